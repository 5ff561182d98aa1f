package main

import (
	"context"
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

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestShadowBesideTopK is the regression test of a request whose
// shadow-mode limits outnumber its other limits: the top-K tracker indexed
// the real limits' items with a shadow limit's index, and the binary died
// (gRPC) or dropped the call (HTTP). It drives the real binary on the
// shipped example rules, top-K on (the default), over gRPC, /json and
// /v1/check, on the memory store and on Redis.
func TestShadowBesideTopK(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildSluice(t)
	examples, err := filepath.Abs("../../examples/rules")
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("tok\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	stores := map[string]func(t *testing.T) []string{
		"memory": func(*testing.T) []string { return nil },
		"redis": func(t *testing.T) []string {
			return []string{"--store", "redis", "--redis-addr", redistest.Standalone(t).Addr()}
		},
	}
	for name, store := range stores {
		t.Run(name, func(t *testing.T) {
			args := append([]string{"serve", "--rules", examples, "--log-format", "json",
				"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
				"--admin-addr", "127.0.0.1:0", "--admin-token-file", tokenFile}, store(t)...)
			p := startSluice(t, bin, nil, args...)
			up := p.next(t, "sluice serving", 20*time.Second)
			testShadowBesideTopK(t, up.str("grpc"), up.str("http"), up.str("admin"))
			// Alive, and no panic recovered (startSluice's cleanup checks
			// the log too).
			if resp, err := http.Get("http://" + up.str("http") + "/readyz"); err != nil || resp.StatusCode != 200 {
				t.Fatalf("after the requests, /readyz: %v %v", resp, err)
			} else {
				resp.Body.Close()
			}
		})
	}
}

func testShadowBesideTopK(t *testing.T, grpcAddr, httpAddr, adminAddr string) {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := rlsv3.NewRateLimitServiceClient(conn)
	desc := func(k, v string) *commonv3.RateLimitDescriptor {
		return &commonv3.RateLimitDescriptor{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: k, Value: v}}}
	}
	post := func(path, body string) (int, string) {
		resp, err := http.Post("http://"+httpAddr+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatalf("%s: %v", path, err) // before the fix: EOF, the call dropped
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// One shadow descriptor alone, and two shadow beside one real one.
	requests := []struct {
		name  string
		descs [][2]string
	}{
		{"one shadow", [][2]string{{"api_key", "trial-7"}}},
		{"two shadow, one real", [][2]string{{"remote_address", "203.0.113.7"}, {"api_key", "trial-7"}, {"api_key", "trial-8"}}},
	}
	for _, r := range requests {
		var descs []*commonv3.RateLimitDescriptor
		var jsonDescs []string
		for _, d := range r.descs {
			descs = append(descs, desc(d[0], d[1]))
			jsonDescs = append(jsonDescs, `{"entries":[{"key":"`+d[0]+`","value":"`+d[1]+`"}]}`)
		}
		resp, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "demo", Descriptors: descs})
		if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || len(resp.GetStatuses()) != len(descs) {
			t.Fatalf("%s: gRPC: %v, %v", r.name, resp, err)
		}
		body := `{"domain":"demo","descriptors":[` + strings.Join(jsonDescs, ",") + `]}`
		if code, out := post("/json", body); code != 200 || !strings.Contains(out, `"OK"`) {
			t.Errorf("%s: /json: %d %s", r.name, code, out)
		}
		if code, out := post("/v1/check", body); code != 200 || !strings.Contains(out, `"shadow":true`) {
			t.Errorf("%s: /v1/check: %d %s", r.name, code, out)
		}
	}
	// The shadow rule's tracker saw its key: 2 + 2·3 trial requests.
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+adminAddr+"/admin/v1/top?domain=demo&rule=api_key_trial_pool", nil)
	req.Header.Set("Authorization", "Bearer tok")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(string(b), "trial") {
		t.Errorf("top of the shadow rule: %d %s", resp.StatusCode, b)
	}
}
