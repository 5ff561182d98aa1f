package httpapi

import (
	"reflect"
	"testing"
)

// normal is a checkRequest with nil and empty slices alike, to compare
// decodings.
func normal(in *checkRequest) checkRequest {
	out := checkRequest{Domain: in.Domain, Cost: in.Cost}
	out.Costs = append(out.Costs, in.Costs...)
	for _, d := range in.Descriptors {
		nd := checkDescriptor{Cost: d.Cost}
		nd.Entries = append(nd.Entries, d.Entries...)
		nd.Costs = append(nd.Costs, d.Costs...)
		out.Descriptors = append(out.Descriptors, nd)
	}
	return out
}

// checkSame: whatever fastCheck accepts, encoding/json's strict path
// accepts too and decodes to the same request, also when the buffers of
// an earlier, larger request are reused.
func checkSame(t *testing.T, body []byte, reused *checkRequest) {
	t.Helper()
	if !fastCheck(body, reused) {
		return
	}
	var slow checkRequest
	var scan strictScan
	if err := decodeCheckJSON(body, &slow, &scan); err != nil {
		t.Fatalf("fast path accepted %q, encoding/json refused it: %v", body, err)
	}
	if a, b := normal(reused), normal(&slow); !reflect.DeepEqual(a, b) {
		t.Fatalf("%q: fast path %+v, encoding/json %+v", body, a, b)
	}
}

var fastBodies = []string{
	`{"domain":"edge","descriptors":[{"entries":[{"key":"tenant","value":"acme"},{"key":"user","value":"alice"}],"cost":3},{"entries":[{"key":"path","value":"/v1/orders"}]}],"cost":1}`,
	" {\n\t\"descriptors\" : [ ] , \"domain\":\"\" } \r\n",
	`{"domain":"t","descriptors":[{"entries":[]}],"cost":-0}`,
	`{"domain":"t","descriptors":[{}],"cost":-123456789012345678}`,
	`{"domain":"t","descriptors":[{"entries":[{"value":"v"},{}]}]}`,
	`{"domain":"llm","costs":{"input_tokens":1200,"output_tokens":0},"descriptors":[{"entries":[{"key":"model","value":"m"}],"costs":{"ru":-5}},{"entries":[{"key":"user","value":"u"}]}]}`,
	`{"domain":"t","descriptors":[{"costs":{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8}}]}`,
}

// TestFastCheck: the plain bodies take the fast path and decode as
// encoding/json decodes them; the others do not take it.
func TestFastCheck(t *testing.T) {
	big := checkRequest{}
	if !fastCheck([]byte(`{"domain":"x","descriptors":[{"entries":[{"key":"a","value":"b"},{"key":"c","value":"d"}],"cost":5},{"entries":[{"key":"e","value":"f"}]},{}],"cost":9}`), &big) {
		t.Fatal("fast path refused a plain body")
	}
	for _, b := range fastBodies {
		if !fastCheck([]byte(b), &checkRequest{}) {
			t.Errorf("fast path refused %q", b)
		}
		reused := big
		checkSame(t, []byte(b), &reused)
	}
	for _, b := range []string{
		`{"Domain":"t","descriptors":[]}`,                            // a name encoding/json matches without case
		`{"domain":"t","domain":"u","descriptors":[]}`,               // a duplicate
		`{"domain":"t\u0041","descriptors":[]}`,                      // an escape
		`{"domain":"tä","descriptors":[]}`,                           // not ASCII
		`{"domain":"t","descriptors":[],"cost":1.0}`,                 // a fraction
		`{"domain":"t","descriptors":[],"cost":1e3}`,                 // an exponent
		`{"domain":"t","descriptors":[],"cost":01}`,                  // a leading zero
		`{"domain":"t","descriptors":[],"cost":1234567890123456789}`, // 19 digits
		`{"domain":"t","descriptors":null}`,                          // a null
		`{"domain":"t","descriptors":[]} x`,                          // trailing data
		`{"domain":"t"}`,                                             // no descriptors
		`{"domain":"t","descriptors":[{"entries":[{"key":"k","key":"j"}]}]}`,
		`{"domain":"t","descriptors":[{"entries":[{"key":"k","x":"j"}]}]}`,
		`{"domain":"t","descriptors":[],}`,
		`{"domain":"t","descriptors":[`,
		`{"domain":"t","descriptors":[],"costs":{}}`,                                                       // empty costs
		`{"domain":"t","descriptors":[],"costs":null}`,                                                     // null costs
		`{"domain":"t","descriptors":[{"costs":{"a":1,"a":2}}]}`,                                           // a unit twice
		`{"domain":"t","descriptors":[{"costs":{"a":1.5}}]}`,                                               // a fraction
		`{"domain":"t","descriptors":[],"costs":{"input_tokens":1},"costs":{"a":1}}`,                       // costs twice
		`{"domain":"t","descriptors":[{"costs":{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9}}]}`, // beyond MaxCostUnits
		``,
	} {
		if fastCheck([]byte(b), &checkRequest{}) {
			t.Errorf("fast path accepted %q", b)
		}
	}
}

// TestFastCheckAllocs: a plain body without costs allocates only its
// strings.
func TestFastCheckAllocs(t *testing.T) {
	body := []byte(`{"domain":"edge","descriptors":[{"entries":[{"key":"tenant","value":"acme"},{"key":"user","value":"alice"}]}]}`)
	var in checkRequest
	fastCheck(body, &in)
	if a := testing.AllocsPerRun(100, func() { fastCheck(body, &in) }); a > 5 {
		t.Errorf("%v allocations, want at most the 5 strings", a)
	}
}

// TestFastCheckCostsAllocs: costs of the units a reused request named
// last time allocate nothing more.
func TestFastCheckCostsAllocs(t *testing.T) {
	body := []byte(`{"domain":"llm","descriptors":[{"entries":[{"key":"model","value":"m"}],"costs":{"input_tokens":1200,"output_tokens":0}}]}`)
	var in checkRequest
	fastCheck(body, &in)
	if a := testing.AllocsPerRun(100, func() { fastCheck(body, &in) }); a > 3 {
		t.Errorf("%v allocations, want at most the 3 strings of the entries and domain", a)
	}
}

// FuzzFastCheck: the fast path and encoding/json's agree on every body the
// fast path accepts.
func FuzzFastCheck(f *testing.F) {
	for _, b := range fastBodies {
		f.Add([]byte(b))
	}
	f.Add([]byte(`{"domain":"t","descriptors":[{"entries":[{"key":"k","key":"j"}]}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		reused := checkRequest{Descriptors: make([]checkDescriptor, 2, 4)}
		reused.Descriptors[1].Entries = []entry{{Key: "stale", Value: "stale"}}
		reused.Descriptors[1].Costs = costList{{Unit: "stale", Cost: 9}}
		reused.Costs = make(costList, 1, 2)
		checkSame(t, body, &reused)
	})
}
