package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"strings"
	"testing"
	"time"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/scheme"
	"github.com/etjob/etjob/internal/testutil"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

var now = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

func ago(d time.Duration) metav1.Time { return metav1.NewTime(now.Add(-d)) }

func golden(t *testing.T, name, got string) {
	t.Helper()
	testutil.Golden(t, name, got, *update)
}

// runningJob is seed 001's elastic-training: horovod, 3 workers of 1..9, one
// of them preempted and replaced.
func runningJob() *etjobv1.ElasticJob {
	j := testutil.MakeElasticJob("elastic-training", "default").Framework(etjobv1.FrameworkHorovod).Replicas(3).Max(9).Obj()
	j.CreationTimestamp = ago(3 * time.Minute)
	j.Spec.CheckpointDir = "/ckpt"
	j.Status = etjobv1.ElasticJobStatus{
		Summary: "Running", Members: 3, ReadyReplicas: 3, Replicas: 3, Preemptions: 1,
		StartTime: ptrTime(ago(3 * time.Minute)),
		Conditions: []metav1.Condition{
			{Type: etjobv1.ConditionRunning, Status: metav1.ConditionTrue, Reason: etjobv1.ReasonMembersReady},
			{Type: etjobv1.ConditionSuspended, Status: metav1.ConditionFalse, Reason: etjobv1.ReasonNotSuspended},
		},
		Membership:     etjobv1.MembershipStatus{Generation: 4, ChangeTime: ptrTime(ago(time.Minute))},
		LastCheckpoint: &etjobv1.CheckpointStatus{Step: 340, Path: "step-340.pt", Time: ptrTime(ago(30 * time.Second))},
		Workers: []etjobv1.WorkerStatus{
			{Name: "elastic-training-worker-0", State: etjobv1.WorkerMember},
			{Name: "elastic-training-worker-1", Index: 1, State: etjobv1.WorkerMember},
			{Name: "elastic-training-worker-3", Index: 3, State: etjobv1.WorkerMember},
		},
		Timeline: []etjobv1.TimelineEvent{
			{Time: ago(3 * time.Minute), Type: "Join", Generation: 1, Members: 3, Message: "joined: elastic-training-worker-0, elastic-training-worker-1, elastic-training-worker-2"},
			{Time: ago(2 * time.Minute), Type: "Notice", Generation: 2, Members: 3, Message: "elastic-training-worker-2: reclamation notice (aws)"},
			{Time: ago(2 * time.Minute), Type: "Leave", Generation: 3, Members: 2, Message: "left: elastic-training-worker-2"},
			{Time: ago(time.Minute), Type: "Join", Generation: 4, Members: 3, Message: "joined: elastic-training-worker-3"},
		},
	}
	return j
}

func waitingJob() *etjobv1.ElasticJob {
	j := testutil.MakeElasticJob("digits", "default").Replicas(4).Min(2).Max(6).Obj()
	j.CreationTimestamp = ago(90 * time.Second)
	j.Status = etjobv1.ElasticJobStatus{
		Summary: etjobv1.ReasonWaitingForCapacity, Restarts: 1,
		Conditions: []metav1.Condition{
			{Type: etjobv1.ConditionRunning, Status: metav1.ConditionFalse, Reason: etjobv1.ReasonWaitingForCapacity, Message: "waiting for capacity"},
			{Type: etjobv1.ConditionSuspended, Status: metav1.ConditionTrue, Reason: etjobv1.ReasonWaitingForCapacity,
				Message: "waiting for capacity: 1 of spec.minReplicas (2) workers ready, 3 pending: 0/5 nodes are available: 5 Insufficient nvidia.com/gpu."},
		},
	}
	return j
}

func ptrTime(t metav1.Time) *metav1.Time { return &t }

func pod(job, name, role, index, node string, gpus int64, phase corev1.PodPhase, created time.Duration) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", CreationTimestamp: ago(created),
			Labels: map[string]string{etjobv1.LabelJobName: job, etjobv1.LabelRole: role}},
		Spec:   corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: role}}},
		Status: corev1.PodStatus{Phase: phase, PodIP: "10.0.0." + index, StartTime: ptrTime(ago(created))},
	}
	if role == etjobv1.RoleWorker {
		p.Labels[etjobv1.LabelWorkerIndex] = index
		p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": *resource.NewQuantity(gpus, resource.DecimalSI)}
	}
	if node == "" {
		p.Status.StartTime = nil
	}
	return p
}

func fixtures() []client.Object {
	return []client.Object{
		runningJob(), waitingJob(),
		pod("elastic-training", "elastic-training-launcher", etjobv1.RoleLauncher, "9", "on-demand-1", 0, corev1.PodRunning, 3*time.Minute),
		pod("elastic-training", "elastic-training-worker-0", etjobv1.RoleWorker, "0", "spot-1", 1, corev1.PodRunning, 3*time.Minute),
		pod("elastic-training", "elastic-training-worker-1", etjobv1.RoleWorker, "1", "spot-2", 1, corev1.PodRunning, 3*time.Minute),
		pod("elastic-training", "elastic-training-worker-3", etjobv1.RoleWorker, "3", "spot-3", 1, corev1.PodRunning, time.Minute),
		pod("digits", "digits-launcher", etjobv1.RoleLauncher, "8", "on-demand-1", 0, corev1.PodRunning, 90*time.Second),
		pod("digits", "digits-worker-0", etjobv1.RoleWorker, "0", "spot-4", 1, corev1.PodRunning, 90*time.Second),
		pod("digits", "digits-worker-1", etjobv1.RoleWorker, "1", "", 1, corev1.PodPending, 90*time.Second),
		&corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "e1", Namespace: "default"}, Type: "Normal", Reason: "MembershipChanged",
			InvolvedObject: corev1.ObjectReference{Kind: "ElasticJob", Name: "elastic-training"}, LastTimestamp: ago(time.Minute), Message: "joined: elastic-training-worker-3"},
		&corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "e2", Namespace: "default"}, Type: "Warning", Reason: "Preempted",
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: "elastic-training-worker-3"}, LastTimestamp: ago(2 * time.Minute), Message: "reclamation notice (aws)"},
		&corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "e3", Namespace: "default"}, Type: "Normal", Reason: "Scheduled",
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: "elastic-training-worker-0"}, LastTimestamp: ago(3 * time.Minute), Message: "Successfully assigned default/elastic-training-worker-0 to spot-1"},
		node("spot-1", true, "0.9180"), node("spot-2", true, "0.9180"), node("spot-3", true, "1.0000"), node("on-demand-1", false, "3.0600"),
	}
}

func node(name string, spot bool, price string) *corev1.Node {
	capacity := "on-demand"
	if spot {
		capacity = "spot"
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		etjobv1.LabelCapacityType: capacity, etjobv1.LabelPricePerHour: price, corev1.LabelInstanceTypeStable: "p3.2xlarge"}}}
}

func testFactory(objs ...runtime.Object) (*factory, *bytes.Buffer, *bytes.Buffer) {
	var out, errOut bytes.Buffer
	f := newFactory("etjob", IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	c := fake.NewClientBuilder().WithScheme(scheme.New()).WithRuntimeObjects(objs...).WithStatusSubresource(&etjobv1.ElasticJob{}).Build()
	f.clients = &Clients{Client: c, Namespace: "default"}
	return f, &out, &errOut
}

func objects() []runtime.Object {
	var out []runtime.Object
	for _, o := range fixtures() {
		out = append(out, o)
	}
	return out
}

func TestGetGolden(t *testing.T) {
	cases := map[string]GetOptions{
		"get_running":        {Name: "elastic-training"},
		"get_running_wide_e": {Name: "elastic-training", Output: "wide", Events: true},
		"get_waiting":        {Name: "digits"},
	}
	for name, o := range cases {
		t.Run(name, func(t *testing.T) {
			f, out, _ := testFactory(objects()...)
			o.factory, o.clients, o.Now = f, f.clients, func() time.Time { return now }
			if err := o.Run(context.Background()); err != nil {
				t.Fatal(err)
			}
			golden(t, name, out.String())
		})
	}
}

func TestListAndTopGolden(t *testing.T) {
	for name, wide := range map[string]bool{"list": false, "list_wide": true} {
		t.Run(name, func(t *testing.T) {
			f, out, _ := testFactory(objects()...)
			o := ListOptions{Output: map[bool]string{true: "wide"}[wide], factory: f, clients: f.clients, Now: func() time.Time { return now }}
			if err := o.Run(context.Background()); err != nil {
				t.Fatal(err)
			}
			golden(t, name, out.String())
		})
	}
	t.Run("top_once", func(t *testing.T) {
		f, out, _ := testFactory(objects()...)
		o := TopOptions{Once: true, AllNamespaces: true, Interval: time.Second, factory: f, clients: f.clients, Now: func() time.Time { return now }}
		if err := o.Run(context.Background()); err != nil {
			t.Fatal(err)
		}
		golden(t, "top_once", out.String())
	})
	t.Run("cost", func(t *testing.T) {
		objs := objects()
		for _, o := range objs {
			if j, ok := o.(*etjobv1.ElasticJob); ok && j.Name == "elastic-training" {
				j.Status.Cost = &etjobv1.CostStatus{Time: &metav1.MicroTime{Time: now.Add(-time.Minute)}, Rows: []etjobv1.CostRow{
					{CapacityType: "spot", InstanceType: "p3.2xlarge", PricePerHour: "0.918", OnDemandPricePerHour: "3.06", Milliseconds: 360000},
					{CapacityType: "spot", InstanceType: "p3.2xlarge", PricePerHour: "1", OnDemandPricePerHour: "3.06", Milliseconds: 60000},
					{CapacityType: "on-demand", InstanceType: "m5.xlarge", PricePerHour: "0.192", OnDemandPricePerHour: "0.192", Milliseconds: 60000},
				}}
			}
		}
		f, out, _ := testFactory(objs...)
		// digits has no bill yet: it says so, and the other job's bill follows.
		o := CostOptions{Names: []string{"digits", "elastic-training"}, factory: f, clients: f.clients}
		if err := o.Run(context.Background()); err != nil {
			t.Fatal(err)
		}
		golden(t, "cost", out.String())
	})
}

func TestCommandLine(t *testing.T) {
	hpa := &autoscalingv2.HorizontalPodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Name: "digits-hpa", Namespace: "default"},
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{MaxReplicas: 6,
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "etjob.dev/v1alpha1", Kind: "ElasticJob", Name: "digits"}},
	}
	cases := map[string]struct {
		args    []string
		wantErr string
		wantOut string
	}{
		"unsupported arena flag": {
			args:    []string{"submit", "etjob", "--name", "x", "--image", "i", "--rdma", "cmd"},
			wantErr: "--rdma is an Arena flag that etjob does not support",
		},
		"unsupported arena string flag": {
			args:    []string{"submit", "--name", "x", "--image", "i", "--ssh-secret", "s", "cmd"},
			wantErr: "--ssh-secret is an Arena flag that etjob does not support: etjob's horovod launcher reaches workers through the Kubernetes API",
		},
		"submit et alias creates": {
			args:    []string{"submit", "et", "--name", "x", "--image", "i", "--workers", "2", "torchrun", "train.py"},
			wantOut: "elasticjob.etjob.dev/x created\n",
		},
		"scaleout above max": {
			args:    []string{"scaleout", "etjob", "--name", "elastic-training", "--count", "7"},
			wantErr: "refused: --count would take elasticjob.etjob.dev/elastic-training to 10 workers, above its maximum of 9 (spec.maxReplicas, --max-workers at submit)",
		},
		"scalein below min": {
			args:    []string{"scalein", "digits", "--count", "3"},
			wantErr: "below its minimum of 2 (spec.minReplicas, --min-workers at submit)",
		},
		"scale with an HPA": {
			args:    []string{"scale", "digits", "--replicas", "5"},
			wantErr: "refused: HorizontalPodAutoscaler digits-hpa targets elasticjob.etjob.dev/digits",
		},
		"scalein of a pod of another job": {
			args:    []string{"scalein", "elastic-training", "--instance", "digits-worker-0"},
			wantErr: "--instance digits-worker-0: not a worker of elasticjob.etjob.dev/elastic-training",
		},
		"bad loglevel": {
			args:    []string{"submit", "--loglevel", "loud", "--name", "x", "--image", "i", "cmd"},
			wantErr: "--loglevel",
		},
		"suspend": {
			args:    []string{"suspend", "digits"},
			wantOut: "elasticjob.etjob.dev/digits suspended\n",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			f, out, _ := testFactory(append(objects(), hpa)...)
			root := newRoot(f)
			root.SetArgs(tc.args)
			err := root.Execute()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if out.String() != tc.wantOut {
				t.Errorf("out = %q, want %q", out.String(), tc.wantOut)
			}
		})
	}
}

func TestKubectlPluginName(t *testing.T) {
	want(t, progName("/usr/local/bin/kubectl-etjob"), "kubectl etjob")
	want(t, progName("etjob"), "etjob")
	var out bytes.Buffer
	root := NewNamedRootCommand("kubectl etjob", IOStreams{Out: &out, ErrOut: &out})
	root.SetArgs([]string{"get", "--help"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "kubectl etjob get NAME [flags]") || !strings.Contains(out.String(), "  kubectl etjob get elastic-training -e") {
		t.Errorf("help does not say kubectl etjob:\n%s", out.String())
	}
}

// TestUnquotedCommand (a low finding): an unquoted Arena command's own flags
// are the command's: `-np 4` is not -n p (namespace p).
func TestUnquotedCommand(t *testing.T) {
	f, out, _ := testFactory(objects()...)
	root := newRoot(f)
	root.SetArgs([]string{"submit", "etjob", "--framework", "horovod", "--name", "u", "--image", "i", "--dry-run", "-o", "json",
		"horovodrun", "-np", "4", "--host-discovery-script", "/etc/edl/discover_hosts.sh", "python", "t.py"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	j := &etjobv1.ElasticJob{}
	if err := json.Unmarshal(out.Bytes(), j); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	cmd := j.Spec.LauncherTemplate.Spec.Containers[0].Command
	if j.Namespace != "default" || cmd[len(cmd)-1] != "horovodrun -np 4 --host-discovery-script /etc/edl/discover_hosts.sh python t.py" {
		t.Errorf("namespace %q, launcher command %q", j.Namespace, cmd)
	}
}
