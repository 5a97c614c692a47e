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
package localcluster

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/instancetype"
	"github.com/etjob/etjob/internal/localcluster/processnode"
)

// Ports of the local control plane (high, fixed, loopback only).
const (
	EtcdClientPort = 23790
	EtcdPeerPort   = 23800
	APIServerPort  = 26443
	SchedulerPort  = 20259
	KCMPort        = 20257
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

// StartControlPlane starts (or finds running) etcd, kube-apiserver,
// kube-scheduler and kube-controller-manager, writes the kubeconfig and
// installs the chart. It returns once the API server is ready; the chart's
// pods run once nodes join (WaitComponents).
func (c *Cluster) StartControlPlane(ctx context.Context) error {
	for _, d := range []string{"pki", "etcd", "logs", "pids", "nodes"} {
		if err := os.MkdirAll(c.path(d), 0o755); err != nil {
			return err
		}
	}
	token, err := c.ensureSecrets()
	if err != nil {
		return err
	}
	if err := c.ensureKubeletPKI(); err != nil {
		return err
	}
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", EtcdClientPort)
	if err := c.start("etcd", filepath.Join(c.BinDir, "etcd"),
		"--name=etjob", "--data-dir="+c.path("etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		fmt.Sprintf("--listen-peer-urls=http://127.0.0.1:%d", EtcdPeerPort),
		fmt.Sprintf("--initial-advertise-peer-urls=http://127.0.0.1:%d", EtcdPeerPort),
		fmt.Sprintf("--initial-cluster=etjob=http://127.0.0.1:%d", EtcdPeerPort),
		"--quota-backend-bytes=4294967296", "--log-level=warn",
	); err != nil {
		return err
	}
	if err := waitHTTP(ctx, etcdURL+"/health", "", 60*time.Second); err != nil {
		return fmt.Errorf("etcd did not become healthy (log: %s): %w", c.path("logs", "etcd.log"), err)
	}
	if err := c.start("kube-apiserver", filepath.Join(c.BinDir, "kube-apiserver"),
		"--etcd-servers="+etcdURL,
		fmt.Sprintf("--secure-port=%d", APIServerPort), "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		// v1.37 refuses a loopback advertise address with the default reconciler (it exits at start).
		"--endpoint-reconciler-type=none",
		"--cert-dir="+c.path("pki"),
		"--token-auth-file="+c.path("pki", "tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+c.path("pki", "sa.pub"),
		"--service-account-signing-key-file="+c.path("pki", "sa.key"),
		"--service-cluster-ip-range=10.96.0.0/16",
		"--allow-privileged=true",
		"--enable-priority-and-fairness=false",
		// Logs and exec go to a process node's kubelet API at its loopback
		// InternalIP, with the client certificate the nodes trust (pki.go);
		// with no --kubelet-certificate-authority the API server does not
		// verify the node's self-signed serving certificate.
		"--kubelet-preferred-address-types=InternalIP",
		"--kubelet-client-certificate="+c.kubeletClientCert(), "--kubelet-client-key="+c.kubeletClientKey(),
		"--v=0",
	); err != nil {
		return err
	}
	server := fmt.Sprintf("https://127.0.0.1:%d", APIServerPort)
	if err := waitHTTP(ctx, server+"/readyz", token, 120*time.Second); err != nil {
		return fmt.Errorf("kube-apiserver did not become ready (log: %s): %w", c.path("logs", "kube-apiserver.log"), err)
	}
	if err := c.writeKubeconfig(server, token); err != nil {
		return err
	}
	kc := "--kubeconfig=" + c.Kubeconfig()
	if err := c.start("kube-scheduler", filepath.Join(c.BinDir, "kube-scheduler"), kc,
		"--leader-elect=false", "--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", SchedulerPort)); err != nil {
		return err
	}
	if err := c.start("kube-controller-manager", filepath.Join(c.BinDir, "kube-controller-manager"), kc,
		"--leader-elect=false", "--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", KCMPort),
		"--service-account-private-key-file="+c.path("pki", "sa.key"),
		"--root-ca-file="+c.path("pki", "apiserver.crt"),
		"--use-service-account-credentials=false",
		// Nodes without heartbeats for 40 s go NotReady, as on a real cluster;
		// process nodes keep real leases.
		"--controllers=*,-nodeipam,-kube-apiserver-serving-clustertrustbundle-publisher-controller",
	); err != nil {
		return err
	}
	return c.installChart(ctx)
}

// RestartComponent restarts one named component of the cluster, as a
// crash-looping or upgraded one would be: etjob-controller (its leading
// pod, RestartController) and agent-<node> (that node's agent pod,
// RestartAgent) are pods; any other name is a process as Components names
// it (kube-apiserver, node-<node>, ...), stopped with SIGTERM and started
// again with the same command line. The kube-apiserver is waited for until
// ready.
func (c *Cluster) RestartComponent(ctx context.Context, name string) error {
	return c.RestartComponentAfter(ctx, name, 0)
}

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

// NodeSpec describes one process node.
type NodeSpec struct {
	Name         string
	Spot         bool
	InstanceType string
	PricePerHour etjobv1.PricePerHour
	// OnDemandPricePerHour is the on-demand price of a spot node's instance
	// type (etjobv1.LabelOnDemandPricePerHour), what status.cost sets its
	// hours beside; 0 on on-demand nodes, whose own price it is.
	OnDemandPricePerHour etjobv1.PricePerHour
	// Provider is the cloud whose metadata service the node emulates
	// (alibaba, aws, gcp, azure) and whose notices its agent reads.
	Provider string
	// GPUs is the number of emulated accelerators (nvidia.com/gpu).
	GPUs int
	// Index picks the node's loopback /24: 127.0.<Index>.1.
	Index int
	// Taints are registered with the node (key[=value]:Effect,...).
	Taints string
}

// Ports of a node's own endpoints, on its node IP.
const (
	// MetadataPort serves the node's emulated cloud metadata service.
	MetadataPort = 8775
	// AgentPort serves the node agent's pod signals.
	AgentPort = etjobv1.AgentPort
)

// NodeIP is the node's loopback address.
func (n NodeSpec) NodeIP() string { return fmt.Sprintf("127.0.%d.1", n.Index) }

// MetadataURL is the base URL of the node's emulated metadata service.
func (n NodeSpec) MetadataURL() string { return fmt.Sprintf("http://%s:%d", n.NodeIP(), MetadataPort) }

// Labels are the node's labels: capacity type as Karpenter writes it (the
// labels real clouds use are listed in etjobv1.SpotLabels),
// instance type, price, zone.
func (n NodeSpec) Labels() map[string]string {
	ct := etjobv1.CapacityTypeOnDemand
	if n.Spot {
		ct = etjobv1.CapacityTypeSpot
	}
	labels := map[string]string{
		etjobv1.LabelCapacityType:     ct,
		etjobv1.LabelInstanceType:     n.InstanceType,
		"topology.kubernetes.io/zone": "local-a",
		etjobv1.LabelPricePerHour:     n.PricePerHour.String(),
		etjobv1.LabelCloudProvider:    n.Provider,
	}
	if n.OnDemandPricePerHour > 0 {
		labels[etjobv1.LabelOnDemandPricePerHour] = n.OnDemandPricePerHour.String()
	}
	return labels
}

// StartNode starts (or finds running) a process node.
func (c *Cluster) StartNode(n NodeSpec) error {
	labels := n.Labels()
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var kv []string
	for _, k := range keys {
		kv = append(kv, k+"="+labels[k])
	}
	dir := c.path("nodes", n.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	args := []string{"--kubeconfig=" + c.Kubeconfig(),
		"--node-name=" + n.Name, "--node-ip=" + n.NodeIP(), "--client-ca-file=" + c.kubeletCA(), "--labels=" + strings.Join(kv, ","), "--work-dir=" + dir,
		fmt.Sprintf("--metadata-listen=%s:%d", n.NodeIP(), MetadataPort), "--metadata-provider=" + n.Provider,
		fmt.Sprintf("--gpus=%d", n.GPUs)}
	// The node advertises its instance type's CPUs and memory (requests are
	// scheduled against them, not enforced on the host).
	if t, ok := instancetype.Lookup(n.InstanceType); ok {
		args = append(args, fmt.Sprintf("--cpus=%d", t.CPUs), fmt.Sprintf("--memory=%dGi", t.MemoryGiB))
	}
	if n.Taints != "" {
		args = append(args, "--taints="+n.Taints)
	}
	bins, err := c.binaries()
	if err != nil {
		return err
	}
	// The chart's controller and agent images run this cluster's binaries;
	// every other image is the local image (c.Images).
	images := c.path("images.json")
	if err := processnode.WriteImages(images, append(componentImages(bins), c.Images...)); err != nil {
		return err
	}
	args = append(args, "--images="+images)
	return c.start("node-"+n.Name, bins.Node, args...)
}

// StopNode stops a node's process (SIGKILL when hard, as a vanished VM) and
// kills every pod process it started.
func (c *Cluster) StopNode(name string, hard bool) error {
	sig := syscall.SIGTERM
	if hard {
		sig = syscall.SIGKILL
	}
	err := c.stop("node-"+name, sig)
	c.killPods(name)
	if hard {
		// The pods died with the node and wrote no end in its ledger.
		_ = os.WriteFile(c.path("nodes", name, LedgerStopFile), []byte(strconv.FormatInt(time.Now().UnixNano(), 10)+"\n"), 0o644)
	}
	return err
}

// LedgerStopFile, in a node's directory, holds when the node was killed
// with its pods (Unix nanoseconds): the end of every pod its billing ledger
// (processnode.LedgerFile) left open.
const LedgerStopFile = "killed-at"

// killPods kills the process groups recorded by a node's pods (pid files
// under nodes/<name>/pods), so no pod outlives its node.
func (c *Cluster) killPods(node string) {
	for _, pid := range c.podPids(node) {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
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

// podPids are the process groups recorded by a node's pods (pid files under
// nodes/<name>/pods).
func (c *Cluster) podPids(node string) []int {
	files, _ := filepath.Glob(c.path("nodes", node, "*", "*.pid"))
	more, _ := filepath.Glob(c.path("nodes", node, "pods", "*", "*.pid"))
	var out []int
	for _, f := range append(files, more...) {
		if pid := readPid(f); pid > 0 {
			out = append(out, pid)
		}
	}
	return out
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

// Component is a process of the cluster.
type Component struct {
	Name  string
	Pid   int
	Alive bool
	Log   string
}

// Components lists the cluster's processes and whether they run.
func (c *Cluster) Components() []Component {
	files, _ := filepath.Glob(c.path("pids", "*.pid"))
	sort.Strings(files)
	var out []Component
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".pid")
		pid := readPid(f)
		out = append(out, Component{Name: name, Pid: pid, Alive: alive(pid), Log: c.path("logs", name+".log")})
	}
	return out
}

func (c *Cluster) running() []string {
	var out []string
	for _, comp := range c.Components() {
		if comp.Alive {
			out = append(out, comp.Name)
		}
	}
	return out
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

// ensureSecrets creates the service-account key pair and the admin token once.
func (c *Cluster) ensureSecrets() (string, error) {
	tokens := c.path("pki", "tokens.csv")
	if b, err := os.ReadFile(tokens); err == nil {
		return strings.SplitN(string(b), ",", 2)[0], nil
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(c.path("pki", "sa.key"), pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return "", err
	}
	if err := os.WriteFile(c.path("pki", "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644); err != nil {
		return "", err
	}
	raw := make([]byte, 24)
	if _, err := rand.Read(raw); err != nil {
		return "", err
	}
	token := hex.EncodeToString(raw)
	return token, os.WriteFile(tokens, []byte(token+",admin,admin,system:masters\n"), 0o600)
}

// writeKubeconfig writes the admin kubeconfig. The API server's CA goes in as data, not as its file's path: client-go
// (v0.37, ClientsAllowCARotation) caches a transport by the CA file's path
// and reads the file again only every 5 minutes, so a process that brought
// a cluster up again in the same directory (go test -count=N of one story)
// kept the last cluster's CA: "x509: certificate signed by unknown
// authority" from the new cluster's own API server (TestKubeconfigCA).
func (c *Cluster) writeKubeconfig(server, token string) error {
	pem, err := os.ReadFile(c.path("pki", "apiserver.crt"))
	if err != nil {
		return fmt.Errorf("the API server's certificate: %w", err)
	}
	ca := base64.StdEncoding.EncodeToString(pem)
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: etjob-local
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: admin
  user:
    token: %s
contexts:
- name: etjob-local
  context: {cluster: etjob-local, user: admin, namespace: default}
current-context: etjob-local
`, server, ca, token)
	return os.WriteFile(c.Kubeconfig(), []byte(kc), 0o600)
}

// waitHTTP polls url until it answers 200.
func waitHTTP(ctx context.Context, url, token string, timeout time.Duration) error {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // a readiness probe of our own loopback server
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("%s: %s", url, resp.Status)
		}
		last = err
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	return last
}
