package scheduler

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/placement"
	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/regional/taskstate"
	"apiary.dev/apiary/shards"
)

// fixedOwners is an OwnerView that never changes.
type fixedOwners map[int]string

func (f fixedOwners) Snapshot() shards.Snapshot {
	s := shards.Snapshot{Owners: map[int]shards.Ownership{}, Changed: make(chan struct{})}
	for sh, m := range f {
		s.Owners[sh] = shards.Ownership{Member: m, Epoch: shards.Epoch(sh + 1)}
	}
	return s
}

// homeFixture is 64 free nodes in a region of 16 shards owned by a, b and c.
func homeFixture() (*homeNodes, []*placement.Node, func(string) int) {
	owners := fixedOwners{}
	for s := 0; s < 16; s++ {
		owners[s] = []string{"a", "b", "c"}[s%3]
	}
	h := newHomeNodes(owners)
	h.refresh()
	var nodes []*placement.Node
	for i := 0; i < 64; i++ {
		nodes = append(nodes, &placement.Node{ID: fmt.Sprintf("n%02d", i),
			Capacity: placement.Resources{CPUMillis: 4000, MemoryMiB: 8192}, MaxTasks: 8})
	}
	return h, nodes, func(id string) int { return shards.Of(id, 16) }
}

// preferred is the first of the owners with work in node id's rendezvous
// order (computed here from shards.Rank, not by the code under test).
func preferred(id string, withWork ...string) string {
	for _, m := range shards.Rank([]string{"a", "b", "c"}, shards.Of(id, 16), 16) {
		if slices.Contains(withWork, m) {
			return m
		}
	}
	return ""
}

func ids(ns []*placement.Node) []string {
	var out []string
	for _, n := range ns {
		out = append(out, n.ID)
	}
	return out
}

// TestHomeNodesReserveForPreferredOwner: a reserves exactly the free nodes
// whose preferred owner among those with work is b; c has no work, so its
// nodes go to the next in their order; the flag is set on the nodes.
func TestHomeNodesReserveForPreferredOwner(t *testing.T) {
	h, nodes, home := homeFixture()
	now := time.Unix(1000, 0)
	mine := urgency{prio: 50, submitMs: now.UnixMilli()}
	others := heads{"b": {prio: 50, submitMs: now.UnixMilli()}}
	got, wake := h.reserve(nodes, nil, "a", mine, others, home, 16, now)
	var want []string
	for _, n := range nodes {
		if preferred(n.ID, "a", "b") == "b" {
			want = append(want, n.ID)
		}
	}
	if len(want) == 0 || len(want) == len(nodes) {
		t.Fatalf("fixture: b preferred on %d of %d nodes; want some but not all", len(want), len(nodes))
	}
	if !slices.Equal(ids(got), want) {
		t.Fatalf("reserved %v, want %v", ids(got), want)
	}
	for _, n := range nodes {
		if n.Reserved != slices.Contains(want, n.ID) {
			t.Fatalf("node %s: Reserved=%v", n.ID, n.Reserved)
		}
	}
	if wake != spillAfter {
		t.Fatalf("wake %v, want %v (every node just seen free)", wake, spillAfter)
	}
}

// TestHomeNodesSpillAndYield: a node left free for spillAfter is anyone's;
// an owner whose head waited yieldAge longer (or has a higher priority)
// reserves nothing; a node seen full restarts its free clock; no other
// owner with work reserves nothing.
func TestHomeNodesSpillAndYield(t *testing.T) {
	now := time.Unix(1000, 0)
	ms := now.UnixMilli()
	b := heads{"b": {prio: 50, submitMs: ms}}
	cases := []struct {
		name   string
		mine   urgency
		others heads
		later  time.Duration // second call this much after the first
		want   bool          // any node reserved in the second call
	}{
		{"same age, within spillAfter", urgency{50, ms}, b, spillAfter - time.Millisecond, true},
		{"same age, after spillAfter", urgency{50, ms}, b, spillAfter, false},
		{"older by less than yieldAge", urgency{50, ms - yieldAge.Milliseconds() + 1}, b, 0, true},
		{"older by more than yieldAge", urgency{50, ms - yieldAge.Milliseconds() - 1}, b, 0, false},
		{"higher priority", urgency{70, ms}, b, 0, false},
		{"lower priority, older", urgency{10, ms - time.Hour.Milliseconds()}, b, 0, true},
		{"nobody else has work", urgency{50, ms}, heads{}, 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h, nodes, home := homeFixture()
			first, _ := h.reserve(nodes, nil, "a", tc.mine, tc.others, home, 16, now)
			for _, n := range first {
				n.Reserved = false
			}
			got, _ := h.reserve(nodes, nil, "a", tc.mine, tc.others, home, 16, now.Add(tc.later))
			if (len(got) > 0) != tc.want {
				t.Fatalf("reserved %d nodes, want any: %v", len(got), tc.want)
			}
		})
	}

	h, nodes, home := homeFixture()
	h.reserve(nodes, nil, "a", urgency{50, ms}, b, home, 16, now)
	for _, n := range nodes {
		n.Reserved = false
		n.RunningTasks = n.MaxTasks // full: its free clock stops
	}
	if got, _ := h.reserve(nodes, nil, "a", urgency{50, ms}, b, home, 16, now.Add(time.Second)); len(got) != 0 {
		t.Fatalf("full nodes reserved: %v", ids(got))
	}
	for _, n := range nodes {
		n.RunningTasks = 0
	}
	got, _ := h.reserve(nodes, nodes[:1], "a", urgency{50, ms}, b, home, 16, now.Add(2*time.Second))
	if len(got) == 0 {
		t.Fatal("nodes freed again: nothing reserved, want their clock restarted")
	}
	if got[0] == nodes[0] {
		t.Fatal("a skipped node (a due canary) was reserved")
	}
}

// TestRoundLeavesPreferredOwnersNodes: an owner's round does not plan on a
// node another owner with an equally old backlog prefers (the task stays
// PENDING, the next round is due by spillAfter), and does once its own task
// has waited yieldAge longer than the other owner's.
func TestRoundLeavesPreferredOwnersNodes(t *testing.T) {
	// Two shards: c1 owns 0, c2 owns 1. A node whose rendezvous order puts
	// c2 first.
	var nodeID string
	for i := 0; nodeID == ""; i++ {
		id := fmt.Sprintf("n%d", i)
		if shards.Rank([]string{"c1", "c2"}, shards.Of(id, 2), 2)[0] == "c2" {
			nodeID = id
		}
	}
	for _, tc := range []struct {
		name        string
		c1Submit    int64
		wantPlanned bool
	}{
		{"equal age", 10_000, false},
		{"c1 waited longer", 10_000 - yieldAge.Milliseconds() - 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newOwnerHarness(t)
			h.s = New(Deps{Region: "eu-west", Jurisdiction: "eu", CoordID: "c1", Placer: h.s.d.Placer, ShardCount: 2,
				Retention: -1, Commit: h.store, Log: h.s.d.Log, Metrics: h.metrics, Skipped: h.skipped,
				Owners: fixedOwners{0: "c1", 1: "c2"}}, ownedShardSet(map[int]shards.Epoch{0: 1}))
			h.s.refreshOwned()
			h.addNode(nodeID, 4000, 8192)
			for sh, submit := range map[int]int64{0: tc.c1Submit, 1: 10_000} {
				id := fmt.Sprintf("job-of-shard-%d", sh)
				spec := &apiaryv1.JobSpec{Name: id, Tasks: []*apiaryv1.TaskGroup{{Name: "g", Count: 1,
					Command: "true", Resources: &apiaryv1.Resources{CpuMillis: 1000, MemoryMb: 64}}}}
				h.store.put(store.KeyJob(sh, id), store.MustJSON(store.JobRecord{ID: id, Region: "eu-west", Spec: spec,
					SubmitMs: submit, TaskCount: 1}))
				tk := pending()
				tk.JobID = id
				h.store.put(store.KeyTask(sh, id, 0), store.MustJSON(&tk))
			}
			h.load()
			next, err := h.s.round(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			a, _ := h.assignment(nodeID, "job-of-shard-0", 0)
			if (a != nil) != tc.wantPlanned {
				t.Fatalf("c1 planned its task on %s (preferred by c2): %v, want %v", nodeID, a != nil, tc.wantPlanned)
			}
			if a2, _ := h.assignment(nodeID, "job-of-shard-1", 0); a2 != nil {
				t.Fatal("c1 planned c2's task")
			}
			if !tc.wantPlanned && next > spillAfter {
				t.Fatalf("next round in %v, want within spillAfter (%v)", next, spillAfter)
			}
			if n := h.s.snap.idx[nodeID]; n != nil && n.Reserved {
				t.Fatal("the Reserved flag outlived the round")
			}
		})
	}
}

// TestAntiAffinityScopeKeyConflict: a plan that places a member of a
// zone-scoped anti-affinity group compares the zone's scope key and
// rewrites it. When another owner placed a member in that zone first (the
// key moved past the cache's revision), the plan conflicts and the task
// stays PENDING, and it is not placed again until the watch delivers the
// key (with the other member beside it); a member of the group in another
// zone is placed meanwhile, and the node scope writes no key.
func TestAntiAffinityScopeKeyConflict(t *testing.T) {
	h := newOwnerHarness(t)
	for id, zone := range map[string]string{"n1": "a", "n2": "b"} {
		epoch := h.store.put(store.KeyNodeAlive(id), id)
		h.store.put(store.KeyNode(id), store.MustJSON(store.NodeRecord{ID: id, Epoch: epoch, Labels: map[string]string{"zone": zone},
			Capacity: &apiaryv1.Resources{CpuMillis: 4000, MemoryMb: 8192}}))
		h.store.put(store.KeyNodeUsage(id), store.MustJSON(store.UsageRecord{}))
	}
	member := func(id, scope string, submit int64) {
		spec := &apiaryv1.JobSpec{Name: id, Tasks: []*apiaryv1.TaskGroup{{Name: "g", Count: 1, Command: "true",
			Resources:    &apiaryv1.Resources{CpuMillis: 100, MemoryMb: 64},
			AntiAffinity: &apiaryv1.AntiAffinity{Group: "web", Scope: scope}}}}
		h.store.put(store.KeyJob(0, id), store.MustJSON(store.JobRecord{ID: id, Region: "eu-west", Spec: spec, SubmitMs: submit, TaskCount: 1}))
		tk := pending()
		tk.JobID = id
		h.store.put(store.KeyTask(0, id, 0), store.MustJSON(&tk))
	}
	member("w1", "zone", 1)
	h.load()
	// Another owner's member in zone a, committed after this cache loaded.
	zoneA := store.KeyAntiAffinity("web", "zone", "a")
	h.store.put(zoneA, "other-owner's task")
	// Bin-packing breaks the tie by id: n1 (zone a) is the engine's pick.
	if err := h.round(); err != nil {
		t.Fatal(err)
	}
	if tk := h.task("w1", 0); tk.State != apiaryv1.TaskState_TASK_STATE_PENDING || counterValue(h.metrics.PlanConflicts) != 1 {
		t.Fatalf("w1 after a plan into a scope another owner filled: %s, conflicts %v; want PENDING after 1 conflict",
			tk.State, counterValue(h.metrics.PlanConflicts))
	}
	if err := h.round(); err != nil {
		t.Fatal(err)
	}
	if tk := h.task("w1", 0); tk.State != apiaryv1.TaskState_TASK_STATE_PENDING {
		t.Fatalf("w1 placed before the watch delivered the scope key: %s on %s", tk.State, tk.NodeID)
	}
	h.s.cache.apply(h.store.get(zoneA), false) // the watch event (with the other member, not modelled here)
	if err := h.round(); err != nil {
		t.Fatal(err)
	}
	if tk := h.task("w1", 0); tk.State != apiaryv1.TaskState_TASK_STATE_ASSIGNED {
		t.Fatalf("w1 after the watch: %s, want ASSIGNED", tk.State)
	}
	zone := map[string]string{"n1": "a", "n2": "b"}[h.task("w1", 0).NodeID]
	kv := h.store.get(store.KeyAntiAffinity("web", "zone", zone))
	if kv == nil || string(kv.Value) != store.KeyTask(0, "w1", 0) {
		t.Fatalf("scope key of zone %s after the plan: %v, want w1's task key", zone, kv)
	}
	if h.s.cache.aaRev[store.KeyAntiAffinity("web", "zone", zone)] != kv.ModRevision {
		t.Fatal("the cache did not take the plan's scope key revision")
	}

	member("w2", "node", 2)
	h.load()
	if err := h.round(); err != nil {
		t.Fatal(err)
	}
	if tk := h.task("w2", 0); tk.State != apiaryv1.TaskState_TASK_STATE_ASSIGNED {
		t.Fatalf("w2 (node scope): %s, want ASSIGNED", tk.State)
	}
	for _, k := range h.store.keys(store.PrefAntiAffinity) {
		if strings.Contains(k, "/node/") {
			t.Fatalf("node scope wrote a scope key %s", k)
		}
	}
}

// TestScopeKeysOfGoneGroupsSwept: a round deletes the scope keys of
// anti-affinity groups no job names any more, and keeps those of groups a
// job still names.
func TestScopeKeysOfGoneGroupsSwept(t *testing.T) {
	h := newOwnerHarness(t)
	gone, kept := store.KeyAntiAffinity("old", "zone", "a"), store.KeyAntiAffinity("web", "zone", "a")
	h.store.put(gone, "a deleted job's task")
	h.store.put(kept, "a live job's task")
	spec := &apiaryv1.JobSpec{Name: "w", Tasks: []*apiaryv1.TaskGroup{{Name: "g", Count: 1, Command: "true",
		Resources: &apiaryv1.Resources{CpuMillis: 100, MemoryMb: 64}, AntiAffinity: &apiaryv1.AntiAffinity{Group: "web", Scope: "zone"}}}}
	h.store.put(store.KeyJob(0, "w"), store.MustJSON(store.JobRecord{ID: "w", Region: "eu-west", Spec: spec, SubmitMs: 1, TaskCount: 1}))
	tk := taskstate.Task{JobID: "w", State: apiaryv1.TaskState_TASK_STATE_COMPLETE}
	h.store.put(store.KeyTask(0, "w", 0), store.MustJSON(&tk))
	h.load()
	if err := h.round(); err != nil {
		t.Fatal(err)
	}
	if h.store.get(gone) != nil {
		t.Error("the scope key of a group no job names was kept")
	}
	if h.store.get(kept) == nil {
		t.Error("the scope key of a group a job names was deleted")
	}
}
