package controller

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/scheme"
	. "github.com/etjob/etjob/internal/testutil"
)

// The Reconcile tests run the reconciler on controller-runtime's fake client
// (a fake API server: no admission, no kubelet) with API errors injected
// through interceptor.Funcs, for what no real API server does on demand.

var reconcileT0 = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

// lostWorkerJob is a running torchrun job of 2 workers, one of them on a
// node that is gone: the next pass counts a preemption and deletes it.
func lostWorkerJob() (*etjobv1.ElasticJob, []client.Object) {
	job := MakeElasticJob("j", "ns").Replicas(2).Min(1).Max(3).Status(etjobv1.ElasticJobStatus{
		StartTime: &metav1.Time{Time: reconcileT0.Add(-time.Hour)}, NextWorkerIndex: 2,
		Membership: etjobv1.MembershipStatus{Generation: 1, Hosts: []string{"j-worker-0:1", "j-worker-1:1"}},
	}).Obj()
	owned := func(p *corev1.Pod) *corev1.Pod {
		t := true
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: etjobv1.GroupVersion.String(), Kind: "ElasticJob", Name: job.Name, UID: job.UID, Controller: &t}}
		return p
	}
	objs := []client.Object{
		job,
		owned(MakeLauncher(job).Ready("od").Obj()),
		owned(MakeWorker(job, 0).Ready("n0").Obj()),
		owned(MakeWorker(job, 1).Ready("gone").Obj()),
		MakeNode("od").Obj(), MakeNode("n0").Obj(),
	}
	return job, objs
}

// newReconcileTest builds the reconciler on a fake client holding objs, with
// the indexes the manager registers.
func newReconcileTest(t *testing.T, funcs interceptor.Funcs, objs ...client.Object) (*ElasticJobReconciler, client.Client) {
	t.Helper()
	c := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(objs...).
		WithStatusSubresource(&etjobv1.ElasticJob{}).
		WithIndex(&corev1.Pod{}, OwnerUIDIndex, func(o client.Object) []string {
			if ref := metav1.GetControllerOf(o); ref != nil {
				return []string{string(ref.UID)}
			}
			return nil
		}).
		WithIndex(&corev1.Event{}, EventPodIndex, func(o client.Object) []string {
			return []string{o.(*corev1.Event).InvolvedObject.Name}
		}).
		WithInterceptorFuncs(funcs).Build()
	r := NewElasticJobReconciler(c, events.NewFakeRecorder(100), clocktesting.NewFakePassiveClock(reconcileT0))
	r.APIReader = c
	return r, c
}

func reconcileJob(r *ElasticJobReconciler) error {
	_, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "j"}})
	return err
}

func getTestJob(t *testing.T, c client.Client) *etjobv1.ElasticJob {
	t.Helper()
	job := &etjobv1.ElasticJob{}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: "j"}, job); err != nil {
		t.Fatal(err)
	}
	return job
}

// TestReconcileDeleteErrorsCountOnce: while the API server refuses to delete
// a preempted worker, every pass sees it again; its preemption is counted
// once, when the deletion is made (it was counted on every failed pass).
func TestReconcileDeleteErrorsCountOnce(t *testing.T) {
	_, objs := lostWorkerJob()
	var refusals atomic.Int32
	refusals.Store(3)
	r, c := newReconcileTest(t, interceptor.Funcs{
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			if obj.GetName() == "j-worker-1" && refusals.Add(-1) >= 0 {
				return apierrors.NewServiceUnavailable("etcd is slow")
			}
			return c.Delete(ctx, obj, opts...)
		},
	}, objs...)
	for range 3 {
		if err := reconcileJob(r); err == nil {
			t.Fatal("a pass whose delete failed returned no error")
		}
		if got := getTestJob(t, c).Status.Preemptions; got != 0 {
			t.Fatalf("preemptions %d while the preempted worker is not deleted yet, want 0 (it is counted when it goes)", got)
		}
	}
	if err := reconcileJob(r); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		_ = reconcileJob(r)
	}
	job := getTestJob(t, c)
	if job.Status.Preemptions != 1 || job.Status.Failures != 0 {
		t.Errorf("preemptions/failures %d/%d after the deletion went through, want 1/0", job.Status.Preemptions, job.Status.Failures)
	}
	err := c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: "j-worker-1"}, &corev1.Pod{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("the preempted worker is still there: %v", err)
	}
}

// TestReconcileStatusConflictLosesNothing: a status write that conflicts
// with a spec write made meanwhile (an HPA, kubectl scale) after the pass
// deleted a preempted worker still records its preemption: the worker is
// gone, and no later pass could count it.
func TestReconcileStatusConflictLosesNothing(t *testing.T) {
	_, objs := lostWorkerJob()
	var conflicts atomic.Int32
	conflicts.Store(1)
	r, c := newReconcileTest(t, interceptor.Funcs{
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			if sub == "status" && conflicts.Add(-1) >= 0 {
				// kubectl scale writes spec.replicas between the pass's
				// read and its status write.
				live := &etjobv1.ElasticJob{}
				if err := c.Get(ctx, client.ObjectKeyFromObject(obj), live); err != nil {
					return err
				}
				live.Spec.Replicas = 3
				if err := c.Update(ctx, live); err != nil {
					return err
				}
			}
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
	}, objs...)
	if err := reconcileJob(r); err != nil {
		t.Fatalf("the pass failed on the conflict: %v", err)
	}
	job := getTestJob(t, c)
	if job.Status.Preemptions != 1 {
		t.Errorf("preemptions %d after a conflicting status write, want 1", job.Status.Preemptions)
	}
	if job.Spec.Replicas != 3 {
		t.Errorf("the other writer's spec.replicas was lost: %d", job.Spec.Replicas)
	}
	if len(job.Status.Timeline) == 0 {
		t.Error("the pass's timeline entries were lost")
	}
}

// TestReconcileCreateRefused: a refused create leaves the job's
// CreateRefused condition with the API server's words, and the refused
// worker's index free for the next try.
func TestReconcileCreateRefused(t *testing.T) {
	_, objs := lostWorkerJob()
	r, c := newReconcileTest(t, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if _, ok := obj.(*corev1.Pod); ok {
				return apierrors.NewForbidden(corev1.Resource("pods"), obj.GetName(), errors.New("exceeded quota: gpu"))
			}
			return c.Create(ctx, obj, opts...)
		},
	}, objs...)
	if err := reconcileJob(r); err == nil {
		t.Fatal("a pass whose create was refused returned no error")
	}
	job := getTestJob(t, c)
	var refused *metav1.Condition
	for i := range job.Status.Conditions {
		if job.Status.Conditions[i].Type == etjobv1.ConditionCreateRefused {
			refused = &job.Status.Conditions[i]
		}
	}
	if refused == nil || refused.Status != metav1.ConditionTrue || !contains(refused.Message, "exceeded quota: gpu") {
		t.Errorf("CreateRefused = %+v, want true with the API server's words", refused)
	}
	if job.Status.NextWorkerIndex != 2 {
		t.Errorf("nextWorkerIndex %d, want 2: the refused worker's index is free again", job.Status.NextWorkerIndex)
	}
	if job.Status.Preemptions != 1 {
		t.Errorf("preemptions %d, want 1: the deletion before the refused create was made", job.Status.Preemptions)
	}
}

// TestReconcileLaggingCache: a cache that has not yet seen the pass's own
// status write makes the next pass wait (no double create) instead of
// deciding on the old status.
func TestReconcileLaggingCache(t *testing.T) {
	_, objs := lostWorkerJob()
	r, c := newReconcileTest(t, interceptor.Funcs{}, objs...)
	if err := reconcileJob(r); err != nil {
		t.Fatal(err)
	}
	written := getTestJob(t, c).ResourceVersion
	// The cache serves a job older than the write.
	stale := getTestJob(t, c)
	stale.ResourceVersion = "1"
	snapCreates := 0
	lag := interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if j, ok := obj.(*etjobv1.ElasticJob); ok {
				stale.DeepCopyInto(j)
				return nil
			}
			return c.Get(ctx, key, obj, opts...)
		},
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			snapCreates++
			return c.Create(ctx, obj, opts...)
		},
	}
	r.Client = interceptor.NewClient(c.(client.WithWatch), lag)
	res, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "j"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.RequeueAfter != expectationsRecheck || snapCreates != 0 {
		t.Errorf("on a cache older than the write %s: requeue %v and %d creates, want %v and none", written, res.RequeueAfter, snapCreates, expectationsRecheck)
	}
}

func contains(s, sub string) bool {
	return strings.Contains(s, sub)
}

// TestReconcileInvalidPodFailsTheJob: a create refused as invalid (422) is
// the pod template's fault: the condition says so, and the next pass fails
// the job with the server's words instead of trying pod after pod.
func TestReconcileInvalidPodFailsTheJob(t *testing.T) {
	_, objs := lostWorkerJob()
	invalid := apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Pod").GroupKind(), "j-worker-2",
		field.ErrorList{field.Invalid(field.NewPath("spec", "containers").Index(0).Child("volumeMounts").Index(1).Child("mountPath"), "/data", "must be unique")})
	r, c := newReconcileTest(t, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if _, ok := obj.(*corev1.Pod); ok {
				return invalid
			}
			return c.Create(ctx, obj, opts...)
		},
	}, objs...)
	if err := reconcileJob(r); err == nil {
		t.Fatal("a pass whose create was refused returned no error")
	}
	job := getTestJob(t, c)
	refused := meta.FindStatusCondition(job.Status.Conditions, etjobv1.ConditionCreateRefused)
	if refused == nil || refused.Reason != etjobv1.ReasonPodTemplateInvalid || !contains(refused.Message, "must be unique") {
		t.Fatalf("CreateRefused = %+v, want reason %s with the server's words", refused, etjobv1.ReasonPodTemplateInvalid)
	}
	_ = reconcileJob(r)
	job = getTestJob(t, c)
	failed := meta.FindStatusCondition(job.Status.Conditions, etjobv1.ConditionFailed)
	if failed == nil || failed.Status != metav1.ConditionTrue || failed.Reason != etjobv1.ReasonPodTemplateInvalid || !contains(failed.Message, "mountPath") {
		t.Errorf("Failed = %+v, want true, reason %s, naming the field", failed, etjobv1.ReasonPodTemplateInvalid)
	}
}

// TestOwnOrReplace (L5): the Service of an earlier job of the same name (an
// etjob.dev ElasticJob with another UID) is deleted to make way; one
// controlled by another API group's ElasticJob of that name is not ours, and
// is left alone with an error that says so.
func TestOwnOrReplace(t *testing.T) {
	job, _ := lostWorkerJob()
	t0 := true
	svc := func(name, apiVersion string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID(name + "-uid"),
			OwnerReferences: []metav1.OwnerReference{{APIVersion: apiVersion, Kind: "ElasticJob", Name: job.Name, UID: "earlier", Controller: &t0}}}}
	}
	earlier, foreign := svc("earlier", etjobv1.GroupVersion.String()), svc("foreign", "jobs.example.com/v1")
	r, c := newReconcileTest(t, interceptor.Funcs{}, earlier, foreign)
	ctx := context.Background()
	if err := r.ownOrReplace(ctx, job, earlier); err == nil || !strings.Contains(err.Error(), "belonged to an earlier job") {
		t.Errorf("an earlier etjob job's Service: %v, want it deleted", err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(earlier), &corev1.Service{}); !apierrors.IsNotFound(err) {
		t.Errorf("the earlier job's Service: %v, want it deleted", err)
	}
	if err := r.ownOrReplace(ctx, job, foreign); err == nil || !strings.Contains(err.Error(), "not controlled by ElasticJob") {
		t.Errorf("another group's ElasticJob's Service: %v, want a refusal", err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(foreign), &corev1.Service{}); err != nil {
		t.Errorf("another group's Service: %v, want it kept", err)
	}
}

// TestReconcileLauncherNodeLabel (issue #42, H2): with --launcher-node-label
// the launcher the controller creates requires that label in each of its
// required terms, beside a spot job's NotIn on spot labels (which a rooted
// kubelet may rewrite; NodeRestriction keeps it from writing the label).
func TestReconcileLauncherNodeLabel(t *testing.T) {
	job := MakeElasticJob("j", "ns").Replicas(2).Min(1).Max(3).Obj()
	job.Spec.Spot = &etjobv1.SpotSpec{Enabled: true}
	r, c := newReconcileTest(t, interceptor.Funcs{}, job)
	r.LauncherNode = NodeLabel{Key: NodeRestrictionPrefix + "/etjob-trusted", Value: "true"}
	if err := reconcileJob(r); err != nil {
		t.Fatal(err)
	}
	launcher := &corev1.Pod{}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: "j-launcher"}, launcher); err != nil {
		t.Fatalf("the launcher was not created: %v", err)
	}
	terms := launcher.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) == 0 {
		t.Fatal("the launcher requires no node")
	}
	for i, term := range terms {
		var trusted, offSpot bool
		for _, req := range term.MatchExpressions {
			trusted = trusted || req.Key == r.LauncherNode.Key && req.Operator == corev1.NodeSelectorOpIn && len(req.Values) == 1 && req.Values[0] == "true"
			offSpot = offSpot || req.Operator == corev1.NodeSelectorOpNotIn
		}
		if !trusted || !offSpot {
			t.Errorf("term %d %+v: want %s=true and the spot labels' NotIn", i, term.MatchExpressions, r.LauncherNode.Key)
		}
	}
}

// TestParseNodeLabel: --launcher-node-label is KEY=VALUE, a valid label; a
// key a kubelet may set is taken with a warning that says so.
func TestParseNodeLabel(t *testing.T) {
	for _, c := range []struct {
		in      string
		want    NodeLabel
		warns   bool
		invalid bool
	}{
		{in: ""},
		{in: "node-restriction.kubernetes.io/etjob-trusted=true", want: NodeLabel{"node-restriction.kubernetes.io/etjob-trusted", "true"}},
		{in: "pool=trusted", want: NodeLabel{"pool", "trusted"}, warns: true},
		{in: "no-value", invalid: true},
		{in: "bad key!=x", invalid: true},
		{in: "k=bad value", invalid: true},
	} {
		got, warning, err := ParseNodeLabel(c.in)
		if (err != nil) != c.invalid || got != c.want || (warning != "") != c.warns {
			t.Errorf("%q: %+v, %q, %v; want %+v, warning %t, invalid %t", c.in, got, warning, err, c.want, c.warns, c.invalid)
		}
	}
}

// TestPodNoticeEventsOff (issue #42, M2): by default a SpotToBeReleased Event
// about a worker on a node no agent serves tells it to leave; with
// --pod-notice-events=off no Event does, and the job is untouched.
func TestPodNoticeEventsOff(t *testing.T) {
	for _, off := range []bool{false, true} {
		job := MakeElasticJob("j", "ns").Replicas(2).Min(1).Max(3).Status(etjobv1.ElasticJobStatus{
			StartTime: &metav1.Time{Time: reconcileT0.Add(-time.Hour)}, NextWorkerIndex: 2,
			Membership: etjobv1.MembershipStatus{Generation: 1, Hosts: []string{"j-worker-0:1", "j-worker-1:1"}},
		}).Obj()
		ctl := true
		owned := func(p *corev1.Pod, uid types.UID) *corev1.Pod {
			p.UID = uid
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: etjobv1.GroupVersion.String(), Kind: "ElasticJob", Name: job.Name, UID: job.UID, Controller: &ctl}}
			return p
		}
		ev := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "eci", Namespace: "ns"}, Reason: "SpotToBeReleased",
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: "j-worker-0", UID: "w0"}}
		r, c := newReconcileTest(t, interceptor.Funcs{}, job,
			owned(MakeLauncher(job).Ready("od").Obj(), "l"), owned(MakeWorker(job, 0).Ready("virtual").Obj(), "w0"),
			owned(MakeWorker(job, 1).Ready("virtual").Obj(), "w1"), MakeNode("od").Obj(), MakeNode("virtual").Obj(), ev)
		r.NoPodNoticeEvents = off
		if err := reconcileJob(r); err != nil {
			t.Fatal(err)
		}
		p := &corev1.Pod{}
		if err := c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: "j-worker-0"}, p); err != nil {
			t.Fatal(err)
		}
		if got, want := p.Annotations[etjobv1.AnnotationLeaveReason], map[bool]string{false: "PodNotice(SpotToBeReleased)", true: ""}[off]; got != want {
			t.Errorf("--pod-notice-events off=%v: leave reason %q, want %q", off, got, want)
		}
	}
}

// TestParsePodNoticeEvents: "agentless" or "off", anything else named.
func TestParsePodNoticeEvents(t *testing.T) {
	if off, err := ParsePodNoticeEvents("agentless"); off || err != nil {
		t.Errorf("agentless: %v, %v", off, err)
	}
	if off, err := ParsePodNoticeEvents("off"); !off || err != nil {
		t.Errorf("off: %v, %v", off, err)
	}
	if _, err := ParsePodNoticeEvents("on"); err == nil || !strings.Contains(err.Error(), `"on"`) {
		t.Errorf("on: %v, want an error naming it", err)
	}
}
