// Package render builds the objects an ElasticJob owns: worker and launcher
// pods, the membership ConfigMap, the headless Service, and the launcher's RBAC.
// Builders are pure and deterministic: same job in, same objects out.
package render

import (
	"encoding/hex"
	"fmt"
	"net"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/core"
	"github.com/etjob/etjob/python"
)

// spotTolerations are the taints that providers put on spot nodes.
var spotTolerations = []corev1.Toleration{
	{Key: "cloud.google.com/gke-spot", Operator: corev1.TolerationOpEqual, Value: "true", Effect: corev1.TaintEffectNoSchedule},
	{Key: "kubernetes.azure.com/scalesetpriority", Operator: corev1.TolerationOpEqual, Value: "spot", Effect: corev1.TaintEffectNoSchedule},
	{Key: etjobv1.LabelCapacityType, Operator: corev1.TolerationOpEqual, Value: etjobv1.CapacityTypeSpot, Effect: corev1.TaintEffectNoSchedule},
}

// ConfigMapName is the name of the job's membership ConfigMap.
func ConfigMapName(job string) string { return job + "-etjob" }

// LauncherServiceAccountName is the service account of a horovod launcher.
func LauncherServiceAccountName(job string) string { return job + "-launcher" }

// RendezvousEndpoint is host:port of the torchrun rendezvous store, served by
// the launcher and reachable through the job's headless Service.
func RendezvousEndpoint(job *etjobv1.ElasticJob) string {
	return fmt.Sprintf("%s.%s.%s.svc:%d", core.LauncherName(job.Name), job.Name, job.Namespace, etjobv1.RendezvousPort)
}

// RendezvousID is torchrun's rdzv_id: a closed rendezvous cannot be reused, so
// every whole-job restart gets a new one.
func RendezvousID(job *etjobv1.ElasticJob) string {
	return fmt.Sprintf("%s-%d", job.UID, job.Status.Restarts)
}

// Labels returns the labels of a pod of the job with the given role.
func Labels(job *etjobv1.ElasticJob, role string) map[string]string {
	return map[string]string{
		etjobv1.LabelJobName: job.Name,
		etjobv1.LabelRole:    role,
		etjobv1.LabelAttempt: strconv.Itoa(int(job.Status.Restarts)),
	}
}

func owner(job *etjobv1.ElasticJob) []metav1.OwnerReference {
	t := true
	return []metav1.OwnerReference{{
		APIVersion: etjobv1.GroupVersion.String(), Kind: "ElasticJob",
		Name: job.Name, UID: job.UID, Controller: &t, BlockOwnerDeletion: &t,
	}}
}

// Worker builds the worker pod with the given index.
func Worker(job *etjobv1.ElasticJob, index int32) *corev1.Pod {
	tmpl := job.Spec.WorkerTemplate.DeepCopy()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:            core.WorkerName(job.Name, index),
			Namespace:       job.Namespace,
			Labels:          merge(tmpl.Labels, Labels(job, etjobv1.RoleWorker)),
			Annotations:     tmpl.Annotations,
			OwnerReferences: owner(job),
		},
		Spec: tmpl.Spec,
	}
	pod.Labels[etjobv1.LabelWorkerIndex] = strconv.Itoa(int(index))
	pod.Spec.Hostname = pod.Name
	pod.Spec.Subdomain = job.Name
	// The controller replaces failed workers under new names (Horovod
	// blacklists by name); a kubelet restarting in place would hide failures.
	pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	env := append(jobEnv(job), podIdentityEnv()...)
	env = append(env, corev1.EnvVar{Name: etjobv1.EnvWorkerIndex, Value: strconv.Itoa(int(index))})
	if job.Spec.Framework == etjobv1.FrameworkTorchrun {
		env = append(env, torchrunEnv(job)...)
	}
	env = append(env, corev1.EnvVar{Name: etjobv1.EnvAgentTokenPath, Value: etjobv1.AgentTokenPath})
	if job.Spec.Framework != etjobv1.FrameworkHorovod {
		env = append(env, corev1.EnvVar{Name: etjobv1.EnvStoreSecretFile, Value: etjobv1.StoreSecretPath})
		mountStoreSecret(&pod.Spec, job)
	}
	injectEnv(&pod.Spec, env)
	mountAgentToken(&pod.Spec)
	respondToEvictions(&pod.Spec)
	if sp := job.Spec.Spot; sp != nil && sp.Enabled {
		preferSpot(&pod.Spec)
	}
	if core.TrainsThroughNotices(&job.Spec) {
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		pod.Annotations[etjobv1.AnnotationNoticeLeadTime] = string(etjobv1.NoticeLeadTimeTrain)
	}
	return pod
}

// PlannedWorker builds the worker with the given index as plan wants it
// created: an extra worker (spec.growth) is labelled etjob.dev/extra and runs
// at the growth PriorityClass; every new worker is kept off plan.AvoidNodes.
func PlannedWorker(job *etjobv1.ElasticJob, plan *core.Plan, index int32) *corev1.Pod {
	pod := Worker(job, index)
	if slices.Contains(plan.ExtraWorkers, index) {
		pod.Labels[etjobv1.LabelExtra] = "true"
		pod.Spec.PriorityClassName = etjobv1.GrowthPriorityClass(&job.Spec)
		// The Priority admission plugin sets it from the class; a value
		// copied from the template would be refused.
		pod.Spec.Priority = nil
		pod.Spec.PreemptionPolicy = nil
	}
	avoidNodes(&pod.Spec, plan.AvoidNodes)
	return pod
}

// avoidNodes keeps the pod off the named nodes: a required node affinity on
// metadata.name, added to every term the template already requires (terms
// are ORed, so each must exclude them). The API allows one value per field
// requirement, so there is one per node.
func avoidNodes(spec *corev1.PodSpec, nodes []string) {
	if len(nodes) == 0 {
		return
	}
	var reqs []corev1.NodeSelectorRequirement
	for _, n := range nodes {
		reqs = append(reqs, corev1.NodeSelectorRequirement{Key: "metadata.name", Operator: corev1.NodeSelectorOpNotIn, Values: []string{n}})
	}
	sel := requiredNodeSelector(spec)
	for i := range sel.NodeSelectorTerms {
		t := &sel.NodeSelectorTerms[i]
		t.MatchFields = append(t.MatchFields, reqs...)
	}
}

// requiredNodeSelector is the pod's required node selector, made where the
// template has none, with at least one term: what is added to each of its
// terms holds whichever term the scheduler matches (terms are ORed).
func requiredNodeSelector(spec *corev1.PodSpec) *corev1.NodeSelector {
	if spec.Affinity == nil {
		spec.Affinity = &corev1.Affinity{}
	}
	if spec.Affinity.NodeAffinity == nil {
		spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	na := spec.Affinity.NodeAffinity
	if na.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		na.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{}
	}
	sel := na.RequiredDuringSchedulingIgnoredDuringExecution
	if len(sel.NodeSelectorTerms) == 0 {
		sel.NodeSelectorTerms = []corev1.NodeSelectorTerm{{}}
	}
	return sel
}

// mountAgentToken gives every container the pod's token for the node agent
// (etjobv1.AgentTokenPath): bound to the pod, for the agent's audience only,
// short-lived.
func mountAgentToken(spec *corev1.PodSpec) {
	const name = "etjob-agent-token"
	if spec.ServiceAccountName == "" {
		// A projected token names its ServiceAccount: the one the
		// ServiceAccount admission plugin would give the pod anyway.
		spec.ServiceAccountName = "default"
	}
	exp := int64(etjobv1.AgentTokenSeconds)
	spec.Volumes = append(spec.Volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{
			Audience: etjobv1.AgentTokenAudience, ExpirationSeconds: &exp, Path: path.Base(etjobv1.AgentTokenPath)}}},
	}}})
	for i := range spec.Containers {
		spec.Containers[i].VolumeMounts = append(spec.Containers[i].VolumeMounts,
			corev1.VolumeMount{Name: name, MountPath: path.Dir(etjobv1.AgentTokenPath), ReadOnly: true})
	}
}

// mountStoreSecret gives every container of a torchrun job's pod the job's
// store secret (StoreSecret) at etjobv1.StoreSecretPath, read-only.
func mountStoreSecret(spec *corev1.PodSpec, job *etjobv1.ElasticJob) {
	const name = "etjob-store-secret"
	mode := int32(0o444) // whatever user the container runs as reads it; the pod is the boundary
	spec.Volumes = append(spec.Volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
		SecretName: core.StoreSecretName(job.Name), DefaultMode: &mode,
		Items: []corev1.KeyToPath{{Key: etjobv1.StoreSecretKey, Path: path.Base(etjobv1.StoreSecretPath)}},
	}}})
	for i := range spec.Containers {
		spec.Containers[i].VolumeMounts = append(spec.Containers[i].VolumeMounts,
			corev1.VolumeMount{Name: name, MountPath: path.Dir(etjobv1.StoreSecretPath), ReadOnly: true})
	}
}

// StoreSecret builds the Secret of a torchrun job's rendezvous store:
// key (random, from the controller) hex-encoded under etjobv1.StoreSecretKey.
// It is immutable (kubelets need not watch it) and lives as long as the job:
// every attempt and every launcher of the job uses it.
func StoreSecret(job *etjobv1.ElasticJob, key []byte) *corev1.Secret {
	immutable := true
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: core.StoreSecretName(job.Name), Namespace: job.Namespace,
			Labels:          map[string]string{etjobv1.LabelJobName: job.Name},
			OwnerReferences: owner(job),
		},
		Immutable: &immutable,
		Type:      corev1.SecretTypeOpaque,
		Data:      map[string][]byte{etjobv1.StoreSecretKey: []byte(hex.EncodeToString(key))},
	}
}

// Launcher builds the launcher pod: horovodrun for horovod, the rendezvous
// store for torchrun (by default `python3 -m etjob.rdzv` from the worker image).
func Launcher(job *etjobv1.ElasticJob) *corev1.Pod {
	var tmpl *corev1.PodTemplateSpec
	if job.Spec.LauncherTemplate != nil {
		tmpl = job.Spec.LauncherTemplate.DeepCopy()
	} else {
		tmpl = RendezvousLauncherTemplate(job.Spec.WorkerTemplate)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:            core.LauncherName(job.Name),
			Namespace:       job.Namespace,
			Labels:          merge(tmpl.Labels, Labels(job, etjobv1.RoleLauncher)),
			Annotations:     tmpl.Annotations,
			OwnerReferences: owner(job),
		},
		Spec: tmpl.Spec,
	}
	pod.Spec.Hostname = pod.Name
	pod.Spec.Subdomain = job.Name
	pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	for i := range pod.Spec.Containers {
		// The end of a failed launcher's log becomes its termination
		// message, which the job's failure Event and condition quote
		// (horovodrun's "Failed to execute discovery script: ...").
		if c := &pod.Spec.Containers[i]; c.TerminationMessagePolicy == "" {
			c.TerminationMessagePolicy = corev1.TerminationMessageFallbackToLogsOnError
		}
	}
	env := jobEnv(job)
	if job.Spec.Framework == etjobv1.FrameworkHorovod {
		// The controller starts horovodrun once its workers are members:
		// `workers` (Arena's -np $((${workers}*${gpus}))) is how many there
		// are, which horovodrun finds at once, not spec.replicas, which it
		// would wait for when capacity is short (a resume below replicas).
		if n := len(job.Status.Membership.Hosts); n > 0 {
			env[0] = corev1.EnvVar{Name: etjobv1.EnvArenaWorkers, Value: strconv.Itoa(n)}
		}
		// No per-pod identity: horovodrun copies the launcher's whole
		// environment into every rank's command (env K=V ...), so an
		// ETJOB_POD_NAME here would name the launcher in every rank, and
		// every rank's check_alive() would ask the launcher's node agent.
		// A rank keeps its own pod's identity from the worker container's
		// environment, which the exec'd process inherits.
		pod.Spec.ServiceAccountName = LauncherServiceAccountName(job.Name)
		env = append(env,
			corev1.EnvVar{Name: "OMPI_MCA_plm_rsh_agent", Value: KubexecPath},
			corev1.EnvVar{Name: "OMPI_MCA_orte_default_hostfile", Value: "/etc/edl/hostfile"},
			// horovodrun is Python: unbuffered, its output reaches the
			// launcher's log (etjob logs) as it comes, not at exit.
			corev1.EnvVar{Name: "PYTHONUNBUFFERED", Value: "1"},
		)
		mountEDL(job, &pod.Spec)
	} else {
		env = append(env, podIdentityEnv()...)
		// A store that replaces one (spec.recovery InProcess) says so to
		// the workers that connect: none of them may open a generation in it
		// before the members have told it theirs (etjob.rdzv, etjob.elastic).
		env = append(env, corev1.EnvVar{Name: etjobv1.EnvRendezvousReplacement, Value: strconv.Itoa(int(job.Status.LauncherReplacements))},
			corev1.EnvVar{Name: etjobv1.EnvStoreSecretFile, Value: etjobv1.StoreSecretPath})
		mountStoreSecret(&pod.Spec, job)
		// The store never shares its node's network (issue #42, M4): its
		// raw c10d store listens on loopback behind the authenticating
		// front, and a node's loopback is every host-network process's. It
		// serves the workers as well from the pod network (a template shared
		// with host-network workers, as `etjob submit --hostNetwork` makes,
		// loses it here alone).
		pod.Spec.HostNetwork = false
		if pod.Spec.DNSPolicy == corev1.DNSClusterFirstWithHostNet {
			pod.Spec.DNSPolicy = corev1.DNSClusterFirst
		}
	}
	injectEnv(&pod.Spec, env)
	if sp := job.Spec.Spot; sp != nil && sp.Enabled {
		requireOnDemand(&pod.Spec)
	}
	respondToEvictions(&pod.Spec)
	return pod
}

// EvictionResponder is the name etjob's controller answers EvictionRequests
// under (spec.evictionResponders, KEP-4563), at the priority the API asks of
// a pod's managing controller.
const EvictionResponder = "etjob.dev/controller"

// EvictionResponderPriority is EvictionResponder's priority.
const EvictionResponderPriority = 10000

// respondToEvictions lists etjob's controller as the pod's eviction
// responder. An API server without the EvictionRequestAPI gate drops the
// field (an older one ignores it).
func respondToEvictions(spec *corev1.PodSpec) {
	for _, r := range spec.EvictionResponders {
		if r.Name == EvictionResponder {
			return
		}
	}
	prio := int32(EvictionResponderPriority)
	spec.EvictionResponders = append(spec.EvictionResponders, corev1.EvictionResponder{Name: EvictionResponder, Priority: &prio})
}

// RendezvousLauncherTemplate is a torchrun job's launcher, the rendezvous
// store, built from the workers' template: the default when the job sets
// none, and what `etjob submit` places with its launcher flags. It runs the
// workers' image with their environment and their node-independent volumes,
// never their claims.
func RendezvousLauncherTemplate(w corev1.PodTemplateSpec) *corev1.PodTemplateSpec {
	c := corev1.Container{Name: "rendezvous", Command: []string{"python3", "-m", "etjob.rdzv", "--port", strconv.Itoa(etjobv1.RendezvousPort)}}
	var volumes []corev1.Volume
	if len(w.Spec.Containers) > 0 {
		wc := w.Spec.Containers[0]
		c.Image, c.ImagePullPolicy, c.WorkingDir = wc.Image, wc.ImagePullPolicy, wc.WorkingDir
		c.Env = append([]corev1.EnvVar(nil), wc.Env...)
		c.EnvFrom = append([]corev1.EnvFromSource(nil), wc.EnvFrom...)
		// The store runs the worker's software, so it gets the worker's
		// node-independent volumes; never its claims, which may be
		// ReadWriteOnce and would pin the launcher to a worker's node.
		shareable := map[string]corev1.Volume{}
		for _, v := range w.Spec.Volumes {
			if v.PersistentVolumeClaim == nil && v.Ephemeral == nil {
				shareable[v.Name] = v
			}
		}
		for _, m := range wc.VolumeMounts {
			if v, ok := shareable[m.Name]; ok {
				c.VolumeMounts = append(c.VolumeMounts, m)
				volumes = append(volumes, v)
				delete(shareable, m.Name)
			}
		}
	}
	c.Ports = []corev1.ContainerPort{{Name: "rdzv", ContainerPort: etjobv1.RendezvousPort}}
	return &corev1.PodTemplateSpec{Spec: corev1.PodSpec{
		Containers:         []corev1.Container{c},
		Volumes:            volumes,
		ImagePullSecrets:   w.Spec.ImagePullSecrets,
		PriorityClassName:  w.Spec.PriorityClassName,
		SchedulerName:      w.Spec.SchedulerName,
		ServiceAccountName: w.Spec.ServiceAccountName,
	}}
}

// KubexecPath is the horovod launcher's rsh agent. horovodrun uses an rsh
// agent only when OMPI_MCA_plm_rsh_agent is exactly this path (mpi-operator's;
// horovod/runner/common/util/env.py is_kubeflow_mpi) and runs ssh for any
// other value; /etc/edl/kubexec.sh, et-operator's name, is the same script.
const KubexecPath = "/etc/mpi/kubexec.sh"

// jobEnv is the environment every pod of the job gets: Arena's variables and
// the job-wide ETJOB_* ones.
func jobEnv(job *etjobv1.ElasticJob) []corev1.EnvVar {
	s := job.Spec
	env := []corev1.EnvVar{
		// Arena's variables, set at creation: they go stale after a resize
		// (docs/api.md points to WORLD_SIZE for the live value).
		{Name: etjobv1.EnvArenaWorkers, Value: strconv.Itoa(int(s.Replicas))},
		{Name: "minWorkers", Value: strconv.Itoa(int(s.MinReplicas))},
		{Name: "maxWorkers", Value: strconv.Itoa(int(s.MaxReplicas))},
		{Name: "gpus", Value: strconv.Itoa(int(etjobv1.GPUsPerWorker(&s)))},
		{Name: etjobv1.EnvJobName, Value: job.Name},
		{Name: etjobv1.EnvNamespace, Value: job.Namespace},
		{Name: etjobv1.EnvRendezvousEndpoint, Value: RendezvousEndpoint(job)},
		{Name: etjobv1.EnvFramework, Value: string(s.Framework)},
		{Name: etjobv1.EnvSlotsPerWorker, Value: strconv.Itoa(int(etjobv1.SlotsPerWorker(&s)))},
		{Name: etjobv1.EnvAttempt, Value: strconv.Itoa(int(job.Status.Restarts))},
		{Name: etjobv1.EnvExitCodePreempted, Value: strconv.Itoa(etjobv1.ExitCodePreempted)},
	}
	if s.CheckpointDir != "" {
		env = append(env, corev1.EnvVar{Name: etjobv1.EnvCheckpointDir, Value: s.CheckpointDir})
	}
	if len(s.WorldSizes) > 0 {
		sizes := make([]string, len(s.WorldSizes))
		for i, n := range s.WorldSizes {
			sizes[i] = strconv.Itoa(int(n))
		}
		env = append(env, corev1.EnvVar{Name: etjobv1.EnvWorldSizes, Value: strings.Join(sizes, ",")})
	}
	return env
}

// podIdentityEnv is who the pod is and where its node agent listens
// (etjob.supervisor reads them).
func podIdentityEnv() []corev1.EnvVar {
	return []corev1.EnvVar{
		{Name: etjobv1.EnvPodName, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		{Name: etjobv1.EnvPodIP, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
		{Name: etjobv1.EnvNodeIP, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.hostIP"}}},
		{Name: etjobv1.EnvAgentAddr, Value: "$(" + etjobv1.EnvNodeIP + "):" + strconv.Itoa(etjobv1.AgentPort)},
	}
}

// torchrunEnv configures the torchrun agents through PET_* variables, which
// torch.distributed.run reads for every flag (docs/design.md, Membership).
func torchrunEnv(job *etjobv1.ElasticJob) []corev1.EnvVar {
	s := job.Spec
	return []corev1.EnvVar{
		{Name: etjobv1.EnvTorchrunNNodes, Value: fmt.Sprintf("%d:%d", s.MinReplicas, s.MaxReplicas)},
		{Name: etjobv1.EnvTorchrunNProcPerNode, Value: strconv.Itoa(int(etjobv1.SlotsPerWorker(&s)))},
		{Name: etjobv1.EnvTorchrunRdzvBackend, Value: "c10d"},
		{Name: etjobv1.EnvTorchrunRdzvEndpoint, Value: RendezvousEndpoint(job)},
		{Name: etjobv1.EnvTorchrunRdzvID, Value: RendezvousID(job)},
		// is_host=false: the store lives in the launcher, never on a worker
		// whose loss would take the job down (measured with torch 1.13's agents).
		{Name: etjobv1.EnvTorchrunRdzvConf, Value: "is_host=false,join_timeout=600,last_call_timeout=3"},
		{Name: etjobv1.EnvTorchrunMaxRestarts, Value: "1000"},
		{Name: etjobv1.EnvTorchrunMonitorInterval, Value: "0.25"},
	}
}

// injectEnv adds env to every container, leaving alone what the user set.
func injectEnv(spec *corev1.PodSpec, env []corev1.EnvVar) {
	for i := range spec.Containers {
		c := &spec.Containers[i]
		have := map[string]bool{}
		for _, e := range c.Env {
			have[e.Name] = true
		}
		var add []corev1.EnvVar
		for _, e := range env {
			if !have[e.Name] {
				add = append(add, e)
			}
		}
		// Ours first, so the user's values may refer to them with $(VAR).
		c.Env = append(add, c.Env...)
	}
}

func preferSpot(spec *corev1.PodSpec) {
	for _, t := range spotTolerations {
		if !hasToleration(spec.Tolerations, t) {
			spec.Tolerations = append(spec.Tolerations, t)
		}
	}
	if spec.Affinity == nil {
		spec.Affinity = &corev1.Affinity{}
	}
	if spec.Affinity.NodeAffinity == nil {
		spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	na := spec.Affinity.NodeAffinity
	for _, k := range sortedKeys(etjobv1.SpotLabels) {
		na.PreferredDuringSchedulingIgnoredDuringExecution = append(na.PreferredDuringSchedulingIgnoredDuringExecution,
			corev1.PreferredSchedulingTerm{Weight: 50, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{
				Key: k, Operator: corev1.NodeSelectorOpIn, Values: []string{etjobv1.SpotLabels[k]},
			}}}})
	}
}

// requireOnDemand keeps a spot job's launcher off spot capacity: a required
// NotIn for every cloud's spot label, added to each term the template
// already requires (terms are ORed, so each must exclude spot: a
// requirement added as a term of its own would be ORed away by any term the
// template has). A template whose required terms already name a capacity
// label has chosen for itself and is left as it is.
func requireOnDemand(spec *corev1.PodSpec) {
	sel := requiredNodeSelector(spec)
	for _, t := range sel.NodeSelectorTerms {
		for _, r := range t.MatchExpressions {
			if _, capacity := etjobv1.SpotLabels[r.Key]; capacity {
				return
			}
		}
	}
	var reqs []corev1.NodeSelectorRequirement
	for _, k := range sortedKeys(etjobv1.SpotLabels) {
		reqs = append(reqs, corev1.NodeSelectorRequirement{Key: k, Operator: corev1.NodeSelectorOpNotIn, Values: []string{etjobv1.SpotLabels[k]}})
	}
	for i := range sel.NodeSelectorTerms {
		t := &sel.NodeSelectorTerms[i]
		t.MatchExpressions = append(t.MatchExpressions, reqs...)
	}
}

// RequireNodeLabel makes spec's pod require nodes labelled key=value, in
// each term it already requires (terms are ORed: a term of its own would be
// ORed away), or in a term of its own when it requires none. The controller
// puts its launchers there when the platform admin names such a label
// (--launcher-node-label, issue #42 H2): one that a kubelet cannot write on
// its own Node (node-restriction.kubernetes.io/, under the NodeRestriction
// admission plugin), so that no rooted node can attract a launcher and its
// store secret or exec rights by relabelling itself.
func RequireNodeLabel(spec *corev1.PodSpec, key, value string) {
	sel := requiredNodeSelector(spec) // one empty term when it requires none
	req := corev1.NodeSelectorRequirement{Key: key, Operator: corev1.NodeSelectorOpIn, Values: []string{value}}
	for i := range sel.NodeSelectorTerms {
		t := &sel.NodeSelectorTerms[i]
		t.MatchExpressions = append(t.MatchExpressions, req)
	}
}

func hasToleration(ts []corev1.Toleration, t corev1.Toleration) bool {
	for _, x := range ts {
		if x.Operator == corev1.TolerationOpExists && x.Key == "" {
			return true
		}
		if x.Key == t.Key && x.Value == t.Value && x.Effect == t.Effect {
			return true
		}
	}
	return false
}

func mountEDL(job *etjobv1.ElasticJob, spec *corev1.PodSpec) {
	mode := int32(0o755)
	spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "etjob-edl", VolumeSource: corev1.VolumeSource{
		ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: ConfigMapName(job.Name)}, DefaultMode: &mode},
	}})
	for i := range spec.Containers {
		spec.Containers[i].VolumeMounts = append(spec.Containers[i].VolumeMounts,
			corev1.VolumeMount{Name: "etjob-edl", MountPath: "/etc/edl", ReadOnly: true},
			corev1.VolumeMount{Name: "etjob-edl", MountPath: path.Dir(KubexecPath), ReadOnly: true})
	}
}

// ConfigMap builds the membership ConfigMap: `hosts` (host:slots, what
// discover_hosts.sh prints), `hostfile` (MPI's format), `generation`, and the
// scripts the horovod launcher runs from /etc/edl. Both lists hold only the
// entries core.ParseHost accepts: Horovod splits each discovery line on ':'
// and MPI each hostfile line on whitespace, and an entry such as "w-1:" or
// "w 1:2" made a line neither reads (FuzzConfigMap).
func ConfigMap(job *etjobv1.ElasticJob, m etjobv1.MembershipStatus) *corev1.ConfigMap {
	var hosts, hostfile strings.Builder
	for _, h := range m.Hosts {
		if host, slots, ok := core.ParseHost(h); ok {
			hosts.WriteString(h + "\n")
			hostfile.WriteString(host + " slots=" + strconv.Itoa(int(slots)) + "\n")
		}
	}
	container := "worker"
	if cs := job.Spec.WorkerTemplate.Spec.Containers; len(cs) > 0 {
		container = cs[0].Name
	}
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name: ConfigMapName(job.Name), Namespace: job.Namespace,
			Labels:          map[string]string{etjobv1.LabelJobName: job.Name},
			OwnerReferences: owner(job),
		},
		Data: map[string]string{
			"hosts":             hosts.String(),
			"hostfile":          hostfile.String(),
			"generation":        strconv.FormatInt(m.Generation, 10),
			"discover_hosts.sh": DiscoverHostsScript(job.Namespace, ConfigMapName(job.Name)),
			"kubexec.sh":        KubexecScript(job.Namespace, container),
			"kubexec.py":        python.Kubexec,
		},
	}
}

// DiscoverHostsScript is /etc/edl/discover_hosts.sh. It prints the published
// members as host:slots. A mounted ConfigMap can lag a minute on a real
// kubelet, longer than a 30 s spot notice (docs/design.md, Membership), so
// it reads the live ConfigMap through the API with the launcher's own token,
// and falls back to the mounted file.
func DiscoverHostsScript(namespace, configMap string) string {
	return `#!/bin/sh
# Generated by etjob: prints host:slots for each published member of this job.
SA=/var/run/secrets/kubernetes.io/serviceaccount
if [ -n "${KUBERNETES_SERVICE_HOST:-}" ] && [ -r "$SA/token" ] && command -v python3 >/dev/null 2>&1; then
  python3 - <<'PY' 2>/dev/null && exit 0
import json, os, ssl, sys, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
host = os.environ["KUBERNETES_SERVICE_HOST"]
if ":" in host: host = "[" + host + "]"
url = "https://%s:%s/api/v1/namespaces/` + namespace + `/configmaps/` + configMap + `" % (host, os.environ.get("KUBERNETES_SERVICE_PORT", "443"))
req = urllib.request.Request(url, headers={"Authorization": "Bearer " + open(sa + "/token").read().strip()})
ctx = ssl.create_default_context(cafile=sa + "/ca.crt")
with urllib.request.urlopen(req, timeout=2, context=ctx) as r:
    sys.stdout.write(json.load(r)["data"]["hosts"])
PY
fi
exec cat /etc/edl/hosts
`
}

// KubexecScript is /etc/mpi/kubexec.sh (and /etc/edl/kubexec.sh), the
// launcher-to-worker transport (OMPI_MCA_plm_rsh_agent): `kubexec.sh POD
// COMMAND...` runs COMMAND in the worker pod through the API with the
// launcher's RoleBinding of LauncherClusterRole. It runs kubexec.py beside it (etjob's own exec
// client, python/etjob/kubexec.py) with the launcher image's Python, which
// horovodrun itself needs: the image needs no kubectl.
func KubexecScript(namespace, container string) string {
	return `#!/bin/sh
# Generated by etjob: runs a command in a worker pod (MPI / horovod rsh agent).
here=$(dirname "$0")
for py in python3 python; do
  if command -v "$py" >/dev/null 2>&1; then
    exec "$py" "$here/kubexec.py" --namespace ` + shellQuote(namespace) + ` --container ` + shellQuote(container) + ` "$@"
  fi
done
echo "kubexec.sh: the launcher image has neither python3 nor python (horovodrun needs one too)" >&2
exit 127
`
}

// shellQuote quotes s for sh: a name from the job's template never becomes
// shell syntax in a generated script.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// Service builds the job's headless Service: every pod is resolvable as
// <pod>.<job>.<namespace>.svc, including the launcher's rendezvous store.
// It has no selector (issue #42, C2): a selector on the job's label matches
// any pod that carries it, a mirror pod a rooted kubelet makes in the
// namespace too, which would then answer for the store's name. Its
// addresses are the EndpointSlice the controller writes (EndpointSlice),
// from the pods the job owns.
func Service(job *etjobv1.ElasticJob) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Name: job.Name, Namespace: job.Namespace,
			Labels:          map[string]string{etjobv1.LabelJobName: job.Name},
			OwnerReferences: owner(job),
		},
		Spec: corev1.ServiceSpec{
			ClusterIP: corev1.ClusterIPNone,
			Ports:     []corev1.ServicePort{{Name: "rdzv", Port: etjobv1.RendezvousPort}},
		},
	}
}

// EndpointSliceManagedBy is the value of the EndpointSlice's
// endpointslice.kubernetes.io/managed-by label: the slice is the
// controller's, not kube-controller-manager's.
const EndpointSliceManagedBy = "controller.etjob.dev"

// unpublishable reports an address an EndpointSlice may not hold (the API
// refuses loopback and link-local ones: the local cluster's pods live on
// 127.0.0.0/8, and its nodes name a job's pods from their owner instead).
func unpublishable(ip string) bool {
	a := net.ParseIP(ip)
	return a == nil || a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsUnspecified()
}

// EndpointSlice builds the addresses of the job's Service: one endpoint per
// pod of pods (the pods the job owns: the controller lists them by owner
// UID, never by label) that has an IP the API accepts and is neither
// finished nor being deleted, named by its hostname when its subdomain is the Service (the DNS
// name <hostname>.<job>.<namespace>.svc), ready whether or not its containers
// are (the store must resolve before any probe passes: the Service used to
// publish not-ready addresses). One address family: the launcher's, else the
// first pod's (IPv4 when none has an IP); a pod of the other family is left
// out. Sorted by pod name: the same pods give the same slice.
func EndpointSlice(job *etjobv1.ElasticJob, pods []*corev1.Pod) *discoveryv1.EndpointSlice {
	family, decided := discoveryv1.AddressTypeIPv4, false
	for _, p := range pods {
		ip := p.Status.PodIP
		launcher := p.Name == core.LauncherName(job.Name)
		if ip == "" || unpublishable(ip) || (decided && !launcher) {
			continue
		}
		family, decided = discoveryv1.AddressTypeIPv4, true
		if strings.Contains(ip, ":") {
			family = discoveryv1.AddressTypeIPv6
		}
		if launcher {
			break
		}
	}
	var eps []discoveryv1.Endpoint
	yes := true
	for _, p := range pods {
		ip := p.Status.PodIP
		if ip == "" || unpublishable(ip) || p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed ||
			strings.Contains(ip, ":") != (family == discoveryv1.AddressTypeIPv6) {
			continue
		}
		ep := discoveryv1.Endpoint{
			Addresses:  []string{ip},
			Conditions: discoveryv1.EndpointConditions{Ready: &yes},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: p.Namespace, Name: p.Name, UID: p.UID},
		}
		if p.Spec.Hostname != "" && p.Spec.Subdomain == job.Name {
			ep.Hostname = &p.Spec.Hostname
		}
		if p.Spec.NodeName != "" {
			ep.NodeName = &p.Spec.NodeName
		}
		eps = append(eps, ep)
	}
	sort.Slice(eps, func(i, j int) bool { return eps[i].TargetRef.Name < eps[j].TargetRef.Name })
	name, port, proto := "rdzv", int32(etjobv1.RendezvousPort), corev1.ProtocolTCP
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: job.Name, Namespace: job.Namespace,
			Labels: map[string]string{
				etjobv1.LabelJobName:         job.Name,
				discoveryv1.LabelServiceName: job.Name,
				discoveryv1.LabelManagedBy:   EndpointSliceManagedBy,
			},
			OwnerReferences: owner(job),
		},
		AddressType: family,
		Endpoints:   eps,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}},
	}
}

// NetworkPolicy builds the job's NetworkPolicy: every pod of the job (the
// launcher, which serves the rendezvous store on RendezvousPort and
// horovodrun's driver, and the workers, with torchrun's per-round bootstrap
// store and the gloo and NCCL ports) admits connections from the job's own
// pods and spec.networkPeers only (docs/security.md, issue #42 H3): the
// pods of other jobs and namespaces, a rooted node's included, reach none of
// them where the cluster's network plugin enforces NetworkPolicies (the
// local cluster has none). Its name, <job>-launcher, is the one it had when
// it covered the launcher alone: a job created before keeps one object.
func NetworkPolicy(job *etjobv1.ElasticJob) *networkingv1.NetworkPolicy {
	own := map[string]string{etjobv1.LabelJobName: job.Name}
	from := []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: own}}}
	for _, p := range job.Spec.NetworkPeers {
		from = append(from, *p.DeepCopy())
	}
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{
			Name: core.LauncherName(job.Name), Namespace: job.Namespace,
			Labels:          map[string]string{etjobv1.LabelJobName: job.Name},
			OwnerReferences: owner(job),
		},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{etjobv1.LabelJobName: job.Name}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: from}},
		},
	}
}

// DisruptionBudget builds the job's PodDisruptionBudget, which turns every
// voluntary eviction (kubectl drain, a node upgrade, an autoscaler's
// scale-down: the Eviction API) of its pods into an agreed stop: no running,
// Ready pod of the job may be evicted, so the eviction
// waits while the node's cordon or the autoscaler's taint (core.DrainSource)
// has the pod leave at the job's next agreed step; a pod that has exited
// there, or that etjob is deleting, is not held by any budget (the API
// server lets terminal pods and pods being deleted go), so the drain goes
// on then. Pods that are not Ready (a pending replacement, a hung rank) are
// never held (unhealthyPodEvictionPolicy AlwaysAllow), and etjob gives up
// on a pod that does not leave within its leave grace period by deleting it:
// a drain waits for at most one step, the checkpoint and that grace period,
// never for good. Its name is the job's, as the Service's.
//
// The budget is minAvailable DisruptionBudgetMinAvailable, a count no job
// reaches, rather than maxUnavailable 0: with maxUnavailable (or a
// percentage) the disruption controller counts the pods a job should have
// from its owner's scale subresource, the ElasticJob's spec.replicas, which
// leaves out the launcher, so a job of 3 workers and its launcher was
// allowed one eviction (measured on the local cluster).
func DisruptionBudget(job *etjobv1.ElasticJob) *policyv1.PodDisruptionBudget {
	all := intstr.FromInt32(DisruptionBudgetMinAvailable)
	always := policyv1.AlwaysAllow
	return &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{
			Name: job.Name, Namespace: job.Namespace,
			Labels:          map[string]string{etjobv1.LabelJobName: job.Name},
			OwnerReferences: owner(job),
		},
		Spec: policyv1.PodDisruptionBudgetSpec{
			Selector:                   &metav1.LabelSelector{MatchLabels: map[string]string{etjobv1.LabelJobName: job.Name}},
			MinAvailable:               &all,
			UnhealthyPodEvictionPolicy: &always,
		},
	}
}

// DisruptionBudgetMinAvailable is the job budget's minAvailable: more pods
// than any job has, so no Ready pod of the job may be evicted.
const DisruptionBudgetMinAvailable = 1 << 30

// LauncherClusterRole is the ClusterRole every horovod launcher is bound to
// in its namespace (config/rbac/launcher_role.yaml): read the membership
// ConfigMap (live discovery), list and exec into pods (the kubexec
// transport). The controller holds `bind` on it alone, so it needs neither
// pods/exec nor the right to create Roles.
const LauncherClusterRole = "etjob-launcher"

// LauncherRBAC builds the horovod launcher's ServiceAccount and the
// RoleBinding of LauncherClusterRole to it in the job's namespace. Nothing
// cluster-wide.
func LauncherRBAC(job *etjobv1.ElasticJob) (*corev1.ServiceAccount, *rbacv1.RoleBinding) {
	name := LauncherServiceAccountName(job.Name)
	om := metav1.ObjectMeta{Name: name, Namespace: job.Namespace, Labels: map[string]string{etjobv1.LabelJobName: job.Name}, OwnerReferences: owner(job)}
	sa := &corev1.ServiceAccount{ObjectMeta: om}
	rb := &rbacv1.RoleBinding{ObjectMeta: *om.DeepCopy(),
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: LauncherClusterRole},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: job.Namespace}},
	}
	return sa, rb
}

func merge(a, b map[string]string) map[string]string {
	out := make(map[string]string, len(a)+len(b)+1)
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
