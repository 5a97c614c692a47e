package testutil

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/etjob/etjob/internal/chart"
)

// Manifests reads every object of the YAML files in dir (kustomization.yaml
// left out), file by file in name order, in each file's order.
func Manifests(dir string) ([]*unstructured.Unstructured, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var out []*unstructured.Unstructured
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		raw, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		objs, err := chart.Decode(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		out = append(out, objs...)
	}
	return out, nil
}

// Find returns the object of kind and name among objs, or fails the test.
func Find(t testing.TB, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no %s %s among the %d objects", kind, name, len(objs))
	return nil
}

// Container returns the one container of a workload's pod template, or
// fails the test.
func Container(t testing.TB, o *unstructured.Unstructured) map[string]any {
	t.Helper()
	cs, _, err := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
	if err != nil || len(cs) != 1 {
		t.Fatalf("%s %s: %d containers, want 1 (%v)", o.GetKind(), o.GetName(), len(cs), err)
	}
	return cs[0].(map[string]any)
}
