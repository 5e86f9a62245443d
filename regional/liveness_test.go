package regional_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/testutil"
)

// gatedJob is a job of n tasks whose attempts each write "start <attempt>"
// to <dir>/L.<index>, wait until <dir>/go exists (openGate), then write
// "done <attempt>": they run for as long as a test needs them to and end
// when it says so. extra is more top-level YAML (max_attempts is 1 unless
// extra sets it).
func gatedJob(dir string, n int, extra string) string {
	if !strings.Contains(extra, "max_attempts") {
		extra += "\nmax_attempts: 1"
	}
	return fmt.Sprintf(`
name: gated
%[3]s
tasks:
  - name: work
    count: %[2]d
    command: sh
    args: ["-c", "echo start $APIARY_ATTEMPT >> %[1]s/L.$APIARY_TASK_INDEX; while [ ! -e %[1]s/go ]; do sleep 0.05; done; echo done $APIARY_ATTEMPT >> %[1]s/L.$APIARY_TASK_INDEX"]
`, dir, n, extra)
}

// oneGatedTask starts a region of two agents (region flags args), waits
// for both nodes, submits a one-task gatedJob (extra YAML) and waits until
// attempt 1 runs; it returns the region, its clients, the job's dir and id,
// and the node running the task.
func oneGatedTask(t *testing.T, extra string, args ...string) (*devcluster.Region, clients, string, string, string) {
	t.Helper()
	_, r := cluster(t, devcluster.RegionSpec{Agents: twoAgents(), ExtraArgs: args})
	c := dial(t, r)
	if err := r.WaitNodes(t.Context(), 2); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	id := submit(t, c, spec(t, gatedJob(dir, 1, extra)))
	return r, c, dir, id, waitAttemptRunning(t, c, id, 0, 1, 30*time.Second).GetNodeId()
}

// openGate lets gatedJob's tasks finish.
func openGate(t *testing.T, dir string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// waitRunning waits until all n tasks of job id are RUNNING.
func waitRunning(t *testing.T, c clients, id string, n int) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, "all tasks running", func() error {
		j, err := getJob(c, id)
		if err != nil {
			return err
		}
		if got := j.GetCounts().GetRunning(); got != int32(n) {
			return fmt.Errorf("counts %v", j.GetCounts())
		}
		return nil
	})
}

// checkOnce asserts that each of the n gated tasks started and finished
// exactly once, on attempt 1, with one committed completion each.
func checkOnce(t *testing.T, c clients, id, dir string, n int) {
	t.Helper()
	j := waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 60*time.Second)
	for _, tk := range j.GetTasks() {
		if tk.GetAttempt() != 1 {
			t.Errorf("task %d ran %d attempts, want 1 (its work was killed or charged)", tk.GetIndex(), tk.GetAttempt())
		}
	}
	done := completions(logs(t, c, id))
	for i := 0; i < n; i++ {
		b, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("L.%d", i)))
		if string(b) != "start 1\ndone 1\n" {
			t.Errorf("task %d wrote %q, want one start and one done, by attempt 1", i, b)
		}
		if done[int32(i)] != 1 {
			t.Errorf("task %d has %d committed completions", i, done[int32(i)])
		}
	}
}

// TestRegionOutageKeepsRunningWork is issue 20's outage case: every
// coordinator of a region is SIGKILLed for 20 s while the agents run tasks
// (max_attempts: 1), then restarted. Before, the agents killed every task
// after one lease TTL and the jobs FAILED ("killed worker"); now no task is
// killed or charged and each completes once. The node leases lapse in the
// restarted etcd before the agents reconnect, so this also exercises
// re-registration and adoption under the new owner's failover grace.
func TestRegionOutageKeepsRunningWork(t *testing.T) {
	for _, members := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d_coordinators", members), func(t *testing.T) {
			t.Parallel()
			_, r := cluster(t, devcluster.RegionSpec{Coordinators: members, Agents: twoAgents()})
			c := dial(t, r)
			dir := t.TempDir()
			const n = 4
			id := submit(t, c, spec(t, gatedJob(dir, n, "")))
			waitRunning(t, c, id, n)
			t0 := time.Now()
			t.Logf("running at %s", t0)
			for _, p := range r.Coords {
				if err := p.Kill(); err != nil {
					t.Fatal(err)
				}
			}
			// The outage (its length is the fault, not a wait for a
			// condition).
			time.Sleep(20 * time.Second)
			for i := 0; i < n; i++ {
				if len(taskProcs(id, i, 1)) == 0 {
					t.Fatalf("task %d's process died during the outage", i)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if err := r.RestartCoordinators(ctx); err != nil {
				t.Fatal(err)
			}
			t.Logf("restarted after %s", time.Since(t0))
			// The region is back: the agents reconnect (their epochs were
			// kept, or adopted by new ones) and their tasks stay RUNNING.
			waitRunning(t, c, id, n)
			t.Logf("running again after %s", time.Since(t0))
			openGate(t, dir)
			checkOnce(t, c, id, dir, n)
			t.Logf("complete after %s", time.Since(t0))
		})
	}
}

// TestRegionOutageLongerThanLostAfter: the region is down longer than the
// job's lost_after: the agents kill the tasks at lost_after and, once the
// region is back, hand them back (LOST); they are requeued, not charged (the
// job has max_attempts: 1) and complete once each. Before, the killed
// attempts were never reported and their tasks stayed RUNNING forever on
// the surviving epoch.
func TestRegionOutageLongerThanLostAfter(t *testing.T) {
	t.Parallel()
	_, r := cluster(t, devcluster.RegionSpec{Agents: twoAgents()})
	c := dial(t, r)
	dir := t.TempDir()
	const n = 3
	id := submit(t, c, spec(t, gatedJob(dir, n, "disconnect: {lost_after: 3s}")))
	waitRunning(t, c, id, n)
	for _, p := range r.Coords {
		if err := p.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, 20*time.Second, "agents kill the tasks at lost_after", func() error {
		for i := 0; i < n; i++ {
			if ps := taskProcs(id, i, 1); len(ps) > 0 {
				return fmt.Errorf("task %d attempt 1 still runs: %v", i, ps)
			}
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := r.RestartCoordinators(ctx); err != nil {
		t.Fatal(err)
	}
	openGate(t, dir)
	j := waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 60*time.Second)
	done := completions(logs(t, c, id))
	for _, tk := range j.GetTasks() {
		i := int(tk.GetIndex())
		if tk.GetAttempt() != 2 || done[int32(i)] != 1 {
			t.Errorf("task %d: attempt %d, %d completions; want attempt 2, one completion", i, tk.GetAttempt(), done[int32(i)])
		}
		if o := attemptOutcome(t, c, id, i, 1); o != "lost" {
			t.Errorf("task %d attempt 1 outcome %q, want lost", i, o)
		}
		b, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("L.%d", i)))
		if string(b) != "start 1\nstart 2\ndone 2\n" {
			t.Errorf("task %d wrote %q, want two starts and one done, by attempt 2", i, b)
		}
	}
}

// taskProcs is attemptProcs for task index idx.
func taskProcs(id string, idx, attempt int) []int {
	return procsWithEnv("APIARY_JOB_ID="+id, fmt.Sprintf("APIARY_ATTEMPT=%d", attempt), fmt.Sprintf("APIARY_TASK_INDEX=%d", idx))
}

// nodeOf returns the node task idx of job id runs on.
func nodeOf(t *testing.T, c clients, id string, idx int) string {
	t.Helper()
	j, err := getJob(c, id)
	if err != nil {
		t.Fatal(err)
	}
	return j.GetTasks()[idx].GetNodeId()
}

// attemptOutcome returns the recorded outcome of attempt a of task idx.
func attemptOutcome(t *testing.T, c clients, id string, idx int, a int32) string {
	t.Helper()
	for _, tk := range logs(t, c, id) {
		if int(tk.GetIndex()) != idx {
			continue
		}
		for _, at := range tk.GetAttempts() {
			if at.GetAttempt() == a {
				return at.GetOutcome()
			}
		}
	}
	return ""
}

// waitAttemptRunning waits until task idx of job id runs attempt a
// (RUNNING) and returns the task.
func waitAttemptRunning(t *testing.T, c clients, id string, idx int, a int32, timeout time.Duration) *apiaryv1.Task {
	t.Helper()
	var tk *apiaryv1.Task
	testutil.Eventually(t, timeout, fmt.Sprintf("task %d attempt %d running", idx, a), func() error {
		j, err := getJob(c, id)
		if err != nil {
			return err
		}
		tk = j.GetTasks()[idx]
		if tk.GetAttempt() != a || tk.GetState() != apiaryv1.TaskState_TASK_STATE_RUNNING {
			return fmt.Errorf("task %d: attempt %d %s on %s", idx, tk.GetAttempt(), tk.GetState(), tk.GetNodeId())
		}
		return nil
	})
	return tk
}

// TestAgentPausedPastLease: an agent SIGSTOPped past its lease while the
// region is up. By default its task is replaced on the other node; when it
// wakes it learns its epoch ended, the new epoch refuses to adopt the
// replaced attempt, so it kills it and its result never counts. With
// disconnect.replace: false nothing is replaced within lost_after: the
// woken agent's new epoch adopts the attempt and its result counts.
func TestAgentPausedPastLease(t *testing.T) {
	t.Run("replaced", func(t *testing.T) {
		t.Parallel()
		// A node lost while the task ran alone on it is charged: give it a
		// second attempt.
		r, c, dir, id, victim := oneGatedTask(t, "max_attempts: 2")
		p := r.Agent(victim)
		if err := p.Pause(); err != nil {
			t.Fatal(err)
		}
		other := waitAttemptRunning(t, c, id, 0, 2, 30*time.Second).GetNodeId()
		if other == victim {
			t.Fatalf("attempt 2 placed on the paused node %s", victim)
		}
		if len(taskProcs(id, 0, 1)) == 0 {
			t.Fatal("attempt 1 died while its agent was paused; the test proves nothing")
		}
		if err := p.Resume(); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 20*time.Second, "stale attempt 1 killed after SIGCONT", func() error {
			if ps := taskProcs(id, 0, 1); len(ps) > 0 {
				return fmt.Errorf("attempt 1 still runs: %v", ps)
			}
			return nil
		})
		openGate(t, dir)
		j := waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 30*time.Second)
		if a := j.GetTasks()[0].GetAttempt(); a != 2 {
			t.Fatalf("completed by attempt %d, want 2", a)
		}
		if done := completions(logs(t, c, id)); done[0] != 1 {
			t.Fatalf("%d committed completions", done[0])
		}
		if o := attemptOutcome(t, c, id, 0, 1); o != "lost" {
			t.Fatalf("attempt 1 outcome %q, want lost", o)
		}
		b, _ := os.ReadFile(filepath.Join(dir, "L.0"))
		if strings.Count(string(b), "done") != 1 || !strings.Contains(string(b), "done 2") {
			t.Fatalf("L.0 = %q, want one done, by attempt 2 (the stale attempt must not finish)", b)
		}
	})
	t.Run("not_replaced", func(t *testing.T) {
		t.Parallel()
		r, c, dir, id, victim := oneGatedTask(t, "disconnect: {lost_after: 20s, replace: false}")
		pids := taskProcs(id, 0, 1)
		p := r.Agent(victim)
		if err := p.Pause(); err != nil {
			t.Fatal(err)
		}
		// Past the 1 s lease and the owner's failover grace: the node is lost,
		// and the task must stay where it is.
		testutil.Eventually(t, 30*time.Second, "paused node seen DOWN", func() error {
			if n := node(t, c, victim); n.GetStatus() != apiaryv1.NodeStatus_NODE_STATUS_DOWN {
				return fmt.Errorf("%s is %s", victim, n.GetStatus())
			}
			return nil
		})
		time.Sleep(3 * time.Second) // a reclaim would have happened by now
		j, err := getJob(c, id)
		if err != nil {
			t.Fatal(err)
		}
		if tk := j.GetTasks()[0]; tk.GetAttempt() != 1 || tk.GetNodeId() != victim {
			t.Fatalf("task replaced within lost_after: attempt %d on %s", tk.GetAttempt(), tk.GetNodeId())
		}
		if err := p.Resume(); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 20*time.Second, "node back with a new epoch", func() error {
			if n := node(t, c, victim); n.GetStatus() != apiaryv1.NodeStatus_NODE_STATUS_READY {
				return fmt.Errorf("%s is %s", victim, n.GetStatus())
			}
			return nil
		})
		openGate(t, dir)
		j = waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 30*time.Second)
		if tk := j.GetTasks()[0]; tk.GetAttempt() != 1 || tk.GetNodeId() != victim {
			t.Fatalf("completed by attempt %d on %s, want the original attempt 1 on %s", tk.GetAttempt(), tk.GetNodeId(), victim)
		}
		if still := taskProcs(id, 0, 1); len(pids) == 0 || len(still) != 0 {
			t.Fatalf("attempt 1 processes before %v, after completion %v", pids, still)
		}
		b, _ := os.ReadFile(filepath.Join(dir, "L.0"))
		if string(b) != "start 1\ndone 1\n" {
			t.Fatalf("L.0 = %q, want the one attempt's start and done", b)
		}
	})
}

// TestAgentSIGTERMHandsBackWork: a SIGTERMed agent drains: its running
// attempts are stopped and requeued at once (DRAINED), not charged (the
// job has max_attempts: 1 and still completes), and its lease is released
// so the node is DOWN without waiting for the lease.
func TestAgentSIGTERMHandsBackWork(t *testing.T) {
	r, c, dir, id, victim := oneGatedTask(t, "", "--failover-grace", "0s")
	p := r.Agent(victim)
	p.Stop(20 * time.Second)
	if p.Running() {
		t.Fatal("agent did not exit on SIGTERM")
	}
	if n := node(t, c, victim); n.GetStatus() != apiaryv1.NodeStatus_NODE_STATUS_DOWN {
		t.Fatalf("%s is %s after a clean stop, want DOWN (lease released)", victim, n.GetStatus())
	}
	waitAttemptRunning(t, c, id, 0, 2, 20*time.Second)
	if o := attemptOutcome(t, c, id, 0, 1); o != "drained" {
		t.Fatalf("attempt 1 outcome %q, want drained", o)
	}
	openGate(t, dir)
	waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 30*time.Second)
}

// TestOperatorDrain: `apiary node drain` stops new placements on the node,
// lets its attempt run until the deadline, then requeues it (DRAINED, not
// charged) on the other node; node list shows DRAINING; the drain survives
// the agent registering again; --cancel leaves the node ineligible until
// `node eligibility --enable`.
func TestOperatorDrain(t *testing.T) {
	r, c, dir, id, victim := oneGatedTask(t, "")
	addr := r.Addr()
	res := runApiary(t, "node", "drain", victim, "--deadline", "2s", "--addr", addr)
	if res.code != 0 || !strings.Contains(res.stdout, "draining: running attempts stop at") {
		t.Fatalf("node drain: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	drainedAt := time.Now()
	res = runApiary(t, "node", "list", "--addr", addr)
	if res.code != 0 || !regexp.MustCompile(`(?m)^\S+\s+`+victim+`\s+READY.*DRAINING until`).MatchString(res.stdout) {
		t.Fatalf("node list does not show %s draining: exit %d\n%s%s", victim, res.code, res.stdout, res.stderr)
	}
	other := waitAttemptRunning(t, c, id, 0, 2, 30*time.Second).GetNodeId()
	if other == victim || time.Since(drainedAt) < 2*time.Second {
		t.Fatalf("attempt 2 on %s %s after the drain (deadline 2s)", other, time.Since(drainedAt))
	}
	if o := attemptOutcome(t, c, id, 0, 1); o != "drained" {
		t.Fatalf("attempt 1 outcome %q, want drained", o)
	}
	// Nothing new lands on the drained node, even after it registers again.
	before := node(t, c, victim).GetEpoch()
	r.Agent(victim).Kill()
	if err := r.Agent(victim).Start(); err != nil {
		t.Fatal(err)
	}
	// Its new epoch (the old one stays READY until its lease lapses).
	if n := waitReady(t, c, victim, before); !n.GetDraining() {
		t.Fatalf("drained node back without its drain: %v", n)
	}
	res = runApiary(t, "node", "list", "--addr", addr)
	if !regexp.MustCompile(`(?m)^\S+\s+` + victim + `\s+READY.*DRAINED since`).MatchString(res.stdout) {
		t.Fatalf("node list does not show %s drained after the deadline:\n%s", victim, res.stdout)
	}
	res = runApiary(t, "node", "eligibility", victim, "--enable", "--addr", addr)
	if res.code != 2 || !strings.Contains(res.stderr, "is draining; end the drain first") {
		t.Fatalf("eligibility --enable while draining: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	res = runApiary(t, "node", "drain", victim, "--cancel", "--addr", addr)
	if res.code != 0 || !strings.Contains(res.stdout, "stays ineligible") {
		t.Fatalf("drain --cancel: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	if n := node(t, c, victim); n.GetDraining() || !n.GetIneligible() {
		t.Fatalf("after cancel: %v", n)
	}
	res = runApiary(t, "node", "eligibility", victim, "--addr", addr)
	if res.code != 2 || !strings.Contains(res.stderr, "--enable or --disable") {
		t.Fatalf("eligibility without a flag: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	res = runApiary(t, "node", "eligibility", victim, "--enable", "--addr", addr)
	if res.code != 0 || !strings.Contains(res.stdout, "is eligible") {
		t.Fatalf("eligibility --enable: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	openGate(t, dir)
	j := waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 30*time.Second)
	if done := completions(logs(t, c, id)); done[0] != 1 || j.GetTasks()[0].GetAttempt() != 2 {
		t.Fatalf("completions %v, attempt %d", done, j.GetTasks()[0].GetAttempt())
	}
}

// TestRepeatedStartedReportIsAccepted: an agent that retries its STARTED
// report (its first answer was lost: an RPC deadline during an etcd stall,
// or the coordinator's Txn retried after it committed) is told yes, not
// "stale": a refusal made the agent treat its attempt as stale and never
// report its end, and the task stayed RUNNING for good (issue 12's breaker).
// The repeat changes nothing, and the attempt completes once.
func TestRepeatedStartedReportIsAccepted(t *testing.T) {
	_, c, dir, id, _ := oneGatedTask(t, "")
	tk := waitAttemptRunning(t, c, id, 0, 1, 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.agent.ReportTaskStatus(ctx, &apiaryv1.ReportTaskStatusRequest{NodeId: tk.GetNodeId(), NodeEpoch: tk.GetNodeEpoch(),
		JobId: id, TaskIndex: 0, Attempt: 1, Kind: apiaryv1.ReportKind_REPORT_KIND_STARTED})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.GetAccepted() {
		t.Fatalf("a repeated STARTED of the running attempt was refused: %q", resp.GetReason())
	}
	again := waitAttemptRunning(t, c, id, 0, 1, 5*time.Second)
	if again.GetAttempt() != 1 || again.GetNodeEpoch() != tk.GetNodeEpoch() || again.GetFencingToken() != tk.GetFencingToken() {
		t.Fatalf("the repeat changed the task: %v -> %v", tk, again)
	}
	openGate(t, dir)
	checkOnce(t, c, id, dir, 1)
}
