package localcluster

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
)

// Ports of the local control plane (high, fixed, loopback only).
const (
	EtcdClientPort = 23790
	EtcdPeerPort   = 23800
	APIServerPort  = 26443
	SchedulerPort  = 20259
	KCMPort        = 20257
)

// StartControlPlane starts (or finds running) etcd, kube-apiserver,
// kube-scheduler and kube-controller-manager, writes the kubeconfig and
// installs the chart. It returns once the API server is ready; the chart's
// pods run once nodes join (WaitComponents).
func (c *Cluster) StartControlPlane(ctx context.Context) error {
	for _, d := range []string{"pki", "etcd", "logs", "pids", "nodes"} {
		if err := os.MkdirAll(c.path(d), 0o755); err != nil {
			return err
		}
	}
	token, err := c.ensureSecrets()
	if err != nil {
		return err
	}
	if err := c.ensureKubeletPKI(); err != nil {
		return err
	}
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", EtcdClientPort)
	if err := c.start("etcd", filepath.Join(c.BinDir, "etcd"),
		"--name=etjob", "--data-dir="+c.path("etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		fmt.Sprintf("--listen-peer-urls=http://127.0.0.1:%d", EtcdPeerPort),
		fmt.Sprintf("--initial-advertise-peer-urls=http://127.0.0.1:%d", EtcdPeerPort),
		fmt.Sprintf("--initial-cluster=etjob=http://127.0.0.1:%d", EtcdPeerPort),
		"--quota-backend-bytes=4294967296", "--log-level=warn",
	); err != nil {
		return err
	}
	if err := waitHTTP(ctx, etcdURL+"/health", "", 60*time.Second); err != nil {
		return fmt.Errorf("etcd did not become healthy (log: %s): %w", c.path("logs", "etcd.log"), err)
	}
	if err := c.start("kube-apiserver", filepath.Join(c.BinDir, "kube-apiserver"),
		"--etcd-servers="+etcdURL,
		fmt.Sprintf("--secure-port=%d", APIServerPort), "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		// v1.37 refuses a loopback advertise address with the default reconciler (it exits at start).
		"--endpoint-reconciler-type=none",
		"--cert-dir="+c.path("pki"),
		"--token-auth-file="+c.path("pki", "tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+c.path("pki", "sa.pub"),
		"--service-account-signing-key-file="+c.path("pki", "sa.key"),
		"--service-cluster-ip-range=10.96.0.0/16",
		"--allow-privileged=true",
		"--enable-priority-and-fairness=false",
		// Logs and exec go to a process node's kubelet API at its loopback
		// InternalIP, with the client certificate the nodes trust (pki.go);
		// with no --kubelet-certificate-authority the API server does not
		// verify the node's self-signed serving certificate.
		"--kubelet-preferred-address-types=InternalIP",
		"--kubelet-client-certificate="+c.kubeletClientCert(), "--kubelet-client-key="+c.kubeletClientKey(),
		// The EvictionRequest API (KEP-4563, alpha in 1.37): the objects are
		// served; 1.37's kube-controller-manager runs no controller for them.
		"--feature-gates=EvictionRequestAPI=true", "--runtime-config=lifecycle.k8s.io/v1alpha1=true",
		"--v=0",
	); err != nil {
		return err
	}
	server := fmt.Sprintf("https://127.0.0.1:%d", APIServerPort)
	if err := waitHTTP(ctx, server+"/readyz", token, 120*time.Second); err != nil {
		return fmt.Errorf("kube-apiserver did not become ready (log: %s): %w", c.path("logs", "kube-apiserver.log"), err)
	}
	if err := c.writeKubeconfig(server, token); err != nil {
		return err
	}
	kc := "--kubeconfig=" + c.Kubeconfig()
	if err := c.start("kube-scheduler", filepath.Join(c.BinDir, "kube-scheduler"), kc,
		"--leader-elect=false", "--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", SchedulerPort)); err != nil {
		return err
	}
	if err := c.start("kube-controller-manager", filepath.Join(c.BinDir, "kube-controller-manager"), kc,
		"--leader-elect=false", "--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", KCMPort),
		"--service-account-private-key-file="+c.path("pki", "sa.key"),
		"--root-ca-file="+c.path("pki", "apiserver.crt"),
		"--use-service-account-credentials=false",
		// Nodes without heartbeats for 40 s go NotReady, as on a real cluster;
		// process nodes keep real leases.
		"--controllers=*,-nodeipam,-kube-apiserver-serving-clustertrustbundle-publisher-controller",
		"--feature-gates=EvictionRequestAPI=true",
	); err != nil {
		return err
	}
	return c.installChart(ctx)
}

// RestartComponent restarts one named component of the cluster, as a
// crash-looping or upgraded one would be: etjob-controller (its leading
// pod, RestartController) and agent-<node> (that node's agent pod,
// RestartAgent) are pods; any other name is a process as Components names
// it (kube-apiserver, node-<node>, ...), stopped with SIGTERM and started
// again with the same command line. The kube-apiserver is waited for until
// ready.
func (c *Cluster) RestartComponent(ctx context.Context, name string) error {
	return c.RestartComponentAfter(ctx, name, 0)
}

// Component is a process of the cluster.
type Component struct {
	Name  string
	Pid   int
	Alive bool
	Log   string
}

// Components lists the cluster's processes and whether they run.
func (c *Cluster) Components() []Component {
	files, _ := filepath.Glob(c.path("pids", "*.pid"))
	sort.Strings(files)
	var out []Component
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".pid")
		pid := readPid(f)
		out = append(out, Component{Name: name, Pid: pid, Alive: alive(pid), Log: c.path("logs", name+".log")})
	}
	return out
}

func (c *Cluster) running() []string {
	var out []string
	for _, comp := range c.Components() {
		if comp.Alive {
			out = append(out, comp.Name)
		}
	}
	return out
}

// ensureSecrets creates the service-account key pair and the admin token once.
func (c *Cluster) ensureSecrets() (string, error) {
	tokens := c.path("pki", "tokens.csv")
	if b, err := os.ReadFile(tokens); err == nil {
		return strings.SplitN(string(b), ",", 2)[0], nil
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(c.path("pki", "sa.key"), pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return "", err
	}
	if err := os.WriteFile(c.path("pki", "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644); err != nil {
		return "", err
	}
	raw := make([]byte, 24)
	if _, err := rand.Read(raw); err != nil {
		return "", err
	}
	token := hex.EncodeToString(raw)
	return token, os.WriteFile(tokens, []byte(token+",admin,admin,system:masters\n"), 0o600)
}

// writeKubeconfig writes the admin kubeconfig. The API server's CA goes in as data, not as its file's path: client-go
// (v0.37, ClientsAllowCARotation) caches a transport by the CA file's path
// and reads the file again only every 5 minutes, so a process that brought
// a cluster up again in the same directory (go test -count=N of one story)
// kept the last cluster's CA: "x509: certificate signed by unknown
// authority" from the new cluster's own API server (TestKubeconfigCA).
func (c *Cluster) writeKubeconfig(server, token string) error {
	pem, err := os.ReadFile(c.path("pki", "apiserver.crt"))
	if err != nil {
		return fmt.Errorf("the API server's certificate: %w", err)
	}
	ca := base64.StdEncoding.EncodeToString(pem)
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: etjob-local
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: admin
  user:
    token: %s
contexts:
- name: etjob-local
  context: {cluster: etjob-local, user: admin, namespace: default}
current-context: etjob-local
`, server, ca, token)
	return os.WriteFile(c.Kubeconfig(), []byte(kc), 0o600)
}

// waitHTTP polls url until it answers 200.
func waitHTTP(ctx context.Context, url, token string, timeout time.Duration) error {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // a readiness probe of our own loopback server
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("%s: %s", url, resp.Status)
		}
		last = err
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	return last
}

// Clientset returns a clientset for the cluster.
func (c *Cluster) Clientset() (*kubernetes.Clientset, error) {
	cfg, err := c.RESTConfig()
	if err != nil {
		return nil, fmt.Errorf("no cluster in %s (etjob-local cluster up): %w", c.Dir, err)
	}
	return kubernetes.NewForConfig(cfg)
}

// waitPortsFree waits until every port can be listened on at 127.0.0.1, up
// to limit, and names the first that cannot.
func waitPortsFree(ctx context.Context, limit time.Duration, ports ...int) error {
	deadline := time.Now().Add(limit)
	for _, port := range ports {
		for {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err == nil {
				l.Close()
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("port %d of the local control plane is still in use after %s: another local cluster runs on this machine "+
					"(etjob-local cluster down --dir DIR), or the last one's processes have not exited: %w", port, limit, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	return nil
}
