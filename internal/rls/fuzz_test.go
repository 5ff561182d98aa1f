package rls

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/ratelimit"
)

// keyRules has a limit at every kind of level a key is built from: key
// only, exact value, nested, wildcard (without share_threshold, whose
// values share a key on purpose).
const keyRules = `domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: tenant
    value: acme
    rate_limit: {unit: second, requests_per_unit: 5}
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 5}
  - key: path
    value: /v1*
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: path
    rate_limit: {unit: second, requests_per_unit: 9}
`

// recorder is a ratelimit.Store that admits everything and records the
// keys it is asked to decide.
type recorder struct {
	mu   sync.Mutex
	keys []string
}

func (r *recorder) Decide(_ context.Context, dst []ratelimit.Decision, items []ratelimit.Item) ([]ratelimit.Decision, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, it := range items {
		r.keys = append(r.keys, it.Key)
		dst = append(dst, ratelimit.Decision{Allowed: true, Capacity: it.Rule.Capacity(), Remaining: 1, Rule: it.Rule.Name})
	}
	return dst, nil
}

func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := r.keys
	r.keys = nil
	return k
}

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

	rec := new(recorder)
	set, err := rules.Parse("keys.yaml", []byte(keyRules))
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
	if err := svc.ShouldRateLimit(f.Context(), &probe, &resp); err != nil || len(rec.take()) != 1 {
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
				if err := svc.ShouldRateLimit(t.Context(), &one, &resp); err != nil {
					t.Fatalf("a valid descriptor: %v", err)
				}
				id := identity(c.req.Domain, d)
				for _, k := range rec.take() {
					if prev, ok := owner[k]; ok && prev != id {
						t.Fatalf("key %q is both %s's and %s's", k, prev, id)
					}
					owner[k] = id
				}
			}
		}
	})
}
