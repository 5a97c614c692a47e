package v1alpha1

// How a torchrun job's pods prove to its rendezvous store (the launcher's
// etjob.rdzv) that they are the job's (issue #26, N1): the controller makes
// one Secret a job, named by core.StoreSecretName, whose StoreSecretKey is
// StoreSecretBytes random bytes (hex), and mounts it read-only at
// StoreSecretPath in the launcher and every worker, named by
// $ETJOB_STORE_SECRET_FILE. It is in no pod's environment: a token that can
// read pod specs (the node agents') learns only the Secret's name.
const (
	StoreSecretKey     = "secret"
	StoreSecretPath    = "/var/run/secrets/etjob.dev/store/secret"
	EnvStoreSecretFile = "ETJOB_STORE_SECRET_FILE"
	StoreSecretBytes   = 32
)
