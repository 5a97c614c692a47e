package processnode

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

func TestExpand(t *testing.T) {
	vars := map[string]string{"A": "a", "EMPTY": ""}
	lookup := func(n string) (string, bool) { v, ok := vars[n]; return v, ok }
	for in, want := range map[string]string{
		"plain":         "plain",
		"$(A)":          "a",
		"x$(A)y$(A)":    "xaya",
		"$(MISSING)":    "$(MISSING)",
		"$$(A)":         "$(A)",
		"$(EMPTY)-":     "-",
		"$(A":           "$(A",
		"cost $5":       "cost $5",
		"trailing $":    "trailing $",
		"$$$(A)":        "$a",
		"$(A)$(A)":      "aa",
		"http://$(A):1": "http://a:1",
	} {
		if got := expand(in, lookup); got != want {
			t.Errorf("expand(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestResolveEnv(t *testing.T) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u1", Labels: map[string]string{"role": "worker"}},
		Spec:       corev1.PodSpec{NodeName: "n1"},
		Status: corev1.PodStatus{
			PodIP: "127.0.1.2", PodIPs: []corev1.PodIP{{IP: "127.0.1.2"}},
			HostIP: "127.0.1.1", HostIPs: []corev1.HostIP{{IP: "127.0.1.1"}},
		},
	}
	cms := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	_ = cms.Add(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm", Namespace: "ns"}, Data: map[string]string{"K": "cmv"}})
	src := envSources{configMaps: corev1listers.NewConfigMapLister(cms)}
	field := func(p string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: p}}
	}
	yes := true
	c := &corev1.Container{
		Name:    "c",
		EnvFrom: []corev1.EnvFromSource{{Prefix: "CM_", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}}}},
		Env: []corev1.EnvVar{
			{Name: "POD_NAME", ValueFrom: field("metadata.name")},
			{Name: "NS", ValueFrom: field("metadata.namespace")},
			{Name: "POD_IP", ValueFrom: field("status.podIP")},
			{Name: "HOST_IP", ValueFrom: field("status.hostIP")},
			{Name: "NODE", ValueFrom: field("spec.nodeName")},
			{Name: "ROLE", ValueFrom: field("metadata.labels['role']")},
			{Name: "ADDR", Value: "$(POD_IP):29500 $(UNDEFINED)"},
			{Name: "OPT", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "none"}, Key: "k", Optional: &yes}}},
			{Name: "NS", Value: "override-$(NS)"},
		},
	}
	got, err := resolveEnv(pod, c, src)
	if err != nil {
		t.Fatal(err)
	}
	want := []corev1.EnvVar{
		{Name: "CM_K", Value: "cmv"},
		{Name: "POD_NAME", Value: "p"},
		{Name: "NS", Value: "override-ns"},
		{Name: "POD_IP", Value: "127.0.1.2"},
		{Name: "HOST_IP", Value: "127.0.1.1"},
		{Name: "NODE", Value: "n1"},
		{Name: "ROLE", Value: "worker"},
		{Name: "ADDR", Value: "127.0.1.2:29500 $(UNDEFINED)"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("resolveEnv (-want +got):\n%s", diff)
	}
}

func TestResolveEnvErrors(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}}
	for name, env := range map[string]corev1.EnvVar{
		"unknown fieldPath":          {Name: "X", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.bogus"}}},
		"resourceFieldRef, no limit": {Name: "X", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.cpu"}}},
		"required secret":            {Name: "X", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "s"}, Key: "k"}}},
	} {
		if _, err := resolveEnv(pod, &corev1.Container{Name: "c", Env: []corev1.EnvVar{env}}, envSources{}); err == nil {
			t.Errorf("%s: resolveEnv returned no error", name)
		}
	}
}

func TestResolveEnvResourceFieldRef(t *testing.T) {
	c := &corev1.Container{Name: "c", Resources: corev1.ResourceRequirements{
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi"), corev1.ResourceCPU: resource.MustParse("1500m")},
		Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
	}}
	ref := func(name, res, divisor string) corev1.EnvVar {
		sel := &corev1.ResourceFieldSelector{Resource: res}
		if divisor != "" {
			sel.Divisor = resource.MustParse(divisor)
		}
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: sel}}
	}
	c.Env = []corev1.EnvVar{ref("MEM", "limits.memory", ""), ref("MEM_MI", "requests.memory", "1Mi"), ref("CPU", "limits.cpu", ""),
		ref("CPU_M", "limits.cpu", "1m")}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}, Spec: corev1.PodSpec{Containers: []corev1.Container{*c}}}
	got, err := resolveEnv(pod, c, envSources{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"MEM": "536870912", "MEM_MI": "128", "CPU": "2", "CPU_M": "1500"}
	for _, e := range got {
		if want[e.Name] != e.Value {
			t.Errorf("%s = %q, want %q", e.Name, e.Value, want[e.Name])
		}
	}
}
