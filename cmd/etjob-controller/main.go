// Command etjob-controller runs the ElasticJob controller: wiring only.
package main

import (
	"context"
	"flag"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/etjob/etjob/internal/controller"
)

// version is set at build time (-X main.version=...).
var version = "dev"

func main() {
	var (
		metricsAddr   string
		probeAddr     string
		leaderElect   bool
		leaderElectNS string
		concurrency   int
		kubeAPIQPS    float64
		kubeAPIBurst  int
	)
	flag.StringVar(&metricsAddr, "metrics-bind-address", ":8080", "address of the Prometheus metrics endpoint (0 disables it)")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz")
	flag.BoolVar(&leaderElect, "leader-elect", false, "elect a leader, so that only one replica reconciles")
	flag.StringVar(&leaderElectNS, "leader-election-namespace", "", "namespace of the leader election Lease (default: the pod's)")
	flag.IntVar(&concurrency, "concurrency", 4, "jobs reconciled in parallel")
	flag.Float64Var(&kubeAPIQPS, "kube-api-qps", 50, "client-side QPS limit towards the API server")
	flag.IntVar(&kubeAPIBurst, "kube-api-burst", 100, "client-side burst towards the API server")
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	log := ctrl.Log.WithName("setup")

	cfg := ctrl.GetConfigOrDie()
	cfg.QPS, cfg.Burst = float32(kubeAPIQPS), kubeAPIBurst
	mgr, err := ctrl.NewManager(cfg, controller.ManagerOptions(metricsAddr, probeAddr, leaderElect, leaderElectNS))
	if err != nil {
		log.Error(err, "creating the manager")
		os.Exit(1)
	}
	if err := controller.Setup(context.Background(), mgr, concurrency); err != nil {
		log.Error(err, "setting up the controller")
		os.Exit(1)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		log.Error(err, "adding the health check")
		os.Exit(1)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		log.Error(err, "adding the ready check")
		os.Exit(1)
	}
	log.Info("starting the etjob controller", "version", version)
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "running the manager")
		os.Exit(1)
	}
}
