// Command kubectl-etjob is the etjob CLI as a kubectl plugin: installed on
// PATH as kubectl-etjob, it runs as `kubectl etjob ...` and its help says so.
// Wiring only: the same commands as cmd/etjob.
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
