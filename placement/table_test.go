package placement

import (
	"reflect"
	"testing"
)

// The node-table cache (Snapshot.Generation) must never change a plan: the
// same engine, seed and input give the same plan whether the tables were
// built in the call or reused, across rounds whose usage differs.
func TestGenerationCacheSamePlan(t *testing.T) {
	snap := synthCluster(2000, 3)
	tasks := synthTasks(300, 5)
	for _, pol := range []Policy{PolicyBinpack, PolicyFragmentation, PolicySpread} {
		cached := New(Options{Policy: pol, Seed: 9})
		for round := 0; round < 3; round++ {
			// Usage changes between rounds; the node set does not.
			s := *snap
			s.Nodes = append([]*Node(nil), snap.Nodes...)
			for i := round; i < len(s.Nodes); i += 7 {
				n := *s.Nodes[i]
				n.Allocated.CPUMillis = min(n.Capacity.CPUMillis, n.Allocated.CPUMillis+int64(1000*round))
				n.Quarantined = round == 2
				s.Nodes[i] = &n
			}
			want := New(Options{Policy: pol, Seed: 9}).Place(&s, tasks)
			s.Generation = 42
			got := cached.Place(&s, tasks)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%s round %d: plan with Generation differs from plan without", pol, round)
			}
		}
	}
}

// A Generation seen before with a different node set is not trusted.
func TestGenerationCacheChecksNodes(t *testing.T) {
	e := New(Options{Seed: 1})
	a := &Snapshot{Generation: 7, Nodes: []*Node{
		{ID: "a", Labels: map[string]string{"zone": "x"}, Capacity: Resources{CPUMillis: 1000, MemoryMiB: 1000}},
	}}
	task := []Task{{ID: "t", Request: Resources{CPUMillis: 100, MemoryMiB: 100}, Constraints: []Constraint{{Label: "zone", Op: "=", Values: []string{"y"}}}}}
	if p := e.Place(a, task); len(p.Placements) != 0 {
		t.Fatalf("placed on a node outside the constraint: %+v", p)
	}
	b := &Snapshot{Generation: 7, Nodes: []*Node{
		{ID: "b", Labels: map[string]string{"zone": "y"}, Capacity: Resources{CPUMillis: 1000, MemoryMiB: 1000}},
	}}
	if p := e.Place(b, task); len(p.Placements) != 1 || p.Placements[0].NodeID != "b" {
		t.Fatalf("stale table reused for a different node set: %+v", p)
	}
}
