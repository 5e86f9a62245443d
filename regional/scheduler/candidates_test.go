package scheduler

import (
	"fmt"
	"testing"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/regional/store"
)

// addUrgencyJob stores a job of count pending tasks of cpuMillis each at
// priority pri, submitted at submitMs (shard 0).
func (h *ownerHarness) addUrgencyJob(id string, pri int32, submitMs, cpuMillis int64, count int) {
	spec := &apiaryv1.JobSpec{Name: id, Priority: pri, Tasks: []*apiaryv1.TaskGroup{{Name: "g", Count: int32(count),
		Command: "true", Resources: &apiaryv1.Resources{CpuMillis: cpuMillis, MemoryMb: 64}}}}
	h.store.put(store.KeyJob(0, id), store.MustJSON(store.JobRecord{ID: id, Region: "eu-west", Spec: spec, SubmitMs: submitMs,
		TaskCount: int32(count)}))
	for i := range count {
		t := pending()
		t.JobID, t.Index = id, int32(i)
		h.store.put(store.KeyTask(0, id, int32(i)), store.MustJSON(&t))
	}
}

// A round under a backlog far past the region's room takes this owner's
// jobs most urgent first: a later job of higher priority before older ones,
// a group that cannot fit anywhere explained once without blocking the
// smaller jobs behind it, and, once the room is taken and every
// explanation used, the jobs past the cut are not looked at.
func TestRoundTakesMostUrgentJobsFirstAndStopsAtTheCut(t *testing.T) {
	h := newOwnerHarness(t)
	h.addNode("n1", 1000, 8192) // room for ten 100 m tasks
	const backlog = 200
	for i := range backlog {
		h.addUrgencyJob(fmt.Sprintf("b%03d", i), 20, int64(1000+i), 100, 50)
	}
	h.addUrgencyJob("urgent-big", 90, 5000, 2000, 3) // fits on no node
	h.addUrgencyJob("std", 50, 6000, 100, 4)
	h.load()
	if err := h.round(); err != nil {
		t.Fatalf("round: %v", err)
	}
	assigned := map[string]int{}
	jobs := map[string]int{"urgent-big": 3, "std": 4}
	for i := range backlog {
		jobs[fmt.Sprintf("b%03d", i)] = 50
	}
	for job, count := range jobs {
		for k := range count {
			if h.task(job, int32(k)).State == apiaryv1.TaskState_TASK_STATE_ASSIGNED {
				assigned[job]++
			}
		}
	}
	total := 0
	for job, n := range assigned {
		total += n
		if job != "std" && job >= fmt.Sprintf("b%03d", maxExplain) {
			t.Fatalf("job %s (past the cut) got %d placements: %v", job, n, assigned)
		}
	}
	if total != 10 || assigned["std"] != 4 || assigned["urgent-big"] != 0 {
		t.Fatalf("placements by job %v: want 10 in all, std's 4 (priority 50 over older batch jobs; the urgent job that fits nowhere does not block it)", assigned)
	}
	if _, ok := h.s.reasons.unplacedSince[store.KeyTask(0, "urgent-big", 0)]; !ok {
		t.Fatal("the urgent job that fits nowhere was not explained")
	}
	// The cost: a task is grouped (its group key made) only when the round
	// looks at it. Past the cut (the room taken by std and b000, then one
	// explanation each for urgent-big and b001-b063) nothing was.
	looked := 0
	for i := range backlog {
		for k := range 50 {
			ct := h.s.cache.tasks[store.KeyTask(0, fmt.Sprintf("b%03d", i), int32(k))]
			if ct.gk == "" {
				continue
			}
			if i >= maxExplain {
				t.Fatalf("task b%03d/%d, past the cut (after b%03d), was looked at", i, k, maxExplain-1)
			}
			looked++
		}
	}
	if looked == 0 {
		t.Fatal("no pending batch task before the cut was looked at")
	}
}

// BenchmarkPlaceRoundBacklog is one scheduling round of an owner whose
// nodes are full (100 nodes of ten tasks, filled by a first round), under a backlog of n pending tasks in jobs of
// 100: the round's cost should follow the jobs (a sort) and the room, not
// n. Run: go test -run '^$' -bench PlaceRoundBacklog ./regional/scheduler
func BenchmarkPlaceRoundBacklog(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("pending=%d", n), func(b *testing.B) {
			h := newOwnerHarness(&testing.T{})
			for i := range 100 {
				id := fmt.Sprintf("n%03d", i)
				h.addNode(id, 1000, 8192)
			}
			for j := range n / 100 {
				h.addUrgencyJob(fmt.Sprintf("j%05d", j), 20, int64(j), 100, 100)
			}
			h.load()
			if err := h.round(); err != nil { // fills every node: 1,000 tasks
				b.Fatal(err)
			}
			b.ResetTimer()
			for range b.N {
				if err := h.round(); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if len(h.s.cache.pending) != n-1000 {
				b.Fatalf("pending %d after the rounds, want %d (nothing fits after the first)", len(h.s.cache.pending), n-1000)
			}
		})
	}
}
