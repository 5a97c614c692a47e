package agent

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
	authnv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/pkg/supervisor"
)

// Extra keys of a TokenReview's user info for a token bound to a pod.
const (
	ExtraPodName = "authentication.kubernetes.io/pod-name"
	ExtraPodUID  = "authentication.kubernetes.io/pod-uid"
)

// Authenticator checks a bearer token and returns who it belongs to.
type Authenticator interface {
	// Authenticate returns the token's user, or ok false for a token the
	// API server does not accept.
	Authenticate(ctx context.Context, token string) (user authnv1.UserInfo, ok bool, err error)
}

// TokenReviewAuthenticator validates tokens with the TokenReview API and
// caches each answer, so that pods polling every ~100 ms cost one review per
// token per TTL. Reviews of tokens it has not seen are budgeted, in all and
// per pod (AuthenticateFor), so that a flood of forged tokens cannot starve
// the reviews of real ones: over budget it answers ErrReviewBudget, or the
// last positive answer for that token while it is at most StaleFor old.
type TokenReviewAuthenticator struct {
	client    kubernetes.Interface
	audiences []string
	ttl       time.Duration
	now       func() time.Time

	mu     sync.Mutex
	cache  map[[32]byte]reviewResult
	all    *rate.Limiter
	perPod map[string]*rate.Limiter
}

// Review budgets of a TokenReviewAuthenticator: in all, and per pod.
const (
	ReviewsPerSecond    = 20
	ReviewBurst         = 40
	PodReviewsPerSecond = 1
	PodReviewBurst      = 5
	staleFor            = 10 * time.Minute
	maxPodLimiters      = 4096
)

// ErrReviewBudget: a token the agent has not seen cannot be reviewed now;
// the caller retries (the agent answers 429 with Retry-After).
var ErrReviewBudget = errors.New("too many token reviews for this pod or node: retry shortly")

type reviewResult struct {
	user    authnv1.UserInfo
	ok      bool
	expires time.Time
}

// NewTokenReviewAuthenticator returns an authenticator that asks client's
// API server, for the given audiences (nil: the API server's own), and
// caches each answer for ttl.
func NewTokenReviewAuthenticator(client kubernetes.Interface, audiences []string, ttl time.Duration, now func() time.Time) *TokenReviewAuthenticator {
	if now == nil {
		now = time.Now
	}
	return &TokenReviewAuthenticator{client: client, audiences: audiences, ttl: ttl, now: now, cache: map[[32]byte]reviewResult{},
		all: rate.NewLimiter(ReviewsPerSecond, ReviewBurst), perPod: map[string]*rate.Limiter{}}
}

// Audiences are the audiences tokens are reviewed for (nil: the API
// server's own).
func (t *TokenReviewAuthenticator) Audiences() []string { return t.audiences }

// Authenticate reviews token, from the cache when it was reviewed within the TTL.
func (t *TokenReviewAuthenticator) Authenticate(ctx context.Context, token string) (authnv1.UserInfo, bool, error) {
	return t.AuthenticateFor(ctx, token, "")
}

// AuthenticateFor is Authenticate for a request that names pod (namespace/
// name; "" for none): a review it needs is charged to that pod's budget too.
func (t *TokenReviewAuthenticator) AuthenticateFor(ctx context.Context, token, pod string) (authnv1.UserInfo, bool, error) {
	key := sha256.Sum256([]byte(token))
	now := t.now()
	t.mu.Lock()
	r, hit := t.cache[key]
	allowed := hit && now.Before(r.expires)
	if !allowed {
		allowed = t.allow(pod)
		if !allowed {
			t.mu.Unlock()
			if hit && r.ok && now.Before(r.expires.Add(staleFor)) {
				return r.user, true, nil // the caller's pod and UID checks still apply
			}
			return authnv1.UserInfo{}, false, ErrReviewBudget
		}
		hit = false
	}
	t.mu.Unlock()
	if hit {
		return r.user, r.ok, nil
	}
	review, err := t.client.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{
		Spec: authnv1.TokenReviewSpec{Token: token, Audiences: t.audiences},
	}, metav1.CreateOptions{})
	if err != nil {
		return authnv1.UserInfo{}, false, fmt.Errorf("TokenReview: %w", err)
	}
	// with audiences asked for, the review answers those the token is valid
	// for: none of them is no authentication here (issue #42, low)
	forUs := len(t.audiences) == 0 || slices.ContainsFunc(review.Status.Audiences, func(a string) bool { return slices.Contains(t.audiences, a) })
	r = reviewResult{user: review.Status.User, ok: review.Status.Authenticated && review.Status.Error == "" && forUs, expires: now.Add(t.ttl)}
	t.mu.Lock()
	for k, old := range t.cache { // bounded: answers go once even a stale one is of no use
		if !now.Before(old.expires.Add(staleFor)) {
			delete(t.cache, k)
		}
	}
	t.cache[key] = r
	t.mu.Unlock()
	return r.user, r.ok, nil
}

// Progress is a worker's training progress, POSTed to /v1/progress.
type Progress = supervisor.Progress

// PodProgress is one pod's latest progress, as served on GET /v1/progress.
type PodProgress struct {
	Namespace string    `json:"namespace"`
	Pod       string    `json:"pod"`
	Received  time.Time `json:"received"`
	Progress
}

type progressStore struct {
	mu   sync.Mutex
	byID map[string]PodProgress
}

func (s *progressStore) put(p PodProgress) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byID == nil {
		s.byID = map[string]PodProgress{}
	}
	s.byID[p.Namespace+"/"+p.Pod] = p
}

// keep drops the progress of every pod that live does not name.
func (s *progressStore) keep(live map[string]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	keepLive(s.byID, live)
}

// keepLive deletes from byID every pod (namespace/name) that live does not name.
func keepLive[V any](byID map[string]V, live map[string]bool) {
	maps.DeleteFunc(byID, func(id string, _ V) bool { return !live[id] })
}

func (s *progressStore) get(ns, pod string) (PodProgress, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.byID[ns+"/"+pod]
	return p, ok
}

// Handler returns the node-local endpoint:
//
//	GET  /v1/signal?namespace=NS&pod=NAME    the pod's Signal
//	POST /v1/progress?namespace=NS&pod=NAME  store the pod's Progress
//	GET  /v1/progress                        every pod's latest progress
//	GET  /healthz                            liveness
//	GET  /readyz                             whether the agent knows its cloud (or none was chosen)
//
// Callers prove who they are with a service-account token bound to the pod
// they name (Authorization: Bearer), never by source IP: on the local
// cluster every pod connects from loopback.
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", a.serveReady)
	mux.HandleFunc("GET /v1/signal", a.serveSignal)
	mux.HandleFunc("POST /v1/progress", a.postProgress)
	mux.HandleFunc("GET /v1/progress", a.getProgress)
	return mux
}

func (a *Agent) serveSignal(w http.ResponseWriter, r *http.Request) {
	ns, name, ok := a.authorizePod(w, r)
	if !ok {
		return
	}
	pod, err := a.pods.Pods(ns).Get(name)
	if err != nil {
		httpError(w, http.StatusNotFound, fmt.Sprintf("pod %s/%s is not on node %s", ns, name, a.o.NodeName))
		return
	}
	a.heartbeat(pod, r.URL.Query())
	writeJSON(w, http.StatusOK, Decide(a.State(), pod.Annotations, a.o.Now()))
}

func (a *Agent) postProgress(w http.ResponseWriter, r *http.Request) {
	ns, name, ok := a.authorizePod(w, r)
	if !ok {
		return
	}
	var p Progress
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		httpError(w, http.StatusBadRequest, "progress body: "+err.Error()+` (want {"step": N, "checkpointStep": M, "checkpointPath": "...", "samplesPerSecond": x, "workers": W})`)
		return
	}
	prev, had := a.progress.get(ns, name)
	now := a.o.Now().UTC()
	a.progress.put(PodProgress{Namespace: ns, Pod: name, Received: now, Progress: p})
	if p.CheckpointStep > 0 && (!had || p.CheckpointStep != prev.CheckpointStep) {
		// One publisher goroutine: a worker cannot make the agent spawn
		// patches, and they never crowd out the Node markings.
		select {
		case a.publishQ <- PodProgress{Namespace: ns, Pod: name, Received: now, Progress: p}:
		default:
			a.log.Warn("checkpoint publications are queued up; dropping one", "pod", ns+"/"+name, "step", p.CheckpointStep)
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// publishCheckpoint copies a new checkpoint into the pod's
// etjob.dev/checkpoint annotation, where the controller reads it (one write
// per checkpoint the worker reports; the agent is the progress channel).
func (a *Agent) publishCheckpoint(ns, name string, p Progress, at time.Time) {
	val, _ := json.Marshal(etjobv1.CheckpointAnnotation{Step: p.CheckpointStep, Path: p.CheckpointPath, Time: at.Format(time.RFC3339), Seconds: p.CheckpointSeconds, SamplesPerSecond: p.SamplesPerSecond, Workers: p.Workers})
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{etjobv1.AnnotationCheckpoint: string(val)}}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := a.o.Client.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		a.log.Warn("publishing a checkpoint on its pod", "pod", ns+"/"+name, "error", err)
	}
}

// publishCheckpoints publishes the queued checkpoints, one at a time, until
// ctx ends.
func (a *Agent) publishCheckpoints(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case p := <-a.publishQ:
			a.publishCheckpoint(p.Namespace, p.Pod, p.Progress, p.Received)
		}
	}
}

// getProgress serves the calling pod its own progress (a list of at most
// one, GET /v1/progress?namespace=&pod=): never another pod's, whose
// checkpoint paths are its own business.
func (a *Agent) getProgress(w http.ResponseWriter, r *http.Request) {
	ns, name, ok := a.authorizePod(w, r)
	if !ok {
		return
	}
	out := []PodProgress{}
	if p, found := a.progress.get(ns, name); found {
		out = append(out, p)
	}
	writeJSON(w, http.StatusOK, out)
}

// authorizePod checks the request's token against the pod it names:
// 400 without namespace and pod, 401 without a valid token, 403 for a token
// of another pod.
func (a *Agent) authorizePod(w http.ResponseWriter, r *http.Request) (ns, name string, ok bool) {
	ns, name = r.URL.Query().Get("namespace"), r.URL.Query().Get("pod")
	if ns == "" || name == "" {
		httpError(w, http.StatusBadRequest, "query parameters namespace and pod are required")
		return "", "", false
	}
	if a.o.InsecureSkipPodAuth {
		return ns, name, true
	}
	// Only pods bound to this node, from the local cache, before any
	// TokenReview: a token of a pod elsewhere, of a made-up pod, or of a
	// deleted pod still in the review cache gets nothing here, and costs
	// no review (N5).
	uid := a.podUID(ns, name)
	if uid == "" {
		httpError(w, http.StatusForbidden, fmt.Sprintf("pod %s/%s is not on node %s", ns, name, a.o.NodeName))
		return "", "", false
	}
	user, ok := a.authenticate(w, r, ns, name, uid)
	if !ok {
		return "", "", false
	}
	if err := podClaimMatches(user, ns, name, uid); err != nil {
		httpError(w, http.StatusForbidden, err.Error())
		return "", "", false
	}
	if a.gate != nil {
		a.gate.trust(r, ns+"/"+name) // a worker's connection: never evicted, the usual idle timeout
	}
	return ns, name, true
}

func (a *Agent) podUID(ns, name string) string {
	if p, err := a.pods.Pods(ns).Get(name); err == nil {
		return string(p.UID)
	}
	return ""
}

// podClaimMatches checks that a token's user is a service account of
// namespace ns whose token is bound to pod name (with uid, when known).
func podClaimMatches(user authnv1.UserInfo, ns, name, uid string) error {
	if !strings.HasPrefix(user.Username, "system:serviceaccount:"+ns+":") {
		return fmt.Errorf("token of %q is not a service account of namespace %s", user.Username, ns)
	}
	pods := user.Extra[ExtraPodName]
	if len(pods) != 1 || pods[0] != name {
		return fmt.Errorf("token of %q is bound to pod %v, not %s/%s (use a projected service-account token of the pod itself)", user.Username, []string(pods), ns, name)
	}
	if uids := user.Extra[ExtraPodUID]; uid != "" && (len(uids) != 1 || uids[0] != uid) {
		return fmt.Errorf("token is bound to an earlier pod %s/%s (uid %v, now %s)", ns, name, []string(uids), uid)
	}
	return nil
}

// allow takes one review from the budget in all and pod's; t.mu is held.
func (t *TokenReviewAuthenticator) allow(pod string) bool {
	if pod != "" {
		l := t.perPod[pod]
		if l == nil {
			if len(t.perPod) >= maxPodLimiters {
				t.perPod = map[string]*rate.Limiter{} // bounded; a reset only refills budgets
			}
			l = rate.NewLimiter(PodReviewsPerSecond, PodReviewBurst)
			t.perPod[pod] = l
		}
		if !l.Allow() {
			return false
		}
	}
	return t.all.Allow()
}

// podAuthenticator is an Authenticator that budgets reviews per pod.
type podAuthenticator interface {
	AuthenticateFor(ctx context.Context, token, pod string) (authnv1.UserInfo, bool, error)
}

// tokenClaims are the claims of a pod-bound service-account token that the
// agent reads, unverified, before it spends a review on the token.
type tokenClaims struct {
	Exp        int64    `json:"exp"`
	Aud        audience `json:"aud"`
	Kubernetes struct {
		Namespace string `json:"namespace"`
		Pod       struct {
			Name string `json:"name"`
			UID  string `json:"uid"`
		} `json:"pod"`
	} `json:"kubernetes.io"`
}

// audience is a JWT's aud claim: one string or a list of them.
type audience []string

func (a *audience) UnmarshalJSON(b []byte) error {
	var one string
	if json.Unmarshal(b, &one) == nil {
		*a = audience{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return err
	}
	*a = many
	return nil
}

// plausibleFor checks, without verifying it, that token is a JWT whose
// claims name pod ns/name (pod "" for any) and, when uid is known, that pod's
// UID, that it has not expired at now, and that it is for one of audiences
// (when the agent names some): junk, tokens of other pods or of an earlier
// pod of that name, expired tokens and tokens for another audience (a pod's
// API token) are refused without a TokenReview (issue #42, M1). code is the
// HTTP status to answer.
func plausibleFor(token, ns, name, uid string, now time.Time, audiences []string) (code int, err error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return http.StatusUnauthorized, errors.New("the token is not a service-account token (a JWT)")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return http.StatusUnauthorized, errors.New("the token is not a service-account token (a JWT)")
	}
	var c tokenClaims
	if err := json.Unmarshal(payload, &c); err != nil {
		return http.StatusUnauthorized, errors.New("the token is not a service-account token (a JWT)")
	}
	if name != "" && (c.Kubernetes.Namespace != ns || c.Kubernetes.Pod.Name != name) {
		return http.StatusForbidden, fmt.Errorf("the token names pod %s/%s, not %s/%s (use a projected service-account token of the pod itself)",
			c.Kubernetes.Namespace, c.Kubernetes.Pod.Name, ns, name)
	}
	if uid != "" && c.Kubernetes.Pod.UID != uid {
		return http.StatusForbidden, fmt.Errorf("the token is bound to another pod %s/%s (uid %q, this one is %s)", ns, name, c.Kubernetes.Pod.UID, uid)
	}
	if c.Exp == 0 || !now.Before(time.Unix(c.Exp, 0)) {
		return http.StatusUnauthorized, fmt.Errorf("the token expired (exp %d) or has no expiry: use the pod's projected token, which the kubelet renews", c.Exp)
	}
	if len(audiences) > 0 && !slices.ContainsFunc(c.Aud, func(a string) bool { return slices.Contains(audiences, a) }) {
		return http.StatusUnauthorized, fmt.Errorf("the token is for %v, not the agent's audience %v (use the projected token at $ETJOB_AGENT_TOKEN_PATH)", []string(c.Aud), audiences)
	}
	return 0, nil
}

// audiencesOf are the audiences an Authenticator reviews tokens for (nil:
// any, or unknown).
func audiencesOf(a Authenticator) []string {
	if x, ok := a.(interface{ Audiences() []string }); ok {
		return x.Audiences()
	}
	return nil
}

// authenticate checks the request's token for pod ns/name (name "" for
// none) whose UID is uid ("" when unknown): its claims, then its signature
// against the issuer's keys, and only then a TokenReview (budgeted).
func (a *Agent) authenticate(w http.ResponseWriter, r *http.Request, ns, name, uid string) (authnv1.UserInfo, bool) {
	token, found := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	token = strings.TrimSpace(token)
	if !found || token == "" {
		w.Header().Set("WWW-Authenticate", `Bearer realm="etjob-agent"`)
		httpError(w, http.StatusUnauthorized, "Authorization: Bearer <service-account token> is required")
		return authnv1.UserInfo{}, false
	}
	if code, err := plausibleFor(token, ns, name, uid, a.o.Now(), audiencesOf(a.o.Authenticator)); err != nil {
		httpError(w, code, err.Error())
		return authnv1.UserInfo{}, false
	}
	if keys := a.o.IssuerKeys; keys != nil {
		if err := keys.Verify(r.Context(), token); err != nil {
			httpError(w, http.StatusUnauthorized, err.Error())
			return authnv1.UserInfo{}, false
		}
		if err := keys.Err(); err != nil && a.keysSaid.CompareAndSwap(false, true) {
			a.log.Error("token signatures are not checked before the TokenReview", "err", err)
		}
	}
	var (
		user authnv1.UserInfo
		ok   bool
		err  error
	)
	if pa, keyed := a.o.Authenticator.(podAuthenticator); keyed && name != "" {
		user, ok, err = pa.AuthenticateFor(r.Context(), token, ns+"/"+name)
	} else {
		user, ok, err = a.o.Authenticator.Authenticate(r.Context(), token)
	}
	if errors.Is(err, ErrReviewBudget) {
		w.Header().Set("Retry-After", "1")
		httpError(w, http.StatusTooManyRequests, err.Error())
		return authnv1.UserInfo{}, false
	}
	if err != nil {
		code := http.StatusServiceUnavailable
		if apierrors.IsForbidden(err) {
			code = http.StatusInternalServerError // the agent lacks RBAC for tokenreviews
		}
		a.log.Error("reviewing a pod token", "err", err)
		httpError(w, code, "cannot verify the token: "+err.Error())
		return authnv1.UserInfo{}, false
	}
	if !ok {
		httpError(w, http.StatusUnauthorized, "the token is not valid")
		return authnv1.UserInfo{}, false
	}
	return user, true
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func httpError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": msg})
}
