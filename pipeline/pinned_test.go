package pipeline

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestPinnedModeListMatchesTheTests keeps the Makefile's PINNED_MODE_TESTS true: the exactly-once
// pass of make test leaves those tests out because they choose their delivery mode themselves
// (forEachDelivery, eosConfig, alsConfig). A test on the list that followed the suite's mode would
// never run in exactly-once mode; a pinned test missing from the list would run twice.
func TestPinnedModeListMatchesTheTests(t *testing.T) {
	mk, err := os.ReadFile(filepath.Join("..", "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^PINNED_MODE_TESTS := (.+)$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("no PINNED_MODE_TESTS in the Makefile")
	}
	listed := strings.Split(strings.TrimSpace(string(m[1])), "|")
	slices.Sort(listed)

	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var pinned []string
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Test") || fn.Body == nil {
				continue
			}
			found := false
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				if c, ok := n.(*ast.CallExpr); ok {
					if id, ok := c.Fun.(*ast.Ident); ok && slices.Contains([]string{"forEachDelivery", "eosConfig", "alsConfig"}, id.Name) {
						found = true
					}
				}
				return !found
			})
			if found {
				pinned = append(pinned, fn.Name.Name)
			}
		}
	}
	slices.Sort(pinned)
	if len(pinned) == 0 {
		t.Fatal("found no test that chooses its delivery mode: the parser looks in the wrong place")
	}
	if !slices.Equal(listed, pinned) {
		t.Errorf("PINNED_MODE_TESTS in the Makefile lists\n  %s\nbut the tests that choose their delivery mode are\n  %s",
			strings.Join(listed, "|"), strings.Join(pinned, "|"))
	}
}
