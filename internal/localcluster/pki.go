package localcluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"time"
)

// The kubelet API's client authentication: a CA of the cluster's own
// (pki/kubelet-ca.crt), which every process node trusts for its callers
// (etjob-node --client-ca-file), and the one certificate it signed, the API
// server's (--kubelet-client-certificate). `kubectl logs` and `exec`
// through the API server work; anything else that reaches a node's address
// is refused.
func (c *Cluster) kubeletCA() string         { return c.path("pki", "kubelet-ca.crt") }
func (c *Cluster) kubeletClientCert() string { return c.path("pki", "kubelet-client.crt") }
func (c *Cluster) kubeletClientKey() string  { return c.path("pki", "kubelet-client.key") }

// ensureKubeletPKI creates the kubelet CA and the API server's client
// certificate once.
func (c *Cluster) ensureKubeletPKI() error {
	if _, err := os.Stat(c.kubeletClientKey()); err == nil {
		return nil
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "etjob-local kubelet client CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(10, 0, 0),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, IsCA: true, BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	client := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}},
		NotBefore:    now.Add(-time.Hour), NotAfter: now.AddDate(10, 0, 0),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, client, caCert, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	for path, block := range map[string]*pem.Block{
		c.kubeletCA():         {Type: "CERTIFICATE", Bytes: caDER},
		c.kubeletClientCert(): {Type: "CERTIFICATE", Bytes: der},
	} {
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o644); err != nil {
			return fmt.Errorf("writing %s: %w", path, err)
		}
	}
	// The key last: its presence says the set is complete.
	return os.WriteFile(c.kubeletClientKey(), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)
}
