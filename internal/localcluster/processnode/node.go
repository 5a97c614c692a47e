package processnode

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/node"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// kubeletPort is the port of the node's kubelet API on its IP, advertised
// in status.daemonEndpoints.
const kubeletPort = 10250

// Options configures a process node.
type Options struct {
	// Client talks to the API server.
	Client kubernetes.Interface
	// NodeName names the Node object.
	NodeName string
	// NodeIP is the node's IPv4 loopback address (status.addresses and every
	// pod's status.hostIP); pod IPs come from the /24 that holds it, so nodes
	// on one machine need distinct /24s (127.0.1.1, 127.0.2.1, ...).
	NodeIP string
	// Labels are added to the node's default labels (kubernetes.io/hostname,
	// kubernetes.io/os, kubernetes.io/arch, type=virtual-kubelet).
	Labels map[string]string
	// Taints are the node's taints at registration (a kubelet's
	// --register-with-taints).
	Taints []corev1.Taint
	// WorkDir holds the per-pod directories and log files.
	WorkDir string
	// Capacity is the node's capacity and allocatable; cpu, memory, pods and
	// nvidia.com/gpu default to DefaultCapacity's values when absent.
	Capacity corev1.ResourceList
	// Images is the node's image table (ProviderConfig.Images).
	Images Images
	// APIServer is the API server's host:port for in-cluster clients
	// (ProviderConfig.APIServer).
	APIServer string
	// ClientCAs, when set, authenticate the kubelet API's callers: only a
	// client certificate they signed is served (the API server's
	// --kubelet-client-certificate), as a kubelet's --client-ca-file does.
	// Unset, anyone who reaches the node's address may read logs and exec.
	ClientCAs *x509.CertPool
}

// DefaultCapacity returns the capacity a process node advertises unless
// Options.Capacity overrides it: this machine's CPUs, 8Gi of memory, 110 pods
// and one emulated GPU.
func DefaultCapacity() corev1.ResourceList {
	return corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI),
		corev1.ResourceMemory: resource.MustParse("8Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
		etjobv1.ResourceGPU:   resource.MustParse("1"),
	}
}

// NewNode returns a virtual-kubelet node whose pods run as host processes,
// and its Provider. The node keeps a Lease in kube-node-lease, reports Ready
// once its pod controller synced, and serves the kubelet API (logs, exec) on
// NodeIP:10250 with a self-signed certificate, to callers with a client
// certificate that Options.ClientCAs signed (without ClientCAs, to anyone
// who reaches the address). Run the node
// with its Run method; call the Provider's Shutdown after Run returned so
// that no process outlives the node.
func NewNode(opts Options) (*nodeutil.Node, *Provider, error) {
	if opts.Client == nil {
		return nil, nil, errors.New("no API client: pass one (etjob-node --kubeconfig)")
	}
	var provider *Provider
	newProvider := func(cfg nodeutil.ProviderConfig) (nodeutil.Provider, node.NodeProvider, error) {
		p, err := NewProvider(ProviderConfig{
			NodeName:     opts.NodeName,
			NodeIP:       opts.NodeIP,
			WorkDir:      opts.WorkDir,
			PricePerHour: opts.Labels[etjobv1.LabelPricePerHour],
			ConfigMaps:   cfg.ConfigMaps,
			Secrets:      cfg.Secrets,
			Client:       opts.Client,
			Images:       opts.Images,
			APIServer:    opts.APIServer,
		})
		provider = p
		return p, nil, err // nil NodeProvider: nodeutil's naive one marks the node Ready
	}
	cert, err := selfSignedCert(opts.NodeName, opts.NodeIP)
	if err != nil {
		return nil, nil, fmt.Errorf("process node %q: kubelet API certificate: %w", opts.NodeName, err)
	}
	mux := http.NewServeMux()
	n, err := nodeutil.NewNode(opts.NodeName, newProvider,
		nodeutil.WithClient(opts.Client),
		nodeutil.AttachProviderRoutes(mux),
		nodeutil.WithTLSConfig(func(c *tls.Config) error {
			c.Certificates = append(c.Certificates, cert)
			if opts.ClientCAs != nil {
				c.ClientCAs, c.ClientAuth = opts.ClientCAs, tls.RequireAndVerifyClientCert
			}
			return nil
		}),
		func(cfg *nodeutil.NodeConfig) error {
			cfg.NodeSpec = nodeSpec(opts)
			// The API server proxies logs and exec to the node's InternalIP
			// (kube-apiserver --kubelet-preferred-address-types=InternalIP),
			// with its kubelet client certificate (ClientCAs).
			cfg.HTTPListenAddr = net.JoinHostPort(opts.NodeIP, strconv.Itoa(kubeletPort))
			cfg.Handler = mux
			// A kubelet resolves env itself; virtual-kubelet's resolver refuses
			// status.hostIP and status.podIP, which only the provider knows.
			cfg.SkipDownwardAPIResolution = true
			return nil
		},
	)
	if err != nil {
		return nil, nil, fmt.Errorf("process node %q: %w", opts.NodeName, err)
	}
	return n, provider, nil
}

// nodeSpec builds the Node that the node controller registers.
func nodeSpec(opts Options) corev1.Node {
	labels := map[string]string{
		"type":                   "virtual-kubelet",
		"kubernetes.io/hostname": opts.NodeName,
		"kubernetes.io/os":       runtime.GOOS,
		"kubernetes.io/arch":     runtime.GOARCH,
	}
	maps.Copy(labels, opts.Labels)
	capacity := DefaultCapacity()
	maps.Copy(capacity, opts.Capacity)
	now := metav1.Now()
	cond := func(t corev1.NodeConditionType, reason, message string) corev1.NodeCondition {
		return corev1.NodeCondition{
			Type: t, Status: corev1.ConditionFalse, Reason: reason, Message: message,
			LastHeartbeatTime: now, LastTransitionTime: now,
		}
	}
	return corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: opts.NodeName, Labels: labels},
		Spec:       corev1.NodeSpec{Taints: opts.Taints},
		Status: corev1.NodeStatus{
			Phase:       corev1.NodePending,
			Capacity:    capacity,
			Allocatable: capacity.DeepCopy(),
			Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeInternalIP, Address: opts.NodeIP},
				{Type: corev1.NodeHostName, Address: opts.NodeName},
			},
			DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: kubeletPort}},
			NodeInfo: corev1.NodeSystemInfo{
				OperatingSystem: runtime.GOOS,
				Architecture:    runtime.GOARCH,
				KubeletVersion:  "v1.37.2-etjob-processnode",
			},
			Conditions: []corev1.NodeCondition{
				cond(corev1.NodeReady, "KubeletNotReady", "pod controller starting"),
				cond(corev1.NodeMemoryPressure, "KubeletHasSufficientMemory", "process node"),
				cond(corev1.NodeDiskPressure, "KubeletHasNoDiskPressure", "process node"),
				cond(corev1.NodePIDPressure, "KubeletHasSufficientPID", "process node"),
				cond(corev1.NodeNetworkUnavailable, "RouteCreated", "pods use loopback addresses"),
			},
		},
	}
}

// Run registers the process node, serves its pods until ctx ends, then stops
// every pod process (SIGTERM, SIGKILL after the grace period) before it
// returns, so that no process outlives a node that was asked to stop.
func Run(ctx context.Context, opts Options) error {
	n, provider, err := NewNode(opts)
	if err != nil {
		return err
	}
	runErr := n.Run(ctx)
	stopCtx, cancel := context.WithTimeout(context.Background(), maxGracePeriod+5*time.Second)
	defer cancel()
	provider.Shutdown(stopCtx, maxGracePeriod)
	if ctx.Err() != nil {
		return nil
	}
	return runErr
}

// ParseLabels parses "k=v,k2=v2" (the --labels flag) into a map and checks
// each key and value as the API server would.
func ParseLabels(s string) (map[string]string, error) {
	labels := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("label %q is not key=value", kv)
		}
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return nil, fmt.Errorf("label key %q: %s", k, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return nil, fmt.Errorf("label %q value %q: %s", k, v, strings.Join(errs, "; "))
		}
		labels[k] = v
	}
	return labels, nil
}

// ParseTaints parses taints as a kubelet's --register-with-taints takes
// them: key[=value]:Effect, comma-separated.
func ParseTaints(s string) ([]corev1.Taint, error) {
	var out []corev1.Taint
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		kv, effect, ok := strings.Cut(item, ":")
		if !ok {
			return nil, fmt.Errorf("taint %q: want key[=value]:Effect", item)
		}
		switch e := corev1.TaintEffect(effect); e {
		case corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
		default:
			return nil, fmt.Errorf("taint %q: effect %q is not NoSchedule, PreferNoSchedule or NoExecute", item, effect)
		}
		key, value, _ := strings.Cut(kv, "=")
		if key == "" {
			return nil, fmt.Errorf("taint %q: no key", item)
		}
		out = append(out, corev1.Taint{Key: key, Value: value, Effect: corev1.TaintEffect(effect)})
	}
	return out, nil
}
