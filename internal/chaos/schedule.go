// Package chaos runs a bounded, seeded chaos schedule against the local
// cluster with real torchrun training (issue #6): noticed reclaims from every
// cloud, bursts (one below minReplicas), hard losses, joins, a loss during a
// reconfiguration, a withdrawn notice, and restarts of the etjob controller,
// a node agent and the kube-apiserver, the kube-apiserver down for
// APIServerDown in the middle of a scale-out, and the launcher's pod (the
// rendezvous store) deleted as a lost node's pod is. Faults fire on training progress or on
// the job's membership generation, never on wall time. A JSON-lines run
// record says what happened; the controller's decision record
// (--record-decisions) replays through core.Decide (Replay), so a failing
// run replays deterministically.
package chaos

import (
	"fmt"
	"math/rand/v2"
)

// Kinds of faults.
const (
	// KindNotice reclaims one member's node with a notice.
	KindNotice = "notice"
	// KindHard kills one member's node with no notice.
	KindHard = "hard"
	// KindBurst reclaims K members' nodes at once with a notice, leaving
	// the job at or above minReplicas.
	KindBurst = "burst"
	// KindBurstBelowMin removes the idle spot nodes, then reclaims K members'
	// nodes at once so that the job falls below minReplicas and waits; then
	// nodes are added until it resumes.
	KindBurstBelowMin = "burst-below-min"
	// KindReconfLoss reclaims one member's node, and a second one as soon as
	// the membership generation changed, before training resumed.
	KindReconfLoss = "reconf-loss"
	// KindCancel announces a reclamation and withdraws it before the deadline.
	KindCancel = "cancel"
	// KindRestartController restarts the etjob controller.
	KindRestartController = "restart-controller"
	// KindRestartAgent restarts the node agent of a member's node.
	KindRestartAgent = "restart-agent"
	// KindRestartAPIServer restarts the kube-apiserver.
	KindRestartAPIServer = "restart-apiserver"
	// KindAPIServerDownScaleOut scales the job out by one worker and stops
	// the kube-apiserver for APIServerDown once the new worker's pod exists,
	// then scales back in once the job trained at the larger size.
	KindAPIServerDownScaleOut = "apiserver-down-scale-out"
	// KindLauncherLost deletes the launcher's pod with no grace period, as
	// the pod garbage collector does once a lost node's object is gone: the
	// rendezvous store is lost, which is not a failure of the job.
	KindLauncherLost = "launcher-lost"
	// KindAddNode adds a spot node (capacity returning); it is no scheduled
	// step but follows losses, so that training can go on.
	KindAddNode = "add-node"
	// KindDrought removes an idle spot node with no notice (no member on
	// it) before the burst below min.
	KindDrought = "drought"
)

// Step is one scheduled fault.
type Step struct {
	Kind string `json:"kind"`
	// K is the number of nodes a burst takes.
	K int `json:"k,omitempty"`
	// Gap is how many training steps the fault waits for after the previous
	// one settled.
	Gap int `json:"gap"`
}

// Schedule returns the seeded schedule: every kind at least once (singles
// and hard losses several times), in a seeded order, the burst below min
// never first so that a loss has already happened, and seeded gaps of 6 to
// 14 steps.
func Schedule(seed int64) []Step {
	r := rand.New(rand.NewPCG(uint64(seed), 0x65746a6f62)) //nolint:gosec // a reproducible schedule, not a secret
	var steps []Step
	add := func(kind string, n, k int) {
		for range n {
			steps = append(steps, Step{Kind: kind, K: k})
		}
	}
	add(KindNotice, 6, 1)
	add(KindHard, 3, 1)
	add(KindBurst, 1, 2)
	add(KindBurstBelowMin, 1, 3)
	add(KindReconfLoss, 1, 2)
	add(KindCancel, 1, 1)
	add(KindRestartController, 1, 0)
	add(KindRestartAgent, 1, 0)
	add(KindRestartAPIServer, 1, 0)
	add(KindAPIServerDownScaleOut, 1, 0)
	add(KindLauncherLost, 1, 0)
	r.Shuffle(len(steps), func(i, j int) { steps[i], steps[j] = steps[j], steps[i] })
	if steps[0].Kind == KindBurstBelowMin {
		steps[0], steps[1] = steps[1], steps[0]
	}
	for i := range steps {
		steps[i].Gap = 6 + r.IntN(9)
		if steps[i].Kind == KindBurst {
			steps[i].K = 2 + r.IntN(2)
		}
	}
	return steps
}

// MembershipLosses is how many members' nodes the schedule takes.
func MembershipLosses(steps []Step) int {
	n := 0
	for _, s := range steps {
		if takesMembers(s.Kind) {
			n += max(s.K, 1)
		}
	}
	return n
}

// takesMembers reports whether a fault of kind takes members' nodes away.
func takesMembers(kind string) bool {
	switch kind {
	case KindNotice, KindHard, KindBurst, KindBurstBelowMin, KindReconfLoss:
		return true
	}
	return false
}

// String is the schedule in one line.
func String(steps []Step) string {
	out := ""
	for i, s := range steps {
		if i > 0 {
			out += " "
		}
		if s.K > 1 {
			out += fmt.Sprintf("%s(k=%d)", s.Kind, s.K)
		} else {
			out += s.Kind
		}
	}
	return out
}
