package localcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/core"
	"github.com/etjob/etjob/internal/emucloud"
	"github.com/etjob/etjob/internal/instancetype"
	"github.com/etjob/etjob/internal/localcluster/processnode"
)

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

// Instance types and prices of the local cluster's nodes, from the one
// table of instance types (internal/instancetype): GPU nodes are p3.2xlarge
// at the prices Bamboo (NSDI'23) used, so that local cost reports can be set
// beside published numbers; launcher nodes are CPU-only m5.xlarge.
var (
	InstanceType  = instancetype.P32xlarge.Name
	SpotPrice     = instancetype.P32xlarge.SpotPrice
	OnDemandPrice = instancetype.P32xlarge.OnDemandPrice
	LauncherType  = instancetype.M5Xlarge.Name
	LauncherPrice = instancetype.M5Xlarge.OnDemandPrice
	SystemType    = instancetype.M5Large.Name
	SystemPrice   = instancetype.M5Large.OnDemandPrice
)

const (
	launcherIndexOffset = 1
	// SystemNode is the node of the cluster's own components (the etjob
	// controller's replicas), like a cloud cluster's system node pool:
	// on-demand (SystemType), tainted CriticalAddonsOnly so that no job's pod
	// lands on it, and never reclaimed by a story. Agents (which tolerate
	// every taint) run on it too.
	SystemNode     = "system-1"
	SystemTaintKey = "CriticalAddonsOnly"
	SystemTaint    = SystemTaintKey + "=true:NoSchedule"
	systemIndex    = 200
)

// NewSystemNodeSpec is the system node (SystemNode).
func NewSystemNodeSpec() NodeSpec {
	return NodeSpec{Name: SystemNode, InstanceType: SystemType, PricePerHour: SystemPrice, Index: systemIndex,
		Provider: Providers[systemIndex%len(Providers)], Taints: SystemTaint}
}

// Providers are the clouds whose metadata services nodes emulate, in the
// order nodes get them, so that a story reclaims nodes of every provider.
var Providers = []string{emucloud.AWS, emucloud.GCP, emucloud.Azure, emucloud.Alibaba}

// NewNodeSpec names a GPU node's capacity, price and cloud; index picks its
// loopback /24 (and, round-robin, its cloud).
func NewNodeSpec(name string, spot bool, index int) NodeSpec {
	n := NodeSpec{Name: name, Spot: spot, InstanceType: InstanceType, PricePerHour: OnDemandPrice, Index: index, GPUs: 1,
		Provider: Providers[index%len(Providers)]}
	if spot {
		n.PricePerHour, n.OnDemandPricePerHour = SpotPrice, OnDemandPrice
	}
	return n
}

// NewLauncherNodeSpec is an on-demand CPU node (no accelerator): reliable
// capacity for launchers and rendezvous stores, where workers, which ask for
// a GPU, never land.
func NewLauncherNodeSpec(name string, index int) NodeSpec {
	return NodeSpec{Name: name, InstanceType: LauncherType, PricePerHour: LauncherPrice, Index: index,
		Provider: Providers[index%len(Providers)]}
}

// AddNode starts a new GPU node (spot, or on-demand at the on-demand price)
// and waits until it is Ready and its agent answers. Names and /24s are never reused: a reclaimed
// node is gone for good. An empty name picks spot-N or gpu-on-demand-N.
func (c *Cluster) AddNode(ctx context.Context, name string, spot bool) (string, error) {
	cs, err := c.Clientset()
	if err != nil {
		return "", err
	}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	used := map[string]bool{}
	for _, n := range nodes.Items {
		used[n.Name] = true
	}
	entries, _ := os.ReadDir(c.path("nodes"))
	for _, e := range entries {
		used[e.Name()] = true
	}
	prefix, base := "gpu-on-demand-", 51
	if spot {
		prefix, base = "spot-", 101
	}
	if name != "" && used[name] {
		return "", fmt.Errorf("--name %s: a node of that name exists or existed in this cluster", name)
	}
	n := 1
	for ; used[fmt.Sprintf("%s%d", prefix, n)]; n++ {
	}
	if name == "" {
		name = fmt.Sprintf("%s%d", prefix, n)
	}
	if err := c.StartNode(NewNodeSpec(name, spot, base+n-1)); err != nil {
		return "", err
	}
	// The new node itself, not a count of all: nodes reclaimed while it
	// starts (a burst of notices) left a count that could never be reached
	// ("4 of 7 nodes Ready after 90s", TestHorovodSpotStory in a CI run).
	if err := c.waitNodeReady(ctx, cs, name); err != nil {
		return "", err
	}
	return name, c.waitAgent(ctx, cs, name)
}

func (c *Cluster) node(ctx context.Context, name string) (*corev1.Node, error) {
	cs, err := c.Clientset()
	if err != nil {
		return nil, err
	}
	node, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", name, err)
	}
	return node, nil
}

func internalIP(node *corev1.Node) string {
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	return ""
}

// WaitNodesReady waits until at least want nodes are Ready.
func (c *Cluster) WaitNodesReady(ctx context.Context, want int) error {
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	var ready []string
	err = poll(ctx, 90*time.Second, func() bool {
		ready = nil
		nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for i := range nodes.Items {
			if core.NodeReady(&nodes.Items[i]) {
				ready = append(ready, nodes.Items[i].Name)
			}
		}
		return len(ready) >= want
	})
	if errors.Is(err, errPollTimeout) {
		sort.Strings(ready)
		return fmt.Errorf("%d of %d nodes Ready after 90s (%v; logs in %s)", len(ready), want, ready, c.path("logs"))
	}
	return err
}

// waitNodeReady waits until the node name is Ready.
func (c *Cluster) waitNodeReady(ctx context.Context, cs kubernetes.Interface, name string) error {
	err := poll(ctx, 90*time.Second, func() bool {
		n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		return err == nil && core.NodeReady(n)
	})
	if errors.Is(err, errPollTimeout) {
		return fmt.Errorf("node %s not Ready after 90s (its log: %s)", name, c.path("logs", "node-"+name+".log"))
	}
	return err
}
