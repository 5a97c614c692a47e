package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// How the new workers of a scale event become Ready.
const (
	// modeKwok: kwok makes each new worker Ready as soon as the scheduler
	// bound it, so the controller often sees several at once (best case).
	modeKwok = "kwok"
	// modeOneByOne: the benchmark makes the new workers Ready one at a time,
	// each once the controller published the previous one and went quiet,
	// as on real nodes where containers start seconds apart (worst case).
	modeOneByOne = "one-by-one"
)

// plannedEvent is one scale event: its mode, k, and the job (by number).
type plannedEvent struct {
	mode string
	k    int
	job  int
}

// eventPlan assigns every scale event its own job, in the order they run.
func eventPlan(o *options) []plannedEvent {
	var out []plannedEvent
	for _, m := range o.modes {
		for _, k := range o.ks {
			for range o.repeat {
				out = append(out, plannedEvent{mode: m, k: k, job: len(out)})
			}
		}
	}
	return out
}

// scaleEvents runs the scale events of eventPlan, one at a time.
func scaleEvents(ctx context.Context, o *options, c *cluster, res *result) error {
	before, err := scrape(c.metricsURL)
	if err != nil {
		return err
	}
	for _, pe := range eventPlan(o) {
		ev, err := scaleEvent(ctx, o, c, pe)
		if err != nil {
			return err
		}
		logf("scale-out k=%d of %s (%s): %d writes (goal ≤ %d), %.2fs to members", ev.K, ev.Job, ev.Mode, ev.Writes, ev.Goal, ev.Seconds)
		res.Scale = append(res.Scale, ev)
	}
	after, err := scrape(c.metricsURL)
	if err != nil {
		return err
	}
	h := after.Reconcile.minus(before.Reconcile)
	res.ScaleReconciles, res.ScaleReconcileMedianMs, res.ScaleReconcileP99Ms = int(h.count()), 1000*h.quantile(0.5), 1000*h.quantile(0.99)
	return nil
}

// scaleEvent writes spec.replicas + k through /scale and counts the
// controller's requests until the new workers are members and it wrote
// nothing more for -settle.
func scaleEvent(ctx context.Context, o *options, c *cluster, pe plannedEvent) (scaleResult, error) {
	name, k := jobName(pe.job), pe.k
	ev := scaleResult{Mode: pe.mode, K: k, Job: name, Goal: 2*k + 3}
	if quiet, err := c.audit.waitQuiet(2*time.Second, 30*time.Second); err != nil {
		return ev, err
	} else if !quiet {
		logf("warning: the controller kept writing for 30s before the scale event of %s", name)
	}
	mark, err := c.audit.mark()
	if err != nil {
		return ev, err
	}
	job := &etjobv1.ElasticJob{}
	key := types.NamespacedName{Namespace: namespace, Name: name}
	if err := c.admin.Get(ctx, key, job); err != nil {
		return ev, err
	}
	target, first := int(job.Spec.Replicas)+k, int(job.Status.NextWorkerIndex)
	sc := &autoscalingv1.Scale{}
	if err := c.admin.SubResource("scale").Get(ctx, job, sc); err != nil {
		return ev, fmt.Errorf("reading /scale of %s: %w", name, err)
	}
	sc.Spec.Replicas = int32(target)
	before := *job.Status.DeepCopy() // job is re-read below
	c.tracer.start(name)
	defer c.tracer.stop(before)
	start := time.Now()
	if err := c.admin.SubResource("scale").Update(ctx, job, client.WithSubResourceBody(sc)); err != nil {
		return ev, fmt.Errorf("writing /scale of %s: %w", name, err)
	}
	// from is when the last new worker became Ready, as far as the benchmark
	// knows: with kwok, the /scale write (which includes scheduling and kwok);
	// one by one, when the benchmark made the last one Ready.
	from := start
	if pe.mode == modeOneByOne {
		if from, err = readyOneByOne(ctx, o, c, name, first, k); err != nil {
			return ev, err
		}
	}
	deadline := from.Add(3 * time.Minute)
	for {
		if err := c.admin.Get(ctx, key, job); err != nil {
			return ev, err
		}
		if len(job.Status.Membership.Hosts) == target {
			break
		}
		if time.Now().After(deadline) {
			return ev, fmt.Errorf("scale-out of %s by %d: %d members after 3m, want %d", name, k, len(job.Status.Membership.Hosts), target)
		}
		time.Sleep(20 * time.Millisecond)
	}
	member := time.Now()
	ev.Seconds = member.Sub(from).Seconds()
	if _, err := c.audit.waitQuiet(o.settle, 30*time.Second); err != nil {
		return ev, err
	}
	rs, err := c.audit.since(mark)
	if err != nil {
		return ev, err
	}
	ev.StatusChanges = c.tracer.stop(before)
	s := summarize(rs)
	ev.Writes, ev.EventWrites, ev.Gets, ev.Lists, ev.ByKind = s.Writes, s.EventWrites, s.Gets, s.Lists, s.ByKind
	for _, r := range rs {
		if r.countedWrite() && r.At.After(member) {
			ev.WritesAfterMembers++
		}
		if r.isWrite() {
			ev.Requests = append(ev.Requests, r)
		}
	}
	ev.start = start
	ev.Pass = ev.Writes <= ev.Goal
	return ev, nil
}

// publishWait bounds how long readyOneByOne waits for the controller to
// publish one new worker before it makes the next Ready: a controller that
// publishes each Ready worker does so in milliseconds; one that batches the
// joiners of a scale-out (until all are Ready, or a deadline) must not stall
// the benchmark.
const publishWait = 10 * time.Second

// readyOneByOne waits until the k new workers (index ≥ first) of job exist
// and are bound, then makes them Running and Ready one at a time, as kwok
// would: each once the controller wrote nothing for -settle and, but for the
// last, published the previous one as a member (or publishWait passed). It
// returns when it made the last one Ready.
func readyOneByOne(ctx context.Context, o *options, c *cluster, job string, first, k int) (time.Time, error) {
	var pods []corev1.Pod
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var list corev1.PodList
		if err := c.admin.List(ctx, &list, client.InNamespace(namespace),
			client.MatchingLabels{etjobv1.LabelJobName: job, etjobv1.LabelRole: etjobv1.RoleWorker}); err != nil {
			return time.Time{}, err
		}
		pods = pods[:0]
		for _, p := range list.Items {
			if workerIndex(&p) >= first && p.Spec.NodeName != "" && p.DeletionTimestamp == nil {
				pods = append(pods, p)
			}
		}
		if len(pods) == k {
			break
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("%s: %d of %d new workers bound after 3m", job, len(pods), k)
		}
		time.Sleep(50 * time.Millisecond)
	}
	slices.SortFunc(pods, func(a, b corev1.Pod) int { return workerIndex(&a) - workerIndex(&b) })
	var last time.Time
	for i := range pods {
		if _, err := c.audit.waitQuiet(o.settle, time.Minute); err != nil {
			return last, err
		}
		if err := markReady(ctx, c, &pods[i]); err != nil {
			return last, err
		}
		last = time.Now()
		if i == len(pods)-1 {
			break
		}
		for !published(ctx, c, job, pods[i].Name) && time.Since(last) < publishWait {
			time.Sleep(20 * time.Millisecond)
		}
	}
	return last, nil
}

func workerIndex(p *corev1.Pod) int {
	i, err := strconv.Atoi(p.Labels[etjobv1.LabelWorkerIndex])
	if err != nil {
		return -1
	}
	return i
}

// published: the job's status.membership lists the worker.
func published(ctx context.Context, c *cluster, job, worker string) bool {
	j := &etjobv1.ElasticJob{}
	if err := c.admin.Get(ctx, types.NamespacedName{Namespace: namespace, Name: job}, j); err != nil {
		return false
	}
	return slices.ContainsFunc(j.Status.Membership.Hosts, func(h string) bool {
		name, _, _ := strings.Cut(h, ":")
		return name == worker
	})
}

var podIPs atomic.Int32

// markReady makes a bound pod Running and Ready with the status kwok's
// pod-ready stage writes.
func markReady(ctx context.Context, c *cluster, pod *corev1.Pod) error {
	ip := podIPs.Add(1)
	for range 10 {
		p := &corev1.Pod{}
		if err := c.admin.Get(ctx, client.ObjectKeyFromObject(pod), p); err != nil {
			return err
		}
		now := metav1.Now()
		p.Status.Phase = corev1.PodRunning
		p.Status.StartTime = &now
		p.Status.PodIP = fmt.Sprintf("10.255.%d.%d", ip/250, ip%250+1)
		p.Status.PodIPs = []corev1.PodIP{{IP: p.Status.PodIP}}
		p.Status.Conditions = nil
		for _, t := range []corev1.PodConditionType{corev1.PodInitialized, corev1.PodReady, corev1.ContainersReady} {
			p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: now})
		}
		p.Status.ContainerStatuses = nil
		for _, ct := range p.Spec.Containers {
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
				Name: ct.Name, Image: ct.Image, Ready: true, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}})
		}
		err := c.admin.Status().Update(ctx, p)
		if err == nil {
			return nil
		}
		if !apierrors.IsConflict(err) {
			return fmt.Errorf("making %s Ready: %w", pod.Name, err)
		}
	}
	return fmt.Errorf("making %s Ready: conflicts 10 times", pod.Name)
}
