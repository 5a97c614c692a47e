package processnode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

const (
	// maxGracePeriod caps a pod's termination grace period so that deleting a
	// process pod never takes longer than this before SIGKILL.
	maxGracePeriod = 30 * time.Second
	// minGracePeriod is a kubelet's minimum (pkg/kubelet/kuberuntime
	// minimumGracePeriodInSeconds): even a force delete gets SIGTERM first.
	minGracePeriod = 2 * time.Second
	// initialBackoff and maxBackoff are a kubelet's crash-loop back-off.
	initialBackoff = 10 * time.Second
	maxBackoff     = 5 * time.Minute
	// defaultPath is used when the node process has no PATH.
	defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// ProviderConfig configures a Provider.
type ProviderConfig struct {
	// NodeName is the node the provider's pods are bound to.
	NodeName string
	// NodeIP is the node's IPv4 loopback address, reported as status.hostIP;
	// pod IPs come from the /24 that holds it.
	NodeIP string
	// WorkDir holds one directory per pod, with the containers' log files.
	WorkDir string
	// ConfigMaps and Secrets resolve env and envFrom references; nil makes
	// such references "not found".
	ConfigMaps corev1listers.ConfigMapLister
	Secrets    corev1listers.SecretLister
	// PricePerHour is the node's price (its etjob.dev/price-per-hour
	// label), written into the node's billing ledger.
	PricePerHour string
	// Images is the node's image table: what each container image brings
	// (environment and files). An image it does not match runs the host as
	// it is.
	Images Images
	// APIServer is host:port of the API server, given to every container as
	// KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT, as a kubelet does
	// for the default/kubernetes Service (in-cluster clients need them).
	APIServer string
	// Client, when set, lets the provider remove a deleted pod from the API
	// as soon as its processes stopped and its terminal status was written,
	// as a kubelet's status manager does (otherwise virtual-kubelet removes it
	// only when the grace period ends); list every pod of the cluster for the
	// pods' hosts file; look up PersistentVolumeClaims and their volumes; and
	// request service account tokens.
	Client kubernetes.Interface
}

// Provider is a virtual-kubelet provider whose pods run as host processes.
// It implements nodeutil.Provider and node.PodNotifier. It is safe for
// concurrent use.
type Provider struct {
	nodeName string
	nodeIP   string
	workDir  string
	price    string
	env      envSources
	client   kubernetes.Interface
	images   Images
	apiHost  string
	apiPort  string
	// unshare is the path of util-linux unshare when pods get namespaces of
	// their own, "" when they run as plain processes (see detectSandbox).
	unshare string
	// hostsPath is the node's hosts file, bind-mounted as every pod's
	// /etc/hosts and kept current from all pods of the cluster.
	hostsPath string
	// clusterPods lists every pod of the cluster; nil without a client.
	clusterPods corev1listers.PodLister
	// clusterSlices lists every EndpointSlice of the cluster (the headless
	// Services' names in the hosts file); nil without a client.
	clusterSlices discoverylisters.EndpointSliceLister
	// wake asks the background loop to rewrite the hosts file now.
	wake     chan struct{}
	stop     chan struct{}
	stopOnce sync.Once

	mu     sync.Mutex
	pods   map[string]*podRun // by namespace/name
	ips    *ipAllocator
	notify func(*corev1.Pod)
}

// podRun is one pod known to the provider. Its fields are guarded by the
// Provider's mu, except notifyMu, which orders the pod's notifications.
type podRun struct {
	pod        *corev1.Pod // spec as last received, status as owned here
	ip         netip.Addr
	dir        string
	containers []*containerRun
	deleting   bool
	forgotten  bool
	killTimer  *time.Timer
	// started is set once the volumes were set up and the containers first
	// started; until then the pod waits in ContainerCreating.
	started bool

	// volMu serializes writing the pod's projected volumes and guards tokens.
	volMu  sync.Mutex
	tokens map[string]cachedToken

	// notifyMu makes notifications leave in the order their snapshots were
	// taken, so that a late "Running" never overwrites a "Failed".
	notifyMu sync.Mutex
}

// containerRun is one container of a podRun.
type containerRun struct {
	index int // in pod.Spec.Containers and pod.Status.ContainerStatuses
	name  string
	// imageMounts are the files of the container's image (Image.Files),
	// mounted before its volumes.
	imageMounts []mount
	argv        []string
	path        string
	env         []string
	dir         string
	logPath     string
	pidPath     string // holds pid while the process runs, for cleanup after a node crash
	pid         int    // 0 when no process runs; unshare's PID when sandboxed
	mounts      []mount
	backoff     *time.Timer
	restarts    int32
}

// NewProvider returns a Provider with no pods.
func NewProvider(cfg ProviderConfig) (*Provider, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("node name is empty: set it (etjob-node --node-name)")
	}
	if cfg.WorkDir == "" {
		return nil, errors.New("work dir is empty: set it (etjob-node --work-dir)")
	}
	ips, err := newIPAllocator(cfg.NodeIP)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.WorkDir, 0o755); err != nil {
		return nil, fmt.Errorf("work dir: %w", err)
	}
	p := &Provider{
		nodeName:  cfg.NodeName,
		nodeIP:    cfg.NodeIP,
		workDir:   cfg.WorkDir,
		price:     cfg.PricePerHour,
		env:       envSources{configMaps: cfg.ConfigMaps, secrets: cfg.Secrets},
		client:    cfg.Client,
		images:    cfg.Images,
		hostsPath: filepath.Join(cfg.WorkDir, "hosts"),
		wake:      make(chan struct{}, 1),
		stop:      make(chan struct{}),
		pods:      map[string]*podRun{},
		ips:       ips,
	}
	if cfg.APIServer != "" {
		if p.apiHost, p.apiPort, err = net.SplitHostPort(cfg.APIServer); err != nil {
			return nil, fmt.Errorf("API server address %q: %w", cfg.APIServer, err)
		}
	}
	if _, err := writeInPlace(p.hostsPath, renderHosts(nil, nil, nil)); err != nil {
		return nil, fmt.Errorf("hosts file: %w", err)
	}
	var why string
	p.unshare, why = detectSandbox()
	if p.unshare == "" {
		slog.Warn("pods run as plain processes without namespaces of their own: no per-pod hostname, /etc/hosts or volume mounts, and a process that starts its own session escapes its pod", "reason", why)
	}
	if p.client != nil {
		factory := informers.NewSharedInformerFactory(p.client, 0)
		inf := factory.Core().V1().Pods()
		_, _ = inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { p.wakeUp() },
			UpdateFunc: func(any, any) { p.wakeUp() },
			DeleteFunc: func(any) { p.wakeUp() },
		})
		p.clusterPods = inf.Lister()
		sl := factory.Discovery().V1().EndpointSlices()
		_, _ = sl.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { p.wakeUp() },
			UpdateFunc: func(any, any) { p.wakeUp() },
			DeleteFunc: func(any) { p.wakeUp() },
		})
		p.clusterSlices = sl.Lister()
		factory.Start(p.stop)
	}
	go p.background()
	return p, nil
}

func podKey(namespace, name string) string { return namespace + "/" + name }

// NotifyPods registers the callback that receives every pod status change,
// and starts the readiness resync (resync) until ctx ends.
func (p *Provider) NotifyPods(ctx context.Context, notify func(*corev1.Pod)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.notify = notify
	if p.client != nil {
		go p.resync(ctx)
	}
}

// resyncInterval is how often resync compares the API server's readiness of
// the node's pods with the provider's.
const resyncInterval = 10 * time.Second

// resync publishes a pod's status again when the API server's copy says
// otherwise about its readiness, as a kubelet's status manager reconciles:
// when a node's lease lapses (a kube-apiserver down for longer than the node
// monitor's grace period), the node lifecycle controller marks its pods
// NotReady, and virtual-kubelet publishes only the provider's own changes,
// so a pod that ran on stayed NotReady for good (found by make chaos's
// kube-apiserver outage: two workers of five never counted as members
// again). The reads come from the API server's watch cache.
func (p *Provider) resync(ctx context.Context) {
	t := time.NewTicker(resyncInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.mu.Lock()
		type one struct {
			pr          *podRun
			ns, name    string
			ready, done bool
		}
		var runs []one
		for _, pr := range p.pods {
			if pr.started && !pr.deleting {
				runs = append(runs, one{pr, pr.pod.Namespace, pr.pod.Name, podReady(pr.pod), pr.pod.Status.Phase != corev1.PodRunning})
			}
		}
		p.mu.Unlock()
		for _, r := range runs {
			if r.done {
				continue
			}
			got, err := p.client.CoreV1().Pods(r.ns).Get(ctx, r.name, metav1.GetOptions{ResourceVersion: "0"})
			if err != nil || got.DeletionTimestamp != nil || podReady(got) == r.ready {
				continue
			}
			// The API server's Ready changed from outside: to the API this
			// is a transition now. virtual-kubelet drops a status equal to
			// the provider's last one, so the change of time is what makes
			// it write the provider's status again.
			p.mu.Lock()
			now := metav1.Now()
			for i, c := range r.pr.pod.Status.Conditions {
				if c.Type == corev1.PodReady || c.Type == corev1.ContainersReady {
					r.pr.pod.Status.Conditions[i].LastTransitionTime = now
				}
			}
			p.mu.Unlock()
			p.publish(r.pr)
		}
	}
}

// podReady is the pod's Ready condition.
func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// CreatePod allocates the pod an IP, resolves its containers' environment
// and starts one process group per container. It returns an InvalidInput
// error for pods a process node cannot run (init containers, a container
// without command).
func (p *Provider) CreatePod(ctx context.Context, pod *corev1.Pod) error {
	if err := validatePod(pod); err != nil {
		return err
	}
	p.mu.Lock()
	key := podKey(pod.Namespace, pod.Name)
	if pr, ok := p.pods[key]; ok && pr.pod.UID == pod.UID {
		p.mu.Unlock()
		return nil
	}
	pr, err := p.preparePodLocked(pod)
	if err != nil {
		p.mu.Unlock()
		return err
	}
	p.pods[key] = pr
	p.ledger("start", pr.pod, pr.pod.Status.StartTime.Time)
	p.mu.Unlock()
	p.wakeUp()
	p.publish(pr)
	if !p.setupAndStart(ctx, pr) {
		go p.retrySetup(pr)
	}
	return nil
}

// setupAndStart sets up pr's volumes and container mounts and starts its
// containers. When a volume is not ready it leaves the pod waiting in
// ContainerCreating with the reason as message, as a kubelet does, and
// returns false. It publishes the pod's status when it changed.
func (p *Provider) setupAndStart(ctx context.Context, pr *podRun) bool {
	p.mu.Lock()
	pod := pr.pod
	p.mu.Unlock()
	paths, err := p.setupVolumes(ctx, pr, pod)
	var mounts [][]mount
	if err == nil {
		for i := range pod.Spec.Containers {
			var m []mount
			m, err = containerMounts(pod, &pod.Spec.Containers[i], paths)
			if err != nil {
				break
			}
			mounts = append(mounts, m)
		}
	}
	p.mu.Lock()
	if pr.deleting || pr.forgotten {
		p.mu.Unlock()
		return true
	}
	if err != nil {
		msg := "waiting for volumes: " + err.Error()
		changed := false
		for i := range pr.pod.Status.ContainerStatuses {
			if w := pr.pod.Status.ContainerStatuses[i].State.Waiting; w != nil && w.Message != msg {
				w.Message, changed = msg, true
			}
		}
		p.mu.Unlock()
		if changed {
			slog.InfoContext(ctx, "pod waits for its volumes", "pod", pod.Name, "err", err)
			p.publish(pr)
		}
		return false
	}
	pr.started = true
	for i, cr := range pr.containers {
		cr.mounts = append(slices.Clone(cr.imageMounts), mounts[i]...)
		p.startLocked(ctx, pr, cr)
	}
	p.mu.Unlock()
	p.publish(pr)
	return true
}

// retrySetup tries setupAndStart every second until it succeeds or the pod
// is deleted.
func (p *Provider) retrySetup(pr *podRun) {
	for {
		select {
		case <-p.stop:
			return
		case <-time.After(time.Second):
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ok := p.setupAndStart(ctx, pr)
		cancel()
		if ok {
			return
		}
	}
}

func validatePod(pod *corev1.Pod) error {
	if len(pod.Spec.InitContainers) > 0 {
		return errdefs.InvalidInputf("pod %s/%s has init containers, which process nodes do not run yet", pod.Namespace, pod.Name)
	}
	for _, c := range pod.Spec.Containers {
		if len(c.Command) == 0 {
			return errdefs.InvalidInputf("container %q of pod %s/%s has no command: a process node runs host binaries and has no image entrypoint; set command", c.Name, pod.Namespace, pod.Name)
		}
	}
	return nil
}

// podIP is the pod's address: the node's own for a hostNetwork pod, as a
// kubelet gives it (releasing it later frees nothing), else the lowest free
// one of the node's /24.
func (p *Provider) podIP(pod *corev1.Pod) (netip.Addr, error) {
	if pod.Spec.HostNetwork {
		return netip.ParseAddr(p.nodeIP)
	}
	return p.ips.allocate()
}

// preparePodLocked builds the podRun of a new pod: IP, directories, status,
// and each container's resolved argv and environment.
func (p *Provider) preparePodLocked(in *corev1.Pod) (*podRun, error) {
	ip, err := p.podIP(in)
	if err != nil {
		return nil, err
	}
	pod := in.DeepCopy()
	now := metav1.Now()
	pod.Status = corev1.PodStatus{
		Phase:     corev1.PodPending,
		HostIP:    p.nodeIP,
		HostIPs:   []corev1.HostIP{{IP: p.nodeIP}},
		PodIP:     ip.String(),
		PodIPs:    []corev1.PodIP{{IP: ip.String()}},
		StartTime: &now,
		QOSClass:  in.Status.QOSClass,
	}
	pr := &podRun{
		pod: pod,
		ip:  ip,
		dir: filepath.Join(p.workDir, "pods", fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID)),
	}
	fail := func(err error) (*podRun, error) {
		p.ips.release(ip)
		return nil, err
	}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		cr, err := p.prepareContainer(pr, i, c)
		if err != nil {
			return fail(err)
		}
		pr.containers = append(pr.containers, cr)
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{
			Name:  c.Name,
			Image: c.Image,
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}},
		})
	}
	if err := os.MkdirAll(pr.dir, 0o755); err != nil {
		return fail(fmt.Errorf("pod directory: %w", err))
	}
	setConditions(pod, now)
	return pr, nil
}

func (p *Provider) prepareContainer(pr *podRun, i int, c *corev1.Container) (*containerRun, error) {
	env, err := resolveEnv(pr.pod, c, p.env)
	if err != nil {
		return nil, errdefs.AsInvalidInput(err)
	}
	base := map[string]string{"PATH": os.Getenv("PATH"), "HOME": os.Getenv("HOME"), "HOSTNAME": podHostname(pr.pod)}
	if base["PATH"] == "" {
		base["PATH"] = defaultPath
	}
	baseKeys := []string{"PATH", "HOME", "HOSTNAME"}
	if p.apiHost != "" {
		base["KUBERNETES_SERVICE_HOST"], base["KUBERNETES_SERVICE_PORT"] = p.apiHost, p.apiPort
		baseKeys = append(baseKeys, "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")
	}
	image, _ := p.images.Lookup(c.Image)
	for _, k := range sortedKeys(image.Env) {
		if _, ok := base[k]; !ok {
			baseKeys = append(baseKeys, k)
		}
		base[k] = image.Env[k]
	}
	vars := make(map[string]string, len(env))
	for _, e := range env {
		vars[e.Name] = e.Value
	}
	lookup := func(n string) (string, bool) { v, ok := vars[n]; return v, ok }
	argv := make([]string, 0, len(c.Command)+len(c.Args))
	for _, a := range append(append([]string{}, c.Command...), c.Args...) {
		argv = append(argv, expand(a, lookup))
	}
	var envList []string
	for _, k := range baseKeys {
		if _, overridden := vars[k]; !overridden && base[k] != "" {
			envList = append(envList, k+"="+base[k])
		}
	}
	for _, e := range env {
		envList = append(envList, e.Name+"="+e.Value)
	}
	pathEnv := base["PATH"]
	if v, ok := vars["PATH"]; ok {
		pathEnv = v
	}
	dir := c.WorkingDir
	if dir == "" {
		dir = pr.dir
	}
	return &containerRun{
		index:       i,
		name:        c.Name,
		imageMounts: image.mounts(),
		argv:        argv,
		path:        lookPath(argv[0], pathEnv),
		env:         envList,
		dir:         dir,
		logPath:     filepath.Join(pr.dir, c.Name+".log"),
		pidPath:     filepath.Join(pr.dir, c.Name+".pid"),
	}, nil
}

// lookPath finds name in the container's PATH, as a runtime does inside the
// container; a name with a slash, or one not found, is returned unchanged so
// that the start fails with the exec error.
func lookPath(name, pathEnv string) string {
	if filepath.Base(name) != name {
		return name
	}
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" {
			continue
		}
		candidate := filepath.Join(dir, name)
		if fi, err := os.Stat(candidate); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return candidate
		}
	}
	return name
}

// startLocked starts cr's process in its own process group, with stdout and
// stderr appended to its log file. A start that fails counts as an exit with
// code 128, reason StartError, as containerd reports it.
func (p *Provider) startLocked(ctx context.Context, pr *podRun, cr *containerRun) {
	cs := &pr.pod.Status.ContainerStatuses[cr.index]
	logFile, err := os.OpenFile(cr.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		p.exitedLocked(pr, cr, metav1.Now(), 128, "StartError", fmt.Sprintf("opening log file: %v", err))
		return
	}
	defer logFile.Close() // the child holds its own descriptor
	path, argv, dir := cr.path, cr.argv, cr.dir
	if p.unshare != "" {
		// The working directory is the container's: the sandbox enters it
		// after its mounts.
		argv = sandboxArgv(p.unshare, p.hostsPath, podHostname(pr.pod), cr.dir, cr.mounts, append([]string{cr.path}, cr.argv[1:]...))
		path, dir = p.unshare, pr.dir
	}
	cmd := &exec.Cmd{
		Path:        path,
		Args:        argv,
		Env:         cr.env,
		Dir:         dir,
		Stdout:      logFile,
		Stderr:      logFile,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	started := metav1.Now()
	if err := cmd.Start(); err != nil {
		p.exitedLocked(pr, cr, started, 128, "StartError", err.Error())
		return
	}
	cr.pid = cmd.Process.Pid
	started = metav1.Now()
	// The pid is also the process group ID; whoever cleans up after a node
	// that died without stopping its pods kills the group it names.
	if err := os.WriteFile(cr.pidPath, []byte(strconv.Itoa(cr.pid)+"\n"), 0o644); err != nil {
		slog.WarnContext(ctx, "writing pid file", "err", err)
	}
	*cs = corev1.ContainerStatus{
		Name:                 cs.Name,
		Image:                cs.Image,
		ContainerID:          "process://" + strconv.Itoa(cr.pid),
		State:                corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}},
		LastTerminationState: cs.LastTerminationState,
		Ready:                true,
		Started:              new(true),
		RestartCount:         cr.restarts,
	}
	setConditions(pr.pod, started)
	slog.InfoContext(ctx, "started container process", "pod", pr.pod.Name, "container", cr.name, "pid", cr.pid)
	go p.wait(pr, cr, cmd, started)
}

// wait reaps cr's process, then kills what is left of its process group:
// the container ends with its main process, as it does in a PID namespace.
func (p *Provider) wait(pr *podRun, cr *containerRun, cmd *exec.Cmd, started metav1.Time) {
	_ = cmd.Wait()
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	code, reason := exitCode(cmd.ProcessState)
	p.mu.Lock()
	cr.pid = 0
	_ = os.Remove(cr.pidPath)
	p.exitedLocked(pr, cr, started, code, reason, "")
	p.mu.Unlock()
	p.publish(pr)
}

// exitCode maps a wait status to a container exit code: the exit status, or
// 128+signal for a process killed by a signal, as container runtimes report.
func exitCode(ps *os.ProcessState) (int32, string) {
	code := int32(ps.ExitCode())
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		code = 128 + int32(ws.Signal())
	}
	if code == 0 {
		return 0, "Completed"
	}
	return code, "Error"
}

// exitedLocked records that cr terminated and, unless the pod is being deleted
// or its restartPolicy says otherwise, schedules a restart after a kubelet's
// crash-loop back-off.
func (p *Provider) exitedLocked(pr *podRun, cr *containerRun, started metav1.Time, code int32, reason, message string) {
	cs := &pr.pod.Status.ContainerStatuses[cr.index]
	now := metav1.Now()
	if message == "" && code != 0 && pr.pod.Spec.Containers[cr.index].TerminationMessagePolicy == corev1.TerminationMessageFallbackToLogsOnError {
		message = logTail(cr.logPath)
	}
	terminated := &corev1.ContainerStateTerminated{
		ExitCode:    code,
		Reason:      reason,
		Message:     message,
		StartedAt:   started,
		FinishedAt:  now,
		ContainerID: cs.ContainerID,
	}
	cs.State = corev1.ContainerState{Terminated: terminated}
	p.ledger("end", pr.pod, now.Time)
	cs.Ready = false
	cs.Started = new(false)
	if !pr.deleting && shouldRestart(pr.pod.Spec.RestartPolicy, code) {
		cs.LastTerminationState = cs.State
		cs.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
			Reason:  "CrashLoopBackOff",
			Message: fmt.Sprintf("back-off restarting container %q (exit code %d)", cr.name, code),
		}}
		delay := min(initialBackoff<<min(cr.restarts, 5), maxBackoff)
		cr.backoff = time.AfterFunc(delay, func() { p.restart(pr, cr) })
	}
	setConditions(pr.pod, now)
	if pr.deleting {
		p.maybeForgetLocked(pr)
	}
}

// logTail is what a kubelet puts in state.terminated.message of a failed
// container whose terminationMessagePolicy is FallbackToLogsOnError: the end
// of its log, at most 80 lines and 2048 bytes (pkg/kubelet/kuberuntime).
// Process nodes have no termination message file, so it is always the log.
func logTail(path string) string {
	const maxBytes, maxLines = 2048, 80
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	off := max(fi.Size()-maxBytes, 0)
	buf := make([]byte, fi.Size()-off)
	n, _ := f.ReadAt(buf, off)
	lines := strings.Split(strings.TrimRight(string(buf[:n]), "\n"), "\n")
	if len(lines) > maxLines {
		lines = lines[len(lines)-maxLines:]
	}
	return strings.Join(lines, "\n")
}

func shouldRestart(policy corev1.RestartPolicy, code int32) bool {
	switch policy {
	case corev1.RestartPolicyNever:
		return false
	case corev1.RestartPolicyOnFailure:
		return code != 0
	}
	return true // Always, the default
}

func (p *Provider) restart(pr *podRun, cr *containerRun) {
	p.mu.Lock()
	if pr.deleting || pr.forgotten {
		p.mu.Unlock()
		return
	}
	cr.backoff = nil
	cr.restarts++
	p.startLocked(context.Background(), pr, cr)
	p.mu.Unlock()
	p.publish(pr)
}

// setConditions derives the pod's phase and conditions from its container
// statuses: Pending until every container started once, Running while any
// container runs or waits to restart, then Succeeded when all exited 0 and
// Failed otherwise.
func setConditions(pod *corev1.Pod, now metav1.Time) {
	allRunning, anyActive, allZero, everStarted := true, false, true, true
	for _, cs := range pod.Status.ContainerStatuses {
		switch {
		case cs.State.Running != nil:
			anyActive = true
		case cs.State.Waiting != nil:
			allRunning = false
			if cs.State.Waiting.Reason == "ContainerCreating" {
				everStarted = false
			}
			anyActive = true
		case cs.State.Terminated != nil:
			allRunning = false
			if cs.State.Terminated.ExitCode != 0 {
				allZero = false
			}
		}
	}
	switch {
	case !everStarted:
		pod.Status.Phase = corev1.PodPending
	case anyActive:
		pod.Status.Phase = corev1.PodRunning
	case allZero:
		pod.Status.Phase = corev1.PodSucceeded
	default:
		pod.Status.Phase = corev1.PodFailed
	}
	ready, reason := corev1.ConditionFalse, "ContainersNotReady"
	if allRunning && len(pod.Status.ContainerStatuses) > 0 {
		ready, reason = corev1.ConditionTrue, ""
	}
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		reason = "PodCompleted"
	}
	setCondition(pod, corev1.PodScheduled, corev1.ConditionTrue, "", now)
	setCondition(pod, corev1.PodInitialized, corev1.ConditionTrue, "", now)
	setCondition(pod, corev1.ContainersReady, ready, reason, now)
	setCondition(pod, corev1.PodReady, ready, reason, now)
}

func setCondition(pod *corev1.Pod, t corev1.PodConditionType, s corev1.ConditionStatus, reason string, now metav1.Time) {
	for i := range pod.Status.Conditions {
		c := &pod.Status.Conditions[i]
		if c.Type != t {
			continue
		}
		if c.Status != s {
			c.LastTransitionTime = now
		}
		c.Status, c.Reason = s, reason
		return
	}
	pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{Type: t, Status: s, Reason: reason, LastTransitionTime: now})
}

// publish sends a snapshot of the pod to the registered callback.
func (p *Provider) publish(pr *podRun) {
	pr.notifyMu.Lock()
	defer pr.notifyMu.Unlock()
	p.mu.Lock()
	snapshot, notify := pr.pod.DeepCopy(), p.notify
	p.mu.Unlock()
	if notify != nil {
		notify(snapshot)
	}
}

// UpdatePod records the pod's new metadata and spec; a running process does
// not change (a kubelet also only acts on image and resize updates, which
// process pods do not have).
func (p *Provider) UpdatePod(_ context.Context, pod *corev1.Pod) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	pr, ok := p.pods[podKey(pod.Namespace, pod.Name)]
	if !ok {
		return errdefs.NotFoundf("pod %s/%s is not on node %s", pod.Namespace, pod.Name, p.nodeName)
	}
	status := pr.pod.Status
	pr.pod = pod.DeepCopy()
	pr.pod.Status = status
	return nil
}

// DeletePod stops the pod: SIGTERM to every container's process group (but
// a main process that a PID 1 would not stop: terminate), then
// SIGKILL once the grace period (the deletion's, else the pod's
// terminationGracePeriodSeconds, at most 30 s) has passed. It returns at
// once; the terminal status is published when the last process exited, and
// then the provider forgets the pod and frees its IP. The pod's directory and
// logs stay in the work dir.
func (p *Provider) DeletePod(ctx context.Context, pod *corev1.Pod) error {
	p.mu.Lock()
	pr, ok := p.pods[podKey(pod.Namespace, pod.Name)]
	if !ok || pr.forgotten {
		p.mu.Unlock()
		return errdefs.NotFoundf("pod %s/%s is not on node %s", pod.Namespace, pod.Name, p.nodeName)
	}
	if !pr.deleting {
		pr.deleting = true
		pr.pod.ObjectMeta = *pod.ObjectMeta.DeepCopy()
		now := metav1.Now()
		for _, cr := range pr.containers {
			if cr.backoff != nil {
				cr.backoff.Stop()
				cr.backoff = nil
				cs := &pr.pod.Status.ContainerStatuses[cr.index]
				cs.State = cs.LastTerminationState
			}
			if cr.pid != 0 {
				terminate(cr.pid, mainProcess(cr.pid, p.Namespaced()))
			}
		}
		setConditions(pr.pod, now)
		grace := gracePeriod(pod)
		slog.InfoContext(ctx, "stopping pod processes", "pod", pod.Name, "grace", grace)
		pr.killTimer = time.AfterFunc(grace, func() { p.kill(pr) })
		p.maybeForgetLocked(pr)
	}
	p.mu.Unlock()
	p.publish(pr)
	return nil
}

// gracePeriod is the time between SIGTERM and SIGKILL for pod.
func gracePeriod(pod *corev1.Pod) time.Duration {
	seconds := int64(maxGracePeriod / time.Second)
	if pod.DeletionGracePeriodSeconds != nil {
		seconds = *pod.DeletionGracePeriodSeconds
	} else if pod.Spec.TerminationGracePeriodSeconds != nil {
		seconds = *pod.Spec.TerminationGracePeriodSeconds
	}
	return min(max(time.Duration(seconds)*time.Second, minGracePeriod), maxGracePeriod)
}

// kill sends SIGKILL to every process group of pr that still runs.
func (p *Provider) kill(pr *podRun) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, cr := range pr.containers {
		if cr.pid != 0 {
			_ = syscall.Kill(-cr.pid, syscall.SIGKILL)
		}
	}
}

// maybeForgetLocked drops a deleted pod once none of its processes runs, and
// frees its IP.
func (p *Provider) maybeForgetLocked(pr *podRun) {
	for _, cr := range pr.containers {
		if cr.pid != 0 {
			return
		}
	}
	if pr.forgotten {
		return
	}
	pr.forgotten = true
	if pr.killTimer != nil {
		pr.killTimer.Stop()
	}
	delete(p.pods, podKey(pr.pod.Namespace, pr.pod.Name))
	p.ips.release(pr.ip)
	if p.client != nil && pr.pod.DeletionTimestamp != nil {
		go p.finishDeletion(pr.pod.Namespace, pr.pod.Name, pr.pod.UID, gracePeriod(pr.pod))
	}
}

// finishDeletion removes a deleted pod whose processes stopped from the API
// once its terminal status is there, as a kubelet's status manager does
// (pkg/kubelet/status: Delete with grace period 0 and a UID precondition).
// virtual-kubelet would only do it when the grace period ends, which delays a
// replacement pod with the same name. It gives up after the grace period, when
// virtual-kubelet's own deletion takes over.
func (p *Provider) finishDeletion(namespace, name string, uid types.UID, within time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	pods := p.client.CoreV1().Pods(namespace)
	for ctx.Err() == nil {
		pod, err := pods.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && pod.UID != uid) {
			return
		}
		if err == nil && !anyContainerRunning(pod) {
			zero := int64(0)
			err = pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: metav1.NewUIDPreconditions(string(uid))})
			if err == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
				return
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// anyContainerRunning is virtual-kubelet's test (node/podcontroller.go
// running) for whether a deleted pod's status is still pending.
func anyContainerRunning(pod *corev1.Pod) bool {
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.State.Terminated == nil && cs.State.Waiting == nil {
			return true
		}
	}
	return false
}

// GetPod returns a copy of the pod with its current status.
func (p *Provider) GetPod(_ context.Context, namespace, name string) (*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pr, ok := p.pods[podKey(namespace, name)]
	if !ok {
		return nil, errdefs.NotFoundf("pod %s/%s is not on node %s", namespace, name, p.nodeName)
	}
	return pr.pod.DeepCopy(), nil
}

// GetPodStatus returns a copy of the pod's current status.
func (p *Provider) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	pod, err := p.GetPod(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return &pod.Status, nil
}

// GetPods returns copies of all pods the provider knows.
func (p *Provider) GetPods(context.Context) ([]*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pods := make([]*corev1.Pod, 0, len(p.pods))
	for _, pr := range p.pods {
		pods = append(pods, pr.pod.DeepCopy())
	}
	return pods, nil
}

// LogPath returns the path of a container's log file, which collects its
// stdout and stderr across restarts.
func (p *Provider) LogPath(namespace, podName, containerName string) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pr, ok := p.pods[podKey(namespace, podName)]
	if !ok {
		return "", errdefs.NotFoundf("pod %s/%s is not on node %s", namespace, podName, p.nodeName)
	}
	for _, cr := range pr.containers {
		if cr.name == containerName {
			return cr.logPath, nil
		}
	}
	return "", errdefs.NotFoundf("pod %s/%s has no container %q", namespace, podName, containerName)
}

// errNotSupported is returned by the kubelet API calls that process nodes do
// not serve yet.
var errNotSupported = errors.New("not supported on process nodes yet")

// AttachToContainer is not supported yet.
func (p *Provider) AttachToContainer(context.Context, string, string, string, api.AttachIO) error {
	return errNotSupported
}

// GetStatsSummary is not supported yet.
func (p *Provider) GetStatsSummary(context.Context) (*statsv1alpha1.Summary, error) {
	return nil, errNotSupported
}

// GetMetricsResource is not supported yet.
func (p *Provider) GetMetricsResource(context.Context) ([]*dto.MetricFamily, error) {
	return nil, errNotSupported
}

// PortForward is not supported yet; pod IPs are loopback addresses that are
// reachable from the host directly.
func (p *Provider) PortForward(context.Context, string, string, int32, io.ReadWriteCloser) error {
	return errNotSupported
}

// Shutdown stops every pod's processes as DeletePod does, with the given
// grace period, and waits until they exited or ctx ends. A node calls it on
// its way out so that no process outlives it.
func (p *Provider) Shutdown(ctx context.Context, grace time.Duration) {
	p.stopOnce.Do(func() { close(p.stop) })
	p.mu.Lock()
	var pending []*podRun
	for _, pr := range p.pods {
		pending = append(pending, pr)
		pr.deleting = true
		for _, cr := range pr.containers {
			if cr.backoff != nil {
				cr.backoff.Stop()
			}
			if cr.pid != 0 {
				terminate(cr.pid, mainProcess(cr.pid, p.Namespaced()))
			}
		}
		if pr.killTimer == nil {
			pr.killTimer = time.AfterFunc(grace, func() { p.kill(pr) })
		}
		p.maybeForgetLocked(pr)
	}
	p.mu.Unlock()
	for ctx.Err() == nil {
		p.mu.Lock()
		n := len(p.pods)
		p.mu.Unlock()
		if n == 0 {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Namespaced reports whether pods get mount, UTS and PID namespaces of their
// own (the node runs as root and util-linux unshare works here).
func (p *Provider) Namespaced() bool { return p.unshare != "" }

// LedgerFile is the node's billing ledger in its work directory: one line
// per pod start ("start <uid> <namespace>/<name> <unix nanoseconds>
// <price per hour>") and container end ("end <uid> <namespace>/<name> <unix
// nanoseconds>"), the local cluster's own record of the node time each pod
// used (the e2e tests check status.cost against it). A node killed with
// its pods writes no end: the cluster records when it stopped the node.
const LedgerFile = "billing.log"

// ledger appends one line to the billing ledger; best effort.
func (p *Provider) ledger(kind string, pod *corev1.Pod, at time.Time) {
	line := fmt.Sprintf("%s %s %s/%s %d", kind, pod.UID, pod.Namespace, pod.Name, at.UnixNano())
	if kind == "start" {
		line += " " + p.price
	}
	f, err := os.OpenFile(filepath.Join(p.workDir, LedgerFile), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	_, _ = f.WriteString(line + "\n")
	_ = f.Close()
}
