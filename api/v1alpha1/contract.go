package v1alpha1

// The worker contract: what the controller puts in a worker's and a
// launcher's environment, and what etjob's worker libraries read there. This
// file is its one owner. The Python library's python/etjob/contract.py is
// generated from it (`make generate`; TestPythonContract fails while it
// differs), and pkg/supervisor, which imports only the standard library, holds
// its copies equal in its tests. EnvAgentTokenPath (agent.go) and
// EnvStoreSecretFile (store.go) belong here too and stay beside their paths.
const (
	// EnvJobName and EnvNamespace name the pod's ElasticJob.
	EnvJobName   = "ETJOB_JOB_NAME"
	EnvNamespace = "ETJOB_NAMESPACE"
	// EnvWorkerIndex is a worker's index (its pod is <job>-worker-<index>).
	EnvWorkerIndex = "ETJOB_WORKER_INDEX"
	// EnvArenaWorkers is Arena's `workers`: spec.replicas when the pod was
	// made (a Horovod launcher's: its members). etjob.elastic's DataLoader
	// makes its global batch for that many ranks (the state then keeps it).
	EnvArenaWorkers = "workers"
	// EnvFramework is spec.framework (torchrun or horovod).
	EnvFramework = "ETJOB_FRAMEWORK"
	// EnvSlotsPerWorker is the processes a worker runs (its GPUs, or 1).
	EnvSlotsPerWorker = "ETJOB_SLOTS_PER_WORKER"
	// EnvLocalRank and EnvLocalWorldSize are torchrun's names, which
	// etjob.launch sets too: a rank's place among its pod's ranks and their
	// number (spec.slotsPerWorker). etjob.elastic keeps a pod's ranks
	// together: adjacent ranks, one failure domain.
	EnvLocalRank      = "LOCAL_RANK"
	EnvLocalWorldSize = "LOCAL_WORLD_SIZE"
	// EnvAttempt is status.restarts when the pod was made.
	EnvAttempt = "ETJOB_ATTEMPT"
	// EnvExitCodePreempted is ExitCodePreempted, the exit of a worker told
	// to stop.
	EnvExitCodePreempted = "ETJOB_EXIT_CODE_PREEMPTED"
	// EnvWorldSizes is spec.worldSizes, comma-separated, where set.
	EnvWorldSizes = "ETJOB_WORLD_SIZES"
	// EnvCheckpointDir is spec.checkpointDir, where set.
	EnvCheckpointDir = "ETJOB_CHECKPOINT_DIR"
	// EnvPodName, EnvPodIP and EnvNodeIP come from the downward API.
	EnvPodName = "ETJOB_POD_NAME"
	EnvPodIP   = "ETJOB_POD_IP"
	EnvNodeIP  = "ETJOB_NODE_IP"
	// EnvAgentAddr is the node agent's signal endpoint,
	// $(ETJOB_NODE_IP):AgentPort.
	EnvAgentAddr = "ETJOB_AGENT_ADDR"
	// EnvRendezvousEndpoint is the launcher's rendezvous store, host:port.
	EnvRendezvousEndpoint = "ETJOB_RDZV_ENDPOINT"
	// EnvRendezvousReplacement, in the launcher only, is
	// status.launcherReplacements: a replaced store (above 0) waits for the
	// members' re-seed before it admits a newcomer.
	EnvRendezvousReplacement = "ETJOB_RDZV_REPLACEMENT"
	// EnvRendezvousRound is the torchrun round a worker process belongs to,
	// set by etjob.torchrun for the processes it starts; the worker libraries
	// report it in their heartbeats.
	EnvRendezvousRound = "ETJOB_RDZV_ROUND"
)

// torchrun's own settings (its PET_ environment, torch.distributed.run's
// arguments), set by the controller in every torchrun worker.
const (
	EnvTorchrunNNodes          = "PET_NNODES"
	EnvTorchrunNProcPerNode    = "PET_NPROC_PER_NODE"
	EnvTorchrunRdzvBackend     = "PET_RDZV_BACKEND"
	EnvTorchrunRdzvEndpoint    = "PET_RDZV_ENDPOINT"
	EnvTorchrunRdzvID          = "PET_RDZV_ID"
	EnvTorchrunRdzvConf        = "PET_RDZV_CONF"
	EnvTorchrunMaxRestarts     = "PET_MAX_RESTARTS"
	EnvTorchrunMonitorInterval = "PET_MONITOR_INTERVAL"
)

// The worker libraries' own settings: the controller sets none of them; a pod
// template may, to tune etjob.elastic and etjob.torchrun (docs/worker-library.md
// documents those meant for users; EnvRendezvousID and EnvAgentPID are set by
// etjob's own tools). They are owned here with the rest of the contract so that
// every ETJOB_ name the libraries read has one definition.
const (
	// etjob.elastic's deadlines and pacing.
	EnvCollectiveTimeout      = "ETJOB_COLLECTIVE_TIMEOUT"
	EnvHeartbeatTimeout       = "ETJOB_HEARTBEAT_TIMEOUT"
	EnvMinBandwidthMbps       = "ETJOB_MIN_BANDWIDTH_MBPS"
	EnvSettleSeconds          = "ETJOB_SETTLE_SECONDS"
	EnvJoinTimeout            = "ETJOB_JOIN_TIMEOUT"
	EnvBelowMinSeconds        = "ETJOB_BELOW_MIN_SECONDS"
	EnvStaleSeconds           = "ETJOB_STALE_SECONDS"
	EnvStoreLossSeconds       = "ETJOB_STORE_LOSS_SECONDS"
	EnvReseedSeconds          = "ETJOB_RESEED_SECONDS"
	EnvStoreProbeSeconds      = "ETJOB_STORE_PROBE_SECONDS"
	EnvStoreSilenceSeconds    = "ETJOB_STORE_SILENCE_SECONDS"
	EnvCheckpointFlushSeconds = "ETJOB_CHECKPOINT_FLUSH_SECONDS"
	EnvSyncChunkMB            = "ETJOB_SYNC_CHUNK_MB"
	// EnvReplicaMismatch is what etjob.elastic does when its replica check
	// finds the ranks' states differ after the first commit: "fail" fails
	// the job; anything else (the default) says so loudly and every rank
	// takes rank 0's commit.
	EnvReplicaMismatch = "ETJOB_REPLICA_MISMATCH"
	// EnvReplicaCheckSteps is how often (in steps; 0: never) a vote (the
	// DDP API's) or a commit (the run API's) carries a digest of each
	// rank's model, compared across ranks.
	EnvReplicaCheckSteps = "ETJOB_REPLICA_CHECK_STEPS"
	// EnvShardedCheckpoints: "0" makes rank 0 write a checkpoint alone;
	// otherwise (the default) every rank writes its part and rank 0 the
	// manifest.
	EnvShardedCheckpoints = "ETJOB_SHARDED_CHECKPOINTS"
	// EnvRendezvousID names etjob.elastic's rendezvous where torchrun's
	// PET_RDZV_ID is not set (a job run by hand).
	EnvRendezvousID = "ETJOB_RDZV_ID"
	// etjob.torchrun's rendezvous polling and last-call grace.
	EnvRendezvousPollSeconds  = "ETJOB_RDZV_POLL_SECONDS"
	EnvRendezvousGraceSeconds = "ETJOB_RDZV_GRACE_SECONDS"
	// EnvWorkerStart is how etjob.torchrun starts workers (forkserver, the
	// default, or exec); EnvPreload adds modules its forkserver imports once
	// (comma-separated; the demo's driver sets it).
	EnvWorkerStart = "ETJOB_WORKER_START"
	EnvPreload     = "ETJOB_PRELOAD"
	// EnvAgentPID is set by etjob.torchrun for its forkserver: the agent's
	// pid, which the forkserver's workers watch.
	EnvAgentPID = "ETJOB_AGENT_PID"
)

// AgentPort is the port of the node agent's node-local signal endpoint (the
// chart's agent DaemonSet listens on it: a test of internal/chart holds the
// two equal).
const AgentPort = 9477
