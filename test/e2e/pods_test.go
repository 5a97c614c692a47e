package e2e

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/etjob/etjob/internal/demo"
	"github.com/etjob/etjob/internal/driver"
)

// podsStory is issue #43's story of several ranks a pod, on the in-process
// story's cluster once its own job is gone: 2 worker pods of 2 ranks each
// (--nproc-per-node=2, the digits example's train_elastic.py under
// `python3 -m etjob.launch`), world 4, min 1 pod.
//   - One local rank SIGKILLed (its process alone, the pod and node stay):
//     its launcher kills the pod's other rank and the pod fails; the other
//     pod trains on at world 2 in its own processes;
//   - the controller's replacement pod brings the job back to world 4;
//   - the job runs to its end.
//
// Checked: the final accuracy within 1 point of an undisturbed run of the
// same script (2 local processes); a pod's ranks are adjacent at world 4 (ranks 2p and 2p+1); the
// surviving pod's two ranks kept their processes for the whole run; at most
// one step done again at each resume; the sampler ledger exact; the job
// Complete; `etjob get` and the status count the pods and the ranks apart.
func podsStory(t *testing.T, e *e2eCluster, image, ckpt string) {
	ctx := withTimeout(t, 8*time.Minute)
	const name = "pods"
	// 100 epochs (2,200 steps): at 60 the job reached its last step at
	// world 2 before the replacement pod joined
	const epochs = 100
	run := func(bin string, args ...string) string {
		t.Helper()
		return e.run(t, ctx, bin, args...)
	}
	logs := jobLogs(t, e.Dir, name)
	worldAfter := func(what string, world int, at time.Time) time.Duration {
		t.Helper()
		return waitWorld(t, ctx, logs, "pods story: "+what, world, at)
	}

	run(e.bin, "submit", "etjob", "--name="+name, "--workers=2", "--min-workers=1", "--max-workers=2", "--gpus=1",
		"--nproc-per-node=2", "--spot-instance", "--image="+image, "--data-dir", e.repo+":/opt/etjob", "--data-dir", ckpt+":/ckpt",
		"--checkpoint-dir=/ckpt", "--recovery=InProcess", "-e", "PYTHONPATH=/opt/etjob/python", "-e", "EPOCHS="+strconv.Itoa(epochs), "-e", "CHECKPOINT_EVERY=200",
		"-e", "ETJOB_COLLECTIVE_TIMEOUT=5", "python3 -m etjob.launch /opt/etjob/examples/digits/train_elastic.py")
	began := time.Now()
	worldAfter("the job started", 4, began)

	// Each pod's ranks at world 4, and their processes.
	ranks := map[string]map[int]bool{}
	pids := map[string]map[int]bool{}
	for _, l := range logs() {
		if l.Kind == "step" && l.World == 4 {
			if ranks[l.Pod] == nil {
				ranks[l.Pod], pids[l.Pod] = map[int]bool{}, map[int]bool{}
			}
			ranks[l.Pod][l.Rank], pids[l.Pod][l.Pid] = true, true
		}
	}
	if len(ranks) != 2 {
		t.Fatalf("pods at world 4: %v; want 2 pods of 2 ranks", ranks)
	}
	pods := make([]string, 0, 2)
	for p, rs := range ranks {
		pods = append(pods, p)
		var got []int
		for r := range rs {
			got = append(got, r)
		}
		sort.Ints(got)
		if len(got) != 2 || got[0]/2 != got[1]/2 || len(pids[p]) != 2 {
			t.Fatalf("pod %s holds ranks %v (pids %v) at world 4; want two adjacent ranks of two processes", p, got, pids[p])
		}
	}
	sort.Strings(pods)
	survivor, victimPod := pods[0], pods[1]
	victim := 0
	for pid := range pids[victimPod] {
		victim = max(victim, pid)
	}

	// One local rank killed (its process alone, by its PID in the pod's
	// namespace, which the logs name): its pod goes whole, the other trains on.
	killedAt := time.Now()
	if _, err := e.KillPodProcess("default", victimPod, victim, syscall.SIGKILL); err != nil {
		t.Fatalf("kill %s's rank (pid %d): %v", victimPod, victim, err)
	}
	alone := worldAfter(fmt.Sprintf("after %s's rank (pid %d) was killed", victimPod, victim), 2, killedAt)
	for _, l := range logs() {
		if l.Kind == "step" && l.Pod == victimPod && l.T > float64(killedAt.UnixNano())/1e9+1 {
			t.Errorf("%s logged step %d (pid %d) after its rank was killed; want the pod's ranks gone together", victimPod, l.Step, l.Pid)
			break
		}
	}
	back := worldAfter("after the replacement pod joined", 4, killedAt.Add(alone))
	// The model against an undisturbed run of the same script (2 local
	// processes, no cluster), begun once the faults are over: a fault may
	// cost time, never a different model.
	undisturbed := demo.Beside(ctx, func(ctx context.Context) (float64, error) {
		return demo.UndisturbedElastic(ctx, e.repo, epochs, 2)
	})

	waitComplete(t, ctx, e, name, logs)
	lines := logs()
	seen := map[int]bool{}
	for _, l := range lines {
		if l.Kind == "step" && l.Pod == survivor {
			seen[l.Pid] = true
		}
	}
	if len(seen) != 2 || !sameSet(seen, pids[survivor]) {
		t.Errorf("%s's steps came from pids %v; want its two ranks' processes %v for the whole run (no survivor restarted)", survivor, seen, pids[survivor])
	}
	for i, r := range driver.Resumes(lines) {
		if r.Lost > 1 {
			t.Errorf("resume %d (from %d after reaching %d, world %d) did %d steps again; want at most 1", i+1, r.From, r.Reached, r.World, r.Lost)
		}
	}
	if ok, detail := driver.LedgerOK(lines); !ok {
		t.Errorf("sampler ledger: %s", detail)
	}
	j := e.job(t, ctx, name)
	if j.Status.SlotsPerWorker != 2 {
		t.Errorf("status.slotsPerWorker %d; want 2", j.Status.SlotsPerWorker)
	}
	if j.Status.Restarts != 0 {
		t.Errorf("status.restarts %d; want 0: the job never restarted", j.Status.Restarts)
	}
	got := run(e.bin, "get", name)
	if !strings.Contains(got, "ranks (2 a worker)") {
		t.Errorf("etjob get does not count the ranks apart from the pods:\n%s", got)
	}
	acc, steps, _ := driver.Final(lines)
	switch base, err := undisturbed(); {
	case err != nil:
		t.Errorf("the undisturbed run: %v", err)
	case math.Abs(acc-base) > 0.01:
		t.Errorf("final accuracy %.4f is not within 1 point of the undisturbed run's %.4f", acc, base)
	}
	t.Logf("pods story: 2 pods x 2 ranks; a local rank killed → the other pod training at world 2 %.2fs after, the replacement back at 4 %.2fs after that; final accuracy %.4f after %d steps",
		alone.Seconds(), back.Seconds(), acc, steps)
	run(e.bin, "delete", name)
}

func sameSet(a, b map[int]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}
