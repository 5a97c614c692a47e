package controller

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime/debug"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"

	"github.com/etjob/etjob/internal/logging"
)

// Main runs the controller with command-line args and returns the exit code.
// cmd/etjob-controller runs it, in the chart's Deployment and in the local
// cluster.
func Main(args []string, version string) int {
	fs := flag.NewFlagSet("etjob-controller", flag.ContinueOnError)
	var (
		kubeconfig    = fs.String("kubeconfig", "", "kubeconfig file (default: in-cluster, then $KUBECONFIG)")
		metricsAddr   = fs.String("metrics-bind-address", ":8443", "address of the Prometheus metrics endpoint (0 disables it)")
		metricsSecure = fs.Bool("metrics-secure", true, "serve metrics over HTTPS to authenticated callers allowed to get /metrics (ClusterRole etjob-metrics-reader); false serves plain HTTP to anyone (local use)")
		probeAddr     = fs.String("health-probe-bind-address", ":8081", "address of /healthz and /readyz")
		pprofAddr     = fs.String("pprof-bind-address", "0", "address of net/http/pprof, unauthenticated: bind it to loopback (0 disables it)")
		leaderElect   = fs.Bool("leader-elect", false, "elect a leader, so that only one replica reconciles")
		leaderElectNS = fs.String("leader-election-namespace", "", "namespace of the leader election Lease (default: the pod's)")
		watchNS       = fs.String("namespaces", "", "comma-separated namespaces whose ElasticJobs the controller reconciles and whose objects it caches (default: every namespace)")
		concurrency   = fs.Int("concurrency", 4, "jobs reconciled in parallel")
		qps           = fs.Float64("kube-api-qps", 50, "client-side QPS limit towards the API server")
		burst         = fs.Int("kube-api-burst", 100, "client-side burst towards the API server")
		memoryLimit   = fs.String("memory-limit", "", "the container's memory limit (the chart passes limits.memory): the Go heap is held to 90% of it (GOMEMLIMIT), so the garbage collector works harder before the kernel kills; GOMEMLIMIT, when set, wins")
		gcPercent     = fs.Int("gc-percent", 0, "the Go garbage collector's target (GOGC): the heap may grow this many percent over the live heap before a collection; lower holds less memory for more CPU (0: the runtime's, 100 or $GOGC)")
		priceTable    = fs.String("price-table", "", "NAMESPACE/NAME of the ConfigMap with the platform admin's node prices (its key \"prices\": lines of <instance type> <capacity type> <US dollars an hour>); where set, a node's own etjob.dev/price-per-hour may only raise its row's price, and a node the table does not list costs its dearest (docs/security.md, N7). Empty, or the ConfigMap absent: every node's own price is trusted")
		priceKeys     = fs.String("price-key-label-prefix", "", "where a node's price-table row is read from: its labels PREFIXinstance-type and PREFIXcapacity-type (spot or on-demand), which you set; use a prefix under node-restriction.kubernetes.io/ (e.g. node-restriction.kubernetes.io/etjob-), which a kubelet cannot set on its own Node, so that a rooted node cannot pass for a cheaper row (docs/security.md, H2). A node without them costs the table's dearest row. Empty: the instance-type and capacity labels its kubelet writes")
		priceRequired = fs.Bool("price-table-required", false, "fail closed: while the --price-table ConfigMap is absent or has never parsed, no node has a price (a node's own etjob.dev/price-per-hour is not believed: price limits and budgets bound nothing, the bill counts nothing), and a table once read stays in force when its ConfigMap is deleted (docs/security.md, M5). False: an absent table trusts every node's own price")
		podNotices    = fs.String("pod-notice-events", PodNoticeEventsAgentless, "which pod Events are reclamation notices: \"agentless\", those about a worker on a node no etjob agent serves (ECI's SpotToBeReleased, an ACS BestEffort eviction, spec.spot.preemptionReasons; any kubelet can post one, docs/security.md, M2); \"off\", none: a pod hears its notice from its node's agent alone")
		launcherNode  = fs.String("launcher-node-label", "", "KEY=VALUE: every launcher (it holds its job's store secret, a horovod one exec rights into its namespace) requires nodes with this label; use a key under node-restriction.kubernetes.io/, which a kubelet cannot set on its own Node, and label the nodes you trust (docs/security.md, H2). Empty: launchers avoid spot capacity by its labels, which a rooted kubelet may rewrite")
		decisionsFile = fs.String("record-decisions", "", "append every decision (snapshot, time, plan) as JSON lines to this file, for `etjob-local chaos --replay`")
	)
	var logOpts logging.Options
	logOpts.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	logger, err := logOpts.New(os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etjob-controller:", err)
		return 2
	}
	logging.Install(logger)
	log := ctrl.Log.WithName("setup")
	if *gcPercent < 0 {
		log.Error(fmt.Errorf("%d: must be positive (0: the runtime's default)", *gcPercent), "--gc-percent")
		return 2
	} else if *gcPercent > 0 {
		debug.SetGCPercent(*gcPercent)
	}
	if soft, err := SoftMemoryLimit(*memoryLimit, os.Getenv("GOMEMLIMIT")); err != nil {
		log.Error(err, "--memory-limit")
		return 2
	} else if soft > 0 {
		debug.SetMemoryLimit(soft)
		log.Info("holding the Go heap under 90% of the memory limit", "limit", *memoryLimit, "GOMEMLIMIT", soft)
	}

	cfg, err := ctrl.GetConfig()
	if *kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", *kubeconfig)
	}
	if err != nil {
		log.Error(err, "loading the kubeconfig")
		return 1
	}
	cfg.QPS, cfg.Burst = float32(*qps), *burst
	nss, err := ParseNamespaces(*watchNS)
	if err != nil {
		log.Error(err, "--namespaces")
		return 2
	}
	mgr, err := ctrl.NewManager(cfg, ManagerOptions(Options{MetricsAddr: *metricsAddr, ProbeAddr: *probeAddr,
		SecureMetrics: *metricsSecure, PprofAddr: *pprofAddr, LeaderElect: *leaderElect, LeaderElectNamespace: *leaderElectNS, Namespaces: nss}))
	if err != nil {
		log.Error(err, "creating the manager")
		return 1
	}
	table, err := ParsePriceTableFlag(*priceTable)
	if err != nil {
		log.Error(err, "--price-table")
		return 2
	}
	keysWarning, err := ParsePriceKeyLabelPrefix(*priceKeys)
	if err != nil {
		log.Error(err, "--price-key-label-prefix")
		return 2
	}
	if keysWarning != "" {
		log.Info("--price-key-label-prefix: " + keysWarning)
	}
	prices := PriceTableFlags{Key: table, KeyLabelPrefix: *priceKeys, Required: *priceRequired}
	if *priceRequired && table.Name == "" {
		log.Error(fmt.Errorf("names no table"), "--price-table-required: set --price-table too")
		return 2
	}
	noPodNotices, err := ParsePodNoticeEvents(*podNotices)
	if err != nil {
		log.Error(err, "--pod-notice-events")
		return 2
	}
	launcherLabel, warning, err := ParseNodeLabel(*launcherNode)
	if err != nil {
		log.Error(err, "--launcher-node-label")
		return 2
	}
	if warning != "" {
		log.Info("--launcher-node-label: " + warning)
	}
	var decisions *DecisionRecorder
	if *decisionsFile != "" {
		if decisions, err = NewDecisionRecorder(*decisionsFile); err != nil {
			log.Error(err, "opening the decision record")
			return 1
		}
	}
	trust := Trust{Prices: prices, LauncherNode: launcherLabel, NoPodNoticeEvents: noPodNotices}
	if err := Setup(context.Background(), mgr, *concurrency, decisions, trust); err != nil {
		log.Error(err, "setting up the controller")
		return 1
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		log.Error(err, "adding the health check")
		return 1
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		log.Error(err, "adding the ready check")
		return 1
	}
	log.Info("starting the etjob controller", "version", version)
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "running the manager")
		return 1
	}
	return 0
}

// SoftMemoryLimit is the Go memory limit for a container memory limit
// (a quantity: 512Mi, or bytes as the downward API gives it): 90% of it, the
// rest left to what the Go runtime does not count (stacks' slack, the
// binary, cgo-free buffers). It is 0 (leave the runtime alone) without a
// limit or when $GOMEMLIMIT is set, which the runtime already honours.
func SoftMemoryLimit(limit, gomemlimit string) (int64, error) {
	if limit == "" || gomemlimit != "" {
		return 0, nil
	}
	q, err := resource.ParseQuantity(limit)
	if err != nil {
		return 0, fmt.Errorf("%q: %w", limit, err)
	}
	if q.Value() <= 0 {
		return 0, fmt.Errorf("%q: must be positive", limit)
	}
	return q.Value() / 10 * 9, nil
}

// ParseNamespaces parses --namespaces: comma-separated namespace names,
// each a DNS label.
func ParseNamespaces(s string) ([]string, error) {
	var out []string
	for _, n := range strings.Split(s, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		if errs := validation.IsDNS1123Label(n); len(errs) > 0 {
			return nil, fmt.Errorf("%q is not a namespace name: %s", n, strings.Join(errs, "; "))
		}
		out = append(out, n)
	}
	return out, nil
}
