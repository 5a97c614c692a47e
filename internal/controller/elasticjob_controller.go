// Package controller holds etjob's reconcilers. They observe (informer caches
// only), call the pure decision core, apply its plan, write status once and
// emit events; they decide nothing themselves.
package controller

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/core"
	"github.com/etjob/etjob/internal/render"
)

// expectationsRecheck is how soon a job whose cache has not caught up with our
// own writes is looked at again if no event arrives first.
const expectationsRecheck = 2 * time.Second

// ElasticJobReconciler reconciles ElasticJobs.
type ElasticJobReconciler struct {
	client.Client
	// APIReader reads from the API server, past the cache: a status write
	// that conflicts is retried on what the server holds (writeStatus).
	// Nil: such a write is not retried in the pass.
	APIReader client.Reader
	Recorder  events.EventRecorder
	Clock     clock.PassiveClock
	// Decisions, when set, records every Decide call (--record-decisions).
	Decisions *DecisionRecorder
	// Prices is the admin's price table (--price-table); nil: none.
	Prices *PriceTables
	// LauncherNode is the node label every launcher requires
	// (--launcher-node-label); zero: none.
	LauncherNode NodeLabel
	// NoPodNoticeEvents is --pod-notice-events=off: no pod Event is read
	// or watched, so a pod hears a notice only through its node's agent.
	NoPodNoticeEvents bool
	// EvictionRequests: the API server serves the EvictionRequest API;
	// a request for a job's pod is a notice of it (evictionrequest.go).
	EvictionRequests bool
	expectations     *Expectations
}

// NewElasticJobReconciler returns a reconciler using the manager's client.
func NewElasticJobReconciler(c client.Client, rec events.EventRecorder, clk clock.PassiveClock) *ElasticJobReconciler {
	return &ElasticJobReconciler{Client: c, Recorder: rec, Clock: clk, expectations: NewExpectations()}
}

// +kubebuilder:rbac:groups=etjob.dev,resources=elasticjobs,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups=etjob.dev,resources=elasticjobs/status,verbs=update
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;create;delete;patch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=configmaps;services,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups="",resources=serviceaccounts,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=rolebindings,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=networking.k8s.io,resources=networkpolicies,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=lifecycle.k8s.io,resources=evictionrequests,verbs=get;list;watch
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;create;delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=clusterroles,verbs=bind,resourceNames=etjob-launcher
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create
// +kubebuilder:rbac:groups="",resources=events,verbs=get;list;watch;create;patch

// Reconcile observes one job, lets the decision core plan, and applies it.
func (r *ElasticJobReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	job := &etjobv1.ElasticJob{}
	if err := r.Get(ctx, req.NamespacedName, job); err != nil {
		if apierrors.IsNotFound(err) {
			r.expectations.Forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if job.DeletionTimestamp != nil {
		return ctrl.Result{}, nil
	}
	snap, synced, err := r.observe(ctx, job)
	if err != nil {
		return ctrl.Result{}, err // controller-runtime ignores RequeueAfter next to an error, and backs off
	}
	if !synced {
		return ctrl.Result{RequeueAfter: expectationsRecheck}, nil
	}
	now := r.Clock.Now()
	plan := core.Decide(snap, now)
	decided := plan // apply trims plan.Status when a create is refused; the record keeps what Decide planned
	applyErr := r.apply(ctx, job, snap.Pods, &plan)
	r.Decisions.Record(snap, now, decided, applyErr)
	if err := r.writeStatus(ctx, job, plan.Status, applyErr); err != nil {
		return ctrl.Result{}, err
	}
	r.emit(job, plan.Events)
	if applyErr != nil {
		return ctrl.Result{}, applyErr
	}
	if plan.DeleteJob {
		return ctrl.Result{}, r.deleteJob(ctx, job)
	}
	return ctrl.Result{RequeueAfter: plan.RequeueAfter}, nil
}

// observe reads the job's pods and their nodes from the caches. It reports
// synced=false while the cache has not yet seen this controller's own creates
// and deletes, so a lagging cache never causes a double create or delete.
//
// The pods and nodes are the cache's own objects, not copies
// (UnsafeDisableDeepCopy): the snapshot is only read, by Decide (which never
// writes to its input: TestDecideProperties checks it) and by the
// expectations. Copying 32 pods and their nodes on every reconcile was a
// large part of the controller's garbage at 1,000 jobs (docs/benchmarks.md).
func (r *ElasticJobReconciler) observe(ctx context.Context, job *etjobv1.ElasticJob) (core.Snapshot, bool, error) {
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(job.Namespace), client.MatchingFields{OwnerUIDIndex: string(job.UID)},
		client.UnsafeDisableDeepCopy); err != nil {
		return core.Snapshot{}, false, err
	}
	snap := core.Snapshot{Job: job, Nodes: map[string]*corev1.Node{}}
	for i := range pods.Items {
		p := &pods.Items[i]
		snap.Pods = append(snap.Pods, p)
		if n := p.Spec.NodeName; n != "" && snap.Nodes[n] == nil {
			node := &corev1.Node{}
			if err := r.Get(ctx, types.NamespacedName{Name: n}, node, client.UnsafeDisableDeepCopy); err == nil {
				snap.Nodes[n] = node
			} else if !apierrors.IsNotFound(err) {
				return core.Snapshot{}, false, err
			}
		}
		if r.NoPodNoticeEvents {
			continue
		}
		if reason, err := r.podNotice(ctx, job, p, snap.Nodes[p.Spec.NodeName]); err != nil {
			return core.Snapshot{}, false, err
		} else if reason != "" {
			if snap.PodNotices == nil {
				snap.PodNotices = map[string]string{}
			}
			snap.PodNotices[p.Name] = reason
		}
	}
	if r.EvictionRequests && len(snap.Pods) > 0 {
		asked, err := r.evictionRequested(ctx, job.Namespace, snap.Pods)
		if err != nil {
			return core.Snapshot{}, false, err
		}
		for pod, requester := range asked {
			if snap.PodNotices == nil {
				snap.PodNotices = map[string]string{}
			}
			snap.PodNotices[pod] = "EvictionRequest:" + requester
		}
	}
	snap.Prices = r.Prices.Get(ctx) // the bill prices by it too
	if err := r.observePricedNodes(ctx, job, &snap); err != nil {
		return core.Snapshot{}, false, err
	}
	key := client.ObjectKeyFromObject(job)
	synced := r.expectations.JobSynced(key, job.ResourceVersion) &&
		r.expectations.Satisfied(key, snap.Pods, r.Clock.Now())
	return snap, synced, nil
}

// observePricedNodes adds to the snapshot, for a job with
// spec.spot.maxPricePerHour, every node priced above it: new workers are kept
// off them (Plan.AvoidNodes), also those that host none of the job's pods
// (found by TestGrowthStory: a probe landed on the node its worker had just
// left for its price). For a job with spec.spot.budgetPerHour it adds every
// priced node: the budget needs the cheapest, and keeps new workers off
// those dearer than their share. Only those nodes: the snapshot stays small,
// and the bill reads the nodes of the job's own pods.
func (r *ElasticJobReconciler) observePricedNodes(ctx context.Context, job *etjobv1.ElasticJob, snap *core.Snapshot) error {
	if !core.ObservesPrices(&job.Spec) {
		return nil
	}
	var nodes corev1.NodeList
	if err := r.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
		return err
	}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		if snap.Nodes[n.Name] == nil && core.SnapshotNode(&job.Spec, snap.Prices, n) {
			snap.Nodes[n.Name] = n
		}
	}
	return nil
}

// podNotice returns the reason of the first Event on the pod that is a
// reclamation notice for it (core.PodNoticeEvent), or "".
func (r *ElasticJobReconciler) podNotice(ctx context.Context, job *etjobv1.ElasticJob, pod *corev1.Pod, node *corev1.Node) (string, error) {
	if pod.Status.Phase == corev1.PodSucceeded {
		return "", nil
	}
	var evs corev1.EventList
	if err := r.List(ctx, &evs, client.InNamespace(pod.Namespace), client.MatchingFields{EventPodIndex: pod.Name}); err != nil {
		return "", err
	}
	isNode := func(name string) bool { // a read that fails counts as a node: the Event is not taken
		return !apierrors.IsNotFound(r.Get(ctx, types.NamespacedName{Name: name}, &corev1.Node{}, client.UnsafeDisableDeepCopy))
	}
	for i := range evs.Items {
		if ev := &evs.Items[i]; core.PodNoticeEvent(job, pod, node, ev, isNode) {
			return ev.Reason, nil
		}
	}
	return "", nil
}

// apply carries out the plan (applyPlan), then publishes the Service's
// addresses whatever became of it: a create a quota refuses at every pass
// must not keep the store's name from resolving for the pods that run.
func (r *ElasticJobReconciler) apply(ctx context.Context, job *etjobv1.ElasticJob, owned []*corev1.Pod, plan *core.Plan) error {
	err := r.applyPlan(ctx, job, plan)
	if perr := r.publishEndpoints(ctx, job, owned); err == nil {
		err = perr
	}
	return err
}

// applyPlan carries out the plan: deletions, signals, creations, then the
// membership. It stops at the first error; the next pass picks up the rest.
func (r *ElasticJobReconciler) applyPlan(ctx context.Context, job *etjobv1.ElasticJob, plan *core.Plan) error {
	key := client.ObjectKeyFromObject(job)
	logger := log.FromContext(ctx)
	for i, d := range plan.Delete {
		r.expectations.ExpectDelete(key, d.Name, r.Clock.Now())
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: d.Name, Namespace: job.Namespace}}
		if err := r.Delete(ctx, pod, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
			r.expectations.DeleteObserved(key, d.Name)
			uncount(plan, plan.Delete[i:])
			return fmt.Errorf("deleting pod %s: %w", d.Name, err)
		}
		logger.V(1).Info("deleted pod", "pod", d.Name, "reason", d.Reason)
	}
	for _, s := range plan.Signal {
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": s.Annotations()}})
		if err != nil {
			return fmt.Errorf("signalling pod %s: %w", s.Pod, err)
		}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: s.Pod, Namespace: job.Namespace}}
		if err := r.Patch(ctx, pod, client.RawPatch(types.MergePatchType, patch)); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("signalling pod %s: %w", s.Pod, err)
		}
	}
	if err := r.ensureSupporting(ctx, job, plan); err != nil {
		return err
	}
	var pods []*corev1.Pod
	if plan.CreateLauncher {
		l := render.Launcher(withStatus(job, plan))
		if r.LauncherNode.Key != "" {
			render.RequireNodeLabel(&l.Spec, r.LauncherNode.Key, r.LauncherNode.Value)
		}
		pods = append(pods, l)
	}
	for _, i := range plan.CreateWorkers {
		pods = append(pods, render.PlannedWorker(withStatus(job, plan), plan, i))
	}
	for _, p := range pods {
		r.expectations.ExpectCreate(key, p.Name, r.Clock.Now())
		err := r.Create(ctx, p)
		if apierrors.IsAlreadyExists(err) && !r.ownPod(ctx, job, p.Name) {
			// The name is held by a pod of another owner: a deleted job of
			// the same name whose pods still terminate. Waiting for our own
			// create to show would stall the job for expectationsTimeout;
			// retry with back-off instead.
			err = fmt.Errorf("pod %s still belongs to another owner (a deleted job of the same name?): %w", p.Name, err)
		} else if apierrors.IsAlreadyExists(err) {
			err = nil
		}
		if err != nil {
			r.expectations.CreateObserved(key, p.Name)
			forgetUncreated(plan, p)
			return &createRefusedError{pod: p.Name, err: err}
		}
	}
	return nil
}

// uncount takes out of the planned status what it counts for the pods whose
// deletion was not made: the next pass sees them again and counts them then,
// so that each failure and preemption is counted once. A plan that finished
// the job keeps its counts: nothing is counted for a finished job again.
func uncount(plan *core.Plan, undone []core.Deletion) {
	if core.FinishedCondition(plan.Status.Conditions) != nil {
		return
	}
	for _, d := range undone {
		plan.Status.Failures -= d.Failures
		plan.Status.Preemptions -= d.Preemptions
	}
}

// ownPod reports whether the cached pod called name is this job's. A pod the
// cache does not hold yet counts as another's: the create is retried with
// back-off, which costs nothing when it was ours after all.
func (r *ElasticJobReconciler) ownPod(ctx context.Context, job *etjobv1.ElasticJob, name string) bool {
	p := &corev1.Pod{}
	if err := r.Get(ctx, types.NamespacedName{Namespace: job.Namespace, Name: name}, p); err != nil {
		return false
	}
	return metav1.IsControlledBy(p, job)
}

// forgetUncreated drops from the planned status the workers from the refused
// one on: they never existed, so their indices may be used again.
func forgetUncreated(plan *core.Plan, refused *corev1.Pod) {
	if refused.Labels[etjobv1.LabelRole] != etjobv1.RoleWorker {
		return
	}
	idx, err := strconv.ParseInt(refused.Labels[etjobv1.LabelWorkerIndex], 10, 32)
	if err != nil {
		return
	}
	st := &plan.Status
	st.NextWorkerIndex = int32(idx)
	// A new slice: the decided plan (the decision record) shares the old one.
	st.Workers = slices.DeleteFunc(slices.Clone(st.Workers), func(w etjobv1.WorkerStatus) bool {
		if w.Index >= int32(idx) && slices.Contains(plan.CreateWorkers, w.Index) {
			st.Replicas--
			return true
		}
		return false
	})
}

// withStatus returns the job with the status the plan is about to write, so
// that rendered pods carry the current attempt.
func withStatus(job *etjobv1.ElasticJob, plan *core.Plan) *etjobv1.ElasticJob {
	j := job.DeepCopy()
	j.Status = plan.Status
	return j
}

// ensureSupporting creates the Service (its EndpointSlice: publishEndpoints), the job's NetworkPolicy and PodDisruptionBudget, for torchrun the rendezvous store's Secret, and, for horovod, the membership
// ConfigMap and launcher RBAC when missing, and updates the ConfigMap when the
// membership changed. Reads go to the cache: a steady job costs no writes.
// torchrun's workers find each other through the rendezvous, not the
// ConfigMap, so a torchrun job has none: its membership is published in
// status alone, one write per change (issue #6's 2k+3 writes per scale-out).
func (r *ElasticJobReconciler) ensureSupporting(ctx context.Context, job *etjobv1.ElasticJob, plan *core.Plan) error {
	if meta.IsStatusConditionTrue(plan.Status.Conditions, etjobv1.ConditionComplete) ||
		meta.IsStatusConditionTrue(plan.Status.Conditions, etjobv1.ConditionFailed) {
		return nil
	}
	objs := []client.Object{render.Service(job), render.NetworkPolicy(job), render.DisruptionBudget(job)}
	if job.Spec.Framework != etjobv1.FrameworkHorovod {
		// Only created when missing: a new key every pass costs 32 random bytes.
		key := make([]byte, etjobv1.StoreSecretBytes)
		if _, err := rand.Read(key); err != nil {
			return fmt.Errorf("making the rendezvous store's secret: %w", err)
		}
		objs = append(objs, render.StoreSecret(job, key))
	}
	if job.Spec.Framework == etjobv1.FrameworkHorovod {
		if err := r.publishHosts(ctx, job, plan); err != nil {
			return err
		}
		sa, rb := render.LauncherRBAC(job)
		objs = append(objs, sa, rb)
	}
	for _, o := range objs {
		existing := o.DeepCopyObject().(client.Object)
		err := r.Get(ctx, client.ObjectKeyFromObject(o), existing)
		switch {
		case apierrors.IsNotFound(err):
			// AlreadyExists means the cache has not seen an object yet,
			// maybe an earlier job's: the retry reads it and checks its owner.
			if err := r.Create(ctx, o); err != nil {
				return fmt.Errorf("creating %T %s: %w", o, o.GetName(), err)
			}
		case err != nil:
			return err
		default:
			if err := r.ownOrReplace(ctx, job, existing); err != nil {
				return err
			}
			if svc, ok := existing.(*corev1.Service); ok && len(svc.Spec.Selector) > 0 {
				if err := r.dropSelector(ctx, svc); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// dropSelector upgrades a Service an earlier controller made, which
// selected the job's label (issue #42, C2): without its selector, and
// without the slices kube-controller-manager made for it (a cluster DNS
// merges every slice of a Service: theirs would keep the addresses of the
// upgrade's moment, a mirror pod's among them, for good). From then on its
// addresses are publishEndpoints'.
func (r *ElasticJobReconciler) dropSelector(ctx context.Context, svc *corev1.Service) error {
	svc = svc.DeepCopy()
	svc.Spec.Selector = nil
	if err := r.Update(ctx, svc); err != nil {
		return fmt.Errorf("dropping the selector of Service %s: %w", svc.Name, err)
	}
	var reader client.Reader = r.Client
	if r.APIReader != nil {
		reader = r.APIReader // kube's slices need not carry the job's label, which the cache selects by
	}
	var slices discoveryv1.EndpointSliceList
	if err := reader.List(ctx, &slices, client.InNamespace(svc.Namespace),
		client.MatchingLabels{discoveryv1.LabelServiceName: svc.Name}); err != nil {
		return fmt.Errorf("listing the slices of Service %s: %w", svc.Name, err)
	}
	for i := range slices.Items {
		s := &slices.Items[i]
		if s.Labels[discoveryv1.LabelManagedBy] == render.EndpointSliceManagedBy {
			continue
		}
		if err := r.Delete(ctx, s); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting EndpointSlice %s of Service %s: %w", s.Name, svc.Name, err)
		}
	}
	return nil
}

// publishEndpoints makes the job's EndpointSlice list the addresses of the
// pods it owns (render.EndpointSlice): created when missing, updated when
// they changed, otherwise no write. A slice of that name another owner holds
// is refused, as any other object the job needs (ownOrReplace).
func (r *ElasticJobReconciler) publishEndpoints(ctx context.Context, job *etjobv1.ElasticJob, owned []*corev1.Pod) error {
	want := render.EndpointSlice(job, owned)
	have := &discoveryv1.EndpointSlice{}
	err := r.Get(ctx, client.ObjectKeyFromObject(want), have)
	switch {
	case apierrors.IsNotFound(err):
		if err := r.Create(ctx, want); err != nil {
			return fmt.Errorf("creating EndpointSlice %s: %w", want.Name, err)
		}
		return nil
	case err != nil:
		return err
	}
	if err := r.ownOrReplace(ctx, job, have); err != nil {
		return err
	}
	if have.AddressType == want.AddressType && equality.Semantic.DeepEqual(have.Endpoints, want.Endpoints) &&
		equality.Semantic.DeepEqual(have.Ports, want.Ports) && maps.Equal(have.Labels, want.Labels) {
		return nil
	}
	if have.AddressType != want.AddressType { // immutable: a new slice
		if err := r.Delete(ctx, have); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("replacing EndpointSlice %s: %w", have.Name, err)
		}
		return fmt.Errorf("EndpointSlice %s had address type %s, want %s: replaced", have.Name, have.AddressType, want.AddressType)
	}
	up := have.DeepCopy()
	up.Endpoints, up.Ports, up.Labels = want.Endpoints, want.Ports, want.Labels
	if err := r.Update(ctx, up); err != nil {
		return fmt.Errorf("updating EndpointSlice %s: %w", up.Name, err)
	}
	return nil
}

// ownOrReplace checks that an object the job needs is the job's own. One
// that an earlier job of the same name left behind (deleted, its children
// not yet garbage collected) would otherwise be adopted, and later collected
// under the new job: it is deleted, and the error retries the pass, which
// creates the job's own.
func (r *ElasticJobReconciler) ownOrReplace(ctx context.Context, job *etjobv1.ElasticJob, o client.Object) error {
	if metav1.IsControlledBy(o, job) {
		return nil
	}
	ref := metav1.GetControllerOf(o)
	// The group too (L5): another API's ElasticJob of that name is not an
	// earlier job of ours, and its objects are not ours to delete.
	if ref == nil || ref.Kind != "ElasticJob" || ref.Name != job.Name || !isOurGroup(ref.APIVersion) {
		return fmt.Errorf("%T %s exists and is not controlled by ElasticJob %s: delete or rename it", o, o.GetName(), job.Name)
	}
	uid := o.GetUID()
	if err := r.Delete(ctx, o, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting %T %s of an earlier job %s (uid %s): %w", o, o.GetName(), job.Name, ref.UID, err)
	}
	return fmt.Errorf("%T %s belonged to an earlier job %s (uid %s): deleted, creating the job's own", o, o.GetName(), job.Name, ref.UID)
}

// isOurGroup reports whether apiVersion is of etjob's API group.
func isOurGroup(apiVersion string) bool {
	gv, err := schema.ParseGroupVersion(apiVersion)
	return err == nil && gv.Group == etjobv1.GroupVersion.Group
}

// publishHosts creates the membership ConfigMap of a horovod job, or updates
// it when the membership changed.
func (r *ElasticJobReconciler) publishHosts(ctx context.Context, job *etjobv1.ElasticJob, plan *core.Plan) error {
	want := render.ConfigMap(job, plan.Status.Membership)
	cm := &corev1.ConfigMap{}
	switch err := r.Get(ctx, client.ObjectKeyFromObject(want), cm); {
	case apierrors.IsNotFound(err):
		if err := r.Create(ctx, want); err != nil {
			return fmt.Errorf("creating ConfigMap %s: %w", want.Name, err)
		}
	case err != nil:
		return err
	case !metav1.IsControlledBy(cm, job):
		return r.ownOrReplace(ctx, job, cm)
	case !equality.Semantic.DeepEqual(cm.Data, want.Data):
		cm.Data = want.Data
		if err := r.Update(ctx, cm); err != nil {
			return fmt.Errorf("publishing membership in ConfigMap %s: %w", want.Name, err)
		}
	}
	return nil
}

// createRefusedError is an API refusal to create a pod (quota, admission).
type createRefusedError struct {
	pod string
	err error
}

func (e *createRefusedError) Error() string {
	return fmt.Sprintf("creating pod %s: %v", e.pod, e.err)
}
func (e *createRefusedError) Unwrap() error { return e.err }

// writeStatus writes the planned status once, if it changed. An API refusal
// to create pods shows as the CreateRefused condition with the server's words.
func (r *ElasticJobReconciler) writeStatus(ctx context.Context, job *etjobv1.ElasticJob, st etjobv1.ElasticJobStatus, applyErr error) error {
	var refused *createRefusedError
	now := metav1.NewTime(r.Clock.Now())
	switch {
	case errors.As(applyErr, &refused):
		// Invalid (422) is the pod template's fault and fails the job on
		// the next pass (core: invalidPodTemplate); anything else (a quota,
		// an admission webhook) may pass later.
		reason := etjobv1.ReasonPodCreateRefused
		if apierrors.IsInvalid(refused.err) {
			reason = etjobv1.ReasonPodTemplateInvalid
		}
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: etjobv1.ConditionCreateRefused, Status: metav1.ConditionTrue,
			Reason: reason, Message: refused.Error(), ObservedGeneration: job.Generation, LastTransitionTime: now})
	case applyErr == nil && meta.IsStatusConditionTrue(st.Conditions, etjobv1.ConditionCreateRefused):
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: etjobv1.ConditionCreateRefused, Status: metav1.ConditionFalse,
			Reason: etjobv1.ReasonPodCreateAccepted, ObservedGeneration: job.Generation, LastTransitionTime: now})
	}
	if equality.Semantic.DeepEqual(job.Status, st) {
		return nil
	}
	base := job.Status
	job = job.DeepCopy()
	job.Status = st
	err := r.Status().Update(ctx, job)
	if apierrors.IsConflict(err) && r.APIReader != nil {
		// Someone wrote the job since it was read: an HPA or kubectl scale
		// writing spec.replicas, most often. The pods this pass deleted
		// are gone, so a retry from scratch would lose what the pass
		// counted and recorded for them. Only this controller writes the
		// status: when the server's is still the one the pass started
		// from, the pass's status goes on top of the new object.
		live := &etjobv1.ElasticJob{}
		if gerr := r.APIReader.Get(ctx, client.ObjectKeyFromObject(job), live); gerr == nil &&
			live.UID == job.UID && equality.Semantic.DeepEqual(live.Status, base) {
			live.Status = st
			job, err = live, r.Status().Update(ctx, live)
		}
	}
	if err != nil {
		return err
	}
	r.expectations.StatusWritten(client.ObjectKeyFromObject(job), job.ResourceVersion)
	return nil
}

func (r *ElasticJobReconciler) emit(job *etjobv1.ElasticJob, evs []core.Event) {
	for _, e := range evs {
		t := corev1.EventTypeNormal
		if e.Warning {
			t = corev1.EventTypeWarning
		}
		r.Recorder.Eventf(job, nil, t, string(e.Reason), string(e.Reason), "%s", e.Message)
	}
}

func (r *ElasticJobReconciler) deleteJob(ctx context.Context, job *etjobv1.ElasticJob) error {
	log.FromContext(ctx).Info("deleting finished job after ttlSecondsAfterFinished")
	return client.IgnoreNotFound(r.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationBackground),
		client.Preconditions{UID: &job.UID}))
}
