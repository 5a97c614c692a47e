// Package driver drives one ElasticJob on the local cluster: it submits the
// digits example as typed objects, reads and waits on the job, and reads the
// ranks' training logs. The demo (internal/demo) and the chaos run
// (internal/chaos) tell their stories through it.
package driver

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/localcluster"
	"github.com/etjob/etjob/internal/scheme"
)

// Driver drives the job Namespace/Job on Cluster.
type Driver struct {
	Cluster        *localcluster.Cluster
	Client         client.Client
	Clientset      *kubernetes.Clientset
	Namespace, Job string
	// Interval is how often WaitFor polls.
	Interval time.Duration
}

// New returns a driver of namespace/job on cl that polls every interval.
func New(cl *localcluster.Cluster, namespace, job string, interval time.Duration) (*Driver, error) {
	cs, err := cl.Clientset()
	if err != nil {
		return nil, err
	}
	cfg, err := cl.RESTConfig()
	if err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		return nil, err
	}
	return &Driver{Cluster: cl, Client: c, Clientset: cs, Namespace: namespace, Job: job, Interval: interval}, nil
}

// Get reads the job.
func (d *Driver) Get(ctx context.Context) (*etjobv1.ElasticJob, error) {
	j := &etjobv1.ElasticJob{}
	return j, d.Client.Get(ctx, types.NamespacedName{Namespace: d.Namespace, Name: d.Job}, j)
}

// Logs are the job's training log lines so far, in time order.
func (d *Driver) Logs() ([]LogLine, error) { return ReadLogs(d.Cluster.Dir, d.Namespace, d.Job) }

// MaxStep is the highest training step any rank logged (0 before any).
func (d *Driver) MaxStep() int {
	lines, _ := d.Logs()
	return MaxStep(lines)
}

// WaitFor calls f every d.Interval until it reports true or an error (see
// the function WaitFor).
func (d *Driver) WaitFor(ctx context.Context, what string, timeout time.Duration, f func() (bool, error)) error {
	return WaitFor(ctx, what, timeout, d.Interval, f)
}

// WaitFor calls f every interval until it reports true or an error, the
// timeout passes (an error naming what was awaited) or ctx ends.
func WaitFor(ctx context.Context, what string, timeout, interval time.Duration, f func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := f()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s", timeout, what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}

// Failed returns the job's Failed condition as an error, or nil when it has
// not failed.
func Failed(j *etjobv1.ElasticJob) error {
	if c := meta.FindStatusCondition(j.Status.Conditions, etjobv1.ConditionFailed); c != nil && c.Status == metav1.ConditionTrue {
		return fmt.Errorf("the job failed: %s: %s", c.Reason, c.Message)
	}
	return nil
}
