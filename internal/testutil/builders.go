// Package testutil has builders of ElasticJobs, pods and nodes for tests, in
// the style of kueue's pkg/util/testing: MakeElasticJob("j", "ns").Replicas(4).Obj().
package testutil

import (
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/core"
)

// JobWrapper builds an ElasticJob.
type JobWrapper struct{ etjobv1.ElasticJob }

// MakeElasticJob returns a torchrun job with the API server's defaults applied.
func MakeElasticJob(name, ns string) *JobWrapper {
	return &JobWrapper{etjobv1.ElasticJob{
		TypeMeta:   metav1.TypeMeta{APIVersion: etjobv1.GroupVersion.String(), Kind: "ElasticJob"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID(name + "-uid"), Generation: 1},
		Spec: etjobv1.ElasticJobSpec{
			Replicas: 1, MinReplicas: 1, MaxReplicas: 1000,
			Framework:           etjobv1.FrameworkTorchrun,
			RestartPolicy:       etjobv1.RestartPolicyNever,
			WorkerRestartPolicy: etjobv1.WorkerRestartExitCode,
			CleanPodPolicy:      etjobv1.CleanPodPolicyRunning,
			WorkerTemplate: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{
				Name: "worker", Image: "python:3.11", Command: []string{"torchrun", "train.py"},
			}}}},
		},
	}}
}

// Obj returns the job.
func (w *JobWrapper) Obj() *etjobv1.ElasticJob { return &w.ElasticJob }

// Replicas sets spec.replicas.
func (w *JobWrapper) Replicas(n int32) *JobWrapper { w.Spec.Replicas = n; return w }

// Min sets spec.minReplicas.
func (w *JobWrapper) Min(n int32) *JobWrapper { w.Spec.MinReplicas = n; return w }

// Max sets spec.maxReplicas.
func (w *JobWrapper) Max(n int32) *JobWrapper { w.Spec.MaxReplicas = n; return w }

// Framework sets spec.framework (and a launcher template for horovod).
func (w *JobWrapper) Framework(f etjobv1.Framework) *JobWrapper {
	w.Spec.Framework = f
	if f == etjobv1.FrameworkHorovod && w.Spec.LauncherTemplate == nil {
		w.Spec.LauncherTemplate = &corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "launcher", Image: "horovod", Command: []string{"horovodrun"},
		}}}}
	}
	return w
}

// LauncherCommand sets the launcher container's command.
func (w *JobWrapper) LauncherCommand(cmd ...string) *JobWrapper {
	w.Spec.LauncherTemplate.Spec.Containers[0].Command = cmd
	return w
}

// Recovery sets spec.recovery.
func (w *JobWrapper) Recovery(r etjobv1.Recovery) *JobWrapper {
	w.Spec.Recovery = r
	return w
}

// RestartPolicy sets spec.restartPolicy.

func (w *JobWrapper) RestartPolicy(p etjobv1.RestartPolicy) *JobWrapper {
	w.Spec.RestartPolicy = p
	return w
}

// WorkerRestartPolicy sets spec.workerRestartPolicy.
func (w *JobWrapper) WorkerRestartPolicy(p etjobv1.WorkerRestartPolicy) *JobWrapper {
	w.Spec.WorkerRestartPolicy = p
	return w
}

// BackoffLimit sets spec.backoffLimit.
func (w *JobWrapper) BackoffLimit(n int32) *JobWrapper { w.Spec.BackoffLimit = &n; return w }

// MaxWaitTime sets spec.maxWaitTime.
func (w *JobWrapper) MaxWaitTime(s int32) *JobWrapper { w.Spec.MaxWaitTime = s; return w }

// Spot sets spec.spot.
func (w *JobWrapper) Spot(sp etjobv1.SpotSpec) *JobWrapper { w.Spec.Spot = &sp; return w }

// Growth sets spec.growth.
func (w *JobWrapper) Growth(g etjobv1.GrowthSpec) *JobWrapper { w.Spec.Growth = &g; return w }

// Label sets a label on the job.
func (w *JobWrapper) Label(k, v string) *JobWrapper {
	if w.Labels == nil {
		w.Labels = map[string]string{}
	}
	w.Labels[k] = v
	return w
}

// Suspend sets spec.suspend.
func (w *JobWrapper) Suspend(b bool) *JobWrapper { w.Spec.Suspend = &b; return w }

// TTL sets spec.ttlSecondsAfterFinished.
func (w *JobWrapper) TTL(s int32) *JobWrapper { w.Spec.TTLSecondsAfterFinished = &s; return w }

// ActiveDeadline sets spec.activeDeadlineSeconds.
func (w *JobWrapper) ActiveDeadline(s int64) *JobWrapper { w.Spec.ActiveDeadlineSeconds = &s; return w }

// CleanPodPolicy sets spec.cleanPodPolicy.
func (w *JobWrapper) CleanPodPolicy(p etjobv1.CleanPodPolicy) *JobWrapper {
	w.Spec.CleanPodPolicy = p
	return w
}

// GPUs sets the worker's GPU limit.
func (w *JobWrapper) GPUs(n int64) *JobWrapper {
	c := &w.Spec.WorkerTemplate.Spec.Containers[0]
	c.Resources.Limits = corev1.ResourceList{etjobv1.ResourceGPU: *resourceQuantity(n)}
	return w
}

// Status sets the status.
func (w *JobWrapper) Status(st etjobv1.ElasticJobStatus) *JobWrapper {
	w.ElasticJob.Status = st
	return w
}

// PodWrapper builds a pod of a job.
type PodWrapper struct{ corev1.Pod }

// MakeWorker returns a pending worker pod of job with the given index.
func MakeWorker(job *etjobv1.ElasticJob, index int32) *PodWrapper {
	p := &PodWrapper{corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name: core.WorkerName(job.Name, index), Namespace: job.Namespace,
		UID: types.UID(core.WorkerName(job.Name, index) + "-uid"),
		Labels: map[string]string{
			etjobv1.LabelJobName: job.Name, etjobv1.LabelRole: etjobv1.RoleWorker,
			etjobv1.LabelWorkerIndex: strconv.Itoa(int(index)),
			etjobv1.LabelAttempt:     strconv.Itoa(int(job.Status.Restarts)),
		},
	}}}
	p.Status.Phase = corev1.PodPending
	return p
}

// MakeLauncher returns a pending launcher pod of job.
func MakeLauncher(job *etjobv1.ElasticJob) *PodWrapper {
	p := &PodWrapper{corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name: core.LauncherName(job.Name), Namespace: job.Namespace,
		Labels: map[string]string{
			etjobv1.LabelJobName: job.Name, etjobv1.LabelRole: etjobv1.RoleLauncher,
			etjobv1.LabelAttempt: strconv.Itoa(int(job.Status.Restarts)),
		},
	}}}
	p.Status.Phase = corev1.PodPending
	return p
}

// Obj returns the pod.
func (p *PodWrapper) Obj() *corev1.Pod { return &p.Pod }

// Attempt sets the attempt label.
func (p *PodWrapper) Attempt(a int32) *PodWrapper {
	p.Labels[etjobv1.LabelAttempt] = strconv.Itoa(int(a))
	return p
}

// Started sets status.startTime, where the bill (status.cost) starts.
func (p *PodWrapper) Started(t time.Time) *PodWrapper {
	ts := metav1.NewTime(t)
	p.Status.StartTime = &ts
	return p
}

// Extra marks the pod an extra worker (spec.growth), created at t.
func (p *PodWrapper) Extra(created time.Time) *PodWrapper {
	p.Labels[etjobv1.LabelExtra] = "true"
	p.CreationTimestamp = metav1.NewTime(created)
	return p
}

// Node binds the pod to a node.

func (p *PodWrapper) Node(n string) *PodWrapper { p.Spec.NodeName = n; return p }

// Ready makes the pod Running and Ready on node n.
func (p *PodWrapper) Ready(n string) *PodWrapper {
	p.Spec.NodeName = n
	p.Status.Phase = corev1.PodRunning
	p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue})
	return p
}

// Told marks the pod as told to leave at t for reason (the controller's
// etjob.dev/leave and etjob.dev/leave-reason annotations).
func (p *PodWrapper) Told(t time.Time, reason string) *PodWrapper {
	return p.Annotation(etjobv1.AnnotationLeave, t.Format(time.RFC3339)).Annotation(etjobv1.AnnotationLeaveReason, reason)
}

// ReadySince makes the pod Running and Ready on node n since t.
func (p *PodWrapper) ReadySince(n string, t time.Time) *PodWrapper {
	p.Ready(n)
	p.Status.Conditions[len(p.Status.Conditions)-1].LastTransitionTime = metav1.NewTime(t)
	return p
}

// Running makes the pod Running but not Ready on node n.
func (p *PodWrapper) Running(n string) *PodWrapper {
	p.Spec.NodeName = n
	p.Status.Phase = corev1.PodRunning
	return p
}

// Exited makes the pod terminal with the container's exit code.
func (p *PodWrapper) Exited(code int32, at time.Time) *PodWrapper {
	p.Status.Phase = corev1.PodFailed
	if code == 0 {
		p.Status.Phase = corev1.PodSucceeded
	}
	p.Status.Conditions = nil
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "worker", State: corev1.ContainerState{
		Terminated: &corev1.ContainerStateTerminated{ExitCode: code, FinishedAt: metav1.NewTime(at)},
	}}}
	return p
}

// ExitedWith is Exited with a termination message (the end of the log, as
// FallbackToLogsOnError gives it).
func (p *PodWrapper) ExitedWith(code int32, at time.Time, message string) *PodWrapper {
	p.Exited(code, at)
	p.Status.ContainerStatuses[0].State.Terminated.Message = message
	return p
}

// Condition adds a pod condition with status True.
func (p *PodWrapper) Condition(t corev1.PodConditionType) *PodWrapper {
	p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: t, Status: corev1.ConditionTrue})
	return p
}

// Reason sets status.reason.
func (p *PodWrapper) Reason(r string) *PodWrapper { p.Status.Reason = r; return p }

// Deleting marks the pod as terminating.
func (p *PodWrapper) Deleting(at time.Time) *PodWrapper {
	t := metav1.NewTime(at)
	p.DeletionTimestamp = &t
	return p
}

// Annotation sets an annotation.
func (p *PodWrapper) Annotation(k, v string) *PodWrapper {
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations[k] = v
	return p
}

// Unschedulable marks the pod unschedulable with the scheduler's message.
func (p *PodWrapper) Unschedulable(msg string) *PodWrapper {
	p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{
		Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable", Message: msg})
	return p
}

// MakeNode returns a Ready node.
func MakeNode(name string) *NodeWrapper {
	return &NodeWrapper{corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}}
}

// NodeWrapper builds a node.
type NodeWrapper struct{ corev1.Node }

// Obj returns the node.
func (n *NodeWrapper) Obj() *corev1.Node { return &n.Node }

// Notice annotates the node with a reclamation notice.
func (n *NodeWrapper) Notice(deadline time.Time, source string) *NodeWrapper {
	n.Annotations = map[string]string{
		etjobv1.AnnotationNodeNotice:       deadline.UTC().Format(time.RFC3339),
		etjobv1.AnnotationNodeNoticeSource: source,
	}
	return n
}

// Label sets a label on the node.
func (n *NodeWrapper) Label(k, v string) *NodeWrapper {
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	n.Labels[k] = v
	return n
}

// Cordon marks the node unschedulable, as kubectl cordon (and drain) does.
func (n *NodeWrapper) Cordon() *NodeWrapper {
	n.Spec.Unschedulable = true
	n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule})
	return n
}

// Taint puts a NoSchedule taint with key on the node.
func (n *NodeWrapper) Taint(key string) *NodeWrapper {
	n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: key, Effect: corev1.TaintEffectNoSchedule})
	return n
}

// NotReady marks the node NotReady since t.
func (n *NodeWrapper) NotReady(since time.Time) *NodeWrapper {
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionFalse, LastTransitionTime: metav1.NewTime(since)}}
	return n
}

func resourceQuantity(n int64) *resource.Quantity { return resource.NewQuantity(n, resource.DecimalSI) }
