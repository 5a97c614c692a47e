package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/driver"
	"github.com/etjob/etjob/internal/localcluster"
)

// TestLeaderKilledMidScaleOut (issue #13): the controller runs as the
// chart's two replicas under leader election. The leader is killed (SIGKILL:
// it releases nothing) while `etjob scaleout` grows a training job from 2
// workers to 5: the controller's client is held to 1 request a second, so
// the kill lands after the first new pod and before the last. The standby
// takes the Lease over and finishes the scale-out; no worker pod is created
// twice, no survivor restarts, nothing counts as a failure, and the ScaleOut
// request succeeds.
func TestLeaderKilledMidScaleOut(t *testing.T) {
	ctx := withTimeout(t, 20*time.Minute)
	const target = 5
	e := startClusterWith(t, ctx, "etjob-e2e-leader", target, 1,
		localcluster.LocalImages(repoRoot(t), localcluster.HorovodVenv()), "--kube-api-qps=1", "--kube-api-burst=1")
	const ns, job = "default", "leader"
	d, err := driver.New(e.Cluster, ns, job, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	shared := filepath.Join(e.Dir, "shared")
	if err := d.SubmitDigits(ctx, driver.Digits{Repo: e.repo, Shared: shared, Epochs: 400, Width: 32, Replicas: 2, MaxReplicas: target}); err != nil {
		t.Fatal(err)
	}
	if err := d.WaitFor(ctx, "2 members training", 5*time.Minute, func() (bool, error) {
		j, err := d.Get(ctx)
		return err == nil && j.Status.Members == 2 && d.MaxStep() >= 3, driver.Failed(j)
	}); err != nil {
		t.Fatal(err)
	}
	before := liveWorkerUIDs(t, ctx, d)

	// Who leads, and how to kill each replica, known before the scale-out
	// begins: the kill must land between its first pod and its last, which
	// the leader creates about a second apart, and asking the API server
	// who leads at that moment takes seconds on a loaded machine (a CI run
	// killed the leader only after it had created every pod).
	killers, err := e.ControllerKillers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	leases, err := d.Clientset.CoordinationV1().Leases(localcluster.ControllerNamespace).Watch(ctx, metav1.ListOptions{
		FieldSelector: "metadata.name=" + localcluster.LeaseName})
	if err != nil {
		t.Fatal(err)
	}
	defer leases.Stop()
	var mu sync.Mutex
	holder := ""
	go func() {
		for ev := range leases.ResultChan() {
			if l, ok := ev.Object.(*coordinationv1.Lease); ok {
				mu.Lock()
				holder = localcluster.LeaseHolder(l, time.Now())
				mu.Unlock()
			}
		}
	}()
	if err := d.WaitFor(ctx, "the Lease's holder", time.Minute, func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return killers[holder] != nil, nil
	}); err != nil {
		t.Fatal(err)
	}

	// Every worker pod the scale-out creates, by name, from the moment it
	// starts; the leader is killed on the first new one, in this watch.
	w, err := d.Clientset.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{
		LabelSelector: etjobv1.LabelJobName + "=" + job + "," + etjobv1.LabelRole + "=" + etjobv1.RoleWorker})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	type kill struct {
		name    string
		created int
		at      time.Time
		err     error
	}
	killed := make(chan kill, 1)
	created := map[string]map[types.UID]bool{}
	go func() {
		done := false
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type != watch.Added {
				continue
			}
			mu.Lock()
			if created[pod.Name] == nil {
				created[pod.Name] = map[types.UID]bool{}
			}
			created[pod.Name][pod.UID] = true
			n, name := len(created), holder
			mu.Unlock()
			if !done && n > len(before) {
				done = true
				err := fmt.Errorf("no controller replica held the Lease when the scale-out began (last holder %q)", name)
				if f := killers[name]; f != nil {
					err = f()
				}
				killed <- kill{name: name, created: n, at: time.Now(), err: err}
			}
		}
	}()

	scale := exec.CommandContext(ctx, e.bin, "scaleout", "etjob", "--name="+job, "--count=3", "--timeout=8m")
	scale.Env = append(os.Environ(), "KUBECONFIG="+e.Kubeconfig())
	scaled := make(chan error, 1)
	var scaleOut []byte
	go func() {
		out, err := scale.CombinedOutput()
		scaleOut = out
		scaled <- err
	}()
	var k kill
	select {
	case k = <-killed:
	case <-time.After(2 * time.Minute):
		t.Fatal("the scale-out created no pod within 2 minutes")
	}
	if k.err != nil {
		t.Fatal(k.err)
	}
	old := k.name
	t.Logf("killed the leading controller %s with %d of %d worker pods created", old, k.created, target)
	if k.created >= target {
		t.Errorf("the leader was killed after it created every pod (%d): not in the middle of the scale-out", k.created)
	}
	next, err := e.WaitLeader(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s took the Lease over after %.1fs", next, time.Since(k.at).Seconds())
	// The replica killed was the one leading: nobody took the Lease between
	// the moment the watch last saw it and the kill.
	lease, err := d.Clientset.CoordinationV1().Leases(localcluster.ControllerNamespace).Get(ctx, localcluster.LeaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a := lease.Spec.AcquireTime; a == nil || a.Time.Before(k.at) {
		t.Fatalf("%s acquired the Lease at %v, before the kill of %s at %v: the replica killed was not leading", next, a, old, k.at)
	}

	select {
	case err := <-scaled:
		if err != nil {
			t.Fatalf("etjob scaleout: %v\n%s", err, scaleOut)
		}
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	t.Logf("etjob scaleout:\n%s", scaleOut)
	if err := d.WaitFor(ctx, "every worker a member", 4*time.Minute, func() (bool, error) {
		j, err := d.Get(ctx)
		return err == nil && j.Status.Members == target, driver.Failed(j)
	}); err != nil {
		t.Fatal(err)
	}
	step := d.MaxStep()
	if err := d.WaitFor(ctx, "training to go on at the new size", 3*time.Minute, func() (bool, error) {
		return d.MaxStep() >= step+3, nil
	}); err != nil {
		t.Fatal(err)
	}

	mu.Lock()
	var names []string
	for name, uids := range created {
		names = append(names, name)
		if len(uids) != 1 {
			t.Errorf("worker pod %s was created %d times", name, len(uids))
		}
	}
	mu.Unlock()
	sort.Strings(names)
	if len(names) != target {
		t.Errorf("worker pods created: %v, want the 2 survivors and %d new ones", names, target-2)
	}
	after := liveWorkerUIDs(t, ctx, d)
	for name, uid := range before {
		if after[name] != uid {
			t.Errorf("survivor %s was replaced or lost (uid %s, now %q)", name, uid, after[name])
		}
	}
	j, err := d.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if j.Status.Failures != 0 || j.Status.Restarts != 0 || j.Status.NextWorkerIndex != target {
		t.Errorf("failures %d, restarts %d, next worker index %d; want 0, 0, %d", j.Status.Failures, j.Status.Restarts, j.Status.NextWorkerIndex, target)
	}
	var outs etjobv1.ScaleOutList
	if err := d.Client.List(ctx, &outs); err != nil {
		t.Fatal(err)
	}
	if len(outs.Items) != 1 || outs.Items[0].Status.Phase != etjobv1.ScaleRequestSucceeded {
		t.Errorf("ScaleOuts: %+v, want one Succeeded", outs.Items)
	}
	// The killed replica's container came back (its node's back-off) and stands by.
	if err := d.WaitFor(ctx, "the killed replica to run again", 2*time.Minute, func() (bool, error) {
		p, err := d.Clientset.CoreV1().Pods(localcluster.ControllerNamespace).Get(ctx, old, metav1.GetOptions{})
		return err == nil && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount >= 1 &&
			p.Status.ContainerStatuses[0].State.Running != nil, nil
	}); err != nil {
		t.Error(err)
	}
}

// liveWorkerUIDs maps the job's worker pods that are not being deleted to their UIDs.
func liveWorkerUIDs(t *testing.T, ctx context.Context, d *driver.Driver) map[string]types.UID {
	t.Helper()
	pods, err := d.Clientset.CoreV1().Pods(d.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: etjobv1.LabelJobName + "=" + d.Job + "," + etjobv1.LabelRole + "=" + etjobv1.RoleWorker})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]types.UID{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			out[p.Name] = p.UID
		}
	}
	return out
}
