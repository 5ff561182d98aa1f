package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/internal/coord/sluicev1"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/reserve"
)

const settleRules = `domain: llm
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: gcra, name: tokens}
`

// TestSettleBinary drives the built binary's reservations with
// settlement, on the memory store, Redis and a Redis Cluster: a
// reservation over
// /v1/check settled over /v1/settle, one over gRPC's Reserve settled over
// HTTP and repeated over gRPC's Settle, and Envoy's request-time and
// stream-done calls (sluice_reserve, sluice_settle) over the rate limit
// service; each step checked by what remains of the limit, and the
// settlements by their metrics.
func TestSettleBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildSluice(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "llm.yaml"), []byte(settleRules), 0o644); err != nil {
		t.Fatal(err)
	}
	stores := map[string]func(t *testing.T) []string{
		"memory": func(*testing.T) []string { return nil },
		"redis": func(t *testing.T) []string {
			return []string{"--store", "redis", "--redis-addr", redistest.Standalone(t).Addr()}
		},
		// The reservations' records and the counters in different slots.
		"cluster": func(t *testing.T) []string {
			return []string{"--store", "redis", "--redis-addr", strings.Join(redistest.Cluster(t).Addrs(), ",")}
		},
	}
	for name, store := range stores {
		t.Run(name, func(t *testing.T) {
			args := append([]string{"serve", "--rules", dir, "--log-format", "json",
				"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, store(t)...)
			p := startSluice(t, bin, nil, args...)
			up := p.next(t, "sluice serving", 20*time.Second)
			testSettleServe(t, up.str("grpc"), up.str("http"))
		})
	}
}

func testSettleServe(t *testing.T, grpcAddr, httpAddr string) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	api := loadOpenAPI(t)
	post := func(path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+httpAddr+path, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if path == "/v1/settle" { // every answer against docs/openapi.yaml
			if err := api.checkResponse(path, resp.StatusCode, resp.Header.Get("Content-Type"), b); err != nil {
				t.Errorf("%s %s: %v", path, body, err)
			}
		}
		return resp.StatusCode, string(b)
	}
	remaining := func(user string) int64 {
		t.Helper()
		code, body := post("/v1/check", `{"domain":"llm","descriptors":[{"entries":[{"key":"user","value":"`+user+`"}]}],"cost":0}`)
		var r struct {
			Descriptors []struct {
				Remaining int64 `json:"remaining"`
			} `json:"descriptors"`
		}
		if err := json.Unmarshal([]byte(body), &r); code != 200 || err != nil || len(r.Descriptors) != 1 {
			t.Fatalf("check: %d %s (%v)", code, body, err)
		}
		return r.Descriptors[0].Remaining
	}
	type settled struct {
		Settled        bool  `json:"settled"`
		AlreadySettled bool  `json:"already_settled"`
		Refunded       int64 `json:"refunded"`
		Charged        int64 `json:"charged"`
	}
	settle := func(body string) settled {
		t.Helper()
		code, b := post("/v1/settle", body)
		var s settled
		if err := json.Unmarshal([]byte(b), &s); code != 200 || err != nil {
			t.Fatalf("settle %s: %d %s (%v)", body, code, b, err)
		}
		return s
	}

	// HTTP: reserve 60, settle at 20.
	code, body := post("/v1/check", `{"domain":"llm","descriptors":[{"entries":[{"key":"user","value":"h"}]}],"cost":60,"settle":true}`)
	var checked struct {
		Reservation string `json:"reservation"`
	}
	if err := json.Unmarshal([]byte(body), &checked); code != 200 || err != nil || len(checked.Reservation) != 22 {
		t.Fatalf("check with settle: %d %s (%v)", code, body, err)
	}
	if s := settle(`{"reservation":"` + checked.Reservation + `","cost":20}`); !s.Settled || s.Refunded != 40 {
		t.Fatalf("settle at 20: %+v", s)
	}
	if r := remaining("h"); r != 80 {
		t.Fatalf("remaining %d after 60 settled at 20, want 80", r)
	}
	if code, body := post("/v1/settle", `{"reservation":"AAAAAAAAAAAAAAAAAAAAAA","cost":1}`); code != 404 {
		t.Fatalf("unknown reservation: %d %s", code, body)
	}

	// gRPC: reserve 10, settle at 30 over HTTP, repeat over gRPC.
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ten := int64(10)
	var res sluicev1.ReserveResponse
	err = conn.Invoke(ctx, reserve.ReserveMethod, &sluicev1.ReserveRequest{
		Domain:      "llm",
		Descriptors: []*sluicev1.RateLimitDescriptor{{Entries: []*sluicev1.RateLimitEntry{{Key: "user", Value: "g"}}}},
		Cost:        &ten, MaxWait: durationpb.New(0), Settle: true,
	}, &res)
	if err != nil || !res.GetAllowed() || len(res.GetReservation()) != 22 {
		t.Fatalf("gRPC Reserve with settle: %v %v", err, &res)
	}
	if s := settle(`{"reservation":"` + res.GetReservation() + `","descriptors":[{"cost":30}]}`); !s.Settled || s.Charged != 20 {
		t.Fatalf("settle at 30: %+v", s)
	}
	var again sluicev1.SettleResponse
	if err := conn.Invoke(ctx, reserve.SettleMethod, &sluicev1.SettleRequest{Reservation: res.GetReservation(), Cost: &ten}, &again); err != nil || !again.GetAlreadySettled() {
		t.Fatalf("gRPC Settle again: %v %v", err, &again)
	}
	if r := remaining("g"); r != 70 {
		t.Fatalf("remaining %d after 10 settled at 30, want 70", r)
	}

	// Envoy: a request-time call reserves 50, its stream-done call
	// settles at 5.
	rls := rlsv3.NewRateLimitServiceClient(conn)
	envoy := func(n uint64, kv ...string) *rlsv3.RateLimitResponse {
		t.Helper()
		d := &commonv3.RateLimitDescriptor{HitsAddend: wrapperspb.UInt64(n)}
		for i := 0; i+1 < len(kv); i += 2 {
			d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
		}
		out, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*commonv3.RateLimitDescriptor{d}})
		if err != nil || out.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("ShouldRateLimit %v: %v %v", kv, err, out)
		}
		return out
	}
	envoy(50, "user", "e", "sluice_reserve", "7f0c-req")
	if r := remaining("e"); r != 50 {
		t.Fatalf("remaining %d after Envoy's estimate of 50, want 50", r)
	}
	envoy(5, "user", "e", "sluice_settle", "7f0c-req")
	if r := remaining("e"); r != 95 {
		t.Fatalf("remaining %d after Envoy's stream-done settlement at 5, want 95", r)
	}

	code, metrics := func() (int, string) {
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+httpAddr+"/metrics", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}()
	for _, want := range []string{
		`sluice_settlements_total{outcome="settled"} 3`,
		`sluice_settlements_total{outcome="already_settled"} 1`,
		`sluice_settlements_total{outcome="unknown"} 1`,
		`sluice_settled_units_total{direction="refunded"} 85`,
		`sluice_settled_units_total{direction="charged"} 20`,
	} {
		if code != 200 || !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}
