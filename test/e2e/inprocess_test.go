package e2e

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/demo"
	"github.com/etjob/etjob/internal/driver"
	"github.com/etjob/etjob/internal/localcluster"
)

// TestInProcessStory is issue #15's story on the local cluster: real
// training with in-process recovery (etjob.elastic, the digits example's
// train_elastic.py, one rank per pod, no torchrun), 4 workers, min 2:
//   - a hard kill (every process of a member's node SIGKILLed, the node
//     gone, no notice): the 3 others train on in the same processes;
//   - a join (a node added, the controller's replacement worker joins and
//     takes the state by broadcast);
//   - the launcher's pod deleted (--recovery=InProcess): the rendezvous store
//     is gone, the workers train on, the controller replaces the launcher
//     alone and the workers reconnect to its store: no worker restarts, no
//     failure, no job restart (storeLoss);
//   - a frozen node (SIGSTOP of every pod process, the node stays Ready and
//     its connections open): the others go on without it after the
//     collective timeout; thawed, the frozen rank comes back as a newcomer;
//   - a noticed loss (a 20 s notice): the rank leaves at a commit (exit 75),
//     the others go on without a rollback (0 steps done again);
//   - then, on the same cluster, podsStory: 2 pods of 2 ranks each.
//
// After each: no survivor's pid changed (the pids of every pod's step lines),
// at most one step was done again (every generation's resume against the
// highest step logged before it), and at the end the sampler ledger is exact
// and the job Complete with no failure, its accuracy within 1 point of an
// undisturbed run of the same script (2 local processes, no cluster, run
// beside the story).
func TestInProcessStory(t *testing.T) {
	inProcessStory(t, inProcessRun{cluster: "etjob-e2e-inprocess", name: "inproc", image: "etjob/digits:local",
		torch: "1.13", env: []string{"PATH=/usr/bin:/bin"}, epochs: 25, full: true})
}

// TestInProcessStoryTorch2 is the story on PyPI's torch 2.15 (the local
// cluster's pytorch/pytorch:2* image, hack/install-torch2.sh's venv), where
// gloo's groups are aborted rather than leaked, with the script a torch 2.x
// DDP team brings: examples/ddp_tutorial, shaped like PyTorch's DDP tutorial
// (an epoch loop over etjob.elastic.DataLoader with 2 loader workers a rank,
// set_epoch, rank 0's snapshot). The hard kill, a join (the joiner's epoch
// loop catches up with the others') and the launcher's pod deleted, then
// the job to its end with the same checks (no survivor restarted, at most
// one step done again, the ledger exact, no failure, the launcher replaced
// alone), and the model the same as an undisturbed run's: its held-out loss
// within 1e-4 of that of 2 local processes of the same script on the same
// torch, run beside the story. The freeze and the notice, whose code is the
// same on both torches, run on torch 1.13 only. Then, on the same cluster,
// drainStory.
func TestInProcessStoryTorch2(t *testing.T) {
	venv := localcluster.Torch2Venv()
	if venv == "" {
		t.Fatal("the torch 2.x venv is not installed: run hack/install-torch2.sh (make test does)")
	}
	const epochs = 10
	// In float64: the story's world sizes (4, 3, 4) sum each step's
	// gradients in another order than the undisturbed run's 2 processes;
	// in float32 one ReLU input that rounded to the other side of 0 (at
	// step 540 of 640, seen once in four runs) sent the final held-out loss
	// 1.45e-4 away from the undisturbed one with every sample trained once
	// (reproduced outside the cluster by replaying that one flip). In
	// float64 that takes an input within ~1e-16 of 0, and a step done twice,
	// a batch skipped or a momentum lost still moves the loss by 6e-4 or more.
	tutorial := []string{"examples/ddp_tutorial/train_elastic.py", "--samples", "4096", "--epochs", strconv.Itoa(epochs), "--float64"}
	inProcessStory(t, inProcessRun{cluster: "etjob-e2e-inprocess2", name: "inproc2", image: "pytorch/pytorch:2.15.0",
		torch: "2.15", epochs: epochs, join: true, drain: true, env: []string{"SAMPLE_SLEEP=0.006"},
		script: "python3 /opt/etjob/" + strings.Join(tutorial, " "),
		undisturbedLoss: func(ctx context.Context, root string) (float64, error) {
			return undisturbedLoss(ctx, root, filepath.Join(venv, "bin", "python3"), 4, tutorial)
		}})
}

// undisturbedLoss runs script (a path in the repository, and its
// arguments) as 2 local etjob.elastic processes of python with its global
// batch made for workers ranks (as etjob's $workers makes it in a job's
// pods), and returns the held-out loss it printed (`final loss=L`).
func undisturbedLoss(ctx context.Context, root, python string, workers int, script []string) (float64, error) {
	dir, err := os.MkdirTemp("", "etjob-undisturbed-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	args := append([]string{filepath.Join(root, "hack/elastic-local.py"), "2", filepath.Join(root, script[0])}, script[1:]...)
	cmd := exec.CommandContext(ctx, python, append(args, "--snapshot", filepath.Join(dir, "snapshot.pt"))...)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(root, "python"), etjobv1.EnvArenaWorkers+"="+strconv.Itoa(workers),
		etjobv1.EnvCheckpointDir+"="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("the undisturbed run: %w\n%s", err, out)
	}
	loss, ok := driver.FinalLoss(driver.ParseLines(string(out)))
	if !ok {
		return 0, fmt.Errorf("the undisturbed run printed no final loss:\n%s", out)
	}
	return loss, nil
}

// inProcessRun is one run of the in-process story.
type inProcessRun struct {
	cluster, name, image string
	torch                string   // the torch the image holds (major.minor), as the launcher's store says
	env                  []string // more of the workers' environment (NAME=value)
	epochs               int
	// script is the workers' command (default: the digits example's
	// train_elastic.py)
	script string
	// full: the join, the freeze and the notice too, and the accuracy
	// against an undisturbed run of the same script
	full bool
	// join: the join without the rest of full
	join bool
	// drain: drainStory on the same cluster once the job is gone
	drain bool
	// undisturbedLoss, when set, is the held-out loss of an undisturbed run
	// of script, which the job's final loss must equal (1e-4)
	undisturbedLoss func(ctx context.Context, root string) (float64, error)
}

func inProcessStory(t *testing.T, o inProcessRun) {
	ctx := withTimeout(t, 10*time.Minute)
	epochs := o.epochs
	root := repoRoot(t)
	undisturbed := func() (float64, error) { return 0, nil }
	switch {
	case o.full:
		undisturbed = demo.Beside(ctx, func(ctx context.Context) (float64, error) {
			return demo.UndisturbedElastic(ctx, root, epochs, 2)
		})
	case o.undisturbedLoss != nil:
		undisturbed = demo.Beside(ctx, func(ctx context.Context) (float64, error) {
			return o.undisturbedLoss(ctx, root)
		})
	}
	script := o.script
	if script == "" {
		script = "python3 /opt/etjob/examples/digits/train_elastic.py"
	}
	e := startCluster(t, ctx, o.cluster, 4, 1)
	repo, dir := e.repo, e.Dir
	ckpt := e.sharedDir(t, "ckpt")
	run := func(bin string, args ...string) string {
		t.Helper()
		return e.run(t, ctx, bin, args...)
	}
	job := func() *etjobv1.ElasticJob {
		t.Helper()
		return e.job(t, ctx, o.name)
	}
	logs := jobLogs(t, dir, o.name)
	// waitTraining waits for steps at world size world after at, and
	// returns how long after at the first came.
	waitTraining := func(what string, world int, at time.Time) time.Duration {
		t.Helper()
		return waitWorld(t, ctx, logs, what, world, at)
	}
	// member picks a member's pod and node that is not the launcher's.
	member := func() (pod, node string) {
		t.Helper()
		j := job()
		names := []string{}
		nodes := map[string]string{}
		for _, w := range j.Status.Workers {
			if w.State == etjobv1.WorkerMember && w.Node != "" {
				names = append(names, w.Name)
				nodes[w.Name] = w.Node
			}
		}
		if len(names) == 0 {
			t.Fatalf("no member: %+v", j.Status.Workers)
		}
		sort.Strings(names)
		return names[len(names)-1], nodes[names[len(names)-1]]
	}

	args := []string{"submit", "etjob", "--name=" + o.name, "--workers=4", "--min-workers=2", "--max-workers=4", "--gpus=1",
		"--spot-instance", "--image=" + o.image, "--data-dir", repo + ":/opt/etjob", "--data-dir", ckpt + ":/ckpt",
		"--checkpoint-dir=/ckpt", "--recovery=InProcess", "-e", "PYTHONPATH=/opt/etjob/python", "-e", "EPOCHS=" + strconv.Itoa(epochs),
		"-e", "ETJOB_COLLECTIVE_TIMEOUT=5"}
	for _, kv := range o.env {
		args = append(args, "-e", kv)
	}
	run(e.bin, append(args, script)...)
	waitTraining("the job started", 4, time.Time{})

	// A hard kill: the node and every process on it gone, no notice.
	pod, node := member()
	killedAt := time.Now()
	run(e.local, "cluster", "reclaim", node, "--notice", "0")
	hard := waitTraining("after the hard kill of "+pod+"'s node", 3, killedAt)

	// A join: a node appears, the controller's replacement joins.
	var join, frozen, noticed time.Duration
	var noticedAt time.Time
	if o.full || o.join {
		addedAt := time.Now()
		run(e.local, "cluster", "add-node", "--spot")
		join = waitTraining("after the replacement joined", 4, addedAt)
	}

	// The launcher's pod deleted (spec.recovery InProcess): its rendezvous
	// store is gone; the workers train on in their generation, the
	// controller replaces the launcher alone, and the workers reconnect to
	// the new store (under the same name, at another address).
	store := storeLoss(t, ctx, e, o.name, o.torch, logs)

	if o.full {
		// A frozen node: its processes stopped, its connections open.
		pod, node = member()
		frozenAt := time.Now()
		run(e.local, "cluster", "freeze", node)
		frozen = waitTraining("after "+pod+"'s node froze", 3, frozenAt)
		thawedAt := time.Now()
		run(e.local, "cluster", "thaw", node)
		waitTraining("after "+pod+"'s node thawed", 4, thawedAt)

		// A noticed loss: the rank hears it from its node's agent and leaves at
		// a commit, exit 75; the others go on without a rollback.
		pod, node = member()
		noticedAt = time.Now()
		run(e.local, "cluster", "reclaim", node, "--notice", "20s")
		noticed = waitTraining("after "+pod+"'s node was reclaimed with a 20 s notice", 3, noticedAt)
	}

	waitComplete(t, ctx, e, o.name, logs)
	lines := logs()
	// No process restarted: every pod's steps come from one pid.
	pids := map[string]map[int]bool{}
	for _, l := range lines {
		if l.Kind == "step" {
			if pids[l.Pod] == nil {
				pids[l.Pod] = map[int]bool{}
			}
			pids[l.Pod][l.Pid] = true
		}
	}
	for p, set := range pids {
		if len(set) != 1 || set[0] {
			t.Errorf("pod %s logged steps from pids %v; want one process for its whole life", p, set)
		}
	}
	resumes := driver.Resumes(lines)
	if o.full && len(resumes) < 5 {
		t.Errorf("%d resumes; want one for the kill, the join, the freeze, the thaw and the notice at least", len(resumes))
	}
	if len(resumes) < 1 {
		t.Errorf("no resume; want one for the kill at least")
	}
	for i, r := range resumes {
		if r.Lost > 1 {
			t.Errorf("resume %d (from %d after reaching %d, world %d) did %d steps again; want at most 1", i+1, r.From, r.Reached, r.World, r.Lost)
		}
		// the pause: the last step logged before the new generation and the first in it
		before, after := 0.0, 0.0
		for _, l := range lines {
			if l.Kind == "step" && l.T < r.T {
				before = l.T
			}
			if l.Kind == "step" && l.T > r.T && after == 0 {
				after = l.T
			}
		}
		t.Logf("resume %d: from %d after reaching %d, world %d, %d steps again, no step for %.2fs", i+1, r.From, r.Reached, r.World, r.Lost, after-before)
	}
	if ok, detail := driver.LedgerOK(lines); !ok {
		t.Errorf("sampler ledger: %s", detail)
	}
	j := job()
	if j.Status.Failures != 0 {
		t.Errorf("status.failures %d; want 0", j.Status.Failures)
	}
	if j.Status.Restarts != 0 || j.Status.LauncherReplacements != 1 {
		t.Errorf("status.restarts %d, launcherReplacements %d; want 0 and 1 (the deleted launcher replaced alone)", j.Status.Restarts, j.Status.LauncherReplacements)
	}
	acc, steps, _ := driver.Final(lines)
	baseAcc, baseErr := undisturbed()
	if o.full {
		if j.Status.Preemptions < 1 {
			t.Errorf("status.preemptions %d; want the noticed worker's exit 75 counted", j.Status.Preemptions)
		}
		for _, r := range resumes {
			if r.T >= float64(noticedAt.UnixNano())/1e9 && r.Lost != 0 {
				t.Errorf("the noticed loss did %d steps again; want 0", r.Lost)
			}
		}
		switch {
		case baseErr != nil:
			t.Errorf("the undisturbed run: %v", baseErr)
		case math.Abs(acc-baseAcc) > 0.01:
			t.Errorf("final accuracy %.4f is not within 1 point of the undisturbed run's %.4f", acc, baseAcc)
		}
	}
	if o.undisturbedLoss != nil {
		loss, ok := driver.FinalLoss(lines)
		switch {
		case baseErr != nil:
			t.Errorf("%v", baseErr)
		case !ok:
			t.Errorf("the job printed no final loss")
		case math.Abs(loss-baseAcc) > 1e-4:
			t.Errorf("final held-out loss %.6f is not the undisturbed run's %.6f: another model", loss, baseAcc)
		default:
			t.Logf("final held-out loss %.6f, the undisturbed run's %.6f", loss, baseAcc)
		}
	}
	t.Logf("in-process story (%s): hard kill → training again %.2fs after, join %.2fs, store lost %.2fs (%d steps meanwhile, training %.2fs after the new store listened), freeze %.2fs (collective timeout 5 s), notice %.2fs; %d pods, %d resumes, final accuracy %.4f after %d steps (the undisturbed run's accuracy or held-out loss %.4f)",
		o.image, hard.Seconds(), join.Seconds(), store.away.Seconds(), store.during, store.after.Seconds(), frozen.Seconds(), noticed.Seconds(), len(pids), len(resumes), acc, steps, baseAcc)
	run(e.bin, "delete", o.name)
	if o.full && !t.Failed() {
		// several ranks a pod, on this cluster (stories share one where they can)
		podsStory(t, e, o.image, e.sharedDir(t, "ckpt-pods"))
	}
	if o.drain && !t.Failed() {
		// drains and cordons, on this cluster (stories share one where they can)
		drainStory(t, e, e.sharedDir(t, "ckpt-drain"))
	}
}

// storeLost is what storeLoss measured.
type storeLost struct {
	away   time.Duration // from the delete to the new launcher's store listening
	during int           // steps logged meanwhile
	after  time.Duration // from the new store listening to the next step
}

// storeLoss deletes the job's launcher pod and waits until the replacement
// launcher's store listens, on torch (the workers' torch too: a store of
// another torch is refused by their handshake), and the workers train after
// it. The job must not restart (its workers keep their pods) and count no
// failure.
func storeLoss(t *testing.T, ctx context.Context, e *e2eCluster, name, torch string, logs func() []driver.LogLine) storeLost {
	t.Helper()
	cs, err := e.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	launcher := name + "-launcher"
	old, err := cs.CoreV1().Pods("default").Get(ctx, launcher, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	deletedAt := time.Now()
	if err := cs.CoreV1().Pods("default").Delete(ctx, launcher, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var listening time.Time
	waitFor(t, ctx, "the replacement launcher's store listening", 3*time.Minute, func() (bool, string) {
		p, err := cs.CoreV1().Pods("default").Get(ctx, launcher, metav1.GetOptions{})
		if err != nil || p.UID == old.UID {
			return false, fmt.Sprintf("old launcher still there (%v)", err)
		}
		raw, err := cs.CoreV1().Pods("default").GetLogs(launcher, &corev1.PodLogOptions{}).DoRaw(ctx)
		out := string(raw)
		if err != nil || !strings.Contains(out, "listening") {
			return false, fmt.Sprintf("phase %s, no listening line yet", p.Status.Phase)
		}
		if !strings.Contains(out, "(replacement 1)") {
			t.Fatalf("the replacement launcher's store does not say it replaces one: %q", out)
		}
		if !strings.Contains(out, "(torch "+torch+".") {
			t.Fatalf("the replacement launcher's store does not run torch %s (the job's image): %q", torch, out)
		}
		listening = time.Now()
		return true, ""
	})
	var got storeLost
	got.away = listening.Sub(deletedAt)
	waitFor(t, ctx, "a step after the new store", 3*time.Minute, func() (bool, string) {
		got.during = 0
		for _, l := range logs() {
			if l.Kind != "step" {
				continue
			}
			at := time.Unix(0, int64(l.T*1e9))
			if at.After(deletedAt) && at.Before(listening) {
				got.during++
			}
			if at.After(listening) && got.after == 0 {
				got.after = at.Sub(listening)
			}
		}
		return got.after > 0, "no step after the new store listened"
	})
	j := e.job(t, ctx, name)
	if j.Status.Failures != 0 || j.Status.Restarts != 0 {
		t.Fatalf("after the launcher's loss: failures %d, restarts %d; want 0 and 0", j.Status.Failures, j.Status.Restarts)
	}
	t.Logf("launcher deleted: its replacement's store listened %.2fs later, %d steps logged meanwhile, a step %.2fs after it",
		got.away.Seconds(), got.during, got.after.Seconds())
	return got
}
