package core

import (
	"fmt"
	"slices"
	"strings"
	"time"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// ScaleRequest is a ScaleOut (Out) or a ScaleIn as DecideScale sees it.
type ScaleRequest struct {
	Out    bool
	Spec   etjobv1.ScaleRequestSpec
	Status etjobv1.ScaleRequestStatus
}

// ScaleDecision is what to do for a scale request.
type ScaleDecision struct {
	// Status is the request's new status.
	Status etjobv1.ScaleRequestStatus
	// SetReplicas, when set, is the job's new spec.replicas (through /scale).
	SetReplicas *int32
	// MarkScaleIn lists worker pods to annotate etjob.dev/scale-in, so the job
	// controller removes them first.
	MarkScaleIn []string
	// RequeueAfter is when to look again (the timeout); 0 means none.
	RequeueAfter time.Duration
}

// DecideScale decides a scale request, given its job (nil when it does not
// exist), whether an HorizontalPodAutoscaler targets the job, and the time.
// It is pure, like Decide.
func DecideScale(req ScaleRequest, job *etjobv1.ElasticJob, hpaTargets bool, now time.Time) ScaleDecision {
	st := req.Status
	d := ScaleDecision{Status: st}
	kind := "scale-in"
	if req.Out {
		kind = "scale-out"
	}
	refuse := func(format string, args ...any) ScaleDecision {
		d.Status.Phase = etjobv1.ScaleRequestRefused
		d.Status.Message = fmt.Sprintf(format, args...)
		d.Status.CompletionTime = &metav1.Time{Time: now}
		return d
	}
	finish := func(phase etjobv1.ScaleRequestPhase, format string, args ...any) ScaleDecision {
		d.Status.Phase = phase
		d.Status.Message = fmt.Sprintf(format, args...)
		d.Status.CompletionTime = &metav1.Time{Time: now}
		return d
	}
	switch st.Phase {
	case etjobv1.ScaleRequestSucceeded, etjobv1.ScaleRequestRefused, etjobv1.ScaleRequestRolledBack, etjobv1.ScaleRequestTimedOut:
		return d
	case "":
		if job == nil {
			return refuse("ElasticJob %q not found", req.Spec.Job)
		}
		if why := FinishedRefusal(job); why != "" {
			return refuse("%s", why)
		}
		if hpaTargets {
			return refuse("an HorizontalPodAutoscaler targets ElasticJob %q: change its size through the HPA", req.Spec.Job)
		}
		count := req.Spec.Count
		if n := int32(len(req.Spec.Instances)); n > 0 {
			if req.Out {
				return refuse("spec.instances applies to a ScaleIn only")
			}
			if count != 0 && count != n {
				return refuse("spec.count (%d) differs from the number of spec.instances (%d)", count, n)
			}
			count = n
		}
		if count < 1 {
			return refuse("spec.count must be at least 1")
		}
		prev := job.Spec.Replicas
		target := prev - count
		if req.Out {
			target = prev + count
		}
		if target > job.Spec.MaxReplicas {
			return refuse("a %s by %d would make spec.replicas %d, above spec.maxReplicas (%d)", kind, count, target, job.Spec.MaxReplicas)
		}
		if target < job.Spec.MinReplicas {
			return refuse("a %s by %d would make spec.replicas %d, below spec.minReplicas (%d)", kind, count, target, job.Spec.MinReplicas)
		}
		for _, name := range req.Spec.Instances {
			if !slices.ContainsFunc(job.Status.Workers, func(w etjobv1.WorkerStatus) bool { return w.Name == name }) {
				return refuse("spec.instances: %q is not a worker of ElasticJob %q", name, req.Spec.Job)
			}
		}
		d.SetReplicas = &target
		d.MarkScaleIn = req.Spec.Instances
		d.Status = etjobv1.ScaleRequestStatus{Phase: etjobv1.ScaleRequestScaling, PreviousReplicas: prev, TargetReplicas: target,
			StartTime: &metav1.Time{Time: now}, Message: fmt.Sprintf("spec.replicas %d -> %d", prev, target)}
		d.RequeueAfter = timeout(req.Spec)
		return d
	}
	// Scaling.
	if job == nil {
		return finish(etjobv1.ScaleRequestTimedOut, "ElasticJob %q was deleted", req.Spec.Job)
	}
	if scaleDone(req, job) {
		return finish(etjobv1.ScaleRequestSucceeded, "%d workers are members (spec.replicas %d)", job.Status.Members, st.TargetReplicas)
	}
	at := st.StartTime.Add(timeout(req.Spec))
	if now.Before(at) {
		d.RequeueAfter = at.Sub(now)
		if job.Spec.Replicas == st.PreviousReplicas && st.TargetReplicas != st.PreviousReplicas {
			// The target was recorded but never reached /scale (the
			// controller stopped between the two writes): set it again.
			// Absolute, so a second pass on a stale job cannot add twice.
			target := st.TargetReplicas
			d.SetReplicas = &target
			d.MarkScaleIn = req.Spec.Instances
		}
		return d
	}
	if !req.Out {
		return finish(etjobv1.ScaleRequestTimedOut, "the %s did not finish within %ds", kind, req.Spec.TimeoutSeconds)
	}
	if job.Spec.Replicas != st.TargetReplicas {
		return finish(etjobv1.ScaleRequestTimedOut, "not all new workers became members within %ds; spec.replicas was changed since (%d), so it is left alone",
			req.Spec.TimeoutSeconds, job.Spec.Replicas)
	}
	prev := st.PreviousReplicas
	d.SetReplicas = &prev
	return finish(etjobv1.ScaleRequestRolledBack, "only %d of %d workers became members within %ds: spec.replicas restored to %d",
		job.Status.Members, st.TargetReplicas, req.Spec.TimeoutSeconds, prev)
}

// scaleDone: a scale-out is done when the target count of workers are
// members; a scale-in when no more workers than the target are active and
// the named instances are gone or leaving.
func scaleDone(req ScaleRequest, job *etjobv1.ElasticJob) bool {
	target := req.Status.TargetReplicas
	if req.Out {
		return job.Status.Members >= target
	}
	if job.Status.Replicas > target {
		return false
	}
	for _, w := range job.Status.Workers {
		if slices.Contains(req.Spec.Instances, w.Name) && w.State != etjobv1.WorkerLeaving {
			return false
		}
	}
	return true
}

func timeout(spec etjobv1.ScaleRequestSpec) time.Duration {
	if spec.TimeoutSeconds <= 0 {
		return 60 * time.Second
	}
	return time.Duration(spec.TimeoutSeconds) * time.Second
}

// HPAsTargeting names the HorizontalPodAutoscalers that target ElasticJob job:
// while one does, it owns the job's size, and scale requests are refused.
func HPAsTargeting(hpas []autoscalingv2.HorizontalPodAutoscaler, job string) []string {
	var names []string
	for _, h := range hpas {
		ref := h.Spec.ScaleTargetRef
		group := ref.APIVersion
		if i := strings.IndexByte(group, '/'); i >= 0 {
			group = group[:i]
		}
		if ref.Kind == "ElasticJob" && ref.Name == job && (group == "" || group == etjobv1.GroupVersion.Group) {
			names = append(names, h.Name)
		}
	}
	return names
}
