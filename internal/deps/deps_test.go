// Package deps holds no code: its test enforces the import rules of
// ARCHITECTURE.md over the whole module, in the spirit of the Go tree's
// go/build/deps_test.go.
//
//   - ratelimit, limitheader (the codec of the RateLimit header fields),
//     priority (a request's priority, its names and its context) and
//     fence (the protected side's check of fencing tokens) depend on the
//     standard library only; adaptive (overload protection)
//     on the standard library and priority only.
//   - No library package (outside cmd/, internal/ and bench/) depends on
//     gRPC, a YAML package or Prometheus — except that grpclimit, whose
//     whole purpose is gRPC interceptors, may depend on gRPC (and on
//     nothing else of the three).
//   - Only redisstore, among the library packages, depends on go-redis:
//     a program that keeps its state in memory links no Redis code. The
//     one exception, drain/redisdrain (drain's Redis Streams Source),
//     reaches go-redis only through redisstore: never by importing it,
//     nor through any other package.
//   - Only drain/jsdrain (drain's JetStream Source), among the library
//     packages, depends on the NATS client (nats.go), and none on the NATS
//     server: a program that drains no JetStream queue, drain's own users
//     included, links no NATS code, and only cmd/ and internal/ embed a
//     server.
//   - Only drain/kafkadrain (drain's Kafka Source), among the library
//     packages, depends on franz-go: a program that drains no Kafka topic
//     links no Kafka code. Its in-process test cluster, kfake, is imported
//     by the tests of drain/kafkadrain and of cmd/sluice (which run the
//     binary's -source kafka on it) alone, and this rule binds test files
//     too.
//   - No library package imports a package under internal/: what a
//     library needs is public, so its users can see and use it too.
//   - Only package main under cmd/ imports flag or reads the environment
//     (os.Getenv, os.LookupEnv, os.Environ, os.ExpandEnv, syscall.Getenv,
//     syscall.Environ). The load-test programs under bench/ are commands
//     too (package main, never imported) and are allowed the same.
//   - Only bench/ imports the benchmark-only modules (failsafe-go, the
//     adaptive limiter Sluice is compared with, and gonum, which draws the
//     plots), and this rule binds test files too: they are in go.mod for
//     the comparison alone.
//   - Only cmd/sluice's tests import the test-only modules chromedp (which
//     drives a browser through the dashboard) and prometheus/prometheus
//     (the PromQL parser and the rule-file checks, rulefmt, that validate
//     deploy/'s queries and alerting rules), and this rule binds test
//     files too; its binary links neither.
//   - No command under cmd/ (the sluice binary) links test code: not
//     testing or a package under testing/, and no package whose name
//     ends in "test" (net/http/httptest, internal/redistest,
//     httplimit/throttledtest, …). The standard library's own internal
//     packages are exempt: every program that imports sync or os links
//     internal/synctest and internal/testlog.
//
// Test files are exempt from every rule but those three (ARCHITECTURE.md's
// sixth, seventh and, for kfake, tenth). So are test-support packages (those that import
// "testing", such as internal/redistest) from the environment rule, as the Go tree exempts its internal/testenv: they run
// only inside tests, where reading CI=true is how a test learns that a
// missing tool is a failure rather than a reason to skip.
package deps_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// pkg is the part of `go list -json` output the rules need.
type pkg struct {
	ImportPath string
	Name       string
	Dir        string
	Standard   bool
	GoFiles    []string
	CgoFiles   []string
	Imports    []string
	Deps       []string
	// TestImports and XTestImports are the imports of the package's test
	// files; only rules with tests set look at them.
	TestImports  []string
	XTestImports []string
}

// goTool returns the go command that runs this test.
func goTool(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	if root := os.Getenv("GOROOT"); root != "" {
		return filepath.Join(root, "bin", "go")
	}
	t.Fatal("the go command is neither on PATH nor in $GOROOT/bin; the import rules need `go list`")
	return ""
}

// listModule returns every package of the main module and of its
// dependencies (not their tests), keyed by import path, and the module path.
func listModule(t *testing.T) (map[string]*pkg, string) {
	t.Helper()
	goCmd := goTool(t)
	out, err := exec.Command(goCmd, "list", "-m", "-f", "{{.Path}}\n{{.Dir}}").Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	mod, root, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	trackSources(t, root)
	cmd := exec.Command(goCmd, "list", "-e", "-deps", "-json", mod+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err = cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps -json %s/...: %v\n%s", mod, err, stderr.String())
	}
	pkgs := make(map[string]*pkg)
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		p := new(pkg)
		if err := dec.Decode(p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decoding go list output: %v", err)
		}
		pkgs[p.ImportPath] = p
	}
	return pkgs, mod
}

// trackSources opens every directory and Go source file of the module at
// root. The go command caches test results keyed by the files a test opens;
// what `go list` reads in a subprocess is invisible to it, so without this
// an import added elsewhere in the module would not rerun the test.
func trackSources(t *testing.T, root string) {
	t.Helper()
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(name, ".go") || name == "go.mod" {
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			return f.Close()
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walking the module: %v", err)
	}
}

// A rule forbids some dependencies to some packages of the module.
type rule struct {
	// name explains the rule in failure messages.
	name string
	// applies reports whether the rule binds the package at rel, its path
	// relative to the module ("." for the root).
	applies func(rel string) bool
	// forbidden reports whether depending on p is against the rule.
	forbidden func(p *pkg) bool
	// tests makes the rule bind the direct imports of test files too.
	tests bool
	// through, when set, reports whether a forbidden package may be
	// reached through the direct import p (not imported directly).
	through func(p *pkg) bool
}

// underAny reports whether rel is one of dirs or lies below one of them.
func underAny(rel string, dirs ...string) bool {
	return slices.ContainsFunc(dirs, func(d string) bool { return hasPathPrefix(rel, d) })
}

// hasPathPrefix reports whether path is prefix or lies below it.
func hasPathPrefix(path, prefix string) bool {
	return path == prefix || strings.HasPrefix(path, prefix+"/")
}

// isGRPC reports whether path is gRPC.
func isGRPC(path string) bool { return hasPathPrefix(path, "google.golang.org/grpc") }

// isHeavy reports whether path is gRPC, a YAML package or Prometheus.
func isHeavy(path string) bool {
	return isGRPC(path) ||
		strings.HasPrefix(path, "github.com/prometheus/") ||
		strings.Contains(strings.ToLower(path), "yaml")
}

// grpcAllowed is the one library package that may depend on gRPC.
const grpcAllowed = "grpclimit"

// redisAllowed is the one library package that may depend on go-redis.
const redisAllowed = "redisstore"

// redisThrough is the one library package that may depend on go-redis
// through redisAllowed, and only through it.
const redisThrough = "drain/redisdrain"

// isBenchOnly reports whether path is in a module that only the
// benchmarks may import.
func isBenchOnly(path string) bool {
	return strings.HasPrefix(path, "github.com/failsafe-go/") || strings.HasPrefix(path, "gonum.org/")
}

// isTestOnly reports whether path is in a module that only cmd/sluice's
// tests may import.
func isTestOnly(path string) bool {
	return strings.HasPrefix(path, "github.com/chromedp/") || strings.HasPrefix(path, "github.com/prometheus/prometheus/")
}

// testOnlyUser is the package whose tests may import the test-only modules.
const testOnlyUser = "cmd/sluice"

// isTestCode reports whether p is test code that a binary must not link:
// testing, a package under testing/, or a package whose last path element
// ends in "test" — but not one of the standard library's internal packages
// (internal/synctest, which sync imports, and its kind), which every
// program links.
func isTestCode(p *pkg) bool {
	path := p.ImportPath
	if path == "testing" || strings.HasPrefix(path, "testing/") {
		return true
	}
	if p.Standard && (strings.HasPrefix(path, "internal/") || strings.Contains(path, "/internal/")) {
		return false
	}
	return strings.HasSuffix(path[strings.LastIndex(path, "/")+1:], "test")
}

// isRedis reports whether path is a Redis client package.
func isRedis(path string) bool { return strings.HasPrefix(path, "github.com/redis/") }

// natsAllowed is the one library package that may depend on the NATS
// client.
const natsAllowed = "drain/jsdrain"

// isNATSClient and isNATSServer report whether path is the NATS client or
// server module.
func isNATSClient(path string) bool { return hasPathPrefix(path, "github.com/nats-io/nats.go") }
func isNATSServer(path string) bool { return hasPathPrefix(path, "github.com/nats-io/nats-server") }

// kafkaAllowed is the one library package that may depend on franz-go;
// its tests and cmd/sluice's may import kfake.
const kafkaAllowed = "drain/kafkadrain"

// kfakeUsers are the packages whose tests may import kfake.
var kfakeUsers = []string{kafkaAllowed, "cmd/sluice"}

// isFranz and isKfake report whether path is franz-go (any of its
// modules) or its in-process test cluster, kfake.
func isFranz(path string) bool { return hasPathPrefix(path, "github.com/twmb/franz-go") }
func isKfake(path string) bool { return hasPathPrefix(path, "github.com/twmb/franz-go/pkg/kfake") }

// isLibrary reports whether the package at rel is a library package: one
// that users of the module import.
func isLibrary(rel string) bool { return !underAny(rel, "cmd", "internal", "bench") }

func importRules(mod string) []rule {
	return []rule{
		{
			name: "ratelimit, the header codec limitheader, priority and fence may depend on the standard library only",
			applies: func(rel string) bool {
				return rel == "ratelimit" || rel == "limitheader" || rel == "priority" || rel == "fence"
			},
			forbidden: func(p *pkg) bool { return !p.Standard },
		},
		{
			name:      "adaptive may depend on the standard library and priority only",
			applies:   func(rel string) bool { return rel == "adaptive" },
			forbidden: func(p *pkg) bool { return !p.Standard && p.ImportPath != mod+"/priority" },
		},
		{
			name:      "library packages (outside cmd/, internal/ and bench/) may not depend on gRPC, YAML or Prometheus",
			applies:   func(rel string) bool { return isLibrary(rel) && rel != grpcAllowed },
			forbidden: func(p *pkg) bool { return isHeavy(p.ImportPath) },
		},
		{
			name:      "only redisstore, of the library packages, may depend on go-redis: a memory-only program links no Redis code",
			applies:   func(rel string) bool { return isLibrary(rel) && rel != redisAllowed && rel != redisThrough },
			forbidden: func(p *pkg) bool { return isRedis(p.ImportPath) },
		},
		{
			name:      "drain/redisdrain may depend on go-redis only through redisstore",
			applies:   func(rel string) bool { return rel == redisThrough },
			forbidden: func(p *pkg) bool { return isRedis(p.ImportPath) },
			through:   func(p *pkg) bool { return p.ImportPath == mod+"/"+redisAllowed },
		},
		{
			name:      "only drain/jsdrain, of the library packages, may depend on the NATS client: a program that drains no JetStream queue links no NATS code",
			applies:   func(rel string) bool { return isLibrary(rel) && rel != natsAllowed },
			forbidden: func(p *pkg) bool { return isNATSClient(p.ImportPath) },
		},
		{
			name:      "no library package may depend on the NATS server (only cmd/ and internal/ embed it)",
			applies:   isLibrary,
			forbidden: func(p *pkg) bool { return isNATSServer(p.ImportPath) },
		},
		{
			name:      "only drain/kafkadrain, of the library packages, may depend on franz-go: a program that drains no Kafka topic links no Kafka code",
			applies:   func(rel string) bool { return isLibrary(rel) && rel != kafkaAllowed },
			forbidden: func(p *pkg) bool { return isFranz(p.ImportPath) },
		},
		{
			name:      "only the tests of drain/kafkadrain and cmd/sluice may import kfake, franz-go's in-process test cluster",
			applies:   func(rel string) bool { return !slices.Contains(kfakeUsers, rel) },
			forbidden: func(p *pkg) bool { return isKfake(p.ImportPath) },
			tests:     true,
		},
		{
			name:      "drain/kafkadrain and cmd/sluice may depend on franz-go but not link kfake outside their tests",
			applies:   func(rel string) bool { return slices.Contains(kfakeUsers, rel) },
			forbidden: func(p *pkg) bool { return isKfake(p.ImportPath) },
		},
		{
			name:      "library packages may not import the module's internal/ packages",
			applies:   isLibrary,
			forbidden: func(p *pkg) bool { return hasPathPrefix(p.ImportPath, mod+"/internal") },
		},
		{
			name:      "only bench/ may import the benchmark-only modules failsafe-go and gonum, in tests too",
			applies:   func(rel string) bool { return !underAny(rel, "bench") },
			forbidden: func(p *pkg) bool { return isBenchOnly(p.ImportPath) },
			tests:     true,
		},
		{
			name:      "only cmd/sluice's tests may import the test-only modules chromedp and prometheus/prometheus",
			applies:   func(rel string) bool { return rel != testOnlyUser },
			forbidden: func(p *pkg) bool { return isTestOnly(p.ImportPath) },
			tests:     true,
		},
		{
			name:      "the sluice binary may not link the test-only modules chromedp and prometheus/prometheus",
			applies:   func(rel string) bool { return rel == testOnlyUser },
			forbidden: func(p *pkg) bool { return isTestOnly(p.ImportPath) },
		},
		{
			name:      "a command under cmd/ (the sluice binary) may not link testing or a package named *test: its demos run on real code",
			applies:   func(rel string) bool { return underAny(rel, "cmd") },
			forbidden: isTestCode,
		},
		{
			name:      "grpclimit may depend on gRPC, but not on YAML or Prometheus",
			applies:   func(rel string) bool { return rel == grpcAllowed },
			forbidden: func(p *pkg) bool { return isHeavy(p.ImportPath) && !isGRPC(p.ImportPath) },
		},
	}
}

// relPath returns path relative to the module path mod, "." for mod itself,
// and whether path is in the module at all.
func relPath(path, mod string) (string, bool) {
	if path == mod {
		return ".", true
	}
	rel, ok := strings.CutPrefix(path, mod+"/")
	return rel, ok
}

// checkImports returns one message per forbidden dependency of a module
// package: a direct import that is forbidden, or a direct import through
// which a forbidden package is reached.
func checkImports(pkgs map[string]*pkg, mod string, rules []rule) []string {
	var msgs []string
	for _, path := range slices.Sorted(maps.Keys(pkgs)) {
		p := pkgs[path]
		rel, ok := relPath(path, mod)
		if !ok {
			continue
		}
		for _, r := range rules {
			if !r.applies(rel) {
				continue
			}
			if r.tests {
				for _, imp := range slices.Concat(p.TestImports, p.XTestImports) {
					if r.forbidden(&pkg{ImportPath: imp}) {
						msgs = append(msgs, fmt.Sprintf("package %s imports %s in a test: %s", path, imp, r.name))
					}
				}
			}
			for _, imp := range p.Imports {
				ip := pkgs[imp]
				if ip == nil {
					continue // go list reported the error; the build fails anyway
				}
				if r.forbidden(ip) {
					msgs = append(msgs, fmt.Sprintf("package %s imports %s: %s", path, imp, r.name))
					continue
				}
				if r.through != nil && r.through(ip) {
					continue
				}
				for _, dep := range ip.Deps {
					if dp := pkgs[dep]; dp != nil && r.forbidden(dp) {
						msgs = append(msgs, fmt.Sprintf("package %s imports %s, which depends on %s: %s", path, imp, dep, r.name))
						break
					}
				}
			}
		}
	}
	return msgs
}

// envFuncs returns the functions that read the process environment, by
// import path.
func envFuncs() map[string][]string {
	return map[string][]string{
		"os":      {"Getenv", "LookupEnv", "Environ", "ExpandEnv"},
		"syscall": {"Getenv", "Environ"},
	}
}

// checkFlagsAndEnv returns one message per module package, other than
// package main under cmd/ or bench/, that imports flag or (unless it imports testing)
// calls a function of envFuncs in its non-test files.
func checkFlagsAndEnv(pkgs map[string]*pkg, mod string) ([]string, error) {
	var msgs []string
	for _, path := range slices.Sorted(maps.Keys(pkgs)) {
		p := pkgs[path]
		rel, ok := relPath(path, mod)
		if !ok || (p.Name == "main" && underAny(rel, "cmd", "bench")) {
			continue
		}
		if slices.Contains(p.Imports, "flag") {
			msgs = append(msgs, fmt.Sprintf("package %s imports flag: only package main under cmd/ or bench/ may parse flags", path))
		}
		if slices.Contains(p.Imports, "testing") {
			continue // a test-support package
		}
		for _, f := range slices.Concat(p.GoFiles, p.CgoFiles) {
			name := filepath.Join(p.Dir, f)
			src, err := os.ReadFile(name)
			if err != nil {
				return nil, err
			}
			calls, err := envCalls(name, src)
			if err != nil {
				return nil, err
			}
			for _, c := range calls {
				msgs = append(msgs, fmt.Sprintf("package %s calls %s: only package main under cmd/ or bench/ may read the environment", path, c))
			}
		}
	}
	return msgs, nil
}

// envCalls returns the uses of envFuncs in one Go source file, as
// "pkg.Func at file:line", whatever name the file imports the package under.
func envCalls(filename string, src []byte) ([]string, error) {
	funcs := envFuncs()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, filename, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	local := make(map[string]string) // local name → import path
	for _, is := range f.Imports {
		path, err := strconv.Unquote(is.Path.Value)
		if err != nil || funcs[path] == nil {
			continue
		}
		name := filepath.Base(path)
		if is.Name != nil {
			name = is.Name.Name
		}
		local[name] = path
	}
	if len(local) == 0 {
		return nil, nil
	}
	var calls []string
	ast.Inspect(f, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		id, ok := sel.X.(*ast.Ident)
		if !ok {
			return true
		}
		if path, ok := local[id.Name]; ok && slices.Contains(funcs[path], sel.Sel.Name) {
			pos := fset.Position(sel.Pos())
			calls = append(calls, fmt.Sprintf("%s.%s at %s:%d", path, sel.Sel.Name, filepath.Base(pos.Filename), pos.Line))
		}
		return true
	})
	return calls, nil
}

// check returns the messages of every rule: the import rules, then the
// flag and environment rule.
func check(pkgs map[string]*pkg, mod string) ([]string, error) {
	msgs := checkImports(pkgs, mod, importRules(mod))
	more, err := checkFlagsAndEnv(pkgs, mod)
	if err != nil {
		return nil, err
	}
	return append(msgs, more...), nil
}

// TestImportRules checks the module as it is.
func TestImportRules(t *testing.T) {
	pkgs, mod := listModule(t)
	if pkgs[mod+"/ratelimit"] == nil {
		t.Fatalf("go list did not find %s/ratelimit; is the test running inside the module?", mod)
	}
	msgs, err := check(pkgs, mod)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		t.Error(m)
	}
}

// TestRulesCatchViolations feeds the checks made-up packages, so that a
// check that silently passes everything cannot go unnoticed.
func TestRulesCatchViolations(t *testing.T) {
	const mod = "example.com/m"
	std := func(path string) *pkg { return &pkg{ImportPath: path, Name: filepath.Base(path), Standard: true} }
	ext := func(path string, deps ...string) *pkg {
		return &pkg{ImportPath: path, Name: filepath.Base(path), Deps: deps}
	}
	own := func(rel, name string, imports ...string) *pkg {
		return &pkg{ImportPath: mod + "/" + rel, Name: name, Imports: imports, Deps: imports}
	}
	tests := []struct {
		name string
		pkgs []*pkg
		want []string // one substring per expected message
	}{
		{
			name: "clean",
			pkgs: []*pkg{
				std("time"), std("flag"), ext("google.golang.org/grpc"),
				own("ratelimit", "ratelimit", "time"),
				own("internal/rls", "rls", "google.golang.org/grpc"),
				own("cmd/sluice", "main", "flag"),
			},
		},
		{
			name: "ratelimit imports a module",
			pkgs: []*pkg{ext("github.com/x/y"), own("ratelimit", "ratelimit", "github.com/x/y")},
			want: []string{"package example.com/m/ratelimit imports github.com/x/y: ratelimit, the header codec limitheader, priority and fence may depend on the standard library only"},
		},
		{
			name: "ratelimit imports another module package",
			pkgs: []*pkg{
				ext("github.com/x/y"),
				own("clock", "clock", "github.com/x/y"),
				own("ratelimit", "ratelimit", mod+"/clock"),
			},
			want: []string{"package example.com/m/ratelimit imports example.com/m/clock: ratelimit, the header codec limitheader, priority and fence may depend on the standard library only"},
		},
		{
			name: "library imports grpc, yaml and prometheus",
			pkgs: []*pkg{
				ext("google.golang.org/grpc/codes"), ext("gopkg.in/yaml.v3"),
				ext("github.com/prometheus/client_golang/prometheus"),
				own("httplimit", "httplimit", "google.golang.org/grpc/codes"),
				own("lease", "lease", "gopkg.in/yaml.v3"),
				own("drain", "drain", "github.com/prometheus/client_golang/prometheus"),
				own("internal/service", "service", "gopkg.in/yaml.v3"), // allowed
				own("bench", "bench", "google.golang.org/grpc/codes"),  // allowed
			},
			want: []string{
				"package example.com/m/drain imports github.com/prometheus/client_golang/prometheus: library packages",
				"package example.com/m/httplimit imports google.golang.org/grpc/codes: library packages",
				"package example.com/m/lease imports gopkg.in/yaml.v3: library packages",
			},
		},
		{
			name: "grpclimit may import grpc, nothing else heavy; its subpackages may not",
			pkgs: []*pkg{
				ext("google.golang.org/grpc"), ext("gopkg.in/yaml.v3"),
				own("grpclimit", "grpclimit", "google.golang.org/grpc"), // allowed
				own("grpclimit/x", "x", "google.golang.org/grpc"),
				own("grpclimitx", "grpclimitx", "google.golang.org/grpc"),
				own("grpclimit/y", "y", "gopkg.in/yaml.v3"),
			},
			want: []string{
				"package example.com/m/grpclimit/x imports google.golang.org/grpc: library packages",
				"package example.com/m/grpclimit/y imports gopkg.in/yaml.v3: library packages",
				"package example.com/m/grpclimitx imports google.golang.org/grpc: library packages",
			},
		},
		{
			name: "grpclimit imports yaml",
			pkgs: []*pkg{ext("gopkg.in/yaml.v3"), own("grpclimit", "grpclimit", "gopkg.in/yaml.v3")},
			want: []string{"package example.com/m/grpclimit imports gopkg.in/yaml.v3: grpclimit may depend on gRPC, but not on YAML or Prometheus"},
		},
		{
			name: "the header codec imports ratelimit",
			pkgs: []*pkg{own("ratelimit", "ratelimit", "time"), std("time"), own("limitheader", "limitheader", mod+"/ratelimit")},
			want: []string{"package example.com/m/limitheader imports example.com/m/ratelimit: ratelimit, the header codec limitheader, priority and fence may depend on the standard library only"},
		},
		{
			name: "library links go-redis",
			pkgs: []*pkg{
				ext("github.com/redis/go-redis/v9"),
				own("redisstore", "redisstore", "github.com/redis/go-redis/v9"), // allowed
				own("lease", "lease", mod+"/redisstore"),
				own("memstore", "memstore", "github.com/redis/go-redis/v9"),
				own("internal/overrides", "overrides", mod+"/redisstore"), // allowed
			},
			want: []string{
				"package example.com/m/lease imports example.com/m/redisstore, which depends on github.com/redis/go-redis/v9: only redisstore",
				"package example.com/m/memstore imports github.com/redis/go-redis/v9: only redisstore",
			},
		},
		{
			name: "drain/redisdrain reaches go-redis only through redisstore",
			pkgs: []*pkg{
				ext("github.com/redis/go-redis/v9"),
				ext("github.com/go-redis/redis_rate/v10", "github.com/redis/go-redis/v9"),
				own("redisstore", "redisstore", "github.com/redis/go-redis/v9"),
				own("drain", "drain", "time"),
				std("time"),
				own("drain/redisdrain", "redisdrain", mod+"/redisstore", mod+"/drain"), // allowed
				own("drain/redisdrainx", "redisdrainx", mod+"/redisstore"),
				own("drain/redisdrain/sub", "sub", mod+"/redisstore"),
			},
			want: []string{
				"package example.com/m/drain/redisdrain/sub imports example.com/m/redisstore, which depends on github.com/redis/go-redis/v9: only redisstore",
				"package example.com/m/drain/redisdrainx imports example.com/m/redisstore, which depends on github.com/redis/go-redis/v9: only redisstore",
			},
		},
		{
			name: "drain/redisdrain imports go-redis directly",
			pkgs: []*pkg{
				ext("github.com/redis/go-redis/v9"),
				own("redisstore", "redisstore", "github.com/redis/go-redis/v9"),
				own("drain/redisdrain", "redisdrain", mod+"/redisstore", "github.com/redis/go-redis/v9"),
			},
			want: []string{"package example.com/m/drain/redisdrain imports github.com/redis/go-redis/v9: drain/redisdrain may depend on go-redis only through redisstore"},
		},
		{
			name: "drain/redisdrain reaches go-redis through another package",
			pkgs: []*pkg{
				ext("github.com/redis/go-redis/v9"),
				ext("github.com/go-redis/redis_rate/v10", "github.com/redis/go-redis/v9"),
				own("redisstore", "redisstore", "github.com/redis/go-redis/v9"),
				own("drain/redisdrain", "redisdrain", mod+"/redisstore", "github.com/go-redis/redis_rate/v10"),
			},
			want: []string{"package example.com/m/drain/redisdrain imports github.com/go-redis/redis_rate/v10, which depends on github.com/redis/go-redis/v9: drain/redisdrain may depend on go-redis only through redisstore"},
		},
		{
			name: "library links NATS",
			pkgs: []*pkg{
				ext("github.com/nats-io/nats.go"), ext("github.com/nats-io/nats.go/jetstream"), ext("github.com/nats-io/nats-server/v2/server"),
				own("drain/jsdrain", "jsdrain", "github.com/nats-io/nats.go/jetstream"),            // allowed
				own("internal/natsembed", "natsembed", "github.com/nats-io/nats-server/v2/server"), // allowed
				own("drain", "drain", "github.com/nats-io/nats.go"),
				own("lease", "lease", mod+"/drain/jsdrain"),
				own("drain/x", "x", "github.com/nats-io/nats-server/v2/server"),
			},
			want: []string{
				"package example.com/m/drain imports github.com/nats-io/nats.go: only drain/jsdrain",
				"package example.com/m/drain/x imports github.com/nats-io/nats-server/v2/server: no library package may depend on the NATS server",
				"package example.com/m/lease imports example.com/m/drain/jsdrain, which depends on github.com/nats-io/nats.go/jetstream: only drain/jsdrain",
			},
		},
		{
			name: "library links franz-go; kfake outside drain/kafkadrain's tests",
			pkgs: []*pkg{
				ext("github.com/twmb/franz-go/pkg/kgo"), ext("github.com/twmb/franz-go/pkg/kfake"),
				func() *pkg {
					p := own("drain/kafkadrain", "kafkadrain", "github.com/twmb/franz-go/pkg/kgo") // allowed
					p.XTestImports = []string{"github.com/twmb/franz-go/pkg/kfake"}                // allowed
					return p
				}(),
				own("drain", "drain", "github.com/twmb/franz-go/pkg/kgo"),
				own("lease", "lease", mod+"/drain/kafkadrain"),
				own("internal/kafkademo", "kafkademo", "github.com/twmb/franz-go/pkg/kgo"), // allowed
				{ImportPath: mod + "/drain/jsdrain", Name: "jsdrain", XTestImports: []string{"github.com/twmb/franz-go/pkg/kfake"}},
				own("drain/kafkadrain/x", "x", "github.com/twmb/franz-go/pkg/kfake"),
			},
			want: []string{
				"package example.com/m/drain imports github.com/twmb/franz-go/pkg/kgo: only drain/kafkadrain",
				"package example.com/m/drain/jsdrain imports github.com/twmb/franz-go/pkg/kfake in a test: only the tests of drain/kafkadrain and cmd/sluice",
				"package example.com/m/drain/kafkadrain/x imports github.com/twmb/franz-go/pkg/kfake: only drain/kafkadrain, of the library packages",
				"package example.com/m/drain/kafkadrain/x imports github.com/twmb/franz-go/pkg/kfake: only the tests of drain/kafkadrain and cmd/sluice",
				"package example.com/m/lease imports example.com/m/drain/kafkadrain, which depends on github.com/twmb/franz-go/pkg/kgo: only drain/kafkadrain",
			},
		},
		{
			name: "library imports internal",
			pkgs: []*pkg{
				own("internal/storekey", "storekey"),
				own("httplimit", "httplimit", mod+"/internal/storekey"),
				own("internal/service", "service", mod+"/internal/storekey"), // allowed
				own("cmd/sluice", "main", mod+"/internal/storekey"),          // allowed
				std("internal/race"),
				own("ratelimitx", "ratelimitx", "internal/race"), // the standard library's own
			},
			want: []string{"package example.com/m/httplimit imports example.com/m/internal/storekey: library packages may not import"},
		},
		{
			name: "library reaches grpc through a dependency",
			pkgs: []*pkg{
				ext("google.golang.org/grpc"),
				ext("github.com/x/wrapper", "google.golang.org/grpc"),
				own("drain", "drain", "github.com/x/wrapper"),
			},
			want: []string{"package example.com/m/drain imports github.com/x/wrapper, which depends on google.golang.org/grpc"},
		},
		{
			name: "adaptive imports a module",
			pkgs: []*pkg{ext("github.com/x/y"), own("adaptive", "adaptive", "github.com/x/y")},
			want: []string{"package example.com/m/adaptive imports github.com/x/y: adaptive may depend on the standard library and priority only"},
		},
		{
			name: "adaptive imports priority, which imports a module",
			pkgs: []*pkg{
				ext("github.com/x/y"),
				own("priority", "priority", "github.com/x/y"),
				own("adaptive", "adaptive", mod+"/priority"), // allowed, unless priority reaches a module
				own("drain", "drain", mod+"/priority"),       // allowed
			},
			want: []string{
				"package example.com/m/adaptive imports example.com/m/priority, which depends on github.com/x/y: adaptive may depend on the standard library and priority only",
				"package example.com/m/priority imports github.com/x/y: ratelimit, the header codec limitheader, priority and fence may depend on the standard library only",
			},
		},
		{
			name: "benchmark-only modules outside bench",
			pkgs: []*pkg{
				ext("github.com/failsafe-go/failsafe-go/adaptivelimiter"), ext("gonum.org/v1/plot"),
				own("drain", "drain", "github.com/failsafe-go/failsafe-go/adaptivelimiter"),
				{ImportPath: mod + "/adaptive", Name: "adaptive", TestImports: []string{"gonum.org/v1/plot"}},
				{ImportPath: mod + "/bench/overload", Name: "overload", XTestImports: []string{"github.com/failsafe-go/failsafe-go/adaptivelimiter"}}, // allowed
			},
			want: []string{
				"package example.com/m/adaptive imports gonum.org/v1/plot in a test: only bench/",
				"package example.com/m/drain imports github.com/failsafe-go/failsafe-go/adaptivelimiter: only bench/",
			},
		},
		{
			name: "test-only modules outside cmd/sluice's tests",
			pkgs: []*pkg{
				ext("github.com/chromedp/chromedp"), ext("github.com/prometheus/prometheus/promql/parser"),
				{ImportPath: mod + "/dashboard", Name: "dashboard", XTestImports: []string{"github.com/chromedp/chromedp"}},
				func() *pkg {
					p := own("cmd/sluice", "main", "github.com/prometheus/prometheus/promql/parser")
					p.TestImports = []string{"github.com/chromedp/chromedp"} // allowed
					return p
				}(),
			},
			want: []string{
				"package example.com/m/cmd/sluice imports github.com/prometheus/prometheus/promql/parser: the sluice binary may not link",
				"package example.com/m/dashboard imports github.com/chromedp/chromedp in a test: only cmd/sluice's tests",
			},
		},
		{
			name: "the binary links test code",
			pkgs: []*pkg{
				std("testing"), std("internal/synctest"), std("testing/synctest"),
				{ImportPath: "net/http/httptest", Name: "httptest", Standard: true, Deps: []string{"testing"}},
				std("net/http"),
				own("internal/redistest", "redistest", "testing"),
				own("internal/redisproc", "redisproc"),
				own("httplimit/rudb", "rudb", "net/http", "internal/synctest"), // allowed: the standard library's internals
				func() *pkg {
					p := own("cmd/sluice", "main", mod+"/internal/redistest", mod+"/internal/redisproc", "net/http/httptest", mod+"/httplimit/rudb", "testing/synctest")
					p.TestImports = []string{"testing", mod + "/internal/redistest"} // allowed: its tests
					return p
				}(),
				own("cmd/tool", "main", "testing"),
				own("bench/redisload", "main", mod+"/internal/redistest"), // not a command under cmd/
			},
			want: []string{
				"package example.com/m/cmd/sluice imports example.com/m/internal/redistest: a command under cmd/",
				"package example.com/m/cmd/sluice imports net/http/httptest: a command under cmd/",
				"package example.com/m/cmd/sluice imports testing/synctest: a command under cmd/",
				"package example.com/m/cmd/tool imports testing: a command under cmd/",
			},
		},
		{
			name: "flag outside main under cmd",
			pkgs: []*pkg{
				std("flag"),
				own("internal/rules", "rules", "flag"),
				own("cmd/tool/lib", "lib", "flag"),
				own("tools", "main", "flag"),
				own("bench/load", "main", "flag"), // allowed
			},
			want: []string{
				"package example.com/m/cmd/tool/lib imports flag",
				"package example.com/m/internal/rules imports flag",
				"package example.com/m/tools imports flag",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pkgs := make(map[string]*pkg)
			for _, p := range tt.pkgs {
				pkgs[p.ImportPath] = p
			}
			got, err := check(pkgs, mod)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %d messages, want %d:\n%s", len(got), len(tt.want), strings.Join(got, "\n"))
			}
			for i, w := range tt.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("message %d = %q, want it to contain %q", i, got[i], w)
				}
			}
		})
	}
}

func TestEnvCalls(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want []string
	}{
		{"none", `package p; import "os"; func f() { os.Exit(0) }`, nil},
		{"getenv", `package p; import "os"; func f() string { return os.Getenv("X") }`,
			[]string{"os.Getenv at x.go:1"}},
		{"renamed import", "package p\nimport sys \"os\"\nfunc f() { _, _ = sys.LookupEnv(\"X\") }",
			[]string{"os.LookupEnv at x.go:3"}},
		{"function value", "package p\nimport \"os\"\nvar get = os.Environ",
			[]string{"os.Environ at x.go:3"}},
		{"syscall", `package p; import "syscall"; func f() { syscall.Getenv("X") }`,
			[]string{"syscall.Getenv at x.go:1"}},
		{"shadowing name without import", `package p; type o struct{}; func (o) Getenv() {}; func f(os o) { os.Getenv() }`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := envCalls("x.go", []byte(tt.src))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("envCalls = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestEnvCallsInPackageFiles(t *testing.T) {
	dir := t.TempDir()
	src := "package store\n\nimport \"os\"\n\nfunc addr() string { return os.Getenv(\"REDIS_ADDR\") }\n"
	if err := os.WriteFile(filepath.Join(dir, "store.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	const mod = "example.com/m"
	pkgs := map[string]*pkg{
		mod + "/redisstore": {ImportPath: mod + "/redisstore", Name: "store", Dir: dir, GoFiles: []string{"store.go"}, Imports: []string{"os"}},
	}
	got, err := checkFlagsAndEnv(pkgs, mod)
	if err != nil {
		t.Fatal(err)
	}
	want := "package example.com/m/redisstore calls os.Getenv at store.go:5: only package main under cmd/ or bench/ may read the environment"
	if len(got) != 1 || got[0] != want {
		t.Errorf("got %q, want [%q]", got, want)
	}

	// The same file in a test-support package (one that imports testing)
	// is allowed.
	p := pkgs[mod+"/redisstore"]
	p.Imports = append(p.Imports, "testing")
	if got, err := checkFlagsAndEnv(pkgs, mod); err != nil || len(got) != 0 {
		t.Errorf("test-support package: got %q, %v; want no messages", got, err)
	}
}
