package core_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/core"
	. "github.com/etjob/etjob/internal/testutil"
)

func TestLastCheckpointAndNoticeWindow(t *testing.T) {
	job := MakeElasticJob("j", "ns").Replicas(2).Min(1).Max(2).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 2,
		LastCheckpoint: &etjobv1.CheckpointStatus{Step: 10}})).Obj()
	gcp := MakeNode("n1").Obj()
	gcp.Labels = map[string]string{etjobv1.LabelCloudProvider: "gcp"}
	aws := MakeNode("n0").Obj()
	aws.Spec.ProviderID = "aws:///us-east-1a/i-0123"
	ckpt := func(step int64, secs float64) string {
		return fmt.Sprintf(`{"step":%d,"path":"/ckpt/ckpt-%d.pt","time":"2026-11-29T10:00:00Z","seconds":%g}`, step, step, secs)
	}
	pods := []*corev1.Pod{
		MakeLauncher(job).Ready("od").Obj(),
		MakeWorker(job, 0).Ready("n0").Annotation(etjobv1.AnnotationCheckpoint, ckpt(40, 20)).Obj(),
		MakeWorker(job, 1).Ready("n1").Annotation(etjobv1.AnnotationCheckpoint, ckpt(30, 1)).Obj(),
	}
	nodes := map[string]*corev1.Node{"od": MakeNode("od").Obj(), "n0": aws, "n1": gcp}
	plan := core.Decide(core.Snapshot{Job: job, Pods: pods, Nodes: nodes}, t0)
	lc := plan.Status.LastCheckpoint
	if lc == nil || lc.Step != 40 || lc.Path != "/ckpt/ckpt-40.pt" || lc.DurationMilliseconds != 20000 {
		t.Fatalf("lastCheckpoint = %+v, want step 40 from j-worker-0", lc)
	}
	// 20 s fits AWS's 2 minutes but not the ~15 s GKE leaves: the job says so.
	c := cond(plan.Status, etjobv1.ConditionCheckpointTooSlow)
	if c == nil || c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "15s a gcp reclamation notice leaves") {
		t.Errorf("CheckpointTooSlow = %+v", c)
	}
	if len(plan.Events) == 0 || plan.Events[len(plan.Events)-1].Reason != etjobv1.ConditionCheckpointTooSlow {
		t.Errorf("events = %+v, want a CheckpointTooSlow warning", plan.Events)
	}
	// A faster checkpoint clears it; an older report never moves it back.
	job.Status = plan.Status
	pods[1] = MakeWorker(job, 1).Ready("n1").Annotation(etjobv1.AnnotationCheckpoint, ckpt(50, 2)).Obj()
	pods[2] = MakeWorker(job, 0).Ready("n0").Annotation(etjobv1.AnnotationCheckpoint, ckpt(20, 1)).Obj()
	plan = core.Decide(core.Snapshot{Job: job, Pods: pods, Nodes: nodes}, t0.Add(time.Minute))
	if plan.Status.LastCheckpoint.Step != 50 || meta.IsStatusConditionTrue(plan.Status.Conditions, etjobv1.ConditionCheckpointTooSlow) {
		t.Errorf("after a fast checkpoint: %+v %+v", plan.Status.LastCheckpoint, plan.Status.Conditions)
	}
}

// TestStatusWorkers checks the per-worker list and the counts summarize
// writes: members, a worker starting, one pending, one leaving.
func TestStatusWorkers(t *testing.T) {
	job := MakeElasticJob("j", "ns").Replicas(4).Min(2).Max(5).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 5,
		Membership: etjobv1.MembershipStatus{Generation: 1, Hosts: []string{"j-worker-0:1", "j-worker-1:1"}}})).Obj()
	pods := []*corev1.Pod{
		MakeLauncher(job).Ready("od").Obj(),
		MakeWorker(job, 0).Ready("n0").Obj(),
		MakeWorker(job, 1).Ready("n1").Obj(),
		MakeWorker(job, 2).Running("n2").Obj(),
		MakeWorker(job, 3).Obj(),
		MakeWorker(job, 4).Ready("n4").Told(t0.Add(-time.Second), etjobv1.ReasonScaleIn).Obj(),
	}
	plan := core.Decide(core.Snapshot{Job: job, Pods: pods, Nodes: nodes("od", "n0", "n1", "n2", "n4")}, t0)
	st := plan.Status
	want := []etjobv1.WorkerStatus{
		{Name: "j-worker-0", Index: 0, Node: "n0", State: etjobv1.WorkerMember},
		{Name: "j-worker-1", Index: 1, Node: "n1", State: etjobv1.WorkerMember},
		{Name: "j-worker-2", Index: 2, Node: "n2", State: etjobv1.WorkerStarting},
		{Name: "j-worker-3", Index: 3, State: etjobv1.WorkerPending},
		{Name: "j-worker-4", Index: 4, Node: "n4", State: etjobv1.WorkerLeaving, Reason: etjobv1.ReasonScaleIn},
	}
	if diff := cmp.Diff(want, st.Workers); diff != "" {
		t.Errorf("workers (-want +got):\n%s", diff)
	}
	if st.Replicas != 4 || st.ReadyReplicas != 2 || st.LeavingReplicas != 1 || st.Members != 2 {
		t.Errorf("replicas/ready/leaving/members = %d/%d/%d/%d, want 4/2/1/2", st.Replicas, st.ReadyReplicas, st.LeavingReplicas, st.Members)
	}
	if st.Desired != "4 (2-5)" || st.Selector != "etjob.dev/job-name=j,etjob.dev/role=worker" {
		t.Errorf("desired %q, selector %q", st.Desired, st.Selector)
	}
	if st.Ranks != 2 {
		t.Errorf("ranks %d, want 2: 2 members of one rank", st.Ranks)
	}
	job.Spec.SlotsPerWorker = ptr.To(int32(8))
	if st := core.Decide(core.Snapshot{Job: job, Pods: pods, Nodes: nodes("od", "n0", "n1", "n2", "n4")}, t0).Status; st.Members != 2 || st.Ranks != 16 || st.SlotsPerWorker != 8 {
		t.Errorf("members/ranks/slots = %d/%d/%d, want 2/16/8: pods and ranks are counted apart", st.Members, st.Ranks, st.SlotsPerWorker)
	}
	if c := cond(st, etjobv1.ConditionResizing); c == nil || c.Reason != etjobv1.ReasonWorkersLeaving || st.Summary != "Resizing" {
		t.Errorf("Resizing = %+v, summary %q; want WorkersLeaving, Resizing", c, st.Summary)
	}
	if len(plan.Events) != 0 {
		t.Errorf("Events = %+v, want none: the membership did not change", plan.Events)
	}
}
