package scheduler

import (
	"fmt"
	"maps"
	"testing"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/regional/store"
)

// TestShardCountsFollowTasks: the cache's per-shard counts (which the
// gauges and ListShards read instead of walking every task) equal a full
// recount after placements, deletions and a job's removal.
func TestShardCountsFollowTasks(t *testing.T) {
	h := newOwnerHarness(t)
	h.addNode("n1", 2000, 4096)
	for i := range 6 {
		h.addJob(fmt.Sprintf("j%d", i), 500, false, pending(), pending())
	}
	h.load()
	check := func(when string) {
		t.Helper()
		want := map[int]map[apiaryv1.TaskState]int{}
		var last int64
		for _, ct := range h.s.cache.tasks {
			if want[ct.shard] == nil {
				want[ct.shard] = map[apiaryv1.TaskState]int{}
			}
			want[ct.shard][ct.rec.State]++
			last = max(last, ct.rec.AssignedMs)
		}
		for sh, sc := range h.s.cache.shardTasks {
			if len(sc.states) == 0 {
				continue
			}
			if !maps.Equal(sc.states, want[sh]) {
				t.Fatalf("%s: shard %d counts %v, recount %v", when, sh, sc.states, want[sh])
			}
			delete(want, sh)
		}
		if len(want) != 0 {
			t.Fatalf("%s: shards %v missing from the counts", when, want)
		}
		if sc := h.s.cache.shardTasks[0]; last > 0 && (sc == nil || sc.lastAssigned != last) {
			t.Fatalf("%s: last assigned %v, want %d", when, sc, last)
		}
	}
	check("loaded")
	if err := h.round(); err != nil {
		t.Fatal(err)
	}
	check("after a round (4 of 12 placed)")
	h.watchDelete(store.KeyTask(0, "j0", 1))
	check("after a task's deletion")
	h.s.cache.removeJob("j1")
	check("after a job's removal")
}
