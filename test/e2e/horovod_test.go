package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/controller"
	"github.com/etjob/etjob/internal/localcluster"
)

// TestHorovodContract proves the Horovod side of the contract with a driver
// that follows Horovod elastic's rules (python/etjob/horovod_driver.py) as the
// launcher, over the real transport (/etc/edl/kubexec.sh: kubectl exec with
// the launcher's namespaced Role) and the real discovery script (the live
// ConfigMap through the API), against real worker pods: a worker's node is
// lost, the driver blacklists it by name, the controller's replacement comes
// under a new name, a pre-change host survives, and the driver's exit 0
// completes the job.
func TestHorovodContract(t *testing.T) {
	ctx := withTimeout(t, 15*time.Minute)
	e := startCluster(t, ctx, "etjob-e2e-horovod", 3, 1)
	cl, repo, assets, dir := e.Cluster, e.repo, e.assets, e.Dir
	cfg, err := cl.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: controller.Scheme()})
	if err != nil {
		t.Fatal(err)
	}

	env := []corev1.EnvVar{
		// kubexec.sh runs kubectl: the one hack/build-controlplane.sh built.
		{Name: "PATH", Value: assets + ":/usr/bin:/bin"},
		{Name: "PYTHONPATH", Value: "/opt/etjob/python"},
		// Process nodes set no service variables: point in-cluster clients
		// (kubectl in kubexec.sh, the discovery script) at the API server.
		{Name: "KUBERNETES_SERVICE_HOST", Value: "127.0.0.1"},
		{Name: "KUBERNETES_SERVICE_PORT", Value: strconv.Itoa(localcluster.APIServerPort)},
	}
	repoVol := corev1.Volume{Name: "etjob", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: repo}}}
	repoMount := corev1.VolumeMount{Name: "etjob", MountPath: "/opt/etjob", ReadOnly: true}
	job := &etjobv1.ElasticJob{
		ObjectMeta: metav1.ObjectMeta{Name: "hvd", Namespace: "default"},
		Spec: etjobv1.ElasticJobSpec{
			Replicas: 2, MinReplicas: 1, MaxReplicas: 3, Framework: etjobv1.FrameworkHorovod,
			Spot: &etjobv1.SpotSpec{Enabled: true},
			WorkerTemplate: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{
				Name: "worker", Image: "horovod", Env: env,
				Command:   []string{"sh", "-c", `trap 'exit 75' TERM INT; while :; do sleep 3600 & wait $!; done`},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": *resourceOne()}},
			}}}},
			LauncherTemplate: &corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				Volumes: []corev1.Volume{repoVol},
				Containers: []corev1.Container{{
					Name: "launcher", Image: "horovod", Env: env, VolumeMounts: []corev1.VolumeMount{repoMount},
					Command: []string{"python3", "-m", "etjob.horovod_driver", "--host-discovery-script", "/etc/edl/discover_hosts.sh",
						"--min-np", "1", "--max-np", "3", "--rounds", "40", "--command", "hostname"},
				}},
			}},
		},
	}
	if err := c.Create(ctx, job); err != nil {
		t.Fatal(err)
	}
	launcherLog := func() string {
		files, _ := filepath.Glob(filepath.Join(dir, "nodes", "*", "pods", "default_hvd-launcher_*", "launcher.log"))
		var b strings.Builder
		for _, f := range files {
			raw, _ := os.ReadFile(f)
			b.Write(raw)
		}
		return b.String()
	}
	waitLog := func(what string, re *regexp.Regexp, timeout time.Duration) []string {
		deadline := time.Now().Add(timeout)
		for time.Now().Before(deadline) {
			if m := re.FindStringSubmatch(launcherLog()); m != nil {
				return m
			}
			time.Sleep(500 * time.Millisecond)
		}
		t.Fatalf("timed out waiting for %s; launcher log:\n%s", what, launcherLog())
		return nil
	}
	waitLog("round 5 on two hosts", regexp.MustCompile(`round 5 on hvd-worker-\d+,hvd-worker-\d+`), 3*time.Minute)

	// Lose worker-1's node without notice: its exec fails, the driver
	// blacklists it by name, and the replacement gets a new name.
	pod := &corev1.Pod{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "hvd-worker-1"}, pod); err != nil {
		t.Fatal(err)
	}
	if err := cl.Reclaim(ctx, pod.Spec.NodeName, 0); err != nil {
		t.Fatal(err)
	}
	waitLog("the blacklisting", regexp.MustCompile(`blacklisted hvd-worker-1 `), 2*time.Minute)
	waitLog("the replacement", regexp.MustCompile(`new host hvd-worker-2`), 3*time.Minute)
	m := waitLog("a membership change with a survivor", regexp.MustCompile(`membership change: .* \(survivors \[([^\]]+)\]\)`), time.Minute)
	if !strings.Contains(m[1], "hvd-worker-0") {
		t.Errorf("the pre-change host hvd-worker-0 should survive the change: %s", m[0])
	}
	waitLog("the end", regexp.MustCompile(`done after 40 rounds`), 5*time.Minute)

	// The launcher's exit 0 completes the job; the lost worker was a preemption.
	deadline := time.Now().Add(time.Minute)
	for {
		got := &etjobv1.ElasticJob{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(job), got); err != nil {
			t.Fatal(err)
		}
		if meta.IsStatusConditionTrue(got.Status.Conditions, etjobv1.ConditionComplete) {
			if got.Status.Failures != 0 || got.Status.Preemptions < 1 {
				t.Errorf("failures %d, preemptions %d: the lost worker is a preemption, not a failure", got.Status.Failures, got.Status.Preemptions)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job not Complete: %+v\nlauncher log:\n%s", got.Status.Conditions, launcherLog())
		}
		time.Sleep(500 * time.Millisecond)
	}
	if strings.Contains(launcherLog(), "FAIL") {
		t.Errorf("the driver reported a violated rule:\n%s", launcherLog())
	}
	fmt.Fprint(testWriter{t}, launcherLog())
}

func resourceOne() *resource.Quantity { return resource.NewQuantity(1, resource.DecimalSI) }
