package controller

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
)

func TestNoticeEventSelector(t *testing.T) {
	sel := NoticeEventSelector()
	for _, c := range []struct {
		kind, reason string
		want         bool
	}{
		{"Pod", "SpotToBeReleased", true}, // ECI
		{"Pod", "Evicted", true},          // ACS BestEffort
		{"Pod", "SomeCloudsOwnReason", true},
		{"Pod", "Scheduled", false},
		{"Pod", "Started", false},
		{"Node", "SpotToBeReleased", false},
	} {
		if got := sel.Matches(fields.Set{"involvedObject.kind": c.kind, "reason": c.reason}); got != c.want {
			t.Errorf("%s/%s: selected %v, want %v (%s)", c.kind, c.reason, got, c.want, sel)
		}
	}
}

// TestSlimPod: the pod cache keeps what the controller reads and drops the
// spec it never reads back (the worker template's command, env, volumes);
// the hostname, subdomain and IP stay for the job's EndpointSlice.
func TestSlimPod(t *testing.T) {
	now := metav1.Now()
	full := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "w-0", Namespace: "ns", UID: "u", Labels: map[string]string{"a": "b"},
			Annotations: map[string]string{"etjob.dev/leave": "x"}, DeletionTimestamp: &now,
			OwnerReferences: []metav1.OwnerReference{{UID: "job"}}, ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "m"}}},
		Spec: corev1.PodSpec{NodeName: "n1", Hostname: "w-0", Subdomain: "job", Containers: []corev1.Container{{Name: "worker", Command: []string{"python3"},
			Env: []corev1.EnvVar{{Name: "A", Value: "1"}}}}, Volumes: []corev1.Volume{{Name: "v"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Reason: "r", Message: "m", PodIP: "10.0.0.1",
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "worker", Image: "img", ImageID: "id", RestartCount: 2, Ready: true,
				State:                corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 75, Message: "leave"}},
				LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1}}}}},
	}
	got, err := SlimPod(full.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	want := full.DeepCopy()
	want.ManagedFields = nil
	want.Spec = corev1.PodSpec{NodeName: "n1", Hostname: "w-0", Subdomain: "job"} // and the IP: the job's EndpointSlice
	want.Status.ContainerStatuses[0].Image, want.Status.ContainerStatuses[0].ImageID = "", ""
	if !equality.Semantic.DeepEqual(got, want) {
		t.Errorf("SlimPod:\n got %+v\nwant %+v", got, want)
	}
	if tomb, _ := SlimPod("tombstone"); tomb != "tombstone" {
		t.Errorf("SlimPod(non-pod) = %v", tomb)
	}
}

func TestSoftMemoryLimit(t *testing.T) {
	for _, c := range []struct {
		limit, env string
		want       int64
		err        bool
	}{
		{"", "", 0, false},
		{"512Mi", "", 512 << 20 / 10 * 9, false},
		{"536870912", "", 536870912 / 10 * 9, false},
		{"512Mi", "400MiB", 0, false}, // GOMEMLIMIT wins
		{"lots", "", 0, true},
		{"0", "", 0, true},
	} {
		got, err := SoftMemoryLimit(c.limit, c.env)
		if got != c.want || (err != nil) != c.err {
			t.Errorf("SoftMemoryLimit(%q, %q) = %d, %v; want %d, error %v", c.limit, c.env, got, err, c.want, c.err)
		}
	}
}

// TestNamespaces: --namespaces scopes every namespaced cache (jobs, pods,
// owned objects, Events) to those namespaces; unset, every namespace.
func TestNamespaces(t *testing.T) {
	nss, err := ParseNamespaces(" team-a,team-b ,")
	if err != nil || len(nss) != 2 {
		t.Fatalf("ParseNamespaces = %v, %v", nss, err)
	}
	if _, err := ParseNamespaces("team-a,Team_B"); err == nil || !strings.Contains(err.Error(), "Team_B") {
		t.Errorf("ParseNamespaces(bad) = %v, want an error naming Team_B", err)
	}
	o := ManagerOptions(Options{Namespaces: nss})
	if len(o.Cache.DefaultNamespaces) != 2 {
		t.Errorf("DefaultNamespaces = %v", o.Cache.DefaultNamespaces)
	}
	for _, n := range nss {
		if _, ok := o.Cache.DefaultNamespaces[n]; !ok {
			t.Errorf("namespace %s not cached", n)
		}
	}
	if o := ManagerOptions(Options{}); o.Cache.DefaultNamespaces != nil {
		t.Errorf("no --namespaces: DefaultNamespaces = %v, want every namespace", o.Cache.DefaultNamespaces)
	}
}

// TestSlimNode: the node cache keeps the notice annotations, labels,
// providerID, taints and conditions, and drops the images.
func TestSlimNode(t *testing.T) {
	full := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{"k": "v"}, Annotations: map[string]string{"etjob.dev/reclaim-deadline": "x"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "m"}}},
		Spec: corev1.NodeSpec{ProviderID: "aws:///i-1", Taints: []corev1.Taint{{Key: "t", Effect: corev1.TaintEffectNoSchedule}}, PodCIDR: "10.0.0.0/24"},
		Status: corev1.NodeStatus{
			Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
			Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4")},
			Images:      []corev1.ContainerImage{{Names: []string{"big/image:1"}, SizeBytes: 1 << 30}},
			NodeInfo:    corev1.NodeSystemInfo{KubeletVersion: "v1.37"},
		},
	}
	got, err := SlimNode(full.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	want := full.DeepCopy()
	want.ManagedFields, want.Spec.PodCIDR = nil, ""
	want.Status.Images, want.Status.NodeInfo = nil, corev1.NodeSystemInfo{}
	if !equality.Semantic.DeepEqual(got, want) {
		t.Errorf("SlimNode:\n got %+v\nwant %+v", got, want)
	}
}

// TestSlimEvent: the Event cache keeps the pod an Event is about (with its
// UID), the reason and the count, and drops the message, annotations and
// labels, whose size the Event's author chooses.
func TestSlimEvent(t *testing.T) {
	big := strings.Repeat("x", 1<<20)
	full := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: "w-0.1", Namespace: "ml", UID: "e1", ResourceVersion: "7",
			Annotations: map[string]string{"a": big}, Labels: map[string]string{"l": "v"}},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "ml", Name: "w-0", UID: "p1", FieldPath: "spec.containers{worker}"},
		Reason:         "SpotToBeReleased", Message: big, Count: 3, Source: corev1.EventSource{Component: "eci", Host: big},
	}
	got, err := SlimEvent(full.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	want := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: "w-0.1", Namespace: "ml", UID: "e1", ResourceVersion: "7"},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "ml", Name: "w-0", UID: "p1"},
		Reason:         "SpotToBeReleased", Count: 3,
	}
	if !equality.Semantic.DeepEqual(got, want) {
		t.Errorf("SlimEvent:\n got %+v\nwant %+v", got, want)
	}
	// A source that can be a node's name is kept: PodNoticeEvent holds it
	// against the pod's node (issue #42, M2).
	full.Source.Host, full.ReportingInstance = "spot-1", "spot-2"
	got, _ = SlimEvent(full.DeepCopy())
	if e := got.(*corev1.Event); e.Source.Host != "spot-1" || e.ReportingInstance != "spot-2" {
		t.Errorf("SlimEvent dropped the source: host %q, reporting instance %q", e.Source.Host, e.ReportingInstance)
	}
}

// TestReadyChanged: the node watch queues the jobs on a node whose Ready
// condition changed status (True, False, Unknown or none) or transition time,
// all of which the core reads.
func TestReadyChanged(t *testing.T) {
	at := metav1.NewTime(time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC))
	node := func(status corev1.ConditionStatus, since metav1.Time) *corev1.Node {
		n := &corev1.Node{}
		if status != "" {
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeMemoryPressure}, {Type: corev1.NodeReady, Status: status, LastTransitionTime: since}}
		}
		return n
	}
	later := metav1.NewTime(at.Add(time.Minute))
	for _, c := range []struct {
		name string
		o, n *corev1.Node
		want bool
	}{
		{"unchanged", node(corev1.ConditionTrue, at), node(corev1.ConditionTrue, at), false},
		{"True to False", node(corev1.ConditionTrue, at), node(corev1.ConditionFalse, later), true},
		{"False to Unknown", node(corev1.ConditionFalse, at), node(corev1.ConditionUnknown, later), true},
		{"the same status, a new transition", node(corev1.ConditionFalse, at), node(corev1.ConditionFalse, later), true},
		{"no condition yet", node("", at), node(corev1.ConditionTrue, at), true},
		{"none either side", node("", at), node("", at), false},
	} {
		if got := readyChanged(c.o, c.n); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
