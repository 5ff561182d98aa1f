package faultnet_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/faultnet"
	"github.com/sluicehq/sluice/internal/redisproc"
)

// TestFaultFailClosed: "a store outage is never reported as a rate limit"
// (ARCHITECTURE.md, "When the store fails"), between hosts. Two serve
// replicas share one Redis; clients ask both over HTTP for one saturated
// key of a strict fixed window of 100 a second whose rule states
// `failure_mode: fail_closed`; one replica is cut from Redis for 2 s.
// Promises: every 429 is a denial Redis decided (its body says
// "limited"); every answer of the cut replica that Redis did not decide is
// 503, never 429, and never admits; so every window admits at most the
// limit, all of it Redis's.
func TestFaultFailClosed(t *testing.T) {
	inMakeFaults(t)
	n := faultnet.New(t)
	rh, s1h, s2h, ch := n.Host("redis"), n.Host("serve1"), n.Host("serve2"), n.Host("client")
	redis := startRedis(t, rh, redisproc.Standalone, redisPort)
	flags := []string{"--store", "redis", "--redis-addr", redis.Addr(), "--replicas", "2"}
	rules := strings.Replace(strictRules, "fixed_window}", "fixed_window, failure_mode: fail_closed}", 1)
	servers := []*serve{startServe(t, s1h, ch, rules, flags...), startServe(t, s2h, ch, rules, flags...)}

	type answer struct {
		status int
		body   string
		retry  string
	}
	var (
		hist    faultnet.History
		mu      sync.Mutex
		answers []answer // of the cut replica, and 429s of either
		wg      sync.WaitGroup
	)
	stop := make(chan struct{})
	for i, s := range servers {
		for range 2 {
			wg.Go(func() {
				tick := time.NewTicker(4 * time.Millisecond)
				defer tick.Stop()
				body := `{"domain":"faults","descriptors":[{"entries":[{"key":"k","value":"hot"}]}]}`
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
					}
					op := faultnet.Op{Client: i, Start: time.Now(), Outcome: faultnet.Failed}
					resp, err := s.c.Post(s.url+"/v1/check", "application/json", bytes.NewReader([]byte(body)))
					if err != nil {
						op.End, op.Reason = time.Now(), err.Error()
						hist.Add(op)
						continue
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					op.End = time.Now()
					a := answer{status: resp.StatusCode, body: string(b), retry: resp.Header.Get("Retry-After")}
					switch resp.StatusCode {
					case http.StatusOK:
						op.Outcome = faultnet.Admitted
					case http.StatusTooManyRequests:
						op.Outcome = faultnet.Denied
					}
					op.Reason = fmt.Sprint(resp.StatusCode)
					hist.Add(op)
					if i == 0 || resp.StatusCode == http.StatusTooManyRequests {
						mu.Lock()
						answers = append(answers, a)
						mu.Unlock()
					}
				}
			})
		}
	}
	phase := func(d time.Duration) time.Time { <-time.After(d); return time.Now() }
	phase(2 * time.Second)
	s1h.Partition(rh)
	phase(2 * time.Second)
	s1h.Heal(rh)
	phase(2 * time.Second)
	close(stop)
	wg.Wait()

	ops := hist.Ops()
	whole := faultnet.CheckWindows(ops, time.Second, strictLimit)
	lat := faultnet.CheckLatency(ops, decisionBound)
	var limited, closed, closedRetry, wrong429, other int
	for _, a := range answers {
		switch {
		case a.status == http.StatusTooManyRequests && strings.Contains(a.body, `"limited"`) && !strings.Contains(a.body, "fail_closed"):
			limited++
		case a.status == http.StatusTooManyRequests:
			wrong429++
			t.Logf("429 not decided by Redis: %.300s", a.body)
		case a.status == http.StatusServiceUnavailable && strings.Contains(a.body, "fail"):
			closed++
			if a.retry != "" {
				closedRetry++
			}
		case a.status == http.StatusOK:
		default:
			other++
			t.Logf("answer %d: %.300s", a.status, a.body)
		}
	}
	t.Logf("whole run: %v", whole)
	t.Logf("latency: %v", lat)
	t.Logf("429s decided by Redis %d, 429s otherwise %d; the cut replica's 503s (failed closed) %d, %d with Retry-After; other answers %d", limited, wrong429, closed, closedRetry, other)
	row(t, "fail_closed across a partition: one of 2 serve replicas cut from Redis 2 s; a strict fixed window of 100/s with failure_mode: fail_closed; HTTP",
		fmt.Sprintf("worst window %d of %d; %d answers 503 (failed closed), %d of them with Retry-After; %d 429s all decided by Redis, %d 429s otherwise; decisions p99 %v, max %v",
			whole.Worst, strictLimit, closed, closedRetry, limited, wrong429, lat.P99.Round(time.Millisecond), lat.Max.Round(time.Millisecond)))

	if wrong429 > 0 || other > 0 {
		t.Errorf("%d answers 429 that Redis did not decide, %d answers neither 200, 429 nor a failed-closed 503", wrong429, other)
	}
	if closed == 0 {
		t.Error("the cut replica never failed closed: the partition did not reach it")
	}
	if whole.Worst > strictLimit {
		t.Errorf("a window admitted %d, above the limit %d: %v", whole.Worst, strictLimit, whole)
	}
	if lat.Over > 0 {
		t.Errorf("%d decisions took longer than %v: %v", lat.Over, decisionBound, lat)
	}
}
