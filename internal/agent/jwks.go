package agent

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	_ "crypto/sha256" // RS256, ES256
	_ "crypto/sha512" // RS384/512, ES384/512
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
)

// IssuerKeys verifies the signature of a service-account token against the
// keys the cluster's service-account issuer publishes (GET /openid/v1/jwks,
// readable by every service account through the default ClusterRole
// system:service-account-issuer-discovery), before the agent spends a
// TokenReview on it: a forged token, whatever pod it names, never reaches the
// review budget (docs/security.md, N5). The TokenReview still decides (a
// deleted pod's token verifies, and is refused there).
//
// Keys are fetched on first use and again, at most every refetchEvery, when a
// token names a key the set does not hold (the issuer rotated its keys). A
// cluster that does not serve its keys leaves the check to the review alone:
// Verify then returns nil, and the agent logs it once.
type IssuerKeys struct {
	fetch func(ctx context.Context) ([]byte, error)
	now   func() time.Time

	mu      sync.Mutex
	keys    map[string]crypto.PublicKey // by kid ("" for a key without one)
	fetched time.Time
	tried   bool
	err     error // the last fetch's error; nil once keys were read
}

const refetchEvery = 30 * time.Second

// ErrBadSignature: the token is not signed by the cluster's issuer.
var ErrBadSignature = errors.New("the token is not signed by this cluster's service-account issuer")

// NewIssuerKeys reads the issuer's keys through client's API server.
func NewIssuerKeys(client kubernetes.Interface, now func() time.Time) *IssuerKeys {
	if now == nil {
		now = time.Now
	}
	return &IssuerKeys{now: now, fetch: func(ctx context.Context) ([]byte, error) {
		return client.Discovery().RESTClient().Get().AbsPath("/openid/v1/jwks").DoRaw(ctx)
	}}
}

// Verify returns nil when token's signature verifies against one of the
// issuer's keys, or when the issuer's keys cannot be read (the review
// decides); ErrBadSignature otherwise.
func (k *IssuerKeys) Verify(ctx context.Context, token string) error {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return ErrBadSignature
	}
	var head struct {
		Alg string `json:"alg"`
		Kid string `json:"kid"`
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[0])
	if err != nil || json.Unmarshal(raw, &head) != nil {
		return ErrBadSignature
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		return ErrBadSignature
	}
	key, ok := k.key(ctx, head.Kid)
	if !ok {
		if k.unavailable() {
			return nil
		}
		return fmt.Errorf("%w (no key %q)", ErrBadSignature, head.Kid)
	}
	if !verifySignature(head.Alg, key, parts[0]+"."+parts[1], sig) {
		return ErrBadSignature
	}
	return nil
}

// unavailable: the issuer's keys were never read.
func (k *IssuerKeys) unavailable() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.keys == nil
}

// Err is the last fetch's error (nil once the keys were read).
func (k *IssuerKeys) Err() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.err
}

// key returns the key kid, fetching the set when it is not held and the
// last fetch is older than refetchEvery (or none was made).
func (k *IssuerKeys) key(ctx context.Context, kid string) (crypto.PublicKey, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if key, ok := k.keys[kid]; ok {
		return key, true
	}
	if k.tried && k.now().Sub(k.fetched) < refetchEvery {
		return nil, false
	}
	k.tried, k.fetched = true, k.now()
	body, err := k.fetch(ctx)
	if err == nil {
		var keys map[string]crypto.PublicKey
		if keys, err = parseJWKS(body); err == nil {
			k.keys, k.err = keys, nil
		}
	}
	if err != nil {
		k.err = fmt.Errorf("reading the service-account issuer's keys (/openid/v1/jwks): %w", err)
	}
	key, ok := k.keys[kid]
	return key, ok
}

// parseJWKS reads the RSA and EC keys of a JSON Web Key Set, by kid.
func parseJWKS(body []byte) (map[string]crypto.PublicKey, error) {
	var set struct {
		Keys []struct {
			Kty, Kid, Crv, N, E, X, Y string
		} `json:"keys"`
	}
	if err := json.Unmarshal(body, &set); err != nil {
		return nil, err
	}
	out := map[string]crypto.PublicKey{}
	num := func(s string) (*big.Int, error) {
		b, err := base64.RawURLEncoding.DecodeString(s)
		if err != nil || len(b) == 0 {
			return nil, fmt.Errorf("bad key number %q", s)
		}
		return new(big.Int).SetBytes(b), nil
	}
	for _, j := range set.Keys {
		switch j.Kty {
		case "RSA":
			n, err1 := num(j.N)
			e, err2 := num(j.E)
			if err := errors.Join(err1, err2); err != nil || !e.IsInt64() {
				return nil, fmt.Errorf("key %q: %v", j.Kid, err)
			}
			out[j.Kid] = &rsa.PublicKey{N: n, E: int(e.Int64())}
		case "EC":
			curves := map[string]elliptic.Curve{"P-256": elliptic.P256(), "P-384": elliptic.P384(), "P-521": elliptic.P521()}
			c, known := curves[j.Crv]
			x, err1 := num(j.X)
			y, err2 := num(j.Y)
			if err := errors.Join(err1, err2); err != nil || !known {
				return nil, fmt.Errorf("key %q: curve %q: %v", j.Kid, j.Crv, err)
			}
			out[j.Kid] = &ecdsa.PublicKey{Curve: c, X: x, Y: y}
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no RSA or EC key in the key set")
	}
	return out, nil
}

// verifySignature checks a JWS signature (RS256/384/512, ES256/384/512).
func verifySignature(alg string, key crypto.PublicKey, signed string, sig []byte) bool {
	hashes := map[string]crypto.Hash{"256": crypto.SHA256, "384": crypto.SHA384, "512": crypto.SHA512}
	if len(alg) != 5 {
		return false
	}
	h, ok := hashes[alg[2:]]
	if !ok {
		return false
	}
	d := h.New()
	d.Write([]byte(signed))
	sum := d.Sum(nil)
	switch pub := key.(type) {
	case *rsa.PublicKey:
		return alg[:2] == "RS" && rsa.VerifyPKCS1v15(pub, h, sum, sig) == nil
	case *ecdsa.PublicKey:
		size := (pub.Curve.Params().BitSize + 7) / 8
		if alg[:2] != "ES" || len(sig) != 2*size {
			return false
		}
		r, s := new(big.Int).SetBytes(sig[:size]), new(big.Int).SetBytes(sig[size:])
		return ecdsa.Verify(pub, sum, r, s)
	}
	return false
}
