package httpapi

import (
	"bytes"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice/internal/rls"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/storetest"
)

// keyFixture is an API on a recorder, with the rules of the key fuzz
// targets (../rls/testdata/keys.yaml).
type keyFixture struct {
	rec *storetest.Recorder
	svc *service.Service
	rls *rls.Server
	api *API
}

// keyRules returns the rules of the key fuzz targets.
func keyRules(t testing.TB) string {
	b, err := os.ReadFile("../rls/testdata/keys.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func newKeyFixture(t testing.TB) *keyFixture {
	f := &keyFixture{rec: new(storetest.Recorder)}
	var err error
	if f.svc, err = service.New(service.Options{Store: f.rec, Rules: loadSet(t, keyRules(t))}); err != nil {
		t.Fatal(err)
	}
	f.rls = rls.New(f.svc, rls.Options{})
	if f.api, err = New(Options{Service: f.svc, RLS: f.rls, MaxBodyBytes: 1 << 16}); err != nil {
		t.Fatal(err)
	}
	return f
}

// post answers body at path as fuzzPost checks it and, when it was decided,
// returns the keys it was decided on.
func (f *keyFixture) post(t *testing.T, path string, body []byte) (keys []string, decided bool) {
	f.rec.Take()
	req := httptest.NewRequest("POST", path, bytes.NewReader(body))
	w := httptest.NewRecorder()
	f.api.ServeHTTP(w, req)
	checkAnswer(t, w, body)
	return f.rec.Take(), w.Code == 200 || w.Code == 429
}

// owners maps each key to the identity of the descriptor it was decided
// for: what a key must depend on, and all it may (the domain, the entries
// and the window of an inline limit, whose quota is left out of the key on
// purpose, as a rule's is).
type owners map[string]string

func (o owners) add(t *testing.T, keys []string, id string) {
	t.Helper()
	for _, k := range keys {
		if prev, ok := o[k]; ok && prev != id {
			t.Fatalf("key %q is both %s's and %s's", k, prev, id)
		}
		o[k] = id
	}
}

func identity(domain string, entries []rules.Entry, window string) string {
	var b strings.Builder
	b.WriteString(strconv.Quote(domain))
	for _, e := range entries {
		b.WriteString(" " + strconv.Quote(e.Key) + "=" + strconv.Quote(e.Value))
	}
	if window != "" {
		b.WriteString(" inline " + window)
	}
	return b.String()
}

// member returns the member of s that encoding/json would decode into the
// field name (bytes.EqualFold), after checking that no two members of s
// are one field: that is a duplicate the strict decoding refuses.
func member(t *testing.T, s *structpb.Struct, name string) *structpb.Value {
	t.Helper()
	var got *structpb.Value
	names := make([]string, 0, len(s.GetFields()))
	for k, v := range s.GetFields() {
		for _, n := range names {
			if strings.EqualFold(n, k) {
				t.Fatalf("decided a body whose object has members %q and %q", n, k)
			}
		}
		names = append(names, k)
		if strings.EqualFold(k, name) {
			got = v
		}
	}
	return got
}

// FuzzCheckKeys: a /v1/check body is either refused with a problem or
// decided, and then it is one that a strict JSON decoder (protojson's,
// which refuses invalid UTF-8, lone surrogates and duplicate names) reads
// as the same request: the keys it was decided on are those of the
// descriptors that decoder finds, decided one by one; and two descriptors,
// of one body or of two, share a key only if their domain and entries are
// the same.
func FuzzCheckKeys(f *testing.F) {
	entry := func(k, v string) string { return `{"key":"` + k + `","value":"` + v + `"}` }
	body := func(domain string, entries ...string) []byte {
		return []byte(`{"domain":"` + domain + `","descriptors":[{"entries":[` + strings.Join(entries, ",") + `]}]}`)
	}
	// The pair the issue names, and the other ways to a lossy decoding.
	f.Add(body("d", entry("user", "\xff")), body("d", entry("user", "\ufffd")))
	f.Add(body("d", entry("user", `\ud800`)), body("d", entry("user", `\ufffd`)))
	f.Add(body("d", entry("user", `\udc00`)), body("d\xff", entry("user", "a")))
	f.Add(body("d", entry("user", `\ud83d\ude00`)), body("d", entry("user", "😀")))
	f.Add(body("d", `{"key":"user","value":"a","value":"b"}`), body("d", entry("user", "b")))
	f.Add(body("d", `{"key":"user","value":"a","VALUE":"b"}`), body("d", `{"Key":"user","vALUE":"a"}`))
	f.Add([]byte(`{"domain":"d","domain":"e","descriptors":[{"entries":[`+entry("user", "a")+`]}]}`), body("e", entry("user", "a")))
	f.Add(body("d", entry("", "a")), body("d", `{"value":"a"}`))
	f.Add(body("d", entry("tenant", "acme"), entry("user", "x")), []byte(`{"domain":"d","descriptors":[{"entries":[`+entry("tenant", "acme")+`]},{"entries":[`+entry("user", "x")+`]}]}`))
	f.Add(body("d", entry("path", "/v1/x")), body("d", entry("path", "/v1%2Fx")))
	f.Add(body("d", entry("user", "a|b")), body("d", entry("user", "a"), entry("b", "")))
	f.Add([]byte(`{"domain":"d","costs":{"tokens":5},"descriptors":[{"entries":[`+entry("user", "a")+`],"costs":{"tokens":1,"tokens":2}}]}`),
		[]byte(`{"domain":"d","descriptors":[{"entries":[`+entry("user", "a")+`],"costs":{"tok\u0065ns":1,"t\xffokens":2}}]}`))
	fx := newKeyFixture(f)
	f.Fuzz(func(t *testing.T, a, b []byte) {
		own := owners{}
		for _, body := range [][]byte{a, b} {
			keys, decided := fx.post(t, "/v1/check", body)
			if !decided {
				continue
			}
			var ref structpb.Value
			if err := protojson.Unmarshal(body, &ref); err != nil {
				t.Fatalf("decided %q, which a strict decoder refuses: %v", body, err)
			}
			root := ref.GetStructValue()
			domain := member(t, root, "domain").GetStringValue()
			var all []string
			for _, dv := range member(t, root, "descriptors").GetListValue().GetValues() {
				var es []rules.Entry
				for _, ev := range member(t, dv.GetStructValue(), "entries").GetListValue().GetValues() {
					e := ev.GetStructValue()
					es = append(es, rules.Entry{Key: member(t, e, "key").GetStringValue(), Value: member(t, e, "value").GetStringValue()})
				}
				one := service.Request{Domain: domain, Descriptors: []service.Descriptor{{Entries: es}}}
				var resp service.Response
				if err := fx.svc.Decide(t.Context(), &one, &resp); err != nil {
					t.Fatalf("%q was decided, but not its descriptor %v: %v", body, es, err)
				}
				mine := fx.rec.Take()
				own.add(t, mine, identity(domain, es, ""))
				all = append(all, mine...)
			}
			if slices.Sort(all); !slices.Equal(keys, all) {
				t.Fatalf("%q decided on keys %q; its descriptors' are %q", body, keys, all)
			}
		}
	})
}

// FuzzEnvoyJSONKeys: a /json body is either refused with a problem or
// decided on the keys of the descriptors protojson reads in it, decided one
// by one; and two descriptors, of one body or of two, share a key only if
// their domain, entries and inline window are the same.
func FuzzEnvoyJSONKeys(f *testing.F) {
	body := func(domain, entries string) []byte {
		return []byte(`{"domain":"` + domain + `","descriptors":[{"entries":[` + entries + `]}]}`)
	}
	f.Add(body("d", `{"key":"user","value":"\xff"}`), body("d", `{"key":"user","value":"\ufffd"}`))
	f.Add(body("d", `{"key":"user","value":"\ud800"}`), body("d", `{"key":"user","value":"a","value":"b"}`))
	f.Add(body("d", `{"key":"","value":"a"}`), body("d", `{"key":"user","value":"a"}`))
	f.Add([]byte(`{"domain":"d","hitsAddend":1,"hits_addend":2,"descriptors":[{"entries":[{"key":"user","value":"a"}]}]}`),
		[]byte(`{"domain":"d","descriptors":[{"entries":[{"key":"user","value":"a"}],"limit":{"requestsPerUnit":3,"unit":"MINUTE"}}]}`))
	f.Add([]byte(`{"domain":"d","descriptors":[{"entries":[{"key":"user","value":"a"}],"limit":{"requestsPerUnit":3,"unit":"SECOND","unitMultiplier":60}}]}`),
		[]byte(`{"domain":"d","descriptors":[{"entries":[{"key":"nope","value":"a"}],"limit":{"requestsPerUnit":3,"unit":"MINUTE"}}]}`))
	f.Add(body("d", `{"key":"tenant","value":"acme"},{"key":"user","value":"x"}`), body("d", `{"key":"path","value":"/v1/x"}`))
	fx := newKeyFixture(f)
	f.Fuzz(func(t *testing.T, a, b []byte) {
		own := owners{}
		for _, body := range [][]byte{a, b} {
			keys, decided := fx.post(t, "/json", body)
			if !decided {
				continue
			}
			var in rlsv3.RateLimitRequest
			if err := protojson.Unmarshal(body, &in); err != nil {
				t.Fatalf("decided %q, which protojson refuses: %v", body, err)
			}
			var all []string
			for _, d := range in.GetDescriptors() {
				one := &rlsv3.RateLimitRequest{Domain: in.GetDomain(), HitsAddend: in.GetHitsAddend(), Descriptors: []*commonv3.RateLimitDescriptor{d}}
				if _, err := fx.rls.ShouldRateLimitJSON(t.Context(), one); err != nil {
					t.Fatalf("%q was decided, but not its descriptor %v: %v", body, d, err)
				}
				var es []rules.Entry
				for _, e := range d.GetEntries() {
					es = append(es, rules.Entry{Key: e.GetKey(), Value: e.GetValue()})
				}
				window := ""
				if l := d.GetLimit(); l != nil {
					window = strconv.Itoa(int(max(l.GetUnitMultiplier().GetValue(), 1))) + "x" + l.GetUnit().String()
				}
				mine := fx.rec.Take()
				own.add(t, mine, identity(in.GetDomain(), es, window))
				all = append(all, mine...)
			}
			if slices.Sort(all); !slices.Equal(keys, all) {
				t.Fatalf("%q decided on keys %q; its descriptors' are %q", body, keys, all)
			}
		}
	})
}
