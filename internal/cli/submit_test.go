package cli

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/render"
)

// seed001 is the horovod command line of seed 001, as the shell passes it.
const seed001 = `horovodrun \
    -np $((${workers}*${gpus})) \
    --min-np $((${minWorkers}*${gpus})) \
    --max-np $((${maxWorkers}*${gpus})) \
    --host-discovery-script /etc/edl/discover_hosts.sh \
    python /examples/elastic/tensorflow2_mnist_elastic.py
    `

func baseOptions() SubmitOptions {
	return SubmitOptions{Name: "j", Namespace: "ns", Image: "img", Command: "torchrun train.py",
		Workers: 1, MinWorkers: 1, MaxWorkers: 1000, JobBackoffLimit: 6, MaxWaitTime: "0"}
}

func TestBuildElasticJob(t *testing.T) {
	cases := map[string]struct {
		opts  func(*SubmitOptions)
		check func(t *testing.T, j *etjobv1.ElasticJob)
	}{
		"defaults are Arena's": {
			opts: func(*SubmitOptions) {},
			check: func(t *testing.T, j *etjobv1.ElasticJob) {
				s := j.Spec
				if s.Replicas != 1 || s.MinReplicas != 1 || s.MaxReplicas != 1000 || *s.BackoffLimit != 6 || s.MaxWaitTime != 0 {
					t.Errorf("spec = %+v", s)
				}
				if s.Framework != etjobv1.FrameworkTorchrun || s.LauncherTemplate != nil {
					t.Errorf("torchrun without launcher flags must leave launcherTemplate nil, got %+v", s.LauncherTemplate)
				}
				if diff := cmp.Diff([]string{"sh", "-c", "torchrun train.py"}, s.WorkerTemplate.Spec.Containers[0].Command); diff != "" {
					t.Errorf("worker command (-want +got):\n%s", diff)
				}
			},
		},
		"--world-sizes is spec.worldSizes, sorted, once each": {
			opts: func(o *SubmitOptions) { o.Recovery, o.GPUs, o.WorldSizes = "InProcess", 8, "32, 8,16,8" },
			check: func(t *testing.T, j *etjobv1.ElasticJob) {
				if diff := cmp.Diff([]int32{8, 16, 32}, j.Spec.WorldSizes); diff != "" {
					t.Errorf("worldSizes (-want +got):\n%s", diff)
				}
			},
		},
		"--nproc-per-node is spec.slotsPerWorker, whatever --gpus says": {
			opts: func(o *SubmitOptions) { o.GPUs, o.NProcPerNode = 1, 2 },
			check: func(t *testing.T, j *etjobv1.ElasticJob) {
				if got := etjobv1.SlotsPerWorker(&j.Spec); got != 2 {
					t.Errorf("slots per worker %d, want 2", got)
				}
			},
		},
		"a horovodrun command without --framework is horovod, as in Arena": {
			opts: func(o *SubmitOptions) { o.Framework, o.Command = "", seed001 },
			check: func(t *testing.T, j *etjobv1.ElasticJob) {
				if j.Spec.Framework != etjobv1.FrameworkHorovod || j.Spec.LauncherTemplate == nil {
					t.Errorf("framework %q, launcher %v", j.Spec.Framework, j.Spec.LauncherTemplate != nil)
				}
			},
		},
		"seed 001 horovod: launcher runs the command verbatim, workers idle": {
			opts: func(o *SubmitOptions) {
				o.Framework, o.Name, o.GPUs, o.Workers, o.MaxWorkers, o.WorkingDir, o.Command = "horovod", "elastic-training", 1, 3, 9, "/examples", seed001
			},
			check: func(t *testing.T, j *etjobv1.ElasticJob) {
				l := j.Spec.LauncherTemplate.Spec.Containers[0]
				if diff := cmp.Diff([]string{"sh", "-c", seed001}, l.Command); diff != "" {
					t.Errorf("launcher command (-want +got):\n%s", diff)
				}
				if l.WorkingDir != "/examples" || l.Resources.Limits != nil {
					t.Errorf("launcher = %+v", l)
				}
				w := j.Spec.WorkerTemplate.Spec.Containers[0]
				if w.Command[2] != horovodWorkerIdle {
					t.Errorf("worker command = %q", w.Command)
				}
				if q := w.Resources.Limits["nvidia.com/gpu"]; q.Value() != 1 {
					t.Errorf("worker GPU limit = %v", q)
				}
				if j.Spec.SlotsPerWorker != nil {
					t.Errorf("slotsPerWorker must derive from the GPU limit, got %d", *j.Spec.SlotsPerWorker)
				}
			},
		},
		"seed 000 spot flags": {
			opts: func(o *SubmitOptions) {
				o.Framework, o.SpotInstance, o.MaxWaitTime = "horovod", true, "600"
				o.Command = "horovodrun --log-level DEBUG --verbose -np $((${workers}*${gpus})) python train_bert.py"
				o.JobRestartPolicy, o.JobBackoffLimit, o.JobBackoffLimitSet, o.WorkerRestartPolicy = "OnFailure", 3, true, "Always"
				o.LauncherSelectors, o.Tolerations = []string{"instance_type=spot-launcher"}, []string{"all"}
				o.CPU, o.Memory = "4", "16Gi"
			},
			check: func(t *testing.T, j *etjobv1.ElasticJob) {
				s := j.Spec
				if !s.Spot.Enabled || s.MaxWaitTime != 600 || s.RestartPolicy != etjobv1.RestartPolicyOnFailure || *s.BackoffLimit != 3 || s.WorkerRestartPolicy != etjobv1.WorkerRestartAlways {
					t.Errorf("spec = %+v", s)
				}
				if diff := cmp.Diff(map[string]string{"instance_type": "spot-launcher"}, s.LauncherTemplate.Spec.NodeSelector); diff != "" {
					t.Errorf("launcher selector (-want +got):\n%s", diff)
				}
				want := []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
				if diff := cmp.Diff(want, s.WorkerTemplate.Spec.Tolerations); diff != "" {
					t.Errorf("tolerations (-want +got):\n%s", diff)
				}
				r := s.WorkerTemplate.Spec.Containers[0].Resources
				if !r.Requests.Cpu().Equal(resource.MustParse("4")) || !r.Limits.Memory().Equal(resource.MustParse("16Gi")) {
					t.Errorf("resources = %+v", r)
				}
			},
		},
		"max-wait-time as a duration": {
			opts:  func(o *SubmitOptions) { o.MaxWaitTime = "10m" },
			check: func(t *testing.T, j *etjobv1.ElasticJob) { want(t, j.Spec.MaxWaitTime, int32(600)) },
		},
		"retry is the backoff limit": {
			opts:  func(o *SubmitOptions) { o.Retry = ptr.To(2) },
			check: func(t *testing.T, j *etjobv1.ElasticJob) { want(t, *j.Spec.BackoffLimit, int32(2)) },
		},
		"torchrun with launcher flags gets a rendezvous launcher without the claims": {
			opts: func(o *SubmitOptions) {
				o.LauncherSelectors, o.LauncherAnnotations = []string{"pool=od"}, []string{"a=b"}
				o.Data, o.DataDirs = []string{"ckpt:/ckpt"}, []string{"/opt/code"}
				o.Selectors, o.Annotations, o.WorkerAnnotations = []string{"pool=spot"}, []string{"x=y"}, []string{"w=1"}
			},
			check: func(t *testing.T, j *etjobv1.ElasticJob) {
				l := j.Spec.LauncherTemplate
				if l.Spec.Containers[0].Command[2] != "etjob.rdzv" || l.Spec.NodeSelector["pool"] != "od" {
					t.Errorf("launcher = %+v", l.Spec)
				}
				if diff := cmp.Diff(map[string]string{"x": "y", "a": "b"}, l.Annotations); diff != "" {
					t.Errorf("launcher annotations (-want +got):\n%s", diff)
				}
				if len(l.Spec.Volumes) != 1 || l.Spec.Volumes[0].HostPath == nil {
					t.Errorf("launcher volumes = %+v", l.Spec.Volumes)
				}
				// One builder: the controller's default launcher, with the
				// flags' placement only.
				placed := render.RendezvousLauncherTemplate(j.Spec.WorkerTemplate).Spec
				placed.NodeSelector = map[string]string{"pool": "od"}
				if diff := cmp.Diff(placed, l.Spec); diff != "" {
					t.Errorf("launcher is not render's default placed by the flags (-want +got):\n%s", diff)
				}
				w := j.Spec.WorkerTemplate
				if len(w.Spec.Volumes) != 2 || w.Spec.Volumes[0].PersistentVolumeClaim.ClaimName != "ckpt" || w.Spec.Containers[0].VolumeMounts[0].MountPath != "/ckpt" {
					t.Errorf("worker volumes = %+v", w.Spec)
				}
				if diff := cmp.Diff(map[string]string{"x": "y", "w": "1"}, w.Annotations); diff != "" {
					t.Errorf("worker annotations (-want +got):\n%s", diff)
				}
				want(t, w.Spec.NodeSelector["pool"], "spot")
			},
		},
		"env, labels, priority, pull policy and secrets": {
			opts: func(o *SubmitOptions) {
				o.Envs, o.Labels, o.Priority = []string{"A=1", "B=x=y"}, []string{"team=ml"}, "high"
				o.ImagePullPolicy, o.ImagePullSecrets, o.Shell = "ifnotpresent", []string{"reg"}, "bash"
			},
			check: func(t *testing.T, j *etjobv1.ElasticJob) {
				w := j.Spec.WorkerTemplate
				c := w.Spec.Containers[0]
				if diff := cmp.Diff([]corev1.EnvVar{{Name: "A", Value: "1"}, {Name: "B", Value: "x=y"}}, c.Env); diff != "" {
					t.Errorf("env (-want +got):\n%s", diff)
				}
				want(t, j.Labels["team"], "ml")
				want(t, w.Labels["team"], "ml")
				want(t, w.Spec.PriorityClassName, "high")
				want(t, c.ImagePullPolicy, corev1.PullIfNotPresent)
				want(t, w.Spec.ImagePullSecrets[0].Name, "reg")
				want(t, c.Command[0], "bash")
			},
		},
		"toleration with key, value, effect and operator": {
			opts: func(o *SubmitOptions) { o.Tolerations = []string{"gpu=true:NoSchedule", "spot:NoExecute,Exists"} },
			check: func(t *testing.T, j *etjobv1.ElasticJob) {
				w := []corev1.Toleration{
					{Key: "gpu", Value: "true", Effect: corev1.TaintEffectNoSchedule, Operator: corev1.TolerationOpEqual},
					{Key: "spot", Effect: corev1.TaintEffectNoExecute, Operator: corev1.TolerationOpExists},
				}
				if diff := cmp.Diff(w, j.Spec.WorkerTemplate.Spec.Tolerations); diff != "" {
					t.Errorf("tolerations (-want +got):\n%s", diff)
				}
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			o := baseOptions()
			tc.opts(&o)
			j, err := BuildElasticJob(o)
			if err != nil {
				t.Fatalf("BuildElasticJob: %v", err)
			}
			tc.check(t, j)
		})
	}
}

func want[T comparable](t *testing.T, got, want T) {
	t.Helper()
	if got != want {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestBuildElasticJobRefusals(t *testing.T) {
	cases := map[string]struct {
		opts     func(*SubmitOptions)
		wantFlag string
	}{
		"no name":                       {func(o *SubmitOptions) { o.Name = "" }, "--name"},
		"bad name":                      {func(o *SubmitOptions) { o.Name = "My_Job" }, "--name"},
		"no image":                      {func(o *SubmitOptions) { o.Image = "" }, "--image"},
		"no command":                    {func(o *SubmitOptions) { o.Command = "" }, "training command"},
		"framework":                     {func(o *SubmitOptions) { o.Framework = "mpi" }, "--framework"},
		"horovod without horovodrun":    {func(o *SubmitOptions) { o.Framework = "horovod" }, "--framework horovod"},
		"min above max":                 {func(o *SubmitOptions) { o.MinWorkers, o.MaxWorkers = 5, 4; o.Workers = 4 }, "--min-workers"},
		"workers below min":             {func(o *SubmitOptions) { o.MinWorkers = 2 }, "--workers"},
		"workers above max":             {func(o *SubmitOptions) { o.Workers, o.MaxWorkers = 5, 4 }, "--workers"},
		"negative gpus":                 {func(o *SubmitOptions) { o.GPUs = -1 }, "--gpus"},
		"nproc per node":                {func(o *SubmitOptions) { o.NProcPerNode = 2000 }, "--nproc-per-node"},
		"world sizes not a number":      {func(o *SubmitOptions) { o.Recovery, o.WorldSizes = "InProcess", "8,x" }, "--world-sizes"},
		"world sizes not a multiple":    {func(o *SubmitOptions) { o.Recovery, o.NProcPerNode, o.WorldSizes = "InProcess", 8, "8,12" }, "not a multiple of the 8 ranks"},
		"world sizes without InProcess": {func(o *SubmitOptions) { o.WorldSizes = "8" }, "--world-sizes needs --recovery InProcess"},
		"fractional wait":               {func(o *SubmitOptions) { o.MaxWaitTime = "1.5s" }, "--max-wait-time"},
		"garbage wait":                  {func(o *SubmitOptions) { o.MaxWaitTime = "soon" }, "--max-wait-time"},
		"restart policy":                {func(o *SubmitOptions) { o.JobRestartPolicy = "Always" }, "--job-restart-policy"},
		"recovery":                      {func(o *SubmitOptions) { o.Recovery = "Resume" }, "--recovery"},
		"in-process horovod": {func(o *SubmitOptions) {
			o.Recovery, o.Framework, o.Command = "InProcess", "horovod", "horovodrun python train.py"
		}, "--recovery InProcess needs --framework torchrun"},
		"worker restart policy":   {func(o *SubmitOptions) { o.WorkerRestartPolicy = "Sometimes" }, "--worker-restart-policy"},
		"retry disagrees":         {func(o *SubmitOptions) { o.Retry, o.JobBackoffLimitSet, o.JobBackoffLimit = ptr.To(1), true, 3 }, "--retry"},
		"selector":                {func(o *SubmitOptions) { o.Selectors = []string{"novalue"} }, "--selector"},
		"launcher selector":       {func(o *SubmitOptions) { o.LauncherSelectors = []string{"=x"} }, "--launcher-selector"},
		"toleration effect":       {func(o *SubmitOptions) { o.Tolerations = []string{"k=v:Sometimes"} }, "--toleration"},
		"toleration exists+value": {func(o *SubmitOptions) { o.Tolerations = []string{"k=v,Exists"} }, "--toleration"},
		"env":                     {func(o *SubmitOptions) { o.Envs = []string{"1A=x"} }, "-e/--env"},
		"label value":             {func(o *SubmitOptions) { o.Labels = []string{"a=b c"} }, "-l/--label"},
		"data":                    {func(o *SubmitOptions) { o.Data = []string{"pvc"} }, "-d/--data"},
		"data relative":           {func(o *SubmitOptions) { o.Data = []string{"pvc:data"} }, "-d/--data"},
		"data twice":              {func(o *SubmitOptions) { o.Data = []string{"a:/d", "b:/d"} }, "-d/--data"},
		"cpu":                     {func(o *SubmitOptions) { o.CPU = "lots" }, "--cpu"},
		"memory":                  {func(o *SubmitOptions) { o.Memory = "-1Gi" }, "--memory"},
		"pull policy":             {func(o *SubmitOptions) { o.ImagePullPolicy = "Sometimes" }, "--image-pull-policy"},
		"checkpoint dir":          {func(o *SubmitOptions) { o.CheckpointDir = "ckpt" }, "--checkpoint-dir"},
		"shell":                   {func(o *SubmitOptions) { o.Shell = "zsh" }, "--shell"},
		"growth":                  {func(o *SubmitOptions) { o.Growth = "ToMax" }, "--growth"},
		"probe timeout alone":     {func(o *SubmitOptions) { o.GrowthProbeTimeout = "30s" }, "--growth-probe-timeout"},
		"probe timeout 0":         {func(o *SubmitOptions) { o.Growth, o.GrowthProbeTimeout = "Opportunistic", "0" }, "--growth-probe-timeout"},
		"backoff":                 {func(o *SubmitOptions) { o.Growth, o.GrowthBackoff = "Opportunistic", "later" }, "--growth-backoff"},
		"max price":               {func(o *SubmitOptions) { o.MaxPrice = "$1" }, "--max-price"},
		"max price exponent":      {func(o *SubmitOptions) { o.MaxPrice = "1e3" }, "--max-price"},
		"budget":                  {func(o *SubmitOptions) { o.Budget = "12,50" }, "--budget"},
		"budget 0":                {func(o *SubmitOptions) { o.Budget = "0" }, "--budget"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			o := baseOptions()
			tc.opts(&o)
			_, err := BuildElasticJob(o)
			if err == nil || !strings.Contains(err.Error(), tc.wantFlag) {
				t.Fatalf("err = %v, want one naming %s", err, tc.wantFlag)
			}
		})
	}
}

func TestBuildElasticJobGrowth(t *testing.T) {
	o := baseOptions()
	o.Growth, o.GrowthProbeTimeout, o.GrowthBackoff, o.MaxPrice, o.Budget = "Opportunistic", "30s", "90", "0.95", "12.50"
	job, err := BuildElasticJob(o)
	if err != nil {
		t.Fatal(err)
	}
	g := job.Spec.Growth
	if g == nil || g.Policy != etjobv1.GrowthOpportunistic || g.ProbeTimeoutSeconds != 30 || g.BackoffSeconds != 90 || g.PriorityClassName != etjobv1.DefaultGrowthPriorityClass {
		t.Errorf("spec.growth = %+v", g)
	}
	if job.Spec.Spot == nil || job.Spec.Spot.MaxPricePerHour != "0.95" || job.Spec.Spot.BudgetPerHour != "12.50" {
		t.Errorf("spec.spot = %+v, want maxPricePerHour 0.95 and budgetPerHour 12.50", job.Spec.Spot)
	}
}

func TestCheckpointWarning(t *testing.T) {
	o := baseOptions()
	o.CheckpointDir = "/ckpt/run1"
	if checkpointWarning(o) == "" {
		t.Error("no warning for a checkpoint dir on no mount")
	}
	o.Data = []string{"pvc:/ckpt"}
	if w := checkpointWarning(o); w != "" {
		t.Errorf("warning %q for a checkpoint dir on a PVC", w)
	}
}

func TestCommandLineJoinsLines(t *testing.T) {
	// Seed 000 breaks its horovodrun line over several lines of one quoted
	// argument; sh -c would run each line as a command of its own.
	got := commandLine([]string{"horovodrun --verbose\n  -np 2\r\n  --min-np 1 \\\n python train.py --epochs=5 ", "--x"})
	if want := "horovodrun --verbose   -np 2    --min-np 1 \\\n python train.py --epochs=5  --x"; got != want {
		t.Errorf("commandLine = %q, want %q", got, want)
	}
}
