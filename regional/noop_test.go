package regional_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
)

// TestNoopExecutorRunsJobWithoutProcesses: two agents started with
// `--executor noop` complete a 200-task job whose command does not exist,
// each task in one attempt, through the region's real placement, dispatch,
// reports and fencing; no attempt's work dir (nor any job dir) is created,
// so no process ran.
func TestNoopExecutorRunsJobWithoutProcesses(t *testing.T) {
	agents := twoAgents()
	for i := range agents {
		agents[i].ExtraArgs = []string{"--executor", "noop"}
	}
	_, r := cluster(t, devcluster.RegionSpec{Agents: agents})
	c := dial(t, r)
	id := submit(t, c, spec(t, `
name: noop-fanout
max_attempts: 1
tasks:
  - name: shard
    count: 200
    command: /nonexistent/apiary-noop-probe
    resources:
      cpu_millis: 100
      memory_mb: 32
`))
	j := waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 40*time.Second)
	if j.GetCounts().GetComplete() != 200 {
		t.Fatalf("counts %v", j.GetCounts())
	}
	tasks := logs(t, c, id)
	if len(tasks) != 200 {
		t.Fatalf("%d tasks in logs", len(tasks))
	}
	nodes := map[string]int{}
	for _, tk := range tasks {
		if tk.GetState() != apiaryv1.TaskState_TASK_STATE_COMPLETE || len(tk.GetAttempts()) != 1 {
			t.Fatalf("task %d: %s with %d attempts, want COMPLETE with 1", tk.GetIndex(), tk.GetState(), len(tk.GetAttempts()))
		}
		a := tk.GetAttempts()[0]
		if a.GetExitCode() != 0 || a.GetStdoutTail() != "" || a.GetFencingToken() <= 0 {
			t.Fatalf("task %d: attempt %v", tk.GetIndex(), a)
		}
		nodes[a.GetNodeId()]++
	}
	for _, p := range r.Agents {
		dataDir := filepath.Join(filepath.Dir(p.LogPath), p.Name) // devcluster: <Dir>/<node id>
		if _, err := os.Stat(dataDir); err != nil {
			t.Fatalf("agent %s: data dir %s: %v", p.Name, dataDir, err)
		}
		if _, err := os.Stat(filepath.Join(dataDir, "work", id)); !os.IsNotExist(err) {
			t.Fatalf("agent %s: the job's work dir exists (%v): a process was set up", p.Name, err)
		}
		if b, _ := os.ReadFile(p.LogPath); len(b) == 0 {
			t.Fatalf("agent %s: empty log", p.Name)
		}
	}
	t.Logf("tasks per node: %v", nodes)
}
