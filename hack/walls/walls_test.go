package walls

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// load is this module's package graph, from go list.
func load(t *testing.T) Graph {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-json=ImportPath,Dir,GoFiles,Imports,Deps,Standard", "./...")
	cmd.Dir = filepath.Join("..", "..")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	g := Graph{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		p := &Package{}
		if err := dec.Decode(p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		g[p.ImportPath] = p
	}
	return g
}

// TestWalls checks this module against every wall.
func TestWalls(t *testing.T) {
	g := load(t)
	for _, v := range Check(g, Walls) {
		t.Error(v)
	}
	core := g[Module+"/internal/core"]
	if core == nil {
		t.Fatal("no internal/core")
	}
	calls, err := ClockCalls(core)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range calls {
		t.Errorf("the decision core reads the clock (it is given now): %s", c)
	}
}

// TestWallsCatchBreaks breaks every wall in a small graph and checks that it
// is reported, and that the unbroken graph passes.
func TestWallsCatchBreaks(t *testing.T) {
	pkg := func(path string, std bool, imports ...string) *Package {
		return &Package{ImportPath: path, Imports: imports, Deps: imports, Standard: std}
	}
	clean := func() Graph {
		g := Graph{}
		for _, p := range []*Package{
			pkg("fmt", true), pkg("time", true), pkg("os", true), pkg("net/http", true),
			pkg("k8s.io/client-go/kubernetes", false), pkg("gonum.org/v1/plot", false),
			pkg(Module+"/api/v1alpha1", false, "fmt"),
			pkg(Module+"/internal/core", false, "fmt", "time", Module+"/api/v1alpha1"),
			pkg(Module+"/internal/controller", false, Module+"/internal/core", "k8s.io/client-go/kubernetes"),
			pkg(Module+"/internal/localcluster", false, "os"),
			pkg(Module+"/internal/agent", false, "net/http"),
			pkg(Module+"/cmd/etjob-agent", false, Module+"/internal/agent"),
			pkg(Module+"/internal/cli", false, Module+"/internal/core", "k8s.io/client-go/kubernetes"),
			pkg(Module+"/cmd/etjob", false, Module+"/internal/cli"),
			pkg(Module+"/cmd/kubectl-etjob", false, Module+"/internal/cli"),
			pkg(Module+"/pkg/supervisor", false, "os"),
			pkg(Module+"/internal/emucloud", false, "net/http", Module+"/internal/agent"),
			pkg(Module+"/internal/localcluster/processnode", false, Module+"/internal/emucloud"),
		} {
			g[p.ImportPath] = p
		}
		return g
	}
	if v := Check(clean(), Walls); len(v) > 0 {
		t.Fatalf("the clean graph breaks walls: %v", v)
	}
	breaks := map[string]func(Graph){
		"the decision core is pure": func(g Graph) {
			g[Module+"/internal/core"].Imports = append(g[Module+"/internal/core"].Imports, "os")
		},
		"api/ imports nothing under internal/": func(g Graph) {
			g[Module+"/api/v1alpha1"].Deps = append(g[Module+"/api/v1alpha1"].Deps, Module+"/internal/core")
		},
		"the user's binaries are clients": func(g Graph) {
			g[Module+"/cmd/kubectl-etjob"].Deps = append(g[Module+"/cmd/kubectl-etjob"].Deps, Module+"/internal/localcluster")
		},
		"the user's binaries are clients: gonum": func(g Graph) {
			g[Module+"/internal/cli"].Deps = append(g[Module+"/internal/cli"].Deps, "gonum.org/v1/plot")
		},
		"the agent does not import the controller": func(g Graph) {
			g[Module+"/cmd/etjob-agent"].Deps = append(g[Module+"/cmd/etjob-agent"].Deps, Module+"/internal/controller")
		},
		"pkg/supervisor is the standard library only": func(g Graph) {
			g[Module+"/pkg/supervisor"].Deps = append(g[Module+"/pkg/supervisor"].Deps, "k8s.io/client-go/kubernetes")
		},
		"the emulated cloud is a test double": func(g Graph) {
			g[Module+"/cmd/etjob-agent"].Deps = append(g[Module+"/cmd/etjob-agent"].Deps, Module+"/internal/emucloud")
		},
		"a wall whose packages are gone": func(g Graph) { delete(g, Module+"/internal/core") },
	}
	for name, breakIt := range breaks {
		t.Run(name, func(t *testing.T) {
			g := clean()
			breakIt(g)
			v := Check(g, Walls)
			want := strings.SplitN(name, ": gonum", 2)[0]
			if name == "a wall whose packages are gone" {
				want = "no package matches " + Module + "/internal/core"
			}
			if len(v) == 0 || !strings.Contains(strings.Join(v, "\n"), want) {
				t.Errorf("broken wall not reported: %v", v)
			}
		})
	}
	// Only direct imports count for the core: its dependencies' own imports
	// (apimachinery uses net) are not its own.
	g := clean()
	g[Module+"/internal/core"].Deps = append(g[Module+"/internal/core"].Deps, "net/http")
	if v := Check(g, Walls); len(v) > 0 {
		t.Errorf("an indirect import of net broke the core's wall: %v", v)
	}
}

func TestClockCalls(t *testing.T) {
	dir := t.TempDir()
	src := map[string]string{
		"a.go": "package p\n\nimport \"time\"\n\nfunc f(now time.Time) time.Duration { return now.Sub(time.Time{}) }\n",
		"b.go": "package p\n\nimport clock \"time\"\n\nvar t0 = clock.Now()\n\nfunc g() clock.Duration { return clock.Since(t0) }\n",
	}
	for name, s := range src {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	calls, err := ClockCalls(&Package{Dir: dir, GoFiles: []string{"a.go", "b.go"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) != 2 || !strings.Contains(calls[0], "b.go:5") || !strings.Contains(calls[1], "time.Since") {
		t.Errorf("calls = %v, want b.go's clock.Now and clock.Since", calls)
	}
}

// TestUserBinarySize builds the user's binaries as `make build` does
// (stripped) and checks that each is at most 60 MB.
func TestUserBinarySize(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	const limit = 60 << 20
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", dir+string(filepath.Separator), "./cmd/etjob", "./cmd/kubectl-etjob")
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, name := range []string{"etjob", "kubectl-etjob"} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %.1f MB stripped", name, float64(st.Size())/1e6)
		if st.Size() > limit {
			t.Errorf("%s is %d bytes stripped, more than 60 MB", name, st.Size())
		}
	}
}
