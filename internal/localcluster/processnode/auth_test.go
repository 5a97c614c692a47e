package processnode_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net/http"
	"testing"
	"time"

	"github.com/etjob/etjob/internal/localcluster/processnode"
	"github.com/etjob/etjob/internal/testutil"
)

// TestKubeletAPIAuthentication: with ClientCAs the node's kubelet API (logs,
// exec) serves only a caller whose client certificate those CAs signed;
// anyone else who reaches the address fails the TLS handshake.
func TestKubeletAPIAuthentication(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs, _ := startAPIServer(t)
	ca, caKey := testCA(t)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	startNode(ctx, cancel, t, processnode.Options{
		Client: cs, NodeName: "authn", NodeIP: "127.0.208.1", WorkDir: t.TempDir(), ClientCAs: pool,
	})
	get := func(certs ...tls.Certificate) error {
		c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
			InsecureSkipVerify: true, Certificates: certs}}} //nolint:gosec // the node's serving certificate is self-signed
		resp, err := c.Get("https://127.0.208.1:10250/containerLogs/ns/pod/main")
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	var lastErr error
	testutil.Eventually(t, 10*time.Second, "the kubelet API serves the signed caller", func() bool {
		lastErr = get(clientCert(t, ca, caKey))
		return lastErr == nil
	})
	if err := get(); err == nil {
		t.Error("a caller without a client certificate was served")
	}
	other, otherKey := testCA(t)
	if err := get(clientCert(t, other, otherKey)); err == nil {
		t.Error("a caller whose certificate another CA signed was served")
	}
}

func testCA(t *testing.T) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func clientCert(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver-kubelet-client"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
