package render_test

import (
	"bytes"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/core"
	"github.com/etjob/etjob/internal/render"
	. "github.com/etjob/etjob/internal/testutil"
)

func env(c corev1.Container) map[string]string {
	out := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			out[e.Name] = "fieldRef:" + e.ValueFrom.FieldRef.FieldPath
			continue
		}
		out[e.Name] = e.Value
	}
	return out
}

func TestWorker(t *testing.T) {
	job := MakeElasticJob("train", "ml").Replicas(4).Min(2).Max(6).GPUs(2).Obj()
	job.Spec.CheckpointDir = "/ckpt"
	job.Spec.WorldSizes = []int32{4, 8, 12}
	job.Status.Restarts = 2
	job.Spec.WorkerTemplate.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "workers", Value: "mine"}}
	pod := render.Worker(job, 7)
	if pod.Name != "train-worker-7" || pod.Spec.Hostname != "train-worker-7" || pod.Spec.Subdomain != "train" {
		t.Errorf("name/hostname/subdomain = %s/%s/%s", pod.Name, pod.Spec.Hostname, pod.Spec.Subdomain)
	}
	if pod.Spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("restartPolicy = %s", pod.Spec.RestartPolicy)
	}
	wantLabels := map[string]string{etjobv1.LabelJobName: "train", etjobv1.LabelRole: "worker", etjobv1.LabelWorkerIndex: "7", etjobv1.LabelAttempt: "2"}
	if diff := cmp.Diff(wantLabels, pod.Labels); diff != "" {
		t.Errorf("labels (-want +got):\n%s", diff)
	}
	got := env(pod.Spec.Containers[0])
	want := map[string]string{
		"workers":    "mine", // the user's value wins
		"minWorkers": "2", "maxWorkers": "6", "gpus": "2",
		"ETJOB_JOB_NAME": "train", "ETJOB_NAMESPACE": "ml", "ETJOB_WORKER_INDEX": "7",
		"ETJOB_POD_NAME": "fieldRef:metadata.name", "ETJOB_NODE_IP": "fieldRef:status.hostIP", "ETJOB_POD_IP": "fieldRef:status.podIP",
		"ETJOB_AGENT_ADDR": "$(ETJOB_NODE_IP):9477", "ETJOB_AGENT_TOKEN_PATH": etjobv1.AgentTokenPath, "ETJOB_RDZV_ENDPOINT": "train-launcher.train.ml.svc:29400",
		"ETJOB_FRAMEWORK": "torchrun", "ETJOB_SLOTS_PER_WORKER": "2", "ETJOB_ATTEMPT": "2",
		"ETJOB_EXIT_CODE_PREEMPTED": "75", "ETJOB_CHECKPOINT_DIR": "/ckpt", "ETJOB_STORE_SECRET_FILE": etjobv1.StoreSecretPath,
		"ETJOB_WORLD_SIZES": "4,8,12", "PET_NNODES": "2:6", "PET_NPROC_PER_NODE": "2", "PET_RDZV_BACKEND": "c10d",
		"PET_RDZV_ENDPOINT": "train-launcher.train.ml.svc:29400", "PET_RDZV_ID": "train-uid-2",
		"PET_RDZV_CONF": "is_host=false,join_timeout=600,last_call_timeout=3", "PET_MAX_RESTARTS": "1000", "PET_MONITOR_INTERVAL": "0.25",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("env (-want +got):\n%s", diff)
	}
	if ref := pod.OwnerReferences[0]; ref.Kind != "ElasticJob" || ref.Controller == nil || !*ref.Controller {
		t.Errorf("owner reference %+v", ref)
	}
	// Finding M2: the worker's token for its node agent is for the agent's
	// audience only, short-lived, in every container.
	var tok *corev1.ServiceAccountTokenProjection
	for _, v := range pod.Spec.Volumes {
		if v.Projected != nil && len(v.Projected.Sources) == 1 && v.Projected.Sources[0].ServiceAccountToken != nil {
			tok = v.Projected.Sources[0].ServiceAccountToken
		}
	}
	if tok == nil || tok.Audience != etjobv1.AgentTokenAudience || tok.ExpirationSeconds == nil || *tok.ExpirationSeconds > 3600 {
		t.Errorf("agent token projection %+v, want audience %s, short-lived", tok, etjobv1.AgentTokenAudience)
	}
	for _, c := range pod.Spec.Containers {
		if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath+"/token" == etjobv1.AgentTokenPath && m.ReadOnly }) {
			t.Errorf("container %s lacks the agent token at %s", c.Name, etjobv1.AgentTokenPath)
		}
	}
}

func TestSpotPlacement(t *testing.T) {
	job := MakeElasticJob("train", "ml").Obj()
	job.Spec.Spot = &etjobv1.SpotSpec{Enabled: true}
	w := render.Worker(job, 0)
	if w.Spec.Affinity == nil || len(w.Spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != len(etjobv1.SpotLabels) {
		t.Errorf("spot worker affinity %+v", w.Spec.Affinity)
	}
	if len(w.Spec.Tolerations) == 0 {
		t.Error("spot worker has no spot tolerations")
	}
	l := render.Launcher(job)
	terms := l.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 1 || len(terms[0].MatchExpressions) != len(etjobv1.SpotLabels) || terms[0].MatchExpressions[0].Operator != corev1.NodeSelectorOpNotIn {
		t.Errorf("launcher of a spot job must require on-demand capacity: %+v", terms)
	}
	if l.Spec.Containers[0].Command[2] != "etjob.rdzv" || l.Spec.Containers[0].Image != "python:3.11" {
		t.Errorf("default torchrun launcher %+v", l.Spec.Containers[0])
	}
	if got := env(l.Spec.Containers[0])["ETJOB_RDZV_REPLACEMENT"]; got != "0" {
		t.Errorf("the first launcher's ETJOB_RDZV_REPLACEMENT = %q, want 0", got)
	}
}

// TestLauncherNoHostNetwork (issue #42, M4): a store launcher never runs in
// its node's network, whose loopback every host-network process of the node
// reaches (its raw store listens there); a horovod launcher keeps its
// template's.
func TestLauncherNoHostNetwork(t *testing.T) {
	for _, fw := range []etjobv1.Framework{etjobv1.FrameworkTorchrun, etjobv1.FrameworkHorovod} {
		job := MakeElasticJob("train", "ml").Obj()
		job.Spec.Framework = fw
		tmpl := render.RendezvousLauncherTemplate(job.Spec.WorkerTemplate)
		tmpl.Spec.HostNetwork, tmpl.Spec.DNSPolicy = true, corev1.DNSClusterFirstWithHostNet
		job.Spec.LauncherTemplate = tmpl
		l := render.Launcher(job)
		want := fw == etjobv1.FrameworkHorovod
		if l.Spec.HostNetwork != want || (l.Spec.DNSPolicy == corev1.DNSClusterFirstWithHostNet) != want {
			t.Errorf("%s launcher: hostNetwork %v, DNS policy %q; want hostNetwork %v", fw, l.Spec.HostNetwork, l.Spec.DNSPolicy, want)
		}
	}
}

// TestLauncherOnDemandWithAffinity (issue #26, L6): a spot job's launcher
// template with an affinity of its own still requires on-demand capacity,
// in each of its terms; one whose terms name a capacity label chose for
// itself.
func TestLauncherOnDemandWithAffinity(t *testing.T) {
	zone := corev1.NodeSelectorRequirement{Key: "topology.kubernetes.io/zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}
	withTerms := func(terms ...corev1.NodeSelectorTerm) *etjobv1.ElasticJob {
		job := MakeElasticJob("train", "ml").Obj()
		job.Spec.Spot = &etjobv1.SpotSpec{Enabled: true}
		tmpl := render.RendezvousLauncherTemplate(job.Spec.WorkerTemplate)
		tmpl.Spec.Affinity = &corev1.Affinity{
			PodAntiAffinity: &corev1.PodAntiAffinity{},
			NodeAffinity:    &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: terms}},
		}
		job.Spec.LauncherTemplate = tmpl
		return job
	}
	terms := render.Launcher(withTerms(corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{zone}},
		corev1.NodeSelectorTerm{})).Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 2 {
		t.Fatalf("terms %+v, want the template's two", terms)
	}
	for i, term := range terms {
		spot := 0
		for _, r := range term.MatchExpressions {
			if _, ok := etjobv1.SpotLabels[r.Key]; ok && r.Operator == corev1.NodeSelectorOpNotIn {
				spot++
			}
		}
		if spot != len(etjobv1.SpotLabels) {
			t.Errorf("term %d %+v: %d spot labels excluded, want all %d", i, term, spot, len(etjobv1.SpotLabels))
		}
	}
	if terms[0].MatchExpressions[0].Key != zone.Key {
		t.Errorf("the template's own requirement is gone: %+v", terms[0])
	}
	chosen := corev1.NodeSelectorRequirement{Key: etjobv1.LabelCapacityType, Operator: corev1.NodeSelectorOpIn, Values: []string{etjobv1.CapacityTypeSpot}}
	terms = render.Launcher(withTerms(corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{chosen}})).
		Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 1 || len(terms[0].MatchExpressions) != 1 {
		t.Errorf("a template that chose its capacity: terms %+v, want them as they were", terms)
	}
}

// TestReplacementLauncher: a launcher that replaces one (spec.recovery
// InProcess) tells its store so (ETJOB_RDZV_REPLACEMENT).
func TestReplacementLauncher(t *testing.T) {
	job := MakeElasticJob("r", "ml").Recovery(etjobv1.RecoveryInProcess).Obj()
	job.Status.LauncherReplacements = 2
	if got := env(render.Launcher(job).Spec.Containers[0])["ETJOB_RDZV_REPLACEMENT"]; got != "2" {
		t.Errorf("ETJOB_RDZV_REPLACEMENT = %q, want 2", got)
	}
}

func TestConfigMap(t *testing.T) {
	job := MakeElasticJob("h", "ml").Framework(etjobv1.FrameworkHorovod).Obj()
	cm := render.ConfigMap(job, etjobv1.MembershipStatus{Generation: 3, Hosts: []string{"h-worker-0:2", "h-worker-3:2"}})
	if cm.Data["hosts"] != "h-worker-0:2\nh-worker-3:2\n" || cm.Data["hostfile"] != "h-worker-0 slots=2\nh-worker-3 slots=2\n" || cm.Data["generation"] != "3" {
		t.Errorf("data %v", cm.Data)
	}
	if !strings.Contains(cm.Data["kubexec.sh"], "kubexec.py") || !strings.Contains(cm.Data["kubexec.py"], "v5.channel.k8s.io") {
		t.Errorf("kubexec.sh must run etjob's own exec client beside it, not kubectl: %q", cm.Data["kubexec.sh"])
	}
	l := render.Launcher(job)
	// horovodrun honours an rsh agent only at exactly /etc/mpi/kubexec.sh
	// (is_kubeflow_mpi); any other value makes it run ssh.
	if l.Spec.ServiceAccountName != "h-launcher" || env(l.Spec.Containers[0])["OMPI_MCA_plm_rsh_agent"] != "/etc/mpi/kubexec.sh" {
		t.Errorf("horovod launcher %+v", l.Spec)
	}
	mounts := map[string]bool{}
	for _, m := range l.Spec.Containers[0].VolumeMounts {
		mounts[m.MountPath] = m.Name == "etjob-edl"
	}
	if !mounts["/etc/mpi"] || !mounts["/etc/edl"] {
		t.Errorf("the scripts must be at /etc/mpi (horovodrun's path) and /etc/edl (et-operator's): %+v", l.Spec.Containers[0].VolumeMounts)
	}
	// horovodrun copies the launcher's environment into every rank: the
	// launcher must carry no pod identity for the ranks to inherit.
	for _, name := range []string{"ETJOB_POD_NAME", "ETJOB_POD_IP", "ETJOB_NODE_IP", "ETJOB_AGENT_ADDR"} {
		if _, ok := env(l.Spec.Containers[0])[name]; ok {
			t.Errorf("the horovod launcher sets %s, which horovodrun would copy into every rank", name)
		}
		if _, ok := env(render.Worker(job, 0).Spec.Containers[0])[name]; !ok {
			t.Errorf("a horovod worker lacks %s", name)
		}
	}
}

// TestKubexecScriptQuotes (finding M7): names from the job's template are
// quoted in the generated script, never run as shell syntax.
func TestKubexecScriptQuotes(t *testing.T) {
	s := render.KubexecScript("team-a", "w'; touch /tmp/pwned; '")
	if !strings.Contains(s, `--namespace 'team-a' --container 'w'\''; touch /tmp/pwned; '\'''`) {
		t.Errorf("container name not quoted:\n%s", s)
	}
}

// TestPlannedWorker: extra workers carry the label and the growth
// PriorityClass; every new worker is kept off the plan's AvoidNodes, in each
// node selector term the template requires.
func TestPlannedWorker(t *testing.T) {
	job := MakeElasticJob("train", "ml").Replicas(2).Max(4).Growth(etjobv1.GrowthSpec{Policy: etjobv1.GrowthOpportunistic}).Obj()
	prio := int32(100)
	job.Spec.WorkerTemplate.Spec.Priority = &prio
	job.Spec.WorkerTemplate.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
			{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}},
			{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"b"}}}},
		}}}}
	plan := &core.Plan{CreateWorkers: []int32{2, 3}, ExtraWorkers: []int32{3}, AvoidNodes: []string{"n1", "n2"}}

	base := render.PlannedWorker(job, plan, 2)
	if _, ok := base.Labels[etjobv1.LabelExtra]; ok || base.Spec.PriorityClassName != "" || base.Spec.Priority == nil {
		t.Errorf("base worker: labels %v, priorityClassName %q, priority %v; want the template's", base.Labels, base.Spec.PriorityClassName, base.Spec.Priority)
	}
	extra := render.PlannedWorker(job, plan, 3)
	if extra.Labels[etjobv1.LabelExtra] != "true" || extra.Spec.PriorityClassName != etjobv1.DefaultGrowthPriorityClass || extra.Spec.Priority != nil {
		t.Errorf("extra worker: labels %v, priorityClassName %q, priority %v", extra.Labels, extra.Spec.PriorityClassName, extra.Spec.Priority)
	}
	want := []corev1.NodeSelectorRequirement{
		{Key: "metadata.name", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"n1"}},
		{Key: "metadata.name", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"n2"}},
	}
	terms := extra.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 2 {
		t.Fatalf("terms = %+v, want the template's two", terms)
	}
	for i, term := range terms {
		if diff := cmp.Diff(want, term.MatchFields); diff != "" {
			t.Errorf("term %d's matchFields (-want +got):\n%s", i, diff)
		}
	}
	if len(job.Spec.WorkerTemplate.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchFields) != 0 {
		t.Errorf("the template itself was changed")
	}
	plain := MakeElasticJob("train", "ml").Obj()
	if p := render.PlannedWorker(plain, &core.Plan{AvoidNodes: []string{"n1"}}, 0); len(p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms) != 1 {
		t.Errorf("without a template affinity: %+v, want one term", p.Spec.Affinity)
	}
}

// TestNetworkPolicy (N1): the launcher, which serves the rendezvous store,
// admits connections from the job's own pods only; the policy selects the
// launcher the controller creates, and no worker.
func TestNetworkPolicy(t *testing.T) {
	job := MakeElasticJob("train", "ml").Replicas(2).Min(1).Max(4).Obj()
	np := render.NetworkPolicy(job)
	if np.Namespace != "ml" || len(np.OwnerReferences) != 1 || np.OwnerReferences[0].Kind != "ElasticJob" {
		t.Errorf("metadata: %+v, want in ml and owned by the job", np.ObjectMeta)
	}
	matches := func(sel map[string]string, labels map[string]string) bool {
		for k, v := range sel {
			if labels[k] != v {
				return false
			}
		}
		return true
	}
	launcher := render.Launcher(job)
	worker := render.Worker(job, 0)
	// issue #42 H3: the workers' ports too (torchrun's bootstrap store, gloo,
	// NCCL), not only the launcher's; another job's pods are not selected
	if sel := np.Spec.PodSelector.MatchLabels; !matches(sel, launcher.Labels) || !matches(sel, worker.Labels) ||
		matches(sel, render.Worker(MakeElasticJob("other", "ml").Obj(), 0).Labels) {
		t.Errorf("selector %v: want the launcher (%v) and the workers (%v), not another job's", sel, launcher.Labels, worker.Labels)
	}
	if got := np.Spec.PolicyTypes; !slices.Equal(got, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
		t.Errorf("policy types %v, want Ingress", got)
	}
	if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].From) != 1 || np.Spec.Ingress[0].From[0].NamespaceSelector != nil ||
		np.Spec.Ingress[0].From[0].IPBlock != nil {
		t.Fatalf("ingress %+v, want one rule from pods of the job's namespace", np.Spec.Ingress)
	}
	from := np.Spec.Ingress[0].From[0].PodSelector.MatchLabels
	other := MakeElasticJob("other", "ml").Obj()
	if !matches(from, worker.Labels) || !matches(from, launcher.Labels) || matches(from, render.Worker(other, 0).Labels) {
		t.Errorf("from %v: want the job's workers and launcher, not another job's pods", from)
	}
	// spec.networkPeers, the opt-in: admitted beside the job's own pods
	scraper := networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"name": "monitoring"}}}
	job.Spec.NetworkPeers = []networkingv1.NetworkPolicyPeer{scraper}
	got := render.NetworkPolicy(job).Spec.Ingress
	if len(got) != 1 || len(got[0].From) != 2 || got[0].From[1].NamespaceSelector.MatchLabels["name"] != "monitoring" {
		t.Errorf("ingress with a peer: %+v, want the job's pods and the peer", got)
	}
}

// TestStoreSecret: a torchrun job's launcher and workers mount the job's
// store Secret read-only and name the file in $ETJOB_STORE_SECRET_FILE; the
// secret itself is in no environment; a horovod job (no store) has none.
func TestStoreSecret(t *testing.T) {
	job := MakeElasticJob("train", "ml").Replicas(2).Min(1).Max(4).Obj()
	key := bytes.Repeat([]byte{0xab}, etjobv1.StoreSecretBytes)
	s := render.StoreSecret(job, key)
	if s.Name != "train-store" || s.Namespace != "ml" || !metav1.IsControlledBy(s, job) || s.Labels[etjobv1.LabelJobName] != "train" {
		t.Errorf("metadata %+v: want train-store in ml, controlled by the job and labelled with it", s.ObjectMeta)
	}
	if s.Immutable == nil || !*s.Immutable {
		t.Error("the Secret is not immutable")
	}
	value := string(s.Data[etjobv1.StoreSecretKey])
	if value != strings.Repeat("ab", etjobv1.StoreSecretBytes) {
		t.Errorf("data %q, want the key hex-encoded", value)
	}
	check := func(role string, pod *corev1.Pod, want bool) {
		t.Helper()
		var vol *corev1.Volume
		for i := range pod.Spec.Volumes {
			if v := &pod.Spec.Volumes[i]; v.Secret != nil && v.Secret.SecretName == s.Name {
				vol = v
			}
		}
		if (vol != nil) != want {
			t.Fatalf("%s: mounts the store secret: %v, want %v", role, vol != nil, want)
		}
		for _, c := range pod.Spec.Containers {
			env := map[string]string{}
			for _, e := range c.Env {
				env[e.Name] = e.Value
				if strings.Contains(e.Value, value) {
					t.Errorf("%s: the secret is in $%s", role, e.Name)
				}
			}
			if got := env[etjobv1.EnvStoreSecretFile]; (got == etjobv1.StoreSecretPath) != want {
				t.Errorf("%s/%s: $%s=%q (want it: %v)", role, c.Name, etjobv1.EnvStoreSecretFile, got, want)
			}
			if !want {
				continue
			}
			mounted := false
			for _, m := range c.VolumeMounts {
				if m.Name == vol.Name && m.ReadOnly && path.Join(m.MountPath, vol.Secret.Items[0].Path) == etjobv1.StoreSecretPath {
					mounted = true
				}
			}
			if !mounted {
				t.Errorf("%s/%s: the secret is not mounted read-only at %s: %+v", role, c.Name, etjobv1.StoreSecretPath, c.VolumeMounts)
			}
		}
	}
	check("torchrun launcher", render.Launcher(job), true)
	check("torchrun worker", render.Worker(job, 0), true)
	hvd := MakeElasticJob("hvd", "ml").Framework(etjobv1.FrameworkHorovod).Obj()
	check("horovod launcher", render.Launcher(hvd), false)
	check("horovod worker", render.Worker(hvd, 0), false)
}

// TestEndpointSlice: the job's Service selects nothing (a mirror pod with
// the job's label is never one of its addresses: issue #42, C2) and its
// slice lists the pods it is given (the job's own) that have an IP and are
// not finished or being deleted, named by hostname where their subdomain is
// the Service, ready whatever their probes say.
func TestEndpointSlice(t *testing.T) {
	job := MakeElasticJob("train", "ns").Obj()
	if svc := render.Service(job); svc.Spec.Selector != nil || svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Fatalf("Service: selector %v, clusterIP %q; want none, headless", svc.Spec.Selector, svc.Spec.ClusterIP)
	}
	named := func(p *corev1.Pod, ip string) *corev1.Pod {
		p.Spec.Hostname, p.Spec.Subdomain, p.Status.PodIP = p.Name, "train", ip
		return p
	}
	launcher := named(MakeLauncher(job).Node("n0").Obj(), "10.0.0.9")
	w1 := named(MakeWorker(job, 1).Obj(), "10.0.0.2")
	w0 := named(MakeWorker(job, 0).Obj(), "10.0.0.1")
	w0.Spec.Subdomain = "elsewhere" // no DNS name under this Service
	noIP := named(MakeWorker(job, 2).Obj(), "")
	done := named(MakeWorker(job, 3).Exited(0, time.Now()).Obj(), "10.0.0.4")
	gone := named(MakeWorker(job, 4).Deleting(time.Now()).Obj(), "10.0.0.5")
	v6 := named(MakeWorker(job, 5).Obj(), "fd00::6")
	loop := named(MakeWorker(job, 6).Obj(), "127.0.1.2") // the API refuses it (the local cluster's pods)
	s := render.EndpointSlice(job, []*corev1.Pod{w1, launcher, w0, noIP, done, gone, v6, loop})
	if s.Name != "train" || s.Labels[discoveryv1.LabelServiceName] != "train" ||
		s.Labels[discoveryv1.LabelManagedBy] != render.EndpointSliceManagedBy || s.AddressType != discoveryv1.AddressTypeIPv4 {
		t.Fatalf("slice %s: labels %v, address type %s", s.Name, s.Labels, s.AddressType)
	}
	var got []string
	for _, ep := range s.Endpoints {
		host := "-"
		if ep.Hostname != nil {
			host = *ep.Hostname
		}
		got = append(got, ep.TargetRef.Name+" "+ep.Addresses[0]+" "+host)
		if ep.Conditions.Ready == nil || !*ep.Conditions.Ready {
			t.Errorf("%s: not ready", ep.TargetRef.Name)
		}
	}
	want := []string{"train-launcher 10.0.0.9 train-launcher", "train-worker-0 10.0.0.1 -", "train-worker-1 10.0.0.2 train-worker-1"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("endpoints (-want +got):\n%s", diff)
	}
	if s := render.EndpointSlice(job, []*corev1.Pod{v6, launcher}); s.AddressType != discoveryv1.AddressTypeIPv4 || len(s.Endpoints) != 1 {
		t.Errorf("the launcher's family decides: %s, %d endpoints", s.AddressType, len(s.Endpoints))
	}
	if s := render.EndpointSlice(job, []*corev1.Pod{v6, w1}); s.AddressType != discoveryv1.AddressTypeIPv6 || len(s.Endpoints) != 1 {
		t.Errorf("no launcher: the first pod's family decides: %s, %d endpoints", s.AddressType, len(s.Endpoints))
	}
	if s := render.EndpointSlice(job, []*corev1.Pod{v6}); s.AddressType != discoveryv1.AddressTypeIPv6 || len(s.Endpoints) != 1 {
		t.Errorf("an IPv6 job: %s, %d endpoints", s.AddressType, len(s.Endpoints))
	}
}

// TestDisruptionBudget: the job's budget holds every Ready pod of the job
// and none of another job's, lets pods that are not Ready
// go (AlwaysAllow) and is owned by the job.
func TestDisruptionBudget(t *testing.T) {
	job := MakeElasticJob("train", "ml").Replicas(2).Min(1).Max(4).Obj()
	pdb := render.DisruptionBudget(job)
	if pdb.Name != job.Name || pdb.Namespace != job.Namespace {
		t.Errorf("name %s/%s; want the job's", pdb.Namespace, pdb.Name)
	}
	if got := pdb.Spec.MinAvailable; got == nil || got.Type != intstr.Int || got.IntValue() != render.DisruptionBudgetMinAvailable || pdb.Spec.MaxUnavailable != nil {
		t.Errorf("minAvailable %v, maxUnavailable %v; want a count no job reaches (not a percentage or maxUnavailable: those read the job's scale, which leaves out the launcher) and none", got, pdb.Spec.MaxUnavailable)
	}
	if p := pdb.Spec.UnhealthyPodEvictionPolicy; p == nil || *p != policyv1.AlwaysAllow {
		t.Errorf("unhealthyPodEvictionPolicy %v; want AlwaysAllow", p)
	}
	sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	for _, pod := range []*corev1.Pod{render.Worker(job, 0), render.Launcher(job)} {
		if !sel.Matches(labels.Set(pod.Labels)) {
			t.Errorf("the budget does not select %s", pod.Name)
		}
	}
	other := MakeElasticJob("other", "ml").Replicas(2).Min(1).Max(4).Obj()
	if sel.Matches(labels.Set(render.Worker(other, 0).Labels)) {
		t.Errorf("the budget selects another job's worker")
	}
	if len(pdb.OwnerReferences) != 1 || pdb.OwnerReferences[0].Name != job.Name {
		t.Errorf("owners %+v; want the job", pdb.OwnerReferences)
	}
}
