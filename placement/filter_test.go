package placement

import (
	"strings"
	"testing"
)

func node(id string, cpu, mem int64, gpus int, labels map[string]string) *Node {
	return &Node{ID: id, Capacity: Resources{CPUMillis: cpu, MemoryMiB: mem, GPUs: gpus}, Labels: labels}
}

// placeOne places a single task and returns the node ID ("" if unplaced)
// and the plan.
func placeOne(t *testing.T, opts Options, snap *Snapshot, task Task) (string, Plan) {
	t.Helper()
	p := New(opts).Place(snap, []Task{task})
	if len(p.Placements)+len(p.Unplaced) != 1 {
		t.Fatalf("plan has %d placements and %d unplaced for one task", len(p.Placements), len(p.Unplaced))
	}
	if len(p.Placements) == 1 {
		return p.Placements[0].NodeID, p
	}
	return "", p
}

func TestFilters(t *testing.T) {
	small := Resources{CPUMillis: 100, MemoryMiB: 100}
	base := func() []*Node {
		return []*Node{
			node("n1", 1000, 1000, 0, map[string]string{"zone": "a", "jurisdiction": "eu", "disk": "ssd", "cores": "8", "kernel": "5.15.0"}),
			node("n2", 1000, 1000, 0, map[string]string{"zone": "b", "jurisdiction": "us", "cores": "32", "kernel": "6.1.2"}),
		}
	}
	cases := []struct {
		name   string
		mutate func(ns []*Node)
		task   Task
		want   string // node ID or "" for unplaced
		reason string // substring of Unplaced.Reason
	}{
		{name: "quarantined", mutate: func(ns []*Node) { ns[0].Quarantined = true; ns[1].Quarantined = true }, task: Task{Request: small}, reason: "quarantined: 2 nodes"},
		{name: "quarantined one", mutate: func(ns []*Node) { ns[0].Quarantined = true }, task: Task{Request: small}, want: "n2"},
		{name: "reserved", mutate: func(ns []*Node) { ns[0].Reserved = true; ns[1].Reserved = true }, task: Task{Request: small}, reason: "reserved for another shard owner: 2 nodes"},
		{name: "reserved one", mutate: func(ns []*Node) { ns[1].Reserved = true }, task: Task{Request: small}, want: "n1"},
		{name: "reserved beside quarantined", mutate: func(ns []*Node) { ns[0].Quarantined = true; ns[1].Reserved = true }, task: Task{Request: small}, reason: "quarantined: 1 node, reserved for another shard owner: 1 node"},
		{name: "ineligible", mutate: func(ns []*Node) { ns[1].Ineligible = true }, task: Task{Request: small, Constraints: []Constraint{{Label: "zone", Op: "=", Values: []string{"b"}}}}, reason: "ineligible: 1 node"},
		{name: "excluded", task: Task{Request: small, ExcludedNodes: map[string]bool{"n1": true}}, want: "n2"},
		{name: "jurisdiction", task: Task{Request: small, Jurisdictions: []string{"us"}}, want: "n2"},
		{name: "jurisdiction none", task: Task{Request: small, Jurisdictions: []string{"uk"}}, reason: "jurisdiction: 2 nodes"},
		{name: "eq", task: Task{Request: small, Constraints: []Constraint{{Label: "zone", Op: "=", Values: []string{"b"}}}}, want: "n2"},
		{name: "ne", task: Task{Request: small, Constraints: []Constraint{{Label: "zone", Op: "!=", Values: []string{"b"}}}}, want: "n1"},
		{name: "in", task: Task{Request: small, Constraints: []Constraint{{Label: "zone", Op: "in", Values: []string{"x", "a"}}}}, want: "n1"},
		{name: "in none", task: Task{Request: small, Constraints: []Constraint{{Label: "zone", Op: "in", Values: []string{"c"}}}}, reason: "constraint zone in [c]: 2 nodes"},
		{name: "not_in", task: Task{Request: small, Constraints: []Constraint{{Label: "zone", Op: "not_in", Values: []string{"a"}}}}, want: "n2"},
		{name: "exists", task: Task{Request: small, Constraints: []Constraint{{Label: "disk", Op: "exists"}}}, want: "n1"},
		{name: "not_exists", task: Task{Request: small, Constraints: []Constraint{{Label: "disk", Op: "not_exists"}}}, want: "n2"},
		{name: "gt", task: Task{Request: small, Constraints: []Constraint{{Label: "cores", Op: ">", Values: []string{"16"}}}}, want: "n2"},
		{name: "lt", task: Task{Request: small, Constraints: []Constraint{{Label: "cores", Op: "<", Values: []string{"16"}}}}, want: "n1"},
		{name: "lt missing label", task: Task{Request: small, Constraints: []Constraint{{Label: "nope", Op: "<", Values: []string{"16"}}}}, reason: "constraint nope < 16: 2 nodes"},
		{name: "version range", task: Task{Request: small, Constraints: []Constraint{{Label: "kernel", Op: "version", Values: []string{">= 6.0, < 7"}}}}, want: "n2"},
		{name: "version pessimistic", task: Task{Request: small, Constraints: []Constraint{{Label: "kernel", Op: "version", Values: []string{"~> 5.15.0"}}}}, want: "n1"},
		{name: "unknown op never matches", task: Task{Request: small, Constraints: []Constraint{{Label: "zone", Op: "~~", Values: []string{"a"}}}}, reason: "2 nodes"},
		{name: "cpu", mutate: func(ns []*Node) { ns[0].Allocated.CPUMillis = 950 }, task: Task{Request: Resources{CPUMillis: 500}}, want: "n2"},
		{name: "memory", task: Task{Request: Resources{MemoryMiB: 2000}}, reason: "memory: 2 nodes"},
		{name: "max tasks", mutate: func(ns []*Node) { ns[0].MaxTasks = 1; ns[0].RunningTasks = 1 }, task: Task{Request: small}, want: "n2"},
		{name: "gpu whole", mutate: func(ns []*Node) {
			ns[0].Capacity.GPUs, ns[0].GPUModel, ns[0].GPUFreeMilli = 2, "T4", []int{1000, 400}
			ns[1].Capacity.GPUs, ns[1].GPUModel = 2, "T4"
		}, task: Task{Request: Resources{GPUs: 2}}, want: "n2"},
		{name: "gpu share needs one GPU", mutate: func(ns []*Node) {
			ns[0].Capacity.GPUs, ns[0].GPUFreeMilli = 2, []int{300, 300}
			ns[1].Capacity.GPUs, ns[1].GPUFreeMilli = 1, []int{500}
		}, task: Task{Request: Resources{GPUMilli: 500}}, want: "n2"},
		{name: "gpu share none", mutate: func(ns []*Node) {
			ns[0].Capacity.GPUs, ns[0].GPUFreeMilli = 2, []int{300, 300}
		}, task: Task{Request: Resources{GPUMilli: 500}}, reason: "gpu share: 2 nodes"},
		{name: "gpu model", mutate: func(ns []*Node) {
			ns[0].Capacity.GPUs, ns[0].GPUModel = 1, "T4"
			ns[1].Capacity.GPUs, ns[1].GPUModel = 1, "V100"
		}, task: Task{Request: Resources{GPUs: 1}, GPUModels: []string{"V100", "A100"}}, want: "n2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ns := base()
			if tc.mutate != nil {
				tc.mutate(ns)
			}
			tc.task.ID = "t"
			got, p := placeOne(t, Options{}, &Snapshot{Nodes: ns}, tc.task)
			if got != tc.want {
				t.Fatalf("placed on %q, want %q (plan %+v)", got, tc.want, p)
			}
			if tc.want == "" && !strings.Contains(p.Unplaced[0].Reason, tc.reason) {
				t.Fatalf("reason %q, want it to contain %q", p.Unplaced[0].Reason, tc.reason)
			}
		})
	}
}

func TestGroupRules(t *testing.T) {
	zones := func(zs ...string) []*Node {
		var ns []*Node
		for i, z := range zs {
			ns = append(ns, node("n"+string(rune('1'+i)), 4000, 4000, 0, map[string]string{"zone": z}))
		}
		return ns
	}
	req := Resources{CPUMillis: 100, MemoryMiB: 100}
	t.Run("distinct hosts existing", func(t *testing.T) {
		snap := &Snapshot{Nodes: zones("a", "b"), Existing: []Allocation{{TaskID: "old", GroupKey: "g", NodeID: "n1"}}}
		got, _ := placeOne(t, Options{}, snap, Task{ID: "t", GroupKey: "g", DistinctHosts: true, Request: req})
		if got != "n2" {
			t.Fatalf("got %q", got)
		}
	})
	t.Run("K anti-affine tasks land on K distinct nodes or stay unplaced", func(t *testing.T) {
		for _, k := range []int{2, 3, 5} {
			var tasks []Task
			for i := 0; i < k; i++ {
				tasks = append(tasks, Task{ID: string(rune('a' + i)), GroupKey: "g", AntiAffinityGroups: []string{"g"}, Request: req})
			}
			p := New(Options{Policy: PolicyBinpack}).Place(&Snapshot{Nodes: zones("a", "b", "c")}, tasks)
			seen := map[string]bool{}
			for _, pl := range p.Placements {
				if seen[pl.NodeID] {
					t.Fatalf("k=%d: two anti-affine tasks on %s", k, pl.NodeID)
				}
				seen[pl.NodeID] = true
			}
			if want := min(k, 3); len(p.Placements) != want || len(p.Unplaced) != k-want {
				t.Fatalf("k=%d: %d placed, %d unplaced", k, len(p.Placements), len(p.Unplaced))
			}
			for _, u := range p.Unplaced {
				if !strings.Contains(u.Reason, "anti-affinity: 3 nodes") {
					t.Fatalf("reason %q", u.Reason)
				}
			}
		}
	})
	t.Run("anti-affinity across groups is symmetric in a batch", func(t *testing.T) {
		tasks := []Task{
			{ID: "web", GroupKey: "web", AntiAffinityGroups: []string{"db"}, Request: req},
			{ID: "db", GroupKey: "db", Request: req},
		}
		p := New(Options{}).Place(&Snapshot{Nodes: zones("a")}, tasks)
		if len(p.Placements) != 1 || len(p.Unplaced) != 1 {
			t.Fatalf("plan %+v", p)
		}
	})
	t.Run("one per zone holds when two tasks are re-placed", func(t *testing.T) {
		// t0..t2 run in zones c, a, b; t1 and t2 are re-placed (their old
		// allocations are still in the snapshot). Four zones, at most one
		// task of the group per zone.
		snap := &Snapshot{Nodes: zones("a", "b", "c", "d"), Existing: []Allocation{
			{TaskID: "t0", GroupKey: "g", NodeID: "n3"},
			{TaskID: "t1", GroupKey: "g", NodeID: "n1"},
			{TaskID: "t2", GroupKey: "g", NodeID: "n2"},
		}}
		rule := []DistinctProperty{{Label: "zone", MaxPerValue: 1}}
		tasks := []Task{
			{ID: "t1", GroupKey: "g", DistinctProperties: rule, Request: req},
			{ID: "t2", GroupKey: "g", DistinctProperties: rule, Request: req},
		}
		for seed := int64(0); seed < 20; seed++ {
			p := New(Options{Seed: seed}).Place(snap, tasks)
			if len(p.Placements) != 2 {
				t.Fatalf("seed %d: plan %+v", seed, p)
			}
			perZone := map[string]int{"c": 1} // t0 stays
			for _, pl := range p.Placements {
				for _, n := range snap.Nodes {
					if n.ID == pl.NodeID {
						perZone[n.Labels["zone"]]++
					}
				}
			}
			for z, n := range perZone {
				if n > 1 {
					t.Fatalf("seed %d: %d tasks in zone %s: %+v", seed, n, z, p.Placements)
				}
			}
		}
		// Three zones only: both re-placed tasks still fit, in a and b.
		snap.Nodes = zones("a", "b", "c")
		p := New(Options{}).Place(snap, tasks)
		if len(p.Placements) != 2 || p.Placements[0].NodeID == p.Placements[1].NodeID {
			t.Fatalf("plan %+v", p)
		}
		// A third new task of the group has no zone left.
		tasks = append(tasks, Task{ID: "t3", GroupKey: "g", DistinctProperties: rule, Request: req})
		p = New(Options{}).Place(snap, tasks)
		if len(p.Placements) != 2 || len(p.Unplaced) != 1 || !strings.Contains(p.Unplaced[0].Reason, "distinct property zone (max 1): 3 nodes") {
			t.Fatalf("plan %+v", p)
		}
	})
}

func TestFragmentationReported(t *testing.T) {
	// 8 free GPUs, 2 per node, on 4 nodes; a task needs 6.
	var ns []*Node
	for i := 0; i < 4; i++ {
		n := node("n"+string(rune('1'+i)), 64000, 256000, 8, nil)
		n.GPUModel = "V100"
		n.GPUFreeMilli = []int{1000, 1000, 0, 0, 0, 0, 0, 0}
		ns = append(ns, n)
	}
	_, p := placeOne(t, Options{}, &Snapshot{Nodes: ns}, Task{ID: "big", Request: Resources{CPUMillis: 1000, MemoryMiB: 1000, GPUs: 6}})
	u := p.Unplaced[0]
	if !u.Fragmented || u.Excluded[ReasonGPU] != 4 || !strings.HasPrefix(u.Reason, "fragmented") || !strings.Contains(u.Reason, "gpu: 4 nodes") {
		t.Fatalf("unplaced %+v", u)
	}
	// One node whose 4 GPUs each hold a 320 share: 2.72 GPUs free, none
	// idle. A 1-GPU task is a fragmentation case on that node alone; a
	// 3-GPU one is not (2.72 < 3).
	one := node("g", 64000, 256000, 4, nil)
	one.GPUModel = "A100"
	one.GPUFreeMilli = []int{680, 680, 680, 680}
	for _, c := range []struct {
		gpus int
		frag bool
	}{{1, true}, {2, true}, {3, false}} {
		_, p = placeOne(t, Options{}, &Snapshot{Nodes: []*Node{one}}, Task{ID: "w", Request: Resources{CPUMillis: 1000, MemoryMiB: 1000, GPUs: c.gpus}})
		if u := p.Unplaced[0]; u.Fragmented != c.frag || strings.HasPrefix(u.Reason, "fragmented") != c.frag || u.Excluded[ReasonGPU] != 1 {
			t.Errorf("%d GPUs on one node of split GPUs: unplaced %+v, want fragmented=%v", c.gpus, u, c.frag)
		}
	}
	// A 700 share with 680 free on each GPU: split too.
	_, p = placeOne(t, Options{}, &Snapshot{Nodes: []*Node{one}}, Task{ID: "s", Request: Resources{CPUMillis: 1000, MemoryMiB: 1000, GPUMilli: 700}})
	if u := p.Unplaced[0]; !u.Fragmented {
		t.Errorf("700 share on 4x680 free: unplaced %+v, want fragmented", u)
	}
	// 10 GPUs needed: not enough in total, so not fragmentation.
	_, p = placeOne(t, Options{}, &Snapshot{Nodes: ns}, Task{ID: "huge", Request: Resources{GPUs: 10}})
	if p.Unplaced[0].Fragmented {
		t.Fatalf("unplaced %+v", p.Unplaced[0])
	}
}

func TestReasonFormat(t *testing.T) {
	got := formatReason(map[string]int{"quarantined": 3, "memory": 812, "constraint zone in [a]": 400}, false)
	want := "memory: 812 nodes, constraint zone in [a]: 400 nodes, quarantined: 3 nodes"
	if got != want {
		t.Fatalf("got %q want %q", got, want)
	}
}

func TestVersionCompare(t *testing.T) {
	cases := []struct {
		v, rng string
		ok     bool
	}{
		{"1.2.3", ">= 1.2, < 1.3", true},
		{"1.3.0", ">= 1.2, < 1.3", false},
		{"v2.0.0", "= 2", true},
		{"2.0.0-rc1", "< 2.0.0", true},
		{"1.2.9", "~> 1.2.3", true},
		{"1.3.0", "~> 1.2.3", false},
		{"1.9", "~> 1.2", true},
		{"2.0", "~> 1.2", false},
		{"garbage", ">= 1", false},
	}
	for _, c := range cases {
		m := compileMatcher("v", OpVersion, []string{c.rng})
		if got := m.match(map[string]string{"v": c.v}); got != c.ok {
			t.Errorf("%s in %q: got %v want %v", c.v, c.rng, got, c.ok)
		}
	}
}
