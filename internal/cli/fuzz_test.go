package cli

import (
	"fmt"
	"math"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// The CLI fuzz targets feed the flag parsers any strings and numbers a user
// could type. Property: either an error that names the flag (it contains
// "--"), or a value that validates: a job the API server and then the
// kubelet accept (kubeRules), a scale request whose numbers fit the API
// types. Never a panic.
//
//	go test -run '^$' -fuzz '^FuzzSubmitFlags$' -fuzztime 60s ./internal/cli

// submitInput holds the fuzzed flags of `etjob submit`.
type submitInput struct {
	name, image, command, maxWait, cpu, memory                     string
	workers, minWorkers, maxWorkers, gpus                          int
	selector, launcherSelector, label, annotation, env, toleration string
	data, dataDir, pullPolicy, priority, scheduler, checkpointDir  string
}

func (in submitInput) options() SubmitOptions {
	o := SubmitOptions{
		Name: in.name, Namespace: "ns", Image: in.image, Command: in.command, MaxWaitTime: in.maxWait,
		CPU: in.cpu, Memory: in.memory, Workers: in.workers, MinWorkers: in.minWorkers, MaxWorkers: in.maxWorkers,
		GPUs: in.gpus, JobBackoffLimit: 6, ImagePullPolicy: in.pullPolicy, Priority: in.priority,
		Scheduler: in.scheduler, CheckpointDir: in.checkpointDir,
	}
	// An empty fuzzed list flag is a flag not given.
	for _, l := range []struct {
		dst *[]string
		v   string
	}{
		{&o.Selectors, in.selector}, {&o.LauncherSelectors, in.launcherSelector}, {&o.Labels, in.label},
		{&o.Annotations, in.annotation}, {&o.Envs, in.env}, {&o.Tolerations, in.toleration},
		{&o.Data, in.data}, {&o.DataDirs, in.dataDir},
	} {
		if l.v != "" {
			*l.dst = []string{l.v}
		}
	}
	return o
}

func FuzzSubmitFlags(f *testing.F) {
	// The documented command lines: seed 000 and 001 (docs/cli.md) and the
	// torchrun example of `etjob submit --help`.
	seeds := []submitInput{
		{name: "elastic-training", image: "registry.cn-hangzhou.aliyuncs.com/ai-samples/horovod:0.20.0-tf2.3.0-torch1.6.0-mxnet1.6.0.post0-py3.7-cuda10.1",
			command: seed001, maxWait: "0", workers: 3, minWorkers: 1, maxWorkers: 9, gpus: 1},
		{name: "fine-tuning-elastic", image: "registry.cn-beijing.aliyuncs.com/acs/bert-elastic-demo:v1.5", command: "horovodrun -np 8 python train_bert.py",
			maxWait: "600", cpu: "4", memory: "16Gi", workers: 8, minWorkers: 1, maxWorkers: 128, gpus: 1,
			launcherSelector: "instance_type=spot-launcher", toleration: "all"},
		{name: "digits", image: "etjob/digits:local", command: "python3 -m etjob.torchrun /opt/etjob/examples/digits/train.py",
			maxWait: "10m", workers: 4, minWorkers: 2, maxWorkers: 6, gpus: 1, data: "digits-ckpt:/ckpt", checkpointDir: "/ckpt",
			selector: "pool=spot", label: "kueue.x-k8s.io/queue-name=q", annotation: "a=b", env: "A=x=y",
			toleration: "gpu=true:NoSchedule", dataDir: "/opt/code:/code", pullPolicy: "IfNotPresent", priority: "high", scheduler: "default-scheduler"},
	}
	for _, s := range seeds {
		f.Add(s.name, s.image, s.command, s.maxWait, s.cpu, s.memory, s.workers, s.minWorkers, s.maxWorkers, s.gpus,
			s.selector, s.launcherSelector, s.label, s.annotation, s.env, s.toleration, s.data, s.dataDir, s.pullPolicy, s.priority, s.scheduler, s.checkpointDir)
	}
	f.Fuzz(func(t *testing.T, name, image, command, maxWait, cpu, memory string, workers, minWorkers, maxWorkers, gpus int,
		selector, launcherSelector, label, annotation, env, toleration, data, dataDir, pullPolicy, priority, scheduler, checkpointDir string) {
		in := submitInput{name, image, command, maxWait, cpu, memory, workers, minWorkers, maxWorkers, gpus,
			selector, launcherSelector, label, annotation, env, toleration, data, dataDir, pullPolicy, priority, scheduler, checkpointDir}
		job, err := BuildElasticJob(in.options())
		if err != nil {
			if !strings.Contains(err.Error(), "--") && !strings.Contains(err.Error(), "training command") {
				t.Fatalf("error %q names no flag", err)
			}
			return
		}
		if errs := kubeRules(job); len(errs) > 0 {
			t.Fatalf("flags %+v built a job the API server or kubelet refuses:\n%s", in, strings.Join(errs, "\n"))
		}
	})
}

// kubeRules checks the job against what the API server enforces on it (the
// CRD's schema and CEL rules, api/v1alpha1) and, for its templates, what it
// enforces on the pods the controller creates from them (Kubernetes'
// pkg/apis/core/validation: ValidatePodSpec, ValidateTolerations,
// validateVolumes, validateContainers), restricted to the fields submit
// sets. A job that passes submit but fails here is created and then stays
// without workers.
func kubeRules(job *etjobv1.ElasticJob) []string {
	var errs []string
	add := func(list field.ErrorList) {
		for _, e := range list {
			errs = append(errs, e.Error())
		}
	}
	s := job.Spec
	if s.MinReplicas < 1 || s.MinReplicas > s.Replicas || s.Replicas > s.MaxReplicas || s.MaxReplicas > etjobv1.MaxWorkers {
		errs = append(errs, fmt.Sprintf("spec: replicas %d, min %d, max %d", s.Replicas, s.MinReplicas, s.MaxReplicas))
	}
	if s.MaxWaitTime < 0 || len(s.CheckpointDir) > 4096 || (s.BackoffLimit != nil && (*s.BackoffLimit < 0 || *s.BackoffLimit > 100000)) {
		errs = append(errs, fmt.Sprintf("spec: maxWaitTime %d, checkpointDir of %d bytes, backoffLimit %v", s.MaxWaitTime, len(s.CheckpointDir), s.BackoffLimit))
	}
	if s.Framework == etjobv1.FrameworkHorovod && s.LauncherTemplate == nil {
		errs = append(errs, "spec.launcherTemplate is required when spec.framework is horovod")
	}
	add(metav1validation.ValidateLabels(job.Labels, field.NewPath("metadata", "labels")))
	templates := map[string]*corev1.PodTemplateSpec{"workerTemplate": &s.WorkerTemplate}
	if s.LauncherTemplate != nil {
		templates["launcherTemplate"] = s.LauncherTemplate
	}
	for name, tpl := range templates {
		p := field.NewPath("spec", name)
		add(metav1validation.ValidateLabels(tpl.Labels, p.Child("metadata", "labels")))
		add(apivalidation.ValidateAnnotations(tpl.Annotations, p.Child("metadata", "annotations")))
		spec := p.Child("spec")
		add(metav1validation.ValidateLabels(tpl.Spec.NodeSelector, spec.Child("nodeSelector")))
		for _, msg := range validation.IsDNS1123Subdomain(tpl.Spec.PriorityClassName) {
			if tpl.Spec.PriorityClassName != "" {
				errs = append(errs, spec.Child("priorityClassName").String()+": "+msg)
			}
		}
		for _, msg := range validation.IsDNS1123Subdomain(tpl.Spec.SchedulerName) {
			if tpl.Spec.SchedulerName != "" {
				errs = append(errs, spec.Child("schedulerName").String()+": "+msg)
			}
		}
		for i, t := range tpl.Spec.Tolerations {
			tp := spec.Child("tolerations").Index(i)
			if t.Key != "" {
				add(metav1validation.ValidateLabelName(t.Key, tp.Child("key")))
			} else if t.Operator != corev1.TolerationOpExists {
				errs = append(errs, tp.String()+": operator must be Exists when key is empty")
			}
			switch t.Operator {
			case corev1.TolerationOpEqual, "":
				for _, msg := range validation.IsValidLabelValue(t.Value) {
					errs = append(errs, tp.Child("value").String()+": "+msg)
				}
			case corev1.TolerationOpExists:
				if t.Value != "" {
					errs = append(errs, tp.String()+": value must be empty when operator is Exists")
				}
			default:
				errs = append(errs, tp.String()+": operator "+string(t.Operator))
			}
		}
		volumes := map[string]bool{}
		for i, v := range tpl.Spec.Volumes {
			vp := spec.Child("volumes").Index(i)
			volumes[v.Name] = true
			switch {
			case v.HostPath != nil:
				// validatePathNoBacksteps
				if v.HostPath.Path == "" || slices.Contains(strings.Split(v.HostPath.Path, "/"), "..") {
					errs = append(errs, vp.Child("hostPath", "path").String()+": must not contain '..': "+v.HostPath.Path)
				}
			case v.PersistentVolumeClaim != nil:
				if v.PersistentVolumeClaim.ClaimName == "" {
					errs = append(errs, vp.String()+": claimName required")
				}
			}
		}
		for i, c := range tpl.Spec.Containers {
			cp := spec.Child("containers").Index(i)
			if c.Image == "" || strings.TrimSpace(c.Image) != c.Image {
				errs = append(errs, cp.Child("image").String()+": must be set, without leading or trailing whitespace")
			}
			for _, e := range c.Env {
				for _, msg := range validation.IsEnvVarName(e.Name) {
					errs = append(errs, cp.Child("env").String()+": "+msg)
				}
			}
			mounts := map[string]bool{}
			for _, m := range c.VolumeMounts {
				if !volumes[m.Name] || m.MountPath == "" || mounts[m.MountPath] || !path.IsAbs(m.MountPath) {
					errs = append(errs, fmt.Sprintf("%s: mount %+v", cp.Child("volumeMounts"), m))
				}
				mounts[m.MountPath] = true
			}
			for n, q := range c.Resources.Limits {
				if r, ok := c.Resources.Requests[n]; (ok && r.Cmp(q) > 0) || q.Sign() < 0 {
					errs = append(errs, fmt.Sprintf("%s: %s request %s above limit %s", cp.Child("resources"), n, r.String(), q.String()))
				}
			}
		}
	}
	return errs
}

// FuzzScaleFlags feeds `etjob scale`, `scaleout` and `scalein` any
// --replicas, --count, --timeout and number of --instance pods. Property:
// an error naming a flag, or numbers that fit the API: replicas and count
// within the CRD's 0..100000 (an int32 conversion must not wrap), a timeout
// of zero or more that a ScaleRequest's timeoutSeconds holds.
//
//	go test -run '^$' -fuzz '^FuzzScaleFlags$' -fuzztime 60s ./internal/cli
func FuzzScaleFlags(f *testing.F) {
	// docs/cli.md and the commands' examples.
	f.Add(uint8(0), 4, 1, "10m", uint8(0))
	f.Add(uint8(1), -1, 1, "60s", uint8(0))
	f.Add(uint8(2), -1, 1, "600", uint8(1))
	f.Add(uint8(2), -1, 2, "0", uint8(2))
	f.Fuzz(func(t *testing.T, verb uint8, replicas, count int, timeout string, instances uint8) {
		o := ScaleOptions{Verb: []string{verbScale, verbScaleOut, verbScaleIn}[verb%3], Name: "j", Replicas: replicas, Count: count}
		for i := range int(instances % 4) {
			o.Instances = append(o.Instances, fmt.Sprintf("j-worker-%d", i))
		}
		d, err := parseTimeout(timeout)
		if err == nil {
			err = o.Validate()
		}
		if err != nil {
			if !strings.Contains(err.Error(), "--") {
				t.Fatalf("error %q names no flag", err)
			}
			return
		}
		if d < 0 {
			t.Fatalf("--timeout %q parsed to %v, a negative timeout", timeout, d)
		}
		if secs := requestTimeoutSeconds(d); secs < 1 || time.Duration(secs)*time.Second < d {
			t.Fatalf("--timeout %q (%v): the request's timeoutSeconds is %d", timeout, d, secs)
		}
		switch o.Verb {
		case verbScale:
			if o.Replicas > etjobv1.MaxWorkers {
				t.Fatalf("--replicas %d validated: above the CRD's maximum of %d, and int32(%d) = %d", o.Replicas, etjobv1.MaxWorkers, o.Replicas, int32(o.Replicas))
			}
		default:
			if o.Count < 1 || o.Count > etjobv1.MaxWorkers {
				t.Fatalf("--count %d validated: the CRD takes 0 to %d, and int32(%d) = %d", o.Count, etjobv1.MaxWorkers, o.Count, int32(o.Count))
			}
			if target, _ := o.target(100000); target > math.MaxInt32-100000 || target < -100000 {
				t.Fatalf("--count %d: target %d wrapped", o.Count, target)
			}
		}
	})
}
