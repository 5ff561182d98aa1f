// Command floor is the do-nothing baseline for Sluice's gRPC load tests: an
// Envoy rate limit service that answers OK to every ShouldRateLimit without
// looking at it. Whatever Sluice costs above this is Sluice's own. With
// -codec it is built with the codec sluice serve's server uses
// (rls.ServerOption) instead of gRPC's default.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"syscall"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/internal/rls"
)

type floor struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (floor) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

func main() {
	addr := flag.String("addr", "127.0.0.1:9081", "listen address (loopback)")
	withCodec := flag.Bool("codec", false, "use sluice serve's codec (rls.ServerOption), not gRPC's default")
	flag.Parse()
	lis, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	var opts []grpc.ServerOption
	if *withCodec {
		opts = append(opts, rls.ServerOption())
	}
	srv := grpc.NewServer(opts...)
	rlsv3.RegisterRateLimitServiceServer(srv, floor{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		srv.GracefulStop()
	}()
	fmt.Printf("floor: do-nothing rate limit service on %s\n", lis.Addr())
	if err := srv.Serve(lis); err != nil {
		log.Fatal(err)
	}
}
