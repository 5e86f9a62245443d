package placement

import (
	"fmt"
	"strings"
	"testing"
)

// antiNodes is n nodes of 4 cores; labels(i) gives node i's labels.
func antiNodes(n int, labels func(i int) map[string]string) []*Node {
	var ns []*Node
	for i := 0; i < n; i++ {
		var l map[string]string
		if labels != nil {
			l = labels(i)
		}
		ns = append(ns, node(fmt.Sprintf("n%d", i), 4000, 8192, 0, l))
	}
	return ns
}

// member is a 1-task job of its own carrying anti-affinity group g.
func member(job string, g, scope string) Task {
	return Task{ID: job + "/0", GroupKey: job + "/0", Request: Resources{CPUMillis: 100, MemoryMiB: 64},
		AntiAffinity: AntiAffinity{Group: g, Scope: scope}}
}

// TestAntiAffinityAcrossJobs: members of one anti-affinity group from
// different jobs (different GroupKeys) land on distinct nodes under every
// policy, even though bin-packing would stack them; one more member than
// nodes stays unplaced with the anti-affinity reason; tasks outside the
// group, and members of another group, are not kept apart from them.
func TestAntiAffinityAcrossJobs(t *testing.T) {
	for _, policy := range []Policy{PolicyBinpack, PolicySpread, PolicyFragmentation} {
		t.Run(string(policy), func(t *testing.T) {
			var tasks []Task
			for j := 0; j < 7; j++ {
				tasks = append(tasks, member(fmt.Sprintf("db%d", j), "db", ""))
			}
			tasks = append(tasks, member("web0", "web", ""), Task{ID: "plain/0", GroupKey: "plain/0", Request: Resources{CPUMillis: 100, MemoryMiB: 64}})
			p := New(Options{Policy: policy, Seed: 1}).Place(&Snapshot{Nodes: antiNodes(6, nil)}, tasks)
			used := map[string]string{}
			for _, pl := range p.Placements {
				if strings.HasPrefix(pl.TaskID, "db") {
					if other, ok := used[pl.NodeID]; ok {
						t.Fatalf("%s and %s of group db both on %s", other, pl.TaskID, pl.NodeID)
					}
					used[pl.NodeID] = pl.TaskID
				}
			}
			if len(used) != 6 {
				t.Fatalf("%d db members placed on 6 nodes, want 6", len(used))
			}
			if len(p.Unplaced) != 1 || !strings.HasPrefix(p.Unplaced[0].TaskID, "db") ||
				!strings.Contains(p.Unplaced[0].Reason, "anti-affinity group db per node: 6 nodes") {
				t.Fatalf("unplaced %+v, want one db member with %q", p.Unplaced, "anti-affinity group db per node: 6 nodes")
			}
			if len(p.Placements) != 8 {
				t.Fatalf("%d placed, want 8 (web0 and plain/0 are not in group db)", len(p.Placements))
			}
		})
	}
}

// TestAntiAffinityExistingAndScope: existing members count (by their
// AntiAffinityGroup, not their GroupKey), a batch task being re-placed does
// not count against itself, and a label scope allows one member per value
// (nodes without the label share "").
func TestAntiAffinityExistingAndScope(t *testing.T) {
	nodes := antiNodes(4, nil)
	existing := []Allocation{
		{TaskID: "old/0", GroupKey: "old/0", NodeID: "n0", AntiAffinityGroup: "db", Request: Resources{CPUMillis: 100, MemoryMiB: 64}},
		{TaskID: "other/0", GroupKey: "other/0", NodeID: "n1", AntiAffinityGroup: "cache", Request: Resources{CPUMillis: 100, MemoryMiB: 64}},
		{TaskID: "new0/0", GroupKey: "new0/0", NodeID: "n2", AntiAffinityGroup: "db", Request: Resources{CPUMillis: 100, MemoryMiB: 64}},
	}
	p := New(Options{Policy: PolicyBinpack, Seed: 1}).Place(&Snapshot{Nodes: nodes, Existing: existing},
		[]Task{member("new0", "db", ScopeNode), member("new1", "db", ScopeNode)})
	got := map[string]string{}
	for _, pl := range p.Placements {
		got[pl.TaskID] = pl.NodeID
	}
	if len(got) != 2 || got["new0/0"] == got["new1/0"] || got["new0/0"] == "n0" || got["new1/0"] == "n0" {
		t.Fatalf("placements %v (unplaced %+v): want new0 and new1 apart and off n0 (old/0 of db is there)", got, p.Unplaced)
	}

	zones := func(i int) map[string]string {
		if i == 6 {
			return nil // no zone label: the value ""
		}
		return map[string]string{"zone": fmt.Sprintf("z%d", i/2)}
	}
	zn := antiNodes(7, zones)
	var tasks []Task
	for j := 0; j < 5; j++ {
		tasks = append(tasks, member(fmt.Sprintf("z%d", j), "db", "zone"))
	}
	p = New(Options{Policy: PolicyBinpack, Seed: 1}).Place(&Snapshot{Nodes: zn}, tasks)
	seen := map[string]bool{}
	byID := map[string]*Node{}
	for _, n := range zn {
		byID[n.ID] = n
	}
	for _, pl := range p.Placements {
		v := byID[pl.NodeID].Labels["zone"]
		if seen[v] {
			t.Fatalf("two members in zone %q", v)
		}
		seen[v] = true
	}
	if len(p.Placements) != 4 || len(p.Unplaced) != 1 || !strings.Contains(p.Unplaced[0].Reason, "anti-affinity group db per zone: 7 nodes") {
		t.Fatalf("%d placed, unplaced %+v: want 4 (3 zones and the unlabelled node) and 1 unplaced for anti-affinity", len(p.Placements), p.Unplaced)
	}
}

// TestAntiAffinityMixedScopes: members of one group with different scopes
// keep every member's rule, whichever was placed first: a node-scoped member
// stays out of the zone of a zone-scoped one, and a zone-scoped member out
// of the zone of a node-scoped one; in one batch too.
func TestAntiAffinityMixedScopes(t *testing.T) {
	zones := func(i int) map[string]string { return map[string]string{"zone": fmt.Sprintf("z%d", i/2)} } // n0,n1: z0; n2,n3: z1
	zoneOf := func(id string) string { var i int; fmt.Sscanf(id, "n%d", &i); return zones(i)["zone"] }
	req := Resources{CPUMillis: 100, MemoryMiB: 64}
	for _, tc := range []struct {
		name               string
		oldScope, newScope string // the new member must avoid the whole of z0 either way
	}{
		{"zone member first, then a node member", "zone", ScopeNode},
		{"node member first, then a zone member", ScopeNode, "zone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			existing := []Allocation{{TaskID: "old/0", GroupKey: "old/0", NodeID: "n0", Request: req,
				AntiAffinityGroup: "mz", AntiAffinityScope: tc.oldScope}}
			for k := 0; k < 5; k++ {
				p := New(Options{Policy: PolicyBinpack, Seed: int64(k)}).Place(&Snapshot{Nodes: antiNodes(4, zones), Existing: existing},
					[]Task{member("new", "mz", tc.newScope)})
				if len(p.Placements) != 1 {
					t.Fatalf("seed %d: unplaced %+v", k, p.Unplaced)
				}
				if n := p.Placements[0].NodeID; zoneOf(n) == "z0" {
					t.Fatalf("seed %d: the %s member went to %s in z0, which holds the %s member on n0", k, tc.newScope, n, tc.oldScope)
				}
			}
		})
	}
	// One batch: a zone member and three node members over 2 zones of 2
	// nodes: at most one member in the zone-scoped member's zone.
	tasks := []Task{member("z", "mz", "zone"), member("a", "mz", ""), member("b", "mz", ""), member("c", "mz", "")}
	p := New(Options{Policy: PolicyBinpack, Seed: 1}).Place(&Snapshot{Nodes: antiNodes(4, zones)}, tasks)
	at := map[string]string{}
	for _, pl := range p.Placements {
		at[pl.TaskID] = pl.NodeID
	}
	zz := zoneOf(at["z/0"])
	for id, n := range at {
		if id != "z/0" && zoneOf(n) == zz {
			t.Fatalf("placements %v: %s shares zone %s with the zone-scoped member", at, id, zz)
		}
	}
	if len(p.Placements) != 3 || len(p.Unplaced) != 1 {
		t.Fatalf("placements %v, unplaced %+v: want the zone member and 2 node members (the other zone's 2 nodes), 1 unplaced", at, p.Unplaced)
	}
}
