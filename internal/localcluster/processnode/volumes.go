package processnode

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// defaultFileMode is the API's default for configMap, secret, downwardAPI
// and projected volumes (0644).
const defaultFileMode = 0o644

// cachedToken is a service account token of a projected volume, requested
// again once 80% of its lifetime passed, as a kubelet's token manager does.
type cachedToken struct {
	token     string
	refreshAt time.Time
}

// setupVolumes prepares every volume of pr's pod and returns the host path
// of each by volume name: emptyDir a directory under the pod's directory,
// hostPath the host path (created for DirectoryOrCreate and FileOrCreate),
// persistentVolumeClaim the hostPath or local path of the bound
// PersistentVolume, and configMap, secret, downwardAPI and projected a
// directory written the kubelet's way (writeAtomic). An error means the pod
// cannot start yet (an unbound claim, a missing ConfigMap); the caller
// retries.
func (p *Provider) setupVolumes(ctx context.Context, pr *podRun, pod *corev1.Pod) (map[string]string, error) {
	paths := map[string]string{}
	for i := range pod.Spec.Volumes {
		v := &pod.Spec.Volumes[i]
		dir := filepath.Join(pr.dir, "volumes", v.Name)
		switch {
		case v.EmptyDir != nil:
			if err := os.MkdirAll(dir, 0o777); err != nil {
				return nil, fmt.Errorf("emptyDir volume %q: %w", v.Name, err)
			}
			paths[v.Name] = dir
		case v.HostPath != nil:
			if err := ensureHostPath(v.HostPath.Path, v.HostPath.Type); err != nil {
				return nil, fmt.Errorf("hostPath volume %q: %w", v.Name, err)
			}
			paths[v.Name] = v.HostPath.Path
		case v.PersistentVolumeClaim != nil:
			path, err := p.claimPath(ctx, pod.Namespace, v.PersistentVolumeClaim.ClaimName)
			if err != nil {
				return nil, fmt.Errorf("volume %q: %w", v.Name, err)
			}
			paths[v.Name] = path
		case v.ConfigMap != nil, v.Secret != nil, v.DownwardAPI != nil, v.Projected != nil:
			if err := p.writeProjected(ctx, pr, pod, v, dir); err != nil {
				return nil, fmt.Errorf("volume %q: %w", v.Name, err)
			}
			paths[v.Name] = dir
		default:
			return nil, fmt.Errorf("volume %q: this volume type is not supported on process nodes (emptyDir, hostPath, persistentVolumeClaim of a hostPath or local PersistentVolume, configMap, secret, downwardAPI and projected are)", v.Name)
		}
	}
	return paths, nil
}

// isProjected reports whether v is written with writeAtomic, and so kept
// current and mounted read-only.
func isProjected(v *corev1.Volume) bool {
	return v.ConfigMap != nil || v.Secret != nil || v.DownwardAPI != nil || v.Projected != nil
}

// refreshVolumes writes pr's configMap, secret, downwardAPI and projected
// volumes again from the current objects; writeAtomic swaps in what changed.
// A source that cannot be read keeps its last content, as on a kubelet.
func (p *Provider) refreshVolumes(ctx context.Context, pr *podRun, pod *corev1.Pod) error {
	var errs []error
	for i := range pod.Spec.Volumes {
		v := &pod.Spec.Volumes[i]
		if isProjected(v) {
			if err := p.writeProjected(ctx, pr, pod, v, filepath.Join(pr.dir, "volumes", v.Name)); err != nil {
				errs = append(errs, fmt.Errorf("volume %q: %w", v.Name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// containerMounts returns the bind mounts of container c: each volumeMount's
// volume path (plus subPath) at its mountPath. configMap, secret,
// downwardAPI and projected volumes are read-only, as a kubelet mounts them.
func containerMounts(pod *corev1.Pod, c *corev1.Container, paths map[string]string) ([]mount, error) {
	volumes := map[string]*corev1.Volume{}
	for i := range pod.Spec.Volumes {
		volumes[pod.Spec.Volumes[i].Name] = &pod.Spec.Volumes[i]
	}
	var out []mount
	for _, vm := range c.VolumeMounts {
		src, ok := paths[vm.Name]
		if !ok {
			return nil, fmt.Errorf("container %q mounts volume %q, which the pod does not have", c.Name, vm.Name)
		}
		if vm.SubPathExpr != "" {
			return nil, fmt.Errorf("container %q volumeMount %q: subPathExpr is not supported on process nodes; use subPath", c.Name, vm.Name)
		}
		v := volumes[vm.Name]
		if vm.SubPath != "" {
			if err := validateProjectionPath(vm.SubPath); err != nil {
				return nil, fmt.Errorf("container %q volumeMount %q subPath: %w", c.Name, vm.Name, err)
			}
			src = filepath.Join(src, vm.SubPath)
			if !isProjected(v) {
				if _, err := os.Stat(src); os.IsNotExist(err) {
					if err := os.MkdirAll(src, 0o777); err != nil { // a kubelet creates a missing subPath as a directory
						return nil, err
					}
				}
			}
		}
		ro := vm.ReadOnly || isProjected(v) || (v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ReadOnly)
		out = append(out, mount{source: src, target: vm.MountPath, readOnly: ro})
	}
	return out, nil
}

// ensureHostPath checks or creates a hostPath as its type asks.
func ensureHostPath(path string, t *corev1.HostPathType) error {
	if !filepath.IsAbs(path) {
		return fmt.Errorf("path %q is not absolute", path)
	}
	typ := corev1.HostPathUnset
	if t != nil {
		typ = *t
	}
	fi, err := os.Stat(path)
	switch typ {
	case corev1.HostPathDirectoryOrCreate:
		if os.IsNotExist(err) {
			return os.MkdirAll(path, 0o755)
		}
	case corev1.HostPathFileOrCreate:
		if os.IsNotExist(err) {
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return err
			}
			return os.WriteFile(path, nil, 0o644)
		}
	case corev1.HostPathDirectory:
		if err != nil || !fi.IsDir() {
			return fmt.Errorf("%q is not a directory (type Directory)", path)
		}
	case corev1.HostPathFile:
		if err != nil || !fi.Mode().IsRegular() {
			return fmt.Errorf("%q is not a file (type File)", path)
		}
	}
	return nil
}

// claimPath returns the host path of the PersistentVolume bound to claim.
func (p *Provider) claimPath(ctx context.Context, namespace, claim string) (string, error) {
	if p.client == nil {
		return "", fmt.Errorf("persistentVolumeClaim %q: the node has no API client", claim)
	}
	pvc, err := p.client.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, claim, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("persistentVolumeClaim %q: %w", claim, err)
	}
	if pvc.Spec.VolumeName == "" || pvc.Status.Phase != corev1.ClaimBound {
		return "", fmt.Errorf("persistentVolumeClaim %q is not bound (phase %q): bind it to a hostPath PersistentVolume", claim, pvc.Status.Phase)
	}
	pv, err := p.client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("persistentVolume %q of claim %q: %w", pvc.Spec.VolumeName, claim, err)
	}
	if ref := pv.Spec.ClaimRef; ref != nil && ref.UID != "" && ref.UID != pvc.UID {
		return "", fmt.Errorf("persistentVolume %q is bound to another claim than %q", pv.Name, claim)
	}
	switch {
	case pv.Spec.HostPath != nil:
		return pv.Spec.HostPath.Path, ensureHostPath(pv.Spec.HostPath.Path, pv.Spec.HostPath.Type)
	case pv.Spec.Local != nil:
		return pv.Spec.Local.Path, nil
	}
	return "", fmt.Errorf("persistentVolume %q of claim %q is neither hostPath nor local, which process nodes cannot mount", pv.Name, claim)
}

// writeProjected builds the files of a configMap, secret, downwardAPI or
// projected volume and writes them to dir with writeAtomic.
func (p *Provider) writeProjected(ctx context.Context, pr *podRun, pod *corev1.Pod, v *corev1.Volume, dir string) error {
	pr.volMu.Lock()
	defer pr.volMu.Unlock()
	payload := map[string]fileProjection{}
	var err error
	switch {
	case v.ConfigMap != nil:
		err = p.configMapFiles(ctx, pod.Namespace, v.ConfigMap.Name, v.ConfigMap.Items, v.ConfigMap.Optional, mode(v.ConfigMap.DefaultMode), payload)
	case v.Secret != nil:
		err = p.secretFiles(ctx, pod.Namespace, v.Secret.SecretName, v.Secret.Items, v.Secret.Optional, mode(v.Secret.DefaultMode), payload)
	case v.DownwardAPI != nil:
		err = downwardAPIFiles(pod, v.DownwardAPI.Items, mode(v.DownwardAPI.DefaultMode), payload)
	case v.Projected != nil:
		def := mode(v.Projected.DefaultMode)
		for _, s := range v.Projected.Sources {
			switch {
			case s.ConfigMap != nil:
				err = p.configMapFiles(ctx, pod.Namespace, s.ConfigMap.Name, s.ConfigMap.Items, s.ConfigMap.Optional, def, payload)
			case s.Secret != nil:
				err = p.secretFiles(ctx, pod.Namespace, s.Secret.Name, s.Secret.Items, s.Secret.Optional, def, payload)
			case s.DownwardAPI != nil:
				err = downwardAPIFiles(pod, s.DownwardAPI.Items, def, payload)
			case s.ServiceAccountToken != nil:
				var tok string
				tok, err = p.serviceAccountToken(ctx, pr, pod, s.ServiceAccountToken)
				payload[s.ServiceAccountToken.Path] = fileProjection{data: []byte(tok), mode: def}
			default:
				err = errors.New("only configMap, secret, downwardAPI and serviceAccountToken projections are supported on process nodes")
			}
			if err != nil {
				break
			}
		}
	}
	if err != nil {
		return err
	}
	_, err = writeAtomic(dir, payload)
	return err
}

func mode(m *int32) os.FileMode {
	if m == nil {
		return defaultFileMode
	}
	return os.FileMode(*m) & 0o777
}

func itemMode(m *int32, def os.FileMode) os.FileMode {
	if m == nil {
		return def
	}
	return os.FileMode(*m) & 0o777
}

// keyFiles adds a ConfigMap's or Secret's keys to payload as a kubelet does
// (pkg/volume/configmap MakePayload): every key when items is empty, else
// the listed keys at their paths; a missing listed key is an error unless
// the source is optional.
func keyFiles(kind, name string, data map[string][]byte, items []corev1.KeyToPath, optional bool, def os.FileMode, payload map[string]fileProjection) error {
	if len(items) == 0 {
		for _, k := range slices.Sorted(maps.Keys(data)) {
			payload[k] = fileProjection{data: data[k], mode: def}
		}
		return nil
	}
	for _, it := range items {
		b, ok := data[it.Key]
		if !ok {
			if optional {
				continue
			}
			return fmt.Errorf("%s %q has no key %q", kind, name, it.Key)
		}
		payload[it.Path] = fileProjection{data: b, mode: itemMode(it.Mode, def)}
	}
	return nil
}

func (p *Provider) configMapFiles(ctx context.Context, namespace, name string, items []corev1.KeyToPath, opt *bool, def os.FileMode, payload map[string]fileProjection) error {
	optional := opt != nil && *opt
	cm, err := p.getConfigMap(ctx, namespace, name)
	if apierrors.IsNotFound(err) && optional {
		return nil
	}
	if err != nil {
		return fmt.Errorf("configMap %q: %w", name, err)
	}
	data := make(map[string][]byte, len(cm.Data)+len(cm.BinaryData))
	for k, v := range cm.Data {
		data[k] = []byte(v)
	}
	maps.Copy(data, cm.BinaryData)
	return keyFiles("configMap", name, data, items, optional, def, payload)
}

func (p *Provider) secretFiles(ctx context.Context, namespace, name string, items []corev1.KeyToPath, opt *bool, def os.FileMode, payload map[string]fileProjection) error {
	optional := opt != nil && *opt
	s, err := p.getSecret(ctx, namespace, name)
	if apierrors.IsNotFound(err) && optional {
		return nil
	}
	if err != nil {
		return fmt.Errorf("secret %q: %w", name, err)
	}
	return keyFiles("secret", name, s.Data, items, optional, def, payload)
}

// getConfigMap reads from the node's informer cache when it has one, else
// from the API server.
func (p *Provider) getConfigMap(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error) {
	if p.env.configMaps != nil {
		return p.env.configMaps.ConfigMaps(namespace).Get(name)
	}
	if p.client != nil {
		return p.client.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
	}
	return nil, errors.New("the node has neither a ConfigMap lister nor an API client")
}

func (p *Provider) getSecret(ctx context.Context, namespace, name string) (*corev1.Secret, error) {
	if p.env.secrets != nil {
		return p.env.secrets.Secrets(namespace).Get(name)
	}
	if p.client != nil {
		return p.client.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
	}
	return nil, errors.New("the node has neither a Secret lister nor an API client")
}

// downwardAPIFiles adds downward API items: metadata.labels and
// metadata.annotations as sorted key="value" lines (pkg/fieldpath
// FormatMap), other fields as podFieldValue resolves them.
func downwardAPIFiles(pod *corev1.Pod, items []corev1.DownwardAPIVolumeFile, def os.FileMode, payload map[string]fileProjection) error {
	for _, it := range items {
		if it.FieldRef == nil {
			return fmt.Errorf("downwardAPI item %q: only fieldRef is supported on process nodes", it.Path)
		}
		var value string
		switch it.FieldRef.FieldPath {
		case "metadata.labels":
			value = formatMap(pod.Labels)
		case "metadata.annotations":
			value = formatMap(pod.Annotations)
		default:
			v, err := podFieldValue(pod, it.FieldRef.FieldPath)
			if err != nil {
				return fmt.Errorf("downwardAPI item %q: %w", it.Path, err)
			}
			value = v
		}
		payload[it.Path] = fileProjection{data: []byte(value), mode: itemMode(it.Mode, def)}
	}
	return nil
}

func formatMap(m map[string]string) string {
	var lines []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		lines = append(lines, fmt.Sprintf("%v=%q", k, m[k]))
	}
	return strings.Join(lines, "\n")
}

// serviceAccountToken returns a token for the pod's service account from the
// TokenRequest API, bound to the pod, with the projection's audience (the
// API server's default audience when empty) and expiry. It reuses a token
// until 80% of its lifetime passed.
func (p *Provider) serviceAccountToken(ctx context.Context, pr *podRun, pod *corev1.Pod, src *corev1.ServiceAccountTokenProjection) (string, error) {
	key := fmt.Sprintf("%s|%d", src.Audience, ptrOr(src.ExpirationSeconds, 3600))
	if t, ok := pr.tokens[key]; ok && time.Now().Before(t.refreshAt) {
		return t.token, nil
	}
	if p.client == nil {
		return "", errors.New("serviceAccountToken: the node has no API client")
	}
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: src.ExpirationSeconds,
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}
	if src.Audience != "" {
		req.Spec.Audiences = []string{src.Audience}
	}
	resp, err := p.client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token for service account %q: %w", sa, err)
	}
	now := time.Now()
	life := resp.Status.ExpirationTimestamp.Sub(now)
	if pr.tokens == nil {
		pr.tokens = map[string]cachedToken{}
	}
	pr.tokens[key] = cachedToken{token: resp.Status.Token, refreshAt: now.Add(min(life*8/10, 24*time.Hour))}
	return resp.Status.Token, nil
}

func ptrOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}
