package httpapi

import (
	"context"
	"crypto/subtle"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/dashboard"
	"github.com/sluicehq/sluice/limitheader"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/ratelimit"
)

// Defaults of the admin API's failed-authentication budget (AdminOptions).
const (
	// DefaultAuthFailures is the burst of failed authentications a client
	// address may make before it is refused.
	DefaultAuthFailures = 5
	// DefaultAuthFailurePeriod is how long a client address takes to win
	// back one failed authentication.
	DefaultAuthFailurePeriod = 10 * time.Second
	// DefaultAuthMaxClients bounds the client addresses whose budget is
	// remembered.
	DefaultAuthMaxClients = 1 << 16
)

// authGuard limits failed authentications per client address. Its
// budget lives in a memstore.Store of bounded size: a GCRA rule whose
// capacity is the burst of failures and which refills one failure every
// period. It is safe for concurrent use.
//
// The token a request presents is compared first (in constant time), and
// the right token always passes: the budget counts failures only, so an
// operator is never locked out because other requests from the same
// address (a dashboard tab left open with a stale token, a neighbour
// behind the same NAT) failed. A missing or wrong token takes one unit of
// its address's budget: 401 while there is some, 429 with Retry-After
// once it is spent. The price: the budget no longer bounds how many
// guesses an address can make, only what they cost the server (no log
// line, a 429); the token must be too long to guess (serve warns at
// start about a short one).
type authGuard struct {
	token []byte
	rule  *ratelimit.Rule
	store *memstore.Store
	now   func() time.Time
	log   *slog.Logger

	// logs bounds the lines logged about failures, over every address;
	// suppressed counts the ones it held back since the last line.
	logs       *ratelimit.Limiter
	suppressed atomic.Int64

	failures, refused prometheus.Counter
}

// authLogBurst is the number of lines about failed authentications logged
// at once; after it, one line every failure period, which counts the
// lines held back.
const authLogBurst = 10

func newAuthGuard(opts *AdminOptions, log *slog.Logger) (*authGuard, error) {
	burst, period, maxClients := opts.AuthFailures, opts.AuthFailurePeriod, opts.AuthMaxClients
	if burst <= 0 {
		burst = DefaultAuthFailures
	}
	if period <= 0 {
		period = DefaultAuthFailurePeriod
	}
	if maxClients <= 0 {
		maxClients = DefaultAuthMaxClients
	}
	rule := &ratelimit.Rule{Name: "admin_auth_failures", Algorithm: ratelimit.GCRA, Quota: 1, Period: period, Burst: int64(burst)}
	if err := rule.Validate(); err != nil {
		return nil, fmt.Errorf("httpapi: the admin API's failed-authentication budget (%d per %v): %w", burst, period, err)
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	g := &authGuard{
		token: []byte(opts.Token),
		rule:  rule,
		// No janitor: the store never holds more than maxClients keys,
		// and a full shard reclaims expired keys when it needs room.
		store: memstore.New(memstore.Options{MaxKeys: maxClients, Shards: 16, Now: now, JanitorInterval: -1}),
		now:   now,
		log:   log,
		logs:  ratelimit.NewLimiter(ratelimit.Every(period), authLogBurst),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_admin_auth_failures_total",
			Help: "Admin API requests whose bearer token was missing or wrong, answered 401 (within their client address's failed-authentication budget).",
		}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_admin_auth_refused_total",
			Help: "Admin API requests whose bearer token was missing or wrong, answered 429 because their client address had used up its failed-authentication budget.",
		}),
	}
	if opts.Registerer != nil {
		for _, c := range []prometheus.Collector{g.failures, g.refused} {
			if err := opts.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("httpapi: registering the admin API's metrics: %w", err)
			}
		}
	}
	return g, nil
}

// check authenticates r; when it refuses r it has answered it.
func (g *authGuard) check(w http.ResponseWriter, r *http.Request) bool {
	tok, ok := dashboard.BearerToken(r.Header.Get("Authorization"))
	if ok && subtle.ConstantTimeCompare([]byte(tok), g.token) == 1 {
		return true
	}
	client := clientKey(r.RemoteAddr)
	var buf [1]ratelimit.Decision
	items := [1]ratelimit.Item{{Key: client, Rule: g.rule, Cost: 1}}
	ds, err := g.store.Decide(context.Background(), buf[:0], items[:])
	if err != nil { // not expected of a memstore with a valid rule
		writeProblem(w, r, http.StatusServiceUnavailable, "httpapi: checking the failed-authentication budget: "+err.Error())
		return false
	}
	if d := ds[0]; !d.Allowed {
		g.refused.Inc()
		g.note(r, client, "limited", slog.Duration("retry_after", d.RetryAfter))
		w.Header()["Retry-After"] = []string{strconv.FormatInt(limitheader.RetryAfterSeconds(d.RetryAfter), 10)}
		writeProblem(w, r, http.StatusTooManyRequests, fmt.Sprintf(
			"too many failed authentications from this address: at most %d, then one every %v; the right token is still accepted",
			g.rule.Burst, g.rule.Period))
		return false
	}
	g.failures.Inc()
	outcome := "wrong_token"
	if !ok {
		outcome = "no_bearer_token"
	}
	g.note(r, client, outcome, slog.Int64("budget_left", ds[0].Remaining))
	w.Header().Set("WWW-Authenticate", `Bearer realm="sluice-admin"`)
	writeProblem(w, r, http.StatusUnauthorized, "a valid bearer token is required")
	return false
}

// note logs a refused authentication at Warn, unless the lines logged
// recently are over the log budget; then it counts it, and the next line
// logged says how many were held back. The token is never logged.
func (g *authGuard) note(r *http.Request, client, outcome string, attr slog.Attr) {
	if !g.logs.AllowN(g.now(), 1) {
		g.suppressed.Add(1)
		return
	}
	g.log.LogAttrs(r.Context(), slog.LevelWarn, "admin: authentication refused",
		slog.String("remote", r.RemoteAddr), slog.String("client", client),
		slog.String("outcome", outcome), attr, slog.Int64("suppressed", g.suppressed.Swap(0)))
}

// clientKey names the client of a request's remote address for its
// failed-authentication budget: an IPv4 address (IPv4-mapped IPv6 ones
// included) is its own client; an IPv6 address is counted with its /64,
// the smallest block a host is usually given, so that one host cannot
// take a fresh budget from each of its 2^64 addresses. An address that is
// not IP (a Unix socket, an in-memory pipe) shares one budget with every
// other such address.
func clientKey(remote string) string {
	var a netip.Addr
	if ap, err := netip.ParseAddrPort(remote); err == nil {
		a = ap.Addr()
	} else if a, err = netip.ParseAddr(remote); err != nil {
		return "non-ip"
	}
	a = a.Unmap().WithZone("")
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p.String()
	}
	return a.String()
}
