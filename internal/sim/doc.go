// Package sim is etjob's trace simulator: a discrete-event replay of a spot
// availability trace (the repository's traces/) that drives the same
// core.Decide(Snapshot, now) Plan as the controller.
//
// The cluster model holds the job, its pods and the nodes. The trace adds
// and removes spot nodes; a removal at T is the node gone at T, its notice
// arrives a provider's window earlier as the node agent would mark it (the
// reclaim-deadline annotation and the reclaiming taint). After every change
// the controller loop runs: Decide on a snapshot, then its plan applied the way
// the controller, the scheduler and the kubelets would (pods created, bound to
// free untainted spot nodes, ready after a start delay; deletions; leave
// signals as annotations; graceful exits with the reserved code), again until
// a plan changes nothing, and at every RequeueAfter.
//
// A training model on top follows the membership Decide publishes. Every
// change restarts torchrun; etjob stops at an agreed step and checkpoints
// first, so a noticed loss costs a checkpoint and a resume pause and loses no
// work, while a worker that dies before that checkpoint is written (no notice,
// a notice shorter than the stop and the checkpoint, or a pod deleted too
// early) is a hard loss: the work since the last completed checkpoint is
// rolled back and the survivors restart after the hard-loss pause. With
// Params.Recovery in-process (etjob.elastic) a planned change is a regroup
// in the same processes without a checkpoint, a joiner's state comes by
// broadcast, and a hard loss does the step in flight again. Beside it
// run the checkpoint-restart baselines (a classic fixed-size job at its best
// size in hindsight, and two elastic ones that restart at the size
// available) and an all-on-demand job under the same samples-per-worker
// model, so the ratios between them are honest.
//
// Everything is deterministic and reads no clock: the same trace and
// parameters give the same results.
package sim
