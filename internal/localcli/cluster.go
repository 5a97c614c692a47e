package localcli

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/hack"
	"github.com/etjob/etjob/internal/cli"
	"github.com/etjob/etjob/internal/localcluster"
	"github.com/etjob/etjob/internal/trace"
)

type clusterOptions struct {
	dir      string
	repo     string
	spot     int
	onDemand int
	streams  cli.IOStreams
}

// cluster is the cluster in --dir, for the verbs that start no node.
func (o *clusterOptions) cluster() (*localcluster.Cluster, error) {
	return &localcluster.Cluster{Dir: o.dir, Out: o.streams.Out}, nil
}

// nodeCluster is the cluster in --dir for the verbs that start process
// nodes (up, add-node, replay): their pods run the local image, Debian's
// torch, Horovod when hack/install-horovod.sh installed it, etjob's library
// and examples (docs/local-cluster.md), which need the repository. Without
// it a horovod job would fail with "horovodrun: not found", far from the
// cause, so it is refused here, naming the flag.
func (o *clusterOptions) nodeCluster() (*localcluster.Cluster, error) {
	repo, err := exampleRepo(o.repo)
	if err != nil {
		return nil, err
	}
	cl, _ := o.cluster()
	cl.Images = localcluster.LocalImages(repo, localcluster.HorovodVenv())
	return cl, nil
}

func newClusterCommand(streams cli.IOStreams) *cobra.Command {
	o := &clusterOptions{streams: streams}
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "A real single-machine Kubernetes cluster whose pods run as host processes",
		Long: `A real single-machine Kubernetes cluster: etcd, kube-apiserver, kube-scheduler and
kube-controller-manager built from source, etjob installed from its Helm chart (the
controller and the agent DaemonSet as pods), and process nodes
whose pods run as host processes (no container engine). Nodes are labelled like
cloud nodes (karpenter.sh/capacity-type, node.kubernetes.io/instance-type) with a price.`,
	}
	cmd.PersistentFlags().StringVar(&o.dir, "dir", localcluster.DefaultDir(), "directory of the cluster's state, logs and kubeconfig")
	cmd.PersistentFlags().StringVar(&o.repo, "repo", "", repoFlagHelp)

	up := &cobra.Command{
		Use:     "up",
		Short:   "Start the cluster (idempotent); builds the control plane on first use",
		Example: "  etjob-local cluster up --spot 4 --on-demand 1\n  export KUBECONFIG=$(etjob-local cluster kubeconfig)",
		Args:    cobra.NoArgs,
		RunE:    func(c *cobra.Command, _ []string) error { return o.up(c.Context()) },
	}
	up.Flags().IntVar(&o.spot, "spot", 4, "spot GPU nodes (p3.2xlarge, one emulated nvidia.com/gpu each)")
	up.Flags().IntVar(&o.onDemand, "on-demand", 1, "on-demand CPU nodes (m5.xlarge, no GPU: the launchers' reliable capacity)")

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
		Short: "Show the cluster's processes and the controller's leader",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			cl, err := o.cluster()
			if err != nil {
				return err
			}
			comps := cl.Components()
			if len(comps) == 0 {
				fmt.Fprintf(o.streams.Out, "no cluster in %s (etjob-local cluster up)\n", o.dir)
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
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if leader, err := cl.Leader(ctx); err == nil {
				if leader == "" {
					leader = "none (no replica holds the Lease)"
				}
				fmt.Fprintf(o.streams.Out, "\netjob-controller leader: %s (its pods: kubectl -n %s get pods; the agents': kubectl -n %s get pods -o wide)\n",
					leader, localcluster.ControllerNamespace, localcluster.AgentNamespace)
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
		Example: "  etjob-local cluster add-node --spot",
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return o.addNode(c.Context(), addName, addSpot)
		},
	}
	addNode.Flags().BoolVar(&addSpot, "spot", false, "add a spot GPU node (default: an on-demand GPU node)")
	addNode.Flags().StringVar(&addName, "name", "", "node name (default: spot-N or gpu-on-demand-N)")

	var notice time.Duration
	var provider string
	reclaim := &cobra.Command{
		Use:   "reclaim NODE",
		Short: "Reclaim a node as a cloud would: a notice, then at the deadline every process dies at once",
		Long: `Reclaim a node as its cloud would. Every node emulates one cloud's instance metadata
service (label etjob.dev/cloud-provider: aws, gcp, azure or alibaba, round-robin). With
--notice > 0 that service announces the reclamation in the provider's documented format; the
node's etjob agent reads it, marks the Node and tells the pods on it. At the deadline every
process of the node is killed with SIGKILL, like a vanished VM, and the Node is removed.
--notice 0 is a hard loss.`,
		Example: "  etjob-local cluster reclaim spot-2 --notice 30s\n  etjob-local cluster reclaim spot-3 --notice 0",
		Args:    cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			return o.reclaim(c.Context(), args[0], notice, provider)
		},
	}
	reclaim.Flags().DurationVar(&notice, "notice", 30*time.Second, "time between the notice and the loss (0: hard loss)")
	reclaim.Flags().StringVar(&provider, "provider", "", "check that the node emulates this cloud (alibaba, aws, gcp, azure); default: the node's own")

	price := &cobra.Command{
		Use:   "price NODE PRICE",
		Short: "Change a node's spot price (US dollars an hour), as its cloud's market would",
		Long: `Change a node's spot price, as its emulated cloud's market would: its etjob.dev/price-per-hour
label, which etjob reads. A job with spec.spot.maxPricePerHour (etjob submit --max-price) lets a
worker on a node priced above it go at an agreed step, and keeps new workers off that node.`,
		Example: "  etjob-local cluster price spot-1 1.75",
		Args:    cobra.ExactArgs(2),
		RunE: func(c *cobra.Command, args []string) error {
			p, err := etjobv1.ParsePricePerHour(args[1])
			if err != nil || p < 0 {
				return fmt.Errorf("PRICE %q: give US dollars an hour as a decimal, like 1.75", args[1])
			}
			cl, err := o.cluster()
			if err != nil {
				return err
			}
			if err := cl.SetPrice(c.Context(), args[0], p); err != nil {
				return err
			}
			fmt.Fprintf(o.streams.Out, "node %s now costs $%s an hour\n", args[0], p)
			return nil
		},
	}

	freeze := func(frozen bool) *cobra.Command {
		use, short, verb := "freeze NODE", "Freeze every pod process of a node (SIGSTOP): a gray failure, the node stays Ready", "frozen"
		if !frozen {
			use, short, verb = "thaw NODE", "Let the pod processes of a frozen node go on (SIGCONT)", "thawed"
		}
		return &cobra.Command{
			Use:     use,
			Short:   short,
			Example: "  etjob-local cluster " + strings.Fields(use)[0] + " spot-2",
			Args:    cobra.ExactArgs(1),
			RunE: func(c *cobra.Command, args []string) error {
				cl, err := o.cluster()
				if err != nil {
					return err
				}
				n, err := cl.FreezeNode(args[0], frozen)
				if err != nil {
					return err
				}
				fmt.Fprintf(o.streams.Out, "node %s: %d pod process groups %s\n", args[0], n, verb)
				return nil
			},
		}
	}

	drain := &cobra.Command{
		Use:   "drain NODE",
		Short: "Drain a node as kubectl drain --ignore-daemonsets does: cordon, then evict its pods through the Eviction API",
		Long: `Drain a node as kubectl drain --ignore-daemonsets does: cordon it, then evict each of its
pods but the DaemonSets' through the Eviction API, asking again every 0.5 s (kubectl: 5 s) while a
PodDisruptionBudget refuses, until every pod is gone. An etjob job's budget holds its pods until
they left at an agreed step; the drain then prints how long each took. uncordon NODE makes the
node schedulable again.`,
		Example: "  etjob-local cluster drain spot-2\n  etjob-local cluster uncordon spot-2",
		Args:    cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			cl, err := o.cluster()
			if err != nil {
				return err
			}
			d, err := cl.Drain(c.Context(), args[0])
			for _, name := range slices.Sorted(maps.Keys(d.Pods)) {
				fmt.Fprintf(o.streams.Out, "pod %s gone %.2fs after the cordon\n", name, d.Pods[name].Seconds())
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(o.streams.Out, "node %s drained in %.2fs (%d evictions refused by a disruption budget)\n", args[0], d.Took.Seconds(), d.Refused)
			return nil
		},
	}
	uncordon := &cobra.Command{
		Use:     "uncordon NODE",
		Short:   "Make a cordoned or drained node schedulable again (kubectl uncordon)",
		Example: "  etjob-local cluster uncordon spot-2",
		Args:    cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			cl, err := o.cluster()
			if err != nil {
				return err
			}
			if err := cl.Cordon(c.Context(), args[0], false); err != nil {
				return err
			}
			fmt.Fprintf(o.streams.Out, "node %s uncordoned\n", args[0])
			return nil
		},
	}

	var replay replayOptions
	replayCmd := &cobra.Command{
		Use:   "replay TRACE",
		Short: "Replay a spot availability trace (ms,add|remove,node) on the cluster, scaled in time",
		Long: `Replay a spot availability trace such as traces/ec2-p3-trace.csv: every add starts a
spot node, every remove reclaims the matching one with --notice, at the trace's times divided by
--speedup. --max-nodes caps the trace's nodes alive at once (the traces have up to 32; this
machine holds a few process nodes); the adds beyond it, and their removes, are skipped.`,
		Example: "  etjob-local cluster replay traces/ec2-p3-trace.csv --speedup 120 --notice 30s --max-nodes 4",
		Args:    cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			return o.replay(c.Context(), args[0], replay)
		},
	}
	replayCmd.Flags().Float64Var(&replay.speedup, "speedup", 60, "divide the trace's times by this (60: an hour in a minute)")
	replayCmd.Flags().DurationVar(&replay.notice, "notice", 30*time.Second, "reclamation notice of every remove (0: hard losses)")
	replayCmd.Flags().IntVar(&replay.maxNodes, "max-nodes", 4, "the most trace nodes alive at once (0: no cap)")

	cmd.AddCommand(up, down, status, kubeconfig, addNode, reclaim, drain, uncordon, price, freeze(true), freeze(false), replayCmd)
	return cmd
}

func (o *clusterOptions) up(ctx context.Context) error {
	if o.spot < 0 || o.onDemand < 0 {
		return fmt.Errorf("--spot and --on-demand must be 0 or more")
	}
	cl, err := o.nodeCluster()
	if err != nil {
		return err
	}
	start := time.Now()
	fmt.Fprintln(o.streams.Out, "control plane binaries (built once from the Go module proxy; cold ~7 min):")
	if cl.BinDir, err = buildControlPlane(o.streams); err != nil {
		return err
	}
	fmt.Fprintf(o.streams.Out, "starting the cluster in %s:\n", o.dir)
	if err := cl.Up(ctx, o.spot, o.onDemand); err != nil {
		return err
	}
	fmt.Fprintf(o.streams.Out, "\ncluster up in %s. Use it with:\n  export KUBECONFIG=%s\n  kubectl get nodes -L karpenter.sh/capacity-type,etjob.dev/price-per-hour\n",
		time.Since(start).Round(time.Second), cl.Kubeconfig())
	return nil
}

func (o *clusterOptions) addNode(ctx context.Context, name string, spot bool) error {
	cl, err := o.nodeCluster()
	if err != nil {
		return err
	}
	name, err = cl.AddNode(ctx, name, spot)
	if err == nil {
		fmt.Fprintf(o.streams.Out, "node %s added\n", name)
	}
	return err
}

type replayOptions struct {
	speedup  float64
	notice   time.Duration
	maxNodes int
}

func (o *clusterOptions) replay(ctx context.Context, path string, r replayOptions) error {
	if r.speedup <= 0 {
		return fmt.Errorf("--speedup %v: must be more than 0", r.speedup)
	}
	if r.notice < 0 {
		return fmt.Errorf("--notice %s: must be 0 or more", r.notice)
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("TRACE: %w", err)
	}
	defer f.Close()
	events, err := trace.Parse(f)
	if err != nil {
		return fmt.Errorf("TRACE %s: %w", path, err)
	}
	cl, err := o.nodeCluster()
	if err != nil {
		return err
	}
	fmt.Fprintf(o.streams.Out, "replaying %d events of %s at %gx\n", len(events), path, r.speedup)
	skipped, err := cl.Replay(ctx, events, localcluster.ReplayOptions{Speedup: r.speedup, Notice: r.notice, MaxNodes: r.maxNodes,
		Log: func(format string, args ...any) { fmt.Fprintf(o.streams.Out, format+"\n", args...) }})
	fmt.Fprintf(o.streams.Out, "replayed; %d events skipped by --max-nodes %d\n", skipped, r.maxNodes)
	return err
}

func (o *clusterOptions) reclaim(ctx context.Context, name string, notice time.Duration, provider string) error {
	if notice < 0 {
		return fmt.Errorf("--notice %s: must be 0 or more", notice)
	}
	cl, err := o.cluster()
	if err != nil {
		return err
	}
	if provider != "" {
		cs, err := cl.Clientset()
		if err != nil {
			return err
		}
		node, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("reclaim %s: %w", name, err)
		}
		if got := node.Labels[etjobv1.LabelCloudProvider]; got != provider {
			return fmt.Errorf("--provider %s: node %s emulates %s, and its agent reads %s notices; pick a node of that cloud (kubectl get nodes -L etjob.dev/cloud-provider)",
				provider, name, got, got)
		}
	}
	return cl.Reclaim(ctx, name, notice)
}

// buildControlPlane runs the embedded hack/build-controlplane.sh, streaming
// its progress, and returns the directory of the binaries.
func buildControlPlane(streams cli.IOStreams) (string, error) {
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
