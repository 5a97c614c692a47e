package processnode

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// podHostname is the hostname a kubelet gives pod (pkg/kubelet
// GeneratePodHostNameAndDomain): spec.hostname, else the pod's name,
// truncated to 63 characters without a trailing '-' or '.'.
func podHostname(pod *corev1.Pod) string {
	h := pod.Name
	if pod.Spec.Hostname != "" {
		h = pod.Spec.Hostname
	}
	if len(h) > 63 {
		h = strings.TrimRight(h[:63], "-.")
	}
	return h
}

// hostsEntry returns the /etc/hosts line of pod, or "" when it has no IP.
// With spec.hostname and spec.subdomain set it names the pod as a headless
// Service's DNS would, fully qualified name first: torch's elastic agent
// publishes socket.getfqdn() of rank 0 as MASTER_ADDR, and getfqdn takes the
// first name of the line. Any other pod is "<ip> <pod name>", after its
// hostname when spec.hostname differs.
func hostsEntry(pod *corev1.Pod) string {
	if pod.Status.PodIP == "" {
		return ""
	}
	if h, sub := pod.Spec.Hostname, pod.Spec.Subdomain; h != "" && sub != "" {
		name := h + "." + sub + "." + pod.Namespace + ".svc"
		return fmt.Sprintf("%s\t%s.cluster.local %s %s.%s %s", pod.Status.PodIP, name, name, h, sub, h)
	}
	// The pod's own hostname first, as a kubelet writes it, so that a pod
	// with spec.hostname but no subdomain resolves its hostname too.
	if h := podHostname(pod); h != pod.Name {
		return pod.Status.PodIP + "\t" + h + " " + pod.Name
	}
	return pod.Status.PodIP + "\t" + pod.Name
}

// renderHosts returns the hosts file of a node: localhost, then one line per
// pod with an IP that is not finished, sorted so that the content changes
// only when an entry does. Every pod of the cluster is in it, which is what
// makes worker hostnames resolve from every pod without a cluster DNS; where
// two pods share a short name the first line wins.
func renderHosts(pods []*corev1.Pod) []byte {
	seen := map[string]bool{}
	var lines []string
	for _, pod := range pods {
		if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		if line := hostsEntry(pod); line != "" && !seen[line] {
			seen[line] = true
			lines = append(lines, line)
		}
	}
	slices.Sort(lines)
	var b bytes.Buffer
	b.WriteString("# Kubernetes-managed hosts file (etjob process node).\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
	for _, l := range lines {
		b.WriteString(l + "\n")
	}
	return b.Bytes()
}

// writeInPlace makes path hold content without replacing its inode: pods
// bind-mount the file, and a bind mount of a single file keeps showing the
// old inode after a rename. It writes only when the content differs and
// reports whether it did. A reader may see a mix for an instant; hosts
// files are small and re-read on every lookup.
func writeInPlace(path string, content []byte) (bool, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return false, err
	}
	defer f.Close()
	old, err := io.ReadAll(f)
	if err != nil {
		return false, err
	}
	if bytes.Equal(old, content) {
		return false, nil
	}
	if _, err := f.WriteAt(content, 0); err != nil {
		return false, err
	}
	if err := f.Truncate(int64(len(content))); err != nil {
		return false, err
	}
	return true, nil
}
