package processnode_test

import (
	"context"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/etjob/etjob/internal/localcluster/processnode"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
)

const nodeName = "process-node-1"

// TestProcessNode runs a process node against a real kube-apiserver and etcd
// and checks what a kubelet would do for two pods: one that exits with an
// error, one that is deleted while it runs.
func TestProcessNode(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs := startAPIServer(t)
	n, provider, err := processnode.NewNode(processnode.Options{
		Client:   cs,
		NodeName: nodeName,
		NodeIP:   "127.0.9.1",
		Labels:   map[string]string{"karpenter.sh/capacity-type": "spot", "etjob.dev/price-per-hour": "0.91"},
		WorkDir:  t.TempDir(),
	})
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
	eventually(t, 30*time.Second, "the Node is Ready with its labels and GPU", func() bool {
		node, err := cs.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false
		}
		gpu := node.Status.Allocatable[processnode.ResourceGPU]
		return nodeReady(node) && node.Labels["karpenter.sh/capacity-type"] == "spot" && gpu.Value() == 1
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
		eventually(t, 30*time.Second, "the pod fails", func() bool {
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
		if err != nil || !ip.IsLoopback() || ip.String() == "127.0.9.1" {
			t.Errorf("status.podIP = %q, want a loopback address other than the node's", got.Status.PodIP)
		}
		if got.Status.HostIP != "127.0.9.1" {
			t.Errorf("status.hostIP = %q, want the node IP 127.0.9.1", got.Status.HostIP)
		}
		logs, err := provider.GetContainerLogs(ctx, ns, pod.Name, "main", api.ContainerLogOpts{})
		if err != nil {
			t.Fatal(err)
		}
		defer logs.Close()
		b, _ := io.ReadAll(logs)
		if want := "hello fails on 127.0.9.1"; !strings.Contains(string(b), want) {
			t.Errorf("log = %q, want it to contain %q", b, want)
		}
	})

	t.Run("deleted pod", func(t *testing.T) {
		ns := newNamespace(ctx, t, cs)
		// The child sleep shares the container's process group: deleting the
		// pod must stop it too, not only the shell.
		pod := processPod(ns, "sleeps", "/bin/sh", "-c", "sleep 300 & echo $! > child.pid; wait")
		grace := int64(5)
		pod.Spec.TerminationGracePeriodSeconds = &grace
		createPod(ctx, t, cs, pod)
		var running *corev1.Pod
		eventually(t, 30*time.Second, "the pod runs and is Ready", func() bool {
			running, _ = cs.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
			return running != nil && running.Status.Phase == corev1.PodRunning && podReady(running)
		})
		pid := containerPID(t, running)
		logPath, err := provider.LogPath(ns, pod.Name, "main")
		if err != nil {
			t.Fatal(err)
		}
		var childPID int
		eventually(t, 10*time.Second, "the shell wrote its child's PID", func() bool {
			b, err := os.ReadFile(filepath.Join(filepath.Dir(logPath), "child.pid"))
			childPID, _ = strconv.Atoi(strings.TrimSpace(string(b)))
			return err == nil && childPID > 0
		})
		if !alive(pid) || !alive(childPID) {
			t.Fatalf("before deletion: shell %d alive=%v, child %d alive=%v", pid, alive(pid), childPID, alive(childPID))
		}

		deleted := time.Now()
		if err := cs.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, "the pod's processes are gone", func() bool {
			return !alive(pid) && !alive(childPID)
		})
		t.Logf("processes %d and %d gone %s after the delete", pid, childPID, time.Since(deleted).Round(time.Millisecond))
		eventually(t, 20*time.Second, "the pod object is gone", func() bool {
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
		eventually(t, 30*time.Second, "the pod runs", func() bool {
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
		eventually(t, 10*time.Second, "SIGKILL ends the process", func() bool { return !alive(pid) })
	})
}

// startAPIServer starts kube-apiserver and etcd (binaries from
// hack/build-controlplane.sh) and returns a client; it skips the test when
// the binaries cannot be had.
func startAPIServer(t *testing.T) kubernetes.Interface {
	t.Helper()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		root, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
		if err != nil {
			t.Skipf("no KUBEBUILDER_ASSETS and no repository root: %v", err)
		}
		out, err := exec.Command(filepath.Join(strings.TrimSpace(string(root)), "hack/build-controlplane.sh")).Output()
		if err != nil {
			t.Skipf("no KUBEBUILDER_ASSETS and hack/build-controlplane.sh failed: %v", err)
		}
		t.Setenv("KUBEBUILDER_ASSETS", strings.TrimSpace(string(out)))
	}
	env := &envtest.Environment{}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting kube-apiserver and etcd: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
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

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting until %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
