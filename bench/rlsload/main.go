// Command rlsload is a closed-loop load generator for Envoy rate limit
// services: C concurrent callers send ShouldRateLimit for D, each request
// carrying one descriptor whose value is one of K distinct keys. It reports
// requests per second and latency percentiles, and, given the server's PID,
// the server CPU time spent per request (from /proc), with its own and the
// whole machine's: on a machine the load generator shares with the server,
// requests/s is about the busy CPU divided by the machine's CPU per
// request, so that is where a ratio to another server comes from.
// With -http it sends the same decisions as POST /v1/check (Sluice's JSON
// API) over HTTP/1.1, one keep-alive connection per caller. Loopback only.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/sluicehq/sluice/bench/loadrun"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// config is one run's flags.
type config struct {
	addr, domain, key, name string
	callers, keys, n        int
	dur                     time.Duration
	pid, storePID           int
	asJSON, http            bool
}

func main() {
	var c config
	flag.StringVar(&c.addr, "addr", "127.0.0.1:8081", "server address; must be loopback")
	flag.IntVar(&c.callers, "c", 16, "concurrent callers")
	flag.DurationVar(&c.dur, "d", 5*time.Second, "duration (at most 2m)")
	flag.IntVar(&c.n, "n", 0, "requests after the warm-up, shared among the callers, instead of a duration (at most 10,000,000)")
	flag.IntVar(&c.keys, "k", 10000, "distinct descriptor values")
	flag.StringVar(&c.domain, "domain", "bench", "domain")
	flag.StringVar(&c.key, "key", "remote_address", "descriptor key")
	flag.IntVar(&c.pid, "pid", 0, "server PID, to report its CPU per request")
	flag.IntVar(&c.storePID, "store-pid", 0, "the store's PID (a redis-server), to report its CPU per request")
	flag.StringVar(&c.name, "name", "", "label for the result")
	flag.BoolVar(&c.asJSON, "json", false, "print one JSON object")
	flag.BoolVar(&c.http, "http", false, "POST /v1/check over HTTP/1.1 to addr instead of calling ShouldRateLimit over gRPC")
	flag.Parse()
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "rlsload:", err)
		os.Exit(1)
	}
}

func run(c config) error {
	host, _, err := net.SplitHostPort(c.addr)
	if err != nil {
		return err
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return errors.New("refusing a non-loopback address")
	}
	lc := loadrun.Config{
		Name: c.name, Domain: c.domain, Callers: c.callers, Keys: c.keys, Dur: c.dur, N: c.n,
		PIDs: []int{c.pid}, StorePID: c.storePID,
	}
	if err := lc.Check(); err != nil {
		return err
	}
	call, closeCall, err := caller(c)
	if err != nil {
		return err
	}
	defer closeCall()
	r, err := loadrun.Run(lc, call)
	if err != nil {
		return err
	}
	return r.Print(os.Stdout, c.asJSON)
}

// caller returns the function that sends the decision of key i and reports
// whether it was over the limit, and what closes its connections.
func caller(c config) (func(i int) (bool, error), func(), error) {
	if c.http {
		bodies := make([][]byte, c.keys)
		for i := range bodies {
			b, err := json.Marshal(map[string]any{"domain": c.domain, "descriptors": []any{map[string]any{"entries": []any{map[string]string{"key": c.key, "value": loadrun.Value(i)}}}}})
			if err != nil {
				return nil, nil, err
			}
			bodies[i] = b
		}
		tr := &http.Transport{MaxIdleConnsPerHost: c.callers, MaxConnsPerHost: c.callers, DisableCompression: true}
		client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
		url := "http://" + c.addr + "/v1/check"
		return func(i int) (bool, error) {
			resp, err := client.Post(url, "application/json", bytes.NewReader(bodies[i]))
			if err != nil {
				return false, err
			}
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			switch {
			case err != nil:
				return false, err
			case resp.StatusCode == http.StatusTooManyRequests:
				return true, nil
			case resp.StatusCode != http.StatusOK:
				return false, fmt.Errorf("status %d", resp.StatusCode)
			}
			return false, nil
		}, tr.CloseIdleConnections, nil
	}
	conn, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	client := rlsv3.NewRateLimitServiceClient(conn)
	reqs := make([]*rlsv3.RateLimitRequest, c.keys)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: c.domain, Descriptors: []*commonv3.RateLimitDescriptor{{
			Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: c.key, Value: loadrun.Value(i)}},
		}}}
	}
	return func(i int) (bool, error) {
		resp, err := client.ShouldRateLimit(context.Background(), reqs[i])
		if err != nil {
			return false, err
		}
		return resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT, nil
	}, func() { conn.Close() }, nil
}
