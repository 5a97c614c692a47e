package localcluster

import (
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/client-go/kubernetes"
	certutil "k8s.io/client-go/util/cert"
)

// TestKubeconfigCA: a cluster brought up again in the same directory, by
// the same process, is reached with the new API server's CA. With the CA
// file's path in the kubeconfig, client-go's transport cache (keyed by that
// path, the file read again every 5 minutes) kept the first server's CA:
// "x509: certificate signed by unknown authority" (go test -count=5 of one
// story failed so at its 4th run). Two TLS test servers stand in for the
// two API servers.
func TestKubeconfigCA(t *testing.T) {
	c := &Cluster{Dir: t.TempDir()}
	if err := os.MkdirAll(c.path("pki"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		// a CA and serving certificate of its own, as kube-apiserver makes them
		crt, key, err := certutil.GenerateSelfSignedCertKey("127.0.0.1", []net.IP{net.ParseIP("127.0.0.1")}, nil)
		if err != nil {
			t.Fatal(err)
		}
		pair, err := tls.X509KeyPair(crt, key)
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"major":"1","minor":"37","gitVersion":"v1.37.0"}`))
		}))
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
		srv.StartTLS()
		if err := os.WriteFile(filepath.Join(c.Dir, "pki", "apiserver.crt"), crt, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := c.writeKubeconfig(srv.URL, "token"); err != nil {
			t.Fatal(err)
		}
		cfg, err := c.RESTConfig()
		if err != nil {
			t.Fatal(err)
		}
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cs.Discovery().ServerVersion(); err != nil {
			t.Fatalf("cluster %d, its CA at the same path: %v", i+1, err)
		}
		srv.Close()
	}
}
