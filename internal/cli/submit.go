package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"path"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/render"
)

// horovodWorkerIdle is what a horovod worker's container runs: horovodrun in
// the launcher starts the training processes in it through kubexec.sh (no
// sshd, unlike et-operator). A worker told to stop exits 75, the reserved
// preemption code, never 0: horovodrun ends the whole job when any rank exits 0.
const horovodWorkerIdle = `trap 'exit 75' TERM INT; while :; do sleep 3600 & wait $!; done`

// unsupportedArenaFlags are Arena's etjob flags that cannot apply here, each
// with the sentence that refuses it. They are accepted by the parser (hidden)
// so that the refusal names the flag instead of "unknown flag".
var unsupportedArenaFlags = []struct {
	name, reason string
	isBool       bool
}{
	{"rdma", "etjob does not manage RDMA devices; request them with your device plugin's resource in a pod template (kubectl apply) instead", true},
	{"gang", "etjob has no gang scheduler integration and an elastic job needs none: it starts once --min-workers workers are members, and --max-wait-time releases workers held idle below that minimum; use --scheduler NAME to hand pods to a scheduler of your own", true},
	{"queue", "etjob does not integrate a queue yet: neither kube-queue nor Kueue, which acts only on the kinds it integrates, so no Workload is made for an ElasticJob and Kueue never suspends, admits or counts it (the label kueue.x-k8s.io/queue-name only keeps a job from growing above --workers); to hold a job back, submit it and run etjob suspend NAME, then etjob resume NAME", true},
	{"ssh-secret", "etjob's horovod launcher reaches workers through the Kubernetes API (an exec, /etc/mpi/kubexec.sh), not SSH, so there is no SSH key to give", false},
	{"sync-mode", "etjob does not sync code into pods; bake the code into --image or mount it with -d PVC:PATH", false},
	{"sync-source", "etjob does not sync code into pods; bake the code into --image or mount it with -d PVC:PATH", false},
	{"sync-image", "etjob does not sync code into pods; bake the code into --image or mount it with -d PVC:PATH", false},
	{"sync-branch", "etjob does not sync code into pods; bake the code into --image or mount it with -d PVC:PATH", false},
	{"tensorboard", "etjob does not deploy TensorBoard; run it next to the job, reading the log directory from the same PVC", true},
	{"tensorboard-image", "etjob does not deploy TensorBoard; run it next to the job, reading the log directory from the same PVC", false},
	{"logdir", "etjob does not deploy TensorBoard; run it next to the job, reading the log directory from the same PVC", false},
	{"config-file", "etjob does not copy local files into pods; put them in a ConfigMap and mount it through a pod template (kubectl apply), or in the image", false},
}

// SubmitOptions are the flags and argument of `etjob submit`: Arena's etjob
// flags, with the same names, meanings and defaults, plus --framework,
// --checkpoint-dir, --dry-run and -o.
type SubmitOptions struct {
	// Name is --name, the job's name.
	Name string
	// Namespace is -n/--namespace.
	Namespace string
	// Command is the training command: it runs as `SHELL -c COMMAND` in the
	// launcher (horovod) or in every worker (torchrun).
	Command string
	// Framework is --framework: torchrun (default) or horovod.
	Framework string
	// Recovery is --recovery: Restart (default) or InProcess.
	Recovery string
	// Image is --image.
	Image string
	// GPUs is --gpus, GPUs per worker (nvidia.com/gpu limit).
	GPUs int
	// NProcPerNode is --nproc-per-node (torchrun's): spec.slotsPerWorker,
	// the training processes a worker runs; 0 leaves it to --gpus.
	NProcPerNode int
	// WorldSizes is --world-sizes: spec.worldSizes, comma-separated.
	WorldSizes string
	// CPU is --cpu, a worker's CPU request and limit.
	CPU string
	// Memory is --memory, a worker's memory request and limit.
	Memory string
	// Workers is --workers, the initial number of workers (spec.replicas).
	Workers int
	// MinWorkers is --min-workers (spec.minReplicas), default 1.
	MinWorkers int
	// MaxWorkers is --max-workers (spec.maxReplicas), default 1000.
	MaxWorkers int
	// SpotInstance is --spot-instance (spec.spot.enabled).
	SpotInstance bool
	// MaxWaitTime is --max-wait-time: whole seconds ("600") or a duration
	// ("10m"); 0 means no limit.
	MaxWaitTime string
	// Growth is --growth: Replicas (default) or Opportunistic (spec.growth.policy).
	Growth string
	// GrowthProbeTimeout and GrowthBackoff are --growth-probe-timeout and
	// --growth-backoff: seconds or a duration ("" keeps the API's default).
	GrowthProbeTimeout, GrowthBackoff string
	// MaxPrice is --max-price, spec.spot.maxPricePerHour.
	MaxPrice string
	// Budget is --budget, spec.spot.budgetPerHour.
	Budget string
	// JobRestartPolicy is --job-restart-policy: Never or OnFailure.
	JobRestartPolicy string
	// JobBackoffLimit is --job-backoff-limit, default 6.
	JobBackoffLimit int
	// JobBackoffLimitSet says --job-backoff-limit was given.
	JobBackoffLimitSet bool
	// Retry is --retry when given: Arena's older name of the job's retry
	// count, the same limit as --job-backoff-limit.
	Retry *int
	// WorkerRestartPolicy is --worker-restart-policy: Always, OnFailure,
	// Never or ExitCode.
	WorkerRestartPolicy string
	// LauncherSelectors are --launcher-selector k=v.
	LauncherSelectors []string
	// Selectors are --selector k=v (workers).
	Selectors []string
	// Tolerations are --toleration key=value:effect,operator or "all".
	Tolerations []string
	// WorkingDir is --working-dir; empty keeps the image's WORKDIR.
	WorkingDir string
	// Envs are -e/--env k=v.
	Envs []string
	// Labels are -l/--label k=v, on the job and its pods.
	Labels []string
	// Annotations are -a/--annotation k=v, on every pod.
	Annotations []string
	// LauncherAnnotations are --launcher-annotation k=v.
	LauncherAnnotations []string
	// WorkerAnnotations are --worker-annotation k=v.
	WorkerAnnotations []string
	// Data are -d/--data PVC:MOUNTPATH.
	Data []string
	// DataDirs are --data-dir HOSTPATH[:MOUNTPATH].
	DataDirs []string
	// ImagePullPolicy is --image-pull-policy.
	ImagePullPolicy string
	// ImagePullSecrets are --image-pull-secret.
	ImagePullSecrets []string
	// Priority is -p/--priority, the pods' PriorityClass.
	Priority string
	// Scheduler is --scheduler, the pods' schedulerName.
	Scheduler string
	// Shell is --shell: sh (default) or bash.
	Shell string
	// HostNetwork, HostIPC and HostPID are Arena's --hostNetwork,
	// --hostIPC and --hostPID.
	HostNetwork, HostIPC, HostPID bool
	// CheckpointDir is --checkpoint-dir (spec.checkpointDir).
	CheckpointDir string
	// DryRun is --dry-run: "", "client" or "server".
	DryRun string
	// Output is -o: "", yaml or json.
	Output string

	unsupported map[string]*pflag.Flag
	factory     *factory
	job         *etjobv1.ElasticJob
}

func newSubmitCommand(f *factory) *cobra.Command {
	cmd := newSubmitSubcommand(f, "submit [flags] COMMAND", nil)
	cmd.Short = "Submit an elastic training job (Arena: `arena submit etjob`)"
	et := newSubmitSubcommand(f, "etjob [flags] COMMAND", []string{"et"})
	et.Short = "Submit an elastic training job; the same as `" + f.prog + " submit`, Arena's spelling"
	cmd.AddCommand(et)
	return cmd
}

const submitExample = `  # Seed 001: Horovod elastic training, 3 workers (1..9), one GPU each
  etjob submit etjob --framework horovod \
    --name=elastic-training --gpus=1 --workers=3 --max-workers=9 --min-workers=1 \
    --image=registry.cn-hangzhou.aliyuncs.com/ai-samples/horovod:0.20.0-tf2.3.0-torch1.6.0-mxnet1.6.0.post0-py3.7-cuda10.1 \
    --working-dir=/examples \
    "horovodrun -np \$((\${workers}*\${gpus})) --min-np \$((\${minWorkers}*\${gpus})) \
     --max-np \$((\${maxWorkers}*\${gpus})) --host-discovery-script /etc/edl/discover_hosts.sh \
     python /examples/elastic/tensorflow2_mnist_elastic.py"

  # Seed 000: on spot instances, 8 workers (1..128), idle workers held at most 600 s
  etjob submit etjob --framework horovod --loglevel=debug --spot-instance --max-wait-time=600 \
    --job-restart-policy=OnFailure --job-backoff-limit=3 --worker-restart-policy=Always \
    --launcher-selector=instance_type=spot-launcher --toleration=all --namespace=default \
    --name=fine-tuning-elastic --gpus=1 --memory=16Gi --cpu=4 \
    --workers=8 --max-workers=128 --min-workers=1 \
    --image=registry.cn-beijing.aliyuncs.com/acs/bert-elastic-demo:v1.5 \
    "horovodrun -np \$((\${workers}*\${gpus})) ... python /examples/elastic/pytorch/train_bert.py --epochs=5"

  # torchrun (the default framework): every worker runs the command
  etjob submit --name digits --workers 4 --min-workers 2 --max-workers 6 --gpus 1 \
    --spot-instance -d digits-ckpt:/ckpt --checkpoint-dir /ckpt \
    --image etjob/digits:local "python3 -m etjob.torchrun /opt/etjob/examples/digits/train.py"

  # Print the ElasticJob instead of creating it
  etjob submit --name j --image python:3.12 --dry-run -o yaml "torchrun train.py"`

func newSubmitSubcommand(f *factory, use string, aliases []string) *cobra.Command {
	o := &SubmitOptions{factory: f, unsupported: map[string]*pflag.Flag{}}
	cmd := &cobra.Command{
		Use:     use,
		Aliases: aliases,
		Long: `Submit an ElasticJob. The flags are Arena's etjob flags, with the same names, meanings and
defaults. COMMAND runs in a shell (` + "`sh -c COMMAND`" + `): in the launcher for --framework horovod,
in every worker for --framework torchrun. Every pod has Arena's variables workers, minWorkers,
maxWorkers and gpus (set at creation; WORLD_SIZE is the live size), so Arena's command lines with
$((${workers}*${gpus})) work verbatim. Wrong input is refused before anything is created.`,
		Example: f.examples(submitExample),
		Args:    cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.Complete(cmd, args); err != nil {
				return err
			}
			if err := o.Validate(); err != nil {
				return err
			}
			return o.Run(cmd.Context())
		},
	}
	fs := cmd.Flags()
	// COMMAND is the training command line: flag parsing stops at its first
	// word, so `horovodrun -np 4 python t.py` unquoted is the command, not
	// -n p (namespace p) and stray arguments.
	fs.SetInterspersed(false)
	fs.StringVar(&o.Name, "name", "", "the job's name (required)")
	fs.StringVar(&o.Image, "image", "", "the container image of the job (required)")
	fs.StringVar(&o.Framework, "framework", "", "the distributed launcher: torchrun or horovod (default: horovod when COMMAND starts with horovodrun, as in Arena's examples, else torchrun)")
	fs.IntVar(&o.GPUs, "gpus", 0, "GPUs per worker (nvidia.com/gpu); also the processes per worker unless --nproc-per-node says otherwise")
	fs.StringVar(&o.WorldSizes, "world-sizes", "", "with --recovery InProcess: the only world sizes (ranks) the job trains at, like 8,16,32 (spec.worldSizes; each a multiple of --nproc-per-node); more workers wait as spares")
	fs.IntVar(&o.NProcPerNode, "nproc-per-node", 0, "training processes (ranks) per worker, torchrun's flag (spec.slotsPerWorker; default --gpus, else 1); with --recovery InProcess run the script as `python3 -m etjob.launch train.py`: a worker's ranks leave and join together")
	fs.StringVar(&o.CPU, "cpu", "", "CPU per worker, request and limit, like 4")
	fs.StringVar(&o.Memory, "memory", "", "memory per worker, request and limit, like 16Gi")
	fs.IntVar(&o.Workers, "workers", 1, "the initial number of workers")
	fs.IntVar(&o.MinWorkers, "min-workers", 1, "the fewest workers the job trains with")
	fs.IntVar(&o.MaxWorkers, "max-workers", 1000, "the most workers the job runs")
	fs.BoolVar(&o.SpotInstance, "spot-instance", false, "run workers on spot instances (tolerate and prefer them; the launcher stays on on-demand capacity)")
	fs.StringVar(&o.MaxWaitTime, "max-wait-time", "0", "seconds (or a duration such as 10m) scheduled but idle workers are held while the job is below --min-workers; 0: no limit")
	fs.StringVar(&o.Growth, "growth", "", "how far the job grows: Replicas (default: back to --workers) or Opportunistic (extra workers up to --max-workers while free capacity lasts, given back first)")
	fs.StringVar(&o.GrowthProbeTimeout, "growth-probe-timeout", "", "with --growth Opportunistic: give up an extra worker not scheduled this long after its creation (seconds or a duration; default 120)")
	fs.StringVar(&o.GrowthBackoff, "growth-backoff", "", "with --growth Opportunistic: no new extra worker this long after one was given up or taken back (seconds or a duration; default 300)")
	fs.StringVar(&o.MaxPrice, "max-price", "", "the most a worker's node may cost, US dollars an hour (its etjob.dev/price-per-hour label), like 0.95: new workers avoid dearer nodes, a worker whose node's price rises above it leaves at an agreed step")
	fs.StringVar(&o.Budget, "budget", "", "the most the job's workers may cost together, US dollars an hour at their nodes' prices, like 12.50: no new worker is started above it, and the dearest leave at an agreed step when prices rise above it")
	fs.StringVar(&o.Recovery, "recovery", "", "how the workers recover: Restart (default: torchrun's agents restart them; a lost launcher restarts the job) or InProcess (the workers run etjob.elastic: a lost launcher is replaced alone, no worker restarts)")
	fs.StringVar(&o.JobRestartPolicy, "job-restart-policy", "", "job restart policy: Never (default) or OnFailure")
	fs.IntVar(&o.JobBackoffLimit, "job-backoff-limit", 6, "failures (preemptions excluded) tolerated before the job fails")
	fs.StringVar(&o.WorkerRestartPolicy, "worker-restart-policy", "", "worker restart policy: Never, OnFailure, Always or ExitCode (default)")
	fs.StringArrayVar(&o.LauncherSelectors, "launcher-selector", nil, `the launcher's node selector, "--launcher-selector key=value"`)
	fs.StringArrayVar(&o.Selectors, "selector", nil, `the workers' node selector, "--selector key=value"`)
	fs.StringArrayVar(&o.Tolerations, "toleration", nil, `tolerate tainted nodes: "--toleration key=value:effect,operator" or "--toleration all"`)
	fs.StringVar(&o.WorkingDir, "working-dir", "", "working directory of the command (default: the image's)")
	fs.StringArrayVarP(&o.Envs, "env", "e", nil, "environment variables, key=value")
	fs.StringArrayVarP(&o.Labels, "label", "l", nil, "labels of the job and its pods, key=value")
	fs.StringArrayVarP(&o.Annotations, "annotation", "a", nil, "annotations of every pod, key=value")
	fs.StringArrayVar(&o.LauncherAnnotations, "launcher-annotation", nil, "annotations of the launcher pod, key=value")
	fs.StringArrayVar(&o.WorkerAnnotations, "worker-annotation", nil, "annotations of the worker pods, key=value")
	fs.StringArrayVarP(&o.Data, "data", "d", nil, "mount a PersistentVolumeClaim, PVC:MOUNTPATH")
	fs.StringArrayVar(&o.DataDirs, "data-dir", nil, "mount a host directory, HOSTPATH[:MOUNTPATH]")
	fs.StringVar(&o.ImagePullPolicy, "image-pull-policy", "", "Always, IfNotPresent or Never")
	fs.StringArrayVar(&o.ImagePullSecrets, "image-pull-secret", nil, "image pull secret names")
	fs.StringVarP(&o.Priority, "priority", "p", "", "the pods' PriorityClass")
	fs.StringVar(&o.Scheduler, "scheduler", "", "the pods' scheduler name")
	fs.StringVar(&o.Shell, "shell", "sh", "the shell that runs COMMAND: sh or bash")
	fs.BoolVar(&o.HostNetwork, "hostNetwork", false, "run the pods in the host's network namespace (a torchrun job's launcher, which holds the store, never does)")
	fs.BoolVar(&o.HostIPC, "hostIPC", false, "run the pods in the host's IPC namespace")
	fs.BoolVar(&o.HostPID, "hostPID", false, "run the pods in the host's PID namespace")
	fs.StringVar(&o.CheckpointDir, "checkpoint-dir", "", "checkpoint directory on shared storage (a -d mount), exported as ETJOB_CHECKPOINT_DIR")
	fs.Int("retry", 0, "Arena's older name of --job-backoff-limit")
	fs.StringVar(&o.DryRun, "dry-run", "", `"client" prints the job without sending it; "server" has the API server check it without persisting it`)
	fs.Lookup("dry-run").NoOptDefVal = "client"
	fs.StringVarP(&o.Output, "output", "o", "", "print the job: yaml or json")
	for _, u := range unsupportedArenaFlags {
		if u.isBool {
			fs.Bool(u.name, false, u.reason)
		} else {
			fs.StringArray(u.name, nil, u.reason)
		}
		_ = fs.MarkHidden(u.name)
		o.unsupported[u.name] = fs.Lookup(u.name)
	}
	_ = cmd.RegisterFlagCompletionFunc("framework", cobra.FixedCompletions([]string{"torchrun", "horovod"}, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("recovery", cobra.FixedCompletions([]string{"Restart", "InProcess"}, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"yaml", "json"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// Complete fills the options from the command line.
func (o *SubmitOptions) Complete(cmd *cobra.Command, args []string) error {
	o.Command = commandLine(args)
	if len(args) > 1 {
		for _, a := range args[1:] {
			name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
			if strings.HasPrefix(a, "--") && (name == "kubeconfig" || name == "namespace" || name == "context" || name == "name") {
				o.factory.log().Warn(fmt.Sprintf("%s is part of COMMAND (%q): etjob's own flags go before the command", a, o.Command))
			}
		}
	}
	o.JobBackoffLimitSet = cmd.Flags().Changed("job-backoff-limit")
	if cmd.Flags().Changed("retry") {
		v, _ := cmd.Flags().GetInt("retry")
		o.Retry = &v
	}
	for name, fl := range o.unsupported {
		if !fl.Changed {
			delete(o.unsupported, name)
		}
	}
	if o.Namespace == "" {
		if o.factory.clients != nil || o.DryRun != "client" {
			cs, err := o.factory.Clients()
			if err != nil {
				return err
			}
			o.Namespace = cs.Namespace
		} else if ns, _, err := o.factory.config.ToRawKubeConfigLoader().Namespace(); err == nil {
			o.Namespace = ns
		} else {
			o.Namespace = "default"
		}
	}
	return nil
}

// commandLine joins COMMAND's arguments with spaces, and turns its bare line
// breaks into spaces, as Arena does: seed 000 breaks `horovodrun ... python
// train.py` over several lines of one quoted argument, which `sh -c` would
// otherwise run as separate commands (horovodrun without its flags, then the
// script alone). A backslash-newline is left for the shell, which joins it.
func commandLine(args []string) string {
	joined := []rune(strings.Join(args, " "))
	for i, r := range joined {
		if (r == '\n' || r == '\r') && (i == 0 || joined[i-1] != '\\') {
			joined[i] = ' '
		}
	}
	return strings.TrimSpace(string(joined))
}

// Validate refuses wrong input before anything is created, naming the flag.
func (o *SubmitOptions) Validate() error {
	names := make([]string, 0, len(o.unsupported))
	for name := range o.unsupported {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		for _, u := range unsupportedArenaFlags {
			if u.name == name {
				return fmt.Errorf("--%s is an Arena flag that etjob does not support: %s. Nothing was created", name, u.reason)
			}
		}
	}
	if err := o.factory.validateLogLevel(); err != nil {
		return err
	}
	switch o.DryRun {
	case "", "none", "client", "server":
	default:
		return fmt.Errorf("--dry-run %q: must be client or server", o.DryRun)
	}
	switch o.Output {
	case "", "yaml", "json":
	default:
		return fmt.Errorf("-o/--output %q: must be yaml or json", o.Output)
	}
	job, err := BuildElasticJob(*o)
	if err != nil {
		return err
	}
	o.job = job
	return nil
}

// Run creates the job (or prints it for --dry-run=client).
func (o *SubmitOptions) Run(ctx context.Context) error {
	f := o.factory
	job := o.job
	f.log().Debug(fmt.Sprintf("framework %s, %d workers (%d-%d), %d GPUs each, command: %s", job.Spec.Framework, job.Spec.Replicas, job.Spec.MinReplicas, job.Spec.MaxReplicas, o.GPUs, o.Command))
	if w := checkpointWarning(*o); w != "" {
		f.log().Warn(w)
	}
	if o.DryRun == "client" {
		if o.Output != "" {
			return printObject(f.out(), job, o.Output)
		}
		fmt.Fprintf(f.out(), "%s created (dry run)\n", jobRef(job.Name))
		return nil
	}
	cs, err := f.Clients()
	if err != nil {
		return err
	}
	if err := checkPods(ctx, cs.Client, job, f.log()); err != nil {
		return err
	}
	var opts []client.CreateOption
	if o.DryRun == "server" {
		opts = append(opts, client.DryRunAll)
	}
	if err := cs.Client.Create(ctx, job, opts...); err != nil {
		return fmt.Errorf("creating %s in namespace %s: %w", jobRef(job.Name), job.Namespace, err)
	}
	if o.Output != "" {
		return printObject(f.out(), job, o.Output)
	}
	if o.DryRun == "server" {
		fmt.Fprintf(f.out(), "%s created (server dry run)\n", jobRef(job.Name))
		return nil
	}
	fmt.Fprintf(f.out(), "%s created\n", jobRef(job.Name))
	f.log().Info(fmt.Sprintf("The Job %s has been submitted successfully", job.Name))
	f.log().Info(fmt.Sprintf("You can run `%s get %s -n %s` to check the job status", f.prog, job.Name, job.Namespace))
	return nil
}

// checkPods has the API server check the job's first worker pod and its
// launcher pod as the controller would create them, without creating them
// (a server-side dry run). A pod the server refuses as invalid would be
// refused for ever, one pod at a time: submit refuses the job with the
// server's words. Any other refusal (a quota, a missing PriorityClass, RBAC
// that does not let this user create pods) may pass later or is not this
// check's business: it is reported, and the job is submitted.
func checkPods(ctx context.Context, c client.Client, job *etjobv1.ElasticJob, log *slog.Logger) error {
	for _, pod := range []*corev1.Pod{render.Worker(job, 0), render.Launcher(job)} {
		role := pod.Labels[etjobv1.LabelRole]
		pod.OwnerReferences = nil // the job has no UID yet
		pod.GenerateName, pod.Name = pod.Name+"-", ""
		err := c.Create(ctx, pod, client.DryRunAll)
		switch {
		case err == nil:
		case apierrors.IsInvalid(err) || apierrors.IsBadRequest(err):
			return fmt.Errorf("the API server refuses the job's %s pod, so it would refuse every one: %w", role, err)
		default:
			log.Debug(fmt.Sprintf("the %s pod's server-side check: %v", role, err))
		}
	}
	return nil
}

// BuildElasticJob builds the ElasticJob that `etjob submit` creates. It is
// pure: the same options give the same job. Errors name the flag.
func BuildElasticJob(o SubmitOptions) (*etjobv1.ElasticJob, error) {
	if o.Name == "" {
		return nil, fmt.Errorf("--name must be set")
	}
	if errs := validation.IsDNS1035Label(o.Name); len(errs) > 0 {
		return nil, fmt.Errorf("--name %q: %s", o.Name, strings.Join(errs, "; "))
	}
	if len(o.Name) > etjobv1.MaxNameLength {
		return nil, fmt.Errorf("--name %q: at most %d characters (pod names add -worker-N)", o.Name, etjobv1.MaxNameLength)
	}
	if o.Image == "" {
		return nil, fmt.Errorf("--image must be set")
	}
	if strings.TrimSpace(o.Image) != o.Image {
		return nil, fmt.Errorf("--image %q: no leading or trailing whitespace", o.Image)
	}
	if o.Command == "" {
		return nil, fmt.Errorf("the training command is missing: give it as the last argument, quoted, e.g. \"torchrun train.py\"")
	}
	framework := etjobv1.Framework(o.Framework)
	if framework == "" {
		// Arena's etjob is Horovod's: its command lines start with horovodrun.
		framework = etjobv1.FrameworkTorchrun
		if fields := strings.Fields(o.Command); len(fields) > 0 && fields[0] == "horovodrun" {
			framework = etjobv1.FrameworkHorovod
		}
	}
	if framework != etjobv1.FrameworkTorchrun && framework != etjobv1.FrameworkHorovod {
		return nil, fmt.Errorf("--framework %q: must be torchrun or horovod", o.Framework)
	}
	if framework == etjobv1.FrameworkHorovod && !strings.Contains(o.Command, "horovodrun") {
		return nil, fmt.Errorf("--framework horovod: COMMAND runs in the launcher and must run horovodrun (e.g. \"horovodrun -np $((${workers}*${gpus})) --host-discovery-script /etc/edl/discover_hosts.sh python train.py\"), not %q; for a command that every worker runs, use --framework torchrun", o.Command)
	}
	if err := checkCounts(o); err != nil {
		return nil, err
	}
	if o.GPUs < 0 {
		return nil, fmt.Errorf("--gpus %d: must be 0 or more", o.GPUs)
	}
	if o.NProcPerNode < 0 || o.NProcPerNode > 1024 {
		return nil, fmt.Errorf("--nproc-per-node %d: must be between 1 and 1024 (or left out: --gpus, else 1)", o.NProcPerNode)
	}
	shell := o.Shell
	if shell == "" {
		shell = "sh"
	}
	if shell != "sh" && shell != "bash" {
		return nil, fmt.Errorf("--shell %q: must be sh or bash", o.Shell)
	}
	maxWait, err := parseMaxWaitTime(o.MaxWaitTime)
	if err != nil {
		return nil, err
	}
	spec := etjobv1.ElasticJobSpec{
		Replicas:      int32(o.Workers),
		MinReplicas:   int32(o.MinWorkers),
		MaxReplicas:   int32(o.MaxWorkers),
		Framework:     framework,
		MaxWaitTime:   maxWait,
		CheckpointDir: o.CheckpointDir,
	}
	if o.NProcPerNode > 0 {
		n := int32(o.NProcPerNode)
		spec.SlotsPerWorker = &n
	}
	if spec.Recovery, err = pickEnum("--recovery", o.Recovery, etjobv1.RecoveryRestart, etjobv1.RecoveryInProcess); err != nil {
		return nil, err
	}
	if spec.Recovery == etjobv1.RecoveryInProcess && framework == etjobv1.FrameworkHorovod {
		return nil, fmt.Errorf("--recovery InProcess needs --framework torchrun (workers that run etjob.elastic): horovodrun runs in the launcher and cannot outlive it")
	}
	if spec.WorldSizes, err = parseWorldSizes(o); err != nil {
		return nil, err
	}
	if len(spec.WorldSizes) > 0 && spec.Recovery != etjobv1.RecoveryInProcess {
		return nil, fmt.Errorf("--world-sizes needs --recovery InProcess: etjob.elastic's ranks form only those sizes (torchrun and horovodrun have no such list)")
	}
	if spec.RestartPolicy, err = pickEnum("--job-restart-policy", o.JobRestartPolicy, etjobv1.RestartPolicyNever, etjobv1.RestartPolicyOnFailure); err != nil {
		return nil, err
	}
	if spec.WorkerRestartPolicy, err = pickEnum("--worker-restart-policy", o.WorkerRestartPolicy,
		etjobv1.WorkerRestartAlways, etjobv1.WorkerRestartOnFailure, etjobv1.WorkerRestartNever, etjobv1.WorkerRestartExitCode); err != nil {
		return nil, err
	}
	backoff, err := backoffLimit(o)
	if err != nil {
		return nil, err
	}
	spec.BackoffLimit = &backoff
	if o.SpotInstance {
		spec.Spot = &etjobv1.SpotSpec{Enabled: true}
	}
	if err := growthFlags(&o, &spec); err != nil {
		return nil, err
	}
	if o.CheckpointDir != "" && !path.IsAbs(o.CheckpointDir) {
		return nil, fmt.Errorf("--checkpoint-dir %q: must be an absolute path in the container", o.CheckpointDir)
	}
	if len(o.CheckpointDir) > 4096 {
		return nil, fmt.Errorf("--checkpoint-dir: at most 4096 characters, not %d", len(o.CheckpointDir))
	}
	// The API server refuses a pod whose priority class or scheduler is not
	// a DNS subdomain, but only once the job exists (FuzzSubmitFlags).
	for _, n := range []struct{ flag, v string }{{"-p/--priority", o.Priority}, {"--scheduler", o.Scheduler}} {
		if errs := validation.IsDNS1123Subdomain(n.v); n.v != "" && len(errs) > 0 {
			return nil, fmt.Errorf("%s %q: %s", n.flag, n.v, strings.Join(errs, "; "))
		}
	}

	labels, err := parseLabels("-l/--label", o.Labels)
	if err != nil {
		return nil, err
	}
	podAnnotations, err := parseAnnotations("-a/--annotation", o.Annotations)
	if err != nil {
		return nil, err
	}
	launcherAnnotations, err := parseAnnotations("--launcher-annotation", o.LauncherAnnotations)
	if err != nil {
		return nil, err
	}
	workerAnnotations, err := parseAnnotations("--worker-annotation", o.WorkerAnnotations)
	if err != nil {
		return nil, err
	}
	workerSelector, err := parseLabels("--selector", o.Selectors)
	if err != nil {
		return nil, err
	}
	launcherSelector, err := parseLabels("--launcher-selector", o.LauncherSelectors)
	if err != nil {
		return nil, err
	}
	env, err := parseEnv(o.Envs)
	if err != nil {
		return nil, err
	}
	tolerations, err := parseTolerations(o.Tolerations)
	if err != nil {
		return nil, err
	}
	volumes, mounts, err := parseData(o.Data, o.DataDirs)
	if err != nil {
		return nil, err
	}
	pullPolicy, err := pickEnum("--image-pull-policy", o.ImagePullPolicy, corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever)
	if err != nil {
		return nil, err
	}
	resources, err := workerResources(o)
	if err != nil {
		return nil, err
	}
	var pullSecrets []corev1.LocalObjectReference
	for _, s := range o.ImagePullSecrets {
		if s == "" {
			return nil, fmt.Errorf("--image-pull-secret: empty name")
		}
		pullSecrets = append(pullSecrets, corev1.LocalObjectReference{Name: s})
	}

	podSpec := func() corev1.PodSpec {
		return corev1.PodSpec{
			Tolerations:       cloneSlice(tolerations),
			ImagePullSecrets:  cloneSlice(pullSecrets),
			PriorityClassName: o.Priority,
			SchedulerName:     o.Scheduler,
			HostNetwork:       o.HostNetwork,
			HostIPC:           o.HostIPC,
			HostPID:           o.HostPID,
		}
	}
	withDNS := func(s *corev1.PodSpec) {
		if s.HostNetwork {
			s.DNSPolicy = corev1.DNSClusterFirstWithHostNet
		}
	}
	shellCommand := []string{shell, "-c", o.Command}

	worker := corev1.Container{
		Name:            "worker",
		Image:           o.Image,
		ImagePullPolicy: pullPolicy,
		WorkingDir:      o.WorkingDir,
		Env:             cloneSlice(env),
		Resources:       resources,
		VolumeMounts:    cloneSlice(mounts),
	}
	if framework == etjobv1.FrameworkHorovod {
		worker.Command = []string{"sh", "-c", horovodWorkerIdle}
	} else {
		worker.Command = shellCommand
	}
	ws := podSpec()
	ws.NodeSelector = nilIfEmpty(workerSelector)
	ws.Volumes = cloneSlice(volumes)
	ws.Containers = []corev1.Container{worker}
	withDNS(&ws)
	spec.WorkerTemplate = corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: nilIfEmpty(labels), Annotations: nilIfEmpty(merged(podAnnotations, workerAnnotations))},
		Spec:       ws,
	}

	launcherMeta := metav1.ObjectMeta{Labels: nilIfEmpty(labels), Annotations: nilIfEmpty(merged(podAnnotations, launcherAnnotations))}
	switch {
	case framework == etjobv1.FrameworkHorovod:
		ls := podSpec()
		ls.NodeSelector = nilIfEmpty(launcherSelector)
		ls.Volumes = cloneSlice(volumes)
		ls.Containers = []corev1.Container{{
			Name: "launcher", Image: o.Image, ImagePullPolicy: pullPolicy, WorkingDir: o.WorkingDir,
			Command: shellCommand, Env: cloneSlice(env), VolumeMounts: cloneSlice(mounts),
		}}
		withDNS(&ls)
		spec.LauncherTemplate = &corev1.PodTemplateSpec{ObjectMeta: launcherMeta, Spec: ls}
	case len(launcherSelector) > 0 || len(launcherAnnotations) > 0:
		// torchrun: the launcher hosts the rendezvous store. Without
		// launcher flags the controller's default is used; with them, the
		// same store (render builds both), placed as the flags say:
		// selector, annotations and the pod-wide flags.
		lt := render.RendezvousLauncherTemplate(spec.WorkerTemplate)
		lt.ObjectMeta = launcherMeta
		lt.Spec.NodeSelector = nilIfEmpty(launcherSelector)
		lt.Spec.Tolerations = cloneSlice(tolerations)
		lt.Spec.HostNetwork, lt.Spec.HostIPC, lt.Spec.HostPID = o.HostNetwork, o.HostIPC, o.HostPID
		withDNS(&lt.Spec)
		spec.LauncherTemplate = lt
	}

	return &etjobv1.ElasticJob{
		TypeMeta:   metav1.TypeMeta{APIVersion: etjobv1.GroupVersion.String(), Kind: "ElasticJob"},
		ObjectMeta: metav1.ObjectMeta{Name: o.Name, Namespace: o.Namespace, Labels: nilIfEmpty(labels)},
		Spec:       spec,
	}, nil
}

// crdMax is the CRD's maximum of backoffLimit
// (+kubebuilder:validation:Maximum=100000); it also keeps int32(n) from
// wrapping. Replica counts are bounded by etjobv1.MaxWorkers.
const crdMax = 100000

func checkCounts(o SubmitOptions) error {
	const limit = etjobv1.MaxWorkers
	for _, c := range []struct {
		flag string
		v    int
	}{{"--workers", o.Workers}, {"--min-workers", o.MinWorkers}, {"--max-workers", o.MaxWorkers}} {
		if c.v < 1 || c.v > limit {
			return fmt.Errorf("%s %d: must be between 1 and %d", c.flag, c.v, limit)
		}
	}
	if o.MinWorkers > o.MaxWorkers {
		return fmt.Errorf("--min-workers %d is more than --max-workers %d", o.MinWorkers, o.MaxWorkers)
	}
	if o.Workers < o.MinWorkers {
		return fmt.Errorf("--workers %d is fewer than --min-workers %d", o.Workers, o.MinWorkers)
	}
	if o.Workers > o.MaxWorkers {
		return fmt.Errorf("--workers %d is more than --max-workers %d", o.Workers, o.MaxWorkers)
	}
	return nil
}

// parseMaxWaitTime reads --max-wait-time: whole seconds as Arena ("600"), or
// a Go duration of whole seconds ("10m"); 0 means no limit.
func parseMaxWaitTime(s string) (int32, error) {
	return parseSeconds("--max-wait-time", s, "0 means no limit")
}

// growthFlags sets spec.growth from --growth and its tuning flags,
// spec.spot.maxPricePerHour from --max-price and spec.spot.budgetPerHour
// from --budget.
func growthFlags(o *SubmitOptions, spec *etjobv1.ElasticJobSpec) error {
	for _, f := range []struct {
		flag, value, example string
		set                  func(*etjobv1.SpotSpec, string)
	}{
		{"--max-price", o.MaxPrice, "0.95", func(s *etjobv1.SpotSpec, v string) { s.MaxPricePerHour = v }},
		{"--budget", o.Budget, "12.50", func(s *etjobv1.SpotSpec, v string) { s.BudgetPerHour = v }},
	} {
		if f.value == "" {
			continue
		}
		if p, err := etjobv1.ParsePricePerHour(f.value); err != nil || p <= 0 || !maxPricePattern.MatchString(f.value) {
			return fmt.Errorf("%s %q: give US dollars an hour as a decimal, like %s", f.flag, f.value, f.example)
		}
		if spec.Spot == nil {
			spec.Spot = &etjobv1.SpotSpec{}
		}
		f.set(spec.Spot, f.value)
	}
	if o.Growth == "" {
		if o.GrowthProbeTimeout != "" || o.GrowthBackoff != "" {
			return fmt.Errorf("--growth-probe-timeout and --growth-backoff need --growth Opportunistic")
		}
		return nil
	}
	policy, err := pickEnum("--growth", o.Growth, etjobv1.GrowthReplicas, etjobv1.GrowthOpportunistic)
	if err != nil {
		return err
	}
	g := &etjobv1.GrowthSpec{Policy: policy, PriorityClassName: etjobv1.DefaultGrowthPriorityClass, ProbeTimeoutSeconds: 120, BackoffSeconds: 300}
	if o.GrowthProbeTimeout != "" {
		if g.ProbeTimeoutSeconds, err = parseSeconds("--growth-probe-timeout", o.GrowthProbeTimeout, "at least 1"); err != nil {
			return err
		}
		if g.ProbeTimeoutSeconds < 1 {
			return fmt.Errorf("--growth-probe-timeout %q: at least 1 second", o.GrowthProbeTimeout)
		}
	}
	if o.GrowthBackoff != "" {
		if g.BackoffSeconds, err = parseSeconds("--growth-backoff", o.GrowthBackoff, "0 means none"); err != nil {
			return err
		}
	}
	if g.ProbeTimeoutSeconds > 86400 || g.BackoffSeconds > 86400 {
		return fmt.Errorf("--growth-probe-timeout and --growth-backoff: at most a day (86400)")
	}
	spec.Growth = g
	return nil
}

// maxPricePattern is the CRD's pattern of spec.spot.maxPricePerHour and
// budgetPerHour.
var maxPricePattern = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?$`)

// parseSeconds reads a flag of whole seconds ("600") or a duration ("10m").
func parseSeconds(flag, s, zero string) (int32, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, nil
	}
	bad := flag + " %q: give whole seconds (600) or a duration (10m); " + zero
	var secs int64
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		secs = n
	} else {
		d, err := time.ParseDuration(s)
		if err != nil {
			return 0, fmt.Errorf(bad, s)
		}
		if d%time.Second != 0 {
			return 0, fmt.Errorf("%s %q: must be whole seconds", flag, s)
		}
		secs = int64(d / time.Second)
	}
	if secs < 0 || secs > 1<<31-1 {
		return 0, fmt.Errorf(bad, s)
	}
	return int32(secs), nil
}

// backoffLimit reconciles --job-backoff-limit and Arena's --retry, which
// names the same limit (the job's retry count).
func backoffLimit(o SubmitOptions) (int32, error) {
	v := o.JobBackoffLimit
	if o.Retry != nil {
		if o.JobBackoffLimitSet && *o.Retry != o.JobBackoffLimit {
			return 0, fmt.Errorf("--retry %d and --job-backoff-limit %d disagree: --retry is Arena's older name of the same limit; give one", *o.Retry, o.JobBackoffLimit)
		}
		v = *o.Retry
	}
	if v < 0 || v > crdMax {
		return 0, fmt.Errorf("--job-backoff-limit %d: must be between 0 and %d", v, crdMax)
	}
	return int32(v), nil
}

// pickEnum matches s case-insensitively against the allowed values; empty
// stays empty (the API server's default).
func pickEnum[T ~string](flag, s string, allowed ...T) (T, error) {
	if s == "" {
		return "", nil
	}
	names := make([]string, len(allowed))
	for i, a := range allowed {
		if strings.EqualFold(s, string(a)) {
			return a, nil
		}
		names[i] = string(a)
	}
	return "", fmt.Errorf("%s %q: must be one of %s", flag, s, strings.Join(names, ", "))
}

func parsePairs(flag string, items []string, sep string) (map[string]string, error) {
	out := map[string]string{}
	for _, it := range items {
		k, v, ok := strings.Cut(it, sep)
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("%s %q: expected key%svalue", flag, it, sep)
		}
		out[k] = v
	}
	return out, nil
}

// parseLabels reads key=value labels (and node selectors, which are label
// matches) and checks them as the API server checks labels: the job's
// labels, and a node selector of a pod it would refuse (FuzzSubmitFlags).
func parseLabels(flag string, items []string) (map[string]string, error) {
	m, err := parsePairs(flag, items, "=")
	if err != nil {
		return nil, err
	}
	for k, v := range m {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return nil, fmt.Errorf("%s %s: %s", flag, k, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return nil, fmt.Errorf("%s %s=%s: %s", flag, k, v, strings.Join(errs, "; "))
		}
	}
	return m, nil
}

// parseAnnotations reads key=value annotations, whose keys the API server
// checks as it does label keys (lower-cased) and whose values are free.
func parseAnnotations(flag string, items []string) (map[string]string, error) {
	m, err := parsePairs(flag, items, "=")
	if err != nil {
		return nil, err
	}
	for k := range m {
		if errs := validation.IsQualifiedName(strings.ToLower(k)); len(errs) > 0 {
			return nil, fmt.Errorf("%s %s: %s", flag, k, strings.Join(errs, "; "))
		}
	}
	return m, nil
}

func parseEnv(items []string) ([]corev1.EnvVar, error) {
	var env []corev1.EnvVar
	for _, it := range items {
		k, v, ok := strings.Cut(it, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("-e/--env %q: expected NAME=value", it)
		}
		if errs := validation.IsEnvVarName(k); len(errs) > 0 {
			return nil, fmt.Errorf("-e/--env %q: %s", it, strings.Join(errs, "; "))
		}
		env = append(env, corev1.EnvVar{Name: k, Value: v})
	}
	return env, nil
}

// parseTolerations reads Arena's --toleration: "all" tolerates every taint;
// otherwise key[=value][:effect][,operator], the operator Equal when a value
// is given, else Exists.
func parseTolerations(items []string) ([]corev1.Toleration, error) {
	var out []corev1.Toleration
	for _, it := range items {
		if it == "all" {
			out = append(out, corev1.Toleration{Operator: corev1.TolerationOpExists})
			continue
		}
		main, op, hasOp := strings.Cut(it, ",")
		main, effect, _ := strings.Cut(main, ":")
		key, value, hasValue := strings.Cut(main, "=")
		t := corev1.Toleration{Key: key, Value: value, Effect: corev1.TaintEffect(effect)}
		if key == "" {
			return nil, fmt.Errorf(`--toleration %q: expected "key=value:effect,operator" or "all"`, it)
		}
		if errs := validation.IsQualifiedName(key); len(errs) > 0 {
			return nil, fmt.Errorf("--toleration %q: key %q: %s", it, key, strings.Join(errs, "; "))
		}
		switch corev1.TaintEffect(effect) {
		case "", corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
		default:
			return nil, fmt.Errorf("--toleration %q: effect %q must be NoSchedule, PreferNoSchedule or NoExecute", it, effect)
		}
		switch {
		case hasOp:
			o, err := pickEnum("--toleration "+it+": operator", op, corev1.TolerationOpEqual, corev1.TolerationOpExists)
			if err != nil {
				return nil, err
			}
			t.Operator = o
		case hasValue:
			t.Operator = corev1.TolerationOpEqual
		default:
			t.Operator = corev1.TolerationOpExists
		}
		if t.Operator == corev1.TolerationOpExists && t.Value != "" {
			return nil, fmt.Errorf("--toleration %q: operator Exists takes no value", it)
		}
		if errs := validation.IsValidLabelValue(t.Value); len(errs) > 0 {
			return nil, fmt.Errorf("--toleration %q: value %q: %s", it, t.Value, strings.Join(errs, "; "))
		}
		out = append(out, t)
	}
	return out, nil
}

// parseData reads -d PVC:MOUNTPATH and --data-dir HOSTPATH[:MOUNTPATH] into
// volumes and their mounts.
func parseData(data, dataDirs []string) ([]corev1.Volume, []corev1.VolumeMount, error) {
	var vols []corev1.Volume
	var mounts []corev1.VolumeMount
	seen := map[string]string{}
	addMount := func(flag, item, mountPath string) error {
		if !path.IsAbs(mountPath) {
			return fmt.Errorf("%s %q: the mount path must be absolute", flag, item)
		}
		if prev, ok := seen[path.Clean(mountPath)]; ok {
			return fmt.Errorf("%s %q: %s is already mounted by %q", flag, item, mountPath, prev)
		}
		seen[path.Clean(mountPath)] = item
		return nil
	}
	for i, it := range data {
		claim, mountPath, ok := strings.Cut(it, ":")
		if !ok || claim == "" || mountPath == "" {
			return nil, nil, fmt.Errorf("-d/--data %q: expected PVC:MOUNTPATH", it)
		}
		if errs := validation.IsDNS1123Subdomain(claim); len(errs) > 0 {
			return nil, nil, fmt.Errorf("-d/--data %q: PVC name: %s", it, strings.Join(errs, "; "))
		}
		if err := addMount("-d/--data", it, mountPath); err != nil {
			return nil, nil, err
		}
		name := fmt.Sprintf("data-%d", i)
		vols = append(vols, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}})
		mounts = append(mounts, corev1.VolumeMount{Name: name, MountPath: mountPath})
	}
	for i, it := range dataDirs {
		host, mountPath, ok := strings.Cut(it, ":")
		if !ok {
			mountPath = host
		}
		if !path.IsAbs(host) {
			return nil, nil, fmt.Errorf("--data-dir %q: the host path must be absolute", it)
		}
		if slices.Contains(strings.Split(host, "/"), "..") {
			return nil, nil, fmt.Errorf("--data-dir %q: the host path must not contain '..' (the API server refuses it)", it)
		}
		if err := addMount("--data-dir", it, mountPath); err != nil {
			return nil, nil, err
		}
		name := fmt.Sprintf("data-dir-%d", i)
		vols = append(vols, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: host}}})
		mounts = append(mounts, corev1.VolumeMount{Name: name, MountPath: mountPath})
	}
	return vols, mounts, nil
}

func workerResources(o SubmitOptions) (corev1.ResourceRequirements, error) {
	var r corev1.ResourceRequirements
	set := func(flag string, name corev1.ResourceName, s string) error {
		if s == "" {
			return nil
		}
		q, err := resource.ParseQuantity(s)
		if err != nil || q.Sign() <= 0 {
			return fmt.Errorf("%s %q: expected a positive quantity such as 4 or 16Gi", flag, s)
		}
		if r.Requests == nil {
			r.Requests, r.Limits = corev1.ResourceList{}, corev1.ResourceList{}
		}
		r.Requests[name], r.Limits[name] = q, q
		return nil
	}
	if err := set("--cpu", corev1.ResourceCPU, o.CPU); err != nil {
		return r, err
	}
	if err := set("--memory", corev1.ResourceMemory, o.Memory); err != nil {
		return r, err
	}
	if o.GPUs > 0 {
		if r.Limits == nil {
			r.Limits = corev1.ResourceList{}
		}
		r.Limits[etjobv1.ResourceGPU] = *resource.NewQuantity(int64(o.GPUs), resource.DecimalSI)
	}
	return r, nil
}

// checkpointWarning says when --checkpoint-dir is not on a -d/--data-dir
// mount: checkpoints there die with the pod.
func checkpointWarning(o SubmitOptions) string {
	if o.CheckpointDir == "" {
		return ""
	}
	dir := path.Clean(o.CheckpointDir)
	for _, it := range append(append([]string(nil), o.Data...), o.DataDirs...) {
		parts := strings.SplitN(it, ":", 2)
		mp := parts[len(parts)-1]
		if mp != "" && (dir == path.Clean(mp) || strings.HasPrefix(dir, path.Clean(mp)+"/")) {
			return ""
		}
	}
	return fmt.Sprintf("--checkpoint-dir %s is not under a -d/--data mount: checkpoints there are lost with the pod", o.CheckpointDir)
}

// printObject prints obj as YAML or JSON, without its (empty) status and
// null creation timestamps, so that the output applies as it is.
func printObject(w interface{ Write([]byte) (int, error) }, obj any, format string) error {
	raw, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return err
	}
	if st, ok := m["status"].(map[string]any); ok && isZeroStatus(st) {
		delete(m, "status")
	}
	dropNullTimestamps(m)
	var out []byte
	if format == "json" {
		out, err = json.MarshalIndent(m, "", "    ")
		out = append(out, '\n')
	} else {
		out, err = yaml.Marshal(m)
	}
	if err != nil {
		return err
	}
	_, err = w.Write(out)
	return err
}

func isZeroStatus(st map[string]any) bool {
	for _, v := range st {
		switch x := v.(type) {
		case float64:
			if x != 0 {
				return false
			}
		case string:
			if x != "" {
				return false
			}
		case map[string]any:
			if !isZeroStatus(x) {
				return false
			}
		default:
			if v != nil {
				return false
			}
		}
	}
	return true
}

func dropNullTimestamps(v any) {
	switch x := v.(type) {
	case map[string]any:
		for k, val := range x {
			if k == "creationTimestamp" && val == nil {
				delete(x, k)
				continue
			}
			if k == "metadata" {
				if mm, ok := val.(map[string]any); ok {
					dropNullTimestamps(mm)
					if len(mm) == 0 {
						delete(x, k)
					}
					continue
				}
			}
			if k == "resources" {
				if mm, ok := val.(map[string]any); ok && len(mm) == 0 {
					delete(x, k)
					continue
				}
			}
			dropNullTimestamps(val)
		}
	case []any:
		for _, e := range x {
			dropNullTimestamps(e)
		}
	}
}

func merged(a, b map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

func nilIfEmpty(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	return m
}

func cloneSlice[T any](s []T) []T {
	if len(s) == 0 {
		return nil
	}
	return append([]T(nil), s...)
}

// parseWorldSizes reads --world-sizes ("8,16,32"): positive, each a multiple
// of the ranks a worker holds (--nproc-per-node, else --gpus, else 1).
func parseWorldSizes(o SubmitOptions) ([]int32, error) {
	if strings.TrimSpace(o.WorldSizes) == "" {
		return nil, nil
	}
	per := 1
	switch {
	case o.NProcPerNode > 0:
		per = o.NProcPerNode
	case o.GPUs > 0:
		per = o.GPUs
	}
	var out []int32
	for _, f := range strings.Split(o.WorldSizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("--world-sizes %q: %q is not a positive number of ranks", o.WorldSizes, f)
		}
		if n%per != 0 {
			return nil, fmt.Errorf("--world-sizes %q: %d is not a multiple of the %d ranks a worker holds (--nproc-per-node, else --gpus): a worker's ranks leave and join together", o.WorldSizes, n, per)
		}
		if !slices.Contains(out, int32(n)) {
			out = append(out, int32(n))
		}
	}
	slices.Sort(out)
	return out, nil
}
