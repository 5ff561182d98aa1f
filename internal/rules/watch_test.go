package rules

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// ruleFile is a one-limit rule file of domain with n per second on key k.
func ruleFile(domain string, n int) string {
	return fmt.Sprintf("domain: %s\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: %d}\n", domain, n)
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// watchHarness runs a Watcher of dir and collects its callbacks.
type watchHarness struct {
	w      *Watcher
	loads  chan *Set
	errs   chan error
	cancel context.CancelFunc
	done   chan error
}

func startWatcher(t *testing.T, dir string) *watchHarness {
	t.Helper()
	h := &watchHarness{loads: make(chan *Set, 16), errs: make(chan error, 16), done: make(chan error, 1)}
	var err error
	h.w, err = NewWatcher(dir, WatchOptions{
		OnLoad:   func(s *Set) { h.loads <- s },
		OnError:  func(err error) { h.errs <- err },
		Debounce: 10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	h.cancel = cancel
	go func() { h.done <- h.w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-h.done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return h
}

const waitFor = 10 * time.Second

// nextLoad waits for a successful load and returns it.
func (h *watchHarness) nextLoad(t *testing.T) *Set {
	t.Helper()
	select {
	case s := <-h.loads:
		return s
	case err := <-h.errs:
		t.Fatalf("load failed: %v", err)
	case <-time.After(waitFor):
		t.Fatal("no load within", waitFor)
	}
	return nil
}

// loadWith waits until a load gives domain d a first rule of limit n:
// editors may make several loads out of one save.
func (h *watchHarness) loadWith(t *testing.T, d string, n int64) *Set {
	t.Helper()
	deadline := time.After(waitFor)
	for {
		select {
		case s := <-h.loads:
			if dom, ok := s.Domain(d); ok && dom.Specs()[0].Rule.Quota == n {
				return s
			}
		case <-h.errs:
			// a half-written file; the final state follows
		case <-deadline:
			t.Fatalf("no load with %s at %d within %v", d, n, waitFor)
		}
	}
}

func limitOf(t *testing.T, s *Set, domain string) int64 {
	t.Helper()
	d, ok := s.Domain(domain)
	if !ok {
		t.Fatalf("domain %q not loaded; have %v", domain, s.Domains())
	}
	return d.Specs()[0].Rule.Quota
}

func TestWatcherReloadsOnWrite(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), ruleFile("a", 1))
	h := startWatcher(t, dir)
	if got := limitOf(t, h.nextLoad(t), "a"); got != 1 {
		t.Fatalf("initial limit = %d, want 1", got)
	}
	writeFile(t, filepath.Join(dir, "a.yaml"), ruleFile("a", 2))
	h.loadWith(t, "a", 2)

	writeFile(t, filepath.Join(dir, "b.yaml"), ruleFile("b", 3))
	s := h.loadWith(t, "b", 3)
	if got := strings.Join(s.Domains(), ","); got != "a,b" {
		t.Errorf("domains = %s, want a,b", got)
	}
	if st := h.w.Status(); st.LastError != nil || st.Loads < 3 || st.LastGood.IsZero() {
		t.Errorf("status = %+v", st)
	}
}

func TestWatcherRenameOver(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "a.yaml")
	writeFile(t, path, ruleFile("a", 1))
	h := startWatcher(t, dir)
	h.nextLoad(t)
	// As vim and most editors save: write a new file, rename it over.
	tmp := filepath.Join(dir, ".a.yaml.swp")
	writeFile(t, tmp, ruleFile("a", 7))
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	h.loadWith(t, "a", 7)
}

func TestWatcherKeepsLastGood(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "a.yaml")
	writeFile(t, path, ruleFile("a", 1))
	h := startWatcher(t, dir)
	h.nextLoad(t)

	writeFile(t, path, "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	select {
	case err := <-h.errs:
		if !strings.Contains(err.Error(), "a.yaml:4") || !strings.Contains(err.Error(), "fortnight") {
			t.Errorf("error %q does not name the file, line and value", err)
		}
	case s := <-h.loads:
		t.Fatalf("a broken file loaded: %v", s.Domains())
	case <-time.After(waitFor):
		t.Fatal("no failed load within", waitFor)
	}
	st := h.w.Status()
	if st.LastError == nil || st.Failures == 0 {
		t.Errorf("status after a broken file = %+v, want its error", st)
	}

	writeFile(t, path, ruleFile("a", 5))
	h.loadWith(t, "a", 5)
	if st := h.w.Status(); st.LastError != nil {
		t.Errorf("status after the fix = %+v, want no error", st)
	}
}

// TestWatcherConfigMapSwap replays what the kubelet does to a ConfigMap
// volume: files are symlinks through ..data to a timestamped directory,
// and an update renames a new ..data symlink over the old one.
func TestWatcherConfigMapSwap(t *testing.T) {
	dir := t.TempDir()
	version := func(name string, n int) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, name, "a.yaml"), ruleFile("a", n))
	}
	version("..2026_11_30_1", 1)
	if err := os.Symlink("..2026_11_30_1", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join("..data", "a.yaml"), filepath.Join(dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	h := startWatcher(t, dir)
	if got := limitOf(t, h.nextLoad(t), "a"); got != 1 {
		t.Fatalf("initial limit = %d, want 1", got)
	}

	version("..2026_11_30_2", 9)
	if err := os.Symlink("..2026_11_30_2", filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "..2026_11_30_1")); err != nil {
		t.Fatal(err)
	}
	h.loadWith(t, "a", 9)
}

func TestWatcherReloadNow(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), ruleFile("a", 1))
	var got *Set
	w, err := NewWatcher(dir, WatchOptions{OnLoad: func(s *Set) { got = s }})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Reload(); err != nil || got == nil {
		t.Fatalf("Reload = %v, set %v", err, got)
	}
	writeFile(t, filepath.Join(dir, "a.yaml"), "domain: [")
	if err := w.Reload(); err == nil {
		t.Fatal("Reload of a broken file succeeded")
	}
	if limitOf(t, got, "a") != 1 {
		t.Error("a failed reload replaced the set")
	}
	if _, err := NewWatcher(dir, WatchOptions{}); err == nil {
		t.Error("NewWatcher without OnLoad succeeded")
	}
}

func TestWatcherMissingDir(t *testing.T) {
	w, err := NewWatcher(filepath.Join(t.TempDir(), "nope"), WatchOptions{OnLoad: func(*Set) {}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(t.Context()); err == nil {
		t.Error("Run on a missing directory returned nil")
	}
}

// TestWatcherRemovedDomains: a reload that drops a domain (its file
// deleted) says which, at Warn; with RefuseEmpty, a reload that would drop
// every domain is refused and the rules in force stay.
func TestWatcherRemovedDomains(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), ruleFile("a", 1))
	writeFile(t, filepath.Join(dir, "b.yaml"), ruleFile("b", 2))
	start, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	var got *Set
	w, err := NewWatcher(dir, WatchOptions{
		OnLoad:      func(s *Set) { got = s },
		Logger:      slog.New(slog.NewTextHandler(&log, nil)),
		Current:     start,
		RefuseEmpty: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "b.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := w.Reload(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(log.String(), "level=WARN") || !strings.Contains(log.String(), "removed=b") {
		t.Errorf("removing b's file logged %q, want a warning naming b", log.String())
	}
	if _, ok := got.Domain("b"); ok {
		t.Error("b is still loaded")
	}

	if err := os.Remove(filepath.Join(dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := w.Reload(); !errors.Is(err, ErrNoDomains) {
		t.Fatalf("a reload with no domain left = %v, want ErrNoDomains", err)
	}
	if limitOf(t, got, "a") != 1 {
		t.Error("the refused reload replaced the set")
	}
	if st := w.Status(); st.Failures != 1 || !errors.Is(st.LastError, ErrNoDomains) {
		t.Errorf("status after the refusal: %+v", st)
	}

	// Without RefuseEmpty, the empty directory applies, with a warning.
	log.Reset()
	w2, err := NewWatcher(dir, WatchOptions{OnLoad: func(s *Set) { got = s }, Logger: slog.New(slog.NewTextHandler(&log, nil)), Current: start})
	if err != nil {
		t.Fatal(err)
	}
	if err := w2.Reload(); err != nil {
		t.Fatal(err)
	}
	if len(got.Domains()) != 0 || !strings.Contains(log.String(), "removed=a,b") {
		t.Errorf("empty reload: domains %v, log %q", got.Domains(), log.String())
	}
}

// swapSymlink points link at target atomically, as Envoy's runtime
// deployments and Kubernetes publish a new version: a new link renamed
// over the old one.
func swapSymlink(t *testing.T, target, link string) {
	t.Helper()
	tmp := link + ".new"
	if err := os.Symlink(target, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, link); err != nil {
		t.Fatal(err)
	}
}

// TestWatcherRuntimeRootSwap follows Envoy's runtime layout: the rules in
// ROOT/sub/config, ROOT a symlink swapped to a new version. A watch placed
// on the old version's directory alone never sees the swap.
func TestWatcherRuntimeRootSwap(t *testing.T) {
	base := t.TempDir()
	for _, v := range []string{"v1", "v2"} {
		if err := os.MkdirAll(filepath.Join(base, v, "ratelimit", "config"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(base, "v1", "ratelimit", "config", "a.yaml"), ruleFile("a", 1))
	writeFile(t, filepath.Join(base, "v2", "ratelimit", "config", "a.yaml"), ruleFile("a", 2))
	root := filepath.Join(base, "current")
	if err := os.Symlink(filepath.Join(base, "v1"), root); err != nil {
		t.Fatal(err)
	}
	h := &watchHarness{loads: make(chan *Set, 16), errs: make(chan error, 16), done: make(chan error, 1)}
	w, err := NewWatcher(filepath.Join(root, "ratelimit", "config"), WatchOptions{
		OnLoad: func(s *Set) { h.loads <- s }, OnError: func(err error) { h.errs <- err },
		Debounce: 10 * time.Millisecond, Root: root,
	})
	if err != nil {
		t.Fatal(err)
	}
	h.w = w
	ctx, cancel := context.WithCancel(t.Context())
	go func() { h.done <- w.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-h.done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	if got := limitOf(t, h.nextLoad(t), "a"); got != 1 {
		t.Fatalf("first load: limit %d, want 1", got)
	}
	swapSymlink(t, filepath.Join(base, "v2"), root)
	h.loadWith(t, "a", 2)
	// The new version's directory is the one watched now.
	writeFile(t, filepath.Join(base, "v2", "ratelimit", "config", "a.yaml"), ruleFile("a", 3))
	h.loadWith(t, "a", 3)
}

// TestWatcherDirSymlinkSwap: the rules directory itself is a symlink that
// is swapped.
func TestWatcherDirSymlinkSwap(t *testing.T) {
	base := t.TempDir()
	for i, v := range []string{"v1", "v2"} {
		if err := os.Mkdir(filepath.Join(base, v), 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(base, v, "a.yaml"), ruleFile("a", i+1))
	}
	link := filepath.Join(base, "rules")
	if err := os.Symlink(filepath.Join(base, "v1"), link); err != nil {
		t.Fatal(err)
	}
	h := startWatcher(t, link)
	if got := limitOf(t, h.nextLoad(t), "a"); got != 1 {
		t.Fatalf("first load: limit %d, want 1", got)
	}
	swapSymlink(t, filepath.Join(base, "v2"), link)
	h.loadWith(t, "a", 2)
}

// TestLoadDirDotFiles: dot files are read only when asked.
func TestLoadDirDotFiles(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, ".hidden.yaml"), ruleFile("hidden", 1))
	for _, dot := range []bool{false, true} {
		s, err := LoadDir(dir, DirOptions{DotFiles: dot})
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := s.Domain("hidden"); ok != dot {
			t.Errorf("DotFiles %v: domain loaded %v", dot, ok)
		}
	}
}
