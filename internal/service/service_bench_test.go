package service_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/topk"
)

const benchRules = `domain: bench
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: tenant
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 1000000000}
`

func newBenchService(b *testing.B, withMetrics, withTop bool) *service.Service {
	b.Helper()
	dom, err := rules.Parse("bench.yaml", []byte(benchRules))
	if err != nil {
		b.Fatal(err)
	}
	set, err := rules.NewSet(dom)
	if err != nil {
		b.Fatal(err)
	}
	st := memstore.New(memstore.Options{JanitorInterval: -1})
	b.Cleanup(func() { st.Close() })
	opts := service.Options{Store: st, Rules: set}
	if withMetrics {
		opts.Metrics = service.NewMetrics(prometheus.NewRegistry())
	}
	if withTop {
		top, err := service.NewTop(topk.Options{}, nil)
		if err != nil {
			b.Fatal(err)
		}
		opts.Top = top
	}
	svc, err := service.New(opts)
	if err != nil {
		b.Fatal(err)
	}
	return svc
}

// BenchmarkDecide measures the service alone (no transport): one
// descriptor over 10,000 keys, and two descriptors decided together;
// without metrics, with them, and with them and the top-K trackers.
func BenchmarkDecide(b *testing.B) {
	keys := make([]string, 10000)
	for i := range keys {
		keys[i] = "10.0." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256)
	}
	for _, mode := range []struct {
		name         string
		metrics, top bool
	}{{"metrics=off", false, false}, {"metrics=on", true, false}, {"metrics=on,top=on", true, true}} {
		name, metrics, top := mode.name, mode.metrics, mode.top
		b.Run("one-descriptor/"+name, func(b *testing.B) {
			svc := newBenchService(b, metrics, top)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				req := service.Request{Domain: "bench", Descriptors: []service.Descriptor{{Entries: []rules.Entry{{Key: "remote_address"}}, Cost: 1}}}
				var resp service.Response
				i := 0
				for pb.Next() {
					req.Descriptors[0].Entries[0].Value = keys[i%len(keys)]
					i++
					if err := svc.Decide(context.Background(), &req, &resp); err != nil || resp.Code != service.OK {
						b.Fatal(err, resp.Code)
					}
				}
			})
		})
		b.Run("two-descriptors/"+name, func(b *testing.B) {
			svc := newBenchService(b, metrics, top)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				req := service.Request{Domain: "bench", Descriptors: []service.Descriptor{
					{Entries: []rules.Entry{{Key: "remote_address"}}, Cost: 1},
					{Entries: []rules.Entry{{Key: "tenant", Value: "acme"}, {Key: "user"}}, Cost: 1},
				}}
				var resp service.Response
				i := 0
				for pb.Next() {
					req.Descriptors[0].Entries[0].Value = keys[i%len(keys)]
					req.Descriptors[1].Entries[1].Value = keys[(i*7)%len(keys)]
					i++
					if err := svc.Decide(context.Background(), &req, &resp); err != nil || resp.Code != service.OK {
						b.Fatal(err, resp.Code)
					}
				}
			})
		})
	}
}
