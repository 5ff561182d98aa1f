package httpapi

import "testing"

// TestStrictScanAccepts: what encoding/json decodes without a loss passes
// the scan: surrogate pairs, a literal or escaped U+FFFD, escapes, names
// that differ, the same name in different objects, every kind of value.
func TestStrictScanAccepts(t *testing.T) {
	for _, s := range []string{
		`{"domain":"\ud83d\ude00","descriptors":[{"entries":[{"key":"😀","value":"\uD83D\uDE00"}]}]}`,
		`{"domain":"` + "\ufffd" + `","descriptors":[{"entries":[{"key":"\ufffd","value":"\"\\\/\b\f\n\r\t"}]}]}`,
		`{"a":{"k":1},"b":{"k":2},"c":[{"k":3},{"k":4}],"k":[true,false,null,-1.5e3,"x"]}`,
		` { "key" : "a" , "value" : "b" } `,
		`{}`, `[]`, `"x"`, `0`,
	} {
		var scan strictScan
		if err := scan.check([]byte(s), true); err != nil {
			t.Errorf("%s: %v", s, err)
		}
	}
}

// TestStrictScanNotJSON: a body that is not well-formed JSON never panics
// the scan, which reports nothing or a loss it found before the
// malformation.
func TestStrictScanNotJSON(t *testing.T) {
	for _, s := range []string{``, `{`, `{"a"`, `{"a":`, `["x",`, `"\u12`, `"\ud800\u`, `{"a":1,"a"`, `{1:2}`, `[1 2]`, `"\ud800`, `"\ud800\udc0`, "\"\xff"} {
		var scan strictScan
		err := scan.check([]byte(s), true)
		if _, ok := err.(*inputError); err != nil && !ok {
			t.Errorf("%q: %v, not an *inputError", s, err)
		}
	}
}

// BenchmarkStrictScan measures the scan of a /v1/check body alone.
func BenchmarkStrictScan(b *testing.B) {
	body := []byte(`{"domain":"edge","descriptors":[{"entries":[{"key":"tenant","value":"acme"},{"key":"user","value":"alice"}],"cost":3},{"entries":[{"key":"path","value":"/v1/orders"}]}],"cost":1}`)
	var scan strictScan
	b.ReportAllocs()
	for b.Loop() {
		if err := scan.check(body, true); err != nil {
			b.Fatal(err)
		}
	}
}
