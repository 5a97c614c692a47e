package processnode

import (
	"bytes"
	"io"
	"os"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// serviceNames returns, by IP, the DNS names a cluster DNS gives the
// endpoints of headless Services (fully qualified first): from their
// EndpointSlices, never from a pod's own hostname and subdomain, so a pod
// that no slice lists (a mirror pod with a job's labels, hostname and
// subdomain: issue #42, C2) answers for no Service's name. An etjob job's
// slice is the controller's, of the pods the job owns; another Service's,
// kube-controller-manager's, of the pods its selector matches.
func serviceNames(slices []*discoveryv1.EndpointSlice) map[string][]string {
	sorted := append([]*discoveryv1.EndpointSlice(nil), slices...)
	sort.Slice(sorted, func(i, j int) bool {
		return sorted[i].Namespace+"/"+sorted[i].Name < sorted[j].Namespace+"/"+sorted[j].Name
	})
	out := map[string][]string{}
	for _, s := range sorted {
		svc := s.Labels[discoveryv1.LabelServiceName]
		if svc == "" {
			continue
		}
		for _, ep := range s.Endpoints {
			if ep.Hostname == nil || *ep.Hostname == "" {
				continue
			}
			name := *ep.Hostname + "." + svc + "." + s.Namespace + ".svc"
			for _, ip := range ep.Addresses {
				if len(out[ip]) == 0 { // one Service's names an address (the first slice by name)
					out[ip] = []string{name + ".cluster.local", name, *ep.Hostname + "." + svc}
				}
			}
		}
	}
	return out
}

// ownNames returns the names a kubelet writes into a pod's own hosts file
// for pod: with spec.hostname and spec.subdomain, its fully qualified name
// under that subdomain (torch's elastic agent publishes socket.getfqdn() of
// rank 0, and getfqdn takes the first name of the line). Here one hosts
// file serves every pod of the node, so these names are given only to this
// node's own pods.
func ownNames(pod *corev1.Pod) []string {
	if h, sub := pod.Spec.Hostname, pod.Spec.Subdomain; h != "" && sub != "" {
		name := h + "." + sub + "." + pod.Namespace + ".svc"
		return []string{name + ".cluster.local", name, h + "." + sub}
	}
	return nil
}

// jobsOwn reports whether pod is controlled by the ElasticJob its subdomain
// names. The local cluster's pods live on loopback addresses, which an
// EndpointSlice may not hold (the API refuses them), so the controller's
// slice of a job is empty here: the hosts file names a job's pods from the
// ownership the slice is made of instead, never from a label or a
// subdomain alone.
func jobsOwn(pod *corev1.Pod) bool {
	ref := metav1.GetControllerOf(pod)
	return ref != nil && ref.Kind == "ElasticJob" && strings.HasPrefix(ref.APIVersion, "etjob.dev/") &&
		ref.Name == pod.Spec.Subdomain
}

// hostsEntry returns the /etc/hosts line of pod, or "" when it has no IP:
// its IP, the Service names of that IP (or, for a pod of this node, own,
// or of the job that owns it, its own), then its hostname, then its name
// when that differs.
func hostsEntry(pod *corev1.Pod, names map[string][]string, own bool) string {
	ip := pod.Status.PodIP
	if ip == "" {
		return ""
	}
	all := slices.Clone(names[ip])
	if len(all) == 0 && (own || jobsOwn(pod)) {
		all = ownNames(pod)
	}
	all = append(all, podHostname(pod))
	if h := podHostname(pod); h != pod.Name {
		all = append(all, pod.Name)
	}
	return ip + "\t" + strings.Join(all, " ")
}

// renderHosts returns the hosts file of a node: localhost, then one line per
// pod with an IP that is not finished (own: the UIDs of this node's pods),
// and one per Service endpoint no such pod has, sorted so that the content
// changes only when an entry does. Every pod of the cluster is in it, by its
// hostname and name, which is what makes worker hostnames resolve from
// every pod without a cluster DNS; where two pods share a short name the
// first line wins. The names of headless Services' pods come from their
// EndpointSlices (serviceNames), as a cluster DNS serves them.
func renderHosts(pods []*corev1.Pod, slices []*discoveryv1.EndpointSlice, own map[string]bool) []byte {
	names := serviceNames(slices)
	seen := map[string]bool{}
	withPod := map[string]bool{}
	var lines []string
	for _, pod := range pods {
		if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		if line := hostsEntry(pod, names, own[string(pod.UID)]); line != "" && !seen[line] {
			seen[line] = true
			withPod[pod.Status.PodIP] = true
			lines = append(lines, line)
		}
	}
	for ip, n := range names {
		if !withPod[ip] {
			lines = append(lines, ip+"\t"+strings.Join(n, " "))
		}
	}
	sort.Strings(lines)
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
