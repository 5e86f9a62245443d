package regional_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/testutil"
)

// TestDatasetsReportedAndPlacedLocally: an agent's --dataset-dir is reported
// to the region (ListNodes), and a job whose task group lists the dataset
// (without size_bytes) runs where it is, with APIARY_DATASET_<NAME> set to
// the local copy, although `scheduler: spread` would spread its tasks over
// the three nodes; a dataset created on another node later is found by the
// rescan, reported by a heartbeat, and draws the next job there.
func TestDatasetsReportedAndPlacedLocally(t *testing.T) {
	dirs := map[string]string{"a1": t.TempDir(), "a2": t.TempDir(), "a3": t.TempDir()}
	if err := os.MkdirAll(filepath.Join(dirs["a1"], "inputs-a"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dirs["a1"], "inputs-a", "part-0"), make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	var agents []devcluster.AgentSpec
	for _, id := range []string{"a1", "a2", "a3"} {
		agents = append(agents, devcluster.AgentSpec{ID: id, CPUMillis: 4000, MemoryMiB: 4096,
			ExtraArgs: []string{"--dataset-dir", dirs[id], "--dataset-rescan", "200ms"}})
	}
	_, r := cluster(t, devcluster.RegionSpec{Agents: agents, NoLAN: true})
	c := dial(t, r)

	holders := func(name string) map[string]int64 {
		t.Helper()
		resp, err := c.admin.ListNodes(callCtx(t), &apiaryv1.ListNodesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int64{}
		for _, n := range resp.GetNodes() {
			for _, d := range n.GetDatasets() {
				if d.GetName() == name {
					out[n.GetId()] = d.GetSizeBytes()
				}
			}
		}
		return out
	}
	if h := holders("inputs-a"); len(h) != 1 || h["a1"] != 1<<20 {
		t.Fatalf("holders of inputs-a: %v, want a1 with 1 MiB (reported at registration)", h)
	}

	// run submits a 3-task spread job reading dataset name and returns each
	// task's node and output.
	run := func(name string) ([]string, []string) {
		t.Helper()
		id := submit(t, c, spec(t, fmt.Sprintf(`
name: reads-%[1]s
scheduler: spread
tasks:
  - name: read
    count: 3
    command: sh
    args: ["-c", "echo \"path=$APIARY_DATASET_%[2]s\"; ls \"$APIARY_DATASET_%[2]s\""]
    resources: {cpu_millis: 1000, memory_mb: 64}
    datasets: [{name: %[1]s}]
`, name, strings.ToUpper(strings.ReplaceAll(name, "-", "_")))))
		waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 60*time.Second)
		var nodes, outs []string
		for _, tk := range logs(t, c, id) {
			a := tk.GetAttempts()[len(tk.GetAttempts())-1]
			nodes = append(nodes, a.GetNodeId())
			outs = append(outs, a.GetStdoutTail())
		}
		return nodes, outs
	}
	nodes, outs := run("inputs-a")
	for i, n := range nodes {
		want := "path=" + filepath.Join(dirs["a1"], "inputs-a") + "\npart-0"
		if n != "a1" || !strings.Contains(outs[i], want) {
			t.Fatalf("task %d ran on %s with output %q; want a1 (holds inputs-a) and %q", i, n, outs[i], want)
		}
	}

	// A dataset that appears on a2 while the agent runs.
	if err := os.MkdirAll(filepath.Join(dirs["a2"], "inputs-b"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dirs["a2"], "inputs-b", "x"), make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "inputs-b reported by a2", func() error {
		if h := holders("inputs-b"); h["a2"] != 4096 {
			return fmt.Errorf("holders %v", h)
		}
		return nil
	})
	nodes, outs = run("inputs-b")
	for i, n := range nodes {
		if n != "a2" || !strings.Contains(outs[i], "path="+filepath.Join(dirs["a2"], "inputs-b")) {
			t.Fatalf("task %d of the inputs-b job ran on %s with output %q; want a2 with the path", i, n, outs[i])
		}
	}
	if err := os.RemoveAll(filepath.Join(dirs["a2"], "inputs-b")); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "inputs-b gone from a2", func() error {
		if h := holders("inputs-b"); len(h) != 0 {
			return fmt.Errorf("holders %v", h)
		}
		return nil
	})
}

// TestTwoStageJobRunsWhereItsInputIs: stage 2 of a job (after: [stage 1])
// waits, PENDING with the reason, until stage 1 completes; stage 1's output
// (written under $APIARY_OUTPUT_DIR) is recorded for its node with the
// completion, and stage 2 (`datasets: [its output]`, scheduler spread)
// runs on that node with APIARY_DATASET_<NAME> pointing at it (fetch_bytes
// 0). With that node gone, a reader runs elsewhere with the fetch hint (the
// bytes it moves). A stage after a failed one fails without running.
func TestTwoStageJobRunsWhereItsInputIs(t *testing.T) {
	var agents []devcluster.AgentSpec
	for _, id := range []string{"a1", "a2", "a3"} {
		agents = append(agents, devcluster.AgentSpec{ID: id, CPUMillis: 4000, MemoryMiB: 4096})
	}
	_, r := cluster(t, devcluster.RegionSpec{Agents: agents, NoLAN: true})
	c := dial(t, r)
	id := submit(t, c, spec(t, `
name: two-stage
scheduler: spread
tasks:
  - name: extract
    command: sh
    args: ["-c", "sleep 5; mkdir -p $APIARY_OUTPUT_DIR/table && head -c 50000 /dev/zero > $APIARY_OUTPUT_DIR/table/part-0"]
    outputs: [table]
  - name: load
    after: [extract]
    count: 2
    command: sh
    args: ["-c", "echo \"node=$APIARY_NODE_ID input=$APIARY_DATASET_TABLE\"; wc -c < $APIARY_DATASET_TABLE/part-0"]
    datasets: [{name: table}]
`))
	// While extract runs (5 s), load waits with the reason (written after
	// 2 s of waiting).
	testutil.Eventually(t, 20*time.Second, "load waiting with the after reason", func() error {
		j, err := getJob(c, id)
		if err != nil {
			return err
		}
		if st := j.GetTasks()[0].GetState(); st == apiaryv1.TaskState_TASK_STATE_COMPLETE {
			t.Fatalf("extract completed before load's waiting reason was seen: %v", j.GetTasks())
		}
		if tk := j.GetTasks()[1]; tk.GetState() != apiaryv1.TaskState_TASK_STATE_PENDING ||
			!strings.Contains(tk.GetUnplacedReason(), "task group extract must complete first") {
			return fmt.Errorf("load task 1: %s, reason %q", tk.GetState(), tk.GetUnplacedReason())
		}
		return nil
	})
	waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 60*time.Second)
	tasks := logs(t, c, id)
	var extractNode string
	var extractEnd int64
	for _, tk := range tasks {
		a := tk.GetAttempts()[len(tk.GetAttempts())-1]
		if tk.GetIndex() == 0 {
			extractNode, extractEnd = a.GetNodeId(), a.GetEndTimeMs()
			continue
		}
		if a.GetStartTimeMs() < extractEnd {
			t.Fatalf("load task %d started at %d, before extract ended at %d", tk.GetIndex(), a.GetStartTimeMs(), extractEnd)
		}
		if a.GetNodeId() != extractNode || !strings.Contains(a.GetStdoutTail(), "node="+extractNode+" input=/") ||
			!strings.Contains(a.GetStdoutTail(), "50000") {
			t.Fatalf("load task %d ran on %s with output %q; want %s (where extract wrote table) reading its 50000 bytes",
				tk.GetIndex(), a.GetNodeId(), a.GetStdoutTail(), extractNode)
		}
	}
	resp, err := c.admin.ListNodes(callCtx(t), &apiaryv1.ListNodesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range resp.GetNodes() {
		for _, d := range n.GetDatasets() {
			if d.GetName() == "table" && (n.GetId() != extractNode || d.GetSizeBytes() != 50000) {
				t.Fatalf("node %s holds table (%d bytes); want only %s with 50000", n.GetId(), d.GetSizeBytes(), extractNode)
			}
		}
	}
	for _, tk := range waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, time.Second).GetTasks() {
		if tk.GetFetchBytes() != 0 {
			t.Fatalf("task %d ran where its data is but has fetch_bytes %d", tk.GetIndex(), tk.GetFetchBytes())
		}
	}

	// With the node that holds table gone, a reader runs elsewhere and says
	// what it fetches (the size known from the lost node's record).
	if err := r.Agent(extractNode).Kill(); err != nil {
		t.Fatal(err)
	}
	away := submit(t, c, spec(t, `
name: reads-away
tasks:
  - name: read
    command: "true"
    datasets: [{name: table}]
`))
	tk := waitState(t, c, away, apiaryv1.JobState_JOB_STATE_COMPLETE, 60*time.Second).GetTasks()[0]
	if tk.GetNodeId() == extractNode || tk.GetFetchBytes() != 50000 {
		t.Fatalf("reader with %s gone: ran on %s, fetch_bytes %d; want another node and 50000", extractNode, tk.GetNodeId(), tk.GetFetchBytes())
	}

	failed := submit(t, c, spec(t, `
name: broken-first-stage
max_attempts: 1
tasks:
  - name: extract
    command: "false"
  - name: load
    after: [extract]
    command: "true"
`))
	j := waitState(t, c, failed, apiaryv1.JobState_JOB_STATE_FAILED, 30*time.Second)
	if tk := j.GetTasks()[1]; tk.GetState() != apiaryv1.TaskState_TASK_STATE_FAILED || tk.GetAttempt() != 0 {
		t.Fatalf("load after a failed extract: %s, attempt %d; want FAILED without running", tk.GetState(), tk.GetAttempt())
	}
}
