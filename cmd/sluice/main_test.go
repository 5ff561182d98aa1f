package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
)

// runArgs runs sluice with args and returns its error and output.
func runArgs(t *testing.T, ctx context.Context, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err = run(ctx, args, &out, &errOut)
	return out.String(), errOut.String(), err
}

func TestRunDispatch(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout string // substring
		wantStderr string // substring
	}{
		{"no command", nil, 2, "", "Usage:"},
		{"unknown command", []string{"frobnicate"}, 2, "", ""},
		{"help", []string{"help"}, 0, "sluice <command> [flags]", ""},
		{"-h", []string{"-h"}, 0, "Commands:", ""},
		{"help compare", []string{"help", "compare"}, 0, "-pattern", ""},
		{"help serve", []string{"help", "serve"}, 0, "SIGTERM", ""},
		{"help unknown", []string{"help", "nope"}, 2, "", ""},
		{"help too many", []string{"help", "a", "b"}, 2, "", ""},
		{"version", []string{"version"}, 0, "\nrevision ", ""},
		{"--version", []string{"--version"}, 0, "\nrevision ", ""},
		{"-version", []string{"-version"}, 0, "\nrevision ", ""},
		{"version extra", []string{"version", "x"}, 2, "", ""},
		{"compare -h", []string{"compare", "-h"}, 0, "", "coefficient of variation"},
		{"compare bad flag", []string{"compare", "-nope"}, 2, "", "flag provided but not defined"},
		{"compare", []string{"compare"}, 0, "sliding_log", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stdout, stderr, err := runArgs(t, t.Context(), tt.args...)
			var codeOut bytes.Buffer
			if got := exitCode(err, &codeOut); got != tt.wantCode {
				t.Errorf("exit code = %d (err %v), want %d", got, err, tt.wantCode)
			}
			if !strings.Contains(stdout, tt.wantStdout) {
				t.Errorf("stdout = %q, want it to contain %q", stdout, tt.wantStdout)
			}
			if !strings.Contains(stderr, tt.wantStderr) {
				t.Errorf("stderr = %q, want it to contain %q", stderr, tt.wantStderr)
			}
		})
	}
}

func TestExitCodeMessages(t *testing.T) {
	var buf bytes.Buffer
	if got := exitCode(errors.New("boom"), &buf); got != 1 || !strings.Contains(buf.String(), "sluice: boom") {
		t.Errorf("exitCode(boom) = %d, %q; want 1 and the message", got, buf.String())
	}
	buf.Reset()
	if got := exitCode(flag.ErrHelp, &buf); got != 0 || buf.Len() != 0 {
		t.Errorf("exitCode(ErrHelp) = %d, %q; want 0 and no output", got, buf.String())
	}
}

func TestServeRejectsArguments(t *testing.T) {
	_, _, err := runArgs(t, t.Context(), "serve", "extra")
	var uerr usageError
	if !errors.As(err, &uerr) {
		t.Fatalf("serve extra: err = %v, want a usage error", err)
	}
}

// TestFormatVersion: the module version, the VCS revision (and whether the
// tree was modified), its time and the Go version, from the build info;
// without VCS information it says so.
func TestFormatVersion(t *testing.T) {
	bi := &debug.BuildInfo{GoVersion: "go1.99.1", Main: debug.Module{Path: "github.com/sluicehq/sluice/cmd/sluice", Version: "v0.5.0"},
		Settings: []debug.BuildSetting{{Key: "-buildmode", Value: "exe"}, {Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"}, {Key: "vcs.time", Value: "2025-01-02T03:04:05Z"}, {Key: "vcs.modified", Value: "false"}}}
	want := "sluice v0.5.0\nrevision 0123456789abcdef0123456789abcdef01234567\ntime     2025-01-02T03:04:05Z\ngo       go1.99.1 plan9/arm\n"
	if got := formatVersion(bi, "plan9/arm"); got != want {
		t.Errorf("formatVersion =\n%s\nwant\n%s", got, want)
	}
	bi.Settings[4].Value = "true"
	if got := formatVersion(bi, "plan9/arm"); !strings.Contains(got, "\nrevision 0123456789abcdef0123456789abcdef01234567 (modified") {
		t.Errorf("a modified tree:\n%s", got)
	}
	bi = &debug.BuildInfo{GoVersion: "go1.99.1", Main: debug.Module{Version: "(devel)"}}
	if got := formatVersion(bi, "plan9/arm"); got != "sluice (devel)\nrevision unknown (built without VCS information)\ngo       go1.99.1 plan9/arm\n" {
		t.Errorf("without VCS information:\n%s", got)
	}
	if got := formatVersion(nil, "plan9/arm"); !strings.HasPrefix(got, "sluice (devel)\nrevision unknown") {
		t.Errorf("without build information:\n%s", got)
	}
}

// TestVersionBuilt: a binary built (-buildvcs=true) in a git checkout
// prints the checkout's revision and commit time, for both spellings. In
// a linked work tree (git worktree, whose .git is a file) cmd/go finds no
// repository and stamps nothing; the binary then says so.
func TestVersionBuilt(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not in a git checkout: %v", err)
	}
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(strings.TrimSpace(string(top)), ".git"))
	stamped := err == nil && fi.IsDir()
	bin := filepath.Join(t.TempDir(), "sluice")
	if out, err := exec.Command("go", "build", "-buildvcs=true", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	var outs []string
	for _, arg := range []string{"version", "--version"} {
		out, err := exec.Command(bin, arg).Output()
		if err != nil {
			t.Fatalf("sluice %s: %v", arg, err)
		}
		outs = append(outs, string(out))
		lines := strings.Split(string(out), "\n")
		if len(lines) < 3 || !strings.HasPrefix(lines[0], "sluice ") || !strings.HasPrefix(lines[len(lines)-2], "go       go1.") {
			t.Fatalf("sluice %s:\n%s", arg, out)
		}
		if !stamped {
			t.Logf("a linked work tree: cmd/go stamps no VCS information")
			if lines[1] != "revision unknown (built without VCS information)" {
				t.Errorf("sluice %s without VCS information:\n%s", arg, out)
			}
			continue
		}
		if !strings.HasPrefix(lines[1], "revision "+strings.TrimSpace(string(head))) {
			t.Errorf("sluice %s: want revision %s:\n%s", arg, head, out)
		}
		if !strings.HasPrefix(lines[2], "time     20") || lines[0] == "sluice (devel)" {
			t.Errorf("sluice %s: want a pseudo-version and the commit time:\n%s", arg, out)
		}
	}
	if outs[0] != outs[1] {
		t.Errorf("version and --version differ:\n%s\n%s", outs[0], outs[1])
	}
}
