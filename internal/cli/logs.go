package cli

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// LogsOptions are the flags and argument of `etjob logs NAME`.
type LogsOptions struct {
	// Name is the job's name.
	Name string
	// Follow is -f/--follow.
	Follow bool
	// Tail is --tail: lines per pod; -1 prints all.
	Tail int64
	// Since is --since: only newer lines.
	Since time.Duration
	// Instance is -i/--instance: one pod instead of the default.
	Instance string
	// Timestamps is --timestamps: print each line's time.
	Timestamps bool

	factory *factory
	clients *Clients
}

func newLogsCommand(f *factory) *cobra.Command {
	o := &LogsOptions{factory: f}
	cmd := &cobra.Command{
		Use:   "logs NAME",
		Short: "Print a job's logs: the launcher's (horovod) or every worker's merged with [worker-i] prefixes (torchrun)",
		Example: f.examples(`  etjob logs elastic-training --tail 10
  etjob logs digits -f
  etjob logs digits -i digits-worker-2 --since 5m --timestamps`),
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: f.completeJobNames,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Name = args[0]
			cs, err := f.Clients()
			if err != nil {
				return err
			}
			o.clients = cs
			return o.Run(cmd.Context())
		},
	}
	cmd.Flags().BoolVarP(&o.Follow, "follow", "f", false, "stream the logs")
	cmd.Flags().Int64Var(&o.Tail, "tail", -1, "lines of each pod's recent log to print; -1: all")
	cmd.Flags().DurationVar(&o.Since, "since", 0, "only lines newer than this (5s, 2m, 3h)")
	cmd.Flags().StringVarP(&o.Instance, "instance", "i", "", "print this pod's logs only")
	cmd.Flags().BoolVar(&o.Timestamps, "timestamps", false, "print each line's timestamp")
	_ = cmd.RegisterFlagCompletionFunc("instance", f.completeWorkerPods(&o.Name))
	addTypeFlag(cmd)
	return cmd
}

type logSource struct {
	pod       corev1.Pod
	prefix    string
	container string
}

// Run prints the logs.
func (o *LogsOptions) Run(ctx context.Context) error {
	c := o.clients.Client
	var job etjobv1.ElasticJob
	if err := c.Get(ctx, client.ObjectKey{Namespace: o.clients.Namespace, Name: o.Name}, &job); err != nil {
		return fmt.Errorf("getting %s in namespace %s: %w", jobRef(o.Name), o.clients.Namespace, err)
	}
	pods, err := jobPods(ctx, c, &job)
	if err != nil {
		return err
	}
	sources := logSources(&job, pods, o.Instance)
	if len(sources) == 0 {
		if o.Instance != "" {
			return fmt.Errorf("-i/--instance %s: no such pod of %s", o.Instance, jobRef(o.Name))
		}
		return fmt.Errorf("%s has no pods to print logs from yet (etjob get %s)", jobRef(o.Name), o.Name)
	}
	if o.Follow {
		return o.follow(ctx, sources)
	}
	return o.merged(ctx, sources)
}

// logSources picks the pods: the named instance, else the horovod launcher,
// else every worker (prefixed [worker-i]).
func logSources(job *etjobv1.ElasticJob, pods []corev1.Pod, instance string) []logSource {
	var out []logSource
	for _, p := range pods {
		role := p.Labels[etjobv1.LabelRole]
		src := logSource{pod: p}
		if len(p.Spec.Containers) > 0 {
			src.container = p.Spec.Containers[0].Name
		}
		switch {
		case instance != "":
			if p.Name == instance {
				return []logSource{src}
			}
		case job.Spec.Framework == etjobv1.FrameworkHorovod:
			if role == etjobv1.RoleLauncher {
				return []logSource{src}
			}
		case role == etjobv1.RoleWorker:
			src.prefix = "[worker-" + p.Labels[etjobv1.LabelWorkerIndex] + "] "
			out = append(out, src)
		}
	}
	return out
}

func (o *LogsOptions) options(src logSource, timestamps bool) *corev1.PodLogOptions {
	opts := &corev1.PodLogOptions{Container: src.container, Follow: o.Follow, Timestamps: timestamps}
	if o.Tail >= 0 {
		t := o.Tail
		opts.TailLines = &t
	}
	if o.Since > 0 {
		s := int64(o.Since.Seconds())
		if s < 1 {
			s = 1
		}
		opts.SinceSeconds = &s
	}
	return opts
}

type logLine struct {
	ts   string
	text string
	src  int
}

// merged reads every pod's log with timestamps and prints the lines in time
// order, each with its pod's prefix.
func (o *LogsOptions) merged(ctx context.Context, sources []logSource) error {
	var lines []logLine
	for i, src := range sources {
		rc, err := o.clients.Kube.CoreV1().Pods(src.pod.Namespace).GetLogs(src.pod.Name, o.options(src, true)).Stream(ctx)
		if err != nil {
			fmt.Fprintf(o.factory.streams.ErrOut, "%sno logs from pod %s: %v\n", src.prefix, src.pod.Name, err)
			continue
		}
		sc := bufio.NewScanner(rc)
		sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
		for sc.Scan() {
			ts, text := splitTimestamp(sc.Text())
			lines = append(lines, logLine{ts: ts, text: text, src: i})
		}
		rc.Close()
	}
	sort.SliceStable(lines, func(i, j int) bool { return lines[i].ts < lines[j].ts })
	out := o.factory.out()
	for _, l := range lines {
		o.write(out, sources[l.src].prefix, l.ts, l.text)
	}
	return nil
}

func (o *LogsOptions) write(out io.Writer, prefix, ts, text string) {
	if o.Timestamps && ts != "" {
		fmt.Fprintf(out, "%s%s %s\n", prefix, ts, text)
		return
	}
	fmt.Fprintf(out, "%s%s\n", prefix, text)
}

// splitTimestamp splits an RFC 3339 timestamp the API server put in front of
// a line (PodLogOptions.Timestamps).
func splitTimestamp(line string) (string, string) {
	ts, rest, ok := strings.Cut(line, " ")
	if !ok {
		ts, rest = line, ""
	}
	if _, err := time.Parse(time.RFC3339Nano, ts); err != nil {
		return "", line
	}
	return ts, rest
}

// follow streams every pod's log at once, line by line. Workers that join
// later are not followed: run the command again.
func (o *LogsOptions) follow(ctx context.Context, sources []logSource) error {
	var mu sync.Mutex
	var wg sync.WaitGroup
	out := o.factory.out()
	for _, src := range sources {
		wg.Add(1)
		go func(src logSource) {
			defer wg.Done()
			rc, err := o.clients.Kube.CoreV1().Pods(src.pod.Namespace).GetLogs(src.pod.Name, o.options(src, o.Timestamps)).Stream(ctx)
			if err != nil {
				mu.Lock()
				fmt.Fprintf(o.factory.streams.ErrOut, "%sno logs from pod %s: %v\n", src.prefix, src.pod.Name, err)
				mu.Unlock()
				return
			}
			defer rc.Close()
			sc := bufio.NewScanner(rc)
			sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
			for sc.Scan() {
				mu.Lock()
				fmt.Fprintf(out, "%s%s\n", src.prefix, sc.Text())
				mu.Unlock()
			}
		}(src)
	}
	wg.Wait()
	return nil
}
