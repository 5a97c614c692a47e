package core_test

import (
	"encoding/json"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/core"
	. "github.com/etjob/etjob/internal/testutil"
)

// hb is a heartbeat annotation: step first seen `since` ago, world and round
// first seen `roundSince` ago.
func hb(step int64, world int32, round int64, since, roundSince time.Duration) string {
	b, _ := json.Marshal(etjobv1.HeartbeatAnnotation{Step: step, World: world, Round: round,
		Since: t0.Add(-since).Format(time.RFC3339), RoundSince: t0.Add(-roundSince).Format(time.RFC3339)})
	return string(b)
}

// heartbeatJob is a running job of n members (min 2) whose workers carry the
// given heartbeats ("" for none), with its launcher.
func heartbeatJob(n int, beats ...string) (*etjobv1.ElasticJob, []*corev1.Pod, map[string]*corev1.Node) {
	var hosts, names []string
	for i := range n {
		hosts = append(hosts, core.FormatHost(WorkerName(i), 1))
		names = append(names, "n"+string(rune('0'+i)))
	}
	job := base().Replicas(int32(n)).Max(6).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: int32(n),
		Membership: etjobv1.MembershipStatus{Generation: 4, Hosts: hosts}})).Obj()
	pods := []*corev1.Pod{MakeLauncher(base().Obj()).Ready("od").Obj()}
	for i := range n {
		w := MakeWorker(base().Obj(), int32(i)).Ready(names[i])
		if beats[i] != "" {
			w = w.Annotation(etjobv1.AnnotationHeartbeat, beats[i])
		}
		pods = append(pods, w.Obj())
	}
	return job, pods, nodes(append(names, "od")...)
}

// WorkerName is j's worker i.
func WorkerName(i int) string { return core.WorkerName("j", int32(i)) }

// TestDecideHeartbeats runs the Decide cases of the members' heartbeats
// (heartbeat.go): a member stuck while others train and a split are
// replaced; a job whose members all wait, a split still settling, a member
// that does not report and a leaving member are left alone.
func TestDecideHeartbeats(t *testing.T) {
	stuckJob, stuckPods, stuckNodes := heartbeatJob(3, hb(40, 3, 2, 3*time.Minute, 10*time.Minute),
		hb(412, 3, 2, 10*time.Second, 10*time.Minute), hb(412, 3, 2, 20*time.Second, 10*time.Minute))
	allJob, allPods, allNodes := heartbeatJob(3, hb(40, 3, 2, 3*time.Minute, 10*time.Minute),
		hb(41, 3, 2, 3*time.Minute, 10*time.Minute), hb(41, 3, 2, 4*time.Minute, 10*time.Minute))
	splitJob, splitPods, splitNodes := heartbeatJob(4, hb(900, 2, 9, 5*time.Second, 5*time.Minute),
		hb(900, 2, 9, 5*time.Second, 5*time.Minute), hb(300, 4, 8, 15*time.Second, 6*time.Minute),
		hb(300, 4, 8, 15*time.Second, 6*time.Minute))
	settlingJob, settlingPods, settlingNodes := heartbeatJob(4, hb(900, 2, 9, 5*time.Second, 20*time.Second),
		hb(900, 2, 9, 5*time.Second, 20*time.Second), hb(300, 4, 8, 15*time.Second, 6*time.Minute),
		hb(300, 4, 8, 15*time.Second, 6*time.Minute))
	// etjob.elastic went on without a frozen rank (world 3, generation 6);
	// the frozen one still says world 4, generation 5, for over a minute
	frozenJob, frozenPods, frozenNodes := heartbeatJob(4, hb(300, 4, 5, 90*time.Second, 10*time.Minute),
		hb(520, 3, 6, 10*time.Second, 80*time.Second), hb(520, 3, 6, 10*time.Second, 80*time.Second),
		hb(520, 3, 6, 10*time.Second, 80*time.Second))
	silentJob, silentPods, silentNodes := heartbeatJob(3, "", hb(412, 3, 2, 10*time.Second, 10*time.Minute),
		hb(412, 3, 2, 20*time.Second, 10*time.Minute))
	leavingJob, leavingPods, leavingNodes := heartbeatJob(3, hb(40, 3, 2, 3*time.Minute, 10*time.Minute),
		hb(412, 3, 2, 10*time.Second, 10*time.Minute), hb(412, 3, 2, 20*time.Second, 10*time.Minute))
	leavingPods[1] = MakeWorker(base().Obj(), 0).Ready("n0").Annotation(etjobv1.AnnotationHeartbeat, hb(40, 3, 2, 3*time.Minute, 10*time.Minute)).
		Told(t0.Add(-5*time.Second), etjobv1.ReasonScaleIn).Obj()

	runDecideCases(t, map[string]decideCase{
		"a member stuck while the others train is replaced: neither a failure nor a preemption": {
			job: stuckJob, pods: stuckPods, nodes: stuckNodes,
			wantDelete:     []string{"j-worker-0"},
			wantCreate:     []int32{3},
			wantHosts:      []string{"j-worker-1:1", "j-worker-2:1"},
			wantGeneration: 5,
			wantCondTrue:   []string{etjobv1.ConditionTrainingStalled, etjobv1.ConditionResizing},
			wantCondReason: map[string]string{etjobv1.ConditionTrainingStalled: etjobv1.ReasonMemberStuck},
			wantSummary:    "Resizing",
			wantRequeue:    100 * time.Second, // j-worker-2's heartbeat turns stale then
			wantEvents: []wantEvent{
				warning(etjobv1.EventMemberStuck, "j-worker-0 stopped advancing: step 40 for 3m0s while other members trained on"),
				normal(etjobv1.EventMembershipChanged, "generation 5: 2 members"),
			},
		},
		"members that all wait (one of them stuck, or a long evaluation) are left alone": {
			job: allJob, pods: allPods, nodes: allNodes,
			wantHosts:      []string{"j-worker-0:1", "j-worker-1:1", "j-worker-2:1"},
			wantGeneration: 4,
			wantSummary:    "Running",
		},
		"members split into two rounds for over a minute: those outside the largest world are replaced": {
			job: splitJob, pods: splitPods, nodes: splitNodes,
			wantDelete:     []string{"j-worker-0", "j-worker-1"},
			wantCreate:     []int32{4, 5},
			wantHosts:      []string{"j-worker-2:1", "j-worker-3:1"},
			wantGeneration: 5,
			wantCondTrue:   []string{etjobv1.ConditionTrainingStalled, etjobv1.ConditionResizing},
			wantCondReason: map[string]string{etjobv1.ConditionTrainingStalled: etjobv1.ReasonSplit},
			wantSummary:    "Resizing",
			wantRequeue:    105 * time.Second,
			wantEvents: []wantEvent{
				warning(etjobv1.EventSplit, "j-worker-2, j-worker-3 in round 8, world 4; j-worker-0, j-worker-1 in round 9, world 2; replacing those outside round 8 (world 4)"),
				normal(etjobv1.EventMembershipChanged, "generation 5: 2 members"),
			},
		},
		"a split that has not lasted a minute is looked at again when it has": {
			job: settlingJob, pods: settlingPods, nodes: settlingNodes,
			wantHosts:      []string{"j-worker-0:1", "j-worker-1:1", "j-worker-2:1", "j-worker-3:1"},
			wantGeneration: 4,
			wantSummary:    "Running",
			wantRequeue:    40 * time.Second,
		},
		"a rank frozen for a minute, in the world the others left, does not make them look split off": {
			job: frozenJob, pods: frozenPods, nodes: frozenNodes,
			wantHosts:      []string{"j-worker-0:1", "j-worker-1:1", "j-worker-2:1", "j-worker-3:1"},
			wantGeneration: 4,
			wantSummary:    "Running",
			wantRequeue:    30 * time.Second, // j-worker-0's heartbeat turns stale then: it is stuck
		},
		"a member whose script does not report is exempt": {
			job: silentJob, pods: silentPods, nodes: silentNodes,
			wantHosts:      []string{"j-worker-0:1", "j-worker-1:1", "j-worker-2:1"},
			wantGeneration: 4,
			wantSummary:    "Running",
			wantRequeue:    100 * time.Second,
		},
		"a leaving member is exempt": {
			job: leavingJob, pods: leavingPods, nodes: leavingNodes,
			wantHosts:      []string{"j-worker-1:1", "j-worker-2:1"},
			wantGeneration: 5,
			wantSummary:    "Resizing",
			wantCondTrue:   []string{etjobv1.ConditionResizing},
			wantCreate:     []int32{3},
			wantRequeue:    25 * time.Second,
			wantEvents:     []wantEvent{normal(etjobv1.EventMembershipChanged, "generation 5: 2 members")},
		},
	})
}

// TestStatusTraining checks status.training: the members whose heartbeat
// advanced within HeartbeatStale, unset when no member reports.
func TestStatusTraining(t *testing.T) {
	job, pods, nodes := heartbeatJob(3, "", hb(412, 3, 2, 10*time.Second, 10*time.Minute), hb(412, 3, 2, 20*time.Second, 10*time.Minute))
	plan := core.Decide(core.Snapshot{Job: job, Pods: pods, Nodes: nodes}, t0)
	if got := plan.Status.Training; got == nil || *got != 2 || plan.Status.Members != 3 {
		t.Errorf("training %v of %d members, want 2 of 3", got, plan.Status.Members)
	}
	// all waiting: none trains, and none is replaced
	job, pods, nodes = heartbeatJob(3, hb(40, 3, 2, 3*time.Minute, 10*time.Minute), hb(41, 3, 2, 3*time.Minute, 10*time.Minute), "")
	plan = core.Decide(core.Snapshot{Job: job, Pods: pods, Nodes: nodes}, t0)
	if got := plan.Status.Training; got == nil || *got != 0 || plan.Status.Members != 3 {
		t.Errorf("training %v of %d members, want 0 of 3", got, plan.Status.Members)
	}
	job, pods, nodes = heartbeatJob(2, "", "")
	plan = core.Decide(core.Snapshot{Job: job, Pods: pods, Nodes: nodes}, t0)
	if plan.Status.Training != nil {
		t.Errorf("training %d with no member reporting, want unset", *plan.Status.Training)
	}
}
