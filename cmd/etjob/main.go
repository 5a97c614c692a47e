// Command etjob is the etjob CLI (also usable as `kubectl etjob` when
// installed as kubectl-etjob): wiring only.
package main

import (
	"os"

	"github.com/etjob/etjob/internal/cli"
)

// version is set at build time (-X main.version=...).
var version = "dev"

func main() {
	cli.Version = version
	os.Exit(cli.Main())
}
