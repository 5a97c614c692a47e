package driver

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/yaml"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// TestDigitsIsTheExample: the typed objects the demo and chaos submit are
// the example users read, examples/digits/elasticjob.yaml, with its ${...}
// filled in.
func TestDigitsIsTheExample(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", DigitsExample))
	if err != nil {
		t.Fatal(err)
	}
	d := Digits{Repo: "/src/etjob", Shared: "/tmp/shared/digits", Epochs: 7, Width: 48, Replicas: 4}
	text := os.Expand(string(raw), func(k string) string {
		return map[string]string{"ETJOB_REPO": d.Repo, "ETJOB_SHARED": d.Shared, "EPOCHS": "7", "WIDTH": "48"}[k]
	})
	docs := strings.Split(text, "\n---\n")
	if len(docs) != 3 {
		t.Fatalf("%s has %d documents, want 3 (PV, PVC, ElasticJob)", DigitsExample, len(docs))
	}
	var (
		pv  corev1.PersistentVolume
		pvc corev1.PersistentVolumeClaim
		job etjobv1.ElasticJob
	)
	for i, into := range []any{&pv, &pvc, &job} {
		if err := yaml.UnmarshalStrict([]byte(docs[i]), into); err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
	}
	pvc.Namespace, job.Namespace = "default", "default"
	gotPV, gotPVC, gotJob := d.Objects("default", "digits")
	for _, c := range []struct{ want, got any }{{&pv, gotPV}, {&pvc, gotPVC}, {&job, gotJob}} {
		if !equality.Semantic.DeepEqual(c.want, c.got) {
			t.Errorf("Digits.Objects differs from %s (-yaml +typed):\n%s", DigitsExample, cmp.Diff(c.want, c.got))
		}
	}

	// Other names and sizes: the names follow the job, the sizes the spec.
	_, pvc2, job2 := Digits{Repo: d.Repo, Shared: d.Shared, Replicas: 6}.Objects("ns", "chaos")
	if pvc2.Name != "chaos-ckpt" || pvc2.Spec.VolumeName != "chaos-ckpt" || job2.Spec.WorkerTemplate.Spec.Volumes[1].PersistentVolumeClaim.ClaimName != "chaos-ckpt" {
		t.Errorf("claim names do not follow the job: %s %s", pvc2.Name, pvc2.Spec.VolumeName)
	}
	if job2.Name != "chaos" || job2.Namespace != "ns" || job2.Spec.Replicas != 6 || job2.Spec.MaxReplicas != 8 || job2.Spec.MinReplicas != 2 {
		t.Errorf("job = %s/%s %d/%d/%d", job2.Namespace, job2.Name, job2.Spec.MinReplicas, job2.Spec.Replicas, job2.Spec.MaxReplicas)
	}
}
