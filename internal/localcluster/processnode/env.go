package processnode

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	corev1listers "k8s.io/client-go/listers/core/v1"
)

// envSources looks up the ConfigMaps and Secrets that env and envFrom refer
// to. A nil lister makes every reference to that kind "not found".
type envSources struct {
	configMaps corev1listers.ConfigMapLister
	secrets    corev1listers.SecretLister
}

// resolveEnv returns the environment of container c of pod as a kubelet builds
// it (pkg/kubelet/kubelet_pods.go makeEnvironmentVariables): envFrom sources
// first, then env entries in order, a later name overriding an earlier one;
// literal values expand $(VAR) references to the variables defined before
// them. The pod's status must already carry podIP and hostIP. Service
// environment variables are not added.
func resolveEnv(pod *corev1.Pod, c *corev1.Container, src envSources) ([]corev1.EnvVar, error) {
	var out []corev1.EnvVar
	index := map[string]int{}
	set := func(name, value string) {
		if i, ok := index[name]; ok {
			out[i].Value = value
			return
		}
		index[name] = len(out)
		out = append(out, corev1.EnvVar{Name: name, Value: value})
	}
	lookup := func(name string) (string, bool) {
		if i, ok := index[name]; ok {
			return out[i].Value, true
		}
		return "", false
	}

	for _, from := range c.EnvFrom {
		data, err := envFromData(pod.Namespace, from, src)
		if err != nil {
			return nil, fmt.Errorf("container %q envFrom: %w", c.Name, err)
		}
		for _, k := range sortedKeys(data) {
			name := from.Prefix + k
			if len(validation.IsEnvVarName(name)) != 0 {
				continue // a kubelet skips (and reports) invalid keys too
			}
			set(name, data[k])
		}
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			set(e.Name, expand(e.Value, lookup))
			continue
		}
		v, ok, err := envValueFrom(pod, c, e.ValueFrom, src)
		if err != nil {
			return nil, fmt.Errorf("container %q env %q: %w", c.Name, e.Name, err)
		}
		if ok {
			set(e.Name, v)
		}
	}
	return out, nil
}

// envValueFrom resolves one valueFrom; ok is false for an optional reference
// whose source does not exist, which leaves the variable unset.
func envValueFrom(pod *corev1.Pod, c *corev1.Container, from *corev1.EnvVarSource, src envSources) (value string, ok bool, err error) {
	switch {
	case from.FieldRef != nil:
		v, err := podFieldValue(pod, from.FieldRef.FieldPath)
		return v, err == nil, err
	case from.ConfigMapKeyRef != nil:
		ref := from.ConfigMapKeyRef
		optional := ref.Optional != nil && *ref.Optional
		if src.configMaps == nil {
			return "", false, missing(optional, "configMap %q: no ConfigMap lister", ref.Name)
		}
		cm, err := src.configMaps.ConfigMaps(pod.Namespace).Get(ref.Name)
		if apierrors.IsNotFound(err) {
			return "", false, missing(optional, "configMap %q not found", ref.Name)
		}
		if err != nil {
			return "", false, err
		}
		if v, found := cm.Data[ref.Key]; found {
			return v, true, nil
		}
		if v, found := cm.BinaryData[ref.Key]; found {
			return string(v), true, nil
		}
		return "", false, missing(optional, "key %q not in configMap %q", ref.Key, ref.Name)
	case from.SecretKeyRef != nil:
		ref := from.SecretKeyRef
		optional := ref.Optional != nil && *ref.Optional
		if src.secrets == nil {
			return "", false, missing(optional, "secret %q: no Secret lister", ref.Name)
		}
		s, err := src.secrets.Secrets(pod.Namespace).Get(ref.Name)
		if apierrors.IsNotFound(err) {
			return "", false, missing(optional, "secret %q not found", ref.Name)
		}
		if err != nil {
			return "", false, err
		}
		if v, found := s.Data[ref.Key]; found {
			return string(v), true, nil
		}
		return "", false, missing(optional, "key %q not in secret %q", ref.Key, ref.Name)
	case from.ResourceFieldRef != nil:
		v, err := resourceFieldValue(pod, c, from.ResourceFieldRef)
		return v, err == nil, err
	}
	return "", false, fmt.Errorf("valueFrom has no source")
}

// resourceFieldValue resolves a resourceFieldRef as a kubelet does: the
// container's (containerName's, else c's) limit or request of cpu, memory
// or ephemeral-storage, divided by the divisor (default 1) and rounded up.
// A kubelet gives the node's allocatable for an unset limit; a process node
// refuses it, naming the field.
func resourceFieldValue(pod *corev1.Pod, c *corev1.Container, ref *corev1.ResourceFieldSelector) (string, error) {
	target := c
	if ref.ContainerName != "" && ref.ContainerName != c.Name {
		target = nil
		for i := range pod.Spec.Containers {
			if pod.Spec.Containers[i].Name == ref.ContainerName {
				target = &pod.Spec.Containers[i]
			}
		}
		if target == nil {
			return "", fmt.Errorf("resourceFieldRef %q: no container %q", ref.Resource, ref.ContainerName)
		}
	}
	kind, name, ok := strings.Cut(ref.Resource, ".")
	var list corev1.ResourceList
	switch kind {
	case "limits":
		list = target.Resources.Limits
	case "requests":
		list = target.Resources.Requests
	default:
		ok = false
	}
	if !ok || (name != "cpu" && name != "memory" && name != "ephemeral-storage") {
		return "", fmt.Errorf("resourceFieldRef %q: want limits or requests of cpu, memory or ephemeral-storage", ref.Resource)
	}
	q, set := list[corev1.ResourceName(name)]
	if !set {
		return "", fmt.Errorf("resourceFieldRef %q: container %q sets none (a kubelet would give the node's allocatable; a process node does not)", ref.Resource, target.Name)
	}
	divisor := ref.Divisor
	if divisor.IsZero() {
		divisor = resource.MustParse("1")
	}
	if name == "cpu" {
		return strconv.FormatInt(ceilDiv(q.MilliValue(), divisor.MilliValue()), 10), nil
	}
	return strconv.FormatInt(ceilDiv(q.Value(), divisor.Value()), 10), nil
}

func ceilDiv(a, b int64) int64 {
	if b <= 0 {
		return a
	}
	return (a + b - 1) / b
}

// missing returns nil for an optional source (the variable stays unset) and
// the formatted error otherwise.
func missing(optional bool, format string, args ...any) error {
	if optional {
		return nil
	}
	return fmt.Errorf(format, args...)
}

func envFromData(namespace string, from corev1.EnvFromSource, src envSources) (map[string]string, error) {
	switch {
	case from.ConfigMapRef != nil:
		optional := from.ConfigMapRef.Optional != nil && *from.ConfigMapRef.Optional
		if src.configMaps == nil {
			return nil, missing(optional, "configMap %q: no ConfigMap lister", from.ConfigMapRef.Name)
		}
		cm, err := src.configMaps.ConfigMaps(namespace).Get(from.ConfigMapRef.Name)
		if apierrors.IsNotFound(err) {
			return nil, missing(optional, "configMap %q not found", from.ConfigMapRef.Name)
		}
		if err != nil {
			return nil, err
		}
		return cm.Data, nil
	case from.SecretRef != nil:
		optional := from.SecretRef.Optional != nil && *from.SecretRef.Optional
		if src.secrets == nil {
			return nil, missing(optional, "secret %q: no Secret lister", from.SecretRef.Name)
		}
		s, err := src.secrets.Secrets(namespace).Get(from.SecretRef.Name)
		if apierrors.IsNotFound(err) {
			return nil, missing(optional, "secret %q not found", from.SecretRef.Name)
		}
		if err != nil {
			return nil, err
		}
		data := make(map[string]string, len(s.Data))
		for k, v := range s.Data {
			data[k] = string(v)
		}
		return data, nil
	}
	return nil, nil
}

// podFieldValue resolves a downward API fieldPath the way a kubelet does
// (pkg/kubelet/kubelet_pods.go podFieldSelectorRuntimeValue).
func podFieldValue(pod *corev1.Pod, path string) (string, error) {
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.podIP":
		return pod.Status.PodIP, nil
	case "status.podIPs":
		return joinIPs(pod.Status.PodIPs), nil
	case "status.hostIP":
		return pod.Status.HostIP, nil
	case "status.hostIPs":
		ips := make([]string, 0, len(pod.Status.HostIPs))
		for _, ip := range pod.Status.HostIPs {
			ips = append(ips, ip.IP)
		}
		return strings.Join(ips, ","), nil
	}
	for prefix, m := range map[string]map[string]string{
		"metadata.labels":      pod.Labels,
		"metadata.annotations": pod.Annotations,
	} {
		if key, ok := strings.CutPrefix(path, prefix+"['"); ok {
			if key, ok = strings.CutSuffix(key, "']"); ok {
				return m[key], nil
			}
		}
	}
	return "", fmt.Errorf("unsupported fieldPath %q", path)
}

func joinIPs(ips []corev1.PodIP) string {
	s := make([]string, 0, len(ips))
	for _, ip := range ips {
		s = append(s, ip.IP)
	}
	return strings.Join(s, ",")
}

// expand replaces $(NAME) with NAME's value when lookup knows it and leaves
// the reference as written otherwise; $$ is an escaped $. This is Kubernetes'
// third_party/forked/golang/expansion, which container env, command and args
// use.
func expand(input string, lookup func(string) (string, bool)) string {
	var b strings.Builder
	checkpoint := 0
	for cursor := 0; cursor < len(input); cursor++ {
		if input[cursor] != '$' || cursor+1 >= len(input) {
			continue
		}
		b.WriteString(input[checkpoint:cursor])
		rest := input[cursor+1:]
		advance := 1
		switch rest[0] {
		case '$':
			b.WriteByte('$')
		case '(':
			end := strings.IndexByte(rest, ')')
			if end < 0 {
				b.WriteString("$(")
				break
			}
			name := rest[1:end]
			if v, ok := lookup(name); ok {
				b.WriteString(v)
			} else {
				b.WriteString("$(" + name + ")")
			}
			advance = end + 1
		default:
			b.WriteString(input[cursor : cursor+2])
		}
		cursor += advance
		checkpoint = cursor + 1
	}
	return b.String() + input[checkpoint:]
}

func sortedKeys(m map[string]string) []string {
	return slices.Sorted(maps.Keys(m))
}
