package localcluster

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// RestartComponentAfter is RestartComponent with the process down for
// `down` between its stop and its start (a kube-apiserver outage).
func (c *Cluster) RestartComponentAfter(ctx context.Context, name string, down time.Duration) error {
	switch {
	case name == "etjob-controller":
		_, err := c.RestartController(ctx)
		return err
	case strings.HasPrefix(name, "agent-"):
		return c.RestartAgent(ctx, strings.TrimPrefix(name, "agent-"))
	}
	pid := readPid(c.path("pids", name+".pid"))
	if !alive(pid) {
		return fmt.Errorf("restart %s: it does not run", name)
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return fmt.Errorf("restart %s: %w", name, err)
	}
	argv := strings.Split(strings.TrimSuffix(string(raw), "\x00"), "\x00")
	if err := c.stop(name, syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case <-time.After(down):
	}
	if err := c.start(name, argv[0], argv[1:]...); err != nil {
		return err
	}
	if name == "kube-apiserver" {
		token, err := c.ensureSecrets()
		if err != nil {
			return err
		}
		return waitHTTP(ctx, fmt.Sprintf("https://127.0.0.1:%d/readyz", APIServerPort), token, 120*time.Second)
	}
	return nil
}

// FreezeNode stops (SIGSTOP) every pod process of a node, or lets them go on
// again (SIGCONT) when frozen is false: the gray failure of a node whose
// kubelet still reports Ready while its processes answer nothing, and whose
// TCP connections stay open. It returns how many process groups it signalled.
func (c *Cluster) FreezeNode(name string, frozen bool) (int, error) {
	if _, err := os.Stat(c.path("nodes", name)); err != nil {
		return 0, fmt.Errorf("node %s: %w", name, err)
	}
	sig := syscall.SIGCONT
	if frozen {
		sig = syscall.SIGSTOP
	}
	n := 0
	for _, pid := range c.podPids(name) {
		if syscall.Kill(-pid, sig) == nil || syscall.Kill(pid, sig) == nil {
			n++
		}
	}
	return n, nil
}

// KillPodProcess sends sig to one process of a pod: the one whose PID is pid
// inside the pod's PID namespace (what the pod's own logs say, os.getpid()
// in a worker), found among the processes of the pod's containers on the
// nodes' process groups. It returns the process's PID on the host. One
// rank of a pod of several dies so, its node and pod staying.
func (c *Cluster) KillPodProcess(namespace, pod string, pid int, sig syscall.Signal) (int, error) {
	dirs, _ := filepath.Glob(c.path("nodes", "*", "pods", namespace+"_"+pod+"_*"))
	groups := map[int]bool{}
	for _, d := range dirs {
		files, _ := filepath.Glob(filepath.Join(d, "*.pid"))
		for _, f := range files {
			if g := readPid(f); g > 0 {
				groups[g] = true
			}
		}
	}
	if len(groups) == 0 {
		return 0, fmt.Errorf("pod %s/%s: no running container on this cluster's nodes", namespace, pod)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/status")
	for _, status := range procs {
		host, nsPid, group, ok := procIDs(status)
		if ok && groups[group] && nsPid == pid {
			return host, syscall.Kill(host, sig)
		}
	}
	return 0, fmt.Errorf("pod %s/%s: no process %d in its PID namespace", namespace, pod, pid)
}

// procIDs reads a /proc/<pid>/status: the process's PID on the host, its
// PID in its own (innermost) namespace, and its process group (from
// /proc/<pid>/stat).
func procIDs(status string) (host, inner, group int, ok bool) {
	b, err := os.ReadFile(status)
	if err != nil {
		return 0, 0, 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "NSpid:" {
			host, _ = strconv.Atoi(f[1])
			inner, _ = strconv.Atoi(f[len(f)-1])
		}
	}
	stat, err := os.ReadFile(filepath.Join(filepath.Dir(status), "stat"))
	if err != nil || host == 0 {
		return 0, 0, 0, false
	}
	// pid (comm) state ppid pgrp ...: comm may hold spaces, so after its ')'
	rest := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if len(rest) < 3 {
		return 0, 0, 0, false
	}
	group, _ = strconv.Atoi(rest[2])
	return host, inner, group, true
}

// Reclaim takes a node back as its cloud would: with notice > 0 the node's
// emulated metadata service announces the reclamation in its provider's
// documented format (Announce: the node agent reads it and marks the Node),
// then at the deadline every process of the node dies at once (SIGKILL, like
// a vanished VM) and the Node is removed. notice 0 is a hard loss.
func (c *Cluster) Reclaim(ctx context.Context, name string, notice time.Duration) error {
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	if _, err := c.node(ctx, name); err != nil { // a mistyped name is an error, not a reclaim of nothing
		return err
	}
	if notice > 0 {
		deadline := time.Now().Add(notice).UTC()
		provider, err := c.Announce(ctx, name, deadline)
		if err != nil {
			return err
		}
		c.logf("node %s: %s reclamation notice, deadline %s", name, provider, deadline.Format(time.RFC3339))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(notice):
		}
	}
	if err := c.StopNode(name, true); err != nil {
		return err
	}
	if err := cs.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	c.logf("node %s reclaimed: its processes were killed and the Node removed", name)
	return nil
}

// WithdrawNotice withdraws a reclamation notice that Reclaim announced
// through the node's metadata service (POST /etjob/clear), as a cloud does
// when it cancels a preemption; the node then stays. Reclaim's own wait is
// the caller's to cancel.
func (c *Cluster) WithdrawNotice(ctx context.Context, name string) error {
	node, err := c.node(ctx, name)
	if err != nil {
		return err
	}
	if err := postMetadataControl(ctx, node, "/etjob/clear"); err != nil {
		return fmt.Errorf("withdrawing the notice of %s: %w", name, err)
	}
	c.logf("node %s: reclamation notice withdrawn", name)
	return nil
}

// SetPrice changes a node's spot price, as its emulated cloud's market
// would: POST /etjob/price to the node's metadata service, whose price feed
// the node's agent reads (--price-source local) and copies into the Node's
// etjob.dev/price-per-hour annotation, which etjob reads before the label the
// node registered with. It returns once the annotation says so. The billing
// ledger keeps the price a pod started at.
func (c *Cluster) SetPrice(ctx context.Context, name string, price etjobv1.PricePerHour) error {
	node, err := c.node(ctx, name)
	if err != nil {
		return err
	}
	if err := postMetadataControl(ctx, node, "/etjob/price?value="+price.String()); err != nil {
		return fmt.Errorf("setting the price of node %s in its market: %w", name, err)
	}
	err = poll(ctx, 30*time.Second, func() bool {
		n, err := c.node(ctx, name)
		return err == nil && n.Annotations[etjobv1.AnnotationPricePerHour] == price.String()
	})
	if err != nil {
		return fmt.Errorf("node %s: its agent did not publish the price $%s: %w", name, price, err)
	}
	c.logf("node %s: price now $%s an hour (its agent published it)", name, price)
	return nil
}

// Announce makes a node's metadata service announce its reclamation at
// deadline in its provider's format, without taking the node: Reclaim with a
// notice is Announce, a wait, then the loss; WithdrawNotice cancels it.
func (c *Cluster) Announce(ctx context.Context, name string, deadline time.Time) (provider string, err error) {
	node, err := c.node(ctx, name)
	if err != nil {
		return "", err
	}
	provider = node.Labels[etjobv1.LabelCloudProvider]
	path := fmt.Sprintf("/etjob/reclaim?provider=%s&deadline=%s", provider, deadline.UTC().Format(time.RFC3339))
	if err := postMetadataControl(ctx, node, path); err != nil {
		return "", fmt.Errorf("announcing the reclamation of %s through its metadata service: %w", name, err)
	}
	return provider, nil
}

// postMetadataControl POSTs to the control API of a node's emulated metadata
// service (internal/emucloud), which answers 204.
func postMetadataControl(ctx context.Context, node *corev1.Node, path string) error {
	u := fmt.Sprintf("http://%s:%d%s", internalIP(node), MetadataPort, path)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("%s answered %s", u, resp.Status)
	}
	return nil
}
