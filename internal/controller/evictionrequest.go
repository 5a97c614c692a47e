package controller

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	lifecyclev1alpha1 "k8s.io/api/lifecycle/v1alpha1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// The EvictionRequest API (KEP-4563, lifecycle.k8s.io/v1alpha1, feature
// gate EvictionRequestAPI, alpha in Kubernetes 1.37): a requester (a drain
// tool, an autoscaler, a test) creates an EvictionRequest for a pod instead
// of evicting it, and the pod's responders (spec.evictionResponders, which
// etjob sets on the pods it makes: render.EvictionResponder) are meant to
// take it from there. 1.37's kube-controller-manager runs no
// evictionrequest-controller, so no Eviction object (where a responder
// reports heartbeats and completion) is ever made: etjob acts on the
// EvictionRequests alone. A request whose intent is Eviction for a pod of a
// job (its name and UID) is a notice of that pod, with no deadline: the pod
// leaves at the job's next agreed step, and etjob deletes it once it left,
// which is the eviction the requester asked for. A request withdrawn before
// that (intent Withdrawn, or deleted) is no notice: the pod trains on. A
// leave already agreed is not taken back (its step is committed).

// evictionRequestKind is the EvictionRequest's group and kind.
var evictionRequestKind = schema.GroupKind{Group: lifecyclev1alpha1.GroupName, Kind: "EvictionRequest"}

// EvictionRequestsServed reports whether the API server serves
// EvictionRequests (lifecycle.k8s.io/v1alpha1), through mapper (the
// manager's, from discovery).
func EvictionRequestsServed(mapper meta.RESTMapper) bool {
	_, err := mapper.RESTMapping(evictionRequestKind, lifecyclev1alpha1.SchemeGroupVersion.Version)
	return err == nil
}

// evictionRequested returns, for each pod of pods named by an
// EvictionRequest of their namespace whose intent is Eviction, the
// request's requester, read from the cache.
func (r *ElasticJobReconciler) evictionRequested(ctx context.Context, namespace string, pods []*corev1.Pod) (map[string]string, error) {
	var list lifecyclev1alpha1.EvictionRequestList
	if err := r.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return nil, err
	}
	return EvictionRequested(list.Items, pods), nil
}

// EvictionRequested is that rule as a function: the requester of each pod
// (by name) that an EvictionRequest with intent Eviction targets by its name
// and UID; a request for an earlier pod of the same name is not for it.
func EvictionRequested(reqs []lifecyclev1alpha1.EvictionRequest, pods []*corev1.Pod) map[string]string {
	var out map[string]string
	uids := make(map[string]types.UID, len(pods))
	for _, p := range pods {
		uids[p.Name] = p.UID
	}
	for _, er := range reqs {
		t := er.Spec.Target.Pod
		if t == nil || er.Spec.Intent != lifecyclev1alpha1.EvictionRequestIntentEviction || er.DeletionTimestamp != nil {
			continue
		}
		if uid, ok := uids[t.Name]; !ok || uid != t.UID {
			continue
		}
		if out == nil {
			out = map[string]string{}
		}
		if out[t.Name] == "" || er.Spec.Requester < out[t.Name] {
			out[t.Name] = er.Spec.Requester
		}
	}
	return out
}

// jobOfEvictionRequest maps an EvictionRequest to the job of the pod it
// targets.
func (r *ElasticJobReconciler) jobOfEvictionRequest(ctx context.Context, o client.Object) []reconcile.Request {
	er, ok := o.(*lifecyclev1alpha1.EvictionRequest)
	if !ok || er.Spec.Target.Pod == nil {
		return nil
	}
	pod := &corev1.Pod{}
	if err := r.Get(ctx, types.NamespacedName{Namespace: er.Namespace, Name: er.Spec.Target.Pod.Name}, pod); err != nil {
		return nil
	}
	name := pod.Labels[etjobv1.LabelJobName]
	if name == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: pod.Namespace, Name: name}}}
}
