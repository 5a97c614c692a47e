package localcluster

import (
	"context"
	"fmt"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// DrainRetry is how long Drain waits before it asks again for an eviction a
// PodDisruptionBudget refused (kubectl drain waits 5 s).
const DrainRetry = 500 * time.Millisecond

// Drained is what a Drain did: the pods it evicted, by name, with how long
// after the cordon each was gone, and how many evictions a budget refused.
type Drained struct {
	Pods    map[string]time.Duration
	Refused int
	Took    time.Duration
}

// Cordon marks a node unschedulable (kubectl cordon), or schedulable again
// (kubectl uncordon).
func (c *Cluster) Cordon(ctx context.Context, name string, cordon bool) error {
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	patch := fmt.Sprintf(`{"spec":{"unschedulable":%t}}`, cordon)
	if _, err := cs.CoreV1().Nodes().Patch(ctx, name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("node %s: %w", name, err)
	}
	return nil
}

// Drain drains a node as kubectl drain --ignore-daemonsets does: it cordons
// it, then evicts each of its pods but the DaemonSets' through the Eviction
// API (policy/v1), asking again every DrainRetry while a PodDisruptionBudget
// refuses, and returns once every pod is gone. The context bounds it.
func (c *Cluster) Drain(ctx context.Context, name string) (Drained, error) {
	start := time.Now()
	out := Drained{Pods: map[string]time.Duration{}}
	cs, err := c.Clientset()
	if err != nil {
		return out, err
	}
	if err := c.Cordon(ctx, name, true); err != nil {
		return out, err
	}
	list, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", name).String()})
	if err != nil {
		return out, err
	}
	var pods []corev1.Pod
	for _, p := range list.Items {
		if !ownedByDaemonSet(&p) {
			pods = append(pods, p)
		}
	}
	sort.Slice(pods, func(i, j int) bool { return pods[i].Name < pods[j].Name })
	evicted := map[types.UID]bool{}
	for len(out.Pods) < len(pods) {
		for _, p := range pods {
			if _, done := out.Pods[p.Name]; done {
				continue
			}
			if !evicted[p.UID] {
				switch err := evict(ctx, cs, &p); {
				case err == nil:
					evicted[p.UID] = true
				case apierrors.IsTooManyRequests(err):
					out.Refused++
				case apierrors.IsNotFound(err):
					evicted[p.UID] = true
				default:
					return out, fmt.Errorf("evicting %s/%s: %w", p.Namespace, p.Name, err)
				}
			}
			cur, err := cs.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) || (err == nil && cur.UID != p.UID) {
				out.Pods[p.Name] = time.Since(start)
			}
		}
		if len(out.Pods) == len(pods) {
			break
		}
		select {
		case <-ctx.Done():
			return out, fmt.Errorf("draining %s: %d of %d pods still there: %w", name, len(pods)-len(out.Pods), len(pods), ctx.Err())
		case <-time.After(DrainRetry):
		}
	}
	out.Took = time.Since(start)
	c.logf("node %s drained: %d pods gone in %s, %d evictions refused by a disruption budget", name, len(pods), out.Took.Round(time.Millisecond), out.Refused)
	return out, nil
}

func evict(ctx context.Context, cs kubernetes.Interface, p *corev1.Pod) error {
	return cs.PolicyV1().Evictions(p.Namespace).Evict(ctx, &policyv1.Eviction{
		ObjectMeta:    metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace},
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}},
	})
}

func ownedByDaemonSet(p *corev1.Pod) bool {
	for _, o := range p.OwnerReferences {
		if o.Kind == "DaemonSet" {
			return true
		}
	}
	return false
}
