// Command sluice is Sluice's binary: the decision service, the queue
// drainer, and tools around them.
//
// Usage:
//
//	sluice serve      run the decision service
//	sluice rules      check rule files (sluice rules validate DIR)
//	sluice compare    run one traffic pattern through every algorithm
//	sluice demo       run a demonstration (sluice demo throttled-db|ingest)
//	sluice top        show a running serve's top keys and rules in a terminal
//	sluice drain      drain a JetStream stream into an HTTP endpoint
//	sluice enqueue    put records into a JetStream stream
//	sluice version    print the version (also sluice --version)
//	sluice help [command]
//
// This package is the only one in Sluice that reads the command line and
// the environment: main passes os.Args to run, parseFlags and
// parseFlagsEnv (this file) parse a subcommand's flags, the latter also
// from their SLUICE_… variables (serve and drain), secret (serve.go) reads
// the password and token variables, and gc.go looks at GOGC and
// GOMEMLIMIT. Every subcommand is a function run<Name>(ctx, args, stdout,
// stderr) that tests call directly.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/sluicehq/sluice/internal/rules"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(err, os.Stderr))
}

// exitCode reports err on stderr and returns the process exit status:
// 0 for success or an explicit -h, 2 for a usage error, 1 otherwise.
func exitCode(err error, stderr io.Writer) int {
	var uerr usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &uerr):
		fmt.Fprintf(stderr, "sluice: %v\n", err)
		fmt.Fprintln(stderr, "Run 'sluice help' for usage.")
		return 2
	default:
		fmt.Fprintf(stderr, "sluice: %v\n", err)
		return 1
	}
}

// usageError is a mistake on the command line, as opposed to a failure of
// the command itself.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, a ...any) error { return usageError{fmt.Sprintf(format, a...)} }

// A command is one subcommand of sluice.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"serve", "run the decision service", runServe},
		{"rules", "check rule files: sluice rules validate DIR", runRules},
		{"compare", "run one traffic pattern through every algorithm and compare them", runCompare},
		{"demo", "run a demonstration: sluice demo throttled-db|ingest [-json]", runDemo},
		{"top", "show the top keys of a running sluice serve: sluice top -addr HOST:PORT [-once]", runTop},
		{"drain", "drain a JetStream stream into an HTTP endpoint at a rate or on leased capacity", runDrain},
		{"enqueue", "put the lines of a file or of stdin into a JetStream stream, durably", runEnqueue},
		{"version", "print the version of sluice and of Go", runVersion},
		{"help", "show help for sluice or for one command", runHelp},
	}
}

// run dispatches args (without the program name) to a subcommand.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		printUsage(stderr)
		return usagef("no command given")
	}
	name := args[0]
	switch name {
	case "-h", "-help", "--help":
		name = "help"
	case "-version", "--version":
		name = "version"
	}
	for _, c := range commands() {
		if c.name == name {
			return c.run(ctx, args[1:], stdout, stderr)
		}
	}
	return usagef("unknown command %q", name)
}

func printUsage(w io.Writer) {
	fmt.Fprint(w, "Sluice controls the flow of requests between programs and the services they call.\n\n")
	fmt.Fprint(w, "Usage:\n\n\tsluice <command> [flags]\n\nCommands:\n\n")
	for _, c := range commands() {
		fmt.Fprintf(w, "\t%-8s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, "\nRun 'sluice help <command>' or 'sluice <command> -h' for a command's flags.\n")
}

// runHelp prints the general usage, or a command's own usage.
func runHelp(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	switch len(args) {
	case 0:
		printUsage(stdout)
		return nil
	case 1:
		for _, c := range commands() {
			if c.name == args[0] && c.name != "help" {
				// Every command prints its usage for -h and returns
				// flag.ErrHelp, which is not a failure here.
				err := c.run(ctx, []string{"-h"}, stdout, stdout)
				if errors.Is(err, flag.ErrHelp) {
					return nil
				}
				return err
			}
		}
		return usagef("help: unknown command %q", args[0])
	}
	return usagef("help takes at most one command, got %d arguments", len(args))
}

// newFlagSet returns a flag set for one subcommand that reports its errors
// to stderr and prints usage, then the flags, for -h.
func newFlagSet(name, usage string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fmt.Fprint(fs.Output(), "\nFlags:\n")
		fs.PrintDefaults()
	}
	return fs
}

// Environment variables stand for the flags of serve and drain, so that a
// container or a Kubernetes manifest can configure them without a command
// line. A flag's variable is the command's prefix followed by the flag's
// name upper-cased, each - an _: serve's --redis-timeout is
// SLUICE_REDIS_TIMEOUT, drain's -lease-redis SLUICE_DRAIN_LEASE_REDIS. A
// flag given on the command line wins over its variable, and a variable
// that is empty counts as unset.
const (
	serveEnvPrefix = "SLUICE_"
	drainEnvPrefix = "SLUICE_DRAIN_"
)

// envUsage ends the usage of a command whose flags can come from the
// environment.
const envUsage = `
Every flag can also be set by the environment variable shown under it; a
flag on the command line wins over its variable, and an empty variable
counts as unset.
`

// envName is the environment variable that stands for the flag name of a
// command whose variables start with prefix.
func envName(prefix, name string) string {
	return prefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// newEnvFlagSet is newFlagSet for a command whose flags can also come from
// the environment variables starting with prefix (parseFlagsEnv reads
// them): its -h shows each flag's variable under it.
func newEnvFlagSet(name, usage, prefix string, stderr io.Writer) *flag.FlagSet {
	fs := newFlagSet(name, usage, stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage+envUsage)
		fmt.Fprint(fs.Output(), "\nFlags:\n")
		printFlagsEnv(fs, prefix)
	}
	return fs
}

// printFlagsEnv prints fs's flags as fs.PrintDefaults does, each followed
// by a line naming its environment variable.
func printFlagsEnv(fs *flag.FlagSet, prefix string) {
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	var buf strings.Builder
	out := fs.Output()
	fs.SetOutput(&buf)
	fs.PrintDefaults()
	fs.SetOutput(out)
	// PrintDefaults writes the flags in VisitAll's order, each starting a
	// line with "  -" and its usage on the lines after, which start with a
	// tab.
	i := 0
	flush := func() {
		if i > 0 {
			fmt.Fprintf(out, "    \t$%s\n", envName(prefix, names[i-1]))
		}
	}
	for line := range strings.Lines(buf.String()) {
		if strings.HasPrefix(line, "  -") && i < len(names) {
			flush()
			i++
		}
		fmt.Fprint(out, line)
	}
	flush()
}

// parseFlagsEnv is parseFlags, then sets every flag not given in args
// from its environment variable (prefix and the flag's name), as lookup
// (os.LookupEnv) finds it. A value the flag refuses is a usage error that
// names the variable.
func parseFlagsEnv(fs *flag.FlagSet, args []string, prefix string, lookup func(string) (string, bool)) error {
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	given := make(map[string]bool)
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []string
	fs.VisitAll(func(f *flag.Flag) {
		name := envName(prefix, f.Name)
		v, ok := lookup(name)
		if given[f.Name] || !ok || v == "" {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			errs = append(errs, fmt.Sprintf("$%s=%q (for -%s): %v", name, v, f.Name, err))
		}
	})
	if len(errs) > 0 {
		return usagef("%s: invalid environment: %s", fs.Name(), strings.Join(errs, "; "))
	}
	return nil
}

// parseFlags parses args into fs and rejects positional arguments.
// A flag error is a usage error; -h is flag.ErrHelp.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usagef("%s: %v", fs.Name(), err)
	}
	if fs.NArg() > 0 {
		return usagef("%s: unexpected argument %q", fs.Name(), fs.Arg(0))
	}
	return nil
}

const versionUsage = `Usage: sluice version (or sluice --version)

Version prints the version of sluice: the main module's version (a tagged
version, a pseudo-version that go build stamps in a git checkout, or
"(devel)"), the VCS revision and commit time it was built from, and the Go
toolchain and platform that built it. A binary built without VCS
information (go run, go test, -buildvcs=false, or outside a checkout) says
so instead of a revision.
`

// runVersion prints the module version, the VCS revision and the Go
// version.
func runVersion(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("version", versionUsage, stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	bi, _ := debug.ReadBuildInfo()
	_, err := io.WriteString(stdout, formatVersion(bi, runtime.GOOS+"/"+runtime.GOARCH))
	return err
}

// formatVersion is what sluice version prints for the build information
// bi (nil when the binary has none) on platform:
//
//	sluice v0.4.0
//	revision 0123abcd… (modified: the work tree had uncommitted changes)
//	time     2025-01-02T03:04:05Z
//	go       go1.26.0 linux/amd64
func formatVersion(bi *debug.BuildInfo, platform string) string {
	v, goVersion := "(devel)", runtime.Version()
	var rev, at string
	modified := false
	if bi != nil {
		if bi.Main.Version != "" {
			v = bi.Main.Version
		}
		if bi.GoVersion != "" {
			goVersion = bi.GoVersion
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				at = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "sluice %s\n", v)
	switch {
	case rev == "":
		b.WriteString("revision unknown (built without VCS information)\n")
	case modified:
		fmt.Fprintf(&b, "revision %s (modified: the work tree had uncommitted changes)\n", rev)
	default:
		fmt.Fprintf(&b, "revision %s\n", rev)
	}
	if at != "" {
		fmt.Fprintf(&b, "time     %s\n", at)
	}
	fmt.Fprintf(&b, "go       %s %s\n", goVersion, platform)
	return b.String()
}

const rulesUsage = `Usage: sluice rules validate DIR

Validate checks the rule files of DIR (*.yaml and *.yml, as sluice serve
loads them) without serving them. It prints OK with what it found, or every
problem as file:line: key: message, and then exits 1.
`

// runRules runs `sluice rules validate DIR`.
func runRules(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("rules", rulesUsage, stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usagef("rules: %v", err)
	}
	if fs.NArg() != 2 || fs.Arg(0) != "validate" {
		return usagef("rules: want: sluice rules validate DIR")
	}
	dir := fs.Arg(1)
	set, err := rules.Validate(dir)
	if err != nil {
		problems := strings.Split(err.Error(), "\n")
		for _, p := range problems {
			fmt.Fprintln(stdout, p)
		}
		return fmt.Errorf("rules validate %s: %d problem(s)", dir, len(problems))
	}
	_, err = fmt.Fprintf(stdout, "OK: %s: %d file(s), %d domain(s) (%s), %d rule(s)\n",
		dir, len(set.Files()), len(set.Domains()), strings.Join(set.Domains(), ", "), ruleCount(set))
	return err
}
