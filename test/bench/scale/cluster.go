package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/scheme"
)

// kwokNodeAnnotation marks the nodes kwok manages (kwok's own convention).
const kwokNodeAnnotation = "kwok.x-k8s.io/node"

// kwokStages are the stage YAMLs (from kwok's module, copied by
// hack/install-kwok.sh) this benchmark plays: nodes become Ready once, pods
// bound to them become Running and Ready, deleted pods go away. No heartbeat
// stage and no node leases: no node-lifecycle controller runs to miss them,
// and they would only add API load that is not the controller's.
var kwokStages = []string{"node/fast/node-initialize.yaml", "pod/fast/pod-ready.yaml", "pod/fast/pod-delete.yaml"}

// cluster is the control plane, kwok, the scheduler and the controller.
type cluster struct {
	dir   string
	env   *envtest.Environment
	admin client.Client
	// tracer records the status changes of the job of a scale event.
	tracer statusTracer
	cfg    *rest.Config
	audit  *auditLog
	procs  []*proc

	controllerPID int
	metricsURL    string
}

// proc is a process this benchmark started.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

func startProc(dir, name, path string, args ...string) (*proc, error) {
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return p, nil
}

// alive returns an error when the process exited, naming its log.
func (p *proc) alive(dir string) error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited (%v); see %s", p.name, p.err, filepath.Join(dir, p.name+".log"))
	default:
		return nil
	}
}

// stop sends SIGTERM, then SIGKILL after 10 s, to this process only.
func (p *proc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// startControlPlane starts kube-apiserver (with the audit log) and etcd on
// free ports (envtest picks them) and installs the CRDs.
func startControlPlane(o *options, repoRoot, assets string) (*cluster, error) {
	c := &cluster{dir: o.dir}
	policy := filepath.Join(o.dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o644); err != nil {
		return nil, err
	}
	auditPath := filepath.Join(o.dir, "audit.log")
	c.audit = newAuditLog(auditPath, controllerUser)
	apiLog, err := os.Create(filepath.Join(o.dir, "kube-apiserver.log"))
	if err != nil {
		return nil, err
	}
	etcdLog, err := os.Create(filepath.Join(o.dir, "etcd.log"))
	if err != nil {
		return nil, err
	}
	api := &envtest.APIServer{Out: apiLog, Err: apiLog, StartTimeout: 2 * time.Minute}
	api.Configure().
		Set("audit-policy-file", policy).
		Set("audit-log-path", auditPath).
		// blocking: each request's line is written before its response, so a
		// count taken after the controller's last response is complete.
		Set("audit-log-mode", "blocking").
		Set("audit-log-maxsize", "0").
		Set("max-requests-inflight", fmt.Sprint(o.apiInflight)).
		Set("max-mutating-requests-inflight", fmt.Sprint(o.apiInflight/2))
	etcd := &envtest.Etcd{Out: etcdLog, Err: etcdLog, StartTimeout: time.Minute}
	// envtest already runs etcd with --unsafe-no-fsync; a larger quota holds
	// 1,000 × 32 pods with their history until the API server compacts it.
	etcd.Configure().Set("quota-backend-bytes", fmt.Sprint(8<<30))
	c.env = &envtest.Environment{
		BinaryAssetsDirectory: assets,
		ControlPlane:          envtest.ControlPlane{APIServer: api, Etcd: etcd},
		CRDInstallOptions: envtest.CRDInstallOptions{
			Paths: []string{filepath.Join(repoRoot, "config/crd/bases")}, ErrorIfPathMissing: true,
		},
	}
	cfg, err := c.env.Start()
	if err != nil {
		return nil, fmt.Errorf("starting kube-apiserver and etcd (logs in %s): %w", o.dir, err)
	}
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = 2000, 4000
	c.cfg = cfg
	c.admin, err = client.New(cfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		c.stop()
		return nil, err
	}
	return c, nil
}

// kubeconfig writes a kubeconfig for a new user in system:masters.
func (c *cluster) kubeconfig(user string) (string, error) {
	u, err := c.env.AddUser(envtest.User{Name: user, Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return "", err
	}
	b, err := u.KubeConfig()
	if err != nil {
		return "", err
	}
	path := filepath.Join(c.dir, user+".kubeconfig")
	return path, os.WriteFile(path, b, 0o600)
}

// createNodes creates n kwok nodes that hold podsPerNode pods each, and
// removes the not-ready taint that the TaintNodesByCondition admission plugin
// puts on new nodes (the node-lifecycle controller, which would remove it,
// does not run here).
func (c *cluster) createNodes(ctx context.Context, n, podsPerNode int) error {
	errs := make(chan error, n)
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			errs <- c.createNode(ctx, fmt.Sprintf("kwok-node-%04d", i), podsPerNode)
		}()
	}
	wg.Wait()
	close(errs)
	return errors.Join(func() []error {
		var out []error
		for err := range errs {
			out = append(out, err)
		}
		return out
	}()...)
}

func (c *cluster) createNode(ctx context.Context, name string, pods int) error {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("256"),
		corev1.ResourceMemory: resource.MustParse("2Ti"),
		corev1.ResourcePods:   *resource.NewQuantity(int64(pods), resource.DecimalSI),
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Labels:      map[string]string{"type": "kwok", corev1.LabelHostname: name},
			Annotations: map[string]string{kwokNodeAnnotation: "fake"},
		},
		Status: corev1.NodeStatus{Capacity: capacity, Allocatable: capacity},
	}
	if err := c.admin.Create(ctx, node); err != nil {
		return fmt.Errorf("creating node %s: %w", name, err)
	}
	patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"taints":null}}`))
	if err := c.admin.Patch(ctx, node, patch); err != nil {
		return fmt.Errorf("removing the taints of node %s: %w", name, err)
	}
	return nil
}

// startKwok starts kwok on the nodes annotated kwok.x-k8s.io/node=fake.
func (c *cluster) startKwok(kwokDir string) error {
	kc, err := c.kubeconfig("kwok")
	if err != nil {
		return err
	}
	// The options kwok's defaulting leaves at zero when a config file is given.
	conf := `apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  podPlayStageParallelism: 16
  nodePlayStageParallelism: 4
  nodeLeaseParallelism: 4
  podsOnNodeSyncParallelism: 4
  enablePodsOnNodeSyncListPager: true
  enablePodsOnNodeSyncStreamWatch: false
`
	for _, s := range kwokStages {
		b, err := os.ReadFile(filepath.Join(kwokDir, "stage", s))
		if err != nil {
			return fmt.Errorf("kwok stage (run hack/install-kwok.sh): %w", err)
		}
		stage := string(b)
		if strings.HasSuffix(s, "/pod-ready.yaml") {
			if stage, err = holdReady(stage); err != nil {
				return err
			}
		}
		conf += "---\n" + stage
	}
	confPath := filepath.Join(c.dir, "kwok.yaml")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return err
	}
	p, err := startProc(c.dir, "kwok", filepath.Join(kwokDir, "kwok"),
		"--kubeconfig", kc, "--config", confPath,
		"--manage-all-nodes=false", "--manage-nodes-with-annotation-selector", kwokNodeAnnotation+"=fake",
		"--node-lease-duration-seconds=0",
		// The default 10.0.0.0/24 holds 254 pod IPs; 1,000 × 32 pods need more.
		"--cidr", "10.64.0.0/10")
	if err != nil {
		return err
	}
	c.procs = append(c.procs, p)
	return nil
}

// holdEnv in the first container of a job's worker template keeps kwok from
// making its workers with an index at or above the value Ready: the benchmark
// makes them Ready itself, one at a time (the "one-by-one" scale events). It
// is an environment variable because the API server prunes the template's
// metadata (the CRD declares workerTemplate.metadata without properties).
const holdEnv = "ETJOB_BENCH_HOLD_READY_FROM_INDEX"

// holdReady adds to kwok's pod-ready stage a requirement that skips held
// workers (a jq expression, as kwok's selectors are).
func holdReady(stage string) (string, error) {
	const anchor = "  selector:\n    matchExpressions:\n"
	if !strings.Contains(stage, anchor) {
		return "", fmt.Errorf("kwok's pod-ready stage has no %q to extend", anchor)
	}
	hold := fmt.Sprintf(`    - key: '((.metadata.labels["%s"] // "-1") | tonumber) >= (([.spec.containers[0].env[]? | select(.name == "%s") | .value][0] // "1000000000") | tonumber)'
      operator: 'NotIn'
      values: ['true']
`, etjobv1.LabelWorkerIndex, holdEnv)
	return strings.Replace(stage, anchor, anchor+hold, 1), nil
}

// startScheduler starts the real kube-scheduler, without serving (no port)
// and without leader election, with a client QPS that does not make it the
// bottleneck of the ramp.
func (c *cluster) startScheduler(assets string, qps int) error {
	kc, err := c.kubeconfig("kube-scheduler")
	if err != nil {
		return err
	}
	conf := fmt.Sprintf(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: %s
  qps: %d
  burst: %d
leaderElection:
  leaderElect: false
`, kc, qps, 2*qps)
	confPath := filepath.Join(c.dir, "kube-scheduler.yaml")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return err
	}
	p, err := startProc(c.dir, "kube-scheduler", filepath.Join(assets, "kube-scheduler"), "--config", confPath, "--secure-port=0")
	if err != nil {
		return err
	}
	c.procs = append(c.procs, p)
	return nil
}

// startController runs the controller as it runs for real: its own process
// (cmd/etjob-controller, what `etjob-local cluster` and the image run), its
// own user, its default client QPS unless told otherwise.
func (c *cluster) startController(o *options, etjob string) error {
	kc, err := c.kubeconfig(controllerUser)
	if err != nil {
		return err
	}
	metrics, err := freeAddr()
	if err != nil {
		return err
	}
	probe, err := freeAddr()
	if err != nil {
		return err
	}
	args := []string{"--kubeconfig", kc, "--metrics-secure=false",
		"--metrics-bind-address", metrics, "--health-probe-bind-address", probe,
		"--concurrency", fmt.Sprint(o.concurrency)}
	if o.controllerQPS > 0 {
		args = append(args, "--kube-api-qps", fmt.Sprint(o.controllerQPS), "--kube-api-burst", fmt.Sprint(o.controllerBurst))
	}
	p, err := startProc(c.dir, "controller", etjob, append(args, o.controllerArgs...)...)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, p)
	c.controllerPID = p.cmd.Process.Pid
	c.metricsURL = "http://" + metrics + "/metrics"
	deadline := time.Now().Add(time.Minute)
	for {
		if err := p.alive(c.dir); err != nil {
			return err
		}
		resp, err := http.Get("http://" + probe + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("controller not ready after 1m; see %s", filepath.Join(c.dir, "controller.log"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// alive checks that every started process still runs.
func (c *cluster) alive() error {
	for _, p := range c.procs {
		if err := p.alive(c.dir); err != nil {
			return err
		}
	}
	return nil
}

// stop stops the processes in reverse order of start, then the control plane.
func (c *cluster) stop() {
	for i := len(c.procs) - 1; i >= 0; i-- {
		c.procs[i].stop()
	}
	if c.env != nil {
		_ = c.env.Stop()
	}
}

// freeAddr returns a free 127.0.0.1 port (the local cluster binds fixed ones;
// this benchmark must never collide with it).
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// waitNodesReady waits until n nodes report Ready (kwok's node-initialize).
func (c *cluster) waitNodesReady(ctx context.Context, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var nodes corev1.NodeList
		if err := c.admin.List(ctx, &nodes); err != nil {
			return err
		}
		ready := 0
		for _, nd := range nodes.Items {
			for _, cond := range nd.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		if ready >= n {
			return nil
		}
		if err := c.alive(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d kwok nodes Ready after %s; see %s", ready, n, timeout, filepath.Join(c.dir, "kwok.log"))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// buildController builds the etjob-controller binary from the working tree
// into dir.
func buildController(repoRoot, dir string) (string, error) {
	out := filepath.Join(dir, "etjob-controller")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/etjob-controller")
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/etjob-controller: %w\n%s", err, b)
	}
	return out, nil
}

// installKwok runs hack/install-kwok.sh (once per machine; then instant) and
// returns kwok's directory.
func installKwok(repoRoot string) (string, error) {
	cmd := exec.Command(filepath.Join(repoRoot, "hack/install-kwok.sh"))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/install-kwok.sh: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}
