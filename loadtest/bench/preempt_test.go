package bench

import (
	"slices"
	"strings"
	"testing"
	"time"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/regional/taskstate"
)

func TestPreemptOrderAlternates(t *testing.T) {
	got := preemptOrder(3)
	want := []string{PreemptFull, PreemptFree, PreemptFree, PreemptFull, PreemptFull, PreemptFree}
	if !slices.Equal(got, want) {
		t.Fatalf("preemptOrder(3) = %v, want %v", got, want)
	}
	got = localityOrder(2)
	if want := []string{LocalityOn, LocalityOff, LocalityOff, LocalityOn}; !slices.Equal(got, want) {
		t.Fatalf("localityOrder(2) = %v, want %v", got, want)
	}
	if localityWeight(LocalityOff) != "-1" || localityWeight(LocalityOn) != "1" {
		t.Fatalf("locality weights: on %s, off %s", localityWeight(LocalityOn), localityWeight(LocalityOff))
	}
}

func TestPreemptSlots(t *testing.T) {
	o := DefaultPreempt
	if got := o.Slots(); got != 12 {
		t.Fatalf("default slots = %d, want 12 (3 agents x 1000 m / 250 m)", got)
	}
	o.TaskMemoryMiB = 512 // memory binds: 2 per agent
	if got := o.Slots(); got != 6 {
		t.Fatalf("slots with 512 MiB tasks = %d, want 6", got)
	}
}

func TestTaskWatchObserve(t *testing.T) {
	tw := newTaskWatch()
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	run := apiaryv1.TaskState_TASK_STATE_RUNNING
	pend := apiaryv1.TaskState_TASK_STATE_PENDING
	for i := int32(0); i < 3; i++ {
		tw.observe(taskstate.Task{JobID: "b", Index: i, State: run}, at(int(i)))
	}
	tw.observe(taskstate.Task{JobID: "u", Index: 0, State: pend}, at(10))
	// Task 1 is marked (still RUNNING), then requeued; task 2 is pending
	// again without a mark (not a preemption).
	tw.observe(taskstate.Task{JobID: "b", Index: 1, State: run, PreemptedBy: "job u task 0"}, at(20))
	tw.observe(taskstate.Task{JobID: "b", Index: 2, State: pend}, at(25))
	tw.observe(taskstate.Task{JobID: "b", Index: 1, State: pend}, at(30))
	tw.observe(taskstate.Task{JobID: "b", Index: 1, State: pend, PreemptedBy: "again"}, at(35))
	tw.observe(taskstate.Task{JobID: "u", Index: 0, State: run}, at(40))
	tw.observe(taskstate.Task{JobID: "u", Index: 0, State: run}, at(50))

	if n := tw.count("b", run); n != 1 {
		t.Errorf("b RUNNING = %d, want 1", n)
	}
	if n := tw.count("b", run, pend); n != 3 {
		t.Errorf("b RUNNING or PENDING = %d, want 3", n)
	}
	if got, ok := tw.firstIn("u", 0, run); !ok || !got.Equal(at(40)) {
		t.Errorf("u first RUNNING = %v %v, want %v", got, ok, at(40))
	}
	if _, ok := tw.firstIn("u", 0, apiaryv1.TaskState_TASK_STATE_ASSIGNED); ok {
		t.Errorf("u seen ASSIGNED, never was")
	}
	marked, mark, req := tw.preemption("b")
	if marked != 1 || !mark.Equal(at(20)) || !req.Equal(at(30)) {
		t.Errorf("preemption(b) = %d %v %v, want 1 %v %v", marked, mark, req, at(20), at(30))
	}
	if marked, mark, req := tw.preemption("u"); marked != 0 || !mark.IsZero() || !req.IsZero() {
		t.Errorf("preemption(u) = %d %v %v, want none", marked, mark, req)
	}
	if sinceMs(t0, time.Time{}) != 0 || sinceMs(t0, at(40)) != 40 {
		t.Errorf("sinceMs: %v %v", sinceMs(t0, time.Time{}), sinceMs(t0, at(40)))
	}
}

func TestCountPreempted(t *testing.T) {
	tasks := []*apiaryv1.Task{
		{Attempts: []*apiaryv1.AttemptResult{{Outcome: taskstate.OutcomePreempted}, {Outcome: "cancelled"}}},
		{Attempts: []*apiaryv1.AttemptResult{{Outcome: "cancelled"}}},
		{},
		{Attempts: []*apiaryv1.AttemptResult{{Outcome: "preempted"}, {Outcome: "preempted"}}},
	}
	if n := countPreempted(tasks); n != 3 {
		t.Fatalf("countPreempted = %d, want 3", n)
	}
}

func TestSummarizePreemptRatio(t *testing.T) {
	var trials []PreemptTrial
	for i := 1; i <= 4; i++ {
		trials = append(trials,
			PreemptTrial{Coordinators: 1, Mode: PreemptFull, Trial: i, RunningMs: float64(200 + 10*i), Victims: 1, Marked: 1, MarkedMs: 5},
			PreemptTrial{Coordinators: 1, Mode: PreemptFree, Trial: i, RunningMs: float64(100 + 10*i)})
	}
	trials = append(trials, PreemptTrial{Coordinators: 1, Mode: PreemptFull, Trial: 5, RunningMs: 9999, Err: "timed out"})
	sums := SummarizePreempt(trials, []int{1, 3})
	if len(sums) != 2 {
		t.Fatalf("got %d summaries, want 2 (no trial of 3 coordinators): %+v", len(sums), sums)
	}
	full, free := sums[0], sums[1]
	if full.Mode != PreemptFull || full.N != 4 || full.Errors != 1 || full.Preempting != 4 || full.Running.P50 != 220 || full.Running.Max != 240 {
		t.Errorf("full summary %+v", full)
	}
	if free.Mode != PreemptFree || free.N != 4 || free.Preempting != 0 || free.Running.P50 != 120 {
		t.Errorf("free summary %+v", free)
	}
	md := PreemptMarkdown(DefaultPreempt, sums)
	if !strings.Contains(md, "| 1 | full | 4 (+1 unfinished) | 220 / 240 / 240 | 1.83 / 1.71 / 1.71 |") {
		t.Errorf("markdown lacks the full row with its ratio to free:\n%s", md)
	}
}
