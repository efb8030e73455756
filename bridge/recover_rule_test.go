//go:build goddp_testhooks

package main

import (
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// exportLine is cgo's export directive, which must sit right above its func.
var exportLine = regexp.MustCompile(`(?m)^//export (\w+)`)

// TestEveryExportRecoversPanics holds the hard rule "a Go panic never
// crosses into C" for every export, today's and tomorrow's: the first
// statement of each //export function in bridge/*.go defers the recovery
// (errors.go). An export that returns a goddp_status defers
// recoverAsStatus(&status, errMsg) on its named result (and its err_msg
// parameter, where it has one), so the caller hears GODDP_ERR_PANIC; one
// that returns no status defers recoverSilently(). A recover anywhere else
// (a helper, a later statement) misses panics from the statements before it.
func TestEveryExportRecoversPanics(t *testing.T) {
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	fset := token.NewFileSet()
	var directives, checked []string
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		src, err := os.ReadFile(path)
		require.NoError(t, err)
		for _, m := range exportLine.FindAllStringSubmatch(string(src), -1) {
			directives = append(directives, m[1])
		}
		file, err := parser.ParseFile(fset, path, src, parser.ParseComments)
		require.NoError(t, err)
		for _, decl := range file.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Doc == nil || !exportedByCgo(fn) {
				continue
			}
			checked = append(checked, fn.Name.Name)
			if problem := recoverProblem(fn); problem != "" {
				t.Errorf("%s: //export %s: %s", fset.Position(fn.Pos()), fn.Name.Name, problem)
			}
		}
	}
	// Every directive belongs to a function checked above, and there are
	// exports to check at all (goddp_plan_graph among them).
	assert.ElementsMatch(t, directives, checked)
	assert.Contains(t, checked, "goddp_plan_graph")
}

func exportedByCgo(fn *ast.FuncDecl) bool {
	for _, c := range fn.Doc.List {
		if c.Text == "//export "+fn.Name.Name {
			return true
		}
	}
	return false
}

// recoverProblem says what is wrong with fn's recovery, or "" when its
// first statement is the deferred recovery the rule asks for.
func recoverProblem(fn *ast.FuncDecl) string {
	status := ""
	if fn.Type.Results != nil {
		for _, field := range fn.Type.Results.List {
			if isCType(field.Type, "goddp_status") {
				if len(field.Names) != 1 {
					return "its goddp_status result must be named, for the deferred recovery to set it"
				}
				status = field.Names[0].Name
			}
		}
	}
	errMsg := "nil"
	for _, field := range fn.Type.Params.List {
		if star, ok := field.Type.(*ast.StarExpr); ok {
			if inner, ok := star.X.(*ast.StarExpr); ok && isCType(inner.X, "char") && len(field.Names) == 1 && field.Names[0].Name == "errMsg" {
				errMsg = "errMsg"
			}
		}
	}
	want := "defer recoverSilently()"
	if status != "" {
		want = "defer recoverAsStatus(&" + status + ", " + errMsg + ")"
	}
	if fn.Body == nil || len(fn.Body.List) == 0 {
		return "has no body; want its first statement to be " + want
	}
	first, ok := fn.Body.List[0].(*ast.DeferStmt)
	if !ok {
		return "its first statement is not a defer; want " + want
	}
	if got := render(first.Call); "defer "+got != want {
		return "its first statement is `defer " + got + "`; want " + want
	}
	return ""
}

// isCType says whether expr is C.name.
func isCType(expr ast.Expr, name string) bool {
	sel, ok := expr.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	pkg, ok := sel.X.(*ast.Ident)
	return ok && pkg.Name == "C" && sel.Sel.Name == name
}

// render writes expr as Go source.
func render(expr ast.Expr) string {
	var b strings.Builder
	if err := printer.Fprint(&b, token.NewFileSet(), expr); err != nil {
		return err.Error()
	}
	return b.String()
}
