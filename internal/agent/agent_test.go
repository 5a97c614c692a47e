package agent_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/agent"
	"github.com/etjob/etjob/internal/agent/notice"
	"github.com/etjob/etjob/internal/agent/price"
	"github.com/etjob/etjob/internal/emucloud"
	"github.com/etjob/etjob/internal/testutil"
	"github.com/etjob/etjob/pkg/supervisor"
)

const nodeName = "spot-node-1"

// TestAgent runs the agent for one Node against a real kube-apiserver and
// etcd, with the emulated metadata service announcing an AWS reclaim, and
// checks the Node's markings and Events, the pod signal endpoint with real
// bound service-account tokens (TokenReview), and the cancellation.
func TestAgent(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs := startAPIServer(t)

	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: map[string]string{etjobv1.LabelCapacityType: etjobv1.CapacityTypeSpot}}}
	if _, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	emu := emucloud.New()
	mdsrv := httptest.NewServer(emu)
	defer mdsrv.Close()
	src, err := notice.New(notice.ProviderAWS, notice.Options{BaseURL: mdsrv.URL})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(agent.Options{Client: cs, NodeName: nodeName, Source: src, PollInterval: 50 * time.Millisecond, Confirm: 1, Listener: l})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run() = %v", err)
		}
	}()
	base := "http://" + l.Addr().String()

	// Two worker pods on the node, each with a token bound to it.
	ns := newNamespace(ctx, t, cs)
	w0, tok0 := workerPod(ctx, t, cs, ns, "worker-0")
	w1, tok1 := workerPod(ctx, t, cs, ns, "worker-1")

	signal := func(pod, token string) (int, agent.Signal) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/v1/signal?namespace=%s&pod=%s", base, ns, pod), nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var s agent.Signal
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode == http.StatusOK {
			if err := json.Unmarshal(b, &s); err != nil {
				t.Fatalf("signal body %q: %v", b, err)
			}
		}
		return resp.StatusCode, s
	}
	testutil.Eventually(t, 20*time.Second, "worker-0 is told none before any notice", func() bool {
		code, s := signal(w0.Name, tok0)
		return code == http.StatusOK && s.Action == agent.ActionNone
	})

	deadline := time.Now().Add(2 * time.Minute).UTC().Truncate(time.Second)
	emu.SetReclaim(emucloud.AWS, deadline)
	testutil.Eventually(t, 20*time.Second, "the Node carries the notice annotations and taint", func() bool {
		n, err := cs.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		return err == nil && n.Annotations[etjobv1.AnnotationNodeNotice] == deadline.Format(time.RFC3339) &&
			n.Annotations[etjobv1.AnnotationNodeNoticeSource] == "aws" && hasTaint(n, agent.TaintReclaiming, corev1.TaintEffectNoSchedule)
	})
	testutil.Eventually(t, 20*time.Second, "a SpotReclaimNotice Event on the Node", func() bool {
		return hasEvent(ctx, cs, agent.EventReasonReclaimNotice, "aws")
	})

	t.Run("pod signal with bound tokens", func(t *testing.T) {
		code, s := signal(w0.Name, tok0)
		if code != http.StatusOK || s.Action != agent.ActionLeave || s.Source != "aws" || s.Deadline != deadline.Format(time.RFC3339) {
			t.Errorf("worker-0 with its own token: %d %+v, want 200 leave from aws at %s", code, s, deadline.Format(time.RFC3339))
		}
		if code, _ := signal(w1.Name, tok0); code != http.StatusForbidden {
			t.Errorf("worker-1 with worker-0's token: %d, want 403", code)
		}
		if code, _ := signal(w0.Name, ""); code != http.StatusUnauthorized {
			t.Errorf("worker-0 without a token: %d, want 401", code)
		}
		if code, _ := signal(w0.Name, "not-a-token"); code != http.StatusUnauthorized {
			t.Errorf("worker-0 with a bad token: %d, want 401", code)
		}
	})

	t.Run("the Go supervisor package against the agent", func(t *testing.T) {
		tokFile := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(tokFile, []byte(tok0), 0o600); err != nil {
			t.Fatal(err)
		}
		sup := supervisor.New(supervisor.Options{AgentAddr: base, Namespace: ns, Pod: w0.Name, TokenPath: tokFile, NoSIGTERM: true, Log: func(string) {}})
		if err := sup.PollOnce(ctx); err != nil {
			t.Fatal(err)
		}
		if d, ok := sup.Deadline(); sup.CheckAlive() || sup.Reason() != "ReclaimNotice(aws)" || !ok || !d.Equal(deadline) {
			t.Errorf("alive %v reason %q deadline %v, want false, ReclaimNotice(aws), %v", sup.CheckAlive(), sup.Reason(), d, deadline)
		}
		other := supervisor.New(supervisor.Options{AgentAddr: base, Namespace: ns, Pod: w1.Name, TokenPath: tokFile, NoSIGTERM: true, Log: func(string) {}})
		if err := other.PollOnce(ctx); err == nil || !strings.Contains(err.Error(), "403") {
			t.Errorf("asking for worker-1 with worker-0's token: %v, want 403", err)
		}
	})

	t.Run("heartbeat", func(t *testing.T) {
		// the worker library's poll carries its step, world size and round;
		// the agent writes them on the pod
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet,
			fmt.Sprintf("%s/v1/signal?namespace=%s&pod=%s&step=41&world=4&round=7", base, ns, w0.Name), nil)
		req.Header.Set("Authorization", "Bearer "+tok0)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /v1/signal with a heartbeat: %d, want 200", resp.StatusCode)
		}
		testutil.Eventually(t, testutil.Timeout, "the heartbeat annotation on worker-0", func() bool {
			p, err := cs.CoreV1().Pods(ns).Get(ctx, w0.Name, metav1.GetOptions{})
			if err != nil {
				return false
			}
			var hb etjobv1.HeartbeatAnnotation
			return json.Unmarshal([]byte(p.Annotations[etjobv1.AnnotationHeartbeat]), &hb) == nil && hb.Step == 41 && hb.World == 4 && hb.Round == 7
		})
	})

	t.Run("progress", func(t *testing.T) {
		body := `{"step": 120, "checkpointStep": 100, "checkpointPath": "/ckpt/step-100", "samplesPerSecond": 812.5}`
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("%s/v1/progress?namespace=%s&pod=%s", base, ns, w0.Name), strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tok0)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("POST /v1/progress: %d, want 204", resp.StatusCode)
		}
		get := func(query, token string) (int, []agent.PodProgress) {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/progress"+query, nil)
			req.Header.Set("Authorization", "Bearer "+token)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var got []agent.PodProgress
			if resp.StatusCode == http.StatusOK {
				if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
					t.Fatal(err)
				}
			}
			return resp.StatusCode, got
		}
		code, got := get(fmt.Sprintf("?namespace=%s&pod=%s", ns, w0.Name), tok0)
		if code != http.StatusOK || len(got) != 1 || got[0].Pod != w0.Name || got[0].Step != 120 || got[0].CheckpointPath != "/ckpt/step-100" {
			t.Errorf("GET /v1/progress of worker-0 = %d %+v, want worker-0 at step 120", code, got)
		}
		// Finding M1: no pod reads another's progress, nor the whole list.
		if code, got := get("", tok0); code != http.StatusBadRequest {
			t.Errorf("GET /v1/progress of every pod: %d %+v, want 400", code, got)
		}
		if code, got := get(fmt.Sprintf("?namespace=%s&pod=%s", ns, w0.Name), tok1); code != http.StatusForbidden {
			t.Errorf("worker-1 reads worker-0's progress: %d %+v, want 403", code, got)
		}
		// A pod of another node, with a valid token of its own, posts nothing here.
		far, farTok := workerPodOn(ctx, t, cs, ns, "far-away", "other-node")
		req, _ = http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("%s/v1/progress?namespace=%s&pod=%s", base, ns, far.Name), strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+farTok)
		resp, err = http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("POST /v1/progress from a pod on another node: %d, want 403", resp.StatusCode)
		}
	})

	emu.Clear()
	testutil.Eventually(t, 20*time.Second, "the notice annotations and taint are removed", func() bool {
		n, err := cs.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		_, ann := n.Annotations[etjobv1.AnnotationNodeNotice]
		_, src := n.Annotations[etjobv1.AnnotationNodeNoticeSource]
		return err == nil && !ann && !src && !hasTaint(n, agent.TaintReclaiming, corev1.TaintEffectNoSchedule)
	})
	testutil.Eventually(t, 20*time.Second, "a SpotReclaimNoticeCancelled Event on the Node", func() bool {
		return hasEvent(ctx, cs, agent.EventReasonReclaimNoticeCancelled, "aws")
	})
	if code, s := signal(w0.Name, tok0); code != http.StatusOK || s.Action != agent.ActionNone {
		t.Errorf("worker-0 after the withdrawal: %d %+v, want none", code, s)
	}

	t.Run("controller leave relayed", func(t *testing.T) {
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q,%q:%q}}}`, etjobv1.AnnotationLeave, time.Now().UTC().Format(time.RFC3339), etjobv1.AnnotationLeaveReason, etjobv1.ReasonScaleIn)
		if _, err := cs.CoreV1().Pods(ns).Patch(ctx, w0.Name, "application/merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 20*time.Second, "worker-0 is told to leave (ScaleIn)", func() bool {
			code, s := signal(w0.Name, tok0)
			return code == http.StatusOK && s.Action == agent.ActionLeave && s.Reason == etjobv1.ReasonScaleIn
		})
	})

	t.Run("kubernetes-side taint", func(t *testing.T) {
		n, err := cs.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: "ToBeDeletedByClusterAutoscaler", Value: "1700000000", Effect: corev1.TaintEffectNoSchedule})
		if _, err := cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 20*time.Second, "the Node is marked with the taint as the source", func() bool {
			n, err := cs.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
			return err == nil && n.Annotations[etjobv1.AnnotationNodeNoticeSource] == "ToBeDeletedByClusterAutoscaler" &&
				n.Annotations[etjobv1.AnnotationNodeNotice] != "" && hasTaint(n, agent.TaintReclaiming, corev1.TaintEffectNoSchedule)
		})
	})
}

func workerPod(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, name string) (*corev1.Pod, string) {
	t.Helper()
	return workerPodOn(ctx, t, cs, ns, name, nodeName)
}

// workerPodOn is workerPod on another node.
func workerPodOn(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, name, node string) (*corev1.Pod, string) {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName:           node,
			ServiceAccountName: "worker",
			Containers:         []corev1.Container{{Name: "main", Image: "worker"}},
		},
	}
	pod, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	expiry := int64(3600)
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "worker", &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
		ExpirationSeconds: &expiry,
		BoundObjectRef:    &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest bound to pod %s: %v", name, err)
	}
	return pod, tr.Status.Token
}

func hasTaint(n *corev1.Node, key string, effect corev1.TaintEffect) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key && t.Effect == effect {
			return true
		}
	}
	return false
}

func hasEvent(ctx context.Context, cs kubernetes.Interface, reason, text string) bool {
	evs, err := cs.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{
		FieldSelector: fields.Set{"involvedObject.kind": "Node", "involvedObject.name": nodeName, "reason": reason}.String(),
	})
	if err != nil {
		return false
	}
	for _, e := range evs.Items {
		if strings.Contains(e.Message, text) {
			return true
		}
	}
	return false
}

func startAPIServer(t *testing.T) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(startAPIServerConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func startAPIServerConfig(t *testing.T) *rest.Config {
	t.Helper()
	assets, err := testutil.ControlPlaneAssets()
	if err != nil {
		t.Skipf("no control plane binaries: %v", err)
	}
	t.Setenv("KUBEBUILDER_ASSETS", assets)
	// envtest configures the API server's service-account issuer and keys,
	// which TokenRequest and TokenReview need.
	env := &envtest.Environment{}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting kube-apiserver and etcd: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	return cfg
}

// newNamespace creates a namespace with the default and worker
// ServiceAccounts (no controller-manager runs here to create them).
func newNamespace(ctx context.Context, t *testing.T, cs kubernetes.Interface) string {
	t.Helper()
	ns, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "agent-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"default", "worker"} {
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns.Name}}
		if _, err := cs.CoreV1().ServiceAccounts(ns.Name).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return ns.Name
}

// TestAgentTokenFlood (finding H2): junk and forged tokens cost no
// TokenReview, or only their pod's small budget, so that a flood of them
// never starves the reviews of real tokens: a worker with a fresh token
// still hears its signal at once.
func TestAgentTokenFlood(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := startAPIServerConfig(t)
	cs, reviews := reviewCounting(t, cfg)
	base := "http://" + runAgent(ctx, t, cs, agent.Options{})
	ns := newNamespace(ctx, t, cs)
	w0, tok0 := workerPod(ctx, t, cs, ns, "worker-0")
	w1, tok1 := workerPod(ctx, t, cs, ns, "worker-1")
	client := &http.Client{Timeout: 5 * time.Second}
	signal := func(pod, token string) int {
		return getStatus(ctx, client, fmt.Sprintf("%s/v1/signal?namespace=%s&pod=%s", base, ns, pod), token)
	}
	testutil.Eventually(t, 20*time.Second, "worker-0 is served", func() bool { return signal(w0.Name, tok0) == http.StatusOK })
	before := reviews.Load()

	// 300 junk tokens at once, 300 forged ones naming worker-0 (a JWT with
	// its claims, its UID and no valid signature), and 300 naming made-up
	// pods of the namespace (N5: each used to cost a review of the node's
	// budget before the agent found the pod was not on its node).
	forged := func(i int, pod string, uid types.UID) string {
		claims, _ := json.Marshal(map[string]any{"kubernetes.io": map[string]any{"namespace": ns, "pod": map[string]string{"name": pod, "uid": string(uid)}}, "jti": i})
		return "eyJhbGciOiJSUzI1NiJ9." + base64.RawURLEncoding.EncodeToString(claims) + ".c2lnbmF0dXJl"
	}
	var wg sync.WaitGroup
	codes := make([]int, 900)
	for i := range 900 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			switch {
			case i < 300:
				codes[i] = signal(w0.Name, fmt.Sprintf("junk-%d", i))
			case i < 600:
				codes[i] = signal(w0.Name, forged(i, w0.Name, w0.UID))
			default:
				ghost := fmt.Sprintf("ghost-%d", i)
				codes[i] = signal(ghost, forged(i, ghost, "0c4f4a6e-0000-4b7e-9a6e-000000000001"))
			}
		}()
	}
	// Meanwhile worker-1 asks with its own, never reviewed token, again
	// every 100 ms as a supervisor does (its new connection may be closed
	// to make room while 900 arrive at once).
	start := time.Now()
	code := 0
	for try := 0; try < 50 && code != http.StatusOK; try++ {
		if code = signal(w1.Name, tok1); code != http.StatusOK {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if code != http.StatusOK {
		t.Errorf("worker-1 during the flood: %d, want 200", code)
	}
	t.Logf("worker-1 served in %s during the flood", time.Since(start).Round(time.Millisecond))
	wg.Wait()
	for i, c := range codes {
		// 0: the connection was closed to make room (900 at once, 256 slots)
		if c != http.StatusUnauthorized && c != http.StatusForbidden && c != 0 {
			t.Errorf("request %d (junk %t, ghost %t): %d, want 401 or 403 (or its connection closed)", i, i < 300, i >= 600, c)
			break
		}
	}
	// Only worker-1's real token is reviewed: junk is no JWT, the forged
	// signatures do not verify against the issuer's keys, the made-up pods
	// are not on the node.
	if n := reviews.Load() - before; n > 1 {
		t.Errorf("%d TokenReviews for the flood and one real token, want 1 (worker-1's)", n)
	} else {
		t.Logf("%d TokenReviews for 900 junk and forged tokens and one real one", n)
	}
	// worker-0's own, already reviewed token is still served.
	if code := signal(w0.Name, tok0); code != http.StatusOK {
		t.Errorf("worker-0 after the flood: %d, want 200", code)
	}
}

// getStatus GETs url with the bearer token through c: the answer's status
// code, or 0 for none.
func getStatus(ctx context.Context, c *http.Client, url, token string) int {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestAgentConnectionLimits (finding M3): a client that sends a request body
// slowly, or keeps an idle connection, is cut off.
func TestAgentConnectionLimits(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs := startAPIServer(t)
	lim := agent.Limits{ReadTimeout: 300 * time.Millisecond, WriteTimeout: time.Second, IdleTimeout: 300 * time.Millisecond, MaxConnections: 3}
	addr := runAgent(ctx, t, cs, agent.Options{Limits: lim})
	testutil.Eventually(t, 20*time.Second, "the endpoint serves", func() bool {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == http.StatusOK
	})
	// closedWithin reports whether the server closes conn within d.
	closedWithin := func(conn net.Conn, d time.Duration) bool {
		_ = conn.SetReadDeadline(time.Now().Add(d))
		buf := make([]byte, 4096)
		for {
			if _, err := conn.Read(buf); err != nil {
				var ne net.Error
				return !(errors.As(err, &ne) && ne.Timeout()) // EOF or reset: closed; deadline: still open
			}
		}
	}
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}

	slow := dial()
	fmt.Fprintf(slow, "POST /v1/progress?namespace=x&pod=y HTTP/1.1\r\nHost: agent\r\nContent-Length: 100\r\n\r\n{\"step\":")
	if !closedWithin(slow, 3*time.Second) {
		t.Error("a request body that never completes holds its connection past the read timeout")
	}
	idle := dial()
	fmt.Fprintf(idle, "GET /healthz HTTP/1.1\r\nHost: agent\r\n\r\n")
	if !closedWithin(idle, 3*time.Second) {
		t.Error("an idle keep-alive connection stays open past the idle timeout")
	}

}

// TestAgentConnectionCap (N4): a worker's connection and three that never
// sent a request hold the four slots; a fifth is served at once and the
// oldest of the three is closed to make room. The worker's connection,
// trusted once its token was accepted, is not the one closed.
func TestAgentConnectionCap(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs := startAPIServer(t)
	addr := runAgent(ctx, t, cs, agent.Options{Limits: agent.Limits{MaxConnections: 4}})
	ns := newNamespace(ctx, t, cs)
	w0, tok0 := workerPod(ctx, t, cs, ns, "worker-0")
	worker := &http.Client{Timeout: 5 * time.Second} // keep-alive: one connection, reused
	var reused []bool
	signal := func() int {
		traced := httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = append(reused, i.Reused) }})
		return getStatus(traced, worker, fmt.Sprintf("http://%s/v1/signal?namespace=%s&pod=%s", addr, ns, w0.Name), tok0)
	}
	testutil.Eventually(t, 20*time.Second, "worker-0 is served", func() bool { return signal() == http.StatusOK })
	var held []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
		time.Sleep(20 * time.Millisecond) // an order of age
	}
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatalf("a fifth connection while four held every slot: %v, want it served", err)
	}
	resp.Body.Close()
	_ = held[0].SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := held[0].Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("the oldest idle connection: read %v, want EOF (closed to make room)", err)
	}
	if code := signal(); code != http.StatusOK || !reused[len(reused)-1] {
		t.Errorf("worker-0 after the fifth connection: %d, its connection reused %t; want 200 on the same connection", code, reused[len(reused)-1])
	}
}

// TestAgentSignalFlood (N4, N5): 300 connections that each asked for
// /healthz and stay open (each closed one is opened again) and a stream of
// 600 forged tokens naming the worker's pod, at a node's agent with its
// default limits, while the worker is told to leave. The worker is the real
// Go supervisor polling as the Python one does, a new connection a poll and
// a 1 s timeout: it hears the leave while the flood goes on (an order: the
// flood stops only once it heard, or after a minute, and that fails).
func TestAgentSignalFlood(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs := startAPIServer(t)
	addr := runAgent(ctx, t, cs, agent.Options{})
	ns := newNamespace(ctx, t, cs)
	w0, tok0 := workerPod(ctx, t, cs, ns, "worker-0")
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(tok0), 0o600); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, "the endpoint serves", func() bool {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == http.StatusOK
	})

	flood, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var opened atomic.Int64
	for range 300 {
		wg.Add(1)
		go func() { // an idle keep-alive connection, opened again when closed
			defer wg.Done()
			for flood.Err() == nil {
				c, err := net.DialTimeout("tcp", addr, time.Second)
				if err != nil {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				opened.Add(1)
				_, _ = c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: agent\r\n\r\n"))
				_, _ = c.Read(make([]byte, 512))
				stopped := context.AfterFunc(flood, func() { c.Close() })
				_, _ = c.Read(make([]byte, 1)) // until the agent closes it
				stopped()
				c.Close()
			}
		}()
	}
	forged := func(i int) string {
		claims, _ := json.Marshal(map[string]any{"kubernetes.io": map[string]any{"namespace": ns, "pod": map[string]string{"name": w0.Name, "uid": string(w0.UID)}}, "jti": i})
		return "eyJhbGciOiJSUzI1NiJ9." + base64.RawURLEncoding.EncodeToString(claims) + ".c2lnbmF0dXJl"
	}
	for g := range 6 {
		wg.Add(1)
		go func() { // 600 forged tokens, 100 from each of 6 clients, again and again
			defer wg.Done()
			c := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
			for i := 0; flood.Err() == nil; i++ {
				req, _ := http.NewRequestWithContext(flood, http.MethodGet, fmt.Sprintf("http://%s/v1/signal?namespace=%s&pod=%s", addr, ns, w0.Name), nil)
				req.Header.Set("Authorization", "Bearer "+forged(g*100+i%100))
				if resp, err := c.Do(req); err == nil {
					resp.Body.Close()
				}
			}
		}()
	}
	defer func() { stop(); wg.Wait() }()
	testutil.Eventually(t, 30*time.Second, "the flood holds 300 connections", func() bool { return opened.Load() >= 300 })

	took, ok := tellToLeave(ctx, t, cs, addr, ns, w0.Name, tokenFile, time.Minute, flood)
	if !ok {
		t.Fatalf("the worker did not hear its leave while the flood went on (%d flood connections opened)", opened.Load())
	}
	t.Logf("the worker heard its leave %s after it was told, during the flood (%d flood connections opened so far)", took, opened.Load())
}

// tellToLeave starts the real Go supervisor for pod, polling the agent at
// addr as the Python one does (a new connection a poll, a 1 s timeout),
// tells the pod to leave (its leave annotation) and waits, for at most
// within and while during lasts, until the supervisor heard it: how long
// that took, and whether it did.
func tellToLeave(ctx context.Context, t *testing.T, cs kubernetes.Interface, addr, ns, pod, tokenFile string,
	within time.Duration, during context.Context) (time.Duration, bool) {
	t.Helper()
	sup := supervisor.New(supervisor.Options{AgentAddr: addr, Namespace: ns, Pod: pod, TokenPath: tokenFile, NoSIGTERM: true,
		Client: &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}},
		Exit:   func(int) {}, Log: func(string) {}}).Start(ctx)
	defer sup.Close()
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q,%q:%q}}}`, etjobv1.AnnotationLeave, time.Now().UTC().Format(time.RFC3339), etjobv1.AnnotationLeaveReason, etjobv1.ReasonScaleIn)
	told := time.Now()
	if _, err := cs.CoreV1().Pods(ns).Patch(ctx, pod, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(within); time.Now().Before(end) && during.Err() == nil; time.Sleep(10 * time.Millisecond) {
		if !sup.CheckAlive() {
			return time.Since(told).Round(time.Millisecond), true
		}
	}
	return 0, false
}

// TestAgentTrustedFlood (issue #42, H1): another pod of the node, with its
// own valid token, holds 256 keep-alive connections, each trusted by an
// accepted request for its own signal (each closed one is opened again and
// trusted again), at an agent with its default limits, while a worker is
// told to leave. The worker is the real Go supervisor polling as the
// Python one does, a new connection a poll: it hears the leave while the
// flood goes on (an order: the flood stops only once it heard, or after 30
// s, less than the agent's idle timeout, and that fails). Trust was per
// connection: every slot was the
// flooding pod's, and the worker's new connections were refused.
func TestAgentTrustedFlood(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs := startAPIServer(t)
	addr := runAgent(ctx, t, cs, agent.Options{})
	ns := newNamespace(ctx, t, cs)
	w0, tok0 := workerPod(ctx, t, cs, ns, "worker-0")
	bad, badTok := workerPod(ctx, t, cs, ns, "flooder")
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(tok0), 0o600); err != nil {
		t.Fatal(err)
	}
	ask := fmt.Sprintf("GET /v1/signal?namespace=%s&pod=%s HTTP/1.1\r\nHost: agent\r\nAuthorization: Bearer %s\r\n\r\n", ns, bad.Name, badTok)
	testutil.Eventually(t, 20*time.Second, "the flooding pod is served", func() bool {
		return getStatus(ctx, &http.Client{Timeout: 5 * time.Second}, fmt.Sprintf("http://%s/v1/signal?namespace=%s&pod=%s", addr, ns, bad.Name), badTok) == http.StatusOK
	})

	flood, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var trusted atomic.Int64
	for range 256 {
		wg.Add(1)
		go func() { // a keep-alive connection trusted by an accepted request, opened again when closed
			defer wg.Done()
			for flood.Err() == nil {
				c, err := net.DialTimeout("tcp", addr, time.Second)
				if err != nil {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				stopped := context.AfterFunc(flood, func() { c.Close() })
				for flood.Err() == nil { // asks again every 20 s: never idle for the agent's IdleTimeout
					if _, err := c.Write([]byte(ask)); err != nil {
						break
					}
					_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
					n, err := c.Read(make([]byte, 4096))
					if n > 0 {
						trusted.Add(1)
					}
					if err != nil {
						break
					}
					_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
					if _, err := c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
						break // the agent closed it
					}
				}
				stopped()
				c.Close()
			}
		}()
	}
	defer func() { stop(); wg.Wait() }()
	testutil.Eventually(t, 60*time.Second, "the flooding pod was answered on 256 connections", func() bool { return trusted.Load() >= 256 })

	// 30 s: less than the agent's IdleTimeout, which the flood never lets lapse
	took, ok := tellToLeave(ctx, t, cs, addr, ns, w0.Name, tokenFile, 30*time.Second, flood)
	if !ok {
		t.Fatalf("the worker did not hear its leave while another pod held trusted connections (%d answered)", trusted.Load())
	}
	t.Logf("the worker heard its leave %s after it was told, while another pod flooded (%d of its requests answered)", took, trusted.Load())
}

// blockedSource is a cloud source that has not answered yet (its metadata
// service is slow after a restart).
type blockedSource struct{ release chan struct{} }

func (b blockedSource) Provider() string { return notice.ProviderAWS }
func (b blockedSource) Poll(ctx context.Context) (notice.Notice, error) {
	select {
	case <-b.release:
	case <-ctx.Done():
	}
	return notice.Notice{}, ctx.Err()
}

// TestAgentRestartKeepsNotice (finding M5): an agent restarted during a live
// notice serves it from its Node's markings before its cloud answers again,
// instead of telling the pods "none".
func TestAgentRestartKeepsNotice(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs := startAPIServer(t)
	deadline := time.Now().Add(2 * time.Minute).UTC().Truncate(time.Second).Format(time.RFC3339)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, Annotations: map[string]string{
		etjobv1.AnnotationNodeNotice: deadline, etjobv1.AnnotationNodeNoticeSource: "aws"}}}
	if _, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ns := newNamespace(ctx, t, cs)
	w0, tok0 := workerPod(ctx, t, cs, ns, "worker-0")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	src := blockedSource{release: make(chan struct{})}
	defer close(src.release)
	a, err := agent.New(agent.Options{Client: cs, NodeName: nodeName, Source: src, PollInterval: 50 * time.Millisecond, Confirm: 1, Listener: l})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = a.Run(ctx) }()
	addr, err := a.Addr(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The very first answer, before the cloud source said anything.
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/v1/signal?namespace=%s&pod=%s", addr, ns, w0.Name), nil)
	req.Header.Set("Authorization", "Bearer "+tok0)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var s agent.Signal
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("signal: %d %v", resp.StatusCode, err)
	}
	if s.Action != agent.ActionLeave || s.Deadline != deadline || s.Source != "aws" {
		t.Errorf("first signal after a restart during a notice: %+v, want leave from aws at %s", s, deadline)
	}
	n, err := cs.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil || n.Annotations[etjobv1.AnnotationNodeNotice] != deadline {
		t.Errorf("the Node's notice after the restart: %v %v", n.Annotations, err)
	}
}

// TestAgentAudience (finding M2): the agent takes only tokens for its own
// audience, which the workers' projected token is; such a token is good for
// nothing else (the API server refuses it), and the workers' API token is
// refused by the agent.
func TestAgentAudience(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := startAPIServerConfig(t)
	cs, reviews := reviewCounting(t, cfg)
	addr := runAgent(ctx, t, cs, agent.Options{Authenticator: agent.NewTokenReviewAuthenticator(cs, []string{etjobv1.AgentTokenAudience}, time.Minute, nil)})
	ns := newNamespace(ctx, t, cs)
	w0, apiToken := workerPod(ctx, t, cs, ns, "worker-0")
	expiry := int64(etjobv1.AgentTokenSeconds)
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "worker", &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
		Audiences: []string{etjobv1.AgentTokenAudience}, ExpirationSeconds: &expiry,
		BoundObjectRef: &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: w0.Name, UID: w0.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	agentToken := tr.Status.Token
	signal := func(token string) int {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/v1/signal?namespace=%s&pod=%s", addr, ns, w0.Name), nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	var code int
	testutil.Eventually(t, 20*time.Second, "the agent takes the agent-audience token", func() bool { code = signal(agentToken); return code == http.StatusOK })
	before := reviews.Load()
	if code := signal(apiToken); code != http.StatusUnauthorized {
		t.Errorf("the pod's API-audience token at the agent: %d, want 401", code)
	}
	// issue #42, M1: refused on its aud claim, before any review
	if n := reviews.Load() - before; n != 0 {
		t.Errorf("the API-audience token cost %d TokenReviews, want 0", n)
	}
	leaked := rest.AnonymousClientConfig(cfg)
	leaked.BearerToken = agentToken
	lc, err := kubernetes.NewForConfig(leaked)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lc.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsUnauthorized(err) {
		t.Errorf("the agent-audience token at the API server: %v, want 401 Unauthorized", err)
	}
}

// runAgent creates the test's Node and runs an agent for it, with o's
// options and the test's client, node name and fast polling, until ctx ends;
// it returns the signal endpoint's address.
func runAgent(ctx context.Context, t *testing.T, cs kubernetes.Interface, o agent.Options) string {
	t.Helper()
	if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o.Client, o.NodeName, o.PollInterval, o.Confirm, o.Listener = cs, nodeName, 50*time.Millisecond, 1, l
	a, err := agent.New(o)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = a.Run(ctx) }()
	return l.Addr().String()
}

// TestAgentPrice: the agent copies its price feed's price into the Node's
// etjob.dev/price-per-hour annotation, over the label, and again when it
// changes; a feed without a price leaves the Node alone.
func TestAgentPrice(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs := startAPIServer(t)
	md := emucloud.New()
	srv := httptest.NewServer(md)
	defer srv.Close()
	src, err := price.New(price.Local, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	runAgent(ctx, t, cs, agent.Options{PriceSource: src})
	annotation := func() (string, bool) {
		n, err := cs.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		v, ok := n.Annotations[etjobv1.AnnotationPricePerHour]
		return v, ok
	}
	time.Sleep(300 * time.Millisecond) // several polls of a feed with no price
	if v, ok := annotation(); ok {
		t.Errorf("annotation %q before the feed had a price", v)
	}
	md.SetSpotPrice("0.91")
	testutil.Eventually(t, 10*time.Second, "the price annotated", func() bool { v, _ := annotation(); return v == "0.91" })
	md.SetSpotPrice("1.5")
	testutil.Eventually(t, 10*time.Second, "the new price annotated", func() bool { v, _ := annotation(); return v == "1.5" })
	testutil.Eventually(t, 10*time.Second, "a PriceChanged Event", func() bool { return hasEvent(ctx, cs, "PriceChanged", "$1.5 an hour") })
}

// TestAgentRedetects: an agent whose cloud's metadata service did not answer
// at start (slow at boot) probes again with back-off: its readiness says so
// meanwhile, and once the cloud answers the node's notices are heard.
func TestAgentRedetects(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs := startAPIServer(t)
	emu := emucloud.New()
	mdsrv := httptest.NewServer(emu)
	defer mdsrv.Close()
	var answers atomic.Bool
	var probes atomic.Int32
	detect := func(context.Context) notice.Source {
		probes.Add(1)
		if !answers.Load() {
			return nil
		}
		src, _ := notice.New(notice.ProviderAWS, notice.Options{BaseURL: mdsrv.URL})
		return src
	}
	base := "http://" + runAgent(ctx, t, cs, agent.Options{Detect: detect, DetectBackoff: 20 * time.Millisecond})
	ready := func() (int, string) {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	testutil.Eventually(t, 20*time.Second, "two probes that found no cloud, and /readyz saying so", func() bool {
		code, body := ready()
		return probes.Load() >= 2 && code == http.StatusServiceUnavailable && strings.Contains(body, "--provider none")
	})
	answers.Store(true)
	testutil.Eventually(t, 20*time.Second, "/readyz ready with the cloud found", func() bool {
		code, body := ready()
		return code == http.StatusOK && strings.Contains(body, "cloud aws")
	})
	emu.SetReclaim(emucloud.AWS, time.Now().Add(2*time.Minute).UTC().Truncate(time.Second))
	testutil.Eventually(t, 20*time.Second, "the Node carries the cloud's notice", func() bool {
		n, err := cs.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		return err == nil && n.Annotations[etjobv1.AnnotationNodeNotice] != ""
	})
	if code, body := ready(); code != http.StatusOK {
		t.Errorf("/readyz = %d %q after the cloud was found", code, body)
	}
}

// reviewCounting is a clientset of cfg that counts the TokenReviews it
// creates.
func reviewCounting(t *testing.T, cfg *rest.Config) (kubernetes.Interface, *atomic.Int64) {
	t.Helper()
	var reviews atomic.Int64
	counted := rest.CopyConfig(cfg)
	counted.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/tokenreviews") {
				reviews.Add(1)
			}
			return rt.RoundTrip(r)
		})
	}
	cs, err := kubernetes.NewForConfig(counted)
	if err != nil {
		t.Fatal(err)
	}
	return cs, &reviews
}
