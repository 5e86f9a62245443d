package bench

import (
	"testing"

	"apiary.dev/apiary/shards"
)

func TestMaxGap(t *testing.T) {
	for _, tc := range []struct {
		name     string
		ts       []float64
		from, to float64
		want     float64
		in       int
	}{
		{"empty window: its whole length", nil, -2000, 3000, 5000, 0},
		{"instants outside are ignored", []float64{-9000, 4000}, -2000, 3000, 5000, 0},
		{"unordered, the ends count", []float64{500, -1500, 100, 2600}, -2000, 3000, 2100, 4},
		{"gap up to the end", []float64{-1900, -1800}, -2000, 3000, 4800, 2},
		{"gap from the start", []float64{2900, 2950}, -2000, 3000, 4900, 2},
		{"on the ends", []float64{-2000, 0, 3000}, -2000, 3000, 3000, 3},
	} {
		if got := maxGap(tc.ts, tc.from, tc.to); got != tc.want {
			t.Errorf("%s: maxGap = %v, want %v", tc.name, got, tc.want)
		}
		if got := countIn(tc.ts, tc.from, tc.to); got != tc.in {
			t.Errorf("%s: countIn = %d, want %d", tc.name, got, tc.in)
		}
	}
}

func TestTaskShard(t *testing.T) {
	for key, want := range map[string]int{
		"/apiary/tasks/00042/job-1/000003": 42,
		"/apiary/tasks/00000/j/000000":     0,
		"/apiary/tasks/00255/j/000001":     255,
	} {
		if s, ok := taskShard(key); !ok || s != want {
			t.Errorf("taskShard(%q) = %d, %v; want %d", key, s, ok, want)
		}
	}
	for _, key := range []string{"/apiary/jobs/00042/job-1", "/apiary/tasks/", "/apiary/tasks/x/j/1", "/apiary/tasks/00042", "/apiary/shards/00042/owner"} {
		if s, ok := taskShard(key); ok {
			t.Errorf("taskShard(%q) = %d, true; want not a task key", key, s)
		}
	}
}

func TestMisplaced(t *testing.T) {
	members := []string{"bench-c1", "bench-c2", "bench-c3"}
	desired := shards.Desired(members, 16)
	owners := map[int]shards.Ownership{}
	for s, m := range desired {
		owners[s] = shards.Ownership{Member: m, Epoch: shards.Epoch(100 + s)}
	}
	if bad := misplaced(desired, owners); len(bad) != 0 {
		t.Fatalf("settled region: misplaced %v", bad)
	}
	delete(owners, 3)
	other := members[0]
	if desired[7] == other {
		other = members[1]
	}
	owners[7] = shards.Ownership{Member: other, Epoch: 1}
	if bad := misplaced(desired, owners); len(bad) != 2 || bad[0] != 3 || bad[1] != 7 {
		t.Fatalf("misplaced = %v, want [3 7] (3 unowned, 7 on %s)", bad, other)
	}
}

func TestPickVictim(t *testing.T) {
	members := []string{"c1", "c2", "c3"}
	got := map[string]int{}
	for trial := 1; trial <= 8; trial++ {
		v, err := pickVictim(members, "c2", trial)
		if err != nil {
			t.Fatal(err)
		}
		if (trial%2 == 1) != (v == "c2") {
			t.Errorf("trial %d: victim %s; want the leader c2 on odd trials only", trial, v)
		}
		got[v]++
	}
	if got["c1"] != 2 || got["c3"] != 2 {
		t.Errorf("followers killed %v, want c1 and c3 twice each", got)
	}
	if _, err := pickVictim(members, "c9", 1); err == nil {
		t.Error("a leader outside the members: want an error")
	}
}

func TestDrainConflictRatios(t *testing.T) {
	r := DrainResult{Conflicts: 5, PlanTxns: 45, Placements: 2000}
	if got := r.ConflictsPerPlan(); got != 0.1 {
		t.Errorf("ConflictsPerPlan = %v, want 0.1", got)
	}
	if got := r.ConflictsPerPlacement(); got != 0.0025 {
		t.Errorf("ConflictsPerPlacement = %v, want 0.0025", got)
	}
	if got := (DrainResult{}).ConflictsPerPlan(); got != 0 {
		t.Errorf("no plans: ConflictsPerPlan = %v, want 0", got)
	}
}

func TestThousands(t *testing.T) {
	for x, want := range map[float64]string{0: "0", 999.4: "999", 1441: "1,441", 1234567: "1,234,567", -2090: "-2,090"} {
		if got := thousands(x); got != want {
			t.Errorf("thousands(%v) = %q, want %q", x, got, want)
		}
	}
}

func TestWeightedPercentile(t *testing.T) {
	xs := []float64{2400, 400, 2500, 450, 420, 2300}
	leader := []bool{true, false, true, false, false, true}
	var even, third []float64
	for _, l := range leader {
		even = append(even, 1)
		if l {
			third = append(third, 1.0/3/3)
		} else {
			third = append(third, 2.0/3/3)
		}
	}
	for _, tc := range []struct {
		name string
		w    []float64
		p    float64
		want float64
	}{
		{"equal weights: nearest rank", even, 50, 450},
		{"equal weights p95", even, 95, 2500},
		{"leader 1 in 3: p50 among the followers", third, 50, 450},
		{"leader 1 in 3: p66 still a follower", third, 66, 450},
		{"leader 1 in 3: p70 a leader", third, 70, 2300},
		{"leader 1 in 3: p95", third, 95, 2500},
	} {
		if got := weightedPercentile(xs, tc.w, tc.p); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
	if got := weightedPercentile(nil, nil, 50); got != 0 {
		t.Errorf("no samples: got %v, want 0", got)
	}
}
