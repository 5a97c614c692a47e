// Package emucloud is the emulated cloud: an instance metadata service, one
// http.Handler that serves the reclamation-notice paths of Alibaba ECS, AWS
// (IMDSv2), GCP and Azure (Scheduled Events) at once, with the headers and
// session tokens the real services require, and the local market's spot
// price. It is a test double: tests use it, and the local cluster gives each
// process node one so that a notice can be sent to a node. No package that
// ships in the controller, the agent or the user's binaries imports it (a
// wall of hack/walls); what it serves is owned by its readers, the agent's
// notice and price packages.
//
// The paths served are only those the node agent reads (and the identity
// paths its auto-detection probes). Alibaba and AWS share /latest/meta-data/:
// the Alibaba paths (instance/spot/termination-time, instance-id) need no
// token, the AWS notice paths need an IMDSv2 token.
package emucloud

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/etjob/etjob/internal/agent/notice"
	"github.com/etjob/etjob/internal/agent/price"
)

// Provider names accepted by SetReclaim and SetEarlyWarning: the agent's.
const (
	Alibaba = notice.ProviderAlibaba
	AWS     = notice.ProviderAWS
	GCP     = notice.ProviderGCP
	Azure   = notice.ProviderAzure
)

// DefaultVMName is the VM name Azure events name unless Server.VMName is set.
const DefaultVMName = "etjob-vm"

// maxTokenTTL is the IMDSv2 limit on a session token's lifetime (6 hours).
const maxTokenTTL = 21600

type kind int

const (
	none kind = iota
	earlyWarning
	reclaim
)

type state struct {
	kind     kind
	deadline time.Time
	since    time.Time
	eventID  string
}

// Server is the emulated metadata service. The zero value is not usable;
// call New.
type Server struct {
	// VMName is this VM's name in Azure's events and instance document.
	VMName string
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Only, when set, is the one provider whose paths are served, as on a
	// real VM (the others answer 404), so that an agent's auto-detection
	// finds that provider; empty serves all four.
	Only string

	mu          sync.Mutex
	states      map[string]state
	tokens      map[string]time.Time
	acks        []string
	incarnation int
	eventSeq    int
	generation  int
	changed     chan struct{}
	spotPrice   string
}

// New returns an emulator with no notice on any provider.
func New() *Server {
	return &Server{VMName: DefaultVMName, states: map[string]state{}, tokens: map[string]time.Time{}, incarnation: 1, changed: make(chan struct{})}
}

// SetReclaim makes provider announce that the instance is reclaimed at
// deadline: Alibaba's termination-time, AWS's spot instance-action
// (terminate), GCP's preempted=TRUE (GCP announces no time) and an Azure
// Preempt event with NotBefore = deadline. It panics on an unknown provider.
func (s *Server) SetReclaim(provider string, deadline time.Time) {
	s.set(provider, state{kind: reclaim, deadline: deadline.UTC().Truncate(time.Second)})
}

// SetEarlyWarning makes provider announce an early warning: AWS's rebalance
// recommendation, GCP's MIGRATE_ON_HOST_MAINTENANCE and an Azure Freeze
// event. Alibaba ECS has no early warning: it clears Alibaba's notice. It
// panics on an unknown provider.
func (s *Server) SetEarlyWarning(provider string) {
	s.set(provider, state{kind: earlyWarning})
}

// SpotPrice is the path of the emulated market's price feed
// (price.LocalMarketPath, where the agent reads it): this instance's current
// spot price in US dollars an hour, as text (404 until SetSpotPrice). No
// cloud serves a price from its metadata service; the local cluster's
// emulated clouds do, so that a price feed (the agent's price.Local) has
// something to read.
const SpotPrice = price.LocalMarketPath

// SetSpotPrice sets the price the feed answers ("" withdraws it).
func (s *Server) SetSpotPrice(price string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.spotPrice = price
}

func (s *Server) serveSpotPrice(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	s.mu.Lock()
	p := s.spotPrice
	s.mu.Unlock()
	if p == "" {
		http.NotFound(w, r)
		return
	}
	fmt.Fprint(w, p)
}

// Clear withdraws every provider's notice.
func (s *Server) Clear() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.states) > 0 {
		s.states = map[string]state{}
		s.bumpLocked()
	}
}

// Acks returns the Azure event ids acknowledged so far (StartRequests).
func (s *Server) Acks() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.acks)
}

// RevokeTokens invalidates every IMDSv2 session token, as a metadata service
// restart does: clients get 401 until they fetch a new one.
func (s *Server) RevokeTokens() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tokens = map[string]time.Time{}
}

func (s *Server) set(provider string, st state) {
	switch provider {
	case Alibaba, AWS, GCP, Azure:
	default:
		panic(fmt.Sprintf("emucloud: unknown provider %q (want alibaba, aws, gcp or azure)", provider))
	}
	if provider == Alibaba && st.kind == earlyWarning {
		st = state{}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st.since = s.now()
	if provider == Azure && st.kind != none {
		s.eventSeq++
		st.eventID = fmt.Sprintf("emulated-event-%04d", s.eventSeq)
	}
	s.states[provider] = st
	s.bumpLocked()
}

func (s *Server) bumpLocked() {
	s.incarnation++
	s.generation++
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *Server) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func (s *Server) get(provider string) state {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.states[provider]
}

// ServeHTTP serves the providers' paths (all four, or Only's).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	var provider string
	var serve func(http.ResponseWriter, *http.Request)
	switch {
	case p == SpotPrice:
		s.serveSpotPrice(w, r)
		return
	case p == "/latest/meta-data/instance-id" && s.Only == AWS:
		provider, serve = AWS, s.serveAWS // an AWS-only VM: IMDSv2 asks for its token here too
	case p == "/latest/meta-data/instance-id" || p == "/latest/meta-data/instance/spot/termination-time":
		provider, serve = Alibaba, s.serveAlibaba
	case strings.HasPrefix(p, "/latest/"):
		provider, serve = AWS, s.serveAWS
	case strings.HasPrefix(p, "/computeMetadata/"):
		provider, serve = GCP, s.serveGCP
	case strings.HasPrefix(p, "/metadata/"):
		provider, serve = Azure, s.serveAzure
	}
	if serve == nil || (s.Only != "" && provider != s.Only) {
		http.NotFound(w, r)
		return
	}
	serve(w, r)
}

func (s *Server) serveAlibaba(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if r.URL.Path == "/latest/meta-data/instance-id" {
		fmt.Fprint(w, "i-emulated0000000000")
		return
	}
	st := s.get(Alibaba)
	if st.kind != reclaim {
		http.NotFound(w, r)
		return
	}
	fmt.Fprint(w, st.deadline.Format("2006-01-02T15:04:05Z"))
}

// serveAWS behaves as IMDSv2 with tokens required (HttpTokens=required):
// a GET without a valid token gets 401.
func (s *Server) serveAWS(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/latest/api/token" {
		if r.Method != http.MethodPut {
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		if r.Header.Get("X-Forwarded-For") != "" {
			http.Error(w, "forbidden", http.StatusForbidden)
			return
		}
		ttl, err := strconv.Atoi(r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds"))
		if err != nil || ttl < 1 || ttl > maxTokenTTL {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		b := make([]byte, 24)
		_, _ = rand.Read(b)
		tok := hex.EncodeToString(b)
		s.mu.Lock()
		s.tokens[tok] = s.now().Add(time.Duration(ttl) * time.Second)
		s.mu.Unlock()
		w.Header().Set("X-aws-ec2-metadata-token-ttl-seconds", strconv.Itoa(ttl))
		fmt.Fprint(w, tok)
		return
	}
	if r.Method != http.MethodGet {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	s.mu.Lock()
	exp, ok := s.tokens[r.Header.Get("X-aws-ec2-metadata-token")]
	valid := ok && s.now().Before(exp)
	s.mu.Unlock()
	if !valid {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	st := s.get(AWS)
	switch r.URL.Path {
	case "/latest/meta-data/spot/instance-action":
		if st.kind != reclaim {
			http.NotFound(w, r)
			return
		}
		writeJSON(w, map[string]string{"action": "terminate", "time": st.deadline.Format("2006-01-02T15:04:05Z")})
	case "/latest/meta-data/events/recommendations/rebalance":
		if st.kind != earlyWarning {
			http.NotFound(w, r)
			return
		}
		writeJSON(w, map[string]string{"noticeTime": st.since.UTC().Format("2006-01-02T15:04:05Z")})
	default:
		http.NotFound(w, r)
	}
}

// maxWait bounds a GCP wait_for_change request, as the real server does.
const maxWait = 5 * time.Minute

// serveGCP requires Metadata-Flavor: Google (403 without, as the real server)
// and supports ?wait_for_change=true with timeout_sec and last_etag.
func (s *Server) serveGCP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Metadata-Flavor", "Google")
	if r.Header.Get("Metadata-Flavor") != "Google" || r.Header.Get("X-Forwarded-For") != "" {
		http.Error(w, "Missing Metadata-Flavor:Google header.", http.StatusForbidden)
		return
	}
	if r.Method != http.MethodGet {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	q := r.URL.Query()
	if q.Get("wait_for_change") == "true" {
		s.mu.Lock()
		etag, changed := strconv.Itoa(s.generation), s.changed
		s.mu.Unlock()
		if last := q.Get("last_etag"); last == "" || last == etag {
			wait := maxWait
			if sec, err := strconv.Atoi(q.Get("timeout_sec")); err == nil && sec > 0 && time.Duration(sec)*time.Second < wait {
				wait = time.Duration(sec) * time.Second
			}
			t := time.NewTimer(wait)
			select {
			case <-changed:
			case <-t.C:
			case <-r.Context().Done():
			}
			t.Stop()
		}
	}
	s.mu.Lock()
	w.Header().Set("ETag", strconv.Itoa(s.generation))
	st := s.states[GCP]
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/text")
	switch r.URL.Path {
	case "/computeMetadata/v1/instance/id":
		fmt.Fprint(w, "4520031799277581759")
	case "/computeMetadata/v1/instance/preempted":
		fmt.Fprint(w, map[bool]string{true: "TRUE", false: "FALSE"}[st.kind == reclaim])
	case "/computeMetadata/v1/instance/maintenance-event":
		fmt.Fprint(w, map[bool]string{true: "MIGRATE_ON_HOST_MAINTENANCE", false: "NONE"}[st.kind == earlyWarning])
	default:
		http.NotFound(w, r)
	}
}

// serveAzure requires Metadata: true and an api-version; the real IMDS
// answers 400 Bad Request without them (not 401/403), and so does this one.
func (s *Server) serveAzure(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Metadata") != "true" {
		writeJSONStatus(w, http.StatusBadRequest, map[string]string{"error": "Bad request. Required metadata header not specified"})
		return
	}
	if r.URL.Query().Get("api-version") == "" {
		writeJSONStatus(w, http.StatusBadRequest, map[string]string{"error": "Bad request. api-version was not specified in the request"})
		return
	}
	switch r.URL.Path {
	case "/metadata/instance":
		writeJSON(w, map[string]any{"compute": map[string]string{"name": s.VMName, "azEnvironment": "AzurePublicCloud"}})
	case "/metadata/scheduledevents":
		switch r.Method {
		case http.MethodGet:
			s.serveAzureEvents(w)
		case http.MethodPost:
			s.ackAzure(w, r)
		default:
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		}
	default:
		http.NotFound(w, r)
	}
}

func (s *Server) serveAzureEvents(w http.ResponseWriter) {
	s.mu.Lock()
	st, inc, vm := s.states[Azure], s.incarnation, s.VMName
	s.mu.Unlock()
	// Azure's event: the fields the agent reads (notice.AzureEvent) and
	// those a real VM's document also carries.
	type event struct {
		notice.AzureEvent
		Description       string `json:"Description"`
		EventSource       string `json:"EventSource"`
		DurationInSeconds int    `json:"DurationInSeconds"`
	}
	events := []event{}
	switch st.kind {
	case reclaim:
		events = append(events, event{AzureEvent: notice.AzureEvent{EventID: st.eventID, EventType: "Preempt", ResourceType: "VirtualMachine",
			Resources: []string{vm}, EventStatus: "Scheduled", NotBefore: st.deadline.Format(http.TimeFormat)}, EventSource: "Platform", DurationInSeconds: -1})
	case earlyWarning:
		events = append(events, event{AzureEvent: notice.AzureEvent{EventID: st.eventID, EventType: "Freeze", ResourceType: "VirtualMachine",
			Resources: []string{vm}, EventStatus: "Scheduled", NotBefore: st.since.Add(15 * time.Minute).UTC().Format(http.TimeFormat)},
			Description: "Host server is undergoing maintenance.", EventSource: "Platform", DurationInSeconds: 9})
	}
	writeJSON(w, map[string]any{"DocumentIncarnation": inc, "Events": events})
}

func (s *Server) ackAzure(w http.ResponseWriter, r *http.Request) {
	var body struct {
		StartRequests []struct {
			EventID string `json:"EventId"`
		} `json:"StartRequests"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || len(body.StartRequests) == 0 {
		writeJSONStatus(w, http.StatusBadRequest, map[string]string{"error": "Bad request. StartRequests with EventId required"})
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sr := range body.StartRequests {
		s.acks = append(s.acks, sr.EventID)
	}
	w.WriteHeader(http.StatusOK)
}

func writeJSON(w http.ResponseWriter, v any) { writeJSONStatus(w, http.StatusOK, v) }

func writeJSONStatus(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
