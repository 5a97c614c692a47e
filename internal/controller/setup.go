package controller

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	lifecyclev1alpha1 "k8s.io/api/lifecycle/v1alpha1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/core"
)

// Cache indexes.
const (
	// OwnerUIDIndex indexes pods by the UID of their controlling ElasticJob.
	OwnerUIDIndex = "etjob.dev/owner-uid"
	// NodeNameIndex indexes the jobs' pods by node.
	NodeNameIndex = "etjob.dev/node-name"
	// EventPodIndex indexes pod Events by the name of their pod.
	EventPodIndex = "etjob.dev/event-pod"
)

// SetupIndexes registers the cache indexes the reconciler reads through.
func SetupIndexes(ctx context.Context, idx client.FieldIndexer) error {
	if err := idx.IndexField(ctx, &corev1.Pod{}, OwnerUIDIndex, func(o client.Object) []string {
		if ref := metav1.GetControllerOf(o); ref != nil && ref.Kind == "ElasticJob" && ref.APIVersion == etjobv1.GroupVersion.String() {
			return []string{string(ref.UID)}
		}
		return nil
	}); err != nil {
		return err
	}
	if err := idx.IndexField(ctx, &corev1.Pod{}, NodeNameIndex, func(o client.Object) []string {
		if n := o.(*corev1.Pod).Spec.NodeName; n != "" {
			return []string{n}
		}
		return nil
	}); err != nil {
		return err
	}
	if err := idx.IndexField(ctx, &corev1.Event{}, EventPodIndex, func(o client.Object) []string {
		if io := o.(*corev1.Event).InvolvedObject; io.Kind == "Pod" && io.Name != "" {
			return []string{io.Name}
		}
		return nil
	}); err != nil {
		return err
	}
	byJob := func(o client.Object) []string {
		spec, _ := o.(scaleRequest).Request()
		return []string{spec.Job}
	}
	if err := idx.IndexField(ctx, &etjobv1.ScaleOut{}, ScaleRequestJobIndex, byJob); err != nil {
		return err
	}
	return idx.IndexField(ctx, &etjobv1.ScaleIn{}, ScaleRequestJobIndex, byJob)
}

// SetupWithManager registers the reconciler: it owns pods, ConfigMaps, the
// launchers' NetworkPolicies and the stores' Secrets (one deleted is made
// again at once),
// watches Nodes for notices, readiness and removal, and pod Events for
// pod-level notices.
func (r *ElasticJobReconciler) SetupWithManager(mgr ctrl.Manager, concurrency int) error {
	b := ctrl.NewControllerManagedBy(mgr).
		For(&etjobv1.ElasticJob{}).
		Owns(&corev1.Pod{}).
		Owns(&corev1.ConfigMap{}).
		Owns(&networkingv1.NetworkPolicy{}).
		Owns(&discoveryv1.EndpointSlice{}). // another writer's change is put back
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.jobsOnNode), builder.WithPredicates(nodeChanged()))
	if !r.NoPodNoticeEvents { // off: no Event wakes a job
		b = b.Watches(&corev1.Event{}, handler.EnqueueRequestsFromMapFunc(r.jobOfNoticeEvent), builder.WithPredicates(eventArrived()))
	}
	if r.EvictionRequests {
		b = b.Watches(&lifecyclev1alpha1.EvictionRequest{}, handler.EnqueueRequestsFromMapFunc(r.jobOfEvictionRequest))
	}
	return b.WithOptions(controller.Options{MaxConcurrentReconciles: concurrency}).
		Named("elasticjob").
		Complete(r)
}

// jobsOnNode maps a Node to the jobs with pods on it.
func (r *ElasticJobReconciler) jobsOnNode(ctx context.Context, o client.Object) []reconcile.Request {
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.MatchingFields{NodeNameIndex: o.GetName()}); err != nil {
		return nil
	}
	seen := map[types.NamespacedName]bool{}
	var reqs []reconcile.Request
	for _, p := range pods.Items {
		name := p.Labels[etjobv1.LabelJobName]
		key := types.NamespacedName{Namespace: p.Namespace, Name: name}
		if name == "" || seen[key] {
			continue
		}
		seen[key] = true
		reqs = append(reqs, reconcile.Request{NamespacedName: key})
	}
	return reqs
}

// nodeChanged passes Node events that matter to a job: a notice annotation,
// the Ready condition, the node's price (spec.spot.maxPricePerHour), and
// deletion.
func nodeChanged() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return true },
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld.(*corev1.Node), e.ObjectNew.(*corev1.Node)
			return o.Annotations[etjobv1.AnnotationNodeNotice] != n.Annotations[etjobv1.AnnotationNodeNotice] ||
				core.DrainSource(o) != core.DrainSource(n) || readyChanged(o, n) || nodePrice(o) != nodePrice(n)
		},
	}
}

// readyChanged: the node's Ready condition changed status (True, False,
// Unknown, or none) or transition time.
func readyChanged(o, n *corev1.Node) bool {
	a, b := core.NodeReadyCondition(o), core.NodeReadyCondition(n)
	if a == nil || b == nil {
		return (a == nil) != (b == nil)
	}
	return a.Status != b.Status || !a.LastTransitionTime.Equal(&b.LastTransitionTime)
}

func nodePrice(n *corev1.Node) etjobv1.PricePerHour {
	p, _ := etjobv1.NodePrice(n)
	return p
}

// jobOfNoticeEvent maps a pod Event that is a reclamation notice for one of
// the jobs' pods (core.NoticeEvent) to that job. Every other Event maps to
// nothing, so the stream of scheduling and image Events costs a cache lookup.
func (r *ElasticJobReconciler) jobOfNoticeEvent(ctx context.Context, o client.Object) []reconcile.Request {
	ev := o.(*corev1.Event)
	pod := &corev1.Pod{}
	if err := r.Get(ctx, types.NamespacedName{Namespace: ev.InvolvedObject.Namespace, Name: ev.InvolvedObject.Name}, pod); err != nil {
		return nil
	}
	name := pod.Labels[etjobv1.LabelJobName]
	job := &etjobv1.ElasticJob{}
	if name == "" || r.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: name}, job) != nil {
		return nil
	}
	if !core.NoticeEvent(job, pod, ev.Reason) {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: pod.Namespace, Name: name}}}
}

// eventArrived passes new Events and repeated ones (an Event's count grows
// instead of a new Event being created).
func eventArrived() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return true },
		UpdateFunc:  func(event.UpdateEvent) bool { return true },
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}
