package localcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/core"
	"github.com/etjob/etjob/internal/emucloud"
	"github.com/etjob/etjob/internal/instancetype"
)

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

// Clientset returns a clientset for the cluster.
func (c *Cluster) Clientset() (*kubernetes.Clientset, error) {
	cfg, err := c.RESTConfig()
	if err != nil {
		return nil, fmt.Errorf("no cluster in %s (etjob-local cluster up): %w", c.Dir, err)
	}
	return kubernetes.NewForConfig(cfg)
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

// waitPortsFree waits until every port can be listened on at 127.0.0.1, up
// to limit, and names the first that cannot.
func waitPortsFree(ctx context.Context, limit time.Duration, ports ...int) error {
	deadline := time.Now().Add(limit)
	for _, port := range ports {
		for {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err == nil {
				l.Close()
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("port %d of the local control plane is still in use after %s: another local cluster runs on this machine "+
					"(etjob-local cluster down --dir DIR), or the last one's processes have not exited: %w", port, limit, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	return nil
}
