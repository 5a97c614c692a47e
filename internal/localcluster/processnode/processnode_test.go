package processnode_test

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/virtual-kubelet/virtual-kubelet/node/api"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/core"
	"github.com/etjob/etjob/internal/localcluster/processnode"
	"github.com/etjob/etjob/internal/testutil"
)

const nodeName = "process-node-1"

// TestProcessNode runs a process node against a real kube-apiserver and etcd
// and checks what a kubelet would do for two pods: one that exits with an
// error, one that is deleted while it runs.
func TestProcessNode(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs, cfg := startAPIServer(t)
	provider := startNode(ctx, cancel, t, processnode.Options{
		Client:   cs,
		NodeName: nodeName,
		NodeIP:   "127.0.209.1",
		Labels:   map[string]string{etjobv1.LabelCapacityType: etjobv1.CapacityTypeSpot, etjobv1.LabelPricePerHour: "0.91"},
		WorkDir:  t.TempDir(),
	})
	testutil.Eventually(t, testutil.Timeout, "the Node is Ready with its labels and GPU", func() bool {
		node, err := cs.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false
		}
		gpu := node.Status.Allocatable[etjobv1.ResourceGPU]
		return core.NodeReady(node) && node.Labels[etjobv1.LabelCapacityType] == etjobv1.CapacityTypeSpot && gpu.Value() == 1
	})
	if _, err := cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, nodeName, metav1.GetOptions{}); err != nil {
		t.Errorf("node lease: %v", err)
	}

	t.Run("failing pod", func(t *testing.T) {
		ns := newNamespace(ctx, t, cs)
		pod := processPod(ns, "fails", "/bin/sh", "-c", `echo hello $POD_NAME on $HOST_IP; exit 3`)
		pod.Spec.RestartPolicy = corev1.RestartPolicyNever
		pod.Spec.Containers[0].Env = []corev1.EnvVar{
			{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
			{Name: "HOST_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.hostIP"}}},
		}
		createPod(ctx, t, cs, pod)
		var got *corev1.Pod
		testutil.Eventually(t, testutil.Timeout, "the pod fails", func() bool {
			got, _ = cs.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
			return got != nil && got.Status.Phase == corev1.PodFailed
		})
		if len(got.Status.ContainerStatuses) != 1 || got.Status.ContainerStatuses[0].State.Terminated == nil {
			t.Fatalf("container statuses = %+v, want one terminated container", got.Status.ContainerStatuses)
		}
		if code := got.Status.ContainerStatuses[0].State.Terminated.ExitCode; code != 3 {
			t.Errorf("exit code = %d, want 3", code)
		}
		ip, err := netip.ParseAddr(got.Status.PodIP)
		if err != nil || !ip.IsLoopback() || ip.String() == "127.0.209.1" {
			t.Errorf("status.podIP = %q, want a loopback address other than the node's", got.Status.PodIP)
		}
		if got.Status.HostIP != "127.0.209.1" {
			t.Errorf("status.hostIP = %q, want the node IP 127.0.209.1", got.Status.HostIP)
		}
		logs, err := provider.GetContainerLogs(ctx, ns, pod.Name, "main", api.ContainerLogOpts{})
		if err != nil {
			t.Fatal(err)
		}
		defer logs.Close()
		b, _ := io.ReadAll(logs)
		if want := "hello fails on 127.0.209.1"; !strings.Contains(string(b), want) {
			t.Errorf("log = %q, want it to contain %q", b, want)
		}
	})

	t.Run("host network pod", func(t *testing.T) {
		ns := newNamespace(ctx, t, cs)
		pod := processPod(ns, "hostnet", "/bin/sh", "-c", "sleep 60")
		pod.Spec.HostNetwork = true
		createPod(ctx, t, cs, pod)
		waitPhase(ctx, t, cs, ns, pod.Name, corev1.PodRunning)
		got, err := cs.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.PodIP != "127.0.209.1" || got.Status.HostIP != "127.0.209.1" {
			t.Errorf("hostNetwork pod: podIP %q, hostIP %q; want both the node's 127.0.209.1", got.Status.PodIP, got.Status.HostIP)
		}
		_ = cs.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	})

	t.Run("pod marked NotReady by the node lifecycle controller", func(t *testing.T) {
		// What kube-controller-manager does to a node's pods when its lease
		// lapsed (a kube-apiserver outage): the pod runs on, and the node
		// must say Ready again (it stayed NotReady before resync).
		ns := newNamespace(ctx, t, cs)
		pod := processPod(ns, "marked", "/bin/sh", "-c", "sleep 60")
		createPod(ctx, t, cs, pod)
		waitPhase(ctx, t, cs, ns, pod.Name, corev1.PodRunning)
		ready := func() bool {
			got, err := cs.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
			if err != nil {
				return false
			}
			for _, c := range got.Status.Conditions {
				if c.Type == corev1.PodReady {
					return c.Status == corev1.ConditionTrue
				}
			}
			return false
		}
		testutil.Eventually(t, testutil.Timeout, "the pod is Ready", ready)
		got, err := cs.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for i, c := range got.Status.Conditions {
			if c.Type == corev1.PodReady {
				got.Status.Conditions[i].Status, got.Status.Conditions[i].Reason = corev1.ConditionFalse, "NodeNotReady"
			}
		}
		if _, err := cs.CoreV1().Pods(ns).UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, testutil.Timeout, "the pod is Ready again", ready)
		_ = cs.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	})

	t.Run("deleted pod", func(t *testing.T) {
		ns := newNamespace(ctx, t, cs)
		// The child sleep shares the container's process group: deleting the
		// pod must stop it too, not only the shell. In a PID namespace even a
		// child in a session of its own (setsid) must go.
		script := "sleep 300 & wait"
		if provider.Namespaced() {
			script = "setsid sleep 300 & wait"
		}
		pod := processPod(ns, "sleeps", "/bin/sh", "-c", script)
		grace := int64(5)
		pod.Spec.TerminationGracePeriodSeconds = &grace
		createPod(ctx, t, cs, pod)
		var running *corev1.Pod
		testutil.Eventually(t, testutil.Timeout, "the pod runs and is Ready", func() bool {
			running, _ = cs.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
			return running != nil && running.Status.Phase == corev1.PodRunning && podReady(running)
		})
		pid := containerPID(t, running)
		var childPID int
		testutil.Eventually(t, 10*time.Second, "the shell started sleep", func() bool {
			for _, d := range descendants(pid) {
				if comm(d) == "sleep" {
					childPID = d
					return true
				}
			}
			return false
		})
		if !alive(pid) || !alive(childPID) {
			t.Fatalf("before deletion: shell %d alive=%v, child %d alive=%v", pid, alive(pid), childPID, alive(childPID))
		}

		deleted := time.Now()
		if err := cs.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 10*time.Second, "the pod's processes are gone", func() bool {
			return !alive(pid) && !alive(childPID)
		})
		t.Logf("processes %d and %d gone %s after the delete", pid, childPID, time.Since(deleted).Round(time.Millisecond))
		testutil.Eventually(t, 20*time.Second, "the pod object is gone", func() bool {
			_, err := cs.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		})
		t.Logf("pod object gone %s after the delete", time.Since(deleted).Round(time.Millisecond))
	})

	t.Run("SIGTERM ignored", func(t *testing.T) {
		ns := newNamespace(ctx, t, cs)
		// An ignored signal stays ignored across exec, so neither the shell
		// nor its sleep stops on SIGTERM: only the SIGKILL after the grace
		// period (2 s, the minimum) ends them.
		pod := processPod(ns, "stubborn", "/bin/sh", "-c", `trap "" TERM; sleep 300 & wait; sleep 300`)
		grace := int64(2)
		pod.Spec.TerminationGracePeriodSeconds = &grace
		createPod(ctx, t, cs, pod)
		var running *corev1.Pod
		testutil.Eventually(t, testutil.Timeout, "the pod runs", func() bool {
			running, _ = cs.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
			return running != nil && running.Status.Phase == corev1.PodRunning
		})
		pid := containerPID(t, running)
		if err := cs.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		if !alive(pid) {
			t.Fatalf("process %d died within 1 s of SIGTERM, which it ignores", pid)
		}
		testutil.Eventually(t, 10*time.Second, "SIGKILL ends the process", func() bool { return !alive(pid) })
	})

	t.Run("a shell's command stops gracefully", func(t *testing.T) {
		requireNamespaces(t, provider)
		ns := newNamespace(ctx, t, cs)
		// `sh -c CMD` (dash forks CMD) has no SIGTERM handler: like a
		// container's PID 1 it is spared, and CMD, which handles SIGTERM,
		// has the time it takes to stop. Before, the shell died at the
		// SIGTERM and took the sandbox's PID namespace, and CMD, with it.
		dir := t.TempDir()
		script := filepath.Join(dir, "graceful.sh")
		out := filepath.Join(dir, "stopped")
		body := "trap 'sleep 1; echo graceful > " + out + "; exit 0' TERM\nwhile :; do sleep 0.1; done\n"
		if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
		pod := processPod(ns, "graceful", "/bin/sh", "-c", "/bin/sh "+script+"; echo done")
		grace := int64(10)
		pod.Spec.TerminationGracePeriodSeconds = &grace
		createPod(ctx, t, cs, pod)
		testutil.Eventually(t, testutil.Timeout, "the pod runs", func() bool {
			p, _ := cs.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
			return p != nil && p.Status.Phase == corev1.PodRunning
		})
		time.Sleep(500 * time.Millisecond) // the trap is set
		if err := cs.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 8*time.Second, "the command's SIGTERM handler ran to its end", func() bool {
			b, err := os.ReadFile(out)
			return err == nil && strings.TrimSpace(string(b)) == "graceful"
		})
	})

	t.Run("hostname and hosts", func(t *testing.T) {
		requireNamespaces(t, provider)
		ns := newNamespace(ctx, t, cs)
		master := processPod(ns, "master", "sleep", "300")
		master.Spec.Hostname, master.Spec.Subdomain = "job-master-0", "job"
		createPod(ctx, t, cs, master)
		var running *corev1.Pod
		testutil.Eventually(t, 10*time.Second, "the master runs", func() bool {
			running, _ = cs.CoreV1().Pods(ns).Get(ctx, master.Name, metav1.GetOptions{})
			return running != nil && running.Status.Phase == corev1.PodRunning
		})
		fqdn := "job-master-0.job." + ns + ".svc.cluster.local"
		worker := processPod(ns, "worker", "/bin/sh", "-c", "hostname; getent hosts "+fqdn+"; getent hosts job-master-0; grep SigIgn /proc/self/status")
		worker.Spec.Hostname, worker.Spec.Subdomain = "job-worker-0", "job"
		worker.Spec.RestartPolicy = corev1.RestartPolicyNever
		createPod(ctx, t, cs, worker)
		waitPhase(ctx, t, cs, ns, worker.Name, corev1.PodSucceeded)
		got := podLog(ctx, t, cs, ns, worker.Name)
		t.Logf("worker log:\n%s", got)
		lines := strings.Split(strings.TrimSpace(got), "\n")
		if len(lines) != 4 || lines[0] != "job-worker-0" {
			t.Fatalf("worker log %q: want hostname job-worker-0, two getent lines, SigIgn", got)
		}
		// The sandbox must not leave any standard signal (1-31: SIGINT and
		// SIGQUIT, which a shell ignores for background jobs, SIGTERM, ...)
		// ignored. Signals 32 and 33 belong to glibc's threads: no glibc
		// program can reset them, and they keep whatever disposition the
		// node's own parent gave them (under make in CI, 32 is ignored).
		mask, err := strconv.ParseUint(strings.TrimSpace(strings.TrimPrefix(lines[3], "SigIgn:")), 16, 64)
		if err != nil || mask&0x7fffffff != 0 {
			t.Errorf("container ignores standard signals: %q", lines[3])
		}
		// getent prints the canonical (first) name: the FQDN, for the full
		// name and for the short hostname alike.
		for _, l := range lines[1:3] {
			if f := strings.Fields(l); len(f) < 2 || f[0] != running.Status.PodIP || f[1] != fqdn {
				t.Errorf("getent line %q, want %s %s ...", l, running.Status.PodIP, fqdn)
			}
		}
	})

	t.Run("configMap volume follows updates", func(t *testing.T) {
		requireNamespaces(t, provider)
		removeCreatedDirs(t, "/etc/edl")
		ns := newNamespace(ctx, t, cs)
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "edl", Namespace: ns}, Data: map[string]string{"x": "first"}}
		if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pod := processPod(ns, "reader", "/bin/sh", "-c", "readlink /etc/edl/x; while true; do cat /etc/edl/x; echo; sleep 0.2; done")
		pod.Spec.Volumes = []corev1.Volume{{Name: "edl", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "edl"}}}}}
		pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "edl", MountPath: "/etc/edl"}}
		createPod(ctx, t, cs, pod)
		testutil.Eventually(t, 10*time.Second, "the pod reads the first value", func() bool {
			return strings.Contains(podLog(ctx, t, cs, ns, pod.Name), "first")
		})
		if got := podLog(ctx, t, cs, ns, pod.Name); !strings.HasPrefix(got, "..data/x\n") {
			t.Errorf("log %q: /etc/edl/x should be a symlink to ..data/x", got)
		}
		cm.Data["x"] = "second"
		if _, err := cs.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		updated := time.Now()
		testutil.Eventually(t, 5*time.Second, "the pod reads the updated value", func() bool {
			return strings.Contains(podLog(ctx, t, cs, ns, pod.Name), "second")
		})
		t.Logf("update seen in the pod %s after the ConfigMap update", time.Since(updated).Round(time.Millisecond))
	})

	t.Run("persistentVolumeClaim of a hostPath volume", func(t *testing.T) {
		requireNamespaces(t, provider)
		const mountPath = "/mnt/etjob-processnode-test"
		removeCreatedDirs(t, mountPath)
		ns := newNamespace(ctx, t, cs)
		hostDir := filepath.Join(t.TempDir(), "pv")
		dirOrCreate := corev1.HostPathDirectoryOrCreate
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: ns},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
				VolumeName:  "pv-" + ns,
			},
		}
		pvc, err := cs.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pod := processPod(ns, "writer", "/bin/sh", "-c", "echo written-in-pod > "+mountPath+"/out")
		pod.Spec.RestartPolicy = corev1.RestartPolicyNever
		pod.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}}}
		pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: mountPath}}
		createPod(ctx, t, cs, pod)
		testutil.Eventually(t, 10*time.Second, "the pod waits for its unbound claim", func() bool {
			got, _ := cs.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
			if got == nil || got.Status.Phase != corev1.PodPending || len(got.Status.ContainerStatuses) == 0 {
				return false
			}
			w := got.Status.ContainerStatuses[0].State.Waiting
			return w != nil && strings.Contains(w.Message, `persistentVolumeClaim "data" is not bound`)
		})
		// No controller-manager runs here: bind the claim by hand.
		pv := &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: "pv-" + ns},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
				AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: hostDir, Type: &dirOrCreate}},
				ClaimRef:               &corev1.ObjectReference{Namespace: ns, Name: "data", UID: pvc.UID},
			},
		}
		if _, err := cs.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cs.CoreV1().PersistentVolumes().Delete(context.Background(), pv.Name, metav1.DeleteOptions{})
		})
		pvc.Status.Phase = corev1.ClaimBound
		if _, err := cs.CoreV1().PersistentVolumeClaims(ns).UpdateStatus(ctx, pvc, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPhase(ctx, t, cs, ns, pod.Name, corev1.PodSucceeded)
		b, err := os.ReadFile(filepath.Join(hostDir, "out"))
		if err != nil || string(b) != "written-in-pod\n" {
			t.Errorf("host file %s = %q, %v; want the pod's write", filepath.Join(hostDir, "out"), b, err)
		}
	})

	t.Run("service account volume", func(t *testing.T) {
		requireNamespaces(t, provider)
		ns := newNamespace(ctx, t, cs)
		// kube-controller-manager publishes kube-root-ca.crt on a cluster.
		root := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kube-root-ca.crt", Namespace: ns}, Data: map[string]string{"ca.crt": "test-ca"}}
		if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, root, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		dir := "/var/run/secrets/kubernetes.io/serviceaccount"
		removeCreatedDirs(t, dir)
		pod := processPod(ns, "sa", "/bin/sh", "-c", "cat "+dir+"/namespace; echo; cat "+dir+"/ca.crt; echo; cut -c1-3 "+dir+"/token")
		pod.Spec.AutomountServiceAccountToken = nil // the ServiceAccount admission plugin adds the projected volume
		pod.Spec.RestartPolicy = corev1.RestartPolicyNever
		createPod(ctx, t, cs, pod)
		waitPhase(ctx, t, cs, ns, pod.Name, corev1.PodSucceeded)
		got := podLog(ctx, t, cs, ns, pod.Name)
		if want := ns + "\ntest-ca\neyJ\n"; got != want { // a JWT starts with {" in base64
			t.Errorf("log = %q, want %q", got, want)
		}
	})

	t.Run("logs and exec through the API server", func(t *testing.T) {
		requireNamespaces(t, provider)
		ns := newNamespace(ctx, t, cs)
		pod := processPod(ns, "talker", "/bin/sh", "-c", "for i in 1 2 3 4 5; do echo line $i; done; sleep 1; echo late; sleep 300")
		pod.Spec.Hostname = "talker-host"
		createPod(ctx, t, cs, pod)
		testutil.Eventually(t, 10*time.Second, "the pod logged five lines", func() bool {
			return strings.Contains(podLog(ctx, t, cs, ns, pod.Name), "line 5")
		})
		tail := int64(2)
		b, err := cs.CoreV1().Pods(ns).GetLogs(pod.Name, &corev1.PodLogOptions{TailLines: &tail}).DoRaw(ctx)
		if err != nil || !strings.HasSuffix(string(b), "line 4\nline 5\n") && !strings.HasSuffix(string(b), "line 5\nlate\n") {
			t.Errorf("tailLines=2: %q, %v", b, err)
		}
		fctx, fcancel := context.WithTimeout(ctx, 5*time.Second)
		defer fcancel()
		stream, err := cs.CoreV1().Pods(ns).GetLogs(pod.Name, &corev1.PodLogOptions{Follow: true}).Stream(fctx)
		if err != nil {
			t.Fatal(err)
		}
		var followed strings.Builder
		buf := make([]byte, 1024)
		for !strings.Contains(followed.String(), "late") {
			n, err := stream.Read(buf)
			followed.Write(buf[:n])
			if err != nil {
				t.Fatalf("following the log: %v (got %q)", err, followed.String())
			}
		}
		stream.Close()

		req := cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod.Name).SubResource("exec").
			VersionedParams(&corev1.PodExecOptions{Container: "main", Command: []string{"hostname"}, Stdout: true, Stderr: true}, scheme.ParameterCodec)
		exec, err := remotecommand.NewSPDYExecutor(cfg, "POST", req.URL())
		if err != nil {
			t.Fatal(err)
		}
		var stdout, stderr strings.Builder
		if err := exec.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr}); err != nil {
			t.Fatalf("exec hostname: %v (stderr %q)", err, stderr.String())
		}
		if stdout.String() != "talker-host\n" {
			t.Errorf("exec hostname printed %q, want %q", stdout.String(), "talker-host\n")
		}
	})
}

// startAPIServer starts kube-apiserver and etcd (binaries from
// hack/build-controlplane.sh) and returns a client and its config; it skips
// the test when the binaries cannot be had. The API server reaches nodes'
// kubelet API at their InternalIP, as `etjob-local cluster up` configures it, and
// adds service account volumes to pods.
// startNode runs a process node until the test ends (cancel stops it, then
// its pods are shut down) and waits until it is Ready.
func startNode(ctx context.Context, cancel context.CancelFunc, t *testing.T, opts processnode.Options) *processnode.Provider {
	t.Helper()
	n, provider, err := processnode.NewNode(opts)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = n.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-n.Done()
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		provider.Shutdown(sctx, time.Second)
	})
	if err := n.WaitReady(ctx, 30*time.Second); err != nil {
		t.Fatalf("node not ready: %v", err)
	}
	return provider
}

func startAPIServer(t *testing.T) (kubernetes.Interface, *rest.Config) {
	t.Helper()
	assets, err := testutil.ControlPlaneAssets()
	if err != nil {
		t.Skipf("no control plane binaries: %v", err)
	}
	t.Setenv("KUBEBUILDER_ASSETS", assets)
	env := &envtest.Environment{}
	args := env.ControlPlane.GetAPIServer().Configure()
	args.Set("kubelet-preferred-address-types", "InternalIP")
	// envtest turns ServiceAccount admission off; it adds the projected
	// service account volume that a pod of a real cluster gets.
	args.Set("disable-admission-plugins", "StorageObjectInUseProtection")
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting kube-apiserver and etcd: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs, cfg
}

// newNamespace creates a namespace with the default ServiceAccount, which
// no controller-manager creates here and pod admission requires.
func newNamespace(ctx context.Context, t *testing.T, cs kubernetes.Interface) string {
	t.Helper()
	ns, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "processnode-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: ns.Name}}
	if _, err := cs.CoreV1().ServiceAccounts(ns.Name).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

func processPod(ns, name string, command ...string) *corev1.Pod {
	no := false
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName:                     nodeName,
			AutomountServiceAccountToken: &no,
			Containers:                   []corev1.Container{{Name: "main", Image: "ignored", Command: command}},
		},
	}
}

func createPod(ctx context.Context, t *testing.T, cs kubernetes.Interface, pod *corev1.Pod) {
	t.Helper()
	if _, err := cs.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func containerPID(t *testing.T, pod *corev1.Pod) int {
	t.Helper()
	id := pod.Status.ContainerStatuses[0].ContainerID
	pid, err := strconv.Atoi(strings.TrimPrefix(id, "process://"))
	if err != nil {
		t.Fatalf("containerID %q is not process://<pid>", id)
	}
	return pid
}

// descendants returns the PIDs of every process below pid.
func descendants(pid int) []int {
	children := map[int][]int{}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, s := range stats {
		b, err := os.ReadFile(s)
		if err != nil {
			continue
		}
		fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(fields) < 2 {
			continue
		}
		child, _ := strconv.Atoi(filepath.Base(filepath.Dir(s)))
		parent, _ := strconv.Atoi(fields[1])
		children[parent] = append(children[parent], child)
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		for _, c := range children[queue[0]] {
			out = append(out, c)
			queue = append(queue, c)
		}
		queue = queue[1:]
	}
	return out
}

// comm returns the command name of pid.
func comm(pid int) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	return strings.TrimSpace(string(b))
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}

// removeCreatedDirs removes, when the test ends, the directories of path
// that do not exist now: a mountPath that does not exist is created on the
// host (empty) for the bind mount.
func removeCreatedDirs(t *testing.T, path string) {
	var created []string
	for p := filepath.Clean(path); p != "/"; p = filepath.Dir(p) {
		if _, err := os.Lstat(p); err == nil {
			break
		}
		created = append(created, p)
	}
	t.Cleanup(func() {
		for _, p := range created {
			_ = os.Remove(p) // only empty directories go
		}
	})
}

// requireNamespaces skips a test of what only pods with namespaces of their
// own get (hostname, /etc/hosts, volume mounts, exec through nsenter).
func requireNamespaces(t *testing.T, p *processnode.Provider) {
	t.Helper()
	if !p.Namespaced() {
		t.Skip("pods run without namespaces here (not root, or unshare unavailable)")
	}
}

func waitPhase(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, name string, phase corev1.PodPhase) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, fmt.Sprintf("pod %s %s", name, phase), func() (bool, string) {
		got, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil && got.Status.Phase == phase {
			return true, ""
		}
		if got != nil {
			return false, fmt.Sprintf("phase %s, containers %+v", got.Status.Phase, got.Status.ContainerStatuses)
		}
		return false, fmt.Sprint(err)
	})
}

// podLog reads a pod's whole log through the API server and the node's
// kubelet API.
func podLog(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, name string) string {
	t.Helper()
	b, err := cs.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		return "" // the node does not know the pod yet
	}
	return string(b)
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
