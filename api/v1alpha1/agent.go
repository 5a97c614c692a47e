package v1alpha1

// How a worker proves who it is to its node's agent: a projected
// service-account token of its own pod for the audience AgentTokenAudience,
// short-lived, mounted at AgentTokenPath (its path also in
// $ETJOB_AGENT_TOKEN_PATH). The agent reviews tokens for that audience
// only, so a token that leaks on the node-local hop is good for nothing
// else: the API server refuses it.
const (
	AgentTokenAudience = "etjob-agent"
	AgentTokenPath     = "/var/run/secrets/etjob.dev/agent/token"
	EnvAgentTokenPath  = "ETJOB_AGENT_TOKEN_PATH"
	// AgentTokenSeconds is the token's lifetime; the kubelet renews it at 80%.
	AgentTokenSeconds = 600
)
