package core

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestOnlyBuildWritesThePlanAndTheStatus holds the decision core's shape:
// the policies decide into the decision's typed fields, and build (decide.go)
// alone makes a Plan and writes a status. A policy that builds a Plan, keeps
// one or a status in a struct, or assigns through a .Status selector fails
// it, naming the file and line.
func TestOnlyBuildWritesThePlanAndTheStatus(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var bad []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") || name == "scale.go" {
			// scale.go is DecideScale, a decision of its own over a
			// ScaleRequest, which writes that object's status.
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			inBuild := false
			if fn, ok := decl.(*ast.FuncDecl); ok && fn.Name.Name == "build" && name == "decide.go" {
				inBuild = true
			}
			ast.Inspect(decl, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.CompositeLit:
					if id, ok := n.Type.(*ast.Ident); ok && id.Name == "Plan" && !inBuild {
						bad = append(bad, fset.Position(n.Pos()).String()+": a Plan made outside build")
					}
				case *ast.StructType:
					for _, fld := range n.Fields.List {
						if name == "plan.go" && len(fld.Names) == 1 && fld.Names[0].Name == "Status" {
							continue // Plan's own Status: what build fills
						}
						if typeName(fld.Type) == "ElasticJobStatus" || typeName(fld.Type) == "Plan" {
							bad = append(bad, fset.Position(fld.Pos()).String()+": a struct keeps a Plan or a status")
						}
					}
				case *ast.AssignStmt:
					for _, l := range n.Lhs {
						if writesStatus(l) && !inBuild {
							bad = append(bad, fset.Position(l.Pos()).String()+": a status field written outside build")
						}
					}
				case *ast.IncDecStmt:
					if writesStatus(n.X) && !inBuild {
						bad = append(bad, fset.Position(n.Pos()).String()+": a status field written outside build")
					}
				}
				return true
			})
		}
	}
	if len(bad) > 0 {
		t.Errorf("only build writes the plan and the status:\n%s", strings.Join(bad, "\n"))
	}
}

// typeName is the name of a type expression, without its package or pointer.
func typeName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return e.Sel.Name
	case *ast.StarExpr:
		return typeName(e.X)
	}
	return ""
}

// writesStatus reports whether an assignment's left side goes through a
// .Status selector (x.Status.F, x.Job.Status.F) or is the variable st.
func writesStatus(e ast.Expr) bool {
	for {
		switch x := e.(type) {
		case *ast.SelectorExpr:
			if x.Sel.Name == "Status" {
				return true
			}
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.StarExpr:
			e = x.X
		case *ast.Ident:
			return x.Name == "st"
		default:
			return false
		}
	}
}
