package bench

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestCountBadAttempts(t *testing.T) {
	attempts := []BadNodeAttempt{
		{Node: "a", AssignedRev: 10},
		{Node: "bad", AssignedRev: 11},
		{Node: "bad", AssignedRev: 19},
		{Node: "bad", AssignedRev: 20}, // the quarantine's own revision: not before
		{Node: "bad", AssignedRev: 25},
		{Node: "bad"}, // not seen by the watch: counted as before
		{Node: "b", AssignedRev: 30},
	}
	for _, tc := range []struct {
		name               string
		bad                string
		rev                int64
		before, total, all int
	}{
		{"quarantined at 20", "bad", 20, 3, 5, 7},
		{"never quarantined", "bad", 0, 5, 5, 7},
		{"control", "", 0, 0, 0, 7},
	} {
		before, total, all := countBadAttempts(attempts, tc.bad, tc.rev)
		if before != tc.before || total != tc.total || all != tc.all {
			t.Errorf("%s: got before %d total %d all %d, want %d %d %d", tc.name, before, total, all, tc.before, tc.total, tc.all)
		}
	}
}

func TestHealthNode(t *testing.T) {
	for key, want := range map[string]string{
		"/apiary/nodes/agent-1/health": "agent-1",
		"/apiary/nodes/agent-1":        "",
		"/apiary/nodes/agent-1/alive":  "",
		"/apiary/nodes//health":        "",
		"/apiary/nodes/a/b/health":     "",
		"/apiary/tasks/x/health":       "",
	} {
		if got := healthNode(key); got != want {
			t.Errorf("healthNode(%q) = %q, want %q", key, got, want)
		}
	}
}

func TestSummarizeBadNode(t *testing.T) {
	trials := []BadNodeTrial{
		{Setup: BadNodeControl, Jobs: 3, Tasks: 60, WallMs: 2000, AttemptsTotal: 60},
		{Setup: BadNodeControl, Jobs: 3, Tasks: 60, WallMs: 3000, AttemptsTotal: 60},
		{Setup: BadNodeControl, Jobs: 3, Tasks: 60, WallMs: 2500, AttemptsTotal: 60},
		{Setup: BadNodeExit1, BadNode: "n1", Jobs: 3, Tasks: 60, WallMs: 2600, Quarantined: true, TimeToQuarantineMs: 400,
			QuarantinedNodes: []string{"n1"}, AttemptsOnBadBefore: 12, AttemptsOnBadTotal: 13, AttemptsTotal: 73},
		{Setup: BadNodeExit1, BadNode: "n2", Jobs: 3, Tasks: 60, WallMs: 3200, FailedTasks: 2, FailedJobs: 1,
			QuarantinedNodes: []string{"n3"}, AttemptsOnBadBefore: 30, AttemptsOnBadTotal: 30, AttemptsTotal: 95},
		{Setup: BadNodeExit1, BadNode: "n3", Jobs: 3, Tasks: 60, WallMs: 2900, Quarantined: true, TimeToQuarantineMs: 900,
			QuarantinedNodes: []string{"n3"}, AttemptsOnBadBefore: 20, AttemptsOnBadTotal: 20, AttemptsTotal: 80},
		{Setup: BadNodeExit1, BadNode: "n4", Err: "timed out", WallMs: 99999},
	}
	sums := SummarizeBadNode(trials, BadNodeSetups)
	if len(sums) != 2 || sums[0].Setup != BadNodeControl || sums[1].Setup != BadNodeExit1 {
		t.Fatalf("setups %+v, want control and exit1 only, in that order", sums)
	}
	c, b := sums[0], sums[1]
	if c.N != 3 || c.Wall.P50 != 2500 || c.Ratio != 1 || c.Quarantined != 0 || len(c.Misses()) != 0 {
		t.Errorf("control: %+v misses %v", c, c.Misses())
	}
	if b.N != 3 || b.Errors != 1 || b.FailedTasks != 2 || b.Tasks != 180 || b.FailedJobs != 1 || b.Jobs != 9 {
		t.Errorf("exit1 counts: %+v", b)
	}
	if b.Quarantined != 2 || b.FalsePositives != 1 {
		t.Errorf("exit1 quarantined %d false positives %d, want 2 and 1", b.Quarantined, b.FalsePositives)
	}
	// Before and time to quarantine over the quarantined trials only; the
	// unfinished trial's wall does not count.
	if b.Before.N != 2 || b.Before.Max != 20 || b.TimeToQuarantine.P50 != 400 || b.TimeToQuarantine.Max != 900 {
		t.Errorf("exit1 before %v, time to quarantine %v", b.Before, b.TimeToQuarantine)
	}
	if b.OnBad.N != 3 || b.OnBad.Max != 30 || b.Wall.Max != 3200 || b.Wall.P50 != 2900 {
		t.Errorf("exit1 on bad %v, wall %v", b.OnBad, b.Wall)
	}
	if want := 2900.0 / 2500; b.Ratio != want {
		t.Errorf("ratio %v, want %v", b.Ratio, want)
	}
	misses := strings.Join(b.Misses(), "; ")
	for _, want := range []string{"1 trial(s) did not finish", "2 task(s) and 1 job(s) failed", "quarantined in 2 of 3 trials", "healthy node was quarantined in 1"} {
		if !strings.Contains(misses, want) {
			t.Errorf("misses %q lack %q", misses, want)
		}
	}
	if strings.Contains(misses, "wall p50") {
		t.Errorf("ratio %.2f <= %.2f reported as a miss: %q", b.Ratio, MaxWallRatio, misses)
	}
	slow := BadNodeSummary{Setup: BadNodeWorkDir, N: 5, Quarantined: 5, Ratio: 1.21}
	if m := slow.Misses(); len(m) != 1 || !strings.Contains(m[0], "1.21") {
		t.Errorf("a ratio of 1.21 misses %v, want the wall time alone", m)
	}
	md := BadNodeMarkdown(DefaultBadNode, sums, Summarize([]float64{2100}))
	for _, want := range []string{"| healthy (control) | 3 | 0/180 | 0/9 | - |", "| every task exits 1 | 3 (+1 unfinished) | 2/180 | 1/9 | 2/3 (+1 false) | 12 / 20 |", "missed:"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}

func TestBadNodeRows(t *testing.T) {
	h, rows := BadNodeRows([]BadNodeTrial{
		{Setup: BadNodeControl, Trial: 1, Tasks: 60, WallMs: 2000.04, AttemptsTotal: 60},
		{Setup: BadNodeWorkDir, Trial: 1, BadNode: "agent-1", Tasks: 60, WallMs: 2500, Quarantined: true, TimeToQuarantineMs: 86,
			AttemptsOnBadBefore: 11, AttemptsOnBadTotal: 11, AttemptsTotal: 71, QuarantinedNodes: []string{"agent-1"}},
	})
	if len(rows) != 2 {
		t.Fatalf("%d rows", len(rows))
	}
	col := map[string]int{}
	for i, c := range h {
		col[c] = i
	}
	for _, c := range []string{"setup", "trial", "wall_ms", "failed_tasks", "failed_jobs", "quarantined", "time_to_quarantine_ms",
		"attempts_on_bad_before_quarantine", "attempts_on_bad_total", "attempts_total"} {
		if _, ok := col[c]; !ok {
			t.Fatalf("header %v lacks %s", h, c)
		}
	}
	for i, r := range rows {
		if len(r) != len(h) {
			t.Fatalf("row %d has %d fields, header %d", i, len(r), len(h))
		}
	}
	// The control has no bad node: its bad-node columns are empty, not 0.
	if c := rows[0]; c[col["quarantined"]] != "" || c[col["attempts_on_bad_total"]] != "" || c[col["wall_ms"]] != "2000.0" {
		t.Errorf("control row %v", c)
	}
	if w := rows[1]; w[col["quarantined"]] != "true" || w[col["time_to_quarantine_ms"]] != "86.0" || w[col["attempts_on_bad_before_quarantine"]] != "11" {
		t.Errorf("workdir row %v", w)
	}
}

func TestSlots(t *testing.T) {
	if got := DefaultBadNode.Slots(4); got != 40 {
		t.Errorf("4 agents x 1000 m of 100 m tasks: %d slots, want 40", got)
	}
	o := DefaultBadNode
	o.MemoryMiB = 64 // memory binds: 4 tasks of 16 MiB per agent
	if got := o.Slots(3); got != 12 {
		t.Errorf("memory-bound: %d slots, want 12", got)
	}
}

// The bad host's sleep is a real script that exits with its code at once.
func TestFakeSleepDir(t *testing.T) {
	for _, code := range []int{75, 1} {
		dir, err := fakeSleepDir(filepath.Join(t.TempDir(), "bin"), code)
		if err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(filepath.Join(dir, "sleep"), "1").CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != code {
			t.Fatalf("sleep exited %v, want code %d (output %q)", err, code, out)
		}
		if !strings.Contains(string(out), "broken") {
			t.Errorf("output %q does not say the host is broken", out)
		}
	}
}

func TestSpawnFloor(t *testing.T) {
	// 4 sleeps of 0.2 s, 2 at once: two waves, at least 400 ms.
	d, err := SpawnFloor(context.Background(), 4, 2, "0.2")
	if err != nil {
		t.Fatal(err)
	}
	if d < 400 || d > 5000 {
		t.Fatalf("floor %.0f ms, want two waves of 200 ms (>= 400 ms)", d)
	}
	if _, err := SpawnFloor(context.Background(), 1, 1, "not-a-number"); err == nil {
		t.Fatal("a failing sleep gave no error")
	}
}
