package core_test

import (
	"testing"
	"time"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/core"
	. "github.com/etjob/etjob/internal/testutil"
)

func TestDecideScale(t *testing.T) {
	job := func(replicas, members int32) *etjobv1.ElasticJob {
		j := MakeElasticJob("j", "ns").Replicas(replicas).Min(2).Max(6).Obj()
		j.Status.Members, j.Status.Replicas = members, members
		j.Status.Workers = []etjobv1.WorkerStatus{{Name: "j-worker-0", State: etjobv1.WorkerMember}, {Name: "j-worker-1", State: etjobv1.WorkerMember}}
		return j
	}
	scaling := func(prev, target int32, ago time.Duration) etjobv1.ScaleRequestStatus {
		return etjobv1.ScaleRequestStatus{Phase: etjobv1.ScaleRequestScaling, PreviousReplicas: prev, TargetReplicas: target,
			StartTime: &metav1.Time{Time: t0.Add(-ago)}}
	}
	spec := func(count int32, instances ...string) etjobv1.ScaleRequestSpec {
		return etjobv1.ScaleRequestSpec{Job: "j", Count: count, Instances: instances, TimeoutSeconds: 60}
	}
	cases := map[string]struct {
		req         core.ScaleRequest
		job         *etjobv1.ElasticJob
		hpa         bool
		wantPhase   etjobv1.ScaleRequestPhase
		wantMessage string
		wantSet     int32 // 0: none
		wantMark    []string
		wantRequeue time.Duration
	}{
		"scale out sets replicas and waits": {
			req: core.ScaleRequest{Out: true, Spec: spec(2)}, job: job(3, 3),
			wantPhase: etjobv1.ScaleRequestScaling, wantSet: 5, wantRequeue: 60 * time.Second, wantMessage: "spec.replicas 3 -> 5",
		},
		"a recorded target that never reached /scale is set again, absolute": {
			req: core.ScaleRequest{Out: true, Spec: spec(1), Status: scaling(3, 4, 10*time.Second)}, job: job(3, 3),
			wantPhase: etjobv1.ScaleRequestScaling, wantSet: 4, wantRequeue: 50 * time.Second,
		},
		"a scale out in progress on a job that has its target sets nothing": {
			req: core.ScaleRequest{Out: true, Spec: spec(1), Status: scaling(3, 4, 10*time.Second)}, job: job(4, 3),
			wantPhase: etjobv1.ScaleRequestScaling, wantRequeue: 50 * time.Second,
		},
		"scale out above max is refused naming the limit": {
			req: core.ScaleRequest{Out: true, Spec: spec(4)}, job: job(3, 3),
			wantPhase: etjobv1.ScaleRequestRefused, wantMessage: "a scale-out by 4 would make spec.replicas 7, above spec.maxReplicas (6)",
		},
		"scale in below min is refused naming the limit": {
			req: core.ScaleRequest{Spec: spec(2)}, job: job(3, 3),
			wantPhase: etjobv1.ScaleRequestRefused, wantMessage: "a scale-in by 2 would make spec.replicas 1, below spec.minReplicas (2)",
		},
		"an HPA owns the size": {
			req: core.ScaleRequest{Out: true, Spec: spec(1)}, job: job(3, 3), hpa: true,
			wantPhase: etjobv1.ScaleRequestRefused, wantMessage: `an HorizontalPodAutoscaler targets ElasticJob "j": change its size through the HPA`,
		},
		"a scale out of a failed job is refused with its state": {
			req: core.ScaleRequest{Out: true, Spec: spec(1)}, job: func() *etjobv1.ElasticJob {
				j := job(3, 0)
				j.Status.Conditions = []metav1.Condition{{Type: etjobv1.ConditionFailed, Status: metav1.ConditionTrue,
					Reason: etjobv1.ReasonBackoffLimit, Message: "4 failures exceed spec.backoffLimit (3)"}}
				return j
			}(),
			wantPhase: etjobv1.ScaleRequestRefused,
			wantMessage: `ElasticJob "j" has failed (BackoffLimitExceeded: 4 failures exceed spec.backoffLimit (3)): ` +
				"a finished job does not scale; submit it again to train more",
		},
		"a missing job": {
			req: core.ScaleRequest{Out: true, Spec: spec(1)}, wantPhase: etjobv1.ScaleRequestRefused, wantMessage: `ElasticJob "j" not found`,
		},
		"zero count": {
			req: core.ScaleRequest{Out: true, Spec: spec(0)}, job: job(3, 3), wantPhase: etjobv1.ScaleRequestRefused, wantMessage: "spec.count must be at least 1",
		},
		"scale in of named instances marks them": {
			req: core.ScaleRequest{Spec: spec(0, "j-worker-1")}, job: job(3, 3),
			wantPhase: etjobv1.ScaleRequestScaling, wantSet: 2, wantMark: []string{"j-worker-1"}, wantRequeue: 60 * time.Second, wantMessage: "spec.replicas 3 -> 2",
		},
		"an unknown instance is refused": {
			req: core.ScaleRequest{Spec: spec(0, "j-worker-9")}, job: job(3, 3),
			wantPhase: etjobv1.ScaleRequestRefused, wantMessage: `spec.instances: "j-worker-9" is not a worker of ElasticJob "j"`,
		},
		"count and instances disagree": {
			req: core.ScaleRequest{Spec: spec(2, "j-worker-1")}, job: job(3, 3),
			wantPhase: etjobv1.ScaleRequestRefused, wantMessage: "spec.count (2) differs from the number of spec.instances (1)",
		},
		"scale out succeeds once the members are there": {
			req: core.ScaleRequest{Out: true, Spec: spec(2), Status: scaling(3, 5, 10*time.Second)}, job: job(5, 5),
			wantPhase: etjobv1.ScaleRequestSucceeded, wantMessage: "5 workers are members (spec.replicas 5)",
		},
		"scale out still waiting": {
			req: core.ScaleRequest{Out: true, Spec: spec(2), Status: scaling(3, 5, 10*time.Second)}, job: job(5, 4),
			wantPhase: etjobv1.ScaleRequestScaling, wantRequeue: 50 * time.Second,
		},
		"scale out rolled back on timeout": {
			req: core.ScaleRequest{Out: true, Spec: spec(2), Status: scaling(3, 5, 61*time.Second)}, job: job(5, 4),
			wantPhase: etjobv1.ScaleRequestRolledBack, wantSet: 3,
			wantMessage: "only 4 of 5 workers became members within 60s: spec.replicas restored to 3",
		},
		"a timed-out scale out leaves a size someone else changed": {
			req: core.ScaleRequest{Out: true, Spec: spec(2), Status: scaling(3, 5, 61*time.Second)}, job: job(6, 4),
			wantPhase:   etjobv1.ScaleRequestTimedOut,
			wantMessage: "not all new workers became members within 60s; spec.replicas was changed since (6), so it is left alone",
		},
		"scale in succeeds when the named worker leaves": {
			req: core.ScaleRequest{Spec: spec(0, "j-worker-1"), Status: scaling(3, 2, 5*time.Second)},
			job: func() *etjobv1.ElasticJob {
				j := job(2, 2)
				j.Status.Workers[1].State = etjobv1.WorkerLeaving
				return j
			}(),
			wantPhase: etjobv1.ScaleRequestSucceeded, wantMessage: "2 workers are members (spec.replicas 2)",
		},
		"scale in times out": {
			req: core.ScaleRequest{Spec: spec(0, "j-worker-1"), Status: scaling(3, 2, 61*time.Second)}, job: job(2, 2),
			wantPhase: etjobv1.ScaleRequestTimedOut, wantMessage: "the scale-in did not finish within 60s",
		},
		"a finished request stays finished": {
			req: core.ScaleRequest{Out: true, Spec: spec(2), Status: etjobv1.ScaleRequestStatus{Phase: etjobv1.ScaleRequestSucceeded, Message: "done"}}, job: job(5, 1),
			wantPhase: etjobv1.ScaleRequestSucceeded, wantMessage: "done",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			d := core.DecideScale(tc.req, tc.job, tc.hpa, t0)
			if d.Status.Phase != tc.wantPhase {
				t.Errorf("phase = %s, want %s (%s)", d.Status.Phase, tc.wantPhase, d.Status.Message)
			}
			if tc.wantMessage != "" && d.Status.Message != tc.wantMessage {
				t.Errorf("message = %q, want %q", d.Status.Message, tc.wantMessage)
			}
			var set int32
			if d.SetReplicas != nil {
				set = *d.SetReplicas
			}
			if set != tc.wantSet {
				t.Errorf("SetReplicas = %d, want %d", set, tc.wantSet)
			}
			if len(d.MarkScaleIn) != len(tc.wantMark) {
				t.Errorf("MarkScaleIn = %v, want %v", d.MarkScaleIn, tc.wantMark)
			}
			if d.RequeueAfter != tc.wantRequeue {
				t.Errorf("RequeueAfter = %v, want %v", d.RequeueAfter, tc.wantRequeue)
			}
		})
	}
}

func TestHPAsTargeting(t *testing.T) {
	hpa := func(name, apiVersion, kind, target string) autoscalingv2.HorizontalPodAutoscaler {
		return autoscalingv2.HorizontalPodAutoscaler{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: autoscalingv2.HorizontalPodAutoscalerSpec{ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: apiVersion, Kind: kind, Name: target}}}
	}
	got := core.HPAsTargeting([]autoscalingv2.HorizontalPodAutoscaler{
		hpa("a", "etjob.dev/v1alpha1", "ElasticJob", "j"),
		hpa("b", "apps/v1", "Deployment", "j"),
		hpa("c", "other.io/v1", "ElasticJob", "j"),
		hpa("d", "etjob.dev/v1alpha1", "ElasticJob", "k"),
		hpa("e", "", "ElasticJob", "j"),
	}, "j")
	if len(got) != 2 || got[0] != "a" || got[1] != "e" {
		t.Errorf("HPAsTargeting = %v, want [a e]", got)
	}
}
