package drain

import (
	"cmp"
	"slices"

	"github.com/sluicehq/sluice/priority"
)

// scheduler orders the messages taken and not yet released: by priority,
// with the anti-starvation rule of the package doc, and round-robin among
// the tenants of one priority. It is not safe for concurrent use.
type scheduler struct {
	levels  []*level // highest priority first
	ofInput []*level // the level of each Input
	limit   int      // StarvationLimit
	n       int
}

// level holds one priority's waiting messages, by tenant.
type level struct {
	prio    priority.Priority
	skipped int                     // releases in a row that passed it over while it waited
	turns   fifo[*tenantQueue]      // those with messages, in turn order
	queues  map[string]*tenantQueue // those with messages, by tenant
	spare   *tenantQueue            // the last one emptied, for the next tenant: its space is kept
	n       int
}

// tenantQueue is one tenant's waiting messages.
type tenantQueue struct {
	tenant string
	fifo[taken]
}

// fifo is a queue; its zero value is empty.
type fifo[T any] struct {
	items []T
	head  int
}

func (q *fifo[T]) push(t T) {
	if q.head > 0 && len(q.items) == cap(q.items) {
		// Reuse the space of what was popped rather than grow: a queue
		// that never empties must not grow with what passed through it.
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
	q.items = append(q.items, t)
}

func (q *fifo[T]) pop() T {
	t := q.items[q.head]
	var zero T
	q.items[q.head] = zero
	q.head++
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	}
	return t
}

func (q *fifo[T]) len() int { return len(q.items) - q.head }

// newScheduler returns a scheduler for Inputs of priorities prios.
func newScheduler(prios []priority.Priority, limit int) scheduler {
	s := scheduler{limit: limit, ofInput: make([]*level, len(prios))}
	byPrio := make(map[priority.Priority]*level)
	for i, p := range prios {
		l := byPrio[p]
		if l == nil {
			l = &level{prio: p, queues: make(map[string]*tenantQueue)}
			byPrio[p] = l
			s.levels = append(s.levels, l)
		}
		s.ofInput[i] = l
	}
	slices.SortFunc(s.levels, func(a, b *level) int { return cmp.Compare(b.prio, a.prio) })
	return s
}

func (s *scheduler) len() int { return s.n }

// push queues t, from Input input, for tenant.
func (s *scheduler) push(input int, tenant string, t taken) {
	l := s.ofInput[input]
	q := l.queues[tenant]
	if q == nil {
		q, l.spare = l.spare, nil
		if q == nil {
			q = new(tenantQueue)
		}
		q.tenant = tenant
		l.queues[tenant] = q
		l.turns.push(q)
	}
	q.push(t)
	l.n++
	s.n++
}

// pop returns the next message to release, if any.
func (s *scheduler) pop() (taken, bool) {
	var pick *level
	for _, l := range s.levels {
		if l.n == 0 {
			continue
		}
		if pick == nil {
			pick = l // the highest waiting priority
		}
		if l.skipped >= s.limit {
			pick = l // the highest one due under the anti-starvation rule
			break
		}
	}
	if pick == nil {
		return taken{}, false
	}
	below := false
	for _, l := range s.levels {
		switch {
		case l == pick:
			l.skipped = 0
			below = true
		case l.n == 0:
			l.skipped = 0
		case below:
			l.skipped++
		}
	}
	q := pick.turns.items[pick.turns.head] // the tenant whose turn it is
	t := q.pop()
	switch {
	case q.len() == 0:
		pick.turns.pop()
		delete(pick.queues, q.tenant) // tenants come and go: keep only those waiting
		pick.spare = q
	case pick.turns.len() > 1:
		pick.turns.push(pick.turns.pop()) // to the back of the turns
	}
	pick.n--
	s.n--
	return t, true
}

// drainAll removes and returns every waiting message.
func (s *scheduler) drainAll() []taken {
	var all []taken
	for {
		t, ok := s.pop()
		if !ok {
			return all
		}
		all = append(all, t)
	}
}
