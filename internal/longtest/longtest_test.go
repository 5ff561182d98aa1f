package longtest_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestMakefileAgrees: the Makefile's LONG names exactly the tests that
// call longtest.Run, so that `make test-long` runs every test `make test`
// skips, and LONG_PKGS holds their packages.
func TestMakefileAgrees(t *testing.T) {
	root := filepath.Join("..", "..")
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	long := regexp.MustCompile(`(?m)^LONG := \^\(([^)]*)\)\$\$$`).FindSubmatch(mk)
	pkgs := regexp.MustCompile(`(?m)^LONG_PKGS := (.*)$`).FindSubmatch(mk)
	if long == nil || pkgs == nil {
		t.Fatal("the Makefile has no LONG := ^(...)$$ or no LONG_PKGS")
	}
	inMakefile := strings.Split(string(long[1]), "|")
	var inCode []string
	var dirs []string
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil || len(fn.Body.List) == 0 {
				continue
			}
			if callsRun(fn.Body.List[0]) {
				inCode = append(inCode, fn.Name.Name)
				dir, _ := filepath.Rel(root, filepath.Dir(path))
				if dir = "./" + filepath.ToSlash(dir) + "/"; !slices.Contains(dirs, dir) {
					dirs = append(dirs, dir)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(inMakefile)
	slices.Sort(inCode)
	inCode = slices.Compact(inCode)
	if !slices.Equal(inMakefile, inCode) {
		t.Errorf("the Makefile's LONG names\n  %v\nthe tests that start with longtest.Run(t) are\n  %v", inMakefile, inCode)
	}
	listed := strings.Fields(string(pkgs[1]))
	slices.Sort(listed)
	slices.Sort(dirs)
	if !slices.Equal(listed, dirs) {
		t.Errorf("the Makefile's LONG_PKGS is %v; the long tests are in %v", listed, dirs)
	}
}

// callsRun reports whether st is longtest.Run(t).
func callsRun(st ast.Stmt) bool {
	es, ok := st.(*ast.ExprStmt)
	if !ok {
		return false
	}
	call, ok := es.X.(*ast.CallExpr)
	if !ok {
		return false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	pkg, ok := sel.X.(*ast.Ident)
	return ok && pkg.Name == "longtest" && sel.Sel.Name == "Run"
}
