// Package rbac tests the shipped identities (config/rbac, config/agent)
// against a real kube-apiserver with RBAC and admission on: `kubectl auth
// can-i` for what each may do, and real requests made with each identity's
// own credentials (impersonation for the controller, a pod-bound
// service-account token for the agent, as its DaemonSet pod gets).
package rbac

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/agent"
	"github.com/etjob/etjob/internal/agent/notice"
	"github.com/etjob/etjob/internal/controller"
	"github.com/etjob/etjob/internal/emucloud"
	"github.com/etjob/etjob/internal/render"
	"github.com/etjob/etjob/internal/scheme"
	"github.com/etjob/etjob/internal/testutil"
)

const (
	controllerSA = "system:serviceaccount:etjob-system:etjob-controller"
	agentSA      = "system:serviceaccount:etjob-agent:etjob-agent"
)

var (
	env   *envtest.Environment
	admin *rest.Config
	cs    *kubernetes.Clientset
	root  string
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	var err error
	if root, err = testutil.RepoRoot(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	assets, err := testutil.ControlPlaneAssets()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	os.Setenv("KUBEBUILDER_ASSETS", assets)
	env = &envtest.Environment{CRDDirectoryPaths: []string{filepath.Join(root, "config", "crd", "bases")}, ErrorIfCRDPathMissing: true}
	if admin, err = env.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "starting kube-apiserver and etcd:", err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	if cs, err = kubernetes.NewForConfig(admin); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// The shipped manifests, as `kubectl apply -k config/default` installs
	// them (the Deployment and DaemonSet objects too; nothing runs them
	// here), the namespaces first.
	for _, dir := range []string{"manager", "agent", "rbac"} {
		if err := applyDir(filepath.Join(root, "config", dir)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return m.Run()
}

// applyDir creates every object of every YAML file in dir (each file that
// has a Namespace holds it first).
func applyDir(dir string) error {
	c, err := client.New(admin, client.Options{Scheme: scheme.New()})
	if err != nil {
		return err
	}
	objs, err := testutil.Manifests(dir)
	if err != nil {
		return err
	}
	for _, u := range objs {
		if err := c.Create(context.Background(), u); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("%s: creating %s %s: %w", dir, u.GetKind(), u.GetName(), err)
		}
	}
	return nil
}

// canI runs `kubectl auth can-i VERB RESOURCE --as USER [-n NS]` with the
// control plane's own kubectl and reports its answer. pods/exec is the exec
// subresource (kubectl reads TYPE/NAME, so it passes --subresource).
func canI(t *testing.T, user, ns, verb, resource string) bool {
	t.Helper()
	kc := env.ControlPlane.KubeCtl()
	args := []string{"auth", "can-i", verb, resource, "--as", user}
	if r, sub, ok := strings.Cut(resource, "/"); ok && (sub == "exec" || sub == "log" || sub == "status" || sub == "scale") {
		args = []string{"auth", "can-i", verb, r, "--subresource", sub, "--as", user}
	}
	if strings.HasPrefix(user, "system:serviceaccount:") {
		parts := strings.Split(user, ":")
		args = append(args, "--as-group", "system:serviceaccounts", "--as-group", "system:serviceaccounts:"+parts[2], "--as-group", "system:authenticated")
	}
	if ns != "" {
		args = append(args, "-n", ns)
	}
	stdout, stderr, err := kc.Run(args...)
	out, _ := io.ReadAll(stdout)
	answer := strings.TrimSpace(string(out))
	if answer != "yes" && answer != "no" {
		errOut, _ := io.ReadAll(stderr)
		t.Fatalf("kubectl %s: %q %v %s", strings.Join(args, " "), answer, err, errOut)
	}
	t.Logf("kubectl %s -> %s", strings.Join(args, " "), answer)
	return answer == "yes"
}

// as is a client acting as the service account user (impersonation: the
// authorizer sees exactly that user and its groups).
func as(t *testing.T, user string) *kubernetes.Clientset {
	t.Helper()
	cfg := rest.CopyConfig(admin)
	parts := strings.Split(user, ":")
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + parts[2], "system:authenticated"}}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func namespace(t *testing.T, prefix string) string {
	t.Helper()
	ns, err := cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// TestControllerIdentity (finding H1): the controller can bind the launcher
// ClusterRole and nothing else, holds no pods/exec and creates no Roles,
// reads Secrets by name only (issue #42, M6), and holds no verb its code
// does not call on its jobs and their ServiceAccounts (issue #42, low).
func TestControllerIdentity(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t, "tenant-")
	for _, c := range []struct {
		verb, resource, ns string
		want               bool
	}{
		{"create", "pods/exec", ns, false},
		{"get", "pods/exec", ns, false},
		{"create", "roles.rbac.authorization.k8s.io", ns, false},
		{"escalate", "roles.rbac.authorization.k8s.io", ns, false},
		{"bind", "clusterroles.rbac.authorization.k8s.io/" + render.LauncherClusterRole, "", true},
		{"bind", "clusterroles.rbac.authorization.k8s.io/cluster-admin", "", false},
		{"bind", "clusterroles.rbac.authorization.k8s.io/admin", "", false},
		{"create", "rolebindings.rbac.authorization.k8s.io", ns, true},
		{"create", "pods", ns, true},
		// issue #42 M6: a job's store Secret by its name, never the list
		{"get", "secrets", ns, true},
		{"create", "secrets", ns, true},
		{"list", "secrets", ns, false},
		{"watch", "secrets", "", false},
		// issue #42, low: the verbs the code calls and no other (a job's
		// spec changes by /scale alone; its status by update)
		{"update", "elasticjobs.etjob.dev", ns, false},
		{"patch", "elasticjobs.etjob.dev", ns, false},
		{"delete", "elasticjobs.etjob.dev", ns, true},
		{"patch", "elasticjobs.etjob.dev/scale", ns, true},
		{"update", "elasticjobs.etjob.dev/scale", ns, false},
		{"update", "elasticjobs.etjob.dev/status", ns, true},
		{"patch", "elasticjobs.etjob.dev/status", ns, false},
		{"update", "services", ns, true},
		{"update", "serviceaccounts", ns, false},
	} {
		if got := canI(t, controllerSA, c.ns, c.verb, c.resource); got != c.want {
			t.Errorf("controller: can-i %s %s -n %q = %t, want %t", c.verb, c.resource, c.ns, got, c.want)
		}
	}

	// Real requests as the controller: the launcher's RoleBinding goes
	// through; a binding of anything else, or a Role, is refused.
	ctl := as(t, controllerSA)
	job := &etjobv1.ElasticJob{ObjectMeta: metav1.ObjectMeta{Name: "j", Namespace: ns, UID: types.UID("00000000-0000-0000-0000-000000000001")}}
	sa, rb := render.LauncherRBAC(job)
	sa.OwnerReferences, rb.OwnerReferences = nil, nil // no such job object here
	if _, err := ctl.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatalf("controller creates the launcher ServiceAccount: %v", err)
	}
	if _, err := ctl.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatalf("controller binds %s to the launcher: %v", render.LauncherClusterRole, err)
	}
	evil := rb.DeepCopy()
	evil.Name, evil.RoleRef.Name = "evil", "cluster-admin"
	if _, err := ctl.RbacV1().RoleBindings(ns).Create(ctx, evil, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("controller binds cluster-admin: %v, want Forbidden", err)
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "r", Namespace: ns}, Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods/exec"}, Verbs: []string{"create"}}}}
	if _, err := ctl.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("controller creates a Role: %v, want Forbidden", err)
	}

	// The launcher it bound may exec into pods of its own namespace only.
	launcher := "system:serviceaccount:" + ns + ":" + sa.Name
	// the authorizer's cache sees the new binding within moments
	testutil.Eventually(t, 10*time.Second, "the launcher may exec into its job's pods", func() bool {
		return canI(t, launcher, ns, "create", "pods/exec")
	})
	if !canI(t, launcher, ns, "get", "pods/exec") || !canI(t, launcher, ns, "get", "configmaps") {
		t.Error("the launcher cannot exec into its job's pods or read its ConfigMap")
	}
	other := namespace(t, "other-")
	if canI(t, launcher, other, "create", "pods/exec") || canI(t, launcher, ns, "delete", "pods") {
		t.Error("the launcher may exec outside its namespace, or delete pods")
	}
}

// agentToken is the token the agent's DaemonSet pod on node gets: bound to a
// pod of ServiceAccount etjob-agent/etjob-agent bound to that node.
func agentToken(t *testing.T, node string) *kubernetes.Clientset {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "etjob-agent-", Namespace: "etjob-agent"},
		Spec:       corev1.PodSpec{NodeName: node, ServiceAccountName: "etjob-agent", Containers: []corev1.Container{{Name: "agent", Image: "etjob-agent"}}},
	}
	pod, err := cs.CoreV1().Pods("etjob-agent").Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	expiry := int64(3600)
	tr, err := cs.CoreV1().ServiceAccounts("etjob-agent").CreateToken(ctx, "etjob-agent", &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
		ExpirationSeconds: &expiry,
		BoundObjectRef:    &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(admin)
	cfg.BearerToken = tr.Status.Token
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// event creates a core/v1 Event in ns about the object kind/name (in
// objNS) with c, as the agent's recorder does.
func event(c *kubernetes.Clientset, ns, kind, name, objNS string) error {
	e := &corev1.Event{ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-", Namespace: ns},
		InvolvedObject: corev1.ObjectReference{APIVersion: "v1", Kind: kind, Name: name, Namespace: objNS},
		Reason:         "SpotToBeReleased", Message: "probe", Type: corev1.EventTypeWarning,
		Source: corev1.EventSource{Component: "etjob-agent"}, FirstTimestamp: metav1.Now(), LastTimestamp: metav1.Now(), Count: 1}
	_, err := c.CoreV1().Events(ns).Create(context.Background(), e, metav1.CreateOptions{})
	return err
}

// eventV1 is event through the events.k8s.io API.
func eventV1(c *kubernetes.Clientset, ns, kind, name, objNS string) error {
	e := &eventsv1.Event{ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-", Namespace: ns},
		Regarding: corev1.ObjectReference{APIVersion: "v1", Kind: kind, Name: name, Namespace: objNS},
		Reason:    "SpotToBeReleased", Note: "probe", Type: corev1.EventTypeWarning, Action: "Notice",
		ReportingController: "etjob.dev/agent", ReportingInstance: "probe", EventTime: metav1.NowMicro()}
	_, err := c.EventsV1().Events(ns).Create(context.Background(), e, metav1.CreateOptions{})
	return err
}

func mergePatch(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestAgentIdentity (findings C1, N2, N3): with its own node's token, the
// agent marks its own Node and the pods bound to it, with etjob.dev/ keys
// only, and posts Events about its own Node only; another node, a label, a
// foreign taint, a cordon, a pod's image, owners or finalizers, and an Event
// about a pod or another node are refused.
func TestAgentIdentity(t *testing.T) {
	ctx := context.Background()
	for _, n := range []string{"spot-a", "spot-b"} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{etjobv1.LabelCapacityType: etjobv1.CapacityTypeSpot}}}
		if _, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ns := namespace(t, "tenant-")
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	pods := map[string]string{}
	for _, n := range []string{"spot-a", "spot-b"} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "w-" + n, Namespace: ns},
			Spec: corev1.PodSpec{NodeName: n, Containers: []corev1.Container{{Name: "worker", Image: "train:1"}}}}
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pods[n] = p.Name
	}
	for _, c := range []struct {
		verb, resource string
		want           bool
	}{
		{"patch", "nodes", true}, {"update", "nodes", false}, {"delete", "nodes", false},
		{"patch", "pods", true}, {"update", "pods", false}, {"create", "pods", false}, {"delete", "pods", false},
	} {
		if got := canI(t, agentSA, ns, c.verb, c.resource); got != c.want {
			t.Errorf("agent: can-i %s %s = %t, want %t", c.verb, c.resource, got, c.want)
		}
	}

	agent := agentToken(t, "spot-a")
	deadline := time.Now().Add(2 * time.Minute).UTC().Format(time.RFC3339)
	node := func(name string, patch map[string]any) error {
		_, err := agent.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, mergePatch(t, patch), metav1.PatchOptions{})
		return err
	}
	pod := func(name string, patch map[string]any) error {
		_, err := agent.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, mergePatch(t, patch), metav1.PatchOptions{})
		return err
	}
	ann := func(k, v string) map[string]any {
		return map[string]any{"metadata": map[string]any{"annotations": map[string]any{k: v}}}
	}
	// A taint list is replaced whole (the API server's admission gave every
	// node node.kubernetes.io/not-ready): the agent keeps the others.
	withTaint := func(name string, extra ...corev1.Taint) map[string]any {
		n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return map[string]any{"spec": map[string]any{"taints": append(n.Spec.Taints, extra...)}}
	}
	allowed := map[string]error{
		"mark its own node":                 node("spot-a", ann(etjobv1.AnnotationNodeNotice, deadline)),
		"taint its own node etjob.dev/":     node("spot-a", withTaint("spot-a", corev1.Taint{Key: etjobv1.TaintReclaiming, Value: "aws", Effect: corev1.TaintEffectNoSchedule})),
		"publish a checkpoint on its pod":   pod(pods["spot-a"], ann(etjobv1.AnnotationCheckpoint, `{"step":10}`)),
		"withdraw the notice from its node": node("spot-a", map[string]any{"metadata": map[string]any{"annotations": map[string]any{etjobv1.AnnotationNodeNotice: nil}}}),
	}
	for what, err := range allowed {
		if err != nil {
			t.Errorf("the agent of spot-a cannot %s: %v", what, err)
		}
	}
	refused := map[string]error{
		"mark another node":               node("spot-b", ann(etjobv1.AnnotationNodeNotice, deadline)),
		"label its own node":              node("spot-a", map[string]any{"metadata": map[string]any{"labels": map[string]any{etjobv1.LabelCapacityType: "on-demand"}}}),
		"annotate its node outside etjob": node("spot-a", ann("example.com/owner", "me")),
		"taint its own node NoExecute":    node("spot-a", withTaint("spot-a", corev1.Taint{Key: "evil", Effect: corev1.TaintEffectNoExecute})),
		"drop another taint of its node":  node("spot-a", map[string]any{"spec": map[string]any{"taints": []any{}}}),
		"cordon its own node":             node("spot-a", map[string]any{"spec": map[string]any{"unschedulable": true}}),
		"annotate a pod on another node":  pod(pods["spot-b"], ann(etjobv1.AnnotationCheckpoint, `{"step":10}`)),
		"change a pod's image":            pod(pods["spot-a"], map[string]any{"spec": map[string]any{"containers": []any{map[string]any{"name": "worker", "image": "evil:1"}}}}),
		"tell a pod to leave":             pod(pods["spot-a"], map[string]any{"metadata": map[string]any{"labels": map[string]any{"x": "y"}}}),
		// N3: re-pointed to another job, a pod's failure would count there
		"re-point its pod's owner": pod(pods["spot-a"], map[string]any{"metadata": map[string]any{"ownerReferences": []any{map[string]any{
			"apiVersion": etjobv1.GroupVersion.String(), "kind": "ElasticJob", "name": "victim", "uid": "0c4f4a6e-1111-4b7e-9a6e-000000000001", "controller": true}}}}),
		"add a finalizer to its pod":  pod(pods["spot-a"], map[string]any{"metadata": map[string]any{"finalizers": []any{"example.com/hold"}}}),
		"add a finalizer to its node": node("spot-a", map[string]any{"metadata": map[string]any{"finalizers": []any{"example.com/hold"}}}),
		"give its node an owner":      node("spot-a", map[string]any{"metadata": map[string]any{"ownerReferences": []any{map[string]any{"apiVersion": "v1", "kind": "Node", "name": "spot-b", "uid": "0c4f4a6e-1111-4b7e-9a6e-000000000002"}}}}),
		// N2: a notice Event about a pod of any namespace would make it leave
		"post an Event about a pod":          event(agent, ns, "Pod", pods["spot-a"], ns),
		"post an Event about another node":   event(agent, "default", "Node", "spot-b", ""),
		"post an events.k8s.io Event on pod": eventV1(agent, ns, "Pod", pods["spot-a"], ns),
	}
	// A notice Event about a pod that someone else posted: the agent may not
	// add to its count either (the controller takes a repeat as a notice).
	posted := &corev1.Event{ObjectMeta: metav1.ObjectMeta{GenerateName: "eci-", Namespace: ns},
		InvolvedObject: corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Name: pods["spot-a"], Namespace: ns},
		Reason:         "SpotToBeReleased", Message: "eci", Type: corev1.EventTypeWarning, Count: 1}
	posted, err := cs.CoreV1().Events(ns).Create(ctx, posted, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = agent.CoreV1().Events(ns).Patch(ctx, posted.Name, types.MergePatchType, []byte(`{"count":2}`), metav1.PatchOptions{})
	refused["add to the count of a pod's Event"] = err
	if err := event(agent, "default", "Node", "spot-a", ""); err != nil {
		t.Errorf("the agent of spot-a cannot post an Event about its own node: %v", err)
	}
	// issue #42, low: the agent's recorder posts core Events; the
	// events.k8s.io API is not the agent's at all.
	refused["post an events.k8s.io Event about its own node"] = eventV1(agent, "default", "Node", "spot-a", "")
	for what, err := range refused {
		if err == nil {
			t.Errorf("the agent of spot-a may %s", what)
		} else if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
			t.Errorf("%s: %v, want a refusal", what, err)
		} else {
			t.Logf("%s: refused: %v", what, err)
		}
	}
	b, err := cs.CoreV1().Nodes().Get(ctx, "spot-b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if b.Annotations[etjobv1.AnnotationNodeNotice] != "" {
		t.Errorf("spot-b carries a forged notice: %v", b.Annotations)
	}
}

// TestRealAgentUnderItsIdentity runs the real agent with its DaemonSet pod's
// token, the shipped ClusterRole and admission policy in force: a cloud
// notice still marks and taints its Node, and withdrawing it unmarks it.
func TestRealAgentUnderItsIdentity(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const name = "spot-real"
	if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
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
	a, err := agent.New(agent.Options{Client: agentToken(t, name), NodeName: name, Source: src, PollInterval: 50 * time.Millisecond, Confirm: 1, Listener: l,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
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
	deadline := time.Now().Add(2 * time.Minute).UTC().Truncate(time.Second)
	emu.SetReclaim(emucloud.AWS, deadline)
	marked := func(want bool) func() bool {
		return func() bool {
			n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false
			}
			tainted := false
			for _, taint := range n.Spec.Taints {
				tainted = tainted || taint.Key == etjobv1.TaintReclaiming
			}
			return (n.Annotations[etjobv1.AnnotationNodeNotice] == deadline.Format(time.RFC3339)) == want && tainted == want
		}
	}
	testutil.Eventually(t, 20*time.Second, "the agent marks and taints its Node under its own identity", marked(true))
	emu.Clear()
	testutil.Eventually(t, 20*time.Second, "the agent unmarks its Node when the notice is withdrawn", marked(false))
}

// TestUserRoles (a low finding): a user with etjob-edit (aggregated into
// edit and admin) can do what `etjob scaleout` and `scalein` do; etjob-view
// reads them.
func TestUserRoles(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t, "team-")
	for user, role := range map[string]string{"alice": "etjob-edit", "bob": "etjob-view"} {
		rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user, Namespace: ns},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role},
			Subjects: []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: user}}}
		if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, 10*time.Second, "the bindings are seen", func() bool { return canI(t, "bob", ns, "get", "elasticjobs.etjob.dev") })
	for _, c := range []struct {
		user, verb, resource string
		want                 bool
	}{
		{"alice", "create", "scaleouts.etjob.dev", true},
		{"alice", "create", "scaleins.etjob.dev", true},
		{"alice", "get", "scaleouts.etjob.dev/status", true},
		{"alice", "update", "elasticjobs.etjob.dev/status", false},
		{"bob", "get", "scaleins.etjob.dev", true},
		{"bob", "create", "scaleouts.etjob.dev", false},
	} {
		if got := canI(t, c.user, ns, c.verb, c.resource); got != c.want {
			t.Errorf("%s: can-i %s %s = %t, want %t", c.user, c.verb, c.resource, got, c.want)
		}
	}
}

// TestMetricsNeedAuthorization (issue #13, metrics): the controller's
// metrics are served over HTTPS to callers the API server authenticates and
// authorizes: none without a token, 403 for a ServiceAccount without
// etjob-metrics-reader, the metrics for one bound to it.
func TestMetricsNeedAuthorization(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	mgr, err := ctrl.NewManager(admin, controller.ManagerOptions(controller.Options{MetricsAddr: addr, ProbeAddr: "0", SecureMetrics: true}))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = mgr.Start(ctx) }()

	ns := namespace(t, "monitoring-")
	token := func(sa string) string {
		t.Helper()
		if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		expiry := int64(600)
		tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	nobody, prom := token("nobody"), token("prometheus")
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "prometheus-" + ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "etjob-metrics-reader"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "prometheus", Namespace: ns}}}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The serving certificate is self-signed (bring your own with a
	// cert-manager Certificate and --metrics-cert-dir in production).
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // self-signed test server
	get := func(tok string) (int, string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/metrics", nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	testutil.Eventually(t, testutil.Timeout, "the metrics endpoint answers a reader", func() bool {
		code, body := get(prom)
		return code == http.StatusOK && strings.Contains(body, "# TYPE")
	})
	if code, _ := get(""); code != http.StatusUnauthorized {
		t.Errorf("metrics without a token: %d, want 401", code)
	}
	if code, _ := get(nobody); code != http.StatusForbidden {
		t.Errorf("metrics for a ServiceAccount without etjob-metrics-reader: %d, want 403", code)
	}
}

// TestKubeletPodEvents (issue #42, M2): on a node no etjob agent serves the
// controller takes a notice Event about a worker as its notice, and any
// kubelet may post Events about any pod. Under the chart's admission policy
// (etjob-kubelet-pod-events) a kubelet must name its own node as an Event's
// source, and the controller takes no notice whose source names another
// node than the pod's (internal/core TestPodNoticeEvent): the kubelet of
// spot-b cannot make a pod on spot-a leave. The API server here runs RBAC
// alone, so the test grants the kubelets what the Node authorizer grants
// every node (events create and patch), named as that stand-in.
func TestKubeletPodEvents(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t, "kubelet-events-")
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "test-stand-in-for-the-node-authorizer-events"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "update", "patch"}}}}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "Group", Name: "system:nodes"}}}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(admin)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:node:spot-b", Groups: []string{"system:nodes", "system:authenticated"}}
	kubelet, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	core := func(host, instance string) error {
		e := &corev1.Event{ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-", Namespace: ns},
			InvolvedObject: corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Name: "train-worker-0", Namespace: ns, UID: "0c4f4a6e-1111-4b7e-9a6e-000000000003"},
			Reason:         "SpotToBeReleased", Message: "probe", Type: corev1.EventTypeWarning,
			Source: corev1.EventSource{Component: "kubelet", Host: host}, ReportingController: "kubelet", ReportingInstance: instance,
			FirstTimestamp: metav1.Now(), LastTimestamp: metav1.Now(), Count: 1}
		_, err := kubelet.CoreV1().Events(ns).Create(ctx, e, metav1.CreateOptions{})
		return err
	}
	v1 := func(instance string) error {
		e := &eventsv1.Event{ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-", Namespace: ns},
			Regarding: corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Name: "train-worker-0", Namespace: ns},
			Reason:    "SpotToBeReleased", Note: "probe", Type: corev1.EventTypeWarning, Action: "Notice",
			ReportingController: "kubelet", ReportingInstance: instance, EventTime: metav1.NowMicro()}
		_, err := kubelet.EventsV1().Events(ns).Create(ctx, e, metav1.CreateOptions{})
		return err
	}
	// The policies were created at the start (TestMain): the API server
	// enforces one once its informer has it.
	testutil.Eventually(t, 20*time.Second, "the policy etjob-kubelet-pod-events is in force", func() bool { return core("spot-a", "") != nil })
	if err := core("spot-b", "spot-b"); err != nil {
		t.Errorf("the kubelet of spot-b cannot post an Event about a pod naming itself, as kubelets do: %v", err)
	}
	if err := v1("spot-b"); err != nil {
		t.Errorf("the kubelet of spot-b cannot post an events.k8s.io Event about a pod naming itself: %v", err)
	}
	for what, err := range map[string]error{
		"name spot-a as the source":                       core("spot-a", ""),
		"name spot-a as the reporting instance":           core("spot-b", "spot-a"),
		"name no source":                                  core("", ""),
		"name spot-a as the source through events.k8s.io": v1("spot-a"),
	} {
		if err == nil {
			t.Errorf("the kubelet of spot-b may %s of an Event about a pod", what)
		} else if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
			t.Errorf("%s: %v, want a refusal", what, err)
		} else {
			t.Logf("%s: refused: %v", what, err)
		}
	}
}
