// Command etjob-agent is the etjob node agent, one per node (a DaemonSet):
// it reads the node's reclamation notices, marks the Node, and serves the
// pods on the node their signals (internal/agent). Wiring only.
package main

import (
	"os"

	"github.com/etjob/etjob/internal/agent"
)

func main() {
	os.Exit(agent.Main(os.Args[1:]))
}
