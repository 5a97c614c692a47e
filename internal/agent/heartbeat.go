package agent

import (
	"context"
	"encoding/json"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

const (
	// HeartbeatInterval is how often at most a pod's heartbeat annotation is
	// written while only its step advances (the controller's
	// core.HeartbeatStale allows for it).
	HeartbeatInterval = 30 * time.Second
	// HeartbeatMinInterval is how often at most it is written when the world
	// size or round changes.
	HeartbeatMinInterval = 5 * time.Second
)

// beat is what a worker says with each poll of GET /v1/signal (query
// parameters step, world and round; the worker library sends them on its
// own).
type beat struct {
	step  int64
	world int32
	round int64
}

// parseBeat reads a beat from a poll's query; ok is false when the worker
// sent none (a script that does not use the library's per-step calls) or a
// malformed one.
func parseBeat(q url.Values) (b beat, ok bool) {
	if q.Get("step") == "" {
		return b, false
	}
	step, err1 := strconv.ParseInt(q.Get("step"), 10, 64)
	world, err2 := strconv.ParseInt(q.Get("world"), 10, 32)
	round, err3 := strconv.ParseInt(q.Get("round"), 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || step < 0 || world < 0 {
		return b, false
	}
	return beat{step: step, world: int32(world), round: round}, true
}

// beatState is one pod's heartbeat as the agent knows it.
type beatState struct {
	ann        etjobv1.HeartbeatAnnotation
	published  time.Time // when ann was last written by this agent (zero: never)
	dirty      bool      // ann changed since it was written
	roundDirty bool      // its world or round did
}

// beats are the pods' heartbeats, published at a bounded rate.
type beats struct {
	mu    sync.Mutex
	byID  map[string]*beatState
	queue chan string // namespace/name of a pod whose annotation is due
}

// observe records a pod's beat at now and says whether its annotation is
// due: a first beat, a new world or round (at most every
// HeartbeatMinInterval), or a new step (at most every HeartbeatInterval).
// A step that stays the same writes nothing: the annotation's since then
// grows old, which is what the controller looks for. prev is the pod's
// annotation as the agent's cache holds it (a restarted agent keeps its
// since when the step is the same).
func (s *beats) observe(id string, b beat, now time.Time, prev string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byID == nil {
		s.byID = map[string]*beatState{}
	}
	st, ok := s.byID[id]
	if !ok {
		st = &beatState{}
		s.byID[id] = st
		if prev == "" || json.Unmarshal([]byte(prev), &st.ann) != nil {
			st.ann = etjobv1.HeartbeatAnnotation{Step: -1, World: -1}
		}
	}
	at := now.UTC().Format(time.RFC3339)
	if st.ann.World != b.world || st.ann.Round != b.round {
		st.ann.World, st.ann.Round, st.ann.RoundSince = b.world, b.round, at
		st.dirty, st.roundDirty = true, true
	}
	if st.ann.Step != b.step {
		st.ann.Step, st.ann.Since = b.step, at
		st.dirty = true
	}
	if !st.dirty {
		return false
	}
	wait := HeartbeatInterval
	if st.roundDirty {
		wait = HeartbeatMinInterval
	}
	return st.published.IsZero() || now.Sub(st.published) >= wait
}

// take returns a pod's annotation to write and marks it written at now.
func (s *beats) take(id string, now time.Time) (etjobv1.HeartbeatAnnotation, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.byID[id]
	if !ok || !st.dirty {
		return etjobv1.HeartbeatAnnotation{}, false
	}
	st.dirty, st.roundDirty, st.published = false, false, now
	return st.ann, true
}

// keep drops the beats of every pod that live does not name.
func (s *beats) keep(live map[string]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	keepLive(s.byID, live)
}

// heartbeat records the beat a poll carried and queues its publication
// when due (one publisher: a worker cannot make the agent spawn writes).
func (a *Agent) heartbeat(pod *corev1.Pod, q url.Values) {
	b, ok := parseBeat(q)
	if !ok {
		return
	}
	id := pod.Namespace + "/" + pod.Name
	if !a.beats.observe(id, b, a.o.Now(), pod.Annotations[etjobv1.AnnotationHeartbeat]) {
		return
	}
	select {
	case a.beats.queue <- id:
	default: // queued already, or the publisher is behind: the next poll asks again
	}
}

// publishHeartbeats writes the queued pods' heartbeat annotations, one at a
// time, until ctx ends.
func (a *Agent) publishHeartbeats(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case id := <-a.beats.queue:
			ann, ok := a.beats.take(id, a.o.Now())
			if !ok {
				continue
			}
			ns, name, _ := strings.Cut(id, "/")
			val, _ := json.Marshal(ann)
			patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{etjobv1.AnnotationHeartbeat: string(val)}}})
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			if _, err := a.o.Client.CoreV1().Pods(ns).Patch(wctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
				a.log.Warn("publishing a heartbeat on its pod", "pod", id, "error", err)
			}
			cancel()
		}
	}
}
