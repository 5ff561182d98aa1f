package dashboard

import (
	"context"
	"crypto/subtle"
	"embed"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/topk"
)

//go:embed page
var page embed.FS

// assets are the page's files, by path.
var assets = map[string]struct{ file, ctype string }{
	"/":         {"page/index.html", "text/html; charset=utf-8"},
	"/dash.js":  {"page/dash.js", "text/javascript; charset=utf-8"},
	"/dash.css": {"page/dash.css", "text/css; charset=utf-8"},
}

// IsAsset reports whether path (below the Dashboard's mount point) is one
// of the page's files, which hold no data: a server that checks a token
// in front of the Dashboard may serve them without it, so that a browser
// can load the page and then ask for the token.
func IsAsset(path string) bool {
	_, ok := assets[path]
	return ok
}

// A LimitSource has limits with top-K trackers: *httplimit.Middleware with
// httplimit.Options.Top, and sluice serve's service.
type LimitSource interface {
	TopLimits() []topk.Limit
}

// A LeaseHolder is what the page reads of a lease holder: *lease.Holder.
type LeaseHolder interface {
	ID() string
	Options() lease.Options
	Stats() lease.Stats
}

// A Lease is a lease holder to show.
type Lease struct {
	// Name names the leased service on the page.
	Name   string
	Holder LeaseHolder
	// Watch, if not nil, is the WatchLeases wrapping the holder's store:
	// the page then shows every member of the service.
	Watch *LeaseWatch
}

// A SemaphoreSource is what the page reads of a semaphore:
// *concurrency.Semaphore.
type SemaphoreSource interface {
	Size() int64
	Held() int64
	Waiting() int
}

// A Semaphore is a semaphore to show.
type Semaphore struct {
	Name      string
	Semaphore SemaphoreSource
}

// Options configure a Dashboard. Everything is optional; what is not
// given is not shown.
type Options struct {
	// Title heads the page; "Sluice" when empty.
	Title string
	// Token, if not empty, is the bearer token status.json requires
	// (compared in constant time).
	Token string
	// Limits are the limits whose top-K tables and totals are shown.
	Limits []LimitSource
	// Rules, if not nil, returns the rules in force, shown as a table.
	Rules func() *RuleSet
	// Leases and Semaphores are shown with their holdings.
	Leases     []Lease
	Semaphores []Semaphore
	// Store, if not nil, returns the store's health; it is called with
	// the request's context for every status.
	Store func(ctx context.Context) *StoreStatus
	// Coordination, if not nil, returns what a coordination service
	// holds for its callers (sluice serve's); it is called with the
	// request's context for every status.
	Coordination func(ctx context.Context) *CoordinationStatus
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// A Dashboard is the page and its status.json; see the package
// documentation.
type Dashboard struct {
	opts Options
}

// New returns a Dashboard.
func New(opts Options) *Dashboard {
	if opts.Title == "" {
		opts.Title = "Sluice"
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Dashboard{opts: opts}
}

// ServeHTTP implements http.Handler.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		h.Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if a, ok := assets[r.URL.Path]; ok {
		b, _ := page.ReadFile(a.file)
		h.Set("Content-Type", a.ctype)
		_, _ = w.Write(b)
		return
	}
	if r.URL.Path != "/status.json" {
		http.NotFound(w, r)
		return
	}
	if d.opts.Token != "" && !BearerIs(r, d.opts.Token) {
		h.Set("WWW-Authenticate", `Bearer realm="sluice"`)
		http.Error(w, "a bearer token is required", http.StatusUnauthorized)
		return
	}
	k, err := ParseK(r.URL.Query().Get("k"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	writeJSON(w, d.Status(r.Context(), k))
}

// BearerIs reports whether r carries "Authorization: Bearer token",
// comparing the token in constant time.
func BearerIs(r *http.Request, token string) bool {
	got, ok := BearerToken(r.Header.Get("Authorization"))
	return ok && subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1
}

// BearerToken returns the token of an Authorization header of the Bearer
// scheme, whose name is case-insensitive (RFC 9110, section 11.1) and is
// followed by one or more spaces.
func BearerToken(h string) (string, bool) {
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return strings.TrimLeft(tok, " "), true
}

// MaxK bounds the entries per table a status may ask for.
const MaxK = 1000

// ParseK parses the k query parameter: "" is 0 (each tracker's K), else
// an integer from 1 to MaxK.
func ParseK(s string) (int, error) {
	if s == "" {
		return 0, nil
	}
	if len(s) > 4 {
		return 0, fmt.Errorf("k %.8q...: want an integer from 1 to %d", s, MaxK)
	}
	k, err := strconv.Atoi(s)
	if err != nil || k < 1 || k > MaxK {
		return 0, fmt.Errorf("k %q: want an integer from 1 to %d", s, MaxK)
	}
	return k, nil
}

// writeJSON answers 200 with v as JSON, not cached.
func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "encoding the status: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(append(b, '\n'))
}

// Status returns the status now, k entries per table (0: each tracker's K).
func (d *Dashboard) Status(ctx context.Context, k int) Status {
	now := d.opts.Now()
	st := Status{Time: now.UTC(), Title: d.opts.Title, Limits: []LimitStatus{}, Leases: []LeaseStatus{}, Semaphores: []SemaphoreStatus{}}
	for _, src := range d.opts.Limits {
		for _, l := range src.TopLimits() {
			st.Limits = append(st.Limits, Limit(l, k))
		}
	}
	if d.opts.Rules != nil {
		st.Rules = d.opts.Rules()
	}
	for _, l := range d.opts.Leases {
		st.Leases = append(st.Leases, l.status(now))
	}
	for _, s := range d.opts.Semaphores {
		st.Semaphores = append(st.Semaphores, SemaphoreStatus{Name: s.Name, Limit: s.Semaphore.Size(), Held: s.Semaphore.Held(), Waiting: s.Semaphore.Waiting()})
	}
	if d.opts.Coordination != nil {
		st.Coordination = d.opts.Coordination(ctx)
	}
	if d.opts.Store != nil {
		st.Store = d.opts.Store(ctx)
	}
	return st
}

// Limit returns the status of one tracked limit, k entries per table.
func Limit(l topk.Limit, k int) LimitStatus {
	ls := LimitStatus{Domain: l.Domain, Name: l.Name, CostUnit: l.CostUnit, Snapshot: l.Tracker.Snapshot(k)}
	if l.Rule != nil {
		ls.Limit = l.Rule.Capacity()
		if l.Rule.Period > 0 {
			ls.Window = l.Rule.Period.String()
		}
	}
	return ls
}

func (l *Lease) status(now time.Time) LeaseStatus {
	cfg, s := l.Holder.Options(), l.Holder.Stats()
	ls := LeaseStatus{
		Name: l.Name, Member: l.Holder.ID(), Capacity: cfg.Capacity, Partitions: cfg.Partitions,
		Granted: s.Granted, Rate: s.Rate, Used: s.Used, Idle: s.Idle, Demand: s.Demand,
		Need: s.Need, Want: s.Want, Leases: s.Leases, Outage: s.Outage,
	}
	if l.Watch != nil {
		if v, at, ok := l.Watch.View(l.Holder.ID()); ok {
			ls.Members, ls.ViewAgeMS = members(v), now.Sub(at).Milliseconds()
		}
	}
	return ls
}

// members returns the members of a view with the partitions each has.
func members(v lease.View) []MemberStatus {
	out := make([]MemberStatus, 0, len(v.Members))
	at := map[string]int{}
	for _, m := range v.Members {
		at[m.ID] = len(out)
		out = append(out, MemberStatus{ID: m.ID, Weight: m.Weight, Need: m.Need, Want: m.Want})
	}
	for _, p := range v.Partitions {
		i, ok := at[p.Owner]
		if !ok || p.Owner == "" {
			continue
		}
		out[i].Has++
		if ms := p.TTL.Milliseconds(); out[i].ExpiresInMS == 0 || ms < out[i].ExpiresInMS {
			out[i].ExpiresInMS = ms
		}
	}
	return out
}
