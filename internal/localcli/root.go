// Package localcli is etjob-local, the developer's binary: a real
// single-machine cluster whose pods run as host processes (`cluster`), the
// spot demo (`demo`), seeded chaos (`chaos`) and the trace simulator (`sim`).
// It runs the real component binaries (etjob-controller, etjob-node,
// etjob-agent) found next to itself; the user's binary, etjob, stays a client
// of the API server (internal/cli).
package localcli

import (
	"fmt"
	"io"
	"os"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/etjob/etjob/internal/cli"
)

// Version is set by the binary.
var Version = "dev"

// NewRootCommand returns the etjob-local command.
func NewRootCommand(streams cli.IOStreams) *cobra.Command {
	root := &cobra.Command{
		Use:   "etjob-local",
		Short: "etjob on this machine: a local cluster of process nodes, the spot demo, chaos and the simulator",
		Long: `etjob on this machine, for trying and developing etjob: a real single-machine Kubernetes
cluster whose pods run as host processes, the spot demo and seeded chaos on it, and the
trace simulator. The cluster runs etjob-controller, etjob-node and etjob-agent from the
directory etjob-local is in (make build puts all of them in bin/). Jobs are driven with
the user's CLI, etjob, against the cluster's kubeconfig.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       Version,
	}
	root.SetIn(streams.In)
	root.SetOut(streams.Out)
	root.SetErr(streams.ErrOut)
	root.AddGroup(&cobra.Group{ID: "local", Title: "Local cluster:"}, &cobra.Group{ID: "offline", Title: "No cluster needed:"})
	for _, c := range []*cobra.Command{newClusterCommand(streams), newDemoCommand(streams), newChaosCommand(streams)} {
		c.GroupID = "local"
		root.AddCommand(c)
	}
	sim := newSimCommand(streams)
	sim.GroupID = "offline"
	root.AddCommand(sim)
	refuseUnknownSubcommands(root)
	return root
}

// refuseUnknownSubcommands makes every command below the root that only
// groups others (`cluster`) fail on a word that names none of them: cobra
// prints such a group's help and exits 0 for `etjob-local cluster delete`,
// which reads as done. The group alone still prints its help.
func refuseUnknownSubcommands(c *cobra.Command) {
	for _, sub := range c.Commands() {
		refuseUnknownSubcommands(sub)
	}
	if !c.HasParent() || !c.HasSubCommands() || c.Runnable() {
		return
	}
	c.Args = cobra.ArbitraryArgs
	c.RunE = func(c *cobra.Command, args []string) error {
		if len(args) == 0 {
			return c.Help()
		}
		return fmt.Errorf("unknown command %q for %q; see '%s --help'", args[0], c.CommandPath(), c.CommandPath())
	}
}

// Main runs the etjob-local command and returns its exit code.
func Main() int {
	// controller-runtime's clients log nothing the user needs; left unset,
	// it prints a warning with a stack into a command that runs 30 s.
	ctrllog.SetLogger(logr.Discard())
	streams := cli.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}
	if err := NewRootCommand(streams).Execute(); err != nil {
		_, _ = io.WriteString(streams.ErrOut, "error: "+err.Error()+"\n")
		return 1
	}
	return 0
}
