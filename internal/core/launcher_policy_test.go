package core

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// TestJudgeLauncher: the launcher rule as a function of its pod, the spec,
// the time and the pass's facts. Decide's tables (launcher_test.go,
// horovod_test.go) keep the stories.
func TestJudgeLauncher(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	torchrun := &etjobv1.ElasticJobSpec{Framework: etjobv1.FrameworkTorchrun, MaxWaitTime: 60}
	inProcess := &etjobv1.ElasticJobSpec{Framework: etjobv1.FrameworkTorchrun, Recovery: etjobv1.RecoveryInProcess, MaxWaitTime: 60}
	horovod := &etjobv1.ElasticJobSpec{Framework: etjobv1.FrameworkHorovod, MaxWaitTime: 60}
	pod := func(edit func(*podView)) *podView {
		v := &podView{pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "j-launcher"}}, role: etjobv1.RoleLauncher}
		if edit != nil {
			edit(v)
		}
		return v
	}
	running := pod(nil)
	deleting := pod(func(v *podView) { v.deleting = true })
	noticed := pod(func(v *podView) { v.noticed = true })
	exited := pod(func(v *podView) { v.terminal, v.exitCode = true, 1 })
	succeeded := pod(func(v *podView) { v.terminal, v.succeeded = true, true })
	notReady := pod(func(v *podView) { v.notReadySince = now.Add(-20 * time.Second) })
	notReadyLong := pod(func(v *podView) { v.notReadySince = now.Add(-60 * time.Second) })
	for _, c := range []struct {
		name string
		spec *etjobv1.ElasticJobSpec
		f    launcherFacts
		want launcherVerdict
	}{
		{"missing: created", torchrun, launcherFacts{}, launcherVerdict{action: launcherCreate}},
		{"missing while restarting: the restart creates it", torchrun, launcherFacts{restarting: true}, launcherVerdict{}},
		{"missing, horovod: horovodrun waits for its workers", horovod, launcherFacts{}, launcherVerdict{}},
		{"missing under members, InProcess: a replacement", inProcess, launcherFacts{members: 2}, launcherVerdict{action: launcherCreate, replacement: true}},
		{"being deleted: a restart waits for its name", torchrun, launcherFacts{launcher: deleting}, launcherVerdict{action: launcherAwaitName}},
		{"being deleted, InProcess: the workers go on", inProcess, launcherFacts{launcher: deleting, members: 2}, launcherVerdict{}},
		{"running", torchrun, launcherFacts{launcher: running, members: 2}, launcherVerdict{}},
		{"horovodrun exited 0: complete", horovod, launcherFacts{launcher: succeeded}, launcherVerdict{action: launcherCompleted}},
		{"InProcess, noticed: replaced at once", inProcess, launcherFacts{launcher: noticed}, launcherVerdict{action: launcherReplace, noticed: true}},
		{"InProcess, exited: replaced", inProcess, launcherFacts{launcher: exited}, launcherVerdict{action: launcherReplace}},
		{"InProcess, NotReady for a while: look again at maxWaitTime", inProcess, launcherFacts{launcher: notReady},
			launcherVerdict{lookAgainAt: now.Add(40 * time.Second)}},
		{"InProcess, NotReady for maxWaitTime: replaced", inProcess, launcherFacts{launcher: notReadyLong}, launcherVerdict{action: launcherReplace}},
		{"noticed: moved", torchrun, launcherFacts{launcher: noticed, members: 2}, launcherVerdict{action: launcherMove}},
		{"a horovodrun etjob stopped, its ranks gone: released", horovod, launcherFacts{launcher: running, stoppedReleased: true},
			launcherVerdict{action: launcherRelease}},
		{"NotReady for a while: look again at maxWaitTime", torchrun, launcherFacts{launcher: notReady},
			launcherVerdict{lookAgainAt: now.Add(40 * time.Second)}},
		{"NotReady for maxWaitTime: lost", torchrun, launcherFacts{launcher: notReadyLong}, launcherVerdict{action: launcherLost}},
		{"horovodrun's exit after etjob's stop: released", horovod, launcherFacts{launcher: exited, exitReleased: true},
			launcherVerdict{action: launcherRelease}},
		{"horovodrun's exit of its own: lost", horovod, launcherFacts{launcher: exited}, launcherVerdict{action: launcherLost}},
		{"exited: lost", torchrun, launcherFacts{launcher: exited}, launcherVerdict{action: launcherLost}},
	} {
		if got := judgeLauncher(c.spec, now, c.f); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

// TestStoreGone: a torchrun job under spec.recovery Restart whose launcher
// went while it had members lost its rendezvous store.
func TestStoreGone(t *testing.T) {
	restart := &etjobv1.ElasticJobSpec{Framework: etjobv1.FrameworkTorchrun}
	deleting := &podView{pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "j-launcher"}}, deleting: true}
	for _, c := range []struct {
		name string
		spec *etjobv1.ElasticJobSpec
		f    launcherFacts
		want string
	}{
		{"gone under members", restart, launcherFacts{members: 3}, "the launcher is gone while 3 workers were members"},
		{"deleted under members", restart, launcherFacts{members: 2, launcher: deleting}, "launcher j-launcher deleted while 2 workers were members"},
		{"no members: nothing lost", restart, launcherFacts{}, ""},
		{"the pass restarts anyway", restart, launcherFacts{members: 3, restarting: true}, ""},
		{"InProcess: replaced alone", &etjobv1.ElasticJobSpec{Recovery: etjobv1.RecoveryInProcess}, launcherFacts{members: 3}, ""},
		{"horovod: no launcher before its members", &etjobv1.ElasticJobSpec{Framework: etjobv1.FrameworkHorovod}, launcherFacts{members: 3}, ""},
	} {
		got := storeGone(c.spec, c.f)
		if (got == "") != (c.want == "") || !strings.HasPrefix(got, c.want) {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

// TestLauncherMoveSignals: which workers a launcher move tells to stop, and
// how long it waits for them.
func TestLauncherMoveSignals(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	grace := 30 * time.Second
	w := func(name string, edit func(*podView)) *podView {
		v := &podView{pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}}, ready: true}
		if edit != nil {
			edit(v)
		}
		return v
	}
	ready := w("ready", nil)
	starting := w("starting", func(v *podView) { v.ready = false })
	toldEarlier := w("told", func(v *podView) { v.leaveAt = now.Add(-20 * time.Second) })
	toldLongAgo := w("long", func(v *podView) { v.leaveAt = now.Add(-40 * time.Second) })
	gone := w("gone", func(v *podView) { v.terminal = true })
	for _, c := range []struct {
		name      string
		workers   []*podView
		notice    time.Time
		wantTell  string
		wantUntil time.Time
	}{
		{"a ready worker is told and waited for", []*podView{ready, starting, gone}, time.Time{}, "ready", now.Add(grace)},
		{"one told earlier: the earliest stop due", []*podView{ready, toldEarlier}, time.Time{}, "ready", now.Add(10 * time.Second)},
		{"a later notice deadline gives more time", []*podView{toldEarlier}, now.Add(time.Minute), "", now.Add(time.Minute)},
		{"every stop past due: nothing to wait for", []*podView{toldLongAgo, starting, gone}, time.Time{}, "", time.Time{}},
	} {
		tell, until := launcherMoveSignals(c.workers, now, grace, c.notice)
		if got := names(tell); got != c.wantTell || !until.Equal(c.wantUntil) {
			t.Errorf("%s: told %q until %v, want %q until %v", c.name, got, until, c.wantTell, c.wantUntil)
		}
	}
}
