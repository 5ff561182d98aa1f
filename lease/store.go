package lease

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"
)

// A Member is one process taking part in sharing a service: its presence
// entry in the store.
type Member struct {
	// ID names the member; it must be unique among the service's members.
	ID string
	// Weight is the member's relative share; members of weight 2 aim at
	// twice the partitions of members of weight 1.
	Weight float64
	// Need is the number of partitions the member's estimated demand
	// fills now, and Want adds its headroom (Want ≥ Need). The others
	// read them to decide whether to yield partitions above their share:
	// needs are served before headroom.
	Need, Want int
}

// PartitionState is one partition as the store sees it.
type PartitionState struct {
	// Owner is the member holding a lease on the partition, or "" when it
	// is free (never leased, released or expired by the store's clock).
	Owner string
	// Epoch is the epoch of the latest lease granted on the partition, 0
	// if none ever was.
	Epoch uint64
	// TTL is the time left to the lease by the store's clock when it made
	// the view (0 when free): a duration, never an instant, so that no
	// clocks are compared. A lease whose TTL is well below a full one has
	// missed a renewal; its owner may have died.
	TTL time.Duration
}

// A View is a snapshot of a service's shared state, read in one call.
type View struct {
	// Members are the active members (presence not expired), sorted by ID.
	Members []Member
	// Partitions holds the state of partitions 0 to P-1.
	Partitions []PartitionState
}

// A Grant is a lease on a partition: the partition and its epoch, a
// fencing token that increases with every lease granted on the partition
// (a renewal keeps the epoch of the lease it extends).
type Grant struct {
	Partition int
	Epoch     uint64
}

// A Store is what a Holder needs from the store shared by all the
// members of one service. Every operation is atomic in the store. Expiry
// instants are computed by the store's own clock (the Redis server's, or
// the process's for MemoryStore) from the TTL given as a duration; no
// instant is ever compared across machines.
//
// MemoryStore and redisstore.LeaseStore implement it; storetest.RunLeases
// is the conformance suite every implementation must pass.
type Store interface {
	// Heartbeat registers or refreshes m's presence for ttl, drops the
	// members whose presence expired, and returns the view of the service
	// with its first partitions partitions.
	Heartbeat(ctx context.Context, m Member, ttl time.Duration, partitions int) (View, error)
	// Acquire leases to member id, for ttl, each partition of parts that
	// is free, expired, or already id's (which then gets a new epoch: a
	// lease whose grant was lost in transit is fenced). It returns the
	// grants made, in the order of parts; the others are left alone.
	Acquire(ctx context.Context, id string, parts []int, ttl time.Duration) ([]Grant, error)
	// Renew extends, for ttl from now, each lease of leases that id still
	// holds with that very epoch and that has not expired. ok[i] reports
	// whether leases[i] was renewed; a lease not renewed is lost.
	Renew(ctx context.Context, id string, leases []Grant, ttl time.Duration) (ok []bool, err error)
	// Release ends each lease of leases that id holds with that epoch; it
	// leaves other members' leases alone. The partition keeps its epoch.
	Release(ctx context.Context, id string, leases []Grant) error
	// Leave removes id's presence.
	Leave(ctx context.Context, id string) error
}

// A Notifier is a Store that tells a service's members when another
// member gives partitions back, leaves, arrives or needs more than before,
// so that they look at once rather than at their next period. A Holder
// whose Store is a Notifier watches it while it runs, and keeps looking
// every period besides: a notification lost costs at most a period.
//
// MemoryStore and redisstore.LeaseStore (Redis pub/sub) implement it.
type Notifier interface {
	// Watch returns a channel on which the store sends the id of each
	// member that released partitions, left, joined or raised its need,
	// for as long as ctx lasts. A slow receiver loses notifications
	// rather than blocking the store. The channel is closed when ctx is
	// done or the watch fails.
	Watch(ctx context.Context) (<-chan string, error)
}

// ErrBadArgument is returned (wrapped) for a partition index out of range,
// an empty member id or a TTL that is not positive.
var ErrBadArgument = errors.New("lease: bad argument")

// CheckArgs is the argument check every Store makes before it touches its
// state: an error wrapping ErrBadArgument for an empty member id, or, when
// ttlNeeded, a TTL that is not positive.
func CheckArgs(id string, ttl time.Duration, ttlNeeded bool) error {
	if id == "" {
		return fmt.Errorf("%w: empty member id", ErrBadArgument)
	}
	if ttlNeeded && ttl <= 0 {
		return fmt.Errorf("%w: ttl %v is not positive", ErrBadArgument, ttl)
	}
	return nil
}

// MemoryStore is a Store for the holders of one process (and the
// simulation): one MemoryStore is the shared state of one service. Expiry is
// measured by its clock, time.Now unless NewMemoryClock set another.
//
// The zero value is not usable: call NewMemory. A MemoryStore is safe for
// concurrent use.
type MemoryStore struct {
	now func() time.Time

	mu       sync.Mutex
	members  map[string]memMember
	parts    map[int]memPart
	watchers map[chan string]struct{}
}

type memMember struct {
	m      Member
	expiry time.Time
}

type memPart struct {
	owner  string
	epoch  uint64
	expiry time.Time
}

// NewMemoryStore returns an empty Memory on the process's clock.
func NewMemoryStore() *MemoryStore { return NewMemoryStoreClock(time.Now) }

// NewMemoryStoreClock returns an empty Memory whose expiry instants are read
// from now.
func NewMemoryStoreClock(now func() time.Time) *MemoryStore {
	return &MemoryStore{now: now, members: map[string]memMember{}, parts: map[int]memPart{}, watchers: map[chan string]struct{}{}}
}

// Watch implements Notifier.
func (s *MemoryStore) Watch(ctx context.Context) (<-chan string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c := make(chan string, watchBuffer)
	s.mu.Lock()
	s.watchers[c] = struct{}{}
	s.mu.Unlock()
	context.AfterFunc(ctx, func() {
		s.mu.Lock()
		delete(s.watchers, c)
		close(c)
		s.mu.Unlock()
	})
	return c, nil
}

// watchBuffer is the buffer of a Notifier's channel.
const watchBuffer = 16

// notifyLocked tells the watchers about member id. s.mu is held.
func (s *MemoryStore) notifyLocked(id string) {
	for c := range s.watchers {
		select {
		case c <- id:
		default:
		}
	}
}

// Heartbeat implements Store.
func (s *MemoryStore) Heartbeat(ctx context.Context, m Member, ttl time.Duration, partitions int) (View, error) {
	if err := CheckArgs(m.ID, ttl, true); err != nil {
		return View{}, err
	}
	if err := ctx.Err(); err != nil {
		return View{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for id, mm := range s.members {
		if !mm.expiry.After(now) {
			delete(s.members, id)
		}
	}
	if old, found := s.members[m.ID]; !found || m.Need > old.m.Need {
		s.notifyLocked(m.ID)
	}
	s.members[m.ID] = memMember{m: m, expiry: now.Add(ttl)}
	v := View{Members: make([]Member, 0, len(s.members)), Partitions: make([]PartitionState, max(0, partitions))}
	for _, mm := range s.members {
		v.Members = append(v.Members, mm.m)
	}
	sort.Slice(v.Members, func(i, j int) bool { return v.Members[i].ID < v.Members[j].ID })
	for i := range v.Partitions {
		p := s.parts[i]
		v.Partitions[i].Epoch = p.epoch
		if p.expiry.After(now) {
			v.Partitions[i].Owner = p.owner
			v.Partitions[i].TTL = p.expiry.Sub(now)
		}
	}
	return v, nil
}

// Acquire implements Store.
func (s *MemoryStore) Acquire(ctx context.Context, id string, parts []int, ttl time.Duration) ([]Grant, error) {
	if err := CheckArgs(id, ttl, true); err != nil {
		return nil, err
	}
	if err := CheckPartitions(parts); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var out []Grant
	for _, i := range parts {
		p := s.parts[i]
		if p.expiry.After(now) && p.owner != id {
			continue
		}
		p.owner, p.epoch, p.expiry = id, p.epoch+1, now.Add(ttl)
		s.parts[i] = p
		out = append(out, Grant{Partition: i, Epoch: p.epoch})
	}
	return out, nil
}

// Renew implements Store.
func (s *MemoryStore) Renew(ctx context.Context, id string, leases []Grant, ttl time.Duration) ([]bool, error) {
	if err := CheckArgs(id, ttl, true); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	ok := make([]bool, len(leases))
	for k, g := range leases {
		p, found := s.parts[g.Partition]
		if !found || p.owner != id || p.epoch != g.Epoch || !p.expiry.After(now) {
			continue
		}
		p.expiry = now.Add(ttl)
		s.parts[g.Partition] = p
		ok[k] = true
	}
	return ok, nil
}

// Release implements Store.
func (s *MemoryStore) Release(ctx context.Context, id string, leases []Grant) error {
	if err := CheckArgs(id, 0, false); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, g := range leases {
		p, found := s.parts[g.Partition]
		if !found || p.owner != id || p.epoch != g.Epoch {
			continue
		}
		s.parts[g.Partition] = memPart{epoch: p.epoch}
		n++
	}
	if n > 0 {
		s.notifyLocked(id)
	}
	return nil
}

// Leave implements Store.
func (s *MemoryStore) Leave(ctx context.Context, id string) error {
	if err := CheckArgs(id, 0, false); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, found := s.members[id]; found {
		delete(s.members, id)
		s.notifyLocked(id)
	}
	return nil
}

// Valid reports whether g is the current, unexpired lease of its
// partition: the check a protected service makes on a fencing token.
func (s *MemoryStore) Valid(ctx context.Context, g Grant) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p, found := s.parts[g.Partition]
	return found && p.owner != "" && p.epoch == g.Epoch && p.expiry.After(s.now()), nil
}

// CheckPartitions returns an error wrapping ErrBadArgument for a negative
// partition index, as every Store's Acquire does.
func CheckPartitions(parts []int) error {
	for _, p := range parts {
		if p < 0 {
			return fmt.Errorf("%w: partition %d", ErrBadArgument, p)
		}
	}
	return nil
}
