package e2e

// The stories' helpers for a job and its pods on the local cluster.

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/driver"
	"github.com/etjob/etjob/internal/testutil"
)

// --- the job and its pods ----------------------------------------------------

// waitFor waits until ok holds, asking every 500 ms (ok asks the API server
// and reads logs), and fails the test after timeout or once ctx is done, with
// ok's last word.
func waitFor(t *testing.T, ctx context.Context, what string, timeout time.Duration, ok func() (bool, string)) {
	t.Helper()
	testutil.EventuallyEvery(t, 500*time.Millisecond, timeout, what, func() (bool, string) {
		if err := ctx.Err(); err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		return ok()
	})
}

func getJob(t *testing.T, ctx context.Context, e *e2eCluster, name string) *etjobv1.ElasticJob {
	t.Helper()
	j := &etjobv1.ElasticJob{}
	if err := e.client(t).Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, j); err != nil {
		t.Fatal(err)
	}
	return j
}

// waitProgressing waits until ok holds, like waitFor, but bounds the silence
// rather than the wait: it fails once progress (a count of step lines) has
// not grown for stall, or once ctx is done. A whole run's length depends on
// the machine (a loaded CI machine trained a story at half its usual pace,
// past a fixed 5-minute limit, while every rank made steps); a stuck job
// stops counting at once.
func waitProgressing(t *testing.T, ctx context.Context, what string, stall time.Duration, progress func() int, ok func() (bool, string)) {
	t.Helper()
	last, lastAt := progress(), time.Now()
	for {
		if err := ctx.Err(); err != nil {
			_, word := ok()
			t.Fatalf("waiting for %s: %v; last: %s", what, err, word)
		}
		done, word := ok()
		if done {
			return
		}
		if p := progress(); p != last {
			last, lastAt = p, time.Now()
		} else if time.Since(lastAt) > stall {
			t.Fatalf("waiting for %s: no new step for %s (%d step lines); last: %s", what, stall, last, word)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// waitFinished waits until the job is Complete or Failed while its
// launchers' logs show new steps at least every stall.
func waitFinished(t *testing.T, ctx context.Context, e *e2eCluster, name string, stall time.Duration, logs *launcherLogs) *etjobv1.ElasticJob {
	t.Helper()
	var j *etjobv1.ElasticJob
	waitProgressing(t, ctx, name+" finished", stall, logs.steps, func() (bool, string) {
		j = getJob(t, ctx, e, name)
		return meta.IsStatusConditionTrue(j.Status.Conditions, etjobv1.ConditionComplete) ||
			meta.IsStatusConditionTrue(j.Status.Conditions, etjobv1.ConditionFailed), fmt.Sprintf("%+v\n%s", j.Status.Conditions, tail(logs.text(), 20))
	})
	return j
}

func waitCondition(t *testing.T, ctx context.Context, e *e2eCluster, name, cond, reason string, timeout time.Duration, logs *launcherLogs) {
	t.Helper()
	waitFor(t, ctx, fmt.Sprintf("%s %s=%s", name, cond, reason), timeout, func() (bool, string) {
		j := getJob(t, ctx, e, name)
		c := meta.FindStatusCondition(j.Status.Conditions, cond)
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == reason, fmt.Sprintf("%+v\n%s", j.Status.Conditions, tail(logs.text(), 20))
	})
}

func podUID(t *testing.T, ctx context.Context, e *e2eCluster, name string) types.UID {
	t.Helper()
	p := &corev1.Pod{}
	if err := e.client(t).Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, p); err != nil {
		t.Fatal(err)
	}
	return p.UID
}

// workerNode returns the node of a pod and that node's IP (its agent's).
func workerNode(t *testing.T, ctx context.Context, e *e2eCluster, pod string) (string, string) {
	t.Helper()
	c := e.client(t)
	p := &corev1.Pod{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: pod}, p); err != nil {
		t.Fatal(err)
	}
	return p.Spec.NodeName, p.Status.HostIP
}

func launcherNodeIP(t *testing.T, ctx context.Context, e *e2eCluster, job string) string {
	t.Helper()
	_, ip := workerNode(t, ctx, e, job+"-launcher")
	return ip
}

// liveWorkers lists the job's worker pods that run and are not deleted.
func liveWorkers(t *testing.T, ctx context.Context, e *e2eCluster, job string) []string {
	t.Helper()
	var pods corev1.PodList
	if err := e.client(t).List(ctx, &pods, client.InNamespace("default"), client.MatchingLabels{etjobv1.LabelJobName: job, etjobv1.LabelRole: etjobv1.RoleWorker}); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			out = append(out, p.Name)
		}
	}
	slices.Sort(out)
	return out
}

// survivingWorker is a running worker of the job on another node than
// except.
func survivingWorker(t *testing.T, ctx context.Context, e *e2eCluster, job, except string) string {
	t.Helper()
	for _, w := range liveWorkers(t, ctx, e, job) {
		if n, _ := workerNode(t, ctx, e, w); n != except {
			return w
		}
	}
	t.Fatalf("no running worker of %s off node %s", job, except)
	return ""
}

func reclaimAsync(t *testing.T, ctx context.Context, e *e2eCluster, node string, notice time.Duration) {
	t.Helper()
	go func() {
		if err := e.Reclaim(ctx, node, notice); err != nil && ctx.Err() == nil {
			t.Errorf("reclaim %s: %v", node, err)
		}
	}()
}

// jobLogs reads the worker logs of job name in namespace default of the
// cluster under dir (driver.ReadLogs), failing the test on an error.
func jobLogs(t *testing.T, dir, name string) func() []driver.LogLine {
	return func() []driver.LogLine {
		t.Helper()
		lines, err := driver.ReadLogs(dir, "default", name)
		if err != nil {
			t.Fatal(err)
		}
		return lines
	}
}

// waitWorld waits for a step at world size world logged after at and
// returns how long after at the first came (0 for a zero at).
func waitWorld(t *testing.T, ctx context.Context, logs func() []driver.LogLine, what string, world int, at time.Time) time.Duration {
	t.Helper()
	var first float64
	waitFor(t, ctx, what, 3*time.Minute, func() (bool, string) {
		last := "no step yet"
		for _, l := range logs() {
			if l.Kind == "step" && l.T >= float64(at.UnixNano())/1e9 {
				if l.World == world {
					first = l.T
					return true, ""
				}
				last = fmt.Sprintf("last step %d at world %d", l.Step, l.World)
			}
		}
		return false, last
	})
	if at.IsZero() {
		t.Logf("%s: training with %d ranks", what, world)
		return 0
	}
	d := time.Duration((first - float64(at.UnixNano())/1e9) * float64(time.Second))
	t.Logf("%s: training with %d ranks %.2fs after", what, world, d.Seconds())
	return d
}

// countSteps counts the step lines among lines (a story's progress).
func countSteps(lines []driver.LogLine) int {
	n := 0
	for _, l := range lines {
		if l.Kind == "step" {
			n++
		}
	}
	return n
}

// waitComplete waits, while the job's logs show new steps, for job name to
// be Complete, and fails the test at once when it failed.
func waitComplete(t *testing.T, ctx context.Context, e *e2eCluster, name string, logs func() []driver.LogLine) {
	t.Helper()
	stepLines := func() int { return countSteps(logs()) }
	waitProgressing(t, ctx, "job "+name+" Complete", 2*time.Minute, stepLines, func() (bool, string) {
		j := e.job(t, ctx, name)
		if c := meta.FindStatusCondition(j.Status.Conditions, etjobv1.ConditionFailed); c != nil && c.Status == "True" {
			t.Fatalf("the job failed: %s", c.Message)
		}
		c := meta.FindStatusCondition(j.Status.Conditions, etjobv1.ConditionComplete)
		return c != nil && c.Status == "True", fmt.Sprintf("members %d, ranks %d", j.Status.Members, j.Status.Ranks)
	})
}
