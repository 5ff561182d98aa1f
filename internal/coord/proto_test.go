package coord

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
)

// TestGeneratedCode regenerates sluicev1 from proto/ into a temporary
// directory, as `make proto` does (buf at the Makefile's BUF_VERSION,
// protoc-gen-go at go.mod's version, both through go run), and fails when
// the checked-in code differs: run `make proto`. Without the generator
// (no module proxy, no build cache) it skips, unless CI=true.
func TestGeneratedCode(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the generator takes a while to build on a cold cache")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^BUF_VERSION \?= (\S+)$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("the Makefile sets no BUF_VERSION")
	}
	out := t.TempDir()
	cmd := exec.Command("go", "run", "github.com/bufbuild/buf/cmd/buf@"+string(m[1]),
		"generate", "proto", "--template", "proto/buf.gen.yaml", "--output", out)
	cmd.Dir = root
	if msg, err := cmd.CombinedOutput(); err != nil {
		if os.Getenv("CI") != "true" {
			t.Skipf("cannot run the generator (CI=true would fail): %v\n%s", err, msg)
		}
		t.Fatalf("generating: %v\n%s", err, msg)
	}
	for _, file := range []string{
		"internal/coord/sluicev1/semaphore.pb.go",
		"internal/coord/sluicev1/lease.pb.go",
		"internal/coord/sluicev1/ratelimit.pb.go", // sluice.v1.RateLimitService (internal/reserve)
	} {
		got, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(filepath.Join(out, file))
		if err != nil {
			t.Fatalf("the generator wrote no %s: %v", file, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run `make proto` and commit the result", file)
		}
	}
}
