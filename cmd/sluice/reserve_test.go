package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/internal/coord/sluicev1"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/reserve"
)

// reserveRuleFile: one unit every 50ms (20/s), burst 2; and a window
// limit, which cannot be reserved.
const reserveRuleFile = `domain: pace
descriptors:
  - key: job
    rate_limit: {period: 1s, requests_per_unit: 20, burst: 2, name: job}
  - key: win
    rate_limit: {unit: second, requests_per_unit: 5, name: win}
`

const (
	reserveInterval = 50 * time.Millisecond // of rule job
	reserveBurst    = 2
)

// TestReserveEndToEnd runs the built binary on the memory store and on a
// real redis-server and reserves over HTTP (every answer checked against
// docs/openapi.yaml) and gRPC at once: N clients reserving together on
// one key of 20/s are each told a wait such that the sends, made at the
// told instants, never exceed the rule (model-checked), and no one is
// refused while the queue is shorter than max_wait; beyond it, those
// refused took nothing. Errors: a window rule, a max_wait above
// --max-reserve-wait.
func TestReserveEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildSluice(t)
	api := loadOpenAPI(t)
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			start := time.Now()
			args := []string{"serve", "--rules", rulesDir(t, map[string]string{"pace.yaml": reserveRuleFile}), "--log-format", "json",
				"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--max-reserve-wait", "2s"}
			if store == "redis" {
				args = append(args, "--store", "redis", "--redis-addr", redistest.Standalone(t).Addr())
			}
			p := startSluice(t, bin, nil, args...)
			up := p.next(t, "sluice serving", 10*time.Second)
			c := newCoordClient(t, api, up.str("http"), up.str("grpc"))
			if !reflectedServices(t, c.conn)[reserve.ServiceName] {
				t.Errorf("reflection does not list %s", reserve.ServiceName)
			}
			hc, err := healthpb.NewHealthClient(c.conn).Check(t.Context(), &healthpb.HealthCheckRequest{Service: reserve.ServiceName})
			if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("health of %s: %v, %v", reserve.ServiceName, hc, err)
			}
			testReserveQueue(t, c, store)
			testReserveOverflow(t, c, store)
			testReserveErrors(t, c)
			t.Logf("%s: %v", store, time.Since(start).Round(time.Millisecond))
		})
	}
}

// reservation is one Reserve call's answer and when it was asked and
// answered, by this process's clock (serve's, and Redis's, on this
// machine).
type reservation struct {
	cost       int64
	allowed    bool
	wait       time.Duration
	retryAfter time.Duration // denied: the descriptor's
	asked, got time.Time
}

// reserveCall reserves cost on job=value over gRPC or HTTP.
func reserveCall(ctx context.Context, c *coordClient, grpc bool, value string, cost int64, maxWait time.Duration) (reservation, error) {
	r := reservation{cost: cost, asked: time.Now()}
	if grpc {
		var out sluicev1.ReserveResponse
		err := c.conn.Invoke(ctx, reserve.ReserveMethod, &sluicev1.ReserveRequest{
			Domain:      "pace",
			Descriptors: []*sluicev1.RateLimitDescriptor{{Entries: []*sluicev1.RateLimitEntry{{Key: "job", Value: value}}}},
			Cost:        &cost,
			MaxWait:     durationpb.New(maxWait),
		}, &out)
		r.got = time.Now()
		if err != nil {
			return r, err
		}
		r.allowed, r.wait = out.GetAllowed(), out.GetWait().AsDuration()
		if !r.allowed {
			r.retryAfter = out.GetDescriptors()[0].GetRetryAfter().AsDuration()
		}
		return r, nil
	}
	code, m, err := c.do(ctx, "/v1/reserve", "", fmt.Sprintf(`{"domain":"pace","descriptors":[{"entries":[{"key":"job","value":%q}]}],"cost":%d,"max_wait_ms":%d}`, value, cost, maxWait.Milliseconds()))
	r.got = time.Now()
	if err != nil {
		return r, err
	}
	if code != http.StatusOK && code != http.StatusTooManyRequests {
		return r, fmt.Errorf("POST /v1/reserve: %d %v", code, m)
	}
	r.allowed = m["allowed"] == true
	r.wait = time.Duration(m["wait_ms"].(float64)) * time.Millisecond
	if !r.allowed {
		d := m["descriptors"].([]any)[0].(map[string]any)
		r.retryAfter = time.Duration(d["retry_after_ms"].(float64)) * time.Millisecond
	}
	if r.allowed != (code == http.StatusOK) {
		return r, fmt.Errorf("POST /v1/reserve: %d with allowed %v", code, r.allowed)
	}
	return r, nil
}

// reserveAtOnce has clients goroutines, half on each transport, reserve
// each units of cost 1 on job=value, one after another, all starting
// together.
func reserveAtOnce(t *testing.T, c *coordClient, value string, clients, each int, maxWait time.Duration) []reservation {
	t.Helper()
	var (
		mu  sync.Mutex
		all []reservation
		wg  sync.WaitGroup
	)
	gate := make(chan struct{})
	for i := range clients {
		wg.Go(func() {
			<-gate
			for range each {
				r, err := reserveCall(t.Context(), c, i%2 == 0, value, 1, maxWait)
				if err != nil {
					t.Errorf("client %d: %v", i, err)
					return
				}
				mu.Lock()
				all = append(all, r)
				mu.Unlock()
			}
		})
	}
	close(gate)
	wg.Wait()
	if len(all) != clients*each {
		t.Fatalf("%d answers of %d", len(all), clients*each)
	}
	return all
}

// sendsConform model-checks the sends of the admitted reservations, each
// made at the instant it was told (answered + wait): in every window
// [x, y] of the sends' instants, at most capacity + (y−x)/interval units
// (GCRA's bound), plus what the told instants' uncertainty allows: a
// decision was made between asking and answering, so a send is at most
// the longest round trip L later than the server meant, which a window
// sees as at most ⌈L/interval⌉ units more. It returns that slack, and an
// error for the first window that holds more.
func sendsConform(rs []reservation, interval time.Duration, capacity int64) (int64, error) {
	var l time.Duration
	type send struct {
		at   time.Time
		cost int64
	}
	var sends []send
	for _, r := range rs {
		l = max(l, r.got.Sub(r.asked))
		if r.allowed {
			sends = append(sends, send{r.got.Add(r.wait), r.cost})
		}
	}
	slack := int64((l + interval - 1) / interval)
	slices.SortFunc(sends, func(a, b send) int { return a.at.Compare(b.at) })
	for i := range sends {
		var sum int64
		for j := i; j < len(sends); j++ {
			sum += sends[j].cost
			span := sends[j].at.Sub(sends[i].at)
			if most := capacity + int64(span/interval) + slack; sum > most {
				return slack, fmt.Errorf("%d units sent within %v (from send %d of %d), at most %d allowed (slack %d for round trips up to %v)", sum, span, i, len(sends), most, slack, l)
			}
		}
	}
	return slack, nil
}

// testReserveQueue: 8 clients reserve 2 units each at once with a wait
// of up to 1s; the 16 units need 700ms of queue, so everyone is
// admitted, and the told instants pace the sends at the rule's rate.
func testReserveQueue(t *testing.T, c *coordClient, store string) {
	rs := reserveAtOnce(t, c, "queue-"+store, 8, 2, time.Second)
	first, last := rs[0].asked, rs[0].got
	var end time.Time
	for _, r := range rs {
		if !r.allowed {
			t.Fatalf("refused with a queue shorter than max_wait: %+v", r)
		}
		first, last = earliest(first, r.asked), latest(last, r.got)
		end = latest(end, r.got.Add(r.wait))
	}
	slack, err := sendsConform(rs, reserveInterval, reserveBurst)
	if err != nil {
		t.Fatal(err)
	}
	// The sends are as dense as the rule allows: the last is told for
	// (16 − burst) intervals after the first decision.
	need := (16 - reserveBurst) * reserveInterval
	if lo, hi := first.Add(need), last.Add(last.Sub(first)+need); end.Before(lo) || end.After(hi) {
		t.Errorf("the last send at %v after the first ask; want within [%v, %v]", end.Sub(first), lo.Sub(first), hi.Sub(first))
	}
	// The check can fail: the same units sent as they were answered, not
	// when told, exceed the rule.
	burst := slices.Clone(rs)
	for i := range burst {
		burst[i].wait = 0
	}
	if span := last.Sub(first); span < 10*reserveInterval {
		if _, err := sendsConform(burst, reserveInterval, reserveBurst); err == nil {
			t.Errorf("16 units sent within %v pass the model check (slack %d)", span, slack)
		}
	}
	t.Logf("queue: 16 reservations answered within %v, sends over %v, slack %d", last.Sub(first), end.Sub(first), slack)
}

// testReserveOverflow: 8 clients reserve 4 units each at once with a
// wait of up to 1s: 32 units need 1.5s of queue. The first burst + 1s/50ms
// = 22 (and what refills meanwhile) are admitted, the rest refused with a
// Retry-After of at most one interval (the queue was full, not
// "almost"; see the exception on Redis below), and the refused take
// nothing: the sends still conform.
func testReserveOverflow(t *testing.T, c *coordClient, store string) {
	rs := reserveAtOnce(t, c, "over-"+store, 8, 4, time.Second)
	first, last := rs[0].asked, rs[0].got
	admitted, minRetry := 0, time.Duration(1<<63-1)
	for _, r := range rs {
		first, last = earliest(first, r.asked), latest(last, r.got)
		if r.allowed {
			admitted++
			if r.wait > time.Second {
				t.Errorf("told to wait %v > max_wait 1s", r.wait)
			}
			continue
		}
		// Refused only when the queue is full: the same reservation fits
		// within one interval. On Redis, a refusal answered from the
		// store's denial cache may say later: a consumption answered
		// after the denial was cached moves the cached instant on by its
		// cost although Redis had counted it before the denial (never
		// too early; at most one interval per reservation in flight).
		most := reserveInterval
		if store == "redis" {
			most *= 1 + 8
		}
		if r.retryAfter <= 0 || r.retryAfter > most {
			t.Errorf("refused with Retry-After %v; want (0, %v]: refused only when the queue is full", r.retryAfter, most)
		}
		minRetry = min(minRetry, r.retryAfter)
	}
	if minRetry > reserveInterval {
		t.Errorf("the first refusal's Retry-After is %v; want at most %v: refused only when the queue is full", minRetry, reserveInterval)
	}
	refill := int(last.Sub(first)/reserveInterval) + 1
	if lo := reserveBurst + int(time.Second/reserveInterval); admitted < lo || admitted > lo+refill {
		t.Errorf("%d of 32 admitted in %v; want %d to %d", admitted, last.Sub(first), lo, lo+refill)
	}
	if _, err := sendsConform(rs, reserveInterval, reserveBurst); err != nil {
		t.Fatal(err)
	}
	// The refused took nothing: one more unit, allowed to wait 2s, is
	// told to send right behind the last admitted one (had the 10
	// refused units been taken, 500ms later).
	var (
		lastSend time.Time
		rtt      time.Duration // the longest: how late a told instant may read here
	)
	for _, r := range rs {
		rtt = max(rtt, r.got.Sub(r.asked))
		if r.allowed {
			lastSend = latest(lastSend, r.got.Add(r.wait))
		}
	}
	one, err := reserveCall(t.Context(), c, false, "over-"+store, 1, 2*time.Second)
	if err != nil || !one.allowed {
		t.Fatalf("one more: %+v, %v", one, err)
	}
	if at := one.got.Add(one.wait); at.Before(lastSend.Add(-rtt)) || at.After(lastSend.Add(reserveInterval+one.got.Sub(one.asked))) {
		t.Errorf("one more is told to send %v after the last admitted; want about one interval (%v)", at.Sub(lastSend), reserveInterval)
	}
	t.Logf("overflow: %d of 32 admitted within %v", admitted, last.Sub(first))
}

func testReserveErrors(t *testing.T, c *coordClient) {
	for _, tt := range []struct {
		body, want string
	}{
		{`{"domain":"pace","descriptors":[{"entries":[{"key":"win","value":"a"}]}],"max_wait_ms":1000}`, `limit \"win\" of domain \"pace\" cannot be reserved`},
		{`{"domain":"pace","descriptors":[{"entries":[{"key":"job","value":"a"}]}],"max_wait_ms":3000}`, "exceeds this server's bound of 2s"},
	} {
		code, m := c.post("/v1/reserve", "", tt.body)
		if detail, _ := m["detail"].(string); code != http.StatusBadRequest || !strings.Contains(detail, strings.ReplaceAll(tt.want, `\"`, `"`)) {
			t.Errorf("%s: %d %v; want 400 containing %s", tt.body, code, m, tt.want)
		}
	}
	cost := int64(1)
	err := c.conn.Invoke(t.Context(), reserve.ReserveMethod, &sluicev1.ReserveRequest{
		Domain:      "pace",
		Descriptors: []*sluicev1.RateLimitDescriptor{{Entries: []*sluicev1.RateLimitEntry{{Key: "win", Value: "a"}}}},
		Cost:        &cost, MaxWait: durationpb.New(time.Second),
	}, &sluicev1.ReserveResponse{})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `"win"`) {
		t.Errorf("gRPC, a window rule: %v; want INVALID_ARGUMENT naming it", err)
	}
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
