package scheduler

import (
	"context"
	"fmt"
	"testing"
	"time"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/regional/taskstate"
)

// TestRetentionDeletesInBoundedBatches: jobs finished before the cutoff
// go, each in whole (record and tasks in one Txn), at most
// maxRetentionKeys keys per sweep beyond the first job; a job with a task
// still running, or finished after the cutoff, stays.
func TestRetentionDeletesInBoundedBatches(t *testing.T) {
	h := newOwnerHarness(t)
	h.s.d.Retention = time.Hour
	now := time.Now()
	old := now.Add(-2 * time.Hour).UnixMilli()
	done := func(finishedMs int64) taskstate.Task {
		return taskstate.Task{State: apiaryv1.TaskState_TASK_STATE_COMPLETE, FinishedMs: finishedMs}
	}
	tasks := func(n int, t taskstate.Task) []taskstate.Task {
		out := make([]taskstate.Task, n)
		for i := range out {
			out[i] = t
		}
		return out
	}
	// Three old jobs of 3,000 tasks (6,002 keys each by the estimate): one
	// per sweep. Ten small old jobs fit beside one of them.
	for i := range 3 {
		h.addJob(fmt.Sprintf("big%d", i), 100, false, tasks(3000, done(old))...)
	}
	for i := range 10 {
		h.addJob(fmt.Sprintf("small%d", i), 100, false, tasks(2, done(old))...)
	}
	h.addJob("running", 100, false, append(tasks(5, done(old)), taskstate.Task{State: apiaryv1.TaskState_TASK_STATE_RUNNING, NodeID: "n1"})...)
	h.addJob("recent", 100, false, tasks(5, done(now.UnixMilli()))...)
	h.load()

	var bigsPerSweep []int
	for sweep := 0; sweep < 10; sweep++ {
		before := len(h.store.keys(store.PrefTasks))
		if err := h.s.sweepRetention(context.Background(), now); err != nil {
			t.Fatal(err)
		}
		deleted := before - len(h.store.keys(store.PrefTasks))
		if deleted == 0 {
			break
		}
		if deleted > maxRetentionKeys {
			t.Fatalf("sweep %d deleted %d task keys, bound %d", sweep, deleted, maxRetentionKeys)
		}
		bigsPerSweep = append(bigsPerSweep, deleted/3000)
	}
	if len(bigsPerSweep) != 3 {
		t.Fatalf("big jobs deleted per sweep %v: want one in each of 3 sweeps", bigsPerSweep)
	}
	for _, id := range []string{"big0", "big1", "big2", "small0", "small9"} {
		if h.store.get(store.KeyJob(0, id)) != nil || len(h.store.keys(store.PrefJobTasks(0, id))) != 0 {
			t.Errorf("%s (finished 2 h ago, retention 1 h) is still stored", id)
		}
		if _, ok := h.s.cache.jobDone[id]; ok {
			t.Errorf("%s still counted in the cache", id)
		}
	}
	for _, id := range []string{"running", "recent"} {
		if h.store.get(store.KeyJob(0, id)) == nil || len(h.store.keys(store.PrefJobTasks(0, id))) == 0 {
			t.Errorf("%s was deleted: it has a running task or finished within the retention", id)
		}
	}
}
