package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/dashboard"
	"github.com/sluicehq/sluice/internal/overrides"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/ratelimit"
)

// A KeyStore lets the admin API read and reset the state of one storage
// key. memstore.Store satisfies it through LocalKeys.
type KeyStore interface {
	State(ctx context.Context, key string) (ratelimit.State, bool, error)
	Reset(ctx context.Context, key string) error
}

// localStore is what an in-process store offers.
type localStore interface {
	State(key string) (ratelimit.State, bool)
	Reset(key string)
}

// LocalKeys adapts an in-process store such as *memstore.Store to KeyStore.
func LocalKeys(s localStore) KeyStore { return localKeys{s} }

type localKeys struct{ s localStore }

func (l localKeys) State(_ context.Context, key string) (ratelimit.State, bool, error) {
	st, ok := l.s.State(key)
	return st, ok, nil
}

func (l localKeys) Reset(_ context.Context, key string) error {
	l.s.Reset(key)
	return nil
}

// AdminOptions configure an Admin.
type AdminOptions struct {
	// Token is the bearer token every request must carry. Required.
	Token string
	// Service is the decision service. Required.
	Service *service.Service
	// Store is the store the service decides with;
	// key inspection peeks at it with cost-0 checks. Required.
	Store ratelimit.Store
	// Keys, if not nil, reads and resets storage keys: without it, key
	// state shows only the peeked decision and reset is not available.
	Keys KeyStore
	// Overrides and OverrideSync manage runtime overrides; nil disables
	// the override endpoints.
	Overrides    *service.Overrides
	OverrideSync *overrides.Sync
	// Reload loads the rules directory now; Status reports the loads.
	// Nil disables POST /admin/v1/reload and the reload status.
	Reload func() error
	Status func() rules.WatchStatus
	// Logger records every change: who, what, when. Nil discards.
	Logger *slog.Logger
	// MaxBodyBytes bounds request bodies; 0 means 64 KiB.
	MaxBodyBytes int64

	// AuthFailures is the burst of failed authentications a client
	// address may make, and AuthFailurePeriod how long it takes to win
	// one back; AuthMaxClients bounds the addresses remembered. Zero means
	// DefaultAuthFailures, DefaultAuthFailurePeriod, DefaultAuthMaxClients.
	AuthFailures      int
	AuthFailurePeriod time.Duration
	AuthMaxClients    int
	// Top, if not nil, tracks the top keys of every rule: GET
	// /admin/v1/top, and the tables of GET /admin/v1/status and of the
	// dashboard.
	Top *service.Top
	// StoreStatus, if not nil, reports the store's health for the status
	// and the dashboard.
	StoreStatus func(ctx context.Context) *dashboard.StoreStatus
	// Coordination, if not nil, reports what the coordination API holds
	// (coord.Service.Status) for the status and the dashboard: its
	// semaphores seen by this process, with their holders and waiters.
	Coordination func(ctx context.Context) *dashboard.CoordinationStatus

	// FailureDefault is the failure mode of the rules that state none
	// (serve's --failure-default); their views show it as "local
	// (default)", say. ratelimit.FailDefault shows "default".
	FailureDefault ratelimit.FailureMode

	// Registerer, if not nil, registers sluice_admin_auth_failures_total
	// and sluice_admin_auth_refused_total.
	Registerer prometheus.Registerer
	// Now is the clock of the failed-authentication budget; nil means
	// time.Now.
	Now func() time.Time
}

// Admin is the admin API, to be served on its own listener:
//
//	GET    /admin/v1/rules                      loaded rules, their source, overrides, reload status
//	POST   /admin/v1/reload                     reload the rules directory now
//	GET    /admin/v1/keys?domain=D&entry=K=V…   storage keys of a descriptor's limits and their state
//	POST   /admin/v1/keys/reset                 {"domain","entries":[{"key","value"}]}: forget their state
//	GET    /admin/v1/overrides                  runtime overrides in force
//	PUT    /admin/v1/overrides/{domain}/{rule}  {"limit","burst"?,"ttl","reason"?}: override a limit
//	DELETE /admin/v1/overrides/{domain}/{rule}  remove an override
//	GET    /admin/v1/top?domain=D&rule=R&k=N    one rule's hottest, most denied and near-limit keys
//	GET    /admin/v1/status?k=N                 everything the dashboard shows, as JSON
//	GET    /admin/dashboard/                    the dashboard (package dashboard)
//
// The dashboard's page, script and style sheet hold no data and are served
// without the token, so that a browser can load them; the page then asks
// for the token and sends it with every request for data
// (/admin/dashboard/status.json, the same as /admin/v1/status).
//
// Domain and rule go in the path percent-encoded; a path with an empty,
// "." or ".." segment is refused (400), not redirected to its cleaned form,
// which could name another override, and so is a name that is not UTF-8.
//
// Every request needs "Authorization: Bearer <token>" (the scheme name in
// any case, RFC 9110); the token is compared in constant time. An optional
// X-Sluice-Actor header names the person or tool acting; it is logged with
// the client address (it is not authenticated: the token is).
//
// # Failed authentications
//
// Each client address has a budget of AuthFailures failed
// authentications, winning one back every AuthFailurePeriod (5, one every
// 10 s, by default). An IPv4 address is one client; IPv6 addresses are
// counted by their /64. The address is the connection's: a proxy in front
// of the admin listener makes every client one. The token is compared
// first: a request with the right one is always served and costs nothing,
// whatever other requests from its address did. Once an address's budget
// is spent, its requests with a missing or wrong token are refused with
// 429 and a Retry-After (when one failure is back). The budget therefore
// bounds what failures cost (log lines, work), not how many guesses an
// address makes: the token must be long and random. Refusals are logged at Warn,
// at most 10 lines at once and then one every AuthFailurePeriod
// over all addresses, each line counting those held back; the token is
// never logged. They are counted in sluice_admin_auth_failures_total (401)
// and sluice_admin_auth_refused_total (429). At most AuthMaxClients
// addresses are remembered (memstore's bounded store, see its package
// doc): an attacker holding more addresses than that, each kept out of
// budget, can make the newest addresses' failures go uncounted.
type Admin struct {
	opts AdminOptions
	log  *slog.Logger
	mux  *http.ServeMux
	auth *authGuard
	dash *dashboard.Dashboard
}

// dashboardPrefix is where the admin API mounts the dashboard.
const dashboardPrefix = "/admin/dashboard"

// dashboardAsset reports whether p is the dashboard's mount point or one of
// its files that hold no data.
func dashboardAsset(p string) bool {
	rest, ok := strings.CutPrefix(p, dashboardPrefix)
	return ok && (rest == "" || dashboard.IsAsset(rest))
}

// NewAdmin returns an Admin.
func NewAdmin(opts AdminOptions) (*Admin, error) {
	if opts.Token == "" {
		return nil, errors.New("httpapi: the admin API needs a token")
	}
	if opts.Service == nil || opts.Store == nil {
		return nil, errors.New("httpapi: the admin API needs the service and its store")
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = 64 << 10
	}
	a := &Admin{opts: opts, log: opts.Logger, mux: http.NewServeMux()}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	var err error
	if a.auth, err = newAuthGuard(&opts, a.log); err != nil {
		return nil, err
	}
	a.mux.HandleFunc("GET /admin/v1/rules", a.listRules)
	if opts.Reload != nil {
		a.mux.HandleFunc("POST /admin/v1/reload", a.reload)
	}
	a.mux.HandleFunc("GET /admin/v1/keys", a.inspectKey)
	if opts.Keys != nil {
		a.mux.HandleFunc("POST /admin/v1/keys/reset", a.resetKey)
	}
	dopts := dashboard.Options{Title: "Sluice", Rules: a.ruleSet, Store: opts.StoreStatus, Coordination: opts.Coordination}
	if opts.Top != nil {
		dopts.Limits = []dashboard.LimitSource{opts.Top}
		a.mux.HandleFunc("GET /admin/v1/top", a.top)
	}
	a.dash = dashboard.New(dopts)
	a.mux.Handle("GET "+dashboardPrefix+"/", http.StripPrefix(dashboardPrefix, a.dash))
	a.mux.HandleFunc("GET /admin/v1/status", a.status)
	if opts.Overrides != nil && opts.OverrideSync != nil {
		a.mux.HandleFunc("GET /admin/v1/overrides", a.listOverrides)
		a.mux.HandleFunc("PUT /admin/v1/overrides/{domain}/{rule}", a.putOverride)
		a.mux.HandleFunc("DELETE /admin/v1/overrides/{domain}/{rule}", a.deleteOverride)
	}
	return a, nil
}

// ServeHTTP implements http.Handler: it checks the token within the
// client's failed-authentication budget, then routes.
func (a *Admin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if (r.Method == http.MethodGet || r.Method == http.MethodHead) && dashboardAsset(r.URL.Path) {
		a.mux.ServeHTTP(w, r)
		return
	}
	if !a.auth.check(w, r) {
		return
	}
	// ServeMux would redirect a path with an empty, "." or ".." segment
	// to its clean form, which may name another override ("./a%2Fb"
	// becomes "a/b"): refuse it instead.
	if p := r.URL.EscapedPath(); p != cleanPath(p) {
		writeProblem(w, r, http.StatusBadRequest, fmt.Sprintf("path %q has an empty, \".\" or \"..\" segment; a domain or rule so named cannot be addressed", p))
		return
	}
	a.mux.ServeHTTP(w, r)
}

// cleanPath is path.Clean keeping a trailing slash, as ServeMux cleans.
func cleanPath(p string) string {
	c := path.Clean("/" + p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c
}

// who returns the log attributes naming the caller.
func who(r *http.Request) slog.Attr {
	return slog.Group("by", "remote", r.RemoteAddr, "actor", r.Header.Get("X-Sluice-Actor"))
}

// actor names the caller in an override's By: X-Sluice-Actor, made valid
// UTF-8 (a header may carry any byte), and the client address.
func actor(r *http.Request) string {
	if a := r.Header.Get("X-Sluice-Actor"); a != "" {
		return strings.ToValidUTF8(a, "\uFFFD") + " (" + r.RemoteAddr + ")"
	}
	return r.RemoteAddr
}

// decodeBody decodes a bounded JSON body strictly into v, as /v1/check
// does (decodeCheck); on error it has answered the request.
func (a *Admin) decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	var body bytes.Buffer
	if !readBody(w, r, a.opts.MaxBodyBytes, &body) {
		return false
	}
	if err := unmarshalStrict(body.Bytes(), v); err != nil {
		detail := err.Error()
		if !errors.Is(err, errTrailing) {
			detail = "decoding the body: " + detail
		}
		writeProblem(w, r, http.StatusBadRequest, detail)
		return false
	}
	var scan strictScan
	if err := scan.check(body.Bytes(), true); err != nil {
		writeProblem(w, r, http.StatusBadRequest, err.Error())
		return false
	}
	return true
}

// The views of the rules are the dashboard's, so that the page and
// GET /admin/v1/rules say the same.
type (
	ruleView     = dashboard.Rule
	overrideView = dashboard.Override
	domainView   = dashboard.RuleDomain
	reloadView   = dashboard.Reload
)

func viewOverride(o *service.Override, now time.Time) *overrideView {
	return &overrideView{Domain: o.Domain, Rule: o.Rule, Limit: o.Quota, Burst: o.Burst,
		ExpiresInMS: o.Expires.Sub(now).Milliseconds(), By: o.By, Reason: o.Reason}
}

func viewRule(sp *rules.Spec) ruleView {
	v := ruleView{Name: sp.Name, Source: sp.Source, Unlimited: sp.Unlimited, Shadow: sp.Shadow, Replaces: sp.Replaces, CostUnit: sp.CostUnit}
	if sp.Unit != rules.UnitUnknown {
		v.Unit = sp.Unit.String()
	}
	if r := sp.Rule; r != nil {
		v.Algorithm, v.Limit, v.Burst = r.Algorithm.String(), r.Quota, r.Burst
		v.FailureMode = r.Failure.String()
		if r.Counting != ratelimit.Strict {
			v.Counting = r.Counting.String()
		}
		if r.Period > 0 {
			v.Period = r.Period.String()
		}
		if r.Calendar != ratelimit.NoCalendar {
			v.Calendar = r.Calendar.String()
			if r.Location != nil {
				v.Timezone = r.Location.String()
			}
		}
	}
	return v
}

// listRules answers GET /admin/v1/rules.
func (a *Admin) listRules(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, a.ruleSet())
}

// ruleSet returns the loaded rules, their overrides and the reload status.
func (a *Admin) ruleSet() *dashboard.RuleSet {
	set := a.opts.Service.Rules()
	now := time.Now()
	byRule := map[[2]string]*service.Override{}
	var overrides []service.Override
	if a.opts.Overrides != nil {
		overrides = a.opts.Overrides.List()
		for i := range overrides {
			byRule[[2]string{overrides[i].Domain, overrides[i].Rule}] = &overrides[i]
		}
	}
	out := &dashboard.RuleSet{Domains: []domainView{}}
	for _, name := range set.Domains() {
		d, _ := set.Domain(name)
		dv := domainView{Name: name, File: d.File(), Rules: []ruleView{}}
		for _, sp := range d.Specs() {
			v := viewRule(sp)
			if r := sp.Rule; r != nil && r.Failure == ratelimit.FailDefault && a.opts.FailureDefault != ratelimit.FailDefault {
				v.FailureMode = a.opts.FailureDefault.String() + " (default)"
			}
			if o := byRule[[2]string{name, sp.Name}]; o != nil {
				v.Override = viewOverride(o, now)
			}
			dv.Rules = append(dv.Rules, v)
		}
		out.Domains = append(out.Domains, dv)
	}
	if a.opts.Status != nil {
		out.Reload = viewStatus(a.opts.Status())
	}
	return out
}

func viewStatus(st rules.WatchStatus) *reloadView {
	v := &reloadView{Loads: st.Loads, Failures: st.Failures}
	if !st.LastLoad.IsZero() {
		v.LastLoad = st.LastLoad.UTC().Format(time.RFC3339Nano)
	}
	if !st.LastGood.IsZero() {
		v.LastGood = st.LastGood.UTC().Format(time.RFC3339Nano)
	}
	if st.LastError != nil {
		v.LastError = st.LastError.Error()
	}
	return v
}

// reload answers POST /admin/v1/reload: 200 with the status when the load
// succeeded, 422 with every file:line error when it failed (the last good
// rules stay in force).
func (a *Admin) reload(w http.ResponseWriter, r *http.Request) {
	err := a.opts.Reload()
	a.log.LogAttrs(r.Context(), slog.LevelInfo, "admin: rules reload requested", who(r), slog.Bool("ok", err == nil))
	if err != nil {
		writeProblem(w, r, http.StatusUnprocessableEntity, "the rules did not load; the last good rules stay in force: "+err.Error())
		return
	}
	var st *reloadView
	if a.opts.Status != nil {
		st = viewStatus(a.opts.Status())
	}
	writeJSON(w, http.StatusOK, struct {
		OK     bool        `json:"ok"`
		Reload *reloadView `json:"reload,omitempty"`
	}{true, st})
}

// keyRequest names one request descriptor.
type keyRequest struct {
	Domain  string  `json:"domain"`
	Entries []entry `json:"entries"`
}

// matchedKey is one limit a descriptor matches, with its storage key.
type matchedKey struct {
	spec *rules.Spec
	key  string
}

// match returns the limits a descriptor matches and their storage keys;
// on error it has answered the request.
func (a *Admin) match(w http.ResponseWriter, r *http.Request, kr *keyRequest) ([]matchedKey, bool) {
	entries := toEntries(nil, kr.Entries)
	req := service.Request{Domain: kr.Domain, Descriptors: []service.Descriptor{{Entries: entries}}}
	if err := req.Validate(); err != nil {
		writeProblem(w, r, http.StatusBadRequest, err.Error())
		return nil, false
	}
	d, ok := a.opts.Service.Rules().Domain(kr.Domain)
	if !ok {
		writeProblem(w, r, http.StatusNotFound, fmt.Sprintf("domain %q is not loaded", kr.Domain))
		return nil, false
	}
	var out []matchedKey
	for _, l := range d.Match(0, entries, nil) {
		out = append(out, matchedKey{spec: l.Spec, key: string(l.AppendKey(nil, entries))})
	}
	return out, true
}

type stateView struct {
	Algorithm string `json:"algorithm"`
	T         int64  `json:"t"`
	N         int64  `json:"n"`
	Prev      int64  `json:"prev,omitempty"`
	Seen      int64  `json:"seen"`
	LogLen    int    `json:"log_len,omitempty"`
}

type keyView struct {
	Rule         string        `json:"rule"`
	Source       string        `json:"source"`
	Key          string        `json:"key"`
	Unlimited    bool          `json:"unlimited,omitempty"`
	Shadow       bool          `json:"shadow,omitempty"`
	Limit        int64         `json:"limit"`
	Remaining    int64         `json:"remaining"`
	ResetAfterMS int64         `json:"reset_after_ms"`
	Override     *overrideView `json:"override,omitempty"`
	Stored       *bool         `json:"stored,omitempty"`
	State        *stateView    `json:"state,omitempty"`
}

// inspectKey answers GET /admin/v1/keys?domain=D&entry=K=V&entry=K2=V2:
// the limits the descriptor (its entries in order; a value is everything
// after the first '=') matches, their storage keys, and their state now.
func (a *Admin) inspectKey(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	kr := keyRequest{Domain: q.Get("domain")}
	for _, e := range q["entry"] {
		k, v, ok := strings.Cut(e, "=")
		if !ok {
			writeProblem(w, r, http.StatusBadRequest, fmt.Sprintf("entry %q: want KEY=VALUE", e))
			return
		}
		kr.Entries = append(kr.Entries, entry{Key: k, Value: v})
	}
	keys, ok := a.match(w, r, &kr)
	if !ok {
		return
	}
	now := time.Now()
	out := struct {
		Domain  string    `json:"domain"`
		Entries []entry   `json:"entries"`
		Limits  []keyView `json:"limits"`
	}{kr.Domain, kr.Entries, []keyView{}}
	for _, mk := range keys {
		v := keyView{Rule: mk.spec.Name, Source: mk.spec.Source, Key: mk.key, Unlimited: mk.spec.Unlimited, Shadow: mk.spec.Shadow}
		if rule := mk.spec.Rule; rule != nil {
			if a.opts.Overrides != nil {
				if or, exp, ok := a.opts.Overrides.Lookup(rule); ok {
					rule = or
					v.Override = &overrideView{Domain: kr.Domain, Rule: mk.spec.Name, Limit: or.Quota, Burst: or.Burst, ExpiresInMS: exp.Sub(now).Milliseconds()}
				}
			}
			// A cost-0 check decides nothing and stores nothing: it reads
			// the key's remaining capacity in any store.
			ds, err := a.opts.Store.Decide(r.Context(), nil, []ratelimit.Item{{Key: mk.key, Rule: rule}})
			if err != nil {
				decisionError(w, r, &service.UnavailableError{Err: err})
				return
			}
			v.Limit, v.Remaining, v.ResetAfterMS = ds[0].Capacity, ds[0].Remaining, ceilMillis(ds[0].ResetAfter)
		}
		if a.opts.Keys != nil {
			st, found, err := a.opts.Keys.State(r.Context(), mk.key)
			if err != nil {
				decisionError(w, r, &service.UnavailableError{Err: err})
				return
			}
			v.Stored = &found
			if found {
				v.State = &stateView{Algorithm: st.Algorithm.String(), T: st.T, N: st.N, Prev: st.Prev, Seen: st.Seen, LogLen: len(st.Log)}
			}
		}
		out.Limits = append(out.Limits, v)
	}
	writeJSON(w, http.StatusOK, out)
}

// resetKey answers POST /admin/v1/keys/reset: it forgets the state of
// every limit the descriptor matches, so its next request starts from full
// capacity (e.g. after a successful login).
func (a *Admin) resetKey(w http.ResponseWriter, r *http.Request) {
	var kr keyRequest
	if !a.decodeBody(w, r, &kr) {
		return
	}
	keys, ok := a.match(w, r, &kr)
	if !ok {
		return
	}
	reset := []string{}
	for _, mk := range keys {
		if mk.spec.Rule == nil {
			continue
		}
		if err := a.opts.Keys.Reset(r.Context(), mk.key); err != nil {
			decisionError(w, r, &service.UnavailableError{Err: err})
			return
		}
		reset = append(reset, mk.key)
	}
	a.log.LogAttrs(r.Context(), slog.LevelInfo, "admin: keys reset", who(r),
		slog.String("domain", kr.Domain), slog.Any("keys", reset))
	writeJSON(w, http.StatusOK, struct {
		Reset []string `json:"reset"`
	}{reset})
}

// status answers GET /admin/v1/status: what the dashboard shows.
func (a *Admin) status(w http.ResponseWriter, r *http.Request) {
	k, err := dashboard.ParseK(r.URL.Query().Get("k"))
	if err != nil {
		writeProblem(w, r, http.StatusBadRequest, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, a.dash.Status(r.Context(), k))
}

// top answers GET /admin/v1/top?domain=D&rule=R&k=N: one rule's tables.
func (a *Admin) top(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	k, err := dashboard.ParseK(q.Get("k"))
	if err != nil {
		writeProblem(w, r, http.StatusBadRequest, err.Error())
		return
	}
	domain, rule := q.Get("domain"), q.Get("rule")
	for _, l := range a.opts.Top.TopLimits() {
		if l.Domain == domain && l.Name == rule {
			writeJSON(w, http.StatusOK, dashboard.Limit(l, k))
			return
		}
	}
	writeProblem(w, r, http.StatusNotFound, fmt.Sprintf("no tracked rule %q in domain %q", rule, domain))
}

// listOverrides answers GET /admin/v1/overrides.
func (a *Admin) listOverrides(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	out := struct {
		Overrides []*overrideView `json:"overrides"`
	}{[]*overrideView{}}
	list := a.opts.Overrides.List()
	for i := range list {
		out.Overrides = append(out.Overrides, viewOverride(&list[i], now))
	}
	writeJSON(w, http.StatusOK, out)
}

// overrideRequest is the body of PUT /admin/v1/overrides/{domain}/{rule}.
type overrideRequest struct {
	Limit  *int64 `json:"limit"`
	Burst  int64  `json:"burst"`
	TTL    string `json:"ttl"` // a Go duration: 90s, 1h, 72h
	Reason string `json:"reason"`
}

// putOverride answers PUT /admin/v1/overrides/{domain}/{rule}: it checks
// the override against the loaded rules, stores it and applies it here at
// once (other replicas within one poll of the store).
func (a *Admin) putOverride(w http.ResponseWriter, r *http.Request) {
	var req overrideRequest
	if !a.decodeBody(w, r, &req) {
		return
	}
	if req.Limit == nil {
		writeProblem(w, r, http.StatusBadRequest, `field "limit" is required`)
		return
	}
	ttl, err := time.ParseDuration(req.TTL)
	if err != nil {
		writeProblem(w, r, http.StatusBadRequest, fmt.Sprintf(`field "ttl": want a duration such as "30m" or "24h", at most %v: %v`, service.MaxOverrideTTL, err))
		return
	}
	if err := overrides.ValidTarget(r.PathValue("domain"), r.PathValue("rule")); err != nil {
		writeProblem(w, r, http.StatusBadRequest, err.Error())
		return
	}
	o := service.Override{
		Domain: r.PathValue("domain"), Rule: r.PathValue("rule"),
		Quota: *req.Limit, Burst: req.Burst, By: actor(r), Reason: req.Reason,
	}
	now := time.Now()
	o.Expires = now.Add(ttl)
	if _, err := o.Check(a.opts.Service.Rules(), now); err != nil {
		status := http.StatusBadRequest
		if errors.Is(err, service.ErrNoSuchRule) {
			status = http.StatusNotFound
		}
		writeProblem(w, r, status, err.Error())
		return
	}
	if err := a.opts.OverrideSync.Store.Put(r.Context(), o, ttl); err != nil {
		writeProblem(w, r, http.StatusServiceUnavailable, err.Error())
		return
	}
	if err := a.opts.OverrideSync.Sync(r.Context()); err != nil {
		writeProblem(w, r, http.StatusServiceUnavailable, "stored, but not re-read: "+err.Error())
		return
	}
	a.log.LogAttrs(r.Context(), slog.LevelInfo, "admin: override set", who(r),
		slog.String("domain", o.Domain), slog.String("rule", o.Rule), slog.Int64("limit", o.Quota),
		slog.Int64("burst", o.Burst), slog.Duration("ttl", ttl), slog.String("reason", o.Reason))
	writeJSON(w, http.StatusOK, viewOverride(&o, now))
}

// deleteOverride answers DELETE /admin/v1/overrides/{domain}/{rule}.
func (a *Admin) deleteOverride(w http.ResponseWriter, r *http.Request) {
	domain, rule := r.PathValue("domain"), r.PathValue("rule")
	if err := overrides.ValidTarget(domain, rule); err != nil {
		writeProblem(w, r, http.StatusBadRequest, err.Error())
		return
	}
	found, err := a.opts.OverrideSync.Store.Delete(r.Context(), domain, rule)
	if err != nil {
		writeProblem(w, r, http.StatusServiceUnavailable, err.Error())
		return
	}
	if err := a.opts.OverrideSync.Sync(r.Context()); err != nil {
		writeProblem(w, r, http.StatusServiceUnavailable, "deleted, but not re-read: "+err.Error())
		return
	}
	a.log.LogAttrs(r.Context(), slog.LevelInfo, "admin: override deleted", who(r),
		slog.String("domain", domain), slog.String("rule", rule), slog.Bool("found", found))
	if !found {
		writeProblem(w, r, http.StatusNotFound, fmt.Sprintf("no override of %s/%s", domain, rule))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
