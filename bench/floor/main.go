// Command floor is the do-nothing baseline for Sluice's gRPC load tests: an
// Envoy rate limit service that answers OK to every ShouldRateLimit without
// looking at it. Whatever Sluice costs above this is Sluice's own. With
// -codec it is built with the codec sluice serve's server uses
// (rls.ServerOption) instead of gRPC's default. With -http it also serves
// a do-nothing HTTP handler for POST /v1/check (it reads the body and
// answers a fixed admission) on a server with serve's HTTP timeouts.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

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
	httpAddr := flag.String("http", "", "also serve the do-nothing POST /v1/check on this address (loopback)")
	flag.Parse()
	if *httpAddr != "" {
		hl, err := net.Listen("tcp", *httpAddr)
		if err != nil {
			log.Fatal(err)
		}
		go serveHTTP(hl)
	}
	lis, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	var opts []grpc.ServerOption
	if *withCodec {
		opts = append(opts, rls.ServerOption(nil))
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

// serveHTTP answers every POST /v1/check on l with a fixed admission after
// reading the body, with sluice serve's default HTTP timeouts; it returns
// when the process ends.
func serveHTTP(l net.Listener) {
	answer := []byte(`{"allowed":true,"code":"OK","descriptors":[{"allowed":true,"code":"OK","matched":false,"reason":"ok"}]}`)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/check", func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, 1<<20)); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header()["Content-Type"] = []string{"application/json"}
		w.Write(answer)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 15 * time.Second, IdleTimeout: 2 * time.Minute}
	log.Fatal(srv.Serve(l))
}
