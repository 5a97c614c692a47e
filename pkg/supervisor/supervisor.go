// Package supervisor gives Go training programs the same contract as the
// Python worker library's etjob.supervisor (a drop-in for Alibaba's kubeai
// Job-Supervisor): ask this pod's node agent what it must do, stop at a step
// boundary when told, and exit with the reserved code.
//
//	sup := supervisor.Init()
//	for step := start; ; step++ {
//		if !sup.CheckAlive() {
//			saveCheckpoint(step)
//			sup.ExitPreempted() // exit code 75: a preemption, never a failure
//		}
//		train(step)
//	}
//
// Start polls the agent ($ETJOB_AGENT_ADDR, node-local) every ~100 ms in the
// background, proving who the pod is with its projected service-account token;
// CheckAlive reads that cache and costs nothing. A SIGTERM (the pod is being
// deleted: the last resort) also makes CheckAlive false instead of killing the
// process, so the step in flight finishes and a checkpoint can be written.
// Without an agent it degrades to the SIGTERM fallback alone and says so once.
//
// The package uses the standard library only; the node agent serves the same
// wire types (Signal, Progress).
package supervisor

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ExitCodePreempted is the reserved exit code of a worker that stops because
// it was told to (EX_TEMPFAIL). The controller counts it as a preemption and
// never as a failure; it is not 0, which Horovod would take for the end of the
// job.
const ExitCodePreempted = 75

// TokenPath is where Kubernetes mounts the pod's service-account token. It is
// sent to the agent only where Options.TokenPath or $ETJOB_AGENT_TOKEN_PATH
// names it (an agent run with --token-audiences="").
const TokenPath = "/var/run/secrets/kubernetes.io/serviceaccount/token"

// Actions the agent answers on GET /v1/signal.
const (
	// ActionNone: go on training.
	ActionNone = "none"
	// ActionCheckpoint: an early warning (AWS rebalance, GCP maintenance):
	// checkpoint now, keep training.
	ActionCheckpoint = "checkpoint"
	// ActionLeave: checkpoint at the agreed step and stop.
	ActionLeave = "leave"
)

// Signal is the node agent's answer on GET /v1/signal.
type Signal struct {
	// Action is "none", "checkpoint" or "leave".
	Action string `json:"action"`
	// Reason says why: ReclaimNotice(<source>), the controller's leave
	// reason, or EarlyWarning(<source>).
	Reason string `json:"reason"`
	// Deadline is when the node goes (RFC 3339), or empty.
	Deadline string `json:"deadline"`
	// Source is the provider or taint behind the notice, or "controller".
	Source string `json:"source"`
	// StopAt (RFC 3339), on a leave, is when to stop: until then the worker
	// trains through its notice. Empty: stop at the next step.
	StopAt string `json:"stopAt,omitempty"`
}

// Progress is a worker's training progress, POSTed to /v1/progress.
type Progress struct {
	// Step is the last completed training step.
	Step int64 `json:"step"`
	// CheckpointStep is the step of the last committed checkpoint.
	CheckpointStep int64 `json:"checkpointStep"`
	// CheckpointPath is where that checkpoint is.
	CheckpointPath string `json:"checkpointPath"`
	// SamplesPerSecond is the worker's recent throughput.
	SamplesPerSecond float64 `json:"samplesPerSecond"`
	// Workers is the number of workers (the world size) SamplesPerSecond
	// was measured with; 0: not said.
	Workers int32 `json:"workers,omitempty"`
	// CheckpointSeconds is how long writing that checkpoint took.
	CheckpointSeconds float64 `json:"checkpointSeconds,omitempty"`
}

// Options configure a Supervisor; the zero value reads the environment the
// controller gives every worker.
type Options struct {
	// AgentAddr is the node agent's host:port or URL ($ETJOB_AGENT_ADDR).
	AgentAddr string
	// Namespace and Pod name this pod ($ETJOB_NAMESPACE, $ETJOB_POD_NAME or
	// $HOSTNAME).
	Namespace, Pod string
	// TokenPath is the pod's token for the agent ($ETJOB_AGENT_TOKEN_PATH;
	// the projected agent-audience token etjob mounts). Empty: none is sent.
	TokenPath string
	// Interval between polls (100 ms).
	Interval time.Duration
	// NoSIGTERM leaves SIGTERM alone (by default it turns into a stop).
	NoSIGTERM bool
	// Log receives the few messages worth a line (stderr by default).
	Log func(msg string)
	// Client is the HTTP client (a 1 s timeout by default).
	Client *http.Client
	// Exit ends the process (os.Exit by default); tests replace it.
	Exit func(code int)
	// Now is the clock (time.Now by default); tests replace it.
	Now func() time.Time
}

// Supervisor tracks what the node agent says about one pod, and SIGTERM.
type Supervisor struct {
	opts Options
	mu   sync.Mutex
	sig  Signal
	term bool
	// pending: a checkpoint was asked for (an early warning, a notice this
	// worker trains through) and ShouldCheckpoint has not said so yet.
	pending bool
	warned  map[string]bool
	start   sync.Once
	stop    context.CancelFunc
	// beat is what Beat said last; calls counts CheckAlive (the step of a
	// program that says nothing more).
	beat  *[3]int64
	calls int64
}

// The environment the controller gives a worker (api/v1alpha1's contract.go
// owns the names; this package imports only the standard library, so its
// tests hold these copies equal to it).
const (
	EnvAgentAddr       = "ETJOB_AGENT_ADDR"
	EnvNamespace       = "ETJOB_NAMESPACE"
	EnvPodName         = "ETJOB_POD_NAME"
	EnvAgentTokenPath  = "ETJOB_AGENT_TOKEN_PATH"
	EnvRendezvousRound = "ETJOB_RDZV_ROUND"
)

// New returns a Supervisor; Start begins polling.
func New(o Options) *Supervisor {
	env := func(v, key string) string {
		if v != "" {
			return v
		}
		return os.Getenv(key)
	}
	o.AgentAddr = env(o.AgentAddr, EnvAgentAddr)
	o.Namespace = env(o.Namespace, EnvNamespace)
	if o.Namespace == "" {
		o.Namespace = "default"
	}
	o.Pod = env(env(o.Pod, EnvPodName), "HOSTNAME")
	if o.TokenPath == "" {
		// The pod's token for the agent's audience. Without one no token is
		// sent: the pod's API token (TokenPath) goes over the agent's plain
		// HTTP only where ETJOB_AGENT_TOKEN_PATH names it (L3).
		o.TokenPath = os.Getenv(EnvAgentTokenPath)
	}
	if o.Interval <= 0 {
		o.Interval = 100 * time.Millisecond
	}
	if o.Log == nil {
		o.Log = func(msg string) { fmt.Fprintln(os.Stderr, "etjob.supervisor: "+msg) }
	}
	if o.Client == nil {
		o.Client = &http.Client{Timeout: time.Second}
	}
	if o.Exit == nil {
		o.Exit = os.Exit
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.AgentAddr != "" && !strings.Contains(o.AgentAddr, "://") {
		o.AgentAddr = "http://" + o.AgentAddr
	}
	return &Supervisor{opts: o, sig: Signal{Action: ActionNone}, warned: map[string]bool{}}
}

// Start installs the SIGTERM fallback and polls the agent in the background
// until ctx ends or Close is called. It is idempotent and returns s.
func (s *Supervisor) Start(ctx context.Context) *Supervisor {
	s.start.Do(func() {
		ctx, s.stop = context.WithCancel(ctx)
		if !s.opts.NoSIGTERM {
			ch := make(chan os.Signal, 1)
			signal.Notify(ch, syscall.SIGTERM)
			go func() {
				defer signal.Stop(ch)
				select {
				case <-ch:
					s.OnSIGTERM()
				case <-ctx.Done():
				}
			}()
		}
		if s.opts.AgentAddr == "" {
			s.warnOnce("no-agent", EnvAgentAddr+" is not set: only SIGTERM will stop this worker")
			return
		}
		go func() {
			t := time.NewTicker(s.opts.Interval)
			defer t.Stop()
			for {
				_ = s.PollOnce(ctx)
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
			}
		}()
	})
	return s
}

// Close stops polling.
func (s *Supervisor) Close() {
	if s.stop != nil {
		s.stop()
	}
}

// CheckAlive is false once this worker must checkpoint and stop
// (kubeai.check_alive()). A worker on a noticed node that the controller
// lets train through the notice stays alive until the signal's StopAt.
// Called once a step, it also counts the steps of the worker's heartbeat.
func (s *Supervisor) CheckAlive() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	return !s.term && !s.stopping()
}

// Beat says this worker's training step, world size and round; the next
// poll of the node agent carries them, and the controller sees from them a
// member that stopped advancing or trains apart (a split). Without it, the
// heartbeat is the number of CheckAlive calls, $WORLD_SIZE and
// $ETJOB_RDZV_ROUND.
func (s *Supervisor) Beat(step int64, world int32, round int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.beat = &[3]int64{step, int64(world), round}
}

// heartbeat is the query a poll carries: none before a step.
func (s *Supervisor) heartbeat() url.Values {
	s.mu.Lock()
	b, calls := s.beat, s.calls
	s.mu.Unlock()
	if b == nil {
		if calls == 0 {
			return nil
		}
		world, err1 := strconv.ParseInt(cmp.Or(os.Getenv("WORLD_SIZE"), "1"), 10, 32)
		round, err2 := strconv.ParseInt(cmp.Or(os.Getenv(EnvRendezvousRound), "0"), 10, 64)
		if err1 != nil || err2 != nil {
			return nil
		}
		b = &[3]int64{calls, world, round}
	}
	return url.Values{"step": {strconv.FormatInt(b[0], 10)}, "world": {strconv.FormatInt(b[1], 10)}, "round": {strconv.FormatInt(b[2], 10)}}
}

// stopping: told to leave, and its stop time (if any) has come.
func (s *Supervisor) stopping() bool {
	if s.sig.Action != ActionLeave {
		return false
	}
	at, err := time.Parse(time.RFC3339, s.sig.StopAt)
	return err != nil || !s.opts.Now().Before(at)
}

// ShouldCheckpoint is true when a checkpoint is wanted now: once for each
// early warning or notice this worker trains through (the first answer after
// none), and always while it stops.
func (s *Supervisor) ShouldCheckpoint() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.term || s.stopping() {
		return true
	}
	p := s.pending
	s.pending = false
	return p
}

// StopAt is when this worker stops training through its notice, if it does.
func (s *Supervisor) StopAt() (time.Time, bool) {
	s.mu.Lock()
	d := s.sig.StopAt
	s.mu.Unlock()
	t, err := time.Parse(time.RFC3339, d)
	return t, err == nil
}

// Deadline is when this worker's node goes, if the notice says.
func (s *Supervisor) Deadline() (time.Time, bool) {
	s.mu.Lock()
	d := s.sig.Deadline
	s.mu.Unlock()
	t, err := time.Parse(time.RFC3339, d)
	return t, err == nil
}

// Reason says why this worker must stop or checkpoint ("" while it may go on).
func (s *Supervisor) Reason() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.term {
		return "SIGTERM"
	}
	if s.sig.Action == ActionNone {
		return ""
	}
	return s.sig.Reason
}

// ExitPreempted ends the process with ExitCodePreempted.
func (s *Supervisor) ExitPreempted() {
	_ = os.Stdout.Sync()
	_ = os.Stderr.Sync()
	s.opts.Exit(ExitCodePreempted)
}

// OnSIGTERM records a SIGTERM as if it had arrived (Start installs it).
func (s *Supervisor) OnSIGTERM() {
	s.mu.Lock()
	first := !s.term
	s.term = true
	s.mu.Unlock()
	if first {
		s.opts.Log(fmt.Sprintf("SIGTERM: finishing the step, then checkpoint and exit %d", ExitCodePreempted))
	}
}

// PollOnce asks the agent once and updates the cached signal. On an error the
// last answer stays (the agent may be restarting).
func (s *Supervisor) PollOnce(ctx context.Context) error {
	req, err := s.request(ctx, http.MethodGet, "/v1/signal", nil)
	if err == nil {
		if hb := s.heartbeat(); hb != nil {
			q := req.URL.Query()
			for k, v := range hb {
				q[k] = v
			}
			req.URL.RawQuery = q.Encode()
		}
	}
	if err != nil {
		return err
	}
	resp, err := s.opts.Client.Do(req)
	if err != nil {
		s.warnOnce("poll", fmt.Sprintf("asking the node agent at %s failed: %v", s.opts.AgentAddr, err))
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		err := fmt.Errorf("GET /v1/signal: %s: %s", resp.Status, strings.TrimSpace(string(body)))
		s.warnOnce("status-"+resp.Status, err.Error())
		return err
	}
	var got Signal
	if err := json.Unmarshal(body, &got); err != nil || (got.Action != ActionNone && got.Action != ActionCheckpoint && got.Action != ActionLeave) {
		err := fmt.Errorf("the node agent answered %q, not a signal", body)
		s.warnOnce("bad-answer", err.Error())
		return err
	}
	s.mu.Lock()
	if s.sig.Action == ActionLeave && got.Action != ActionLeave {
		// A leave stands: the ranks are already stopping at an agreed
		// step, and a restarted agent may not know the notice yet.
		s.mu.Unlock()
		return nil
	}
	changed := got.Action != s.sig.Action || got.StopAt != s.sig.StopAt
	if s.sig.Action == ActionNone && got.Action != ActionNone {
		s.pending = true
	}
	s.sig = got
	s.mu.Unlock()
	if changed && got.Action != ActionNone {
		msg := fmt.Sprintf("node agent says %s (%s, deadline %s)", got.Action, got.Reason, got.Deadline)
		if got.StopAt != "" {
			msg += ": training on until " + got.StopAt
		}
		s.opts.Log(msg)
	}
	return nil
}

// ReportProgress tells the node agent how far this worker got and its last
// checkpoint; the agent publishes new checkpoints on the pod and the
// controller shows the newest in status.lastCheckpoint.
func (s *Supervisor) ReportProgress(ctx context.Context, p Progress) error {
	if s.opts.AgentAddr == "" {
		return fmt.Errorf("%s is not set", EnvAgentAddr)
	}
	body, err := json.Marshal(p)
	if err != nil {
		return err
	}
	req, err := s.request(ctx, http.MethodPost, "/v1/progress", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.opts.Client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		return fmt.Errorf("POST /v1/progress: %s: %s", resp.Status, strings.TrimSpace(string(msg)))
	}
	return nil
}

func (s *Supervisor) request(ctx context.Context, method, path string, body io.Reader) (*http.Request, error) {
	q := url.Values{"namespace": {s.opts.Namespace}, "pod": {s.opts.Pod}}
	req, err := http.NewRequestWithContext(ctx, method, s.opts.AgentAddr+path+"?"+q.Encode(), body)
	if err != nil {
		return nil, err
	}
	if s.opts.TokenPath == "" {
		return req, nil
	}
	if tok, err := os.ReadFile(s.opts.TokenPath); err == nil {
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	}
	return req, nil
}

func (s *Supervisor) warnOnce(key, msg string) {
	s.mu.Lock()
	seen := s.warned[key]
	s.warned[key] = true
	s.mu.Unlock()
	if !seen {
		s.opts.Log(msg)
	}
}

var (
	defaultOnce sync.Once
	defaultSup  *Supervisor
)

// Init starts the process-wide Supervisor from the environment
// (kubeai.init()) and returns it.
func Init() *Supervisor {
	defaultOnce.Do(func() { defaultSup = New(Options{}).Start(context.Background()) })
	return defaultSup
}

// CheckAlive is Init().CheckAlive() (kubeai.check_alive()).
func CheckAlive() bool { return Init().CheckAlive() }

// ShouldCheckpoint is Init().ShouldCheckpoint().
func ShouldCheckpoint() bool { return Init().ShouldCheckpoint() }

// ExitPreempted is Init().ExitPreempted().
func ExitPreempted() { Init().ExitPreempted() }
