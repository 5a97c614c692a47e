package v1alpha1

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// pythonContract is the Python library's copy of the worker contract,
// generated from this package by TestPythonContract.
const pythonContract = "../../python/etjob/contract.py"

// contractFiles hold the contract's constants: every Env* name, AgentPort
// and ExitCodePreempted.
var contractFiles = []string{"contract.go", "agent.go", "store.go", "constants.go"}

var (
	lowerUpper = regexp.MustCompile(`([a-z0-9])([A-Z])`)
	upperWord  = regexp.MustCompile(`([A-Z]+)([A-Z][a-z])`)
)

// pythonName is a Go constant's name in Python: EnvTorchrunRdzvID is
// ENV_TORCHRUN_RDZV_ID.
func pythonName(goName string) string {
	s := upperWord.ReplaceAllString(goName, "${1}_${2}")
	return strings.ToUpper(lowerUpper.ReplaceAllString(s, "${1}_${2}"))
}

// renderPythonContract reads the contract's constants from this package's
// source and renders python/etjob/contract.py.
func renderPythonContract() (string, error) {
	type constant struct{ name, value string }
	var consts []constant
	fset := token.NewFileSet()
	for _, name := range contractFiles {
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			return "", err
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, id := range vs.Names {
					if !strings.HasPrefix(id.Name, "Env") && id.Name != "AgentPort" && id.Name != "ExitCodePreempted" {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok {
						return "", fmt.Errorf("%s: %s is not a literal", name, id.Name)
					}
					consts = append(consts, constant{pythonName(id.Name), lit.Value})
				}
			}
		}
	}
	sort.Slice(consts, func(i, j int) bool { return consts[i].name < consts[j].name })
	var b strings.Builder
	b.WriteString(`# Code generated from api/v1alpha1 (the worker contract) by its
# TestPythonContract; DO NOT EDIT. make generate writes it again.
"""The worker contract: the environment etjob's controller gives a worker
and a launcher and the worker libraries' own settings (the ENV_ names), the
node agent's port and the exit code of a worker told to stop. Go's
api/v1alpha1 owns them."""

`)
	for _, c := range consts {
		v := c.value
		if strings.HasPrefix(v, "`") {
			u, err := strconv.Unquote(v)
			if err != nil {
				return "", err
			}
			v = strconv.Quote(u)
		}
		fmt.Fprintf(&b, "%s = %s\n", c.name, v)
	}
	return b.String(), nil
}

// TestPythonContract fails while python/etjob/contract.py differs from what
// this package's constants render; ETJOB_UPDATE_CONTRACT=1 (make generate)
// writes it.
func TestPythonContract(t *testing.T) {
	want, err := renderPythonContract()
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv("ETJOB_UPDATE_CONTRACT") == "1" {
		if err := os.WriteFile(pythonContract, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(pythonContract)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("%s is not what api/v1alpha1's contract renders: run make generate (or ETJOB_UPDATE_CONTRACT=1 go test -run TestPythonContract ./api/v1alpha1/)\n--- got\n%s\n--- want\n%s",
			filepath.Clean(pythonContract), got, want)
	}
}

func TestPythonName(t *testing.T) {
	for goName, want := range map[string]string{
		"EnvJobName": "ENV_JOB_NAME", "EnvPodIP": "ENV_POD_IP", "EnvTorchrunRdzvID": "ENV_TORCHRUN_RDZV_ID",
		"EnvTorchrunNProcPerNode": "ENV_TORCHRUN_N_PROC_PER_NODE", "AgentPort": "AGENT_PORT", "ExitCodePreempted": "EXIT_CODE_PREEMPTED",
	} {
		if got := pythonName(goName); got != want {
			t.Errorf("pythonName(%q) = %q, want %q", goName, got, want)
		}
	}
}
