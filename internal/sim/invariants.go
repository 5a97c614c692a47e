package sim

import (
	"fmt"
	"slices"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/core"
)

// check holds a plan to the design's rules (docs/design.md), computed independently of the
// decision core: it only deletes and signals pods that exist; members are
// ready workers on live nodes that were not told to leave and are not on a
// noticed node, or that train through their notice until their stop time;
// Running
// means minReplicas <= members <= maxReplicas; the generation moves by one
// exactly when the hosts change; no worker name is created twice; never more
// than maxReplicas workers are alive.
func (w *elastic) check(prev etjobv1.ElasticJobStatus, plan core.Plan) error {
	st := plan.Status
	spec := w.job.Spec
	deleted, signaled := map[string]bool{}, map[string]bool{}
	for _, d := range plan.Delete {
		if w.pods[d.Name] == nil {
			return fmt.Errorf("plan deletes %s, which does not exist", d.Name)
		}
		deleted[d.Name] = true
	}
	for _, s := range plan.Signal {
		if w.pods[s.Pod] == nil {
			return fmt.Errorf("plan signals %s, which does not exist", s.Pod)
		}
		signaled[s.Pod] = true
	}
	if st.Membership.Generation < prev.Membership.Generation {
		return fmt.Errorf("generation went back %d -> %d", prev.Membership.Generation, st.Membership.Generation)
	}
	changed := !slices.Equal(prev.Membership.Hosts, st.Membership.Hosts)
	if changed != (st.Membership.Generation == prev.Membership.Generation+1) || st.Membership.Generation > prev.Membership.Generation+1 {
		return fmt.Errorf("hosts %v -> %v but generation %d -> %d", prev.Membership.Hosts, st.Membership.Hosts,
			prev.Membership.Generation, st.Membership.Generation)
	}
	leads := map[string]time.Duration{}
	for _, s := range plan.Signal {
		leads[s.Pod] = s.StopLead
	}
	for _, name := range hostNames(st.Membership.Hosts) {
		p := w.pods[name]
		if p == nil || deleted[name] {
			return fmt.Errorf("member %s is gone or deleted", name)
		}
		n := w.nodes[p.Spec.NodeName]
		if !ready(p) || n == nil {
			return fmt.Errorf("member %s is not a ready worker on a live node", name)
		}
		if !signaled[name] && !w.leaving(p) {
			continue
		}
		// A leaver stays a member only on a noticed node, until its stop
		// time: at least the stop margin before the deadline.
		lead, ok := leads[name]
		if !ok {
			n, _ := strconv.Atoi(p.Annotations[etjobv1.AnnotationStopLead])
			lead = time.Duration(n) * time.Second
		}
		deadline, err := time.Parse(time.RFC3339, n.Annotations[etjobv1.AnnotationNodeNotice])
		if err != nil || lead < w.p.StopMargin || lead == 0 || !w.at().Before(deadline.Add(-lead)) {
			return fmt.Errorf("member %s is leaving and not training through a notice (lead %s, deadline %q)",
				name, lead, n.Annotations[etjobv1.AnnotationNodeNotice])
		}
	}
	if meta.IsStatusConditionTrue(st.Conditions, etjobv1.ConditionRunning) {
		if n := int32(len(st.Membership.Hosts)); n < spec.MinReplicas || n > spec.MaxReplicas {
			return fmt.Errorf("running with %d members, min %d max %d", n, spec.MinReplicas, spec.MaxReplicas)
		}
	}
	alive := len(plan.CreateWorkers)
	for _, i := range plan.CreateWorkers {
		if name := core.WorkerName(w.job.Name, i); w.created[name] {
			return fmt.Errorf("worker name %s created twice", name)
		}
	}
	for name, p := range w.pods {
		if p.Labels[etjobv1.LabelRole] == etjobv1.RoleWorker && !terminal(p) && !deleted[name] {
			alive++
		}
	}
	if alive > int(spec.MaxReplicas) {
		return fmt.Errorf("%d workers alive after the plan, max %d", alive, spec.MaxReplicas)
	}
	if st.Failures > 0 {
		return fmt.Errorf("%d failures counted: every loss in a trace is a preemption", st.Failures)
	}
	return nil
}
