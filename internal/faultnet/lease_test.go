package faultnet_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/faultnet"
	"github.com/sluicehq/sluice/internal/redisproc"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/redisstore"
)

// The lease holders of TestFaultLease are copies of the test binary run
// with leaseEnv set (TestMain runs leaseMain instead of the tests), and
// holderRedis and holderURL as for the semaphore's holders.
const (
	leaseEnv    = "FAULTNET_LEASE"  // the holder's name
	leaseOutage = "FAULTNET_OUTAGE" // its lease.OutagePolicy, as a number
)

// The service the holders share: leaseCap units a second in leaseParts
// partitions, leases of leaseTTL; each holder has leaseWorkers senders,
// each sending one unit per admission, with a backlog that never ends.
const (
	leaseCap     = 200
	leaseParts   = 10
	leaseTTL     = time.Second
	leaseWorkers = 8
	// leasePrepare is each sender's work between a unit's admission and
	// its send, within leaseUse: a holder frozen at a random instant is
	// most likely holding a unit or two admitted and not yet sent.
	leasePrepare = 20 * time.Millisecond
	// leaseUse is Margin/2 at leaseTTL (Margin is TTL/10): the time the
	// lease's validity leaves a caller to use a unit it was admitted.
	leaseUse = leaseTTL / 20
)

// leaseMain is a lease holder process: it holds leases of the service on
// Redis with an endless backlog and sends every unit its Limiter admits
// to the downstream, saying when it was admitted, until killed.
func leaseMain() int {
	name := os.Getenv(leaseEnv)
	policy, err := strconv.Atoi(os.Getenv(leaseOutage))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	c, err := redisstore.NewClient(redisstore.ClientOptions{Addrs: []string{os.Getenv(holderRedis)}, Timeout: 250 * time.Millisecond})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	store, err := redisstore.NewLeaseStore(c, "faults", redisstore.LeaseOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	h, err := lease.NewHolder(store, lease.Options{ID: name, Capacity: leaseCap, Partitions: leaseParts, TTL: leaseTTL,
		Outage: lease.OutagePolicy(policy)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	h.SetBacklog(1 << 30)
	ctx := context.Background()
	go func() { fmt.Fprintln(os.Stderr, "run:", h.Run(ctx)) }()
	url := os.Getenv(holderURL)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: leaseWorkers}}
	lim := h.Limiter()
	for range leaseWorkers {
		go func() {
			for lim.Wait(ctx) == nil {
				admitted := time.Now()
				time.Sleep(leasePrepare) // the work before the send
				req, err := http.NewRequest(http.MethodPost, url, nil)
				if err != nil {
					fmt.Fprintln(os.Stderr, err)
					return
				}
				req.Header.Set("Holder", name)
				req.Header.Set("Admitted", strconv.FormatInt(admitted.UnixNano(), 10))
				resp, err := client.Do(req)
				if err != nil {
					fmt.Fprintln(os.Stderr, "send:", err)
					continue
				}
				resp.Body.Close()
			}
		}()
	}
	for {
		time.Sleep(time.Second)
		s := h.Stats()
		fmt.Printf("%s: rate %.0f, outage %v, losses %d\n", name, lim.Limit(), s.Outage, s.Losses)
	}
}

// downstream is the service the leases share: it records each unit's
// arrival, its holder and when its holder's Limiter admitted it.
type downstream struct {
	url   string
	mu    sync.Mutex
	units []unit
}

type unit struct {
	holder            string
	admitted, arrived time.Time
}

func startDownstream(t *testing.T, h *faultnet.Host) *downstream {
	t.Helper()
	l, err := h.Listen("tcp", h.Addr(httpPort))
	if err != nil {
		t.Fatal(err)
	}
	d := &downstream{url: "http://" + h.Addr(httpPort)}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		u := unit{holder: req.Header.Get("Holder"), arrived: time.Now()}
		if ns, err := strconv.ParseInt(req.Header.Get("Admitted"), 10, 64); err == nil {
			u.admitted = time.Unix(0, ns)
		}
		d.mu.Lock()
		d.units = append(d.units, u)
		d.mu.Unlock()
	})}
	go srv.Serve(l) //nolint:errcheck // ends with Close
	t.Cleanup(func() { srv.Close() })
	return d
}

// arrivals returns the arrival instants of the units of holder ("" for
// all) that arrived in [from, to).
func (d *downstream) arrivals(holder string, from, to time.Time) []time.Time {
	var at []time.Time
	for _, u := range d.within(holder, from, to) {
		at = append(at, u.arrived)
	}
	return at
}

// admissions returns, sorted, the admission instants of the units of
// holder ("" for all) that arrived in [from, to).
func (d *downstream) admissions(holder string, from, to time.Time) []time.Time {
	var at []time.Time
	for _, u := range d.within(holder, from, to) {
		at = append(at, u.admitted)
	}
	slices.SortFunc(at, time.Time.Compare)
	return at
}

// late returns the units of holder ("" for all) that arrived in [from,
// to) more than leaseUse after their admission, and the longest use.
func (d *downstream) late(holder string, from, to time.Time) (n int, longest time.Duration) {
	for _, u := range d.within(holder, from, to) {
		use := u.arrived.Sub(u.admitted)
		longest = max(longest, use)
		if use > leaseUse {
			n++
		}
	}
	return n, longest
}

// within returns the units of holder ("" for all) that arrived in
// [from, to), by arrival.
func (d *downstream) within(holder string, from, to time.Time) []unit {
	d.mu.Lock()
	defer d.mu.Unlock()
	var us []unit
	for _, u := range d.units {
		if (holder == "" || u.holder == holder) && !u.arrived.Before(from) && u.arrived.Before(to) {
			us = append(us, u)
		}
	}
	return us
}

// TestFaultLease: leases under a partition and a pause. Three lease
// holder processes, each on a host of its own, share a capacity of
// 200 units a second (10 partitions, TTL 1 s) on Redis, each with an
// endless backlog, and send what their Limiters admit (20 ms of work
// after each admission) to a downstream on a fifth host, which counts
// arrivals. Holder 1 is cut from Redis for
// 3 s, then healed; later holder 2 is frozen (SIGSTOP) for 2 s, then
// resumed. Promise (lease's doc, "Validity"; ARCHITECTURE.md): the
// arrivals in any second, wherever it starts, never exceed the capacity,
// as long as a unit is used within Margin/2 (50 ms) of its admission;
// a holder cut from the store stops at its leases' deadlines, by its own
// clock (lease.OutageReserved, the default) or falls to its even share
// (lease.OutageEvenShare: measured, stated).
func TestFaultLease(t *testing.T) {
	inMakeFaults(t)
	for _, c := range []struct {
		name, label string
		policy      lease.OutagePolicy
	}{
		{"reserved", "lease.OutageReserved, the default", lease.OutageReserved},
		{"even-share", "lease.OutageEvenShare", lease.OutageEvenShare},
	} {
		t.Run(c.name, func(t *testing.T) { leases(t, c.policy, c.label) })
	}
}

func leases(t *testing.T, policy lease.OutagePolicy, label string) {
	n := faultnet.New(t)
	rh, dh := n.Host("redis"), n.Host("downstream")
	redis := startRedis(t, rh, redisproc.Standalone, redisPort)
	down := startDownstream(t, dh)
	var hosts []*faultnet.Host
	var procs []*faultnet.Proc
	for i := 1; i <= 3; i++ {
		h := n.Host("lease" + strconv.Itoa(i))
		cmd := h.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), leaseEnv+"=h"+strconv.Itoa(i), leaseOutage+"="+strconv.Itoa(int(policy)),
			holderRedis+"="+redis.Addr(), holderURL+"="+down.url)
		hosts, procs = append(hosts, h), append(procs, h.StartCmd("holder", cmd))
	}
	// The phases are the scenario's own durations, not synchronisation.
	phase := func(d time.Duration) time.Time { <-time.After(d); return time.Now() }
	begin := phase(0)
	cutAt := phase(3 * time.Second)
	hosts[0].Partition(rh)
	healAt := phase(3 * time.Second)
	hosts[0].Heal(rh)
	pauseAt := phase(2 * time.Second)
	procs[1].Pause()
	resumeAt := phase(2 * time.Second)
	procs[1].Resume()
	end := phase(3 * time.Second)

	// What the holders' Limiters admitted (by the admission instants the
	// holders sent: one machine, one clock) and what reached the
	// downstream, at their worst in any second, over the run and around
	// each fault; and the units used later than the promise assumes.
	peaks := func(from, to time.Time) (admitted, arrived int) {
		admitted, _ = faultnet.Peak(down.admissions("", from, to), time.Second)
		arrived, _ = faultnet.Peak(down.arrivals("", from, to), time.Second)
		return admitted, arrived
	}
	admitted, arrived := peaks(begin, end)
	late, longest := down.late("", begin, end)
	cutAdmitted, cutArrived := peaks(cutAt, healAt.Add(leaseTTL))
	cutSent := down.arrivals("h1", cutAt.Add(leaseTTL), healAt) // past its leases
	var lastCut time.Duration
	if sent := down.arrivals("h1", cutAt, healAt); len(sent) > 0 {
		lastCut = sent[len(sent)-1].Sub(cutAt)
	}
	pauseAdmitted, pauseArrived := peaks(pauseAt, resumeAt.Add(time.Second))
	pauseLate, pauseUse := down.late("h2", resumeAt, end)
	t.Logf("run: %d units in %v; the most in one second: admitted %d, arrived %d (capacity %d); %d used more than %v after admission, the longest %v",
		len(down.arrivals("", begin, end)), end.Sub(begin).Round(time.Millisecond), admitted, arrived, leaseCap, late, leaseUse, longest.Round(time.Millisecond))
	for at := begin; at.Before(end); at = at.Add(time.Second) {
		t.Logf("  second %2d: h1 %3d, h2 %3d, h3 %3d", int(at.Sub(begin)/time.Second),
			len(down.arrivals("h1", at, at.Add(time.Second))), len(down.arrivals("h2", at, at.Add(time.Second))), len(down.arrivals("h3", at, at.Add(time.Second))))
	}
	t.Logf("cut: the most in one second admitted %d, arrived %d; holder 1's last unit %v after the cut; %d units from it between a TTL after the cut and the heal",
		cutAdmitted, cutArrived, lastCut.Round(time.Millisecond), len(cutSent))
	t.Logf("pause: the most in one second admitted %d, arrived %d; holder 2's units used late after the resumption: %d, the longest %v",
		pauseAdmitted, pauseArrived, pauseLate, pauseUse.Round(time.Millisecond))
	row(t, fmt.Sprintf("leases (%s): 3 holder processes share %d/s in %d partitions (TTL %v) on Redis; one cut from Redis 3 s, later one frozen (SIGSTOP) 2 s", label, leaseCap, leaseParts, leaseTTL),
		fmt.Sprintf("the most in any second, admitted / arrived at the downstream: run %d / %d, cut %d / %d, pause %d / %d (capacity %d); the cut holder's last unit %v after the cut, %d past a TTL; the frozen holder's units sent after its resumption, admitted before: %d (the longest %v from admission); units used > %v after admission in the run: %d",
			admitted, arrived, cutAdmitted, cutArrived, pauseAdmitted, pauseArrived, leaseCap, lastCut.Round(time.Millisecond), len(cutSent), pauseLate, pauseUse.Round(time.Millisecond), leaseUse, late))

	if len(down.arrivals("h1", begin, cutAt)) == 0 || len(down.arrivals("h2", begin, pauseAt)) == 0 {
		t.Fatal("holders 1 and 2 sent nothing before their faults: the scenario did not run")
	}
	if policy == lease.OutageEvenShare {
		if len(cutSent) == 0 {
			t.Error("holder 1 sent nothing while cut from Redis: its even share did not apply")
		}
		return
	}
	// The Limiters admit at most the capacity in any second, wherever it
	// starts; a unit's admission instant is read once Wait has returned,
	// and a unit arrives at the downstream after that: within leaseUse
	// for all but the late ones. So a second of either holds at most
	// the admissions of a second and leaseUse, plus the late units.
	bound := leaseCap + leaseCap*int(leaseUse/time.Millisecond)/1000
	if admitted > bound {
		t.Errorf("the Limiters admitted %d units in one second, above %d (capacity %d, and %v of it)", admitted, bound, leaseCap, leaseUse)
	}
	if arrived > bound+late {
		t.Errorf("%d units arrived in one second, above %d (capacity %d, and %v of it, and %d units used late)", arrived, bound+late, leaseCap, leaseUse, late)
	}
	if len(cutSent) > 0 {
		t.Errorf("holder 1 sent %d units past its leases' deadlines while cut from Redis", len(cutSent))
	}
}
