package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/dashboard"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/topk"
)

// topConfig is what serve's flags say of the top-K trackers.
type topConfig struct {
	k          int
	secretKeys []string
	secretFlag string
}

func addTopFlags(fs *flag.FlagSet, c *topConfig) {
	fs.IntVar(&c.k, "top-k", topk.DefaultK, "keys each rule's hottest, most denied and near-limit tables keep (admin API, dashboard); 0 turns the tracking off")
	fs.StringVar(&c.secretFlag, "top-secret-keys", "", "descriptor `keys`, comma-separated (such as remote_address,api_key), whose rules' keys the top tables show hashed")
}

func (c *topConfig) validate() error {
	if c.k < 0 || c.k > 1000 {
		return usagef("serve: --top-k %d: want 0 (off) to 1000", c.k)
	}
	for k := range strings.SplitSeq(c.secretFlag, ",") {
		if k = strings.TrimSpace(k); k != "" {
			c.secretKeys = append(c.secretKeys, k)
		}
	}
	return nil
}

// newTop returns the trackers, or nil when they are off.
func (c *topConfig) newTop() (*service.Top, error) {
	if c.k == 0 {
		return nil, nil
	}
	return service.NewTop(topk.Options{K: c.k}, c.secretKeys)
}

// memoryHealth reports the memory store's health: always up.
func memoryHealth(m *memstore.Store) func(context.Context) *dashboard.StoreStatus {
	return func(context.Context) *dashboard.StoreStatus {
		return &dashboard.StoreStatus{Kind: "memory", Healthy: true, Keys: m.Stats().Keys}
	}
}

// redisHealth reports Redis's health: a PING's round trip (bounded by the
// store's timeout), the breaker, and the failure modes' decisions.
func redisHealth(c redis.UniversalClient, rs *redisstore.Store, cfg *serveConfig) func(context.Context) *dashboard.StoreStatus {
	mode := "standalone"
	switch {
	case cfg.redisMaster != "":
		mode = "sentinel"
	case len(cfg.redisAddrs) > 1:
		mode = "cluster"
	}
	return func(ctx context.Context) *dashboard.StoreStatus {
		st := rs.Stats()
		s := &dashboard.StoreStatus{Kind: "redis", Mode: mode, Healthy: true, Breaker: "closed",
			Errors: st.Errors, FailOpen: st.FailOpen, FailClosed: st.FailClosed, Local: st.Local}
		if st.Open {
			s.Breaker = "open"
		}
		ctx, cancel := context.WithTimeout(ctx, cfg.redisTimeout)
		defer cancel()
		start := time.Now()
		if err := c.Ping(ctx).Err(); err != nil {
			s.Healthy, s.Error = false, err.Error()
		} else {
			s.LatencyMS = float64(time.Since(start).Microseconds()) / 1000
		}
		return s
	}
}

const topUsage = `Usage: sluice top -addr HOST:PORT [flags]

Top shows in the terminal what the dashboard of a running sluice serve
shows: for every rule, its decisions and denials per second and its
hottest, most denied and nearest-the-limit keys, and the semaphores held
through its coordination API (each holder's fence, weight, time held and
time left, and the acquires waiting), refreshed every
-interval (the screen is redrawn) or printed once with -once (totals
only: a rate needs two readings). It reads GET /admin/v1/status of the
admin listener at -addr with the bearer token from -token-file or, failing
that, the SLUICE_ADMIN_TOKEN environment variable.
`

// topStatusMaxBytes bounds the status read from the admin API.
const topStatusMaxBytes = 8 << 20

func runTop(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("top", topUsage, stderr)
	addr := fs.String("addr", "", "admin API `address` (host:port) of sluice serve; required")
	tokenFile := fs.String("token-file", "", "`file` holding the admin token (default: $"+adminTokenEnv+")")
	once := fs.Bool("once", false, "print the tables once and exit")
	interval := fs.Duration("interval", 2*time.Second, "time between refreshes")
	k := fs.Int("k", 5, "keys shown per table (1 to 1000)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *addr == "" {
		return usagef("top: -addr is required: the --admin-addr of sluice serve")
	}
	if *interval < 100*time.Millisecond {
		return usagef("top: -interval %v: want at least 100ms", *interval)
	}
	if _, err := dashboard.ParseK(strconv.Itoa(*k)); err != nil {
		return usagef("top: -%v", err)
	}
	token, err := secret(*tokenFile, adminTokenEnv)
	if err != nil {
		return fmt.Errorf("top: reading the admin token: %w", err)
	}
	c := &topClient{
		url:   "http://" + *addr + "/admin/v1/status?k=" + strconv.Itoa(*k),
		token: strings.TrimSpace(token),
		http:  &http.Client{Timeout: 5 * time.Second},
	}
	var prev *dashboard.Status
	for {
		st, err := c.get(ctx)
		if err != nil {
			return err
		}
		var b bytes.Buffer
		if !*once {
			b.WriteString("\x1b[H\x1b[2J") // home, clear the screen
		}
		renderTop(&b, st, prev)
		if _, err := stdout.Write(b.Bytes()); err != nil || *once {
			return err
		}
		prev = st
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(*interval):
		}
	}
}

type topClient struct {
	url, token string
	http       *http.Client
}

func (c *topClient) get(ctx context.Context) (*dashboard.Status, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url, nil)
	if err != nil {
		return nil, fmt.Errorf("top: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("top: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("top: %s answered %s: %s", c.url, resp.Status, bytes.TrimSpace(msg))
	}
	return decodeStatus(resp.Body)
}

// decodeStatus reads a status of at most topStatusMaxBytes.
func decodeStatus(r io.Reader) (*dashboard.Status, error) {
	b, err := io.ReadAll(io.LimitReader(r, topStatusMaxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("top: reading the status: %w", err)
	}
	if len(b) > topStatusMaxBytes {
		return nil, fmt.Errorf("top: the status is larger than %d bytes", topStatusMaxBytes)
	}
	var st dashboard.Status
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("top: decoding the status: %w", err)
	}
	return &st, nil
}

// renderTop writes the tables of st; with prev, the previous reading, the
// rates since.
func renderTop(w io.Writer, st, prev *dashboard.Status) {
	fmt.Fprintf(w, "%s at %s\n", st.Title, st.Time.Format(time.TimeOnly))
	if s := st.Store; s != nil {
		health := "healthy"
		if !s.Healthy {
			health = "DOWN: " + s.Error
		}
		fmt.Fprintf(w, "store %s %s; breaker %s; failed calls %d; fail_open %d fail_closed %d local %d\n",
			s.Kind, health, orDash(s.Breaker), s.Errors, s.FailOpen, s.FailClosed, s.Local)
	}
	before := map[string]dashboard.LimitStatus{}
	var dt float64
	if prev != nil {
		dt = st.Time.Sub(prev.Time).Seconds()
		for _, l := range prev.Limits {
			before[l.Domain+"\x00"+l.Name] = l
		}
	}
	idle := 0
	for _, l := range st.Limits {
		if l.Decisions == 0 {
			idle++
			continue
		}
		fmt.Fprintf(w, "\n%s / %s", l.Domain, l.Name)
		if l.Limit > 0 {
			unit := ""
			if l.CostUnit != "" {
				unit = " " + l.CostUnit
			}
			fmt.Fprintf(w, "  (%d%s per %s)", l.Limit, unit, orDash(l.Window))
		}
		fmt.Fprintf(w, "  %d decisions, %d denied", l.Decisions, l.Denied)
		if l.Sample > 1 {
			fmt.Fprintf(w, " (1 in %d counted)", l.Sample)
		}
		if p, ok := before[l.Domain+"\x00"+l.Name]; ok && dt > 0 {
			fmt.Fprintf(w, "  %.1f/s, %.1f denied/s", float64(l.Decisions-p.Decisions)/dt, float64(l.Denied-p.Denied)/dt)
		}
		fmt.Fprintln(w)
		if len(l.Hot) == 0 {
			continue
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  HOT\tDECISIONS\t±\tMOST DENIED\tDENIED\t±\tNEAR LIMIT\tUSED\tWHOLE IN\t")
		for i := range max(len(l.Hot), len(l.MostDenied), len(l.Near)) {
			cells := make([]string, 0, 9)
			if i < len(l.Hot) {
				cells = append(cells, "  "+l.Hot[i].Key, strconv.FormatInt(l.Hot[i].Count, 10), strconv.FormatInt(l.Hot[i].Err+3*l.Hot[i].Sigma, 10))
			} else {
				cells = append(cells, "", "", "")
			}
			if i < len(l.MostDenied) {
				cells = append(cells, l.MostDenied[i].Key, strconv.FormatInt(l.MostDenied[i].Denied, 10), strconv.FormatInt(l.MostDenied[i].Err+3*l.MostDenied[i].Sigma, 10))
			} else {
				cells = append(cells, "", "", "")
			}
			if i < len(l.Near) {
				cells = append(cells, l.Near[i].Key, fmt.Sprintf("%.0f%%", l.Near[i].Used*100), l.Near[i].WholeIn.Round(100*time.Millisecond).String())
			} else {
				cells = append(cells, "", "", "")
			}
			fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t")
		}
		tw.Flush()
	}
	switch {
	case len(st.Limits) == 0:
		fmt.Fprintln(w, "\nno rule is tracked (serve runs with --top-k 0, or no rule is loaded)")
	case idle > 0:
		fmt.Fprintf(w, "\n%d of %d rules decided nothing yet\n", idle, len(st.Limits))
	}
	renderCoordination(w, st.Coordination)
}

// renderCoordination writes what the coordination API holds: one line
// per holder of each semaphore acquired through serve, the semaphore's
// own cells on its first line; then one line per remote holder of each
// leased service, likewise.
func renderCoordination(w io.Writer, c *dashboard.CoordinationStatus) {
	if c == nil {
		return
	}
	renderCoordSemaphores(w, c.Semaphores)
	renderCoordLeases(w, c.Leases)
}

func msString(v int64) string { return (time.Duration(v) * time.Millisecond).String() }

// renderCoordSemaphores writes the semaphores held through serve.
func renderCoordSemaphores(w io.Writer, sems []dashboard.HeldSemaphore) {
	if len(sems) == 0 {
		return
	}
	fmt.Fprintln(w, "\nsemaphores held through the coordination API (holders of every replica, waiters of this one)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  SEMAPHORE\tLIMIT\tHELD\tWAITING\tQUEUED\tFENCE\tWEIGHT\tHELD FOR\tEXPIRES IN\t")
	ms := msString
	for _, s := range sems {
		queued := "-"
		if s.Queued >= 0 {
			queued = strconv.Itoa(s.Queued)
		}
		head := fmt.Sprintf("  %s\t%d\t%d\t%d\t%s", s.Name, s.Limit, s.Held, s.Waiting, queued)
		switch {
		case s.Error != "":
			fmt.Fprintf(tw, "%s\t\t\tcannot read: %s\t\t\n", head, s.Error)
			continue
		case len(s.Holders) == 0:
			fmt.Fprintf(tw, "%s\t-\t\t\t\t\n", head)
			continue
		}
		for i, h := range s.Holders {
			if i > 0 {
				head = "  \t\t\t\t"
			}
			held := "unknown"
			if h.HeldForMS != nil {
				held = ms(*h.HeldForMS)
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t\n", head, h.Fence, h.Weight, held, ms(h.ExpiresInMS))
		}
	}
	tw.Flush()
}

// renderCoordLeases writes the leased services serve runs remote holders
// for: each holder by its member id in the store, never its holder id.
func renderCoordLeases(w io.Writer, svcs []dashboard.LeasedService) {
	if len(svcs) == 0 {
		return
	}
	fmt.Fprintln(w, "\nleases held through the coordination API (the remote holders this replica runs, latest joined first)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  SERVICE\tCAPACITY\tPARTITIONS\tHOLDERS\tMEMBER\tWEIGHT\tJOINED\tRATE\tDEMAND\tBACKLOG\tLEASES\tVALID FOR\tHEARTBEAT\t")
	num := func(v float64) string { return strconv.FormatFloat(math.Round(v*10)/10, 'f', -1, 64) }
	for _, s := range svcs {
		head := fmt.Sprintf("  %s\t%s\t%d\t%d", s.Service, num(s.Capacity), s.Partitions, s.HolderCount)
		if len(s.Holders) == 0 {
			fmt.Fprintf(tw, "%s\t-\t\t\t\t\t\t\t\t\t\n", head)
			continue
		}
		for i, h := range s.Holders {
			if i > 0 {
				head = "  \t\t\t"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s ago\t%s/s\t%s/s\t%d\t%d\t%s\t%s ago\t\n", head, h.Member, num(h.Weight), msString(h.JoinedForMS),
				num(h.Rate), num(h.DemandRate), h.Backlog, h.Leases, msString(h.ValidForMS), msString(h.HeartbeatAgoMS))
		}
		if more := s.HolderCount - len(s.Holders); more > 0 {
			fmt.Fprintf(tw, "  \t\t\t\t(%d more)\t\t\t\t\t\t\t\t\t\n", more)
		}
	}
	tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
