package service

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluicehq/sluice/memstore"
)

const quotaRules = `domain: q
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 100, name: user}
  - key: login
    rate_limit: {unit: day, requests_per_unit: 1, name: login}
  - key: backend
    value: a
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 1, name: quota_a}
  - key: backend
    value: b
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 2, name: quota_b}
  - key: remote
    detailed_metric: true
    rate_limit: {unit: day, requests_per_unit: 100, name: remote}
`

func newQuotaService(t *testing.T, independent bool) (*Service, *Metrics) {
	t.Helper()
	st := memstore.New(memstore.Options{JanitorInterval: -1})
	t.Cleanup(func() { st.Close() })
	m := NewMetrics(prometheus.NewRegistry())
	m.SetDetailedKeys(2)
	svc, err := New(Options{Store: st, Rules: overrideSet(t, quotaRules), Metrics: m, Independent: independent})
	if err != nil {
		t.Fatal(err)
	}
	return svc, m
}

func decideQ(t *testing.T, svc *Service, kvs ...string) *Response {
	t.Helper()
	var resp Response
	if err := svc.Decide(t.Context(), &Request{Domain: "q", Descriptors: descs(kvs...)}, &resp); err != nil {
		t.Fatal(err)
	}
	return &resp
}

// remaining is what a cost-0 look finds left of the limit of kv.
func remaining(t *testing.T, svc *Service, kv string) int64 {
	t.Helper()
	d := descs(kv)
	d[0].Cost = 0
	var resp Response
	if err := svc.Decide(t.Context(), &Request{Domain: "q", Descriptors: d}, &resp); err != nil {
		t.Fatal(err)
	}
	return resp.Statuses[0].Decision.Remaining
}

// TestQuotaMode: a descriptor over its quota is OverLimit with
// QuotaExceeded while the request is OK; once every quota descriptor is
// over, the request is OverLimit and the other limits keep nothing.
func TestQuotaMode(t *testing.T) {
	svc, m := newQuotaService(t, false)
	r := decideQ(t, svc, "user=u", "backend=a", "backend=b")
	if r.Code != OK || r.Statuses[1].QuotaExceeded || !r.Statuses[1].Quota {
		t.Fatalf("first request: %+v; want OK, a quota status within its quota", r)
	}
	r = decideQ(t, svc, "user=u", "backend=a", "backend=b")
	if r.Code != OK || r.Statuses[1].Code != OverLimit || !r.Statuses[1].QuotaExceeded || r.Statuses[2].Code != OK {
		t.Fatalf("second request: code %v, statuses %+v; want OK with a over quota, b within", r.Code, r.Statuses)
	}
	if got := remaining(t, svc, "user=u"); got != 98 {
		t.Fatalf("user remaining %d after two allowed requests; want 98", got)
	}
	r = decideQ(t, svc, "user=u", "backend=a", "backend=b")
	if r.Code != OverLimit || !r.Statuses[1].QuotaExceeded || !r.Statuses[2].QuotaExceeded || r.Statuses[0].Code != OK {
		t.Fatalf("third request: code %v, statuses %+v; want OverLimit, both quotas exceeded", r.Code, r.Statuses)
	}
	if got := remaining(t, svc, "user=u"); got != 98 {
		t.Errorf("user remaining %d after a request refused by its quotas; want 98 (refunded)", got)
	}
	for outcome, want := range map[string]float64{"quota_exceeded": 1, "over_limit": 2} {
		got := value(t, m.decisions.WithLabelValues("q", "quota_a", outcome)) + value(t, m.decisions.WithLabelValues("q", "quota_b", outcome))
		if got != want {
			t.Errorf("quota rules' outcome %s = %v; want %v", outcome, got, want)
		}
	}
}

// TestQuotaModeRealDenial: a request denied by a limit without quota_mode
// consumes nothing from its quota limits.
func TestQuotaModeRealDenial(t *testing.T) {
	for _, independent := range []bool{false, true} {
		svc, _ := newQuotaService(t, independent)
		decideQ(t, svc, "login=x", "backend=b")
		r := decideQ(t, svc, "login=x", "backend=b")
		if r.Code != OverLimit || r.Statuses[0].Code != OverLimit || r.Statuses[1].Code != OK {
			t.Fatalf("independent=%v: %+v; want OverLimit by login", independent, r)
		}
		want := int64(0) // b counts on its own
		if !independent {
			want = 1 // the denied request took nothing
		}
		if got := remaining(t, svc, "backend=b"); got != want {
			t.Errorf("independent=%v: b remaining %d; want %d", independent, got, want)
		}
	}
}

// TestDetailedMetricBound: a detailed_metric rule is counted per value up
// to its bound, the rest under _overflow; other rules never are.
func TestDetailedMetricBound(t *testing.T) {
	svc, m := newQuotaService(t, false)
	for _, v := range []string{"1", "2", "3", "4", "1"} {
		decideQ(t, svc, "remote="+v, "user=u")
	}
	for key, want := range map[string]float64{"q.remote_1": 2, "q.remote_2": 1, OverflowKey: 2} {
		if got := value(t, m.detailed.WithLabelValues("q", "remote", key, "ok")); got != want {
			t.Errorf("key %s: %v decisions; want %v", key, got, want)
		}
	}
	if n := countSeries(m.detailed); n != 3*len(outcomes) {
		t.Errorf("%d detailed series; want %d (two keys and the overflow, no other rule)", n, 3*len(outcomes))
	}
}

// value is the value of counter c.
func value(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// countSeries counts the series c holds.
func countSeries(c prometheus.Collector) int {
	ch := make(chan prometheus.Metric)
	go func() { c.Collect(ch); close(ch) }()
	n := 0
	for range ch {
		n++
	}
	return n
}

// TestQuotaRefusalBesideARefund: a request refused by its quota-mode
// limits keeps nothing of what its other limits consumed, even when one
// of them is a refund. Giving back by negating every cost made the refund
// a consumption of 5 on a limit of 1, which the store denied, and since
// the give-back is one call, all or nothing, the user's unit was kept.
func TestQuotaRefusalBesideARefund(t *testing.T) {
	svc, _ := newQuotaService(t, false)
	decideQ(t, svc, "backend=a") // a is over its quota from now on
	d := descs("user=u", "login=l", "backend=a")
	d[1].Cost = -5 // a refund of a limit with nothing taken
	var resp Response
	if err := svc.Decide(t.Context(), &Request{Domain: "q", Descriptors: d}, &resp); err != nil {
		t.Fatal(err)
	}
	if resp.Code != OverLimit || !resp.Statuses[2].QuotaExceeded {
		t.Fatalf("code %v, statuses %+v; want OverLimit, refused by backend=a's quota", resp.Code, resp.Statuses)
	}
	if got := remaining(t, svc, "user=u"); got != 100 {
		t.Errorf("user remaining %d after a refused request; want 100 (given back)", got)
	}
	if got := remaining(t, svc, "login=l"); got != 1 {
		t.Errorf("login remaining %d after a refused request; want 1 (nothing taken)", got)
	}
}
