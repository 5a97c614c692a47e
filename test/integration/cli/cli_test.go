// Package cli_test runs the etjob CLI against a real kube-apiserver and etcd
// (envtest, with binaries built by hack/build-controlplane.sh) and the etjob
// controller (no kubelet: no worker ever becomes ready): the CLI's own
// behaviour is under test (submit, get, /scale, suspend, resume, delete, the
// refusals), and a scale-out request that never completes shows the
// controller's rollback to the previous replicas.
package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/cli"
	"github.com/etjob/etjob/internal/controller"
	"github.com/etjob/etjob/internal/scheme"
	"github.com/etjob/etjob/internal/testutil"
)

var (
	k8s        client.Client
	kubeconfig string
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	root, err := testutil.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	assets, err := testutil.ControlPlaneAssets()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	os.Setenv("KUBEBUILDER_ASSETS", assets)
	env := &envtest.Environment{
		CRDInstallOptions: envtest.CRDInstallOptions{Paths: []string{filepath.Join(root, "config/crd/bases")}, ErrorIfPathMissing: true},
	}
	cfg, err := env.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting envtest:", err)
		return 1
	}
	defer env.Stop()
	if k8s, err = client.New(cfg, client.Options{Scheme: scheme.New()}); err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mgr, err := ctrl.NewManager(cfg, controller.ManagerOptions(controller.Options{MetricsAddr: "0", ProbeAddr: "0"}))
	if err == nil {
		err = controller.Setup(ctx, mgr, 2, nil, controller.Trust{})
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "controller:", err)
		return 1
	}
	go func() { _ = mgr.Start(ctx) }()
	dir, err := os.MkdirTemp("", "etjob-cli-*")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := writeKubeconfig(cfg, kubeconfig); err != nil {
		fmt.Fprintln(os.Stderr, "kubeconfig:", err)
		return 1
	}
	return m.Run()
}

// writeKubeconfig writes what `--kubeconfig` reads, for the envtest server.
func writeKubeconfig(cfg *rest.Config, path string) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["envtest"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "envtest"}
	kc.CurrentContext = "envtest"
	return clientcmd.WriteToFile(*kc, path)
}

// etjob runs the CLI as a user would, with --kubeconfig and -n.
func etjob(t *testing.T, ns string, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	root := cli.NewRootCommand(cli.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	root.SetArgs(append([]string{"--kubeconfig", kubeconfig, "-n", ns}, args...))
	err := root.ExecuteContext(context.Background())
	t.Logf("etjob %s\n%s%s(err: %v)", strings.Join(args, " "), out.String(), errOut.String(), err)
	return out.String(), errOut.String(), err
}

func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "cli-"}}
	if err := k8s.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// seed001 is seed 001's command line after the shell removed its quoting.
const seed001 = "horovodrun \\\n    -np $((${workers}*${gpus})) \\\n    --min-np $((${minWorkers}*${gpus})) \\\n    --max-np $((${maxWorkers}*${gpus})) \\\n    --host-discovery-script /etc/edl/discover_hosts.sh \\\n    python /examples/elastic/tensorflow2_mnist_elastic.py\n    "

func TestSeed001DryRunIsAcceptedByTheAPIServer(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	out, _, err := etjob(t, ns, "submit", "etjob", "--framework", "horovod", "--dry-run", "-o", "yaml",
		"--name=elastic-training", "--gpus=1", "--workers=3", "--max-workers=9", "--min-workers=1",
		"--image=registry.cn-hangzhou.aliyuncs.com/ai-samples/horovod:0.20.0-tf2.3.0-torch1.6.0-mxnet1.6.0.post0-py3.7-cuda10.1",
		"--working-dir=/examples", seed001)
	if err != nil {
		t.Fatal(err)
	}
	var job etjobv1.ElasticJob
	if err := yaml.UnmarshalStrict([]byte(out), &job); err != nil {
		t.Fatalf("--dry-run -o yaml printed invalid YAML: %v\n%s", err, out)
	}
	if got := job.Spec.LauncherTemplate.Spec.Containers[0].Command; len(got) != 3 || got[2] != strings.TrimSpace(seed001) {
		t.Errorf("launcher command = %q, want sh -c with the seed's line verbatim", got)
	}
	if err := k8s.Create(ctx, &job, client.DryRunAll); err != nil {
		t.Fatalf("the API server refused the printed job (server-side dry run): %v", err)
	}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(&job), &etjobv1.ElasticJob{}); !apierrors.IsNotFound(err) {
		t.Errorf("a dry run created the job: %v", err)
	}
}

func TestJobLifecycle(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	key := client.ObjectKey{Namespace: ns, Name: "digits"}
	job := func() *etjobv1.ElasticJob {
		t.Helper()
		var j etjobv1.ElasticJob
		if err := k8s.Get(ctx, key, &j); err != nil {
			t.Fatal(err)
		}
		return &j
	}

	out, errOut, err := etjob(t, ns, "submit", "--name", "digits", "--workers", "2", "--min-workers", "2", "--max-workers", "4",
		"--gpus", "1", "--spot-instance", "--max-wait-time", "10m", "-d", "digits-ckpt:/ckpt", "--checkpoint-dir", "/ckpt",
		"--image", "etjob/digits:local", "python3 -m etjob.torchrun train.py")
	if err != nil {
		t.Fatal(err)
	}
	if out != "elasticjob.etjob.dev/digits created\n" || !strings.Contains(errOut, "The Job digits has been submitted successfully") ||
		!strings.Contains(errOut, "You can run `etjob get digits -n "+ns+"` to check the job status") {
		t.Errorf("submit printed %q / %q", out, errOut)
	}
	j := job()
	if j.Spec.Replicas != 2 || j.Spec.MaxWaitTime != 600 || !j.Spec.Spot.Enabled || j.Spec.LauncherTemplate != nil || *j.Spec.BackoffLimit != 6 {
		t.Errorf("spec = %+v", j.Spec)
	}

	out, _, err = etjob(t, ns, "get", "digits")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Name:        digits\n", "Status:      PENDING\n", "Namespace:   " + ns + "\n", "Trainer:     ETJOB\n",
		"Reason:      the controller has not looked at the job yet\n", "Instances:\n  NAME  STATUS  AGE  IS_CHIEF  GPU(Requested)  NODE\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("get: missing %q in\n%s", want, out)
		}
	}

	// Scale through /scale.
	if _, _, err := etjob(t, ns, "scale", "digits", "--replicas", "3"); err != nil {
		t.Fatal(err)
	}
	if got := job().Spec.Replicas; got != 3 {
		t.Errorf("after scale --replicas 3: spec.replicas = %d", got)
	}

	// No kubelet runs, so no worker ever joins: the ScaleOut request times
	// out and the controller restores the previous replicas.
	_, errOut, err = etjob(t, ns, "scaleout", "etjob", "--name", "digits", "--count", "1", "--timeout", "2s")
	if err == nil || !strings.Contains(err.Error(), "replicas restored to 3") {
		t.Errorf("scaleout with no members: err = %v, want a timeout that restored 3 replicas", err)
	}
	if !strings.Contains(errOut, "0 of 4 workers are members") {
		t.Errorf("scaleout printed no progress: %q", errOut)
	}
	if got := job().Spec.Replicas; got != 3 {
		t.Errorf("after the timed-out scaleout: spec.replicas = %d, want 3 restored", got)
	}

	// Refusals across min and max name the flag and the limit.
	if _, _, err := etjob(t, ns, "scaleout", "digits", "--count", "2"); err == nil || !strings.Contains(err.Error(), "above its maximum of 4 (spec.maxReplicas, --max-workers at submit)") {
		t.Errorf("scaleout above max: err = %v", err)
	}
	if _, _, err := etjob(t, ns, "scalein", "etjob", "--name", "digits", "--count", "2"); err == nil || !strings.Contains(err.Error(), "--count would take elasticjob.etjob.dev/digits to 1 workers, below its minimum of 2") {
		t.Errorf("scalein below min: err = %v", err)
	}

	// An HPA owns the size.
	hpa := &autoscalingv2.HorizontalPodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Name: "digits", Namespace: ns},
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{MaxReplicas: 4,
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "etjob.dev/v1alpha1", Kind: "ElasticJob", Name: "digits"}},
	}
	if err := k8s.Create(ctx, hpa); err != nil {
		t.Fatal(err)
	}
	if _, _, err := etjob(t, ns, "scale", "digits", "--replicas", "4"); err == nil || !strings.Contains(err.Error(), "HorizontalPodAutoscaler digits targets") {
		t.Errorf("scale under an HPA: err = %v", err)
	}
	if err := k8s.Delete(ctx, hpa); err != nil {
		t.Fatal(err)
	}

	// An Arena flag that cannot apply is refused, and nothing is created.
	if _, _, err := etjob(t, ns, "submit", "--name", "tb", "--image", "i", "--tensorboard", "python train.py"); err == nil || !strings.Contains(err.Error(), "--tensorboard is an Arena flag that etjob does not support") {
		t.Errorf("--tensorboard: err = %v", err)
	}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "tb"}, &etjobv1.ElasticJob{}); !apierrors.IsNotFound(err) {
		t.Errorf("a refused submit created the job: %v", err)
	}

	// Suspend, resume, delete.
	if out, _, err := etjob(t, ns, "suspend", "digits"); err != nil || out != "elasticjob.etjob.dev/digits suspended\n" {
		t.Errorf("suspend: %q, %v", out, err)
	}
	if s := job().Spec.Suspend; s == nil || !*s {
		t.Errorf("after suspend: spec.suspend = %v", s)
	}
	if _, _, err := etjob(t, ns, "resume", "digits"); err != nil {
		t.Error(err)
	}
	if s := job().Spec.Suspend; s == nil || *s {
		t.Errorf("after resume: spec.suspend = %v", s)
	}
	if out, _, err := etjob(t, ns, "delete", "digits"); err != nil || out != "elasticjob.etjob.dev/digits deleted\n" {
		t.Errorf("delete: %q, %v", out, err)
	}
	testutil.Eventually(t, 10*time.Second, "the job gone after delete", func() (bool, string) {
		err := k8s.Get(ctx, key, &etjobv1.ElasticJob{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
}

// TestSubmitRefusesPodsTheServerRefuses: a job whose pods the API server
// would refuse as invalid (annotations over a pod's 256 KiB pass the CRD,
// whose pod template is not a pod's schema, and the CLI's own checks) is
// refused at submit with the server's words, after a server-side dry run of
// its pods; nothing is created.
func TestSubmitRefusesPodsTheServerRefuses(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	_, _, err := etjob(t, ns, "submit", "--name", "badpod", "--image", "i", "-a", "big="+strings.Repeat("x", 300<<10), "python train.py")
	if err == nil || !strings.Contains(err.Error(), "the API server refuses the job's worker pod") || !strings.Contains(err.Error(), "metadata.annotations") {
		t.Fatalf("submit of a job with invalid pods: %v", err)
	}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "badpod"}, &etjobv1.ElasticJob{}); !apierrors.IsNotFound(err) {
		t.Errorf("the refused job was created: %v", err)
	}
	var pods corev1.PodList
	if err := k8s.List(ctx, &pods, client.InNamespace(ns)); err != nil || len(pods.Items) != 0 {
		t.Errorf("the dry run left pods: %d, %v", len(pods.Items), err)
	}
}
