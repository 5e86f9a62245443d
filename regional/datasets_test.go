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
