// Command etjob-local runs etjob on this machine: the local cluster of
// process nodes, the spot demo, chaos and the simulator (internal/localcli).
// It starts etjob-controller, etjob-node and etjob-agent from its own
// directory. Wiring only.
package main

import (
	"os"

	"github.com/etjob/etjob/internal/localcli"
)

// version is set at build time (-X main.version=...).
var version = "dev"

func main() {
	localcli.Version = version
	os.Exit(localcli.Main())
}
