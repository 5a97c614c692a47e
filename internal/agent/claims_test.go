package agent

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestPlausibleFor: a token's claims are checked before any review (issue
// #42, M1): the pod and its UID, an expiry in the future, and one of the
// agent's audiences. Before, an expired token or one for another audience
// that the issuer signed went to a TokenReview.
func TestPlausibleFor(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	token := func(claims map[string]any) string {
		c := map[string]any{"kubernetes.io": map[string]any{"namespace": "ns", "pod": map[string]string{"name": "w-0", "uid": "u1"}}}
		for k, v := range claims {
			c[k] = v
		}
		b, _ := json.Marshal(c)
		return "eyJhbGciOiJSUzI1NiJ9." + base64.RawURLEncoding.EncodeToString(b) + ".c2ln"
	}
	agentAud := []string{"etjob-agent"}
	for _, c := range []struct {
		name      string
		claims    map[string]any
		audiences []string
		code      int
		says      string
	}{
		{name: "valid for the agent", claims: map[string]any{"exp": now.Add(time.Minute).Unix(), "aud": []string{"etjob-agent"}}, audiences: agentAud},
		{name: "aud as one string", claims: map[string]any{"exp": now.Add(time.Minute).Unix(), "aud": "etjob-agent"}, audiences: agentAud},
		{name: "expired", claims: map[string]any{"exp": now.Add(-time.Second).Unix(), "aud": "etjob-agent"}, audiences: agentAud,
			code: http.StatusUnauthorized, says: "expired"},
		{name: "no expiry", claims: map[string]any{"aud": "etjob-agent"}, audiences: agentAud, code: http.StatusUnauthorized, says: "no expiry"},
		{name: "the API server's audience", claims: map[string]any{"exp": now.Add(time.Hour).Unix(), "aud": []string{"https://kubernetes.default.svc"}},
			audiences: agentAud, code: http.StatusUnauthorized, says: "not the agent's audience"},
		{name: "any audience when the agent names none", claims: map[string]any{"exp": now.Add(time.Hour).Unix(), "aud": "api"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, err := plausibleFor(token(c.claims), "ns", "w-0", "u1", now, c.audiences)
			if code != c.code || (c.says == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), c.says) {
				t.Errorf("got %d %v, want %d %q", code, err, c.code, c.says)
			}
		})
	}
}
