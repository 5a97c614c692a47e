// Package cli is the etjob command line, the user's binary: Arena's etjob
// verbs (issue #5) on ElasticJobs, a client of the API server and nothing
// more. The local cluster and the developer verbs live in internal/localcli
// (the etjob-local binary). Commands follow kubectl's Options{Complete,
// Validate, Run} shape.
package cli

import (
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
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
	return NewNamedRootCommand("etjob", streams)
}

// NewNamedRootCommand returns the etjob command as prog names it in usage and
// examples: "etjob", or "kubectl etjob" for the kubectl plugin.
func NewNamedRootCommand(prog string, streams IOStreams) *cobra.Command {
	return newRoot(newFactory(prog, streams))
}

func newRoot(f *factory) *cobra.Command {
	prog, streams := f.prog, f.streams
	root := &cobra.Command{
		Use:   "etjob",
		Short: "Elastic distributed training on spot capacity, for Kubernetes",
		Long: `Elastic distributed training on spot capacity, for Kubernetes. Arena's etjob verbs and flags
(` + "`" + prog + " submit etjob ...`" + ` or ` + "`" + prog + " submit ...`" + `), on ElasticJobs, with kubectl's connection flags.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       Version,
	}
	if prog != "etjob" {
		root.Annotations = map[string]string{cobra.CommandDisplayNameAnnotation: prog}
	}
	root.SetIn(streams.In)
	root.SetOut(streams.Out)
	root.SetErr(streams.ErrOut)
	f.config.AddFlags(root.PersistentFlags())
	root.PersistentFlags().StringVar(&f.logLevel, "loglevel", "info", "log level of the INFO/WARN lines: debug, info, warn or error (Arena's)")
	_ = root.RegisterFlagCompletionFunc("namespace", completeNamespaces(f))
	root.AddGroup(&cobra.Group{ID: "jobs", Title: "Job commands (Arena's etjob verbs):"})
	jobs := []*cobra.Command{
		newSubmitCommand(f), newListCommand(f), newGetCommand(f), newLogsCommand(f),
		newScaleCommand(f), newScaleOutInCommand(f, verbScaleOut), newScaleOutInCommand(f, verbScaleIn),
		newLifecycleCommand(f, "suspend"), newLifecycleCommand(f, "resume"), newLifecycleCommand(f, "delete"),
		newTopCommand(f), newCostCommand(f),
	}
	for _, c := range jobs {
		c.GroupID = "jobs"
		root.AddCommand(c)
	}
	return root
}

// progName is how the binary is invoked: "kubectl etjob" when it is the
// kubectl plugin kubectl-etjob, else "etjob".
func progName(arg0 string) string {
	base := strings.TrimSuffix(filepath.Base(arg0), ".exe")
	if rest, ok := strings.CutPrefix(base, "kubectl-"); ok && rest != "" {
		return "kubectl " + strings.ReplaceAll(rest, "_", "-")
	}
	return "etjob"
}

// Main runs the etjob command and returns its exit code.
func Main() int {
	// controller-runtime's clients log nothing the user needs; left unset,
	// it prints a warning with a stack into a command that runs 30 s.
	ctrllog.SetLogger(logr.Discard())
	streams := IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}
	cmd := NewNamedRootCommand(progName(os.Args[0]), streams)
	if err := cmd.Execute(); err != nil {
		_, _ = io.WriteString(streams.ErrOut, "error: "+err.Error()+"\n")
		return 1
	}
	return 0
}
