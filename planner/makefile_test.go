package planner

// The Makefile's gounit target runs fewer Go commands than a naive one
// would; these tests hold the assumptions that make that safe.

import (
	"go/ast"
	"go/build/constraint"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestGoroutinesOnlyInConcurrentTests keeps the Makefile's race run honest:
// make gounit runs only the planner's TestConcurrent* tests under -race
// (the planner itself starts no goroutine), so a go statement or a
// WaitGroup.Go call anywhere else in this package fails here.
func TestGoroutinesOnlyInConcurrentTests(t *testing.T) {
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	fset := token.NewFileSet()
	var seen []string
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, 0)
		require.NoError(t, err, name)
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			allowed := strings.HasSuffix(name, "_test.go") && strings.HasPrefix(fn.Name.Name, "TestConcurrent")
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				starts := false
				switch n := n.(type) {
				case *ast.GoStmt:
					starts = true
				case *ast.CallExpr:
					sel, ok := n.Fun.(*ast.SelectorExpr)
					starts = ok && sel.Sel.Name == "Go"
				}
				if starts {
					seen = append(seen, fn.Name.Name)
					assert.True(t, allowed, "%s: %s starts a goroutine; only TestConcurrent* tests run under -race (Makefile, gounit)",
						fset.Position(n.Pos()), fn.Name.Name)
				}
				return true
			})
		}
	}
	assert.Contains(t, seen, "TestConcurrentBuild", "the check found no goroutine at all: it no longer sees the package's files")
}

// TestEveryFileIsVettedWithTheTestHooks keeps gounit's one vet (with
// -tags goddp_testhooks) complete: a file that builds only without the tag
// would be vetted by no one.
func TestEveryFileIsVettedWithTheTestHooks(t *testing.T) {
	var files []string
	for _, dir := range []string{".", "../bridge"} {
		found, err := filepath.Glob(filepath.Join(dir, "*.go"))
		require.NoError(t, err)
		files = append(files, found...)
	}
	require.NotEmpty(t, files)
	withHooks := func(tag string) bool {
		return tag == "goddp_testhooks" || tag == "linux" || tag == "amd64" || tag == "cgo"
	}
	for _, name := range files {
		src, err := os.ReadFile(name)
		require.NoError(t, err)
		for _, line := range strings.Split(string(src), "\n") {
			if !constraint.IsGoBuild(line) {
				continue
			}
			expr, err := constraint.Parse(line)
			require.NoError(t, err, name)
			assert.True(t, expr.Eval(withHooks), "%s: %q excludes it from `go vet -tags goddp_testhooks` (Makefile, gounit)", name, line)
		}
	}
}

// TestEveryFuzzTargetIsFuzzed: make gofuzz fuzzes each Fuzz* function of
// the planner (a counted -fuzztime Nx run); without it, plain go test runs
// only a fuzz target's seeds. It reads what `make -n gofuzz` would run.
func TestEveryFuzzTargetIsFuzzed(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make on PATH")
	}
	cmd := exec.Command("make", "--no-print-directory", "-n", "-C", "..", "gofuzz")
	for _, kv := range os.Environ() { // not an outer make's jobserver or flags
		if !strings.HasPrefix(kv, "MAKEFLAGS=") && !strings.HasPrefix(kv, "MFLAGS=") && !strings.HasPrefix(kv, "MAKELEVEL=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "make -n gofuzz: %s", out)
	recipe := string(out)
	files, err := filepath.Glob("*_test.go")
	require.NoError(t, err)
	fset := token.NewFileSet()
	var targets []string
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, 0)
		require.NoError(t, err, name)
		for _, decl := range f.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && fn.Recv == nil && strings.HasPrefix(fn.Name.Name, "Fuzz") {
				targets = append(targets, fn.Name.Name)
				assert.Regexp(t, `-fuzz '\^`+fn.Name.Name+`\$' -fuzztime [0-9]+x \./planner`, recipe,
					"%s: %s is never fuzzed; add it to the Makefile's FUZZ_RUNS (gofuzz)", fset.Position(fn.Pos()), fn.Name.Name)
			}
		}
	}
	assert.Contains(t, targets, "FuzzPlan", "the check found no fuzz target at all")
}
