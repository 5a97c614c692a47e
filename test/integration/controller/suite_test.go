// Package controller_test runs the ElasticJob controller against a real
// kube-apiserver and etcd (envtest, with binaries built by
// hack/build-controlplane.sh). No kubelet runs: tests move pod status
// themselves, and a tiny "kubelet" finishes graceful deletions.
package controller_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/etjob/etjob/internal/controller"
	"github.com/etjob/etjob/internal/logging"
	"github.com/etjob/etjob/internal/scheme"
	"github.com/etjob/etjob/internal/testutil"
)

var (
	cfg      *rest.Config
	k8s      client.Client
	counter  = &requestCounter{}
	repoRoot string
	stopAll  context.CancelFunc
)

// requestCounter counts the controller's own API requests by verb and
// resource, to measure writes per scale event and LISTs after the sync.
type requestCounter struct {
	mu     sync.Mutex
	counts map[string]int
	on     atomic.Bool
}

func (c *requestCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(r *http.Request) (*http.Response, error) {
		if c.on.Load() {
			verb := r.Method
			q := r.URL.Query()
			parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
			if verb == http.MethodGet && q.Get("watch") != "true" && !isNamedGet(parts) {
				verb = "LIST"
			} else if q.Get("watch") == "true" {
				verb = "WATCH"
			}
			res := resourceOf(parts)
			c.mu.Lock()
			c.counts[verb+" "+res]++
			c.mu.Unlock()
		}
		return rt.RoundTrip(r)
	})
}

func (c *requestCounter) start() {
	c.mu.Lock()
	c.counts = map[string]int{}
	c.mu.Unlock()
	c.on.Store(true)
}

// waitQuiet waits until the controller has sent no request for d, so that
// the last write of an event is counted (a fixed sleep could end before it).
func (c *requestCounter) waitQuiet(t *testing.T, d time.Duration) {
	t.Helper()
	last, since := -1, time.Now()
	testutil.Eventually(t, timeout, "the controller quiet for "+d.String(), func() error {
		c.mu.Lock()
		n := 0
		for _, v := range c.counts {
			n += v
		}
		c.mu.Unlock()
		if n != last {
			last, since = n, time.Now()
		}
		if time.Since(since) < d {
			return fmt.Errorf("%d requests so far", n)
		}
		return nil
	})
}

func (c *requestCounter) stop() map[string]int {
	c.on.Store(false)
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.counts
	c.counts = map[string]int{}
	return out
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// isNamedGet: /api/v1/namespaces/ns/pods/name has an even number of parts after
// the group version prefix; a collection path has an odd one.
func isNamedGet(parts []string) bool {
	i := 2 // api/v1
	if len(parts) > 0 && parts[0] == "apis" {
		i = 3
	}
	rest := parts[min(i, len(parts)):]
	if len(rest) >= 2 && rest[0] == "namespaces" {
		rest = rest[2:]
	}
	return len(rest) >= 2
}

func resourceOf(parts []string) string {
	i := 2
	if len(parts) > 0 && parts[0] == "apis" {
		i = 3
	}
	rest := parts[min(i, len(parts)):]
	if len(rest) >= 2 && rest[0] == "namespaces" {
		rest = rest[2:]
	}
	if len(rest) == 0 {
		return ""
	}
	if len(rest) >= 3 {
		return rest[0] + "/" + rest[2]
	}
	return rest[0]
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	logging.Install(slog.New(quiet{slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: testLogLevel()})}))
	root, err := testutil.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	repoRoot = root
	assets, err := testutil.ControlPlaneAssets()
	if err != nil {
		fmt.Fprintln(os.Stderr, "building the control plane:", err)
		return 1
	}
	os.Setenv("KUBEBUILDER_ASSETS", assets)
	env := &envtest.Environment{
		CRDInstallOptions: envtest.CRDInstallOptions{Paths: []string{filepath.Join(repoRoot, "config/crd/bases")}, ErrorIfPathMissing: true},
	}
	cfg, err = env.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting envtest:", err)
		return 1
	}
	defer env.Stop()

	ctx, cancel := context.WithCancel(context.Background())
	stopAll = cancel
	defer cancel()
	k8s, err = client.New(cfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		return 1
	}
	mgrCfg := rest.CopyConfig(cfg)
	mgrCfg.WrapTransport = counter.wrap
	mgr, err := ctrl.NewManager(mgrCfg, controller.ManagerOptions(controller.Options{MetricsAddr: "0", ProbeAddr: "0"}))
	if err != nil {
		fmt.Fprintln(os.Stderr, "manager:", err)
		return 1
	}
	if err := controller.Setup(ctx, mgr, 4, nil, controller.Trust{}); err != nil {
		fmt.Fprintln(os.Stderr, "setup:", err)
		return 1
	}
	go func() {
		if err := mgr.Start(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "manager stopped:", err)
		}
	}()
	go kubelet(ctx)
	return m.Run()
}

// quiet drops records below its level, errors too: logr logs errors at any
// verbosity, and the controller's retried errors are expected here.
type quiet struct{ slog.Handler }

func (q quiet) Handle(ctx context.Context, r slog.Record) error {
	if !q.Enabled(ctx, r.Level) {
		return nil
	}
	return q.Handler.Handle(ctx, r)
}

func (q quiet) WithAttrs(a []slog.Attr) slog.Handler { return quiet{q.Handler.WithAttrs(a)} }
func (q quiet) WithGroup(g string) slog.Handler      { return quiet{q.Handler.WithGroup(g)} }

func testLogLevel() slog.Level {
	if os.Getenv("ETJOB_TEST_VERBOSE") != "" {
		return slog.LevelDebug
	}
	return slog.LevelError + 4 // nothing: the controller's retried conflicts are expected here
}

// kubelet stands in for the kubelets that do not run here: it finishes the
// graceful deletion of pods bound to a node, as a kubelet does once their
// containers stopped.
func kubelet(ctx context.Context) {
	for ctx.Err() == nil {
		var pods corev1.PodList
		if err := k8s.List(ctx, &pods); err == nil {
			for i := range pods.Items {
				p := &pods.Items[i]
				if p.DeletionTimestamp != nil {
					_ = k8s.Delete(ctx, p, client.GracePeriodSeconds(0))
				}
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

var nsSeq atomic.Int32

// newNamespace creates a fresh namespace (with the default service account,
// since no controller-manager runs here) for one test case.
func newNamespace(t *testing.T) string {
	t.Helper()
	ns := fmt.Sprintf("t%d-%d", nsSeq.Add(1), time.Now().UnixNano()%100000)
	ctx := context.Background()
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: ns}}); err != nil {
		t.Fatal(err)
	}
	return ns
}
