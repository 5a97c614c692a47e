package timeline

import (
	"flag"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/testutil"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

var t0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

func golden(t *testing.T, name, got string) {
	t.Helper()
	testutil.Golden(t, name, got, *update)
}

func entry(d time.Duration, typ string, gen int64, members int32, msg string) etjobv1.TimelineEvent {
	return etjobv1.TimelineEvent{Time: metav1.NewTime(at(d)), Type: typ, Generation: gen, Members: members, Message: msg}
}

// spotStory is the demo's story as the controller records it: 4 workers,
// one reclaimed with a notice (shrink in place), two more at once (below
// min: suspend), capacity back (resume, grow to 4), done.
func spotStory() *etjobv1.ElasticJob {
	j := testutil.MakeElasticJob("digits", "default").Replicas(4).Min(2).Max(6).Obj()
	j.CreationTimestamp = metav1.NewTime(t0)
	j.Status.CompletionTime = &metav1.Time{Time: at(9 * time.Minute)}
	j.Status.Timeline = []etjobv1.TimelineEvent{
		entry(40*time.Second, "Join", 1, 4, "joined: digits-worker-0, digits-worker-1, digits-worker-2, digits-worker-3"),
		entry(2*time.Minute, "Notice", 1, 4, "digits-worker-3: reclamation notice (aws)"),
		entry(2*time.Minute+20*time.Second, "Leave", 2, 3, "digits-worker-3 preempted (ReclaimNotice(aws))"),
		entry(4*time.Minute, "Notice", 2, 3, "digits-worker-1, digits-worker-2: reclamation notice (aws)"),
		entry(4*time.Minute+5*time.Second, "Stop", 2, 3, "below spec.minReplicas (2): 3 workers told to checkpoint and stop"),
		entry(4*time.Minute+30*time.Second, "Suspend", 3, 0, "below spec.minReplicas: waiting for capacity"),
		entry(5*time.Minute+30*time.Second, "Resume", 4, 2, "capacity returned: resuming from the last checkpoint"),
		entry(6*time.Minute+30*time.Second, "Join", 5, 4, "joined: digits-worker-4, digits-worker-5"),
		entry(9*time.Minute, "Complete", 5, 4, "all workers exited 0"),
	}
	j.Status.Members = 4
	return j
}

// spotTraining is what two of the ranks logged meanwhile.
func spotTraining() []TrainingLog {
	var logs []TrainingLog
	add := func(d time.Duration, kind string, step, world int) {
		logs = append(logs, TrainingLog{At: at(d), Kind: kind, Step: step, World: world})
	}
	add(45*time.Second, "resume", 0, 4)
	add(45*time.Second, "resume", 0, 4)
	for s := 1; s <= 60; s++ {
		add(45*time.Second+time.Duration(s)*time.Second, "step", s, 4)
		add(45*time.Second+time.Duration(s)*time.Second, "step", s, 4)
	}
	add(2*time.Minute+10*time.Second, "stop", 60, 0)
	add(2*time.Minute+11*time.Second, "stop", 60, 0)
	add(2*time.Minute+30*time.Second, "resume", 60, 3)
	for s := 61; s <= 150; s++ {
		add(2*time.Minute+30*time.Second+time.Duration(s-60)*time.Second, "step", s, 3)
	}
	add(4*time.Minute+10*time.Second, "stop", 150, 0)
	add(5*time.Minute+40*time.Second, "resume", 150, 2)
	for s := 151; s <= 200; s++ {
		add(5*time.Minute+40*time.Second+time.Duration(s-150)*time.Second, "step", s, 2)
	}
	add(6*time.Minute+40*time.Second, "resume", 200, 4)
	for s := 201; s <= 330; s++ {
		add(6*time.Minute+40*time.Second+time.Duration(s-200)*time.Second, "step", s, 4)
	}
	add(9*time.Minute, "final", 330, 0)
	return logs
}

func TestFromStatus(t *testing.T) {
	tl := FromStatus(spotStory(), at(time.Hour))
	if !tl.Start.Equal(t0) || !tl.End.Equal(at(9*time.Minute)) || tl.Truncated {
		t.Errorf("Start, End, Truncated = %v, %v, %t", tl.Start, tl.End, tl.Truncated)
	}
	want := []Point{{t0, 0}, {at(40 * time.Second), 4}, {at(2*time.Minute + 20*time.Second), 3}, {at(4*time.Minute + 30*time.Second), 0},
		{at(5*time.Minute + 30*time.Second), 2}, {at(6*time.Minute + 30*time.Second), 4}}
	if diff := cmp.Diff(want, tl.Members); diff != "" {
		t.Errorf("members (-want +got):\n%s", diff)
	}
	if len(tl.Events) != 9 || tl.Events[1].Type != "Notice" {
		t.Errorf("events = %+v", tl.Events)
	}
	running := FromStatus(testutil.MakeElasticJob("j", "ns").Obj(), at(time.Minute))
	if running.Text(0) != "j: no timeline yet (the controller records joins, leaves, stops, suspends and resumes in status.timeline)\n" {
		t.Errorf("empty timeline: %q", running.Text(0))
	}
}

func TestFromStatusTruncated(t *testing.T) {
	j := testutil.MakeElasticJob("long", "ns").Obj()
	j.CreationTimestamp = metav1.NewTime(t0)
	for i := range 64 {
		j.Status.Timeline = append(j.Status.Timeline, entry(time.Hour+time.Duration(i)*time.Minute, "Join", int64(i), int32(2+i%2), "x"))
	}
	tl := FromStatus(j, at(3*time.Hour))
	if !tl.Truncated || !tl.Start.Equal(at(time.Hour)) {
		t.Errorf("Truncated %t, Start %v: want true, the oldest kept event", tl.Truncated, tl.Start)
	}
	if v, ok := valueAt(tl.Members, at(30*time.Minute)); ok {
		t.Errorf("members before the oldest kept event = %d, want unknown", v)
	}
}

func TestAddTraining(t *testing.T) {
	var tl Timeline
	tl.AddTraining(spotTraining())
	var types []string
	for _, e := range tl.Events {
		types = append(types, e.Type+": "+e.Message)
	}
	want := []string{
		"Trained: training started at step 0 with 4 ranks",
		"Stopped: ranks stopped at step 60",
		"Trained: training resumed at step 60 with 3 ranks",
		"Stopped: ranks stopped at step 150",
		"Trained: training resumed at step 150 with 2 ranks",
		"Trained: training resumed at step 200 with 4 ranks",
		"Finished: training finished after 330 steps",
	}
	if diff := cmp.Diff(want, types); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if got := tl.Steps[len(tl.Steps)-1].Value; got != 330 || len(tl.Steps) != 330 {
		t.Errorf("steps: %d points up to %d, want one per step up to 330", len(tl.Steps), got)
	}
	var worlds []int
	for _, p := range tl.World {
		worlds = append(worlds, p.Value)
	}
	if diff := cmp.Diff([]int{4, 0, 3, 0, 2, 4, 0}, worlds); diff != "" {
		t.Errorf("world sizes (-want +got):\n%s", diff)
	}
}

func TestTextGolden(t *testing.T) {
	story := FromStatus(spotStory(), at(time.Hour))
	withTraining := story
	withTraining.AddTraining(spotTraining())
	big := FromStatus(spotStory(), at(time.Hour))
	for i := range big.Members {
		big.Members[i].Value *= 8
	}
	cases := map[string]struct {
		tl    Timeline
		width int
	}{
		"text_status":   {story, 0},
		"text_training": {withTraining, 72},
		"text_scaled":   {big, 40},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			golden(t, name, tc.tl.Text(tc.width))
		})
	}
}
