package localcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Binaries are the etjob binaries a local cluster runs: cmd/etjob-node as
// a process per node (the kubelet of a process node, here only), and
// cmd/etjob-controller and cmd/etjob-agent as the chart's pods, whose images
// (ghcr.io/etjob/etjob-controller, ghcr.io/etjob/etjob-agent) the process
// nodes map to these files. The user's binary, etjob, is not among them: it
// is a client.
type Binaries struct {
	Controller string
	Node       string
	Agent      string
}

// componentNames are the binaries' names, as `make build` and `go install
// ./cmd/...` name them.
var componentNames = []string{"etjob-controller", "etjob-node", "etjob-agent"}

// BinariesIn returns the components in dir, or an error that names every
// one missing and how to build them.
func BinariesIn(dir string) (Binaries, error) {
	var missing []string
	paths := make([]string, len(componentNames))
	for i, name := range componentNames {
		paths[i] = filepath.Join(dir, name)
		if st, err := os.Stat(paths[i]); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return Binaries{}, fmt.Errorf("the local cluster runs %s from %s, and %s not there: run `make build` (bin/), or `go install ./cmd/...` in the etjob repository",
			strings.Join(componentNames, ", "), dir, strings.Join(missing, ", ")+" is")
	}
	return Binaries{Controller: paths[0], Node: paths[1], Agent: paths[2]}, nil
}

// BinariesNextTo returns the components in the directory of the running
// binary (etjob-local), where `make build` and `go install` put them.
func BinariesNextTo() (Binaries, error) {
	self, err := os.Executable()
	if err != nil {
		return Binaries{}, err
	}
	if resolved, err := filepath.EvalSymlinks(self); err == nil {
		self = resolved
	}
	return BinariesIn(filepath.Dir(self))
}

// binaries are c.Binaries, or when unset the ones next to the running binary.
func (c *Cluster) binaries() (Binaries, error) {
	if c.Binaries != (Binaries{}) {
		return c.Binaries, nil
	}
	return BinariesNextTo()
}

// BuildBinaries builds the components from the etjob repository at repo
// into dir (tests and benchmarks: the build cache makes it a link step).
func BuildBinaries(ctx context.Context, repo, dir string) (Binaries, error) {
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	for _, name := range componentNames {
		args = append(args, "./cmd/"+name)
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return Binaries{}, errors.Join(fmt.Errorf("go %s: %w", strings.Join(args, " "), err), errors.New(strings.TrimSpace(string(out))))
	}
	return BinariesIn(dir)
}
