package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/driver"
	"github.com/etjob/etjob/internal/testutil"
)

// TestGrowthStory is issue #14's growth and price story on the local
// cluster, with real torchrun training:
//   - a job of replicas 2 / max 4 (spec.growth.policy Opportunistic) grows to
//     4 when two spot nodes appear;
//   - another workload's pods take that capacity: the scheduler preempts the
//     extra workers (the chart's etjob-opportunistic PriorityClass), which
//     leave at an agreed step; the base workers keep running;
//   - the job grows back once the capacity is free;
//   - a node's price rises above spec.spot.maxPricePerHour: its worker leaves
//     at an agreed step and nothing lands on that node again;
//   - a base worker's node gets dearer: its replacement preempts the last
//     extra worker, two membership changes at once;
//   - minReplicas is 1 (a newcomer must not complete a round alone);
//   - no resume loses a committed step, and nothing counts as a failure.
func TestGrowthStory(t *testing.T) {
	ctx := withTimeout(t, 12*time.Minute)
	e := startCluster(t, ctx, "etjob-e2e-growth", 2, 1)
	cl, repo, dir := e.Cluster, e.repo, e.Dir
	ckpt := e.sharedDir(t, "ckpt")
	cs, err := cl.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	run := func(bin string, args ...string) string {
		t.Helper()
		return e.run(t, ctx, bin, args...)
	}
	job := func() *etjobv1.ElasticJob {
		t.Helper()
		return e.job(t, ctx, "grow")
	}
	waitJob := func(what string, timeout time.Duration, ok func(*etjobv1.ElasticJob) bool) *etjobv1.ElasticJob {
		t.Helper()
		start := time.Now()
		var j *etjobv1.ElasticJob
		testutil.EventuallyEvery(t, time.Second, timeout, what, func() (bool, string) {
			j = job()
			return ok(j), fmt.Sprintf("%+v", j.Status)
		})
		t.Logf("%s after %.1fs", what, time.Since(start).Seconds())
		return j
	}
	// members are the job's members by pod name, with their nodes.
	members := func(j *etjobv1.ElasticJob) map[string]string {
		out := map[string]string{}
		for _, w := range j.Status.Workers {
			if w.State == etjobv1.WorkerMember {
				out[w.Name] = w.Node
			}
		}
		return out
	}
	// waitTraining waits for training steps at world size world after at:
	// the membership is real only once torchrun trains with it.
	waitTraining := func(world int, after time.Time) {
		t.Helper()
		start := time.Now()
		waitFor(t, ctx, fmt.Sprintf("training steps with %d ranks", world), 4*time.Minute, func() (bool, string) {
			lines, err := driver.ReadLogs(dir, "default", "grow")
			if err != nil {
				return false, err.Error()
			}
			last := "no step yet"
			for _, l := range lines {
				if l.Kind == "step" && l.T >= float64(after.UnixNano())/1e9 {
					if l.World == world {
						return true, ""
					}
					last = fmt.Sprintf("last step %d at world %d", l.Step, l.World)
				}
			}
			return false, last
		})
		t.Logf("training with %d ranks %.1fs later", world, time.Since(start).Seconds())
	}
	uid := func(pod string) types.UID {
		t.Helper()
		p, err := cs.CoreV1().Pods("default").Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("pod %s: %v", pod, err)
		}
		return p.UID
	}

	run(e.bin, "submit", "etjob", "--name=grow", "--workers=2", "--min-workers=1", "--max-workers=4", "--gpus=1",
		"--spot-instance", "--growth=Opportunistic", "--growth-probe-timeout=15s", "--growth-backoff=5s", "--max-price=1.0",
		"--image=etjob/digits:local", "--data-dir", repo+":/opt/etjob", "--data-dir", ckpt+":/ckpt",
		"--checkpoint-dir=/ckpt", "-e", "PATH=/usr/bin:/bin", "-e", "PYTHONPATH=/opt/etjob/python", "-e", "EPOCHS=400", "-e", "WIDTH=64",
		"python3 -m etjob.torchrun /opt/etjob/examples/digits/train.py")
	j := waitJob("2 members on the 2 spot nodes", testutil.LongTimeout, func(j *etjobv1.ElasticJob) bool { return j.Status.Members == 2 })
	waitTraining(2, time.Time{})
	base := members(j)
	baseUIDs := map[string]types.UID{}
	for pod := range base {
		baseUIDs[pod] = uid(pod)
	}

	// Two spot nodes appear: the job grows to maxReplicas with extra workers.
	addedAt := time.Now()
	run(e.local, "cluster", "add-node", "--spot")
	run(e.local, "cluster", "add-node", "--spot")
	j = waitJob("4 members, 2 of them extra", 3*time.Minute, func(j *etjobv1.ElasticJob) bool {
		return j.Status.Members == 4 && j.Status.Growth != nil && j.Status.Growth.ExtraWorkers == 2
	})
	waitTraining(4, addedAt)
	var extras []string
	for pod := range members(j) {
		if _, ok := base[pod]; !ok {
			extras = append(extras, pod)
		}
	}
	for _, pod := range extras {
		p, err := cs.CoreV1().Pods("default").Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Labels[etjobv1.LabelExtra] != "true" || p.Spec.PriorityClassName != etjobv1.DefaultGrowthPriorityClass || p.Spec.Priority == nil || *p.Spec.Priority >= 0 {
			t.Errorf("extra worker %s: label %q, priorityClassName %q, priority %v; want etjob.dev/extra and the chart's etjob-opportunistic below 0",
				pod, p.Labels[etjobv1.LabelExtra], p.Spec.PriorityClassName, p.Spec.Priority)
		}
	}

	// Another workload needs two GPUs: the scheduler preempts the extra
	// workers, not the base ones, and the job lets them go at an agreed step.
	other := func(i int) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("other-%d", i), Namespace: "default"},
			Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Tolerations:   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
				Containers: []corev1.Container{{Name: "main", Image: "etjob/digits:local", Command: []string{"sleep", "600"},
					Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{etjobv1.ResourceGPU: resource.MustParse("1")}}}},
			},
		}
	}
	takenAt := time.Now()
	for i := range 2 {
		if _, err := cs.CoreV1().Pods("default").Create(ctx, other(i), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, ctx, "the other workload's pods scheduled", 3*time.Minute, func() (bool, string) {
		n := 0
		for i := range 2 {
			p, err := cs.CoreV1().Pods("default").Get(ctx, fmt.Sprintf("other-%d", i), metav1.GetOptions{})
			if err == nil && p.Spec.NodeName != "" {
				n++
			}
		}
		return n == 2, fmt.Sprintf("%d of 2 scheduled", n)
	})
	j = waitJob("2 members again, the base ones", 2*time.Minute, func(j *etjobv1.ElasticJob) bool { return j.Status.Members == 2 })
	t.Logf("the extra workers gave the capacity back %.1fs after the other workload asked for it", time.Since(takenAt).Seconds())
	waitTraining(2, takenAt)
	for pod, node := range members(j) {
		if base[pod] != node || uid(pod) != baseUIDs[pod] {
			t.Errorf("member %s on %s: want the base workers %v, never replaced", pod, node, base)
		}
	}
	if j.Status.Failures != 0 {
		t.Errorf("failures %d: giving capacity back is no failure", j.Status.Failures)
	}

	// The other workload ends: the job grows back to 4.
	for i := range 2 {
		if err := cs.CoreV1().Pods("default").Delete(ctx, fmt.Sprintf("other-%d", i), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	endedAt := time.Now()
	j = waitJob("4 members after the other workload ended", 4*time.Minute, func(j *etjobv1.ElasticJob) bool { return j.Status.Members == 4 })
	waitTraining(4, endedAt)

	// An extra worker's node gets dearer than --max-price: the worker leaves
	// at an agreed step, and no new worker lands on that node.
	var pricey, leaver string
	for pod, node := range members(j) {
		p, err := cs.CoreV1().Pods("default").Get(ctx, pod, metav1.GetOptions{})
		if err == nil && p.Labels[etjobv1.LabelExtra] == "true" && (leaver == "" || pod < leaver) {
			leaver, pricey = pod, node
		}
	}
	if leaver == "" {
		t.Fatalf("no extra worker among the members %v", members(j))
	}
	pricedAt := time.Now()
	run(e.local, "cluster", "price", pricey, "1.5")
	j = waitJob("the worker on the dearer node gone", 3*time.Minute, func(j *etjobv1.ElasticJob) bool {
		m := members(j)
		if _, still := m[leaver]; still || len(m) != 3 {
			return false
		}
		for _, node := range m {
			if node == pricey {
				return false
			}
		}
		return true
	})
	waitTraining(3, pricedAt)
	// No free node is left but the dear one: the next probe waits, and is
	// given up, instead of landing there.
	j = waitJob("a probe given up after the price rise", 2*time.Minute, func(j *etjobv1.ElasticJob) bool {
		return slices.ContainsFunc(j.Status.Timeline, func(ev etjobv1.TimelineEvent) bool {
			return !ev.Time.Time.Before(pricedAt.Truncate(time.Second)) && strings.Contains(ev.Message, "given up")
		})
	})
	var priceLeaves []string
	for _, ev := range j.Status.Timeline {
		if strings.Contains(ev.Message, "leaves: node "+pricey+" costs 1.5 an hour") {
			priceLeaves = append(priceLeaves, ev.Message)
		}
	}
	if len(priceLeaves) != 1 || !strings.HasPrefix(priceLeaves[0], leaver+" ") {
		t.Errorf("price leaves %q: want %s's alone (no new worker may land on %s)", priceLeaves, leaver, pricey)
	}

	// A base worker's node gets dearer too: the worker leaves at an agreed
	// step, and its replacement, with no free node left, makes the scheduler
	// preempt the extra worker: two membership changes at once, in which the
	// torchrun rounds once deadlocked (issue #25). The job trains on with
	// the remaining base worker and the replacement.
	var pricier, baseLeaver, extraLeft string
	for pod, node := range members(j) {
		if _, ok := base[pod]; ok && (baseLeaver == "" || pod < baseLeaver) {
			baseLeaver, pricier = pod, node
		} else if !ok {
			extraLeft = pod
		}
	}
	if baseLeaver == "" || extraLeft == "" {
		t.Fatalf("want a base and an extra worker among the members %v", members(j))
	}
	repricedAt := time.Now()
	run(e.local, "cluster", "price", pricier, "1.5")
	j = waitJob("the base worker on the dearer node replaced, the extra worker preempted for it", 4*time.Minute, func(j *etjobv1.ElasticJob) bool {
		m := members(j)
		_, stillBase := m[baseLeaver]
		_, stillExtra := m[extraLeft]
		if stillBase || stillExtra || len(m) != 2 {
			return false
		}
		for _, node := range m {
			if node == pricier || node == pricey {
				return false
			}
		}
		return true
	})
	waitTraining(2, repricedAt)
	if !slices.ContainsFunc(j.Status.Timeline, func(ev etjobv1.TimelineEvent) bool {
		return strings.Contains(ev.Message, baseLeaver+" leaves: node "+pricier+" costs 1.5 an hour")
	}) {
		t.Errorf("the timeline does not say why %s left: %+v", baseLeaver, j.Status.Timeline)
	}

	pods, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: etjobv1.LabelJobName + "=grow"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if (p.Spec.NodeName == pricey || p.Spec.NodeName == pricier) && p.DeletionTimestamp == nil &&
			p.Status.Phase != corev1.PodFailed && p.Status.Phase != corev1.PodSucceeded {
			t.Errorf("pod %s runs on %s, priced above --max-price", p.Name, p.Spec.NodeName)
		}
	}
	if j.Status.Failures != 0 {
		t.Errorf("failures %d, want 0", j.Status.Failures)
	}

	lines, err := driver.ReadLogs(dir, "default", "grow")
	if err != nil {
		t.Fatal(err)
	}
	resumes := driver.Resumes(lines)
	if len(resumes) < 5 {
		t.Errorf("%d resumes; want one for each of the 5 membership changes at least", len(resumes))
	}
	for i, r := range resumes {
		// The scheduler's preemption of the extra workers deletes them at
		// once (their SIGTERM comes with the DisruptionTarget notice): their
		// workers stop at an agreed step all the same, like any leave.
		after := ""
		if r.T >= float64(takenAt.UnixNano())/1e9 && r.T < float64(endedAt.UnixNano())/1e9 {
			after = ", after the scheduler preempted the extra workers"
		}
		if r.Lost != 0 {
			t.Errorf("resume %d%s (from %d after reaching %d, world %d) lost %d committed steps", i+1, after, r.From, r.Reached, r.World, r.Lost)
		}
	}
	t.Logf("%d resumes; status.growth %+v", len(resumes), j.Status.Growth)
	run(e.bin, "delete", "grow")
}
