package grpclimit_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/grpclimit"
	"github.com/sluicehq/sluice/storetest"
)

// flakyHealth answers every call with code (and a RetryInfo of retry, if
// set) while code is not OK, and counts the calls; Watch sends one
// message and ends.
type flakyHealth struct {
	healthpb.UnimplementedHealthServer
	code  atomic.Uint32
	retry time.Duration
	calls atomic.Int64
}

func (h *flakyHealth) refusal() error {
	c := codes.Code(h.code.Load())
	if c == codes.OK {
		return nil
	}
	st := status.New(c, "the server refuses")
	if h.retry > 0 {
		st, _ = st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(h.retry)})
	}
	return st.Err()
}

func (h *flakyHealth) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	h.calls.Add(1)
	if err := h.refusal(); err != nil {
		return nil, err
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func (h *flakyHealth) Watch(_ *healthpb.HealthCheckRequest, ss healthpb.Health_WatchServer) error {
	h.calls.Add(1)
	if err := h.refusal(); err != nil {
		return err
	}
	return ss.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING})
}

// startLoopback serves h on a loopback TCP port and returns a client
// whose calls go through c's interceptors.
func startLoopback(t *testing.T, h *flakyHealth, c *grpclimit.Client) healthpb.HealthClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, h)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(c.UnaryInterceptor()),
		grpc.WithStreamInterceptor(c.StreamInterceptor()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

func newRejecter(t *testing.T, o adaptive.RejecterOptions) *adaptive.Rejecter {
	t.Helper()
	th, err := adaptive.NewRejecter(o)
	if err != nil {
		t.Fatal(err)
	}
	return th
}

// isRejected reports whether err is the Client's local rejection: it
// matches ErrRejectedLocally and is an UNAVAILABLE saying so.
func isRejected(err error) bool {
	return errors.Is(err, grpclimit.ErrRejectedLocally) && status.Code(err) == codes.Unavailable &&
		strings.Contains(status.Convert(err).Message(), "rejected locally")
}

// TestClientRejecter: against a real server on loopback that answers
// UNAVAILABLE for a while, the Client rejects most calls locally with an
// UNAVAILABLE "rejected locally" matching ErrRejectedLocally, and returns the
// server's own UNAVAILABLE for those it sends (which does not match
// ErrRejectedLocally); after the server recovers, rejecting stops.
func TestClientRejecter(t *testing.T) {
	for _, stream := range []bool{false, true} {
		name := map[bool]string{false: "unary", true: "stream"}[stream]
		t.Run(name, func(t *testing.T) {
			h := &flakyHealth{}
			h.code.Store(uint32(codes.Unavailable))
			clock := storetest.NewClock(time.Unix(1_200_000, 0))
			window := 20 * time.Second
			th := newRejecter(t, adaptive.RejecterOptions{Window: window, Now: clock.Now, Rand: rand.New(rand.NewPCG(1, 2)).Float64})
			cl := startLoopback(t, h, &grpclimit.Client{Rejecter: th, MaxRetries: -1})
			call := func() error {
				if !stream {
					_, err := cl.Check(t.Context(), &healthpb.HealthCheckRequest{})
					return err
				}
				w, err := cl.Watch(t.Context(), &healthpb.HealthCheckRequest{})
				if err != nil {
					return err
				}
				_, err = w.Recv()
				return err
			}
			const step = 100 * time.Millisecond

			var rejected, refused int
			for range 300 {
				err := call()
				switch {
				case isRejected(err):
					rejected++
				case status.Code(err) == codes.Unavailable && !errors.Is(err, grpclimit.ErrRejectedLocally):
					refused++
				default:
					t.Fatalf("while failing: %v; want the server's UNAVAILABLE or a local rejection", err)
				}
				clock.Advance(step)
			}
			if n := h.calls.Load(); n != int64(refused) || n > 45 {
				t.Errorf("the server saw %d calls of 300 while failing (%d refusals returned), want at most 45 (the probability is capped at 0.9)", n, refused)
			}
			if st := th.Stats(); st.TotalRequests != 300 || st.TotalAccepts != 0 || st.TotalRejected != int64(rejected) {
				t.Errorf("rejecter stats %+v, want 300 requests, no accepts, %d rejected", st, rejected)
			}

			h.code.Store(uint32(codes.OK))
			before := h.calls.Load()
			var recovered time.Duration = -1
			requests, rejected := 0, 0
			for at := time.Duration(0); at < 2*window; at += step {
				requests++
				err := call()
				switch {
				case err == nil:
				case isRejected(err):
					rejected++
					if recovered >= 0 {
						t.Fatalf("rejected %v after the recovery, after the probability fell to zero at %v", at, recovered)
					}
				default:
					t.Fatalf("after the recovery: %v", err)
				}
				clock.Advance(step)
				if recovered < 0 && th.Stats().Probability == 0 {
					recovered = at
				}
			}
			if rejected == 0 {
				t.Error("nothing was rejected after the recovery")
			}
			if recovered < 0 {
				t.Fatalf("still rejecting %v after the recovery (stats %+v)", 2*window, th.Stats())
			}
			if n := h.calls.Load() - before; n != int64(requests-rejected) {
				t.Errorf("the server saw %d calls after the recovery, want the %d not rejected", n, requests-rejected)
			}
			t.Logf("%s: %d rejected while failing, %d after; rejecting stopped %v after the recovery", name, 300-refused, rejected, recovered)
		})
	}
}

// TestClientRejecterPassesOverloadOn: the server's RESOURCE_EXHAUSTED and
// UNAVAILABLE with RetryInfo are retried, then returned to the caller as
// they came; none counts as an accept, and an INVALID_ARGUMENT or
// NOT_FOUND does.
func TestClientRejecterPassesOverloadOn(t *testing.T) {
	for _, c := range []struct {
		code     codes.Code
		accepted bool
	}{{codes.ResourceExhausted, false}, {codes.Unavailable, false}, {codes.InvalidArgument, true}, {codes.NotFound, true}} {
		h := &flakyHealth{retry: time.Millisecond}
		h.code.Store(uint32(c.code))
		th := newRejecter(t, adaptive.RejecterOptions{Rand: func() float64 { return 0.999999 }})
		cl := startLoopback(t, h, &grpclimit.Client{Rejecter: th, MaxRetries: 2, MaxPause: time.Millisecond})
		_, err := cl.Check(t.Context(), &healthpb.HealthCheckRequest{})
		if status.Code(err) != c.code || status.Convert(err).Message() != "the server refuses" || errors.Is(err, grpclimit.ErrRejectedLocally) {
			t.Errorf("%v: got %v, want the server's answer", c.code, err)
			continue
		}
		wantCalls, wantAccepts := int64(3), int64(0) // the call and its two retries
		if c.accepted {
			wantCalls, wantAccepts = 1, 1
		}
		if n := h.calls.Load(); n != wantCalls {
			t.Errorf("%v: the server saw %d calls, want %d", c.code, n, wantCalls)
		}
		if st := th.Stats(); st.TotalRequests != wantCalls || st.TotalAccepts != wantAccepts {
			t.Errorf("%v: the rejecter counted %d requests and %d accepts, want %d and %d", c.code, st.TotalRequests, st.TotalAccepts, wantCalls, wantAccepts)
		}
	}
}

// TestClientRejecterRejectsRetry: a retry the Rejecter rejects is not
// made, and the server's refusal is returned, not a local rejection.
func TestClientRejecterRejectsRetry(t *testing.T) {
	h := &flakyHealth{retry: time.Millisecond}
	h.code.Store(uint32(codes.ResourceExhausted))
	at := time.Unix(1_200_000, 0)
	var draws []float64
	th := newRejecter(t, adaptive.RejecterOptions{Now: func() time.Time { return at }, Rand: func() float64 {
		if len(draws) == 0 {
			return 0
		}
		r := draws[0]
		draws = draws[1:]
		return r
	}})
	for range 4 {
		th.AcceptAt(at)
	}
	for range 10 { // 10 requests, 4 accepts
		th.AllowAt(at)
	}
	before := th.Stats().TotalRejected
	draws = []float64{0.99, 0} // the call passes, its retry does not
	c := &grpclimit.Client{Rejecter: th, MaxRetries: 3, MaxPause: time.Millisecond}
	cl := startLoopback(t, h, c)
	_, err := cl.Check(t.Context(), &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.ResourceExhausted || errors.Is(err, grpclimit.ErrRejectedLocally) {
		t.Fatalf("got %v, want the server's RESOURCE_EXHAUSTED", err)
	}
	if n := h.calls.Load(); n != 1 {
		t.Errorf("the server saw %d calls, want 1: the retry was rejected", n)
	}
	if made, _ := c.Retries(); made != 0 {
		t.Errorf("%d retries counted, want 0", made)
	}
	if st := th.Stats(); st.TotalRejected != before+1 {
		t.Errorf("%d rejections, want %d", st.TotalRejected, before+1)
	}
}
