package driver

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// DigitsExample is the YAML that Digits builds as typed objects, relative to
// the repository; a test keeps the two the same.
const DigitsExample = "examples/digits/elasticjob.yaml"

// Digits sizes the digits example (examples/digits/elasticjob.yaml) on the
// local cluster.
type Digits struct {
	// Repo is the etjob repository, mounted at /opt/etjob.
	Repo string
	// Shared is the directory that holds the checkpoint volume.
	Shared string
	// Epochs and Width size the training (work per step and in all).
	Epochs, Width int
	// Replicas are the desired workers: min 2, max Replicas+2 unless
	// MaxReplicas says more.
	Replicas, MaxReplicas int32
}

// Objects are the example's PersistentVolume, PersistentVolumeClaim and
// ElasticJob for job name in namespace: the YAML's objects, with its
// ${...} filled in and its names and sizes set.
func (d Digits) Objects(namespace, name string) (*corev1.PersistentVolume, *corev1.PersistentVolumeClaim, *etjobv1.ElasticJob) {
	ckpt := name + "-ckpt"
	size := resource.MustParse("1Gi")
	rwx := []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}
	pv := &corev1.PersistentVolume{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolume"},
		ObjectMeta: metav1.ObjectMeta{Name: ckpt},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:                   rwx,
			StorageClassName:              "",
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{
				Path: filepath.Join(d.Shared, "digits-ckpt"), Type: ptr.To(corev1.HostPathDirectoryOrCreate)}},
		},
	}
	pvc := &corev1.PersistentVolumeClaim{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolumeClaim"},
		ObjectMeta: metav1.ObjectMeta{Name: ckpt, Namespace: namespace},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      rwx,
			StorageClassName: ptr.To(""),
			VolumeName:       ckpt,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
		},
	}
	worker := corev1.Container{
		Name: "worker",
		// Process nodes run the host's binaries: the image is not pulled
		// (docs/local-cluster.md); PATH and PYTHONPATH pick Debian's torch.
		Image:   "etjob/digits:local",
		Command: []string{"python3", "-m", "etjob.torchrun", "/opt/etjob/examples/digits/train.py"},
		Env: []corev1.EnvVar{
			{Name: "PATH", Value: "/usr/bin:/bin"},
			{Name: "PYTHONPATH", Value: "/opt/etjob/python"},
			{Name: "EPOCHS", Value: strconv.Itoa(d.Epochs)},
			{Name: "WIDTH", Value: strconv.Itoa(d.Width)},
			{Name: etjobv1.EnvPreload, Value: "sklearn.datasets"},
		},
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{etjobv1.ResourceGPU: resource.MustParse("1")}},
		VolumeMounts: []corev1.VolumeMount{
			{Name: "etjob", MountPath: "/opt/etjob", ReadOnly: true},
			{Name: "ckpt", MountPath: "/ckpt"},
		},
	}
	job := &etjobv1.ElasticJob{
		TypeMeta:   metav1.TypeMeta{APIVersion: etjobv1.GroupVersion.String(), Kind: "ElasticJob"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: etjobv1.ElasticJobSpec{
			Replicas: d.Replicas, MinReplicas: 2, MaxReplicas: max(d.MaxReplicas, d.Replicas+2),
			MaxWaitTime:   600,
			CheckpointDir: "/ckpt",
			Spot:          &etjobv1.SpotSpec{Enabled: true},
			WorkerTemplate: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				TerminationGracePeriodSeconds: ptr.To[int64](30),
				Containers:                    []corev1.Container{worker},
				Volumes: []corev1.Volume{
					{Name: "etjob", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: d.Repo, Type: ptr.To(corev1.HostPathDirectory)}}},
					{Name: "ckpt", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: ckpt}}},
				},
			}},
		},
	}
	return pv, pvc, job
}

// SubmitDigits creates the digits example as d's job, with a fresh shared
// directory for its checkpoints.
func (d *Driver) SubmitDigits(ctx context.Context, spec Digits) error {
	_ = os.RemoveAll(spec.Shared)
	if err := os.MkdirAll(spec.Shared, 0o755); err != nil {
		return err
	}
	pv, pvc, job := spec.Objects(d.Namespace, d.Job)
	for _, o := range []client.Object{pv, pvc, job} {
		if err := d.Client.Create(ctx, o); err != nil {
			return fmt.Errorf("creating %s %s: %w", o.GetObjectKind().GroupVersionKind().Kind, o.GetName(), err)
		}
	}
	return nil
}
