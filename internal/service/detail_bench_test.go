package service_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/memstore"
)

// BenchmarkDetailedMetric measures what detailed_metric costs one
// descriptor over 10,000 keys with metrics on: 100 keys have their series,
// the rest go to the overflow's. Compare with
// BenchmarkDecide/one-descriptor/metrics=on.
func BenchmarkDetailedMetric(b *testing.B) {
	dom, err := rules.Parse("bench.yaml", []byte(`domain: bench
descriptors:
  - key: remote_address
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 1000000000}
`))
	if err != nil {
		b.Fatal(err)
	}
	set, err := rules.NewSet(dom)
	if err != nil {
		b.Fatal(err)
	}
	st := memstore.New(memstore.Options{JanitorInterval: -1})
	b.Cleanup(func() { st.Close() })
	svc, err := service.New(service.Options{Store: st, Rules: set, Metrics: service.NewMetrics(prometheus.NewRegistry())})
	if err != nil {
		b.Fatal(err)
	}
	keys := make([]string, 10000)
	for i := range keys {
		keys[i] = "10.0." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256)
	}
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
}
