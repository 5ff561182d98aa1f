package faultnet

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// An Outcome is what one operation came to.
type Outcome int

const (
	Admitted Outcome = iota // allowed, granted
	Denied                  // refused by the limit
	Failed                  // no answer, or an error answer
)

func (o Outcome) String() string {
	switch o {
	case Admitted:
		return "admitted"
	case Denied:
		return "denied"
	default:
		return "failed"
	}
}

// An Op is one operation as its client saw it: sent at Start, answered
// (or given up) at End. Whatever decided it did so in between.
type Op struct {
	Client     int // who sent it (a replica, a worker)
	Start, End time.Time
	Outcome    Outcome
	Reason     string // the answer's own word for it (ok, limited, local, ...)
}

// A History records operations from many goroutines.
type History struct {
	mu  sync.Mutex
	ops []Op
}

// Add records op.
func (h *History) Add(op Op) {
	h.mu.Lock()
	h.ops = append(h.ops, op)
	h.mu.Unlock()
}

// Ops returns the operations recorded so far, by start.
func (h *History) Ops() []Op {
	h.mu.Lock()
	ops := slices.Clone(h.ops)
	h.mu.Unlock()
	slices.SortFunc(ops, func(a, b Op) int { return a.Start.Compare(b.Start) })
	return ops
}

// A Window is one fixed window's count of admitted operations: Certain
// counts those decided within it for sure (sent and answered inside it),
// Possible those that may have been (sent or answered inside it, or
// spanning it). Certain ≤ what the decider admitted in the window ≤
// Possible.
type Window struct {
	Start             time.Time
	Certain, Possible int
}

// Windows counts the admitted operations of ops per fixed window of
// period, aligned to the Unix epoch as fixed-window rules are, between the
// window of the first operation's start and that of the last one's end.
func Windows(ops []Op, period time.Duration) []Window {
	if len(ops) == 0 {
		return nil
	}
	p := int64(period)
	first, last := ops[0].Start.UnixNano(), ops[0].End.UnixNano()
	for _, op := range ops {
		first, last = min(first, op.Start.UnixNano()), max(last, op.End.UnixNano())
	}
	base := first - first%p
	ws := make([]Window, (last-base)/p+1)
	for i := range ws {
		ws[i].Start = time.Unix(0, base+int64(i)*p)
	}
	for _, op := range ops {
		if op.Outcome != Admitted {
			continue
		}
		a, b := (op.Start.UnixNano()-base)/p, (op.End.UnixNano()-base)/p
		if a == b {
			ws[a].Certain++
		}
		for i := a; i <= b; i++ {
			ws[i].Possible++
		}
	}
	return ws
}

// WindowReport is how a fixed-window limit held over a history.
type WindowReport struct {
	Limit   int
	Windows int
	// Worst is the largest certain count of one window, WorstAt its start.
	Worst   int
	WorstAt time.Time
	// Over is the certain over-admission of the worst window as a share
	// of the limit: (Worst − Limit) / Limit, 0 when within it.
	Over float64
}

// CheckWindows reports the worst window of ops against limit per period.
func CheckWindows(ops []Op, period time.Duration, limit int) WindowReport {
	r := WindowReport{Limit: limit}
	for _, w := range Windows(ops, period) {
		r.Windows++
		if w.Certain > r.Worst {
			r.Worst, r.WorstAt = w.Certain, w.Start
		}
	}
	if r.Worst > limit {
		r.Over = float64(r.Worst-limit) / float64(limit)
	}
	return r
}

func (r WindowReport) String() string {
	return fmt.Sprintf("worst window %d of limit %d (%.0f%% over) in %d windows", r.Worst, r.Limit, 100*r.Over, r.Windows)
}

// LatencyReport is how long operations took to be answered.
type LatencyReport struct {
	N             int
	P50, P99, Max time.Duration
	// Over counts the operations that took longer than the bound.
	Bound time.Duration
	Over  int
}

// CheckLatency reports the latencies of ops against bound.
func CheckLatency(ops []Op, bound time.Duration) LatencyReport {
	r := LatencyReport{N: len(ops), Bound: bound}
	if len(ops) == 0 {
		return r
	}
	ds := make([]time.Duration, len(ops))
	for i, op := range ops {
		ds[i] = op.End.Sub(op.Start)
		if ds[i] > bound {
			r.Over++
		}
	}
	slices.Sort(ds)
	r.P50, r.P99, r.Max = ds[len(ds)/2], ds[(len(ds)*99)/100], ds[len(ds)-1]
	return r
}

func (r LatencyReport) String() string {
	return fmt.Sprintf("%d decisions: p50 %v, p99 %v, max %v; %d over %v", r.N,
		r.P50.Round(10*time.Microsecond), r.P99.Round(10*time.Microsecond), r.Max.Round(10*time.Microsecond), r.Over, r.Bound)
}

// A Gauge measures, at a protected resource, how many users are inside
// at once: each Enter is matched by one Exit, and Max is the most inside
// at any instant.
type Gauge struct {
	in, max atomic.Int64
}

// Enter counts one more user inside.
func (g *Gauge) Enter() {
	n := g.in.Add(1)
	for {
		m := g.max.Load()
		if n <= m || g.max.CompareAndSwap(m, n) {
			return
		}
	}
}

// Exit counts one user out.
func (g *Gauge) Exit() { g.in.Add(-1) }

// Max is the most users inside at once so far.
func (g *Gauge) Max() int64 { return g.max.Load() }

// Peak returns the most instants of at (sorted) inside one window of
// length w, wherever it starts, and the start of the first such window:
// the rate in use at a resource that counts arrivals, Σ over every
// sender, at its worst.
func Peak(at []time.Time, w time.Duration) (n int, from time.Time) {
	j := 0
	for i := range at {
		for at[i].Sub(at[j]) >= w {
			j++
		}
		if i-j+1 > n {
			n, from = i-j+1, at[j]
		}
	}
	return n, from
}
