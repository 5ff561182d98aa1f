package bench

import (
	"context"
	"net"
	"strconv"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/rls"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/redisstore"
)

// floorServer answers OK to everything, as bench/floor does.
type floorServer struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (floorServer) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

// BenchmarkRLSInProcess sends ShouldRateLimit over real gRPC on loopback
// from 32 × GOMAXPROCS callers in this process (64 on two CPUs), over 10,000
// keys, to the do-nothing floor (an empty OK) and to Sluice's RLS adapter
// with metrics, on the memory store and on a redis-server this benchmark
// starts: the difference is what Sluice adds per request, client side
// (decoding a status per descriptor) included.
func BenchmarkRLSInProcess(b *testing.B) {
	for _, name := range []string{"floor", "sluice", "sluice-redis"} {
		b.Run(name, func(b *testing.B) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			g := grpc.NewServer()
			if name == "floor" {
				rlsv3.RegisterRateLimitServiceServer(g, floorServer{})
			} else {
				set, err := rules.Load("rules")
				if err != nil {
					b.Fatal(err)
				}
				var st ratelimit.Store
				if name == "sluice-redis" {
					c, err := redisstore.NewClient(redisstore.ClientOptions{Addrs: []string{redistest.Standalone(b).Addr()}})
					if err != nil {
						b.Fatal(err)
					}
					defer c.Close()
					rs, err := redisstore.New(c, redisstore.Options{})
					if err != nil {
						b.Fatal(err)
					}
					defer rs.Close()
					st = rs
				} else {
					ms := memstore.New(memstore.Options{JanitorInterval: -1})
					defer ms.Close()
					st = ms
				}
				svc, err := service.New(service.Options{Store: st, Rules: set, Metrics: service.NewMetrics(prometheus.NewRegistry())})
				if err != nil {
					b.Fatal(err)
				}
				rls.New(svc, rls.Options{}).Register(g)
			}
			served := make(chan error, 1)
			go func() { served <- g.Serve(lis) }()
			defer func() { g.Stop(); <-served }()
			conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			client := rlsv3.NewRateLimitServiceClient(conn)
			reqs := make([]*rlsv3.RateLimitRequest, 10000)
			for i := range reqs {
				reqs[i] = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.0." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256)}}}}}
			}
			b.SetParallelism(32)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					i++
					if _, err := client.ShouldRateLimit(context.Background(), reqs[i%len(reqs)]); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
