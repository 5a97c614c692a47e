// Package localcluster runs a real single-machine Kubernetes cluster with no
// containers: etcd, kube-apiserver, kube-scheduler and kube-controller-manager
// built from the Go module proxy (hack/build-controlplane.sh), and process
// nodes whose pods run as host processes (internal/localcluster/processnode).
// etjob itself is installed from its Helm chart (charts/etjob), as a
// platform team installs it: the controller (two replicas, leader election)
// and the agent DaemonSet run as pods under the chart's ServiceAccounts and
// RBAC, the process nodes mapping their images to this build's binaries.
// It is etjob's demo and end-to-end bed.
//
// Every component is a detached process with a pid file and a log under the
// cluster directory, so `up` is idempotent, `down` leaves nothing behind, and
// the cluster outlives the command that started it.
//
// What is where:
//
//   - cluster.go: the Cluster, Up, Stop and Delete, and its detached processes.
//   - controlplane.go: etcd, kube-apiserver, kube-scheduler and
//     kube-controller-manager, their secrets and the kubeconfig.
//   - nodes.go: the process nodes (etjob-node, a kubelet whose pods are host
//     processes, is processnode), their specs, start and stop.
//   - components.go and chart.go: etjob installed from its chart, its
//     controller's leader and its agents.
//   - faults.go: what the stories, the demo and the chaos run inflict on
//     purpose: reclaims with and without notice, withdrawn notices, price
//     changes, frozen nodes, component outages (a hard node stop is
//     StopNode's); replay.go: a spot trace played on the nodes.
//   - images.go, binaries.go, pki.go: what the nodes run, and the cluster's
//     certificates.
//
// The emulated cloud the nodes' metadata services serve is internal/emucloud.
package localcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/etjob/etjob/internal/localcluster/processnode"
)

// Cluster is a local cluster rooted at a directory.
type Cluster struct {
	// Dir holds keys, data, logs, pid files and the kubeconfig.
	Dir string
	// BinDir holds kube-apiserver, kube-scheduler, kube-controller-manager, etcd.
	BinDir string
	// Binaries are the etjob-controller, etjob-node and etjob-agent
	// binaries the cluster runs (BuildBinaries); unset, the ones next to
	// the running binary (BinariesNextTo).
	Binaries Binaries
	// Out receives progress.
	Out io.Writer
	// Images is what each container image brings on the process nodes
	// (processnode.Image); nil runs every image as the host as it is.
	// LocalImages builds the local image of etjob's examples.
	Images processnode.Images
	// ControllerArgs are extra flags of the etjob controller, given to the
	// chart as controller.extraArgs (etjob-local chaos passes
	// --record-decisions).
	ControllerArgs []string
}

// DefaultDir is where `etjob-local cluster` keeps its cluster unless told otherwise.
func DefaultDir() string {
	if d := os.Getenv("ETJOB_CLUSTER_DIR"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = os.TempDir()
	}
	return filepath.Join(home, ".cache", "etjob", "cluster")
}

// Kubeconfig is the path of the cluster's admin kubeconfig.
func (c *Cluster) Kubeconfig() string { return filepath.Join(c.Dir, "kubeconfig") }

func (c *Cluster) path(parts ...string) string {
	return filepath.Join(append([]string{c.Dir}, parts...)...)
}

func (c *Cluster) logf(format string, args ...any) {
	if c.Out != nil {
		fmt.Fprintf(c.Out, format+"\n", args...)
	}
}

// Stop stops everything, nodes first, and leaves the data for a later `up`.
func (c *Cluster) Stop() error {
	var errs []error
	for _, name := range c.running() {
		if strings.HasPrefix(name, "node-") {
			errs = append(errs, c.StopNode(strings.TrimPrefix(name, "node-"), false))
		}
	}
	for _, name := range []string{"kube-controller-manager", "kube-scheduler", "kube-apiserver", "etcd"} {
		errs = append(errs, c.stop(name, syscall.SIGTERM))
	}
	return errors.Join(errs...)
}

// Delete stops everything and removes the cluster directory.
func (c *Cluster) Delete() error {
	if err := c.Stop(); err != nil {
		return err
	}
	return os.RemoveAll(c.Dir)
}

// start runs a component detached (its own session), unless its pid file
// names a live process.
func (c *Cluster) start(name, bin string, args ...string) error {
	pidFile := c.path("pids", name+".pid")
	if pid := readPid(pidFile); alive(pid) {
		c.logf("  %-26s running (pid %d)", name, pid)
		return nil
	}
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("starting %s: %w", name, err)
	}
	logFile, err := os.OpenFile(c.path("logs", name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logFile.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Dir = c.Dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", name, err)
	}
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		return err
	}
	go func() { _ = cmd.Wait() }() // reap it if it dies while we run
	c.logf("  %-26s started (pid %d, log %s)", name, cmd.Process.Pid, logFile.Name())
	return nil
}

// stop signals a component's process group and waits up to 15 s, then kills
// it and waits up to 10 s more (a loaded machine: a kube-apiserver that was
// busy took longer than the 200 ms this waited before).
func (c *Cluster) stop(name string, sig syscall.Signal) error {
	pidFile := c.path("pids", name+".pid")
	pid := readPid(pidFile)
	if pid <= 0 {
		return nil
	}
	if alive(pid) {
		_ = syscall.Kill(-pid, sig)
		deadline := time.Now().Add(15 * time.Second)
		for alive(pid) && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		if alive(pid) {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			deadline = time.Now().Add(10 * time.Second)
			for alive(pid) && time.Now().Before(deadline) {
				time.Sleep(100 * time.Millisecond)
			}
		}
		if alive(pid) {
			return fmt.Errorf("%s (pid %d) did not stop", name, pid)
		}
	}
	return os.Remove(pidFile)
}

func readPid(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// alive reports whether pid runs and is not a zombie.
func alive(pid int) bool {
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name in parentheses: "pid (comm) S ...".
	if i := strings.LastIndexByte(string(stat), ')'); i > 0 && i+2 < len(stat) {
		return stat[i+2] != 'Z'
	}
	return true
}

// Up starts the control plane, the system node (the controller's), spot GPU
// nodes and on-demand CPU nodes (the launchers'), and waits until the nodes are Ready, a
// controller replica leads and every node's agent answers. It is idempotent.
func (c *Cluster) Up(ctx context.Context, spot, onDemand int) error {
	if _, err := c.binaries(); err != nil {
		return err // before anything starts
	}
	// The ports are fixed: a control plane still on them (the last
	// cluster's, shutting down) would answer this one's clients with its own
	// certificates ("x509: certificate signed by unknown authority", or 401).
	if err := waitPortsFree(ctx, 30*time.Second, EtcdClientPort, EtcdPeerPort, APIServerPort, SchedulerPort, KCMPort); err != nil {
		return err
	}
	if err := c.StartControlPlane(ctx); err != nil {
		return err
	}
	if err := c.StartNode(NewSystemNodeSpec()); err != nil {
		return err
	}
	for i := range onDemand {
		if err := c.StartNode(NewLauncherNodeSpec(fmt.Sprintf("on-demand-%d", i+1), launcherIndexOffset+i)); err != nil {
			return err
		}
	}
	for i := range spot {
		if err := c.StartNode(NewNodeSpec(fmt.Sprintf("spot-%d", i+1), true, 101+i)); err != nil {
			return err
		}
	}
	if err := c.WaitNodesReady(ctx, spot+onDemand+1); err != nil {
		return err
	}
	return c.WaitComponents(ctx)
}
