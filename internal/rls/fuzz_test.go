package rls

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/storetest"
)

// identity is what a descriptor's keys must depend on, and all they may:
// the domain, the entries and the window of an inline limit (whose quota
// is left out of the key on purpose, as a rule's is).
func identity(domain string, d *service.Descriptor) string {
	var b strings.Builder
	b.WriteString(strconv.Quote(domain))
	for _, e := range d.Entries {
		b.WriteString(" " + strconv.Quote(e.Key) + "=" + strconv.Quote(e.Value))
	}
	if l := d.InlineLimit; l != nil {
		b.WriteString(" inline " + strconv.Itoa(int(max(l.Multiplier, 1))) + "x" + l.Unit.String())
	}
	return b.String()
}

// FuzzRequestKeys: a RateLimitRequest in protobuf, as gRPC receives it, is
// either refused with INVALID_ARGUMENT and a message, or decided; and the
// store keys it is decided on identify its descriptors: two descriptors,
// of one request or of two, share a key only if they have the same
// domain, entries and inline window.
func FuzzRequestKeys(f *testing.F) {
	desc := func(kv ...string) *commonv3.RateLimitDescriptor {
		return &commonv3.RateLimitDescriptor{Entries: entries(kv...)}
	}
	add := func(a, b []byte) { f.Add(a, b) }
	enc := func(domain string, ds ...*commonv3.RateLimitDescriptor) []byte {
		b, err := proto.Marshal(&rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds})
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	inline := desc("user", "a")
	inline.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3, Unit: typev3.RateLimitUnit_MINUTE}
	// The pair the issue names: invalid UTF-8, and the U+FFFD a lossy
	// decoder makes of it.
	add(wireRequest("d", "user", "\xff"), wireRequest("d", "user", "\ufffd"))
	add(wireRequest("d\xff", "user", "a"), enc("d\ufffd", desc("user", "a")))
	add(wireRequest("d", "", "a"), enc("d", desc("user", "a")))
	add(enc("d", desc("user", "a|b")), enc("d", desc("user", "a", "b", "")))
	add(enc("d", desc("tenant", "acme", "user", "x")), enc("d", desc("tenant", "acme"), desc("user", "x")))
	add(enc("d", desc("path", "/v1/x")), enc("d", desc("path", "/v1%2Fx")))
	add(enc("d", inline), enc("d", desc("user", "a")))
	add(enc("d", desc("user", "a"), desc("user", "a")), enc("e", desc("user", "a")))
	add([]byte{0xff}, nil)
	add(enc("d", desc(ReserveKey, "r", "user", "a")), enc("d", desc("user", "a", SettleKey, "r"), desc("user", "b")))

	rec := new(storetest.Recorder)
	data, err := os.ReadFile("testdata/keys.yaml")
	if err != nil {
		f.Fatal(err)
	}
	set, err := rules.Parse("keys.yaml", data)
	if err != nil {
		f.Fatal(err)
	}
	rs, err := rules.NewSet(set)
	if err != nil {
		f.Fatal(err)
	}
	svc, err := service.New(service.Options{Store: rec, Rules: rs})
	if err != nil {
		f.Fatal(err)
	}
	// The recorder sees the keys (else the property holds vacuously).
	var resp service.Response
	probe := service.Request{Domain: "d", Descriptors: []service.Descriptor{{Entries: []rules.Entry{{Key: "tenant", Value: "acme"}, {Key: "user", Value: "x"}}}}}
	if err := svc.Decide(f.Context(), &probe, &resp); err != nil || len(rec.Take()) != 1 {
		f.Fatalf("the nested rule decided no key (%v)", err)
	}
	f.Fuzz(func(t *testing.T, a, b []byte) {
		owner := map[string]string{} // key → identity
		for _, body := range [][]byte{a, b} {
			in, err := decodeRequest(body)
			if err != nil {
				if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || st.Message() == "" {
					t.Fatalf("refused with %v, want INVALID_ARGUMENT with a message", err)
				}
				continue
			}
			var c call
			err = c.convert(in)
			if err == nil {
				err = c.req.Validate()
			}
			if err != nil {
				if !errors.Is(err, service.ErrInvalidRequest) || err.Error() == "" {
					t.Fatalf("refused with %v, want an ErrInvalidRequest", err)
				}
				continue
			}
			// Each descriptor on its own, so that each key is known to
			// be its.
			for i := range c.req.Descriptors {
				d := &c.req.Descriptors[i]
				one := service.Request{Domain: c.req.Domain, Descriptors: []service.Descriptor{*d}}
				var resp service.Response
				if err := svc.Decide(t.Context(), &one, &resp); err != nil {
					t.Fatalf("a valid descriptor: %v", err)
				}
				id := identity(c.req.Domain, d)
				for _, k := range rec.Take() {
					if prev, ok := owner[k]; ok && prev != id {
						t.Fatalf("key %q is both %s's and %s's", k, prev, id)
					}
					owner[k] = id
				}
			}
		}
	})
}
