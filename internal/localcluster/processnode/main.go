package processnode

import (
	"context"
	"crypto/x509"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	vklog "github.com/virtual-kubelet/virtual-kubelet/log"
	vkslog "github.com/virtual-kubelet/virtual-kubelet/log/slog"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/emucloud"
	"github.com/etjob/etjob/internal/logging"
)

// Main runs one process node with command-line args and returns the exit
// code; cmd/etjob-node (what `etjob-local cluster` starts) runs it. It serves until SIGTERM or SIGINT, then stops its pods' processes.
func Main(args []string) int {
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
		taints     = fs.String("taints", "", "taints to register with, key[=value]:Effect,... (e.g. CriticalAddonsOnly=true:NoSchedule)")
		workDir    = fs.String("work-dir", "", "directory for per-pod directories and container logs (required)")
		gpus       = fs.Int("gpus", 1, "emulated accelerators (nvidia.com/gpu) the node advertises")
		cpus       = fs.String("cpus", "", "CPUs the node advertises, a quantity (its instance type's; default: this machine's); not enforced on the host")
		memory     = fs.String("memory", "", "memory the node advertises, a quantity such as 61Gi (its instance type's; default 8Gi); not enforced on the host")
		mdListen   = fs.String("metadata-listen", "", "serve the node's emulated cloud metadata service and its control endpoints here")
		mdProvider = fs.String("metadata-provider", "", "the one cloud (alibaba, aws, gcp, azure) whose metadata paths the service answers, as a real VM's does; empty answers all four")
		clientCA   = fs.String("client-ca-file", "", "CA bundle that signs the kubelet API's callers' client certificates (the API server's); unset, the kubelet API serves anyone who reaches it")
		imagesFile = fs.String("images", "", "the node's image table, a JSON list of {image, env, files} (Image): what each container image brings")
	)
	var logOpts logging.Options
	logOpts.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *nodeName == "" || *nodeIP == "" || *workDir == "" {
		return fmt.Errorf("--node-name, --node-ip and --work-dir are required")
	}
	capacity := corev1.ResourceList{etjobv1.ResourceGPU: *resource.NewQuantity(int64(*gpus), resource.DecimalSI)}
	for _, f := range []struct {
		flag, value string
		name        corev1.ResourceName
	}{{"--cpus", *cpus, corev1.ResourceCPU}, {"--memory", *memory, corev1.ResourceMemory}} {
		if f.value == "" {
			continue
		}
		q, err := resource.ParseQuantity(f.value)
		if err != nil || q.Sign() <= 0 {
			return fmt.Errorf("%s %q: want a positive quantity such as 8 or 61Gi", f.flag, f.value)
		}
		capacity[f.name] = q
	}
	lbls, err := ParseLabels(*labels)
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
	switch *mdProvider {
	case "", emucloud.Alibaba, emucloud.AWS, emucloud.GCP, emucloud.Azure:
	default:
		return fmt.Errorf("--metadata-provider %q: want alibaba, aws, gcp, azure or empty (all four)", *mdProvider)
	}
	tnts, err := ParseTaints(*taints)
	if err != nil {
		return fmt.Errorf("--taints: %w", err)
	}
	var cas *x509.CertPool
	if *clientCA != "" {
		pem, err := os.ReadFile(*clientCA)
		if err != nil {
			return fmt.Errorf("--client-ca-file: %w", err)
		}
		cas = x509.NewCertPool()
		if !cas.AppendCertsFromPEM(pem) {
			return fmt.Errorf("--client-ca-file %s: no PEM certificate in it", *clientCA)
		}
	}
	images, err := ReadImages(*imagesFile)
	if err != nil {
		return fmt.Errorf("--images: %w", err)
	}
	api, err := url.Parse(cfg.Host)
	if err != nil {
		return fmt.Errorf("--kubeconfig: server %q: %w", cfg.Host, err)
	}
	logger, err := logOpts.New(os.Stderr)
	if err != nil {
		return err
	}
	logger = logger.With("node", *nodeName)
	slog.SetDefault(logger)
	vklog.L = vkslog.FromSlog(logger)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if *mdListen != "" {
		ln, err := net.Listen("tcp", *mdListen)
		if err != nil {
			return fmt.Errorf("--metadata-listen: %w", err)
		}
		md := emucloud.New()
		md.Only = *mdProvider
		srv := &http.Server{Handler: emucloud.Handler(md), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
	}
	return Run(ctx, Options{
		Client:    client,
		NodeName:  *nodeName,
		NodeIP:    *nodeIP,
		Labels:    lbls,
		Taints:    tnts,
		ClientCAs: cas,
		WorkDir:   *workDir,
		Capacity:  capacity,
		Images:    images,
		APIServer: api.Host,
	})
}
