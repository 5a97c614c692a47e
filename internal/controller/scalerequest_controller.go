package controller

import (
	"context"
	"fmt"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/core"
)

// ScaleRequestJobIndex indexes ScaleOuts and ScaleIns by spec.job.
const ScaleRequestJobIndex = "etjob.dev/scale-request-job"

// scaleRequest is a ScaleOut or a ScaleIn.
type scaleRequest interface {
	client.Object
	Request() (*etjobv1.ScaleRequestSpec, *etjobv1.ScaleRequestStatus)
}

// ScaleRequestReconciler reconciles ScaleOuts (Out) or ScaleIns: it changes
// the job's spec.replicas through /scale, as `kubectl scale` does, and
// records the outcome in the request's status. The ElasticJob controller
// never writes its own spec: spec.replicas is the user's (and an HPA's).
type ScaleRequestReconciler struct {
	client.Client
	Clock clock.PassiveClock
	Out   bool
}

// +kubebuilder:rbac:groups=etjob.dev,resources=scaleouts;scaleins,verbs=get;list;watch
// +kubebuilder:rbac:groups=etjob.dev,resources=scaleouts/status;scaleins/status,verbs=update
// +kubebuilder:rbac:groups=etjob.dev,resources=elasticjobs/scale,verbs=patch
// +kubebuilder:rbac:groups=autoscaling,resources=horizontalpodautoscalers,verbs=get;list;watch

func (r *ScaleRequestReconciler) newObject() scaleRequest {
	if r.Out {
		return &etjobv1.ScaleOut{}
	}
	return &etjobv1.ScaleIn{}
}

// Reconcile decides one request with the pure core and applies the decision.
func (r *ScaleRequestReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	obj := r.newObject()
	if err := r.Get(ctx, req.NamespacedName, obj); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	spec, status := obj.Request()
	job, hpa, err := r.observe(ctx, req.Namespace, spec.Job)
	if err != nil {
		return ctrl.Result{}, err
	}
	d := core.DecideScale(core.ScaleRequest{Out: r.Out, Spec: *spec, Status: *status}, job, hpa, r.Clock.Now())
	// A new request records its target before it changes the job: a pass
	// on a stale cache (the job's watch fires right after /scale is
	// written, before the request's status reaches the cache) then fails
	// its status write on the resourceVersion instead of adding count a
	// second time. A crash between the two writes is repaired by
	// DecideScale, which sets the recorded target again.
	if status.Phase == "" && d.Status.Phase == etjobv1.ScaleRequestScaling {
		*status = d.Status
		if err := r.Status().Update(ctx, obj); err != nil {
			return ctrl.Result{}, err
		}
		if err := r.apply(ctx, job, d); err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{RequeueAfter: d.RequeueAfter}, nil
	}
	if err := r.apply(ctx, job, d); err != nil {
		return ctrl.Result{}, err
	}
	if !equality.Semantic.DeepEqual(*status, d.Status) {
		*status = d.Status
		if err := r.Status().Update(ctx, obj); err != nil {
			return ctrl.Result{}, err
		}
	}
	return ctrl.Result{RequeueAfter: d.RequeueAfter}, nil
}

func (r *ScaleRequestReconciler) observe(ctx context.Context, ns, name string) (*etjobv1.ElasticJob, bool, error) {
	job := &etjobv1.ElasticJob{}
	if err := r.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, job); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, false, nil
		}
		return nil, false, err
	}
	var hpas autoscalingv2.HorizontalPodAutoscalerList
	if err := r.List(ctx, &hpas, client.InNamespace(ns)); err != nil {
		return nil, false, err
	}
	return job, len(core.HPAsTargeting(hpas.Items, name)) > 0, nil
}

func (r *ScaleRequestReconciler) apply(ctx context.Context, job *etjobv1.ElasticJob, d core.ScaleDecision) error {
	for _, pod := range d.MarkScaleIn {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: job.Namespace}}
		patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:""}}}`, etjobv1.AnnotationScaleIn)
		if err := r.Patch(ctx, p, client.RawPatch(types.MergePatchType, patch)); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("marking %s for scale-in: %w", pod, err)
		}
	}
	if d.SetReplicas == nil {
		return nil
	}
	// A compare-and-set on spec.replicas alone: the decision was made on
	// job.Spec.Replicas, and a status write in between (the job's own
	// reconciler, every published checkpoint) must not make it conflict,
	// as a read-modify-write of the whole /scale object would, again and
	// again under a busy job and a slow client.
	patch := fmt.Appendf(nil, `[{"op":"test","path":"/spec/replicas","value":%d},{"op":"replace","path":"/spec/replicas","value":%d}]`,
		job.Spec.Replicas, *d.SetReplicas)
	if err := r.SubResource("scale").Patch(ctx, job, client.RawPatch(types.JSONPatchType, patch),
		client.WithSubResourceBody(&autoscalingv1.Scale{})); err != nil {
		return fmt.Errorf("writing /scale of ElasticJob %s (spec.replicas %d -> %d): %w", job.Name, job.Spec.Replicas, *d.SetReplicas, err)
	}
	return nil
}

// SetupWithManager registers the reconciler; a change of a job wakes its
// pending requests.
func (r *ScaleRequestReconciler) SetupWithManager(mgr ctrl.Manager) error {
	name := "scalein"
	if r.Out {
		name = "scaleout"
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(r.newObject()).
		Watches(&etjobv1.ElasticJob{}, handler.EnqueueRequestsFromMapFunc(r.requestsOfJob)).
		Named(name).
		Complete(r)
}

func (r *ScaleRequestReconciler) requestsOfJob(ctx context.Context, o client.Object) []reconcile.Request {
	var keys []types.NamespacedName
	if r.Out {
		var l etjobv1.ScaleOutList
		if err := r.List(ctx, &l, client.InNamespace(o.GetNamespace()), client.MatchingFields{ScaleRequestJobIndex: o.GetName()}); err != nil {
			return nil
		}
		for _, x := range l.Items {
			keys = append(keys, client.ObjectKeyFromObject(&x))
		}
	} else {
		var l etjobv1.ScaleInList
		if err := r.List(ctx, &l, client.InNamespace(o.GetNamespace()), client.MatchingFields{ScaleRequestJobIndex: o.GetName()}); err != nil {
			return nil
		}
		for _, x := range l.Items {
			keys = append(keys, client.ObjectKeyFromObject(&x))
		}
	}
	out := make([]reconcile.Request, 0, len(keys))
	for _, k := range keys {
		out = append(out, reconcile.Request{NamespacedName: k})
	}
	return out
}
