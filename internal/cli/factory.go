package cli

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/logging"
	"github.com/etjob/etjob/internal/scheme"
)

// Clients are the API clients and the namespace a command works with. Tests
// fill them with fakes.
type Clients struct {
	// Client reads and writes ElasticJobs, pods, nodes, events and HPAs.
	Client client.Client
	// Kube streams pod logs (CoreV1().Pods().GetLogs).
	Kube kubernetes.Interface
	// Namespace is the namespace of -n/--namespace, else the kubeconfig's.
	Namespace string
}

// factory holds what every job command shares: the program name (etjob or
// kubectl etjob), the streams, kubectl's connection flags and the log level.
type factory struct {
	prog     string
	streams  IOStreams
	config   *genericclioptions.ConfigFlags
	logLevel string
	start    time.Time
	// clients, when set, replaces the connection built from the flags (tests).
	clients *Clients
}

func newFactory(prog string, streams IOStreams) *factory {
	return &factory{prog: prog, streams: streams, config: genericclioptions.NewConfigFlags(true), logLevel: "info", start: time.Now()}
}

// Clients connects to the cluster named by --kubeconfig / --context.
func (f *factory) Clients() (*Clients, error) {
	if f.clients != nil {
		return f.clients, nil
	}
	cfg, err := f.config.ToRESTConfig()
	if err != nil {
		return nil, fmt.Errorf("connecting to the cluster (--kubeconfig, --context): %w", err)
	}
	ns, _, err := f.config.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return nil, fmt.Errorf("reading the namespace from the kubeconfig: %w", err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		return nil, err
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	f.clients = &Clients{Client: c, Kube: kube, Namespace: ns}
	return f.clients, nil
}

func (f *factory) validateLogLevel() error {
	if _, err := logging.ParseLevel(f.logLevel); err != nil {
		return fmt.Errorf("--loglevel %w", err)
	}
	return nil
}

// log is the command's logger: Arena-style (logrus) lines, e.g.
// "INFO[0003] msg", on the error stream, so that stdout stays a clean object
// (-o yaml) or table.
func (f *factory) log() *slog.Logger {
	level, err := logging.ParseLevel(f.logLevel)
	if err != nil {
		level = slog.LevelInfo // validateLogLevel refused it before any command ran
	}
	return slog.New(logging.NewArenaHandler(f.streams.ErrOut, level, f.start))
}

// out is the command's standard output.
func (f *factory) out() io.Writer { return f.streams.Out }

// examples replaces the program name in an example block, so that the help of
// kubectl-etjob shows `kubectl etjob ...`.
func (f *factory) examples(s string) string {
	if f.prog == "etjob" {
		return s
	}
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		trimmed := strings.TrimLeft(l, " ")
		if strings.HasPrefix(trimmed, "etjob ") {
			lines[i] = l[:len(l)-len(trimmed)] + f.prog + strings.TrimPrefix(trimmed, "etjob")
		}
	}
	return strings.Join(lines, "\n")
}

// completeJobNames lists the ElasticJobs of the namespace for shell
// completion of a NAME argument.
func (f *factory) completeJobNames(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return f.jobNames(cmd, toComplete), cobra.ShellCompDirectiveNoFileComp
}

func (f *factory) completeJobNamesMulti(cmd *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	return f.jobNames(cmd, toComplete), cobra.ShellCompDirectiveNoFileComp
}

func (f *factory) jobNames(cmd *cobra.Command, prefix string) []string {
	cs, err := f.Clients()
	if err != nil {
		return nil
	}
	var list etjobv1.ElasticJobList
	if err := cs.Client.List(cmd.Context(), &list, client.InNamespace(cs.Namespace)); err != nil {
		return nil
	}
	var names []string
	for _, j := range list.Items {
		if strings.HasPrefix(j.Name, prefix) {
			names = append(names, j.Name)
		}
	}
	return names
}

// jobRef is how output names a job, as kubectl does.
func jobRef(name string) string { return "elasticjob.etjob.dev/" + name }

// completeWorkerPods lists the worker pods of the job named by *name for
// shell completion of --instance.
func (f *factory) completeWorkerPods(name *string) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		job := *name
		if job == "" && len(args) > 0 {
			job = args[0]
		}
		cs, err := f.Clients()
		if err != nil || job == "" {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var pods corev1.PodList
		if err := cs.Client.List(cmd.Context(), &pods, client.InNamespace(cs.Namespace),
			client.MatchingLabels{etjobv1.LabelJobName: job, etjobv1.LabelRole: etjobv1.RoleWorker}); err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var out []string
		for _, p := range pods.Items {
			if strings.HasPrefix(p.Name, toComplete) {
				out = append(out, p.Name)
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

func completeNamespaces(f *factory) cobra.CompletionFunc {
	return func(cmd *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		cs, err := f.Clients()
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var list corev1.NamespaceList
		if err := cs.Client.List(cmd.Context(), &list); err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var out []string
		for _, n := range list.Items {
			if strings.HasPrefix(n.Name, toComplete) {
				out = append(out, n.Name)
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}
