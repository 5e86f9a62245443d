package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

func pendingJob(reason string, pending, running int32) *apiaryv1.Job {
	j := &apiaryv1.Job{Id: "eu-west-01", State: apiaryv1.JobState_JOB_STATE_PENDING,
		Counts: &apiaryv1.TaskCounts{Pending: pending, Running: running}}
	for i := int32(0); i < pending; i++ {
		j.Tasks = append(j.Tasks, &apiaryv1.Task{Index: i, State: apiaryv1.TaskState_TASK_STATE_PENDING, UnplacedReason: reason})
	}
	for i := int32(0); i < running; i++ {
		j.Tasks = append(j.Tasks, &apiaryv1.Task{Index: pending + i, State: apiaryv1.TaskState_TASK_STATE_RUNNING})
	}
	if pending == 0 {
		j.State = apiaryv1.JobState_JOB_STATE_RUNNING
	}
	return j
}

// The wait prints why tasks wait when the reason appears, then at most every
// waitReminder, and a reminder only while tasks are pending.
func TestWaitProgressRateLimit(t *testing.T) {
	var b bytes.Buffer
	t0 := time.Unix(1000, 0)
	p := &waitProgress{w: &b, start: t0}
	lines := func() []string { return strings.Split(strings.TrimSpace(b.String()), "\n") }
	at := func(d time.Duration) time.Time { return t0.Add(d) }

	p.seen(pendingJob("", 1, 0), at(0))
	p.seen(pendingJob("constraint zone = [mars]: 2 nodes", 1, 0), at(100*time.Millisecond))
	if l := lines(); len(l) != 2 || !strings.HasSuffix(l[1], "; waiting: constraint zone = [mars]: 2 nodes") {
		t.Fatalf("the first reason is printed at once:\n%s", b.String())
	}
	// A changed reason within waitReminder waits; the same state again is not repeated.
	p.seen(pendingJob("constraint zone = [mars]: 3 nodes", 1, 0), at(2*time.Second))
	p.seen(pendingJob("constraint zone = [mars]: 3 nodes", 1, 0), at(3*time.Second))
	p.tick(at(5 * time.Second))
	if n := len(lines()); n != 2 {
		t.Fatalf("printed within %v:\n%s", waitReminder, b.String())
	}
	p.tick(at(10200 * time.Millisecond))
	if l := lines(); len(l) != 3 || !strings.Contains(l[2], "waiting: constraint zone = [mars]: 3 nodes [still waiting after 10s]") {
		t.Fatalf("no reminder with the current reason after %v:\n%s", waitReminder, b.String())
	}
	p.tick(at(15 * time.Second))
	p.tick(at(20 * time.Second))
	if n := len(lines()); n != 3 {
		t.Fatalf("reminders closer than %v:\n%s", waitReminder, b.String())
	}
	p.tick(at(20300 * time.Millisecond))
	if n := len(lines()); n != 4 {
		t.Fatalf("no second reminder:\n%s", b.String())
	}
	// A change of counts is printed at once.
	p.seen(pendingJob("constraint zone = [mars]: 3 nodes", 1, 1), at(21*time.Second))
	if l := lines(); len(l) != 5 || !strings.Contains(l[4], "1 running, 1 pending") {
		t.Fatalf("a count change was not printed:\n%s", b.String())
	}
	// Nothing pending: no reminder.
	p.seen(pendingJob("", 0, 2), at(22*time.Second))
	n := len(lines())
	p.tick(at(60 * time.Second))
	if len(lines()) != n {
		t.Fatalf("reminder with nothing pending:\n%s", b.String())
	}
	// JSON output prints nothing but keeps the last state.
	q := &waitProgress{start: t0}
	q.seen(pendingJob("cpu: 1 node", 1, 0), at(0))
	q.tick(at(time.Minute))
	if q.lastJob() == nil {
		t.Fatal("last job not kept")
	}
}

func TestPendingReasonGPUModelHint(t *testing.T) {
	j := pendingJob("gpu model: 2 nodes", 1, 0)
	if r := pendingReason(j); !strings.Contains(r, "case included") || !strings.Contains(r, "apiary node list") {
		t.Fatalf("no case hint: %q", r)
	}
	var b bytes.Buffer
	printJob(&b, j)
	if !strings.Contains(b.String(), "note: gpu_models must equal") {
		t.Fatalf("job status has no hint:\n%s", b.String())
	}
	if r := pendingReason(pendingJob("cpu: 2 nodes", 1, 0)); strings.Contains(r, "gpu_models") {
		t.Fatalf("hint without a gpu model reason: %q", r)
	}
}
