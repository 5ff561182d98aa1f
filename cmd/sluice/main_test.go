package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
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
		{"version", []string{"version"}, 0, "sluice ", ""},
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
