package agent

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"math/big"
	"testing"
	"time"
)

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// jws signs claims as a compact JWS with key (RS256 or ES256) under kid.
func jws(t *testing.T, key crypto.Signer, kid string) string {
	t.Helper()
	alg := "RS256"
	if _, ok := key.(*ecdsa.PrivateKey); ok {
		alg = "ES256"
	}
	head, _ := json.Marshal(map[string]string{"alg": alg, "kid": kid})
	signed := b64(head) + "." + b64([]byte(`{"sub":"system:serviceaccount:ml:default"}`))
	sum := sha256.Sum256([]byte(signed))
	var sig []byte
	switch k := key.(type) {
	case *rsa.PrivateKey:
		s, err := rsa.SignPKCS1v15(rand.Reader, k, crypto.SHA256, sum[:])
		if err != nil {
			t.Fatal(err)
		}
		sig = s
	case *ecdsa.PrivateKey:
		r, s, err := ecdsa.Sign(rand.Reader, k, sum[:])
		if err != nil {
			t.Fatal(err)
		}
		sig = append(r.FillBytes(make([]byte, 32)), s.FillBytes(make([]byte, 32))...)
	}
	return signed + "." + b64(sig)
}

func jwksOf(rsaKey *rsa.PrivateKey, ecKey *ecdsa.PrivateKey) []byte {
	keys := []map[string]string{
		{"kty": "RSA", "kid": "r1", "alg": "RS256", "use": "sig", "n": b64(rsaKey.N.Bytes()), "e": b64(big.NewInt(int64(rsaKey.E)).Bytes())},
		{"kty": "EC", "kid": "e1", "crv": "P-256", "x": b64(ecKey.X.FillBytes(make([]byte, 32))), "y": b64(ecKey.Y.FillBytes(make([]byte, 32)))},
	}
	b, _ := json.Marshal(map[string]any{"keys": keys})
	return b
}

// TestIssuerKeys (N5): a token signed by the issuer's RSA or EC key
// verifies; a forged signature, another key or an unknown key id do not; an
// unknown key id refetches the set at most every refetchEvery; a cluster
// that serves no keys leaves the check to the TokenReview.
func TestIssuerKeys(t *testing.T) {
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	other, _ := rsa.GenerateKey(rand.Reader, 2048)
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	fetches := 0
	keys := &IssuerKeys{now: func() time.Time { return now }, fetch: func(context.Context) ([]byte, error) {
		fetches++
		return jwksOf(rsaKey, ecKey), nil
	}}
	ctx := context.Background()
	good := jws(t, rsaKey, "r1")
	for name, tok := range map[string]string{"RS256": good, "ES256": jws(t, ecKey, "e1")} {
		if err := keys.Verify(ctx, tok); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	bad := map[string]string{
		"forged signature":   good[:len(good)-8] + "AAAAAAAA",
		"another key":        jws(t, other, "r1"),
		"an unknown key id":  jws(t, other, "r9"),
		"not a JWT":          "junk",
		"the EC key, as RSA": jws(t, rsaKey, "e1"),
		// issue #42 (low): the classic confusions. alg "none" with no
		// signature, and HS256 keyed with the issuer's public key (which
		// anyone can fetch) over the same claims
		"alg none":                unsigned("none", "r1", ""),
		"alg none, empty sig":     unsigned("none", "r1", "."),
		"HS256 with the RSA key":  hs256(rsaKey.N.Bytes(), "r1"),
		"HS256 with the JWKS doc": hs256(jwksOf(rsaKey, ecKey), "r1"),
	}
	for name, tok := range bad {
		if err := keys.Verify(ctx, tok); !errors.Is(err, ErrBadSignature) {
			t.Errorf("%s: %v, want ErrBadSignature", name, err)
		}
	}
	if fetches != 1 {
		t.Errorf("%d fetches of the key set, want 1 (the unknown key id within %s of the first)", fetches, refetchEvery)
	}
	now = now.Add(refetchEvery)
	_ = keys.Verify(ctx, jws(t, other, "r9"))
	if fetches != 2 {
		t.Errorf("%d fetches, want 2 (an unknown key id after %s: the issuer may have rotated)", fetches, refetchEvery)
	}

	none := &IssuerKeys{now: time.Now, fetch: func(context.Context) ([]byte, error) { return nil, errors.New("404 page not found") }}
	if err := none.Verify(ctx, jws(t, other, "r1")); err != nil {
		t.Errorf("no key set served: %v, want nil (the TokenReview decides)", err)
	}
	if none.Err() == nil {
		t.Error("no key set served: Err() is nil, want the fetch's error (the agent logs it)")
	}
}

// unsigned is a JWS whose header says alg over the test's claims, with
// tail (no signature, or an empty one) after them.
func unsigned(alg, kid, tail string) string {
	head, _ := json.Marshal(map[string]string{"alg": alg, "kid": kid})
	return b64(head) + "." + b64([]byte(`{"sub":"system:serviceaccount:ml:default"}`)) + tail
}

// hs256 is a JWS over the test's claims with an HMAC-SHA256 keyed with key:
// what a forger makes of a public key when a verifier trusts the header's
// alg.
func hs256(key []byte, kid string) string {
	signed := unsigned("HS256", kid, "")
	m := hmac.New(sha256.New, key)
	m.Write([]byte(signed))
	return signed + "." + b64(m.Sum(nil))
}
