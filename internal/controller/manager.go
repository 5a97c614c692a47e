package controller

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/scheme"
)

// Options are what a deployment chooses of the manager's options.
type Options struct {
	// MetricsAddr and ProbeAddr are the metrics and probe listen addresses
	// ("0" disables).
	MetricsAddr, ProbeAddr string
	// SecureMetrics serves metrics over HTTPS to authorized callers only.
	SecureMetrics bool
	// LeaderElect elects a leader in LeaderElectNamespace.
	LeaderElect          bool
	LeaderElectNamespace string
	// PprofAddr serves net/http/pprof ("" or "0": off).
	PprofAddr string
	// Namespaces, when not empty, are the only namespaces whose jobs the
	// controller reconciles and whose objects it caches (--namespaces).
	Namespaces []string
}

// ManagerOptions are the manager options: caches of pods and owned objects are
// limited to etjob's own (labelled) objects, and with o.Namespaces to those
// namespaces, so the controller's memory does not grow with unrelated
// workloads; cached objects carry no managedFields, and pods only what the
// controller reads (SlimPod). With o.SecureMetrics the metrics endpoint
// serves HTTPS and answers only callers whose token the API server
// authenticates and who may get /metrics (ClusterRole etjob-metrics-reader).
func ManagerOptions(o Options) ctrl.Options {
	metrics := metricsserver.Options{BindAddress: o.MetricsAddr}
	if o.SecureMetrics {
		metrics.SecureServing = true
		metrics.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	ours, _ := labels.NewRequirement(etjobv1.LabelJobName, selection.Exists, nil)
	sel := labels.NewSelector().Add(*ours)
	return ctrl.Options{
		Scheme:                  scheme.New(),
		Metrics:                 metrics,
		HealthProbeBindAddress:  o.ProbeAddr,
		PprofBindAddress:        o.PprofAddr,
		LeaderElection:          o.LeaderElect,
		LeaderElectionID:        etjobv1.LeaderElectionID,
		LeaderElectionNamespace: o.LeaderElectNamespace,
		// A replica that stops (a rollout, a drain) hands the Lease over at
		// once instead of leaving the other to wait out its duration; Main
		// returns as soon as the manager stopped.
		LeaderElectionReleaseOnCancel: true,
		// Secrets are never cached, listed or watched: the controller reads
		// each job's store Secret by its name, from the API server (RBAC: get,
		// create, delete; issue #42 M6), so its token cannot enumerate the
		// cluster's Secrets.
		Client: client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}},
		Cache: cache.Options{
			DefaultNamespaces: namespaces(o.Namespaces),
			// Nothing here reads managedFields (one entry per writer of an
			// object, a large part of a cached pod); an update without them keeps
			// the server's.
			DefaultTransform: cache.TransformStripManagedFields(),
			ByObject: map[client.Object]cache.ByObject{
				&corev1.Pod{}:                   {Label: sel, Transform: SlimPod},
				&corev1.Node{}:                  {Transform: SlimNode},
				&corev1.ConfigMap{}:             {Label: sel},
				&corev1.Service{}:               {Label: sel},
				&corev1.ServiceAccount{}:        {Label: sel},
				&rbacv1.RoleBinding{}:           {Label: sel},
				&networkingv1.NetworkPolicy{}:   {Label: sel},
				&policyv1.PodDisruptionBudget{}: {Label: sel},
				&discoveryv1.EndpointSlice{}:    {Label: sel},
				// Pod-level reclamation notices (ECI, ACS) arrive as Events on pods.
				&corev1.Event{}: {Field: NoticeEventSelector(), Transform: SlimEvent},
			}},
	}
}

// Trust is what the controller believes of nodes and kubelets, from its
// flags (docs/security.md); the zero value is the flags' defaults.
type Trust struct {
	// Prices names the admin's price table ConfigMap (PriceTables; empty:
	// none), the label prefix of its rows' keys and whether it fails closed.
	Prices PriceTableFlags
	// LauncherNode is the node label every launcher requires (zero: none).
	LauncherNode NodeLabel
	// NoPodNoticeEvents is --pod-notice-events=off: no pod Event is a
	// notice, on any node.
	NoPodNoticeEvents bool
}

// Setup registers indexes and the reconciler with the manager; decisions,
// when not nil, records every Decide call of the job reconciler.
func Setup(ctx context.Context, mgr ctrl.Manager, concurrency int, decisions *DecisionRecorder, trust Trust) error {
	if err := SetupIndexes(ctx, mgr.GetFieldIndexer()); err != nil {
		return err
	}
	r := NewElasticJobReconciler(mgr.GetClient(), mgr.GetEventRecorder("etjob-controller"), clock.RealClock{})
	r.APIReader = mgr.GetAPIReader()
	r.Decisions = decisions
	r.Prices = trust.Prices.PriceTables(mgr.GetAPIReader(), clock.RealClock{})
	r.LauncherNode = trust.LauncherNode
	r.NoPodNoticeEvents = trust.NoPodNoticeEvents
	r.EvictionRequests = EvictionRequestsServed(mgr.GetRESTMapper())
	if err := r.SetupWithManager(mgr, concurrency); err != nil {
		return err
	}
	if err := ctrlmetrics.Registry.Register(NewJobCollector(mgr.GetCache(), mgr.Elected())); err != nil {
		return err
	}
	for _, out := range []bool{true, false} {
		sr := &ScaleRequestReconciler{Client: mgr.GetClient(), Clock: clock.RealClock{}, Out: out}
		if err := sr.SetupWithManager(mgr); err != nil {
			return err
		}
	}
	return nil
}

// namespaces is the cache's namespace set; nil is every namespace.
func namespaces(names []string) map[string]cache.Config {
	if len(names) == 0 {
		return nil
	}
	out := make(map[string]cache.Config, len(names))
	for _, n := range names {
		out[n] = cache.Config{}
	}
	return out
}

// SlimPod is the pod cache's transform: it keeps of each pod only what the
// controller reads (the decision core's classify, the indexes, the
// expectations): its metadata without managedFields, spec.nodeName, and the
// status' phase, reason, message, conditions and each container's state. At
// 1,000 jobs x 32 workers the pods are nearly all the cache, and their specs
// (the worker template: command, env, volumes) most of each pod
// (docs/benchmarks.md). The controller never updates a pod from the cache
// (it creates pods from the job's template and patches annotations), so
// what is dropped is never written back.
func SlimPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a tombstone
	}
	meta := pod.ObjectMeta
	meta.ManagedFields = nil
	slim := &corev1.Pod{
		TypeMeta:   pod.TypeMeta,
		ObjectMeta: meta,
		// the hostname, subdomain and IP: the job's EndpointSlice
		Spec: corev1.PodSpec{NodeName: pod.Spec.NodeName, Hostname: pod.Spec.Hostname, Subdomain: pod.Spec.Subdomain},
		Status: corev1.PodStatus{
			PodIP:      pod.Status.PodIP,
			Phase:      pod.Status.Phase,
			Reason:     pod.Status.Reason,
			Message:    pod.Status.Message,
			Conditions: pod.Status.Conditions,
			StartTime:  pod.Status.StartTime, // the bill (status.cost) starts there
		},
	}
	for _, cs := range pod.Status.ContainerStatuses {
		slim.Status.ContainerStatuses = append(slim.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: cs.Name, State: cs.State, LastTerminationState: cs.LastTerminationState,
			Ready: cs.Ready, RestartCount: cs.RestartCount,
		})
	}
	return slim, nil
}

// SlimNode is the node cache's transform: a node's metadata without
// managedFields, its providerID, taints and unschedulable, and its
// conditions, capacity and allocatable; not its images (on a real node
// dozens of image names and sizes, the largest part of a Node), daemon
// endpoints, node info or volumes. Every node of the cluster is cached.
func SlimNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil // a tombstone
	}
	meta := n.ObjectMeta
	meta.ManagedFields = nil
	return &corev1.Node{
		TypeMeta:   n.TypeMeta,
		ObjectMeta: meta,
		Spec:       corev1.NodeSpec{ProviderID: n.Spec.ProviderID, Taints: n.Spec.Taints, Unschedulable: n.Spec.Unschedulable},
		Status: corev1.NodeStatus{
			Conditions: n.Status.Conditions, Capacity: n.Status.Capacity, Allocatable: n.Status.Allocatable,
		},
	}, nil
}

// SlimEvent is the Event cache's transform: it keeps what a pod-level notice
// needs (the Event's name, the pod it is about with its UID, the reason and
// the count), never its message, annotations or labels, whose size the
// Event's author chooses. Every cached Event is then a few hundred bytes,
// and the API server deletes Events after its --event-ttl (1 h by default):
// a flood of forged Events costs the controller at most that hour's count
// times that size (docs/security.md, N2).
func SlimEvent(obj any) (any, error) {
	e, ok := obj.(*corev1.Event)
	if !ok {
		return obj, nil // a tombstone
	}
	return &corev1.Event{
		TypeMeta: e.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{Name: e.Name, Namespace: e.Namespace, UID: e.UID, ResourceVersion: e.ResourceVersion,
			CreationTimestamp: e.CreationTimestamp},
		InvolvedObject: corev1.ObjectReference{Kind: e.InvolvedObject.Kind, Namespace: e.InvolvedObject.Namespace,
			Name: e.InvolvedObject.Name, UID: e.InvolvedObject.UID},
		Reason: e.Reason,
		Count:  e.Count,
		// Its source, which PodNoticeEvent holds against the pod's node
		// (issue #42, M2), where it can be a node's name at all: a longer
		// one, which its author sized, names no node either way.
		Source:            corev1.EventSource{Host: nodeNameOrEmpty(e.Source.Host)},
		ReportingInstance: nodeNameOrEmpty(e.ReportingInstance),
	}, nil
}

// nodeNameOrEmpty is s where it may be a Node's name (at most 253
// characters), else "".
func nodeNameOrEmpty(s string) string {
	if len(s) > 253 {
		return ""
	}
	return s
}

// routinePodEventReasons are the Events every pod start and stop produces
// (scheduler and kubelet); none is a reclamation notice, and they are nearly
// all of a cluster's pod Events (33,000 Scheduled alone at 1,000 x 32).
var routinePodEventReasons = []string{"Scheduled", "Pulling", "Pulled", "Created", "Started", "Killing", "SuccessfulAttachVolume"}

// NoticeEventSelector selects the pod Events the controller caches for the
// pod-level notices: every reason but the routine ones. A field selector
// cannot list the reasons it wants (no OR), but it can exclude the routine
// ones by name, and they are nearly all the Events; unknown or configured
// notice reasons (spec.spot.preemptionReasons) stay in.
func NoticeEventSelector() fields.Selector {
	sel := []fields.Selector{fields.OneTermEqualSelector("involvedObject.kind", "Pod")}
	for _, r := range routinePodEventReasons {
		sel = append(sel, fields.OneTermNotEqualSelector("reason", r))
	}
	return fields.AndSelectors(sel...)
}
