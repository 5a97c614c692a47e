package chart_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/chart"
	"github.com/etjob/etjob/internal/testutil"
)

// TestDefaults: the default rendering installs every part, images pinned to
// the chart's appVersion, the components run by name (their images put
// them on PATH), and the Go heap held under the memory limit.
func TestDefaults(t *testing.T) {
	objs, err := chart.Objects(nil)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.GetKind()]++
	}
	for kind, n := range map[string]int{"CustomResourceDefinition": 3, "Namespace": 2, "Deployment": 1, "DaemonSet": 1,
		"ValidatingAdmissionPolicy": 3, "ValidatingAdmissionPolicyBinding": 3, "ConfigMap": 1, "PodDisruptionBudget": 1} {
		if kinds[kind] != n {
			t.Errorf("%d %s rendered, want %d", kinds[kind], kind, n)
		}
	}
	ctl := testutil.Container(t, testutil.Find(t, objs, "Deployment", "etjob-controller"))
	if ctl["image"] != "ghcr.io/etjob/etjob-controller:v0.1.0" {
		t.Errorf("controller image %v", ctl["image"])
	}
	if cmd, _ := ctl["command"].([]any); len(cmd) != 1 || cmd[0] != "etjob-controller" {
		t.Errorf("controller command %v", ctl["command"])
	}
	args := strings.Join(toStrings(ctl["args"]), " ")
	for _, want := range []string{"--leader-elect", "--leader-election-namespace=etjob-system", "--metrics-secure=true",
		"--metrics-bind-address=:8443", "--memory-limit=$(MEMORY_LIMIT)", "--gc-percent=50", "--price-table=etjob-system/etjob-prices"} {
		if !strings.Contains(args, want) {
			t.Errorf("controller args %q lack %q", args, want)
		}
	}
	agent := testutil.Container(t, testutil.Find(t, objs, "DaemonSet", "etjob-agent"))
	if agent["image"] != "ghcr.io/etjob/etjob-agent:v0.1.0" {
		t.Errorf("agent image %v", agent["image"])
	}
	if a := strings.Join(toStrings(agent["args"]), " "); strings.Contains(a, "--metadata-url") || !strings.Contains(a, "--provider=auto") {
		t.Errorf("agent args %q: want the cloud's own metadata service and auto-detection", a)
	}
}

// TestValues: what a platform team changes reaches every object that
// depends on it.
func TestValues(t *testing.T) {
	objs, err := chart.Objects(map[string]any{
		"namespaces": map[string]any{"create": false},
		"controller": map[string]any{"namespace": "ml-system", "replicas": 3, "listenOnPodIP": true,
			"image": map[string]any{"digest": "sha256:0123"}, "resources": map[string]any{"limits": map[string]any{"memory": nil}},
			"extraArgs": []any{"--concurrency=8"}, "watchNamespaces": []any{"team-a", "team-b"},
			"trustedNodeLabel": "node-restriction.kubernetes.io/etjob-trusted=true", "priceKeyLabelPrefix": "node-restriction.kubernetes.io/etjob-",
			"priceTableRequired": true, "podNoticeEvents": "off"},
		"agent": map[string]any{"namespace": "ml-agent", "metadataURL": "http://$(NODE_IP):8775", "azureVMName": "vm-1",
			"criticalPodQuota": map[string]any{"enabled": true}},
		"dashboard": map[string]any{"enabled": false},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() == "Namespace" || o.GetKind() == "ConfigMap" {
			t.Errorf("%s %s rendered though disabled", o.GetKind(), o.GetName())
		}
	}
	// N12: GKE's quota for the agent's system-node-critical pods, in its namespace.
	quota := testutil.Find(t, objs, "ResourceQuota", "etjob-agent-critical-pods")
	scope, _, _ := unstructured.NestedSlice(quota.Object, "spec", "scopeSelector", "matchExpressions")
	if quota.GetNamespace() != "ml-agent" || len(scope) != 1 || fmt.Sprint(scope[0]) != "map[operator:In scopeName:PriorityClass values:[system-node-critical]]" {
		t.Errorf("the agent's priority quota: namespace %q, scope %v", quota.GetNamespace(), scope)
	}
	dep := testutil.Find(t, objs, "Deployment", "etjob-controller")
	if dep.GetNamespace() != "ml-system" {
		t.Errorf("controller in %q", dep.GetNamespace())
	}
	if n, _, _ := unstructured.NestedInt64(dep.Object, "spec", "replicas"); n != 3 {
		t.Errorf("replicas %d", n)
	}
	ctl := testutil.Container(t, dep)
	if ctl["image"] != "ghcr.io/etjob/etjob-controller@sha256:0123" {
		t.Errorf("controller image %v, want by digest", ctl["image"])
	}
	args := strings.Join(toStrings(ctl["args"]), " ")
	for _, want := range []string{"--metrics-bind-address=$(POD_IP):8443", "--leader-election-namespace=ml-system", "--concurrency=8",
		"--namespaces=team-a,team-b", "--launcher-node-label=node-restriction.kubernetes.io/etjob-trusted=true",
		"--price-key-label-prefix=node-restriction.kubernetes.io/etjob-", "--price-table-required", "--pod-notice-events=off"} {
		if !strings.Contains(args, want) {
			t.Errorf("controller args %q lack %q", args, want)
		}
	}
	// issue #42 H2: the controller's replicas require the admin's label too
	terms, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "affinity", "nodeAffinity",
		"requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms")
	if len(terms) != 1 || !strings.Contains(fmt.Sprint(terms[0]), "map[key:node-restriction.kubernetes.io/etjob-trusted operator:In values:[true]]") {
		t.Errorf("the controller's required terms %v lack the trusted node label", terms)
	}
	if strings.Contains(args, "--memory-limit") {
		t.Errorf("controller args %q: no memory limit, no --memory-limit", args)
	}
	if sa := testutil.Find(t, objs, "ServiceAccount", "etjob-controller"); sa.GetNamespace() != "ml-system" {
		t.Errorf("controller ServiceAccount in %q", sa.GetNamespace())
	}
	subjects, _, _ := unstructured.NestedSlice(testutil.Find(t, objs, "ClusterRoleBinding", "etjob-agent").Object, "subjects")
	if subjects[0].(map[string]any)["namespace"] != "ml-agent" {
		t.Errorf("agent binding subjects %v", subjects)
	}
	for _, name := range []string{"etjob-agent-own-node", "etjob-agent-own-events"} {
		policy, _, _ := unstructured.NestedSlice(testutil.Find(t, objs, "ValidatingAdmissionPolicy", name).Object, "spec", "matchConditions")
		if expr := policy[0].(map[string]any)["expression"].(string); !strings.Contains(expr, "system:serviceaccount:ml-agent:etjob-agent") {
			t.Errorf("the admission policy %s matches %q, not the agent's ServiceAccount in ml-agent", name, expr)
		}
	}
	a := strings.Join(toStrings(testutil.Container(t, testutil.Find(t, objs, "DaemonSet", "etjob-agent"))["args"]), " ")
	for _, want := range []string{"--metadata-url=http://$(NODE_IP):8775", "--azure-vm-name=vm-1"} {
		if !strings.Contains(a, want) {
			t.Errorf("agent args %q lack %q", a, want)
		}
	}
}

func toStrings(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}

// TestPricesValue (issue #42, M5): controller.prices ships the admin's
// price table as the ConfigMap --price-table names, in a form the
// controller parses; without it the chart ships none.
func TestPricesValue(t *testing.T) {
	objs, err := chart.Objects(map[string]any{"controller": map[string]any{"prices": "p4d.24xlarge spot 9.83\np4d.24xlarge on-demand 32.77\n"}})
	if err != nil {
		t.Fatal(err)
	}
	cm := testutil.Find(t, objs, "ConfigMap", "etjob-prices")
	text, _, _ := unstructured.NestedString(cm.Object, "data", etjobv1.PriceTableKey)
	table, err := etjobv1.ParsePriceTable(text)
	if err != nil || len(table.Prices) != 2 || cm.GetNamespace() != "etjob-system" {
		t.Errorf("the shipped table in %q: %q: %v", cm.GetNamespace(), text, err)
	}
	dep := testutil.Find(t, objs, "Deployment", "etjob-controller")
	if args := strings.Join(toStrings(testutil.Container(t, dep)["args"]), " "); !strings.Contains(args, "--price-table=etjob-system/etjob-prices") ||
		!strings.Contains(args, "--pod-notice-events=agentless") || strings.Contains(args, "--price-table-required") {
		t.Errorf("the defaults' controller args %q", args)
	}
	if objs, err = chart.Objects(nil); err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() == "ConfigMap" && o.GetName() == "etjob-prices" {
			t.Error("a price table shipped though controller.prices is empty")
		}
	}
}

// TestBadValues: the chart's schema refuses a bad value, naming it.
func TestBadValues(t *testing.T) {
	for field, values := range map[string]map[string]any{
		"replicas":            {"controller": map[string]any{"replicas": 0}},
		"provider":            {"agent": map[string]any{"provider": "oracle"}},
		"pollInterval":        {"agent": map[string]any{"pollInterval": "soon"}},
		"replcas":             {"controller": map[string]any{"replcas": 2}},
		"digest":              {"agent": map[string]any{"image": map[string]any{"digest": "latest"}}},
		"trustedNodeLabel":    {"controller": map[string]any{"trustedNodeLabel": "no value at all"}},
		"priceKeyLabelPrefix": {"controller": map[string]any{"priceKeyLabelPrefix": "two/slashes/"}},
		"podNoticeEvents":     {"controller": map[string]any{"podNoticeEvents": "sometimes"}},
		"priceTableRequired":  {"controller": map[string]any{"priceTableRequired": "yes"}},
	} {
		_, err := chart.Objects(values)
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: error %v, want one that names %s", field, err, field)
		}
	}
}

// TestKustomizeDiff: Diff finds a changed file, a missing one and a stray
// one, and nothing in a tree written from the rendering itself.
func TestKustomizeDiff(t *testing.T) {
	want, err := chart.Kustomize()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for rel, content := range want {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, content, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if stale, err := chart.Diff(dir, want); err != nil || len(stale) > 0 {
		t.Fatalf("Diff of the rendering itself = %v, %v", stale, err)
	}
	_ = os.WriteFile(filepath.Join(dir, "manager", "manager.yaml"), []byte("# edited by hand\n"), 0o644)
	_ = os.Remove(filepath.Join(dir, "rbac", "role.yaml"))
	_ = os.WriteFile(filepath.Join(dir, "agent", "extra.yaml"), []byte("kind: ConfigMap\n"), 0o644)
	stale, err := chart.Diff(dir, want)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(stale, " "); got != "agent/extra.yaml manager/manager.yaml rbac/role.yaml" {
		t.Errorf("Diff = %q, want the stray, the edited and the missing file", got)
	}
}

// TestAgentPort holds the chart's agent port equal to the worker contract's
// (etjobv1.AgentPort, where render points every worker's $ETJOB_AGENT_ADDR):
// its --listen flag, its container and host port, and its readiness probe.
func TestAgentPort(t *testing.T) {
	objs, err := chart.Objects(nil)
	if err != nil {
		t.Fatal(err)
	}
	agent := testutil.Container(t, testutil.Find(t, objs, "DaemonSet", "etjob-agent"))
	port := fmt.Sprint(etjobv1.AgentPort)
	if a := toStrings(agent["args"]); !slices.Contains(a, "--listen=$(NODE_IP):"+port) {
		t.Errorf("agent args %q: want --listen=$(NODE_IP):%s", a, port)
	}
	ports, _ := agent["ports"].([]any)
	found := false
	for _, p := range ports {
		m, _ := p.(map[string]any)
		if fmt.Sprint(m["containerPort"]) == port && fmt.Sprint(m["hostPort"]) == port {
			found = true
		}
	}
	if !found {
		t.Errorf("agent ports %v: want containerPort and hostPort %s", ports, port)
	}
	probe, _ := agent["readinessProbe"].(map[string]any)
	get, _ := probe["httpGet"].(map[string]any)
	if fmt.Sprint(get["port"]) != port {
		t.Errorf("agent readiness probe %v: want port %s", probe, port)
	}
}
