package main

import (
	"errors"
	"flag"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestFlagEnvPrecedence: a flag on the command line wins over its
// environment variable, which wins over the default; an empty variable
// counts as unset; a value the flag refuses names the variable.
func TestFlagEnvPrecedence(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    string // addr, n, on, wait as one string
		wantErr string // substring of the error; "" for none
	}{
		{"defaults", nil, nil, "127.0.0.1:1 1 false 1s", ""},
		{"environment", nil, map[string]string{"T_ADDR": ":2", "T_MAX_N": "2", "T_ON": "true", "T_WAIT": "2s"}, ":2 2 true 2s", ""},
		{"flags", []string{"-addr", ":3", "-max-n", "3", "-on", "-wait", "3s"}, nil, ":3 3 true 3s", ""},
		{"flags over the environment", []string{"-addr", ":3", "-max-n=3", "-on=false", "-wait", "3s"},
			map[string]string{"T_ADDR": ":2", "T_MAX_N": "2", "T_ON": "true", "T_WAIT": "2s"}, ":3 3 false 3s", ""},
		{"a flag given its default still wins", []string{"-max-n", "1"}, map[string]string{"T_MAX_N": "2"}, "127.0.0.1:1 1 false 1s", ""},
		{"some of each", []string{"-addr", ":3"}, map[string]string{"T_ADDR": ":2", "T_WAIT": "2s"}, ":3 1 false 2s", ""},
		{"empty is unset", nil, map[string]string{"T_ADDR": "", "T_ON": ""}, "127.0.0.1:1 1 false 1s", ""},
		{"other prefixes ignored", nil, map[string]string{"ADDR": ":9", "X_ADDR": ":9", "T_addr": ":9"}, "127.0.0.1:1 1 false 1s", ""},
		{"bad int", nil, map[string]string{"T_MAX_N": "many"}, "", `$T_MAX_N="many" (for -max-n)`},
		{"bad bool", nil, map[string]string{"T_ON": "yes please"}, "", "$T_ON"},
		{"bad duration", nil, map[string]string{"T_WAIT": "5"}, "", "$T_WAIT"},
		{"bad value under a flag is never read", []string{"-wait", "4s"}, map[string]string{"T_WAIT": "5"}, "127.0.0.1:1 1 false 4s", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := newEnvFlagSet("t", "Usage: t\n", "T_", io.Discard)
			addr := fs.String("addr", "127.0.0.1:1", "")
			n := fs.Int("max-n", 1, "")
			on := fs.Bool("on", false, "")
			wait := fs.Duration("wait", time.Second, "")
			lookup := func(k string) (string, bool) { v, ok := tt.env[k]; return v, ok }
			err := parseFlagsEnv(fs, tt.args, "T_", lookup)
			if tt.wantErr != "" {
				var uerr usageError
				if !errors.As(err, &uerr) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want a usage error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := strings.Join([]string{*addr, strconv.Itoa(*n), strconv.FormatBool(*on), wait.String()}, " ")
			if got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

// flagEntries splits the Flags section of a command's -h into each flag's
// entry (its lines), by name.
func flagEntries(t *testing.T, help string) map[string]string {
	t.Helper()
	_, flags, ok := strings.Cut(help, "\nFlags:\n")
	if !ok {
		t.Fatalf("no Flags section:\n%s", help)
	}
	entries := map[string]string{}
	for _, e := range strings.Split("\n"+flags, "\n  -")[1:] {
		name, _, _ := strings.Cut(e, "\n")
		name, _, _ = strings.Cut(name, " ")
		entries[name] = e
	}
	return entries
}

// TestServeHelpListsEnv: serve -h names every flag's variable, under the
// flag, and no variable is one of the secrets serve reads by name.
func TestServeHelpListsEnv(t *testing.T) {
	_, help, err := runArgs(t, t.Context(), "serve", "-h")
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("serve -h: %v", err)
	}
	if !strings.Contains(help, "a\nflag on the command line wins over its variable") {
		t.Errorf("serve -h does not say that flags win:\n%s", help)
	}
	entries := flagEntries(t, help)
	if len(entries) < 40 {
		t.Fatalf("serve -h lists %d flags:\n%s", len(entries), help)
	}
	secrets := map[string]bool{adminTokenEnv: true, coordTokenEnv: true, redisPasswordEnv: true, sentinelPasswordEnv: true}
	for name, entry := range entries {
		env := envName(serveEnvPrefix, name)
		if secrets[env] {
			t.Errorf("flag --%s's variable %s is a secret's", name, env)
		}
		if !strings.HasSuffix(strings.TrimRight(entry, "\n"), "\n    \t$"+env) {
			t.Errorf("serve -h: flag -%s's entry does not end with $%s:\n%s", name, env, entry)
		}
	}
	for _, secret := range []string{adminTokenEnv, coordTokenEnv, redisPasswordEnv, sentinelPasswordEnv} {
		if !strings.Contains(help, "$"+secret+")") {
			t.Errorf("serve -h no longer mentions %s", secret)
		}
	}
}

// TestDrainHelpListsEnv: drain's flags have variables of their own prefix.
func TestDrainHelpListsEnv(t *testing.T) {
	_, help, err := runArgs(t, t.Context(), "drain", "-h")
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("drain -h: %v", err)
	}
	for _, want := range []string{"  -lease-redis string\n", "\t$SLUICE_DRAIN_LEASE_REDIS\n", "\t$SLUICE_DRAIN_URL\n", "\t$SLUICE_DRAIN_NATS_URL\n"} {
		if !strings.Contains(help, want) {
			t.Errorf("drain -h lacks %q:\n%s", want, help)
		}
	}
}

// TestServeEnvProcess runs the binary configured by its environment alone
// (as the container image is), with one variable overruled by a flag, and
// a bad variable, which stops it with the variable's name.
func TestServeEnvProcess(t *testing.T) {
	bin := buildSluice(t)
	rules, err := filepath.Abs(filepath.Join("..", "..", "examples", "rules"))
	if err != nil {
		t.Fatal(err)
	}
	env := []string{
		"SLUICE_RULES=" + rules, "SLUICE_GRPC_ADDR=127.0.0.1:0", "SLUICE_HTTP_ADDR=127.0.0.1:0",
		"SLUICE_LOG_FORMAT=json", "SLUICE_STORE=nowhere", "SLUICE_SHUTDOWN_TIMEOUT=3s",
	}

	t.Run("bad variable", func(t *testing.T) {
		cmd := exec.Command(bin, "serve")
		cmd.Env = append(cmd.Environ(), append(env, "SLUICE_REDIS_TIMEOUT=soon")...)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(out), `$SLUICE_REDIS_TIMEOUT="soon" (for -redis-timeout)`) {
			t.Fatalf("serve with SLUICE_REDIS_TIMEOUT=soon: %v, want exit 2 naming the variable:\n%s", err, out)
		}
	})

	t.Run("serves", func(t *testing.T) {
		p := startSluice(t, bin, env, "serve", "--store", "memory")
		up := p.next(t, "sluice serving", 30*time.Second)
		if up.str("rules") != rules || up.str("store") != "memory" || up.str("domains") != "demo" {
			t.Errorf("serving with %v; want the rules of $SLUICE_RULES and the store of --store", up)
		}
		resp, err := http.Get("http://" + up.str("http") + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("/readyz: %s", resp.Status)
		}
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := p.waitExit(t, 10*time.Second); err != nil {
			t.Errorf("serve exited with %v after SIGTERM, want 0", err)
		}
	})
}
