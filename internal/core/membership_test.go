package core_test

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/core"
	. "github.com/etjob/etjob/internal/testutil"
)

// TestDecideMembership runs the Decide cases of the published membership and
// join batching (membership.go).
func TestDecideMembership(t *testing.T) {
	runDecideCases(t, map[string]decideCase{
		"ready workers are published with slots from the GPU limit": {
			job: base().GPUs(2).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
				MakeWorker(base().Obj(), 2).Ready("n2").Obj(),
			},
			nodes:          nodes("od", "n0", "n1", "n2"),
			wantHosts:      []string{"j-worker-0:2", "j-worker-1:2", "j-worker-2:2"},
			wantGeneration: 1,
			wantCondTrue:   []string{etjobv1.ConditionRunning},
			wantSummary:    "Running",
			wantEvents:     []wantEvent{normal(etjobv1.EventMembershipChanged, "generation 1: 3 members")},
		},
		"a new worker waits briefly for the others of its scale-out to join with them": {
			job: base().Replicas(4).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 4,
				Membership: etjobv1.MembershipStatus{Generation: 2, Hosts: []string{"j-worker-0:1", "j-worker-1:1"}}})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
				MakeWorker(base().Obj(), 2).ReadySince("n2", t0.Add(-time.Second)).Obj(),
				MakeWorker(base().Obj(), 3).Node("n3").Obj(),
			},
			nodes:          nodes("od", "n0", "n1", "n2", "n3"),
			wantHosts:      []string{"j-worker-0:1", "j-worker-1:1"},
			wantGeneration: 2,
			wantCondTrue:   []string{etjobv1.ConditionRunning, etjobv1.ConditionResizing},
			wantRequeue:    4 * time.Second,
			wantSummary:    "Resizing",
		},
		"the batch window over, the ready worker joins alone": {
			job: base().Replicas(4).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 4,
				Membership: etjobv1.MembershipStatus{Generation: 2, Hosts: []string{"j-worker-0:1", "j-worker-1:1"}}})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
				MakeWorker(base().Obj(), 2).ReadySince("n2", t0.Add(-core.JoinBatchWindow)).Obj(),
				MakeWorker(base().Obj(), 3).Node("n3").Obj(),
			},
			nodes:          nodes("od", "n0", "n1", "n2", "n3"),
			wantHosts:      []string{"j-worker-0:1", "j-worker-1:1", "j-worker-2:1"},
			wantGeneration: 3,
			wantCondTrue:   []string{etjobv1.ConditionRunning, etjobv1.ConditionResizing},
			wantSummary:    "Resizing",
			wantEvents:     []wantEvent{normal(etjobv1.EventMembershipChanged, "generation 3: 3 members")},
		},
	})
}
