package controller

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	lifecyclev1alpha1 "k8s.io/api/lifecycle/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TestEvictionRequested: a request with intent Eviction for a job's pod (its
// name and UID) is a notice of it; a withdrawn one, one being deleted, one for
// an earlier pod of the same name, or one for another pod is not.
func TestEvictionRequested(t *testing.T) {
	pod := func(name, uid string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(uid)}}
	}
	req := func(requester, pod, uid string, intent lifecyclev1alpha1.EvictionRequestIntent) lifecyclev1alpha1.EvictionRequest {
		return lifecyclev1alpha1.EvictionRequest{Spec: lifecyclev1alpha1.EvictionRequestSpec{
			Target:    lifecyclev1alpha1.EvictionRequestTarget{Pod: &lifecyclev1alpha1.EvictionRequestPodReference{Name: pod, UID: types.UID(uid)}},
			Requester: requester, Intent: intent,
		}}
	}
	deleting := req("a.io/drain", "j-worker-3", "u3", lifecyclev1alpha1.EvictionRequestIntentEviction)
	deleting.DeletionTimestamp = &metav1.Time{}
	pods := []*corev1.Pod{pod("j-worker-0", "u0"), pod("j-worker-1", "u1"), pod("j-worker-2", "u2"), pod("j-worker-3", "u3")}
	reqs := []lifecyclev1alpha1.EvictionRequest{
		req("z.io/upgrade", "j-worker-0", "u0", lifecyclev1alpha1.EvictionRequestIntentEviction),
		req("a.io/drain", "j-worker-0", "u0", lifecyclev1alpha1.EvictionRequestIntentEviction),
		req("a.io/drain", "j-worker-1", "u1", lifecyclev1alpha1.EvictionRequestIntentWithdrawn),
		req("a.io/drain", "j-worker-2", "an-earlier-pod", lifecyclev1alpha1.EvictionRequestIntentEviction),
		deleting,
		req("a.io/drain", "other-worker-0", "o0", lifecyclev1alpha1.EvictionRequestIntentEviction),
		{Spec: lifecyclev1alpha1.EvictionRequestSpec{Requester: "a.io/no-target", Intent: lifecyclev1alpha1.EvictionRequestIntentEviction}},
	}
	want := map[string]string{"j-worker-0": "a.io/drain"}
	if diff := cmp.Diff(want, EvictionRequested(reqs, pods)); diff != "" {
		t.Errorf("EvictionRequested() (-want +got):\n%s", diff)
	}
	if got := EvictionRequested(nil, pods); got != nil {
		t.Errorf("no request: %v; want none", got)
	}
}
