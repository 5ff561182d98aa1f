package faultnet_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/faultnet"
	"github.com/sluicehq/sluice/internal/redisproc"
	"github.com/sluicehq/sluice/lease"
)

// leaseClockOffset is how far ahead holder 1's monotonic clock runs in
// TestFaultLeaseClock: a machine booted a day before the others.
const leaseClockOffset = 86400 // seconds

// TestFaultLeaseClock: lease holders whose clocks differ. Neither lease
// nor concurrency reads the wall clock (no Unix, UnixNano or time.Unix
// in either package): a lease's and a permit's deadlines are time.Now
// readings of the holder's own process plus durations, compared with
// later readings of the same process (Go compares them on the monotonic
// clock), and Redis is sent durations (TTLs in milliseconds) that it
// times by its own TIME. A wall clock offset cannot be given to a Go
// process here (a time namespace moves only the monotonic and boot-time
// clocks, and libfaketime does not reach Go's vDSO reads), so this
// measures the other clock a holder's machine has of its own: holder 1
// of TestFaultLease's three (200 units a second, 10 partitions, TTL 1 s,
// lease.OutageReserved) runs in a time namespace whose monotonic clock
// is a day ahead of the others', and is cut from Redis for 3 s. Checked
// as TestFaultLease/reserved: Σ ≤ C at the downstream (the arrivals of
// any second within the capacity and Margin/2 of it, plus the units used
// late), and holder 1's Limiter admits nothing past a TTL after the cut
// (what arrives later was used late, counted apart); and that
// the namespace's offset is in force (/proc/PID/timens_offsets).
func TestFaultLeaseClock(t *testing.T) {
	inMakeFaults(t)
	if _, err := os.Stat("/proc/self/timens_offsets"); err != nil {
		t.Skipf("no time namespaces: %v", err)
	}
	n := faultnet.New(t)
	rh, dh := n.Host("redis"), n.Host("downstream")
	redis := startRedis(t, rh, redisproc.Standalone, redisPort)
	down := startDownstream(t, dh)
	var hosts []*faultnet.Host
	var procs []*faultnet.Proc
	for i := 1; i <= 3; i++ {
		h := n.Host("lease" + strconv.Itoa(i))
		args := []string{os.Args[0], "-test.run=^$"}
		if i == 1 {
			off := strconv.Itoa(leaseClockOffset)
			args = append([]string{"unshare", "--time", "--monotonic", off, "--boottime", off, "--"}, args...)
		}
		cmd := h.Command(args[0], args[1:]...)
		cmd.Env = append(os.Environ(), leaseEnv+"=h"+strconv.Itoa(i), leaseOutage+"="+strconv.Itoa(int(lease.OutageReserved)),
			holderRedis+"="+redis.Addr(), holderURL+"="+down.url)
		hosts, procs = append(hosts, h), append(procs, h.StartCmd("holder", cmd))
	}
	// The phases are the scenario's own durations, not synchronisation.
	phase := func(d time.Duration) time.Time { <-time.After(d); return time.Now() }
	begin := phase(0)
	cutting := phase(3 * time.Second)
	offsets, err := os.ReadFile(fmt.Sprintf("/proc/%d/timens_offsets", procs[0].PID()))
	if err != nil {
		t.Fatal(err)
	}
	hosts[0].Partition(rh)
	// The cut is in force once Partition returns (it runs nft, which
	// took over a second once on the loaded machine): a renewal may
	// succeed until then, so the leases' deadlines are timed from it.
	cutAt := time.Now()
	t.Logf("the partition took %v to set up", cutAt.Sub(cutting).Round(time.Millisecond))
	healAt := phase(3 * time.Second)
	hosts[0].Heal(rh)
	end := phase(3 * time.Second)
	if !strings.Contains(string(offsets), "monotonic") || !strings.Contains(string(offsets), strconv.Itoa(leaseClockOffset)) {
		t.Fatalf("holder 1's time namespace offsets: %q, want its monotonic clock %d s ahead", offsets, leaseClockOffset)
	}

	admitted, _ := faultnet.Peak(down.admissions("", begin, end), time.Second)
	arrived, _ := faultnet.Peak(down.arrivals("", begin, end), time.Second)
	late, longest := down.late("", begin, end)
	// Holder 1's units that arrived past a TTL after the cut, and those
	// of them its Limiter admitted past it (none, if it stopped at its
	// leases' deadlines; the others were used late, on a loaded machine).
	cutSent := down.arrivals("h1", cutAt.Add(leaseTTL), healAt)
	cutAdmitted := 0
	for _, u := range down.within("h1", cutAt, healAt) {
		if !u.admitted.Before(cutAt.Add(leaseTTL)) {
			cutAdmitted++
		}
	}
	var lastCut time.Duration
	if sent := down.arrivals("h1", cutAt, healAt); len(sent) > 0 {
		lastCut = sent[len(sent)-1].Sub(cutAt)
	}
	for at := begin; at.Before(end); at = at.Add(time.Second) {
		t.Logf("  second %2d: h1 %3d, h2 %3d, h3 %3d", int(at.Sub(begin)/time.Second),
			len(down.arrivals("h1", at, at.Add(time.Second))), len(down.arrivals("h2", at, at.Add(time.Second))), len(down.arrivals("h3", at, at.Add(time.Second))))
	}
	t.Logf("holder 1's time namespace: %q; the most in one second admitted %d, arrived %d (capacity %d); %d used more than %v after admission (the longest %v); holder 1's last unit %v after the cut, %d arriving and %d admitted past a TTL",
		strings.TrimSpace(string(offsets)), admitted, arrived, leaseCap, late, leaseUse, longest.Round(time.Millisecond), lastCut.Round(time.Millisecond), len(cutSent), cutAdmitted)
	row(t, fmt.Sprintf("lease clocks: 3 holder processes share %d/s in %d partitions (TTL %v) on Redis; holder 1's monotonic clock a day ahead (a time namespace), cut from Redis 3 s", leaseCap, leaseParts, leaseTTL),
		fmt.Sprintf("the most in any second, admitted / arrived at the downstream: %d / %d (capacity %d); units used > %v after admission: %d (the longest %v); the cut holder's last unit %v after the cut, %d arriving and %d admitted past a TTL",
			admitted, arrived, leaseCap, leaseUse, late, longest.Round(time.Millisecond), lastCut.Round(time.Millisecond), len(cutSent), cutAdmitted))

	if len(down.arrivals("h1", begin, cutAt)) == 0 {
		t.Fatal("holder 1 sent nothing before the cut: the scenario did not run")
	}
	bound := leaseCap + leaseCap*int(leaseUse/time.Millisecond)/1000
	if admitted > bound {
		t.Errorf("the Limiters admitted %d units in one second, above %d (capacity %d, and %v of it)", admitted, bound, leaseCap, leaseUse)
	}
	if arrived > bound+late {
		t.Errorf("%d units arrived in one second, above %d (capacity %d, and %v of it, and %d units used late)", arrived, bound+late, leaseCap, leaseUse, late)
	}
	if cutAdmitted > 0 {
		t.Errorf("holder 1 admitted %d units past a TTL after being cut from Redis, past its leases' deadlines", cutAdmitted)
	}
}
