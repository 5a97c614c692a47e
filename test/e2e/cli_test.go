package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/demo"
)

// TestCLIStory drives a spot story through the etjob CLI only, with Arena's
// spellings where Arena has them: submit, get, logs, scaleout, a reclamation,
// add-node, scalein, completion, delete. The training logs then show that no
// committed step was lost.
func TestCLIStory(t *testing.T) {
	ctx := withTimeout(t, 20*time.Minute)
	e := startCluster(t, ctx, "etjob-e2e-cli", 4, 1)
	cl, repo, bin, dir := e.Cluster, e.repo, e.bin, e.Dir
	ckpt := filepath.Join(dir, "shared", "ckpt")
	if err := os.MkdirAll(ckpt, 0o755); err != nil {
		t.Fatal(err)
	}
	etjob := func(args ...string) (string, error) {
		t.Helper()
		cmd := exec.CommandContext(ctx, bin, append(args, "--kubeconfig", cl.Kubeconfig())...)
		if args[0] == "cluster" {
			cmd = exec.CommandContext(ctx, bin, append(args, "--dir", dir)...)
		}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		t.Logf("$ etjob %s\n%s", strings.Join(args, " "), strings.TrimSpace(out.String()))
		return out.String(), err
	}
	must := func(args ...string) string {
		t.Helper()
		out, err := etjob(args...)
		if err != nil {
			t.Fatalf("etjob %s: %v", strings.Join(args, " "), err)
		}
		return out
	}
	getJob := func() *etjobv1.ElasticJob {
		t.Helper()
		cmd := exec.CommandContext(ctx, bin, "get", "digits-cli", "-o", "json", "--kubeconfig", cl.Kubeconfig())
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("etjob get -o json: %v", err)
		}
		j := &etjobv1.ElasticJob{}
		if err := json.Unmarshal(out, j); err != nil {
			t.Fatalf("etjob get -o json printed no ElasticJob: %v\n%s", err, out)
		}
		return j
	}
	waitFor := func(what string, timeout time.Duration, ok func(*etjobv1.ElasticJob) bool) *etjobv1.ElasticJob {
		t.Helper()
		deadline := time.Now().Add(timeout)
		for {
			j := getJob()
			if ok(j) {
				return j
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s: %+v", what, j.Status)
			}
			time.Sleep(time.Second)
		}
	}

	must("submit", "etjob", "--name=digits-cli", "--workers=3", "--min-workers=2", "--max-workers=4", "--gpus=1",
		"--spot-instance", "--image=etjob/digits:local", "--data-dir", repo+":/opt/etjob", "--data-dir", ckpt+":/ckpt",
		"--checkpoint-dir=/ckpt", "-e", "PATH=/usr/bin:/bin", "-e", "PYTHONPATH=/opt/etjob/python", "-e", "EPOCHS=40", "-e", "WIDTH=64",
		"python3 -m etjob.torchrun /opt/etjob/examples/digits/train.py")
	waitFor("3 members", 5*time.Minute, func(j *etjobv1.ElasticJob) bool { return j.Status.Members == 3 })
	out := must("get", "digits-cli")
	for _, want := range []string{"Name:", "digits-cli", "Trainer:", "ETJOB", "Instances:", "IS_CHIEF", "GPU(Requested)"} {
		if !strings.Contains(out, want) {
			t.Errorf("etjob get lacks %q", want)
		}
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		out, _ = etjob("logs", "digits-cli", "--tail", "3")
		if strings.Contains(out, "[worker-") && strings.Contains(out, "step=") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("etjob logs shows no prefixed step lines:\n%s", out)
		}
		time.Sleep(2 * time.Second)
	}

	// Arena's scale-out: a ScaleOut request, done when the new worker is a member.
	must("scaleout", "etjob", "--name=digits-cli", "--count=1", "--timeout=4m")
	waitFor("4 members", time.Minute, func(j *etjobv1.ElasticJob) bool { return j.Status.Members == 4 })

	// A spot node is reclaimed with a notice: the job shrinks in place, then
	// grows back on a new node.
	j := getJob()
	victim := ""
	for _, w := range j.Status.Workers {
		if w.State == etjobv1.WorkerMember && strings.HasPrefix(w.Node, "spot-") {
			victim = w.Node
		}
	}
	must("cluster", "reclaim", victim, "--notice", "15s")
	must("cluster", "add-node", "--spot")
	waitFor("4 members again", 4*time.Minute, func(j *etjobv1.ElasticJob) bool { return j.Status.Members == 4 })

	// Arena's scale-in.
	must("scalein", "etjob", "--name=digits-cli", "--count=1", "--timeout=4m")
	j = waitFor("completion", 15*time.Minute, func(j *etjobv1.ElasticJob) bool { return j.Status.CompletionTime != nil })
	if out := must("get", "digits-cli"); !strings.Contains(out, "SUCCEEDED") {
		t.Errorf("etjob get after completion:\n%s", out)
	}
	if j.Status.Failures != 0 || j.Status.Preemptions < 1 {
		t.Errorf("failures %d preemptions %d: the reclaimed worker is a preemption", j.Status.Failures, j.Status.Preemptions)
	}
	lines, err := demo.ReadLogs(dir, "default", "digits-cli")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, ok := demo.Final(lines); !ok {
		t.Fatal("training did not finish")
	}
	if ok, detail := demo.LedgerOK(lines); !ok {
		t.Errorf("sampler ledger: %s", detail)
	}
	for i, r := range demo.Resumes(lines) {
		if r.Lost != 0 {
			t.Errorf("restart %d (resumed at %d after reaching %d) lost %d committed steps", i+1, r.From, r.Reached, r.Lost)
		}
	}
	must("delete", "digits-cli")
}
