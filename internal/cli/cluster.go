package cli

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/hack"
	"github.com/etjob/etjob/internal/localcluster"
)

// Prices of the local cluster's nodes: p3.2xlarge as Bamboo (NSDI'23) used them,
// so that local cost reports can be set beside published numbers.
const (
	localInstanceType = "p3.2xlarge"
	spotPrice         = "0.91"
	onDemandPrice     = "3.06"
)

type clusterOptions struct {
	dir      string
	spot     int
	onDemand int
	streams  IOStreams
}

func (o *clusterOptions) cluster() (*localcluster.Cluster, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return &localcluster.Cluster{Dir: o.dir, Self: self, Out: o.streams.Out}, nil
}

func newClusterCommand(streams IOStreams) *cobra.Command {
	o := &clusterOptions{streams: streams}
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "A real single-machine Kubernetes cluster whose pods run as host processes",
		Long: `A real single-machine Kubernetes cluster: etcd, kube-apiserver, kube-scheduler and
kube-controller-manager built from source, the etjob controller, and process nodes
whose pods run as host processes (no container engine). Nodes are labelled like
cloud nodes (karpenter.sh/capacity-type, node.kubernetes.io/instance-type) with a price.`,
	}
	cmd.PersistentFlags().StringVar(&o.dir, "dir", localcluster.DefaultDir(), "directory of the cluster's state, logs and kubeconfig")

	up := &cobra.Command{
		Use:     "up",
		Short:   "Start the cluster (idempotent); builds the control plane on first use",
		Example: "  etjob cluster up --spot 4 --on-demand 1\n  export KUBECONFIG=$(etjob cluster kubeconfig)",
		Args:    cobra.NoArgs,
		RunE:    func(c *cobra.Command, _ []string) error { return o.up(c.Context()) },
	}
	up.Flags().IntVar(&o.spot, "spot", 4, "spot process nodes")
	up.Flags().IntVar(&o.onDemand, "on-demand", 1, "on-demand process nodes (the launcher's)")

	down := &cobra.Command{
		Use:   "down",
		Short: "Stop every process of the cluster (pods included); --delete also removes its data",
		Args:  cobra.NoArgs,
	}
	del := down.Flags().Bool("delete", false, "also remove the cluster directory")
	down.RunE = func(*cobra.Command, []string) error {
		cl, err := o.cluster()
		if err != nil {
			return err
		}
		if *del {
			err = cl.Delete()
		} else {
			err = cl.Stop()
		}
		if err == nil {
			fmt.Fprintln(o.streams.Out, "cluster stopped")
		}
		return err
	}

	status := &cobra.Command{
		Use:   "status",
		Short: "Show the cluster's processes",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			cl, err := o.cluster()
			if err != nil {
				return err
			}
			comps := cl.Components()
			if len(comps) == 0 {
				fmt.Fprintf(o.streams.Out, "no cluster in %s (etjob cluster up)\n", o.dir)
				return nil
			}
			fmt.Fprintf(o.streams.Out, "%-28s %-8s %s\n", "COMPONENT", "PID", "STATE")
			for _, c := range comps {
				state := "running"
				if !c.Alive {
					state = "stopped (log: " + c.Log + ")"
				}
				fmt.Fprintf(o.streams.Out, "%-28s %-8d %s\n", c.Name, c.Pid, state)
			}
			fmt.Fprintf(o.streams.Out, "\nkubeconfig: %s\n", cl.Kubeconfig())
			return nil
		},
	}

	kubeconfig := &cobra.Command{
		Use:   "kubeconfig",
		Short: "Print the path of the cluster's kubeconfig",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			cl, err := o.cluster()
			if err == nil {
				fmt.Fprintln(o.streams.Out, cl.Kubeconfig())
			}
			return err
		},
	}

	var addSpot bool
	var addName string
	addNode := &cobra.Command{
		Use:     "add-node",
		Short:   "Add a process node",
		Example: "  etjob cluster add-node --spot",
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return o.addNode(c.Context(), addName, addSpot)
		},
	}
	addNode.Flags().BoolVar(&addSpot, "spot", false, "add a spot node (default: on-demand)")
	addNode.Flags().StringVar(&addName, "name", "", "node name (default: spot-N or on-demand-N)")

	var notice time.Duration
	reclaim := &cobra.Command{
		Use:   "reclaim NODE",
		Short: "Reclaim a node as a cloud would: a notice, then at the deadline every process dies at once",
		Long: `Reclaim a node as a spot market would. With --notice > 0 the node first gets a reclamation
notice (the etjob.dev/reclaim-deadline annotation and a NoSchedule taint, as the node agent of
issue #4 will set from the emulated metadata endpoint), then at the deadline every process of the
node is killed with SIGKILL, like a vanished VM, and the Node is removed. --notice 0 is a hard loss.`,
		Example: "  etjob cluster reclaim spot-2 --notice 30s\n  etjob cluster reclaim spot-3 --notice 0",
		Args:    cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			return o.reclaim(c.Context(), args[0], notice)
		},
	}
	reclaim.Flags().DurationVar(&notice, "notice", 30*time.Second, "time between the notice and the loss (0: hard loss)")

	cmd.AddCommand(up, down, status, kubeconfig, addNode, reclaim)
	return cmd
}

func (o *clusterOptions) up(ctx context.Context) error {
	if o.spot < 0 || o.onDemand < 0 {
		return fmt.Errorf("--spot and --on-demand must be 0 or more")
	}
	cl, err := o.cluster()
	if err != nil {
		return err
	}
	start := time.Now()
	fmt.Fprintln(o.streams.Out, "control plane binaries (built once from the Go module proxy; cold ~7 min):")
	bin, err := buildControlPlane(o.streams)
	if err != nil {
		return err
	}
	cl.BinDir = bin
	fmt.Fprintf(o.streams.Out, "starting the cluster in %s:\n", o.dir)
	if err := cl.StartControlPlane(ctx); err != nil {
		return err
	}
	for i := range o.onDemand {
		if err := cl.StartNode(nodeSpec(fmt.Sprintf("on-demand-%d", i+1), false, 1+i)); err != nil {
			return err
		}
	}
	for i := range o.spot {
		if err := cl.StartNode(nodeSpec(fmt.Sprintf("spot-%d", i+1), true, 101+i)); err != nil {
			return err
		}
	}
	if err := waitNodesReady(ctx, cl, o.spot+o.onDemand); err != nil {
		return err
	}
	fmt.Fprintf(o.streams.Out, "\ncluster up in %s. Use it with:\n  export KUBECONFIG=%s\n  kubectl get nodes -L karpenter.sh/capacity-type,etjob.dev/price-per-hour\n",
		time.Since(start).Round(time.Second), cl.Kubeconfig())
	return nil
}

// nodeSpec names a node and gives it a loopback /24 of its own.
func nodeSpec(name string, spot bool, index int) localcluster.NodeSpec {
	price := onDemandPrice
	if spot {
		price = spotPrice
	}
	return localcluster.NodeSpec{Name: name, Spot: spot, InstanceType: localInstanceType, PricePerHour: price, Index: index}
}

func (o *clusterOptions) addNode(ctx context.Context, name string, spot bool) error {
	cl, err := o.cluster()
	if err != nil {
		return err
	}
	cs, err := clientset(cl)
	if err != nil {
		return err
	}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	prefix, base := "on-demand-", 1
	if spot {
		prefix, base = "spot-", 101
	}
	// Names and /24s are never reused: a reclaimed node is gone for good.
	used := map[string]bool{}
	for _, n := range nodes.Items {
		used[n.Name] = true
	}
	entries, _ := os.ReadDir(filepath.Join(o.dir, "nodes"))
	for _, e := range entries {
		used[e.Name()] = true
	}
	n := 1
	for ; name == "" || used[name]; n++ {
		if name != "" && used[name] {
			return fmt.Errorf("--name %s: a node of that name exists or existed in this cluster", name)
		}
		if !used[fmt.Sprintf("%s%d", prefix, n)] {
			name = fmt.Sprintf("%s%d", prefix, n)
			break
		}
	}
	idx := base + n - 1
	if err := cl.StartNode(nodeSpec(name, spot, idx)); err != nil {
		return err
	}
	if err := waitNodesReady(ctx, cl, len(nodes.Items)+1); err != nil {
		return err
	}
	fmt.Fprintf(o.streams.Out, "node %s added\n", name)
	return nil
}

func (o *clusterOptions) reclaim(ctx context.Context, name string, notice time.Duration) error {
	cl, err := o.cluster()
	if err != nil {
		return err
	}
	cs, err := clientset(cl)
	if err != nil {
		return err
	}
	node, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reclaim %s: %w", name, err)
	}
	if notice > 0 {
		deadline := time.Now().Add(notice).UTC()
		if node.Annotations == nil {
			node.Annotations = map[string]string{}
		}
		node.Annotations[etjobv1.AnnotationNodeNotice] = deadline.Format(time.RFC3339)
		node.Annotations[etjobv1.AnnotationNodeNoticeSource] = "etjob-cluster"
		node.Spec.Taints = append(node.Spec.Taints, corev1.Taint{Key: "etjob.dev/reclaimed", Effect: corev1.TaintEffectNoSchedule})
		if _, err := cs.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("announcing the reclamation of %s: %w", name, err)
		}
		fmt.Fprintf(o.streams.Out, "node %s: reclamation notice, deadline %s\n", name, deadline.Format(time.RFC3339))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(notice):
		}
	}
	if err := cl.StopNode(name, true); err != nil {
		return err
	}
	if err := cs.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	fmt.Fprintf(o.streams.Out, "node %s reclaimed: its processes were killed and the Node removed\n", name)
	return nil
}

func clientset(cl *localcluster.Cluster) (*kubernetes.Clientset, error) {
	cfg, err := cl.RESTConfig()
	if err != nil {
		return nil, fmt.Errorf("no cluster in %s (etjob cluster up): %w", cl.Dir, err)
	}
	return kubernetes.NewForConfig(cfg)
}

func waitNodesReady(ctx context.Context, cl *localcluster.Cluster, want int) error {
	cs, err := clientset(cl)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		ready := 0
		if err == nil {
			for _, n := range nodes.Items {
				for _, c := range n.Status.Conditions {
					if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
						ready++
					}
				}
			}
		}
		if ready >= want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d nodes Ready after 90s (logs in %s)", ready, want, filepath.Join(cl.Dir, "logs"))
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// buildControlPlane runs the embedded hack/build-controlplane.sh, streaming
// its progress, and returns the directory of the binaries.
func buildControlPlane(streams IOStreams) (string, error) {
	f, err := os.CreateTemp("", "etjob-build-controlplane-*.sh")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(hack.BuildControlPlane); err != nil {
		return "", err
	}
	f.Close()
	var out strings.Builder
	cmd := exec.Command("bash", f.Name())
	cmd.Stdout, cmd.Stderr = &out, streams.ErrOut
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("building the control plane: %w", err)
	}
	return strings.TrimSpace(out.String()), nil
}
