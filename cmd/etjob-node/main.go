// Command etjob-node runs one process node: a virtual-kubelet node whose pods
// run as host processes (internal/localcluster/processnode). `etjob cluster`
// runs the same code as `etjob internal node`; this binary is for running a
// node by hand. Wiring only.
package main

import (
	"os"

	"github.com/etjob/etjob/internal/localcluster"
)

func main() {
	os.Exit(localcluster.NodeMain(os.Args[1:]))
}
