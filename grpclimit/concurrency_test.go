package grpclimit_test

import (
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/grpclimit"
	"github.com/sluicehq/sluice/priority"
)

// TestClientConcurrency: against a real server on loopback answering
// UNAVAILABLE, the Client's Concurrency limit shrinks (each answer is a
// drop) and the server's refusals are passed on; once the limit holds
// no slot for a call, it fails at once with UNAVAILABLE matching
// adaptive.ErrOverloaded, without reaching the server.
func TestClientConcurrency(t *testing.T) {
	h := &flakyHealth{}
	h.code.Store(uint32(codes.Unavailable))
	l, err := adaptive.NewConcurrency(adaptive.ConcurrencyOptions{Max: 20, Min: 1, Initial: 20, Window: time.Millisecond, MinSamples: 1, Controller: &adaptive.AIMD{}})
	if err != nil {
		t.Fatal(err)
	}
	c := &grpclimit.Client{Concurrency: l, MaxRetries: -1}
	hc := startLoopback(t, h, c)
	for i := 0; l.Stats().Limit > 4; i++ {
		if i == 5000 {
			t.Fatalf("the limit is still %v after 5,000 answers UNAVAILABLE", l.Stats().Limit)
		}
		_, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{})
		if status.Code(err) != codes.Unavailable || errors.Is(err, adaptive.ErrOverloaded) {
			t.Fatalf("%v; want the server's UNAVAILABLE passed on", err)
		}
	}
	if st := l.Stats(); st.InFlight != 0 {
		t.Errorf("%d slots held with no call in flight", st.InFlight)
	}
	// Hold every slot the limit has: a call then finds none.
	var held []adaptive.Permit
	for {
		pm, r := l.TryAcquireAt(time.Now(), priority.Critical)
		if r.Refused() {
			break
		}
		held = append(held, pm)
	}
	before := h.calls.Load()
	_, err = hc.Check(t.Context(), &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.Unavailable || !errors.Is(err, adaptive.ErrOverloaded) || h.calls.Load() != before {
		t.Errorf("a call with every slot held: %v (server calls %d → %d); want UNAVAILABLE matching ErrOverloaded, not sent", err, before, h.calls.Load())
	}
	for i := range held {
		held[i].Ignore()
	}
}

// TestClientConcurrencyRefusalIsNoAccept: a call that finds no slot of the
// Client's Concurrency limit is not an accept of the Rejecter. The two
// clients disagreed here: httplimit.Client counted it as none, grpclimit's
// as an accept (its error has no gRPC code, which read as "the server did
// its work"), so a client whose limit shed its calls told its Rejecter the
// server was healthy. Both now run retry.Caller, where a local refusal is
// Failed.
func TestClientConcurrencyRefusalIsNoAccept(t *testing.T) {
	h := &flakyHealth{}
	l, err := adaptive.NewConcurrency(adaptive.ConcurrencyOptions{Max: 1, Min: 1, Initial: 1})
	if err != nil {
		t.Fatal(err)
	}
	th, err := adaptive.NewRejecter(adaptive.RejecterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := &grpclimit.Client{Concurrency: l, Rejecter: th, MaxRetries: -1}
	hc := startLoopback(t, h, c)
	if _, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	if st := th.Stats(); st.TotalRequests != 1 || st.TotalAccepts != 1 {
		t.Fatalf("after one call answered: %+v, want 1 request and 1 accept", st)
	}
	pm, r := l.TryAcquireAt(time.Now(), priority.Critical)
	if r.Refused() {
		t.Fatal("the one slot is taken")
	}
	defer pm.Ignore()
	if _, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{}); !errors.Is(err, adaptive.ErrOverloaded) {
		t.Fatalf("with the slot held: %v, want ErrOverloaded", err)
	}
	if st := th.Stats(); st.TotalRequests != 2 || st.TotalAccepts != 1 {
		t.Errorf("after a call refused a slot: %+v, want 2 requests and still 1 accept", st)
	}
}
