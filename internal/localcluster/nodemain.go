package localcluster

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	vklog "github.com/virtual-kubelet/virtual-kubelet/log"
	vkslog "github.com/virtual-kubelet/virtual-kubelet/log/slog"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/etjob/etjob/internal/localcluster/processnode"
)

// NodeMain runs one process node with command-line args and returns the exit
// code; `etjob internal node` (what `etjob cluster` starts) and cmd/etjob-node
// run it. It serves until SIGTERM or SIGINT, then stops its pods' processes.
func NodeMain(args []string) int {
	if err := runNode(args); err != nil {
		fmt.Fprintln(os.Stderr, "etjob-node:", err)
		return 1
	}
	return 0
}

func runNode(args []string) error {
	fs := flag.NewFlagSet("etjob-node", flag.ContinueOnError)
	var (
		kubeconfig = fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "path to the kubeconfig of the cluster to join")
		nodeName   = fs.String("node-name", "", "name of the Node object (required)")
		nodeIP     = fs.String("node-ip", "", "the node's IPv4 loopback address, e.g. 127.0.1.1; pod IPs come from its /24 (required)")
		labels     = fs.String("labels", "", "extra node labels, k=v,k2=v2 (e.g. karpenter.sh/capacity-type=spot,etjob.dev/price-per-hour=0.91)")
		workDir    = fs.String("work-dir", "", "directory for per-pod directories and container logs (required)")
		verbose    = fs.Bool("v", false, "log debug messages")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *nodeName == "" || *nodeIP == "" || *workDir == "" {
		return fmt.Errorf("--node-name, --node-ip and --work-dir are required")
	}
	lbls, err := processnode.ParseLabels(*labels)
	if err != nil {
		return fmt.Errorf("--labels: %w", err)
	}
	// nodeutil.NewNode builds a default client from $KUBECONFIG before it
	// takes ours, and warns when that fails; point it at the same file.
	if *kubeconfig != "" {
		_ = os.Setenv("KUBECONFIG", *kubeconfig)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return fmt.Errorf("--kubeconfig %q: %w", *kubeconfig, err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	vklog.L = vkslog.FromSlog(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("node", *nodeName))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	return processnode.Run(ctx, processnode.Options{
		Client:   client,
		NodeName: *nodeName,
		NodeIP:   *nodeIP,
		Labels:   lbls,
		WorkDir:  *workDir,
	})
}
