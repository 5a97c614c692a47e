// Package agent is the etjob node agent, one per node: it reads the node's
// reclamation notices (the cloud's metadata service through package notice,
// and Kubernetes-side taints), marks its Node for the controller, and serves
// the pods on its node their current signal over a node-local endpoint, so
// that a notice reaches the workers even with the controller down.
package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/agent/notice"
	"github.com/etjob/etjob/internal/agent/price"
)

// DefaultKubernetesNoticeWindow is the time a Kubernetes-side notice (a
// taint) gives before the node goes: none is announced, so a window is
// assumed (AWS's two minutes).
const DefaultKubernetesNoticeWindow = 120 * time.Second

// Options configures an Agent.
type Options struct {
	// Client talks to the API server.
	Client kubernetes.Interface
	// NodeName is this node.
	NodeName string
	// Source reads the cloud's notices; nil means Kubernetes-side signals
	// only, unless Detect finds one later.
	Source notice.Source
	// Detect, when set and Source is nil (--provider auto found no cloud at
	// start: a metadata service slow at boot), probes for the cloud again
	// with back-off, from DetectBackoff doubling up to MaxDetectBackoff,
	// until a source answers; nil when none does. /readyz fails meanwhile.
	Detect func(context.Context) notice.Source
	// DetectBackoff is the first wait between probes; zero means 2 s.
	DetectBackoff time.Duration
	// PriceSource feeds the node's current price into its
	// etjob.dev/price-per-hour annotation; nil leaves prices to the label.
	PriceSource price.Source
	// PollInterval is the time between metadata reads; zero means 1 s.
	PollInterval time.Duration
	// Confirm is how many identical metadata readings a change needs; zero
	// means 2.
	Confirm int
	// KubernetesNoticeWindow is the deadline given to a Kubernetes-side
	// notice; zero means DefaultKubernetesNoticeWindow.
	KubernetesNoticeWindow time.Duration
	// Listener, if set, is where the signal endpoint serves; else Listen.
	Listener net.Listener
	// Listen is the signal endpoint's address; empty means the node's
	// internal IP on port 9477.
	Listen string
	// Authenticator checks pod tokens; nil means TokenReview through
	// ReviewClient.
	Authenticator Authenticator
	// IssuerKeys verifies a token's signature before any TokenReview; nil
	// means the issuer keys read through ReviewClient (or Client).
	IssuerKeys *IssuerKeys
	// ReviewClient sends the TokenReviews; nil means Client. Its own client
	// (QPS and burst), so that reviews never queue behind, or starve, the
	// Node markings.
	ReviewClient kubernetes.Interface
	// InsecureSkipPodAuth serves any caller as the pod it names (local
	// debugging only).
	InsecureSkipPodAuth bool
	// Limits bound the signal endpoint's connections; zero fields take
	// DefaultLimits'.
	Limits Limits
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Log is the logger; nil means slog.Default().
	Log *slog.Logger
}

// Limits bound the signal endpoint's HTTP connections: a slow or idle
// client holds one for at most ReadTimeout or IdleTimeout (UntrustedIdle
// while none of its requests carried an accepted pod token), and at most
// MaxConnections are open at once: a new one closes an untrusted connection
// that waits (connGate.evictable), or is refused. A pod holds at most
// TrustedPerPod trusted connections (its oldest closes for a new one).
type Limits struct {
	ReadTimeout    time.Duration
	WriteTimeout   time.Duration
	IdleTimeout    time.Duration
	UntrustedIdle  time.Duration
	MaxConnections int
	TrustedPerPod  int
}

// DefaultLimits are the endpoint's limits unless Options.Limits says
// otherwise: workers poll every ~100 ms with small requests; 16 trusted
// connections a pod leave room for 8 ranks a pod, each polling while its
// last poll's connection closes.
var DefaultLimits = Limits{ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, IdleTimeout: 60 * time.Second,
	UntrustedIdle: 2 * time.Second, MaxConnections: 256, TrustedPerPod: 16}

func (l Limits) orDefaults() Limits {
	if l.ReadTimeout <= 0 {
		l.ReadTimeout = DefaultLimits.ReadTimeout
	}
	if l.WriteTimeout <= 0 {
		l.WriteTimeout = DefaultLimits.WriteTimeout
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = DefaultLimits.IdleTimeout
	}
	if l.MaxConnections <= 0 {
		l.MaxConnections = DefaultLimits.MaxConnections
	}
	if l.UntrustedIdle <= 0 {
		l.UntrustedIdle = DefaultLimits.UntrustedIdle
	}
	if l.TrustedPerPod <= 0 {
		l.TrustedPerPod = DefaultLimits.TrustedPerPod
	}
	return l
}

// Agent is one node's agent. Create it with New and start it with Run.
type Agent struct {
	o        Options
	log      *slog.Logger
	recorder record.EventRecorder

	nodes corelisters.NodeLister
	pods  corelisters.PodLister

	kick chan struct{}

	mu sync.Mutex
	// src is the cloud's notice source once known (Options.Source, or what
	// Options.Detect found), nil before.
	src          notice.Source
	cloud        notice.Notice
	cloudSettled bool
	k8sSince     time.Time
	state        NodeState
	warnSince    time.Time
	reclaimSince time.Time
	acked        map[string]bool

	progress progressStore
	beats    beats
	publishQ chan PodProgress
	addr     chan string
	keysSaid atomic.Bool // the issuer keys' absence was logged
	gate     *connGate   // the signal endpoint's connections (Run)
}

// New checks o and returns an agent.
func New(o Options) (*Agent, error) {
	if o.Client == nil {
		return nil, errors.New("agent: Options.Client is required")
	}
	if o.NodeName == "" {
		return nil, errors.New("agent: the node name is required (--node-name or $NODE_NAME)")
	}
	if o.PollInterval <= 0 {
		o.PollInterval = time.Second
	}
	if o.Confirm <= 0 {
		o.Confirm = 2
	}
	if o.KubernetesNoticeWindow <= 0 {
		o.KubernetesNoticeWindow = DefaultKubernetesNoticeWindow
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	rc := o.ReviewClient
	if rc == nil {
		rc = o.Client
	}
	if o.Authenticator == nil {
		o.Authenticator = NewTokenReviewAuthenticator(rc, nil, 60*time.Second, o.Now)
	}
	if o.IssuerKeys == nil {
		o.IssuerKeys = NewIssuerKeys(rc, o.Now)
	}
	return &Agent{o: o, log: o.Log.With("node", o.NodeName), kick: make(chan struct{}, 1), acked: map[string]bool{}, addr: make(chan string, 1),
		publishQ: make(chan PodProgress, 64), beats: beats{queue: make(chan string, 256)}}, nil
}

// Addr returns the signal endpoint's address once it listens.
func (a *Agent) Addr(ctx context.Context) (string, error) {
	select {
	case s := <-a.addr:
		a.addr <- s
		return s, nil
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// Run watches the node and its pods, polls the metadata service, keeps the
// Node's markings current and serves the signal endpoint until ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: a.o.Client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	a.recorder = broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "etjob-agent", Host: a.o.NodeName})

	nodeFactory := informers.NewSharedInformerFactoryWithOptions(a.o.Client, 0, informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
		lo.FieldSelector = fields.OneTermEqualSelector("metadata.name", a.o.NodeName).String()
	}))
	podFactory := informers.NewSharedInformerFactoryWithOptions(a.o.Client, 0, informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
		lo.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", a.o.NodeName).String()
	}))
	nodeInf, podInf := nodeFactory.Core().V1().Nodes(), podFactory.Core().V1().Pods()
	a.nodes, a.pods = nodeInf.Lister(), podInf.Lister()
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { a.poke() },
		UpdateFunc: func(any, any) { a.poke() },
		DeleteFunc: func(any) { a.poke() },
	}
	if _, err := nodeInf.Informer().AddEventHandler(handler); err != nil {
		return err
	}
	if _, err := podInf.Informer().AddEventHandler(handler); err != nil {
		return err
	}
	nodeFactory.Start(ctx.Done())
	podFactory.Start(ctx.Done())
	defer nodeFactory.Shutdown()
	defer podFactory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), nodeInf.Informer().HasSynced, podInf.Informer().HasSynced) {
		return fmt.Errorf("agent: the node and pod caches did not sync: %w", ctx.Err())
	}

	go a.publishCheckpoints(ctx)
	go a.publishHeartbeats(ctx)
	if a.o.PriceSource != nil {
		go a.watchPrice(ctx)
	}
	// The state is computed before the first pod is served: a restarted
	// agent restores a live notice from its Node (sync) instead of telling
	// the pods "none" until the cloud answers again.
	if err := a.sync(ctx); err != nil && ctx.Err() == nil {
		a.log.Error("updating the node", "err", err)
	}
	l, err := a.listen()
	if err != nil {
		return err
	}
	lim := a.o.Limits.orDefaults()
	a.gate = newConnGate(l, lim.MaxConnections, lim.TrustedPerPod, lim.UntrustedIdle)
	srv := &http.Server{Handler: a.Handler(), ReadHeaderTimeout: lim.ReadTimeout, ReadTimeout: lim.ReadTimeout,
		WriteTimeout: lim.WriteTimeout, IdleTimeout: lim.IdleTimeout, MaxHeaderBytes: 16 << 10,
		ConnState: a.gate.connState, ConnContext: connContext}
	a.addr <- l.Addr().String()
	a.log.Info("serving pod signals", "addr", l.Addr().String(), "source", sourceName(a.o.Source))
	srvErr := make(chan error, 1)
	go func() { srvErr <- srv.Serve(a.gate) }()
	defer func() {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		_ = srv.Shutdown(sctx)
	}()

	if a.o.Source != nil {
		a.watchCloud(ctx, a.o.Source)
	} else {
		// Kubernetes-side notices only, for now or for good: nothing to
		// wait for before the Node is marked.
		a.mu.Lock()
		a.cloudSettled = true
		a.mu.Unlock()
		if a.o.Detect != nil {
			go a.redetect(ctx)
		}
	}

	a.poke()
	backoff := time.Duration(0)
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-srvErr:
			return fmt.Errorf("agent: serving %s: %w", l.Addr(), err)
		case <-a.kick:
		case <-retry:
		}
		if err := a.sync(ctx); err != nil && ctx.Err() == nil {
			backoff = min(max(2*backoff, 200*time.Millisecond), 30*time.Second)
			a.log.Error("updating the node", "err", err, "retryIn", backoff)
			retry = time.After(backoff)
			continue
		}
		backoff, retry = 0, nil
	}
}

// MaxDetectBackoff bounds the wait between two probes for the cloud.
const MaxDetectBackoff = 5 * time.Minute

// watchCloud starts reading the cloud's notices from src.
func (a *Agent) watchCloud(ctx context.Context, src notice.Source) {
	a.mu.Lock()
	a.src = src
	a.mu.Unlock()
	d := &notice.Debouncer{Confirm: a.o.Confirm, Log: a.log.With("provider", src.Provider())}
	go notice.Watch(ctx, src, a.o.PollInterval, d, a.o.Now, a.setCloud)
}

// redetect probes for the cloud until one answers: an agent that started
// while its node's metadata service was slow (at boot) would otherwise
// never hear that node's reclamation notices, with /healthz green.
func (a *Agent) redetect(ctx context.Context) {
	wait := a.o.DetectBackoff
	if wait <= 0 {
		wait = 2 * time.Second
	}
	for tries := 1; ; tries++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		if src := a.o.Detect(ctx); src != nil {
			a.log.Info("detected cloud provider", "provider", src.Provider(), "probes", tries+1)
			a.watchCloud(ctx, src)
			return
		}
		wait = min(2*wait, MaxDetectBackoff)
		a.log.Info("no cloud metadata service answered yet: Kubernetes-side notices only", "probes", tries+1, "nextProbeIn", wait)
	}
}

// source is the cloud's notice source, nil while none is known.
func (a *Agent) source() notice.Source {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.src
}

// serveReady answers readiness: ready once the agent knows its cloud, or
// when none was chosen (--provider none); not ready while --provider auto
// has found none yet, saying so (Kubernetes-side notices still work).
func (a *Agent) serveReady(w http.ResponseWriter, _ *http.Request) {
	switch src := a.source(); {
	case src != nil:
		fmt.Fprintf(w, "ok: cloud %s\n", src.Provider())
	case a.o.Detect == nil:
		fmt.Fprintln(w, "ok: no cloud provider (Kubernetes-side notices only)")
	default:
		http.Error(w, "no cloud metadata service has answered yet (probing again with back-off): this node's reclamation notices "+
			"would be missed; Kubernetes-side notices still work. On a node with no cloud metadata service, set --provider none",
			http.StatusServiceUnavailable)
	}
}

func sourceName(s notice.Source) string {
	if s == nil {
		return "kubernetes only"
	}
	return s.Provider()
}

func (a *Agent) poke() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

func (a *Agent) setCloud(n notice.Notice) {
	a.mu.Lock()
	a.cloud, a.cloudSettled = n, true
	a.mu.Unlock()
	a.log.Info("cloud notice", "kind", n.Kind.String(), "deadline", n.Deadline, "detail", n.Detail)
	a.poke()
}

// listen binds Options.Listener, Options.Listen, or the node's internal IP
// on port 9477.
func (a *Agent) listen() (net.Listener, error) {
	if a.o.Listener != nil {
		return a.o.Listener, nil
	}
	addr := a.o.Listen
	if addr == "" {
		host := ""
		if node, err := a.nodes.Get(a.o.NodeName); err == nil {
			for _, ad := range node.Status.Addresses {
				if ad.Type == corev1.NodeInternalIP {
					host = ad.Address
					break
				}
			}
		}
		if host == "" {
			a.log.Warn("the node has no InternalIP yet; listening on all addresses")
		}
		addr = net.JoinHostPort(host, fmt.Sprint(etjobv1.AgentPort))
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("agent: --listen %s: %w", addr, err)
	}
	return l, nil
}

// State returns the node state the agent serves.
func (a *Agent) State() NodeState {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.state
}

// sync recomputes the node state from the cloud notice and the cached Node
// and pods, then brings the Node's markings and events in line.
func (a *Agent) sync(ctx context.Context) error {
	node, err := a.nodes.Get(a.o.NodeName)
	if err != nil {
		node = nil
	}
	pods, _ := a.pods.List(labels.Everything())
	live := make(map[string]bool, len(pods))
	for _, p := range pods {
		live[p.Namespace+"/"+p.Name] = true
	}
	a.progress.keep(live) // the progress of pods gone from the node goes too
	a.beats.keep(live)
	now := a.o.Now()
	kind, src := KubernetesNotice(node, pods)

	a.mu.Lock()
	var st NodeState
	switch a.cloud.Kind {
	case notice.Reclaim:
		st.Reclaim = a.cloud
	case notice.EarlyWarning:
		st.Warning = a.cloud
	}
	if kind == notice.Reclaim {
		if a.k8sSince.IsZero() {
			a.k8sSince = now
		}
		k := notice.Notice{Kind: notice.Reclaim, Deadline: a.k8sSince.Add(a.o.KubernetesNoticeWindow).UTC().Truncate(time.Second), Source: src, Detail: "taint or condition " + src}
		if st.Reclaim.Kind != notice.Reclaim || k.Deadline.Before(st.Reclaim.Deadline) {
			st.Reclaim = k
		}
	} else {
		a.k8sSince = time.Time{}
	}
	if kind == notice.EarlyWarning && st.Warning.Kind != notice.EarlyWarning {
		st.Warning = notice.Notice{Kind: notice.EarlyWarning, Source: src, Detail: "taint " + src}
	}
	if st.Warning.Kind == notice.EarlyWarning {
		if a.warnSince.IsZero() {
			a.warnSince = now
		}
	} else {
		a.warnSince = time.Time{}
	}
	if !a.cloudSettled && st.Reclaim.Kind != notice.Reclaim {
		// Until the cloud source has answered (a restart), the notice this
		// agent left on its Node still holds: the pods keep hearing it.
		if n, ok := markedNotice(node); ok {
			st.Reclaim = n
		}
	}
	switch {
	case st.Reclaim.Kind != notice.Reclaim:
		a.reclaimSince = time.Time{}
	case a.reclaimSince.IsZero():
		a.reclaimSince = now
	}
	st.ReclaimSince = a.reclaimSince
	a.state = st
	settled, warnSince := a.cloudSettled, a.warnSince
	a.mu.Unlock()

	if node == nil {
		return nil // not created yet, or deleted: nothing to mark
	}
	if err := a.mark(ctx, node, st, settled, warnSince); err != nil {
		return err
	}
	a.ackIfDrained(ctx, st, pods)
	return nil
}

// ackIfDrained tells the provider (Azure) that the node may go once no
// workload pod is left on it.
func (a *Agent) ackIfDrained(ctx context.Context, st NodeState, pods []*corev1.Pod) {
	src := a.source()
	acker, ok := src.(notice.Acker)
	if !ok || st.Reclaim.EventID == "" || st.Reclaim.Source != src.Provider() {
		return
	}
	a.mu.Lock()
	done := a.acked[st.Reclaim.EventID]
	a.mu.Unlock()
	if done || workloadPods(pods) > 0 {
		return
	}
	if err := acker.Ack(ctx, st.Reclaim.EventID); err != nil {
		a.log.Error("acknowledging the provider event", "event", st.Reclaim.EventID, "err", err)
		return
	}
	a.log.Info("acknowledged the provider event: the node is drained", "event", st.Reclaim.EventID)
	a.mu.Lock()
	a.acked[st.Reclaim.EventID] = true
	a.mu.Unlock()
}

// workloadPods counts pods that still run on the node, leaving out
// DaemonSet pods (this agent's own among them) and static pods, which stay
// until the node goes.
func workloadPods(pods []*corev1.Pod) int {
	n := 0
	for _, p := range pods {
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if _, mirror := p.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
			continue
		}
		owned := false
		for _, ref := range p.OwnerReferences {
			if ref.Kind == "DaemonSet" {
				owned = true
			}
		}
		if !owned {
			n++
		}
	}
	return n
}

// watchPrice reads the price source every poll interval and copies a price
// that changed into the Node's etjob.dev/price-per-hour annotation (a merge
// patch of that one key, with an Event); the controller reads it before the
// node's label.
func (a *Agent) watchPrice(ctx context.Context) {
	src := a.o.PriceSource
	t := time.NewTicker(a.o.PollInterval)
	defer t.Stop()
	var failing bool
	for {
		p, ok, err := src.Price(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			if !failing {
				a.log.Warn("reading the node's price", "source", src.Name(), "err", err)
			}
			failing = true
		case err == nil && ok:
			failing = false
			if err := a.publishPrice(ctx, p); err != nil && ctx.Err() == nil {
				a.log.Warn("publishing the node's price", "price", p.String(), "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (a *Agent) publishPrice(ctx context.Context, p etjobv1.PricePerHour) error {
	node, err := a.nodes.Get(a.o.NodeName)
	if err != nil {
		return err
	}
	old, had := node.Annotations[etjobv1.AnnotationPricePerHour]
	if had && old == p.String() {
		return nil
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{etjobv1.AnnotationPricePerHour: p.String()}}})
	if _, err := a.o.Client.CoreV1().Nodes().Patch(ctx, a.o.NodeName, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "etjob-agent"}); err != nil {
		return err
	}
	was, _ := etjobv1.NodePrice(node)
	a.log.Info("the node's price changed", "source", a.o.PriceSource.Name(), "from", was.String(), "to", p.String())
	a.recorder.Eventf(node, corev1.EventTypeNormal, "PriceChanged", "spot price now $%s an hour (was $%s; from %s)", p, was, a.o.PriceSource.Name())
	return nil
}
