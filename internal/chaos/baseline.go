package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
)

// baselinePort is the undisturbed run's rendezvous port. torchrun
// --standalone (the demo's baseline) binds the wildcard address on 29400,
// the port the job's launcher binds on its pod IP at the same time here.
const baselinePort = 29431

var accRe = regexp.MustCompile(`final accuracy=([\d.]+)`)

// baseline runs the same training undisturbed with the job's desired
// number of local processes (the world size the chaos job trains at between
// faults; the demo's baseline uses two) and returns its final accuracy.
func baseline(ctx context.Context, repo string, epochs, width int) (float64, error) {
	dir, err := os.MkdirTemp("", "etjob-chaos-baseline-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	cmd := exec.CommandContext(ctx, "/usr/bin/python3", "-m", "etjob.torchrun", "--nnodes=1", fmt.Sprintf("--nproc_per_node=%d", desiredWorkers),
		"--rdzv_backend=c10d", fmt.Sprintf("--rdzv_endpoint=localhost:%d", baselinePort), "--rdzv_id=chaos-baseline",
		filepath.Join(repo, "examples/digits/train.py"), "--epochs", strconv.Itoa(epochs))
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(repo, "python"), "ETJOB_CHECKPOINT_DIR="+dir,
		"WIDTH="+strconv.Itoa(width), "ETJOB_AGENT_ADDR=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("undisturbed run: %w\n%s", err, tail(string(out), 2000))
	}
	m := accRe.FindStringSubmatch(string(out))
	if m == nil {
		return 0, fmt.Errorf("the undisturbed run printed no final accuracy:\n%s", tail(string(out), 2000))
	}
	return strconv.ParseFloat(m[1], 64)
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
