package core_test

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/core"
	. "github.com/etjob/etjob/internal/testutil"
)

// TestDecideScaling runs the Decide cases of scale: creating workers up to the
// desired size and telling the surplus to leave (scaling.go).
func TestDecideScaling(t *testing.T) {
	runDecideCases(t, map[string]decideCase{
		"new job creates the launcher and desired workers": {
			job:          base().Obj(),
			wantLauncher: true,
			wantCreate:   []int32{0, 1, 2},
			wantSummary:  "Pending",
		},
		"replicas above max are clamped to max": {
			job:          base().Replicas(3).Max(3).Obj(),
			wantLauncher: true,
			wantCreate:   []int32{0, 1, 2},
			wantSummary:  "Pending",
		},
		"creates are bounded per pass": {
			job:          base().Replicas(100).Max(100).Obj(),
			wantLauncher: true,
			wantCreate:   seq(0, core.MaxCreatesPerPass),
			wantSummary:  "Pending",
		},
		"scale in tells the highest ready index to leave and drops it from membership": {
			job: base().Replicas(2).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3,
				Membership: etjobv1.MembershipStatus{Generation: 4, Hosts: []string{"j-worker-0:1", "j-worker-1:1", "j-worker-2:1"}}})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
				MakeWorker(base().Obj(), 2).Ready("n2").Obj(),
			},
			nodes:          nodes("od", "n0", "n1", "n2"),
			wantSignal:     []string{"j-worker-2"},
			wantHosts:      []string{"j-worker-0:1", "j-worker-1:1"},
			wantGeneration: 5,
			wantCondTrue:   []string{etjobv1.ConditionRunning, etjobv1.ConditionResizing},
			wantSummary:    "Resizing",
			wantRequeue:    30 * time.Second,
			wantEvents:     []wantEvent{normal(etjobv1.EventMembershipChanged, "generation 5: 2 members")},
		},
		"scale in takes named workers first and deletes unready victims at once": {
			job: base().Replicas(2).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 4})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Annotation(etjobv1.AnnotationScaleIn, "").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
				MakeWorker(base().Obj(), 2).Ready("n2").Obj(),
				MakeWorker(base().Obj(), 3).Obj(),
			},
			nodes:          nodes("od", "n0", "n1", "n2"),
			wantSignal:     []string{"j-worker-0"},
			wantDelete:     []string{"j-worker-3"},
			wantHosts:      []string{"j-worker-1:1", "j-worker-2:1"},
			wantGeneration: 1,
			wantCondTrue:   []string{etjobv1.ConditionRunning, etjobv1.ConditionResizing},
			wantSummary:    "Resizing",
			wantRequeue:    30 * time.Second,
			wantEvents:     []wantEvent{normal(etjobv1.EventMembershipChanged, "generation 1: 2 members")},
		},
	})
}
