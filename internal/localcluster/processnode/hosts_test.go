package processnode

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TestRenderHosts: the names under a headless Service come from its
// EndpointSlice (a cluster DNS's records), or for this node's own pods from
// their hostname and subdomain (a kubelet's own hosts file); a pod of
// another node that no slice lists, with a job's hostname and subdomain (a
// mirror pod: issue #42, C2), gets its short names only. A job's own pods
// (controlled by the ElasticJob their subdomain names) get theirs: on
// loopback addresses, which no EndpointSlice may hold, that is the slice.
func TestRenderHosts(t *testing.T) {
	pod := func(name, hostname, subdomain, ip string, phase corev1.PodPhase) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID(name)},
			Spec:       corev1.PodSpec{Hostname: hostname, Subdomain: subdomain},
			Status:     corev1.PodStatus{PodIP: ip, Phase: phase},
		}
	}
	host := func(h string) *string { return &h }
	yes := true
	owned := func(p *corev1.Pod, job string) *corev1.Pod {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "etjob.dev/v1alpha1", Kind: "ElasticJob", Name: job, Controller: &yes}}
		return p
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "job", Namespace: "ns", Labels: map[string]string{discoveryv1.LabelServiceName: "job"}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"127.0.1.2"}, Hostname: host("w-0")},
			{Addresses: []string{"127.0.4.4"}, Hostname: host("w-9")}, // no pod seen yet
			{Addresses: []string{"127.0.2.2"}},                        // no hostname: no name
		},
	}
	got := string(renderHosts([]*corev1.Pod{
		pod("w-1", "w-1", "job", "127.0.1.3", corev1.PodRunning),
		pod("plain", "", "", "127.0.2.2", corev1.PodRunning),
		pod("named", "host", "", "127.0.2.3", corev1.PodRunning),
		pod("w-0", "w-0", "job", "127.0.1.2", corev1.PodRunning),
		pod("mirror", "w-0", "job", "127.0.3.3", corev1.PodRunning),
		owned(pod("l", "l", "job", "127.0.5.5", corev1.PodRunning), "job"),
		owned(pod("other", "x", "job", "127.0.5.6", corev1.PodRunning), "another-job"),
		pod("no-ip", "", "", "", corev1.PodPending),
		pod("done", "", "", "127.0.1.9", corev1.PodSucceeded),
	}, []*discoveryv1.EndpointSlice{slice}, map[string]bool{"w-1": true}))
	want := "# Kubernetes-managed hosts file (etjob process node).\n" +
		"127.0.0.1\tlocalhost\n" +
		"::1\tlocalhost ip6-localhost ip6-loopback\n" +
		"127.0.1.2\tw-0.job.ns.svc.cluster.local w-0.job.ns.svc w-0.job w-0\n" +
		"127.0.1.3\tw-1.job.ns.svc.cluster.local w-1.job.ns.svc w-1.job w-1\n" +
		"127.0.2.2\tplain\n" +
		"127.0.2.3\thost named\n" +
		"127.0.3.3\tw-0 mirror\n" +
		"127.0.4.4\tw-9.job.ns.svc.cluster.local w-9.job.ns.svc w-9.job\n" +
		"127.0.5.5\tl.job.ns.svc.cluster.local l.job.ns.svc l.job l\n" +
		"127.0.5.6\tx other\n"
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
