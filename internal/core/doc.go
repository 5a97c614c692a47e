// Package core is etjob's pure decision core: Decide(snapshot, now) -> Plan,
// and DecideScale for ScaleOut and ScaleIn requests.
//
// It reads no clock, does no I/O and holds no client: the controller, the trace
// simulator and the tests all drive these same functions with what they
// observed. Everything that is a decision (is this exit a preemption? who
// leaves on a scale-in? is the job below min?) is made here and nowhere else.
//
// What is where (each policy file has its own _test.go; hosts.go is tested
// through horovod_test.go):
//
//   - snapshot.go: the input, Snapshot{Job, Pods, Nodes, ...}, and how each pod
//     is classified; plan.go: the output, Plan, Signal, Event.
//   - decide.go: Decide, the decision type, its primitives, the one order of
//     the steps, and build: the one place that makes the Plan and writes the
//     status, from what the policies decided (build_test.go holds that).
//   - launcher.go: the launcher, its move, a lost store, horovodrun's start.
//   - horovod.go: Horovod's host sets (a change never leaves horovodrun without
//     a host of its last set; which launcher exits are a release).
//   - hosts.go: the host:slots entries of Horovod's discovery.
//   - failures.go: failures, preemptions, backoffLimit, restarts.
//   - leaving.go: workers told to leave, their grace, the notice's lead time.
//   - completion.go: completion, activeDeadlineSeconds, cleanup and TTL.
//   - suspend.go: spec.suspend.
//   - scaling.go: the job's own desired size; growth.go: extra workers above
//     it under spec.growth.
//   - price.go: spec.spot.maxPricePerHour and budgetPerHour, node prices
//     under the admin's price table.
//   - heartbeat.go: members seen stuck or split by their heartbeats.
//   - membership.go: the membership elected, published once a pass, and recorded; join batching.
//   - capacity.go: below minReplicas (the agreed stop, waiting for capacity).
//   - status.go: conditions and the status summary; cost.go: the bill,
//     status.cost.
//   - scale.go: DecideScale, the ScaleOut and ScaleIn requests.
package core
