package regional_test

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/testutil"
)

// TestUrgentTaskPreemptsBatchWork: a region full of batch tasks (two of
// priority 20, two of 10, max_attempts 1), then an urgent task (priority 90)
// that fits nowhere: it runs, having preempted the fewest tasks of the
// lowest priority (one of priority 10: it needs one task's room); the
// victim's attempt says it was preempted and by whom, and
// the victim runs again and completes (with max_attempts 1, a charged
// attempt would have failed the job instead). Submission to running is
// logged; its distribution is measured by `apiary loadtest preempt`, not
// here (the bound below only catches a reservation that waited for its
// 30 s deadline).
func TestUrgentTaskPreemptsBatchWork(t *testing.T) {
	getJobT := func(t *testing.T, c clients, id string) *apiaryv1.Job {
		t.Helper()
		j, err := getJob(c, id)
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	agents := []devcluster.AgentSpec{
		{ID: "a0", CPUMillis: 2000, MemoryMiB: 4096, MaxTasks: 8},
		{ID: "a1", CPUMillis: 2000, MemoryMiB: 4096, MaxTasks: 8},
	}
	_, r := cluster(t, devcluster.RegionSpec{Coordinators: 1, Agents: agents, NoLAN: true})
	c := dial(t, r)
	batch := submit(t, c, spec(t, `
name: batch
priority: 20
max_attempts: 1
tasks:
  - name: work
    count: 2
    command: sleep
    args: ["4"]
    resources: {cpu_millis: 1000, memory_mb: 64}
`))
	low := submit(t, c, spec(t, `
name: low
priority: 10
max_attempts: 1
tasks:
  - name: work
    count: 2
    command: sleep
    args: ["4"]
    resources: {cpu_millis: 1000, memory_mb: 64}
`))
	waitRunning(t, c, batch, 2)
	waitRunning(t, c, low, 2)
	start := time.Now()
	urgent := submit(t, c, spec(t, `
name: urgent
priority: 90
tasks:
  - name: now
    command: sleep
    args: ["1"]
    resources: {cpu_millis: 1000, memory_mb: 64}
`))
	var ran time.Duration
	testutil.Eventually(t, 20*time.Second, "the urgent task running", func() error {
		j, err := getJob(c, urgent)
		if err != nil {
			return err
		}
		if s := j.GetTasks()[0].GetState(); s != apiaryv1.TaskState_TASK_STATE_RUNNING && s != apiaryv1.TaskState_TASK_STATE_COMPLETE {
			return fmt.Errorf("urgent task %s (%s)", s, j.GetTasks()[0].GetUnplacedReason())
		}
		ran = time.Since(start)
		return nil
	})
	t.Logf("urgent task: submission to running %v", ran)
	if ran > 10*time.Second {
		t.Errorf("urgent task ran %v after submission: it waited for the reservation's deadline, not its victims", ran)
	}
	waitState(t, c, urgent, apiaryv1.JobState_JOB_STATE_COMPLETE, 30*time.Second)
	if j := waitState(t, c, batch, apiaryv1.JobState_JOB_STATE_COMPLETE, 60*time.Second); j.GetCounts().GetComplete() != 2 {
		t.Fatalf("batch job %v", j.GetCounts())
	}
	for _, tk := range getJobT(t, c, batch).GetTasks() {
		if len(tk.GetAttempts()) != 1 {
			t.Errorf("batch (priority 20) task %d has attempts %v: preempted although priority 10 tasks ran", tk.GetIndex(), tk.GetAttempts())
		}
	}
	j := waitState(t, c, low, apiaryv1.JobState_JOB_STATE_COMPLETE, 60*time.Second)
	victims := 0
	for _, tk := range j.GetTasks() {
		as := tk.GetAttempts()
		for i, a := range as {
			if a.GetOutcome() != "preempted" {
				continue
			}
			victims++
			if !strings.Contains(a.GetError(), "preempted by job "+urgent+" task 0 (priority 90, urgent)") {
				t.Errorf("victim %d attempt %d error %q, want it to name the urgent task", tk.GetIndex(), a.GetAttempt(), a.GetError())
			}
			if i != len(as)-2 || as[len(as)-1].GetOutcome() != "complete" {
				t.Errorf("victim %d's attempts %v: want the preempted one, then a complete one", tk.GetIndex(), as)
			}
		}
	}
	if victims != 1 {
		t.Fatalf("%d priority-10 tasks preempted, want 1 (the fewest that make room)", victims)
	}
}

// TestPreemptorWhoseNodeIsLostPreemptsElsewhere: the urgent task's
// reservation is on a node whose agent is then SIGKILLed before the victims
// report: the reservation ends with its node epoch, and the urgent task
// preempts again on the node left and runs there (the breaker's case: it
// used to wait behind the long batch work for good).
func TestPreemptorWhoseNodeIsLostPreemptsElsewhere(t *testing.T) {
	agents := []devcluster.AgentSpec{
		{ID: "a0", CPUMillis: 2000, MemoryMiB: 4096, MaxTasks: 8},
		{ID: "a1", CPUMillis: 2000, MemoryMiB: 4096, MaxTasks: 8},
	}
	// A 10 s node lease: the agents are paused for a few seconds below.
	_, r := cluster(t, devcluster.RegionSpec{Coordinators: 1, Agents: agents, NoLAN: true, ExtraArgs: []string{"--node-lease-ttl", "10s"}})
	c := dial(t, r)
	batch := submit(t, c, spec(t, `
name: batch
priority: batch
tasks:
  - name: work
    count: 4
    command: sleep
    args: ["300"]
    resources: {cpu_millis: 1000, memory_mb: 64}
`))
	waitRunning(t, c, batch, 4)
	t.Cleanup(func() { _, _ = c.jobs.CancelJob(callCtx(t), &apiaryv1.CancelJobRequest{JobId: batch}) })
	// SIGSTOP every agent first, so that the victims cannot report before
	// the node of the reservation is killed.
	for _, a := range agents {
		if err := r.Agent(a.ID).Pause(); err != nil {
			t.Fatal(err)
		}
	}
	urgent := submit(t, c, spec(t, `
name: urgent
priority: urgent
tasks:
  - name: now
    command: sleep
    args: ["1"]
    resources: {cpu_millis: 1000, memory_mb: 64}
`))
	var reserved string
	re := regexp.MustCompile(`on node (\S+); placed there`)
	testutil.Eventually(t, 20*time.Second, "the urgent task's reservation", func() error {
		j, err := getJob(c, urgent)
		if err != nil {
			return err
		}
		m := re.FindStringSubmatch(j.GetTasks()[0].GetUnplacedReason())
		if m == nil {
			return fmt.Errorf("reason %q", j.GetTasks()[0].GetUnplacedReason())
		}
		reserved = m[1]
		return nil
	})
	var other string
	for _, a := range agents {
		p := r.Agent(a.ID)
		if reserved == a.ID {
			if err := p.Kill(); err != nil {
				t.Fatal(err)
			}
			continue
		}
		other = a.ID
		if err := p.Resume(); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, 40*time.Second, "the urgent task running on the node left", func() error {
		j, err := getJob(c, urgent)
		if err != nil {
			return err
		}
		tk := j.GetTasks()[0]
		if s := tk.GetState(); s != apiaryv1.TaskState_TASK_STATE_RUNNING && s != apiaryv1.TaskState_TASK_STATE_COMPLETE {
			return fmt.Errorf("urgent task %s (%s)", s, tk.GetUnplacedReason())
		}
		if tk.GetNodeId() != other {
			return fmt.Errorf("urgent task on %s, want the node of agent %s", tk.GetNodeId(), other)
		}
		return nil
	})
}
