package regional_test

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/testutil"
)

// TestStartFailureFault runs real agents: a node whose work dir is broken
// fails to start every attempt it gets (a node fault), and its tasks are
// retried elsewhere without failing; a command missing everywhere (the job's
// fault) fails the job once it failed to start on two distinct nodes.
func TestStartFailureFault(t *testing.T) {
	cl, r := cluster(t, devcluster.RegionSpec{Agents: []devcluster.AgentSpec{
		{ID: "n1", CPUMillis: 1000}, {ID: "n2", CPUMillis: 1000},
	}})
	c := dial(t, r)
	if err := r.WaitNodes(t.Context(), 2); err != nil {
		t.Fatal(err)
	}

	// A missing command first: on a fresh region no node has a record yet,
	// so the job's fault is judged by its own rule alone.
	t.Run("MissingCommandFailsAfterTwoNodes", func(t *testing.T) {
		id := submit(t, c, spec(t, `
name: no-such-command
max_attempts: 5
tasks:
  - name: a
    command: /nonexistent/apiary-no-such-command
`))
		j := waitState(t, c, id, apiaryv1.JobState_JOB_STATE_FAILED, 60*time.Second)
		tasks := logs(t, c, id)
		if len(tasks) != 1 {
			t.Fatalf("%d tasks", len(tasks))
		}
		nodes := map[string]bool{}
		attempts := tasks[0].GetAttempts()
		for i, a := range attempts {
			// The first node's failure is unconfirmed (retried elsewhere,
			// not charged); the second node's confirms it: the job's fault.
			want := apiaryv1.FailureFault_FAILURE_FAULT_UNCONFIRMED
			if i == len(attempts)-1 {
				want = apiaryv1.FailureFault_FAILURE_FAULT_JOB
			}
			if a.GetFault() != want {
				t.Fatalf("attempt %d on %s: fault %s (error %q), want %s", a.GetAttempt(), a.GetNodeId(), a.GetFault(), a.GetError(), want)
			}
			nodes[a.GetNodeId()] = true
		}
		if len(nodes) != 2 || !strings.Contains(tasks[0].GetError(), "2 distinct nodes") {
			t.Fatalf("failed after attempts on %v with error %q; want a job fault on 2 distinct nodes", nodes, tasks[0].GetError())
		}
		if n := len(tasks[0].GetAttempts()); n > 3 {
			t.Fatalf("%d attempts before failing (max_attempts 5), want 2 or 3", n)
		}
		if j.GetCounts().GetFailed() != 1 {
			t.Fatalf("counts %v", j.GetCounts())
		}
	})
	t.Run("BrokenWorkDirIsNotTheJobsFault", func(t *testing.T) {
		if err := cl.BreakWorkDir("n1"); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := cl.RepairWorkDir("n1"); err != nil {
				t.Fatal(err)
			}
		}()
		id := submit(t, c, spec(t, `
name: bad-host
max_attempts: 1
tasks:
  - name: a
    count: 10
    command: sh
    args: ["-c", "sleep 0.2"]
    resources: {cpu_millis: 250}
`))
		j := waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 60*time.Second)
		if j.GetCounts().GetComplete() != 10 || j.GetCounts().GetFailed() != 0 {
			t.Fatalf("counts %v, want 10 complete, 0 failed", j.GetCounts())
		}
		nodeFaults := 0
		for _, tk := range logs(t, c, id) {
			onN1 := 0
			for _, a := range tk.GetAttempts() {
				if a.GetNodeId() == "n1" {
					// A retry avoids the node the task failed on while
					// another node could run it.
					if onN1++; onN1 > 1 {
						t.Fatalf("task %d was placed on n1 again after failing there: %v", tk.GetIndex(), tk.GetAttempts())
					}
				}
				switch {
				case a.GetOutcome() == "complete" && a.GetNodeId() != "n2":
					t.Fatalf("task %d completed on %s, whose work dir is broken", tk.GetIndex(), a.GetNodeId())
				case a.GetOutcome() == "complete":
				case a.GetNodeId() == "n1" && a.GetOutcome() == "retry" && a.GetFault() == apiaryv1.FailureFault_FAILURE_FAULT_NODE:
					nodeFaults++
				default:
					t.Fatalf("task %d attempt %d on %s: outcome %q fault %s error %q, want a node-fault retry on n1",
						tk.GetIndex(), a.GetAttempt(), a.GetNodeId(), a.GetOutcome(), a.GetFault(), a.GetError())
				}
			}
		}
		if nodeFaults == 0 {
			t.Fatal("no attempt was placed on n1: the test did not exercise a node fault")
		}
		t.Logf("%d node-fault start failures on n1 absorbed with max_attempts 1", nodeFaults)
		out, err := exec.Command(testutil.Binary(t), "job", "logs", id, "--addr", r.APIAddrs[0]).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "on n1: retry (node fault, not charged)") {
			t.Fatalf("apiary job logs does not show the node fault: %v\n%s", err, out)
		}
	})

}
