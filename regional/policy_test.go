package regional_test

import (
	"testing"
	"time"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
)

// TestRegionDefaultScheduler: a job without `scheduler` is placed by the
// region's --scheduler (here spread: its two tasks land on the two idle
// nodes), and a job's own `scheduler` overrides it (binpack: both on one);
// Job.scheduler says which applied.
func TestRegionDefaultScheduler(t *testing.T) {
	_, r := cluster(t, devcluster.RegionSpec{Agents: twoAgents(), ExtraArgs: []string{"--scheduler", "spread"}})
	c := dial(t, r)
	for _, tc := range []struct {
		field string
		nodes int
	}{{"", 2}, {"scheduler: binpack", 1}, {"scheduler: spread", 2}} {
		id := submit(t, c, spec(t, `
name: pair
`+tc.field+`
tasks:
  - name: t
    count: 2
    command: sh
    args: ["-c", "sleep 0.2"]
    resources: {cpu_millis: 100, memory_mb: 64}
`))
		j := waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 30*time.Second)
		want := "spread"
		if tc.field == "scheduler: binpack" {
			want = "binpack"
		}
		if j.GetScheduler() != want {
			t.Errorf("job with %q: Job.scheduler %q, want %q", tc.field, j.GetScheduler(), want)
		}
		nodes := map[string]bool{}
		for _, tk := range logs(t, c, id) {
			nodes[tk.GetNodeId()] = true
		}
		if len(nodes) != tc.nodes {
			t.Errorf("job with %q in a --scheduler spread region: tasks on %v, want %d node(s)", tc.field, nodes, tc.nodes)
		}
	}
}
