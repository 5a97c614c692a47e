package config

import (
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/etjob/etjob/internal/chart"
	"github.com/etjob/etjob/internal/testutil"
)

// objects are every object of the manifests under config/ (kustomize trees).
func objects(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	for _, dir := range []string{"manager", "agent", "rbac"} {
		objs, err := testutil.Manifests(dir)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, objs...)
	}
	return out
}

// TestManifestsFitToDeploy (finding M6): pinned images, an agent image of its
// own, the controller on reliable capacity with a PDB and spread replicas,
// Pod Security labels, the agent non-root with a seccomp profile.
func TestManifestsFitToDeploy(t *testing.T) {
	objs := objects(t)
	for _, o := range objs {
		containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		for _, c := range containers {
			img, _ := c.(map[string]any)["image"].(string)
			if !strings.Contains(img, ":") || strings.HasSuffix(img, ":latest") {
				t.Errorf("%s %s: image %q is not pinned to a version", o.GetKind(), o.GetName(), img)
			}
		}
	}
	agent := testutil.Find(t, objs, "DaemonSet", "etjob-agent")
	if img, _ := testutil.Container(t, agent)["image"].(string); !strings.Contains(img, "etjob-agent") {
		t.Errorf("the agent runs %q, not the agent image", img)
	}
	if v, _, _ := unstructured.NestedBool(agent.Object, "spec", "template", "spec", "securityContext", "runAsNonRoot"); !v {
		t.Error("the agent does not run as non-root")
	}
	if v, _, _ := unstructured.NestedString(agent.Object, "spec", "template", "spec", "securityContext", "seccompProfile", "type"); v != "RuntimeDefault" {
		t.Error("the agent has no seccomp profile")
	}
	ctl := testutil.Find(t, objs, "Deployment", "etjob-controller")
	if r, _, _ := unstructured.NestedFieldNoCopy(ctl.Object, "spec", "replicas"); fmt.Sprint(r) != "2" {
		t.Errorf("controller replicas %v, want 2 (leader election)", r)
	}
	terms, _, _ := unstructured.NestedSlice(ctl.Object, "spec", "template", "spec", "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms")
	if len(terms) != 1 || !strings.Contains(fmt.Sprint(terms), "karpenter.sh/capacity-type NotIn [spot]") && !strings.Contains(fmt.Sprint(terms), "key:karpenter.sh/capacity-type operator:NotIn values:[spot]") {
		t.Errorf("the controller may land on spot nodes: %v", terms)
	}
	if _, found, _ := unstructured.NestedMap(ctl.Object, "spec", "template", "spec", "affinity", "podAntiAffinity"); !found {
		t.Error("the controller's replicas are not spread")
	}
	testutil.Find(t, objs, "PodDisruptionBudget", "etjob-controller")
	for ns, level := range map[string]string{"etjob-system": "restricted", "etjob-agent": "privileged"} {
		if got := testutil.Find(t, objs, "Namespace", ns).GetLabels()["pod-security.kubernetes.io/enforce"]; got != level {
			t.Errorf("namespace %s enforces %q, want %s", ns, got, level)
		}
	}
	if ds := agent.GetNamespace(); ds != "etjob-agent" {
		t.Errorf("the agent runs in %s, want its own privileged namespace", ds)
	}
}

// TestKustomizeIsTheChart: the kustomize tree is the Helm chart rendered
// with its default values (`make manifests`), so the two install the same.
func TestKustomizeIsTheChart(t *testing.T) {
	want, err := chart.Kustomize()
	if err != nil {
		t.Fatal(err)
	}
	stale, err := chart.Diff(".", want)
	if err != nil {
		t.Fatal(err)
	}
	if len(stale) > 0 {
		t.Errorf("config/ is not charts/etjob rendered with its defaults; run make manifests. Differing: %v", stale)
	}
}
