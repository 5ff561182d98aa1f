package rules

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
)

// DefaultDebounce is how long a Watcher waits after the last change in its
// directory before it reloads, when WatchOptions.Debounce is 0.
const DefaultDebounce = 100 * time.Millisecond

// WatchOptions configure a Watcher.
type WatchOptions struct {
	// OnLoad receives every set loaded without error. Required. It is
	// called from one goroutine at a time, in load order.
	OnLoad func(*Set)
	// OnError, if not nil, receives every failed load; the last good set
	// stays in force.
	OnError func(error)
	// Debounce is the quiet time after a change before a reload; 0 means
	// DefaultDebounce. Editors and Kubernetes write a change as several
	// events; one reload follows them all.
	Debounce time.Duration
	// Logger logs reloads and their errors; nil discards.
	Logger *slog.Logger
	// Current is the set in force before the Watcher's first load (the
	// one the program started with), which the first load is compared
	// with; nil means none.
	Current *Set
	// RefuseEmpty refuses a load that would leave no domain while some
	// are in force (every rule file deleted, a volume mounted empty): it
	// fails like a broken file, with ErrNoDomains, and the last good set
	// stays. Without it such a load applies, and every request is OK.
	RefuseEmpty bool
	// Dir says which files of the directory are read (DirOptions).
	Dir DirOptions
	// Root, if set, is a symlink above the directory (Envoy's runtime
	// layout: RUNTIME_ROOT, with the rules in RUNTIME_ROOT/<subdirectory>/
	// config) that a deployment swaps to publish a new version of every
	// file at once; the Watcher reloads when it changes. The directory
	// itself, when it is a symlink, is followed the same way without it.
	Root string
}

// ErrNoDomains is the error of a load refused by WatchOptions.RefuseEmpty.
var ErrNoDomains = errors.New("rules: the directory holds no domain any more; keeping the rules in force (RefuseEmpty)")

// A Watcher reloads a rules directory when it changes: it watches the
// directory (not its files, so editors that save by renaming a new file
// over the old one, and Kubernetes ConfigMap volumes that swap a symlink,
// are both seen), waits until the changes settle, loads the whole
// directory, and hands a good Set to OnLoad. A load that fails keeps the
// last good set: OnError gets the error, which names every file, line and
// key at fault, and Status reports it until a later load succeeds.
//
// Run is the Watcher's goroutine; Reload loads at once, from any
// goroutine. Loads never overlap.
type Watcher struct {
	dir  string
	opts WatchOptions
	log  *slog.Logger

	load    sync.Mutex // serialises loads and their callbacks
	current *Set       // the set in force: the last good load; guarded by load

	mu     sync.Mutex
	status WatchStatus
}

// WatchStatus is the outcome of a Watcher's loads.
type WatchStatus struct {
	// Loads and Failures count the loads done and those that failed.
	Loads, Failures int
	// LastLoad is when the last load finished; LastGood when the last
	// successful one did.
	LastLoad, LastGood time.Time
	// LastError is the error of the last load, nil when it succeeded.
	LastError error
}

// NewWatcher returns a Watcher of dir. It does not read dir until Run or
// Reload.
func NewWatcher(dir string, opts WatchOptions) (*Watcher, error) {
	if opts.OnLoad == nil {
		return nil, errors.New("rules: WatchOptions.OnLoad is required")
	}
	if opts.Debounce <= 0 {
		opts.Debounce = DefaultDebounce
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Watcher{dir: dir, opts: opts, log: log, current: opts.Current}, nil
}

// Status returns the outcome of the loads so far.
func (w *Watcher) Status() WatchStatus {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.status
}

// Reload loads the directory now and returns the load's error; on success
// OnLoad has been called when it returns.
func (w *Watcher) Reload() error {
	w.load.Lock()
	defer w.load.Unlock()
	set, err := LoadDir(w.dir, w.opts.Dir)
	if err == nil && w.opts.RefuseEmpty && len(set.names) == 0 && len(w.current.Domains()) > 0 {
		err = ErrNoDomains
	}
	now := time.Now()
	w.mu.Lock()
	w.status.Loads++
	w.status.LastLoad = now
	w.status.LastError = err
	if err != nil {
		w.status.Failures++
	} else {
		w.status.LastGood = now
	}
	w.mu.Unlock()
	if err != nil {
		w.log.Error("rules reload failed; keeping the last good rules", "dir", w.dir, "err", err)
		if w.opts.OnError != nil {
			w.opts.OnError(err)
		}
		return err
	}
	removed := removedDomains(w.current, set)
	w.opts.OnLoad(set)
	w.current = set
	// Logged once the rules are in force, so that whoever reads the log
	// (the end-to-end test does) may rely on them. A domain that went away
	// is a change worth a warning: its requests are now all OK.
	if len(removed) > 0 {
		w.log.Warn("rules loaded; domains removed, their requests are no longer limited", "dir", w.dir, "removed", strings.Join(removed, ","), "domains", len(set.names), "files", len(set.files))
	} else {
		w.log.Info("rules loaded", "dir", w.dir, "domains", len(set.names), "files", len(set.files))
	}
	return nil
}

// removedDomains returns the domains of prev that next does not hold.
func removedDomains(prev, next *Set) []string {
	var out []string
	for _, d := range prev.Domains() {
		if _, ok := next.Domain(d); !ok {
			out = append(out, d)
		}
	}
	return out
}

// Run watches the directory until ctx is done, then returns nil. Once the
// watch is in place it loads the directory (so that no change made before
// is missed), then again after every change, debounced. It returns an
// error only when the directory cannot be watched.
//
// A watch follows the directory it was given at the time it was placed,
// so Run also watches the parent of the directory and of Root: when
// either path is replaced (a symlink swapped to a new version), it
// watches the directory again, at its new place, before it reloads.
func (w *Watcher) Run(ctx context.Context) error {
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("rules: watching %s: %w", w.dir, err)
	}
	defer fw.Close()
	if err := fw.Add(w.dir); err != nil {
		return fmt.Errorf("rules: watching %s: %w", w.dir, err)
	}
	dir := filepath.Clean(w.dir)
	anchors := []string{dir}
	if w.opts.Root != "" {
		anchors = append(anchors, filepath.Clean(w.opts.Root))
	}
	for _, a := range anchors {
		if err := fw.Add(filepath.Dir(a)); err != nil {
			w.log.Warn("rules: cannot watch the parent directory; a swap of the path will not be seen", "path", a, "err", err)
		}
	}
	_ = w.Reload() // errors are reported through OnError and Status
	swapped := false

	timer := time.NewTimer(0)
	if !timer.Stop() {
		<-timer.C
	}
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-fw.Events:
			if !ok {
				return errors.New("rules: the directory watch closed")
			}
			if ev.Op == fsnotify.Chmod {
				continue // touch, chmod: the content did not change
			}
			name := filepath.Clean(ev.Name)
			if slices.Contains(anchors, name) {
				swapped = true
			} else if filepath.Dir(name) != dir {
				continue // a neighbour of the directory or of Root
			}
			timer.Reset(w.opts.Debounce)
		case err, ok := <-fw.Errors:
			if !ok {
				return errors.New("rules: the directory watch closed")
			}
			// An overflow loses events: reload to be sure.
			w.log.Warn("rules watch error; reloading", "dir", w.dir, "err", err)
			timer.Reset(w.opts.Debounce)
		case <-timer.C:
			if swapped {
				// The path may lead somewhere else now: watch it anew.
				swapped = false
				_ = fw.Remove(w.dir)
				if err := fw.Add(w.dir); err != nil {
					w.log.Warn("rules: cannot watch the directory after it was replaced; waiting for it to come back", "dir", w.dir, "err", err)
				}
			}
			_ = w.Reload()
		}
	}
}
