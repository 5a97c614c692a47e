package localcluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/etjob/etjob/internal/core"
)

// componentTimeout bounds each wait for the controller or an agent.
const componentTimeout = 2 * time.Minute

// WaitComponents waits until the chart's components serve: a controller
// replica holds the leader Lease, and every Ready node's agent answers on
// its node's address.
func (c *Cluster) WaitComponents(ctx context.Context) error {
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	leader, err := c.WaitLeader(ctx, "")
	if err != nil {
		return err
	}
	c.logf("  %-26s leader %s", "etjob-controller", leader)
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for i := range nodes.Items {
		if core.NodeReady(&nodes.Items[i]) {
			if err := c.waitAgent(ctx, cs, nodes.Items[i].Name); err != nil {
				return err
			}
		}
	}
	return nil
}

// Leader returns the controller replica (its pod's name, where the Lease
// names one) that holds the leader Lease, or "" when none does.
func (c *Cluster) Leader(ctx context.Context) (string, error) {
	cs, err := c.Clientset()
	if err != nil {
		return "", err
	}
	return leader(ctx, cs)
}

func leader(ctx context.Context, cs kubernetes.Interface) (string, error) {
	lease, err := cs.CoordinationV1().Leases(ControllerNamespace).Get(ctx, LeaseName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return LeaseHolder(lease, time.Now()), nil
}

// LeaseHolder returns the controller replica (its pod's name) that holds
// lease at now, or "" when none does or its term ran out.
func LeaseHolder(lease *coordinationv1.Lease, now time.Time) string {
	holder := ""
	if lease.Spec.HolderIdentity != nil {
		holder = *lease.Spec.HolderIdentity
	}
	// controller-runtime's identity is "<hostname>_<uuid>", and a process
	// pod's hostname is its name.
	holder, _, _ = strings.Cut(holder, "_")
	if holder == "" || lease.Spec.RenewTime == nil || lease.Spec.LeaseDurationSeconds == nil ||
		now.Sub(lease.Spec.RenewTime.Time) > time.Duration(*lease.Spec.LeaseDurationSeconds)*time.Second {
		return ""
	}
	return holder
}

// WaitLeader waits until a controller replica other than not holds the
// leader Lease and returns it.
func (c *Cluster) WaitLeader(ctx context.Context, not string) (string, error) {
	cs, err := c.Clientset()
	if err != nil {
		return "", err
	}
	var l string
	err = poll(ctx, componentTimeout, func() bool {
		var lerr error
		l, lerr = leader(ctx, cs)
		return lerr == nil && l != "" && l != not
	})
	if errors.Is(err, errPollTimeout) {
		return "", fmt.Errorf("no etjob controller replica took the leader Lease %s/%s within %v (last holder %q; kubectl -n %s get pods,events)",
			ControllerNamespace, LeaseName, componentTimeout, l, ControllerNamespace)
	}
	return l, err
}

// agentPod returns the agent pod bound to node, if any.
func agentPod(ctx context.Context, cs kubernetes.Interface, node string) (*corev1.Pod, error) {
	pods, err := cs.CoreV1().Pods(AgentNamespace).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=etjob-agent", FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return nil, err
	}
	for i := range pods.Items {
		if pods.Items[i].DeletionTimestamp == nil {
			return &pods.Items[i], nil
		}
	}
	return nil, nil
}

// waitAgent waits until node's agent pod runs and its signal endpoint
// answers at the node's address.
func (c *Cluster) waitAgent(ctx context.Context, cs kubernetes.Interface, node string) error {
	n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return err
	}
	url := fmt.Sprintf("http://%s:%d/healthz", internalIP(n), AgentPort)
	client := &http.Client{Timeout: time.Second}
	err = poll(ctx, componentTimeout, func() bool {
		pod, err := agentPod(ctx, cs, node)
		if err != nil || pod == nil || pod.Status.Phase != corev1.PodRunning {
			return false
		}
		resp, err := client.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	if errors.Is(err, errPollTimeout) {
		return fmt.Errorf("the etjob agent of node %s did not answer at %s within %v (kubectl -n %s get pods -o wide)", node, url, componentTimeout, AgentNamespace)
	}
	return err
}

// RestartController deletes the controller replica that leads, as a crash
// or an eviction would take it; its Deployment makes a new one, and the
// standby replica takes the Lease over. It returns the new leader.
func (c *Cluster) RestartController(ctx context.Context) (string, error) {
	cs, err := c.Clientset()
	if err != nil {
		return "", err
	}
	old, err := c.WaitLeader(ctx, "")
	if err != nil {
		return "", err
	}
	if err := cs.CoreV1().Pods(ControllerNamespace).Delete(ctx, old, metav1.DeleteOptions{}); err != nil {
		return "", fmt.Errorf("deleting the leading controller pod %s: %w", old, err)
	}
	return c.WaitLeader(ctx, old)
}

// RestartAgent deletes node's agent pod, as a crash or an upgrade would
// restart it; its DaemonSet makes a new one, which is waited for.
func (c *Cluster) RestartAgent(ctx context.Context, node string) error {
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	pod, err := agentPod(ctx, cs, node)
	if err != nil {
		return err
	}
	if pod == nil {
		return fmt.Errorf("restart the agent of %s: node %s has no agent pod", node, node)
	}
	if err := cs.CoreV1().Pods(AgentNamespace).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		return err
	}
	err = poll(ctx, componentTimeout, func() bool {
		p, err := agentPod(ctx, cs, node)
		return err == nil && p != nil && p.UID != pod.UID
	})
	if errors.Is(err, errPollTimeout) {
		return fmt.Errorf("no new agent pod on %s within %v", node, componentTimeout)
	}
	if err != nil {
		return err
	}
	return c.waitAgent(ctx, cs, node)
}

// errPollTimeout is poll's error when the condition did not hold in time.
var errPollTimeout = errors.New("timed out")

// poll checks done every 300 ms until it holds (nil), ctx ends (its error)
// or timeout passes (errPollTimeout); the caller says what was waited for.
func poll(ctx context.Context, timeout time.Duration, done func() bool) error {
	deadline := time.Now().Add(timeout)
	for !done() {
		if time.Now().After(deadline) {
			return errPollTimeout
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(300 * time.Millisecond):
		}
	}
	return nil
}

// KillLeader kills the processes of the leading controller replica at once
// (SIGKILL, as a crash or an OOM kill takes them): it releases nothing, so
// the standby replica takes the Lease over only once it expired. The pod
// stays; its node restarts the container after its back-off, as a kubelet
// does. It returns the killed replica's name.
func (c *Cluster) KillLeader(ctx context.Context) (string, error) {
	name, err := c.WaitLeader(ctx, "")
	if err != nil {
		return "", err
	}
	killers, err := c.ControllerKillers(ctx)
	if err != nil {
		return "", err
	}
	kill, ok := killers[name]
	if !ok {
		return "", fmt.Errorf("kill the leader %s: no controller pod of that name", name)
	}
	return name, kill()
}

// ControllerKillers maps each controller replica's pod name to a function
// that kills that replica's processes as KillLeader does, reading only its
// node's pid files: no request to the API server. A test that must kill
// the leader at one moment (the first pod of a scale-out) resolves them
// before it, as asking the API server at that moment takes seconds on a
// loaded machine, by which time the moment has passed.
func (c *Cluster) ControllerKillers(ctx context.Context) (map[string]func() error, error) {
	cs, err := c.Clientset()
	if err != nil {
		return nil, err
	}
	pods, err := cs.CoreV1().Pods(ControllerNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string]func() error{}
	for _, pod := range pods.Items {
		if pod.Spec.NodeName == "" || pod.DeletionTimestamp != nil {
			continue
		}
		name, node := pod.Name, pod.Spec.NodeName
		glob := c.path("nodes", node, "pods", fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID), "*.pid")
		out[name] = func() error {
			pids, _ := filepath.Glob(glob)
			killed := 0
			for _, f := range pids {
				if pid := readPid(f); alive(pid) {
					_ = syscall.Kill(-pid, syscall.SIGKILL)
					killed++
				}
			}
			if killed == 0 {
				return fmt.Errorf("kill the controller replica %s: no process of it runs on %s", name, node)
			}
			return nil
		}
	}
	return out, nil
}
