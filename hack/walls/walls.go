// Package walls holds the import walls of etjob's design (docs/design.md,
// "Walls") and checks a module's package graph against them. Its test runs
// them on this module in the README's test command; each wall also has a
// test that breaks it on purpose, so that a check that never fails is caught.
package walls

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"sort"
	"strings"
)

// Module is etjob's module path.
const Module = "github.com/etjob/etjob"

// Package is one package of the graph: its direct imports and all its
// dependencies (go list's Imports and Deps), its Go files, and whether it is
// in the standard library.
type Package struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Imports    []string
	Deps       []string
	Standard   bool
}

// Graph is the packages by import path.
type Graph map[string]*Package

// Wall is one rule: the packages matching From must not import (directly
// when Direct, else anywhere below them) a package matching Forbid.
type Wall struct {
	Name string
	// From and Forbid are import paths; a trailing "/..." matches the path
	// and every path below it.
	From   []string
	Forbid []string
	Direct bool
	// StdlibOnly forbids every non-standard package but From's own.
	StdlibOnly bool
}

// Walls are etjob's walls.
var Walls = []Wall{
	{
		Name:   "the decision core is pure: no client, no controller-runtime, no os, no net",
		From:   []string{Module + "/internal/core"},
		Forbid: []string{"k8s.io/client-go/...", "sigs.k8s.io/controller-runtime/...", "os/...", "net/..."},
		Direct: true,
	},
	{
		Name:   "api/ imports nothing under internal/",
		From:   []string{Module + "/api/..."},
		Forbid: []string{Module + "/internal/..."},
	},
	{
		Name: "the user's binaries are clients: no controller, local cluster, agent, virtual-kubelet, apiserver or gonum",
		From: []string{Module + "/cmd/etjob", Module + "/cmd/kubectl-etjob", Module + "/internal/cli"},
		Forbid: []string{Module + "/internal/controller/...", Module + "/internal/localcluster/...", Module + "/internal/agent/...",
			"github.com/virtual-kubelet/...", "k8s.io/apiserver/...", "gonum.org/..."},
	},
	{
		Name:   "the agent does not import the controller",
		From:   []string{Module + "/internal/agent/...", Module + "/cmd/etjob-agent"},
		Forbid: []string{Module + "/internal/controller/..."},
	},
	{
		Name: "the emulated cloud is a test double: nothing that ships in the controller, the agent, the user's binaries, api/ or pkg/ imports it",
		From: []string{Module + "/cmd/etjob-controller", Module + "/cmd/etjob-agent", Module + "/cmd/etjob", Module + "/cmd/kubectl-etjob",
			Module + "/internal/controller/...", Module + "/internal/agent/...", Module + "/internal/core/...", Module + "/internal/render/...",
			Module + "/internal/cli/...", Module + "/api/...", Module + "/pkg/..."},
		Forbid: []string{Module + "/internal/emucloud/..."},
	},
	{
		Name:       "pkg/supervisor is the standard library only (Go workers import it)",
		From:       []string{Module + "/pkg/supervisor"},
		StdlibOnly: true,
	},
}

// match reports whether path matches pattern (exact, or pattern/... for a
// whole tree).
func match(pattern, path string) bool {
	if tree, ok := strings.CutSuffix(pattern, "/..."); ok {
		return path == tree || strings.HasPrefix(path, tree+"/")
	}
	return path == pattern
}

func matchAny(patterns []string, path string) bool {
	for _, p := range patterns {
		if match(p, path) {
			return true
		}
	}
	return false
}

// Check returns one line per broken wall and offending import, sorted. A
// wall whose From matches no package of g is itself reported: a renamed
// package must not silently lift its wall.
func Check(g Graph, walls []Wall) []string {
	var out []string
	for _, w := range walls {
		found := false
		for _, p := range g {
			if !matchAny(w.From, p.ImportPath) {
				continue
			}
			found = true
			imports := p.Deps
			if w.Direct {
				imports = p.Imports
			}
			for _, imp := range imports {
				q := g[imp]
				bad := matchAny(w.Forbid, imp)
				if w.StdlibOnly {
					bad = q != nil && !q.Standard && !matchAny(w.From, imp)
				}
				if bad {
					out = append(out, fmt.Sprintf("%s: %s imports %s", w.Name, p.ImportPath, imp))
				}
			}
		}
		if !found {
			out = append(out, fmt.Sprintf("%s: no package matches %s", w.Name, strings.Join(w.From, ", ")))
		}
	}
	sort.Strings(out)
	return out
}

// ClockCalls returns file:line of every call of time.Now, time.Since or
// time.Until in p's Go files (tests are not among GoFiles): the decision
// core is given the time, and never reads the clock.
func ClockCalls(p *Package) ([]string, error) {
	var out []string
	fset := token.NewFileSet()
	for _, name := range p.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, 0)
		if err != nil {
			return nil, err
		}
		timeName := ""
		for _, imp := range f.Imports {
			if imp.Path.Value == `"time"` {
				timeName = "time"
				if imp.Name != nil {
					timeName = imp.Name.Name
				}
			}
		}
		if timeName == "" {
			continue
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if id, ok := sel.X.(*ast.Ident); ok && id.Name == timeName {
				switch sel.Sel.Name {
				case "Now", "Since", "Until":
					out = append(out, fmt.Sprintf("%s: time.%s", fset.Position(sel.Pos()), sel.Sel.Name))
				}
			}
			return true
		})
	}
	return out, nil
}
