package processnode

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestRenderHosts(t *testing.T) {
	pod := func(name, hostname, subdomain, ip string, phase corev1.PodPhase) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"},
			Spec:       corev1.PodSpec{Hostname: hostname, Subdomain: subdomain},
			Status:     corev1.PodStatus{PodIP: ip, Phase: phase},
		}
	}
	got := string(renderHosts([]*corev1.Pod{
		pod("w-1", "w-1", "job", "127.0.1.3", corev1.PodRunning),
		pod("plain", "", "", "127.0.2.2", corev1.PodRunning),
		pod("named", "host", "", "127.0.2.3", corev1.PodRunning),
		pod("w-0", "w-0", "job", "127.0.1.2", corev1.PodRunning),
		pod("no-ip", "", "", "", corev1.PodPending),
		pod("done", "", "", "127.0.1.9", corev1.PodSucceeded),
	}))
	want := "# Kubernetes-managed hosts file (etjob process node).\n" +
		"127.0.0.1\tlocalhost\n" +
		"::1\tlocalhost ip6-localhost ip6-loopback\n" +
		"127.0.1.2\tw-0.job.ns.svc.cluster.local w-0.job.ns.svc w-0.job w-0\n" +
		"127.0.1.3\tw-1.job.ns.svc.cluster.local w-1.job.ns.svc w-1.job w-1\n" +
		"127.0.2.2\tplain\n" +
		"127.0.2.3\thost named\n"
	if got != want {
		t.Errorf("renderHosts =\n%s\nwant\n%s", got, want)
	}
}

func TestPodHostname(t *testing.T) {
	long := strings.Repeat("a", 62) + "-b" // cut at 63, it would end in "-"
	for name, tc := range map[string]struct {
		pod  corev1.Pod
		want string
	}{
		"pod name":      {corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}}, "p"},
		"spec.hostname": {corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: corev1.PodSpec{Hostname: "h"}}, "h"},
		"truncated":     {corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: long}}, strings.Repeat("a", 62)},
	} {
		if got := podHostname(&tc.pod); got != tc.want {
			t.Errorf("%s: podHostname = %q, want %q", name, got, tc.want)
		}
	}
}

// TestWriteInPlace checks that the hosts file keeps its inode (a bind mount
// of it would otherwise show stale content) and shrinks.
func TestWriteInPlace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hosts")
	if changed, err := writeInPlace(path, []byte("a long first version\n")); err != nil || !changed {
		t.Fatalf("first write: changed=%v err=%v", changed, err)
	}
	ino := inode(t, path)
	if changed, err := writeInPlace(path, []byte("short\n")); err != nil || !changed {
		t.Fatalf("second write: changed=%v err=%v", changed, err)
	}
	if changed, _ := writeInPlace(path, []byte("short\n")); changed {
		t.Error("writing the same content reported a change")
	}
	if b, _ := os.ReadFile(path); string(b) != "short\n" {
		t.Errorf("content = %q, want %q", b, "short\n")
	}
	if inode(t, path) != ino {
		t.Error("the file was replaced, not rewritten in place")
	}
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}
