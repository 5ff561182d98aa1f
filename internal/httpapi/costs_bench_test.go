package httpapi

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drain/draintest"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/memstore"
)

const unitsBenchRules = `domain: b
descriptors:
  - key: model
    value: one
    descriptors:
      - key: user
        limits:
          - {unit: second, requests_per_unit: 1000000000}
  - key: model
    value: three
    descriptors:
      - key: user
        limits:
          - {unit: second, requests_per_unit: 1000000000}
          - {unit: second, requests_per_unit: 1000000000, cost_unit: input_tokens}
          - {unit: second, requests_per_unit: 1000000000, cost_unit: output_tokens}
`

// BenchmarkCheckUnits measures what /v1/check does between the body and
// the answer (strict decoding, conversion, the service's decision on a
// memory store) for one limit and a cost, against three limits of three
// units (requests, input and output tokens) with costs for two, and the
// same three limits with a plain cost; and the decoding alone. Keys
// spread over 10,000 users.
func BenchmarkCheckUnits(b *testing.B) {
	svc, err := service.New(service.Options{Store: memstore.New(memstore.Options{JanitorInterval: -1}), Rules: loadSet(b, unitsBenchRules)})
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct{ name, model, extra string }{
		{"one-limit", "one", `,"cost":1`},
		{"three-units", "three", `,"costs":{"input_tokens":1200,"output_tokens":0}`},
		{"three-units-no-costs", "three", `,"cost":1`},
	} {
		bodies := make([][]byte, 10000)
		for i := range bodies {
			bodies[i] = fmt.Appendf(nil, `{"domain":"b","descriptors":[{"entries":[{"key":"model","value":%q},{"key":"user","value":"u%d"}]%s}]}`, bc.model, i, bc.extra)
		}
		b.Run(bc.name+"/decode", func(b *testing.B) {
			c := new(checkCall)
			b.ReportAllocs()
			cpu0 := draintest.CPUTime(b)
			i := 0
			for b.Loop() {
				if err := decodeCheck(bodies[i%len(bodies)], &c.in, &c.scan); err != nil {
					b.Fatal(err)
				}
				i++
			}
			reportCPU(b, cpu0)
		})
		b.Run(bc.name+"/decode+decide", func(b *testing.B) {
			b.ReportAllocs()
			cpu0 := draintest.CPUTime(b)
			defer reportCPU(b, cpu0)
			b.RunParallel(func(pb *testing.PB) {
				c := new(checkCall)
				i := 0
				for pb.Next() {
					if err := decodeCheck(bodies[i%len(bodies)], &c.in, &c.scan); err != nil {
						b.Fatal(err)
					}
					i++
					if err := c.convert(); err != nil {
						b.Fatal(err)
					}
					if err := svc.Decide(context.Background(), &c.req, &c.resp); err != nil || c.resp.Code != service.OK {
						b.Fatal(err, c.resp.Code)
					}
				}
			})
		})
	}
}

// reportCPU reports the process's CPU time per operation since cpu0: on a
// machine other work shares, a steadier measure than the wall clock's
// ns/op.
func reportCPU(b *testing.B, cpu0 time.Duration) {
	b.ReportMetric(float64(draintest.CPUTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
}
