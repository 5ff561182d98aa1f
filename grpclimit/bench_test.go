package grpclimit_test

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"

	"github.com/sluicehq/sluice/grpclimit"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/ratelimit"
)

// BenchmarkServer measures the unary server interceptor alone, called
// directly (no transport): one policy keyed by peer, admitted or denied.
func BenchmarkServer(b *testing.B) {
	run := func(b *testing.B, rule ratelimit.Rule) {
		st := memstore.New(memstore.Options{JanitorInterval: -1})
		b.Cleanup(func() { st.Close() })
		s, err := grpclimit.NewServer(grpclimit.Options{
			Store:    st,
			Policies: []grpclimit.Policy{{Rule: rule, Keys: []grpclimit.Key{grpclimit.ByPeer(), grpclimit.ByMethod()}}},
		})
		if err != nil {
			b.Fatal(err)
		}
		intercept := s.UnaryInterceptor()
		info := &grpc.UnaryServerInfo{FullMethod: "/grpc.health.v1.Health/Check"}
		handler := func(context.Context, any) (any, error) { return nil, nil }
		ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 4000}})
		b.ReportAllocs()
		for b.Loop() {
			_, _ = intercept(ctx, nil, info, handler)
		}
	}
	b.Run("allowed", func(b *testing.B) {
		run(b, ratelimit.Rule{Name: "per_peer", Quota: 1e9, Period: time.Second, Burst: 1 << 40})
	})
	b.Run("denied", func(b *testing.B) {
		run(b, ratelimit.Rule{Name: "per_peer", Quota: 1, Period: time.Hour})
	})
}

// BenchmarkClient measures the unary client interceptor around a call that
// succeeds at once: the pause check and the retry budget's bookkeeping.
func BenchmarkClient(b *testing.B) {
	c := &grpclimit.Client{}
	intercept := c.UnaryInterceptor()
	invoker := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error { return nil }
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_ = intercept(ctx, "/grpc.health.v1.Health/Check", nil, nil, nil, invoker)
	}
}
