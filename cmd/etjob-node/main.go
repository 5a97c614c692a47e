// Command etjob-node runs one process node: a virtual-kubelet node whose pods
// run as host processes (internal/localcluster/processnode). `etjob-local
// cluster` runs one per node. Wiring only.
package main

import (
	"os"

	"github.com/etjob/etjob/internal/localcluster/processnode"
)

func main() {
	os.Exit(processnode.Main(os.Args[1:]))
}
