package agent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/agent/notice"
	"github.com/etjob/etjob/internal/agent/price"
	"github.com/etjob/etjob/internal/logging"
)

// Main runs the agent with command-line args and returns the exit code;
// cmd/etjob-agent runs it, and another binary (the local cluster) can run an
// agent in-process with the same flags. It serves until SIGTERM or SIGINT.
func Main(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, args); errors.Is(err, flag.ErrHelp) {
		return 0
	} else if err != nil {
		fmt.Fprintln(os.Stderr, "etjob-agent:", err)
		return 1
	}
	return 0
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("etjob-agent", flag.ContinueOnError)
	var (
		kubeconfig   = fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig path; empty means in-cluster config")
		nodeName     = fs.String("node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME)")
		provider     = fs.String("provider", "auto", "cloud notice source: alibaba, aws, gcp, azure, none or auto (probe each metadata service)")
		metadataURL  = fs.String("metadata-url", "", "override the metadata service base URL (an emulator), e.g. http://127.0.0.1:8080")
		priceSource  = fs.String("price-source", price.None, "feed of this node's spot price, copied into its etjob.dev/price-per-hour annotation: none, or local (the local cluster's emulated market at --metadata-url)")
		pollInterval = fs.Duration("poll-interval", time.Second, "time between metadata reads (a changed reading is read again 100 ms later to confirm it)")
		confirm      = fs.Int("confirm", 2, "identical metadata readings needed before a change is believed")
		listen       = fs.String("listen", "", "signal endpoint address (default the node's InternalIP, port 9477)")
		window       = fs.Duration("k8s-notice-window", DefaultKubernetesNoticeWindow, "deadline given to a Kubernetes-side notice (a taint such as ToBeDeletedByClusterAutoscaler)")
		gcpWindow    = fs.Duration("gcp-preemption-window", notice.DefaultGCPWindow, "deadline given to a GCP preemption (GCP announces none; GKE pods get about 15s)")
		azureVM      = fs.String("azure-vm-name", "", "this VM's name in Azure scheduled events (default: accept events for any VM)")
		audiences    = fs.String("token-audiences", etjobv1.AgentTokenAudience, "comma-separated audiences pod tokens must carry (the workers' projected token is for "+etjobv1.AgentTokenAudience+`; "" takes the API server's own)`)
		insecure     = fs.Bool("insecure-skip-pod-auth", false, "serve any caller as the pod it names, without a token (local debugging only)")
	)
	var logOpts logging.Options
	logOpts.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *nodeName == "" {
		return fmt.Errorf("--node-name is required (or set $NODE_NAME, e.g. from the downward API spec.nodeName)")
	}
	if *pollInterval <= 0 {
		return fmt.Errorf("--poll-interval %v: must be positive", *pollInterval)
	}
	if *confirm < 1 {
		return fmt.Errorf("--confirm %d: must be at least 1", *confirm)
	}
	log, err := logOpts.New(os.Stderr)
	if err != nil {
		return err
	}

	var cfg *rest.Config
	if *kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", *kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return fmt.Errorf("--kubeconfig %q: %w", *kubeconfig, err)
	}
	cfg.UserAgent = "etjob-agent/" + *nodeName
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	// TokenReviews get a client of their own: a flood of them never
	// queues the Node markings behind it (client-go's default is 5 QPS).
	rcfg := rest.CopyConfig(cfg)
	rcfg.QPS, rcfg.Burst = ReviewsPerSecond, ReviewBurst
	reviewClient, err := kubernetes.NewForConfig(rcfg)
	if err != nil {
		return err
	}

	no := notice.Options{BaseURL: *metadataURL, AzureVMName: *azureVM, GCPWindow: *gcpWindow}
	var src notice.Source
	var detect func(context.Context) notice.Source
	switch *provider {
	case "none":
	case "auto":
		if src = notice.Detect(ctx, no, 2*time.Second); src == nil {
			// A metadata service slow at boot: probe again (Agent.redetect).
			detect = func(ctx context.Context) notice.Source { return notice.Detect(ctx, no, 2*time.Second) }
			log.Info("no cloud metadata service answered yet: Kubernetes-side notices only; probing again with back-off")
		} else {
			log.Info("detected cloud provider", "provider", src.Provider())
		}
	default:
		if src, err = notice.New(*provider, no); err != nil {
			return fmt.Errorf("--provider: %w", err)
		}
	}
	prices, err := price.New(*priceSource, *metadataURL)
	if err != nil {
		return fmt.Errorf("--price-source: %w", err)
	}
	if *insecure {
		log.Warn("--insecure-skip-pod-auth: any local caller can read any pod's signal; for local debugging only")
	}
	var auds []string
	if *audiences != "" {
		auds = strings.Split(*audiences, ",")
	}
	a, err := New(Options{
		Client:                 client,
		NodeName:               *nodeName,
		Source:                 src,
		Detect:                 detect,
		PriceSource:            prices,
		PollInterval:           *pollInterval,
		Confirm:                *confirm,
		KubernetesNoticeWindow: *window,
		Listen:                 *listen,
		ReviewClient:           reviewClient, // the TokenReviews and the issuer's keys (New)
		Authenticator:          NewTokenReviewAuthenticator(reviewClient, auds, 60*time.Second, nil),
		InsecureSkipPodAuth:    *insecure,
		Log:                    log,
	})
	if err != nil {
		return err
	}
	return a.Run(ctx)
}
