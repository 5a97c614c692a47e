// Command etjob-controller runs the ElasticJob controller: wiring only.
package main

import (
	"os"

	"github.com/etjob/etjob/internal/controller"
)

// version is set at build time (-X main.version=...).
var version = "dev"

func main() {
	os.Exit(controller.Main(os.Args[1:], version))
}
