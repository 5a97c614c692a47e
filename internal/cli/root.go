// Package cli is the etjob command line: Arena's etjob verbs (issue #5) and
// the local cluster (`etjob cluster ...`). Commands follow kubectl's
// Options{Complete, Validate, Run} shape.
package cli

import (
	"io"
	"os"

	"github.com/spf13/cobra"
)

// Version is set by the binary.
var Version = "dev"

// IOStreams are the command's standard streams.
type IOStreams struct {
	In     io.Reader
	Out    io.Writer
	ErrOut io.Writer
}

// NewRootCommand returns the etjob command.
func NewRootCommand(streams IOStreams) *cobra.Command {
	root := &cobra.Command{
		Use:           "etjob",
		Short:         "Elastic distributed training on spot capacity, for Kubernetes",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       Version,
	}
	root.SetIn(streams.In)
	root.SetOut(streams.Out)
	root.SetErr(streams.ErrOut)
	root.AddCommand(newClusterCommand(streams), newDemoCommand(streams), newInternalCommand())
	return root
}

// Main runs the etjob command and returns its exit code.
func Main() int {
	streams := IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}
	cmd := NewRootCommand(streams)
	if err := cmd.Execute(); err != nil {
		_, _ = io.WriteString(streams.ErrOut, "error: "+err.Error()+"\n")
		return 1
	}
	return 0
}
