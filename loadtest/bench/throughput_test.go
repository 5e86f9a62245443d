package bench

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/regional/taskstate"
)

func TestBucketRows(t *testing.T) {
	rows := []revRow{
		{rev: 5, by: [8]int32{1}, pending: 10, live: 10},                                // before the window
		{rev: 11, by: [8]int32{2, 1}, complete: 1, pending: 8, live: 8},                 // interval 0
		{rev: 20, by: [8]int32{3}, complete: 2, pending: 3, live: 5},                    // interval 0 (= its bound)
		{rev: 35, by: [8]int32{1, 0, 0, 1, 0, 0, 2}, complete: 4, pending: 6, live: 10}, // interval 2
		{rev: 50, by: [8]int32{9}, complete: 9, pending: 0},                             // after the window
	}
	bounds := []revBound{{0, 10}, {5 * time.Second, 20}, {10 * time.Second, 30}, {15 * time.Second, 40}}
	got := bucketRows(rows, bounds)
	if len(got) != 3 {
		t.Fatalf("%d intervals, want 3", len(got))
	}
	want := []ThroughputInterval{
		{Index: 0, FromS: 0, ToS: 5, FromRev: 10, ToRev: 20, Completed: 3, Events: 6, TasksPerS: 0.6, PendingMin: 3, PendingEnd: 3, InFlightEnd: 2},
		{Index: 1, FromS: 5, ToS: 10, FromRev: 20, ToRev: 30, Completed: 0, Events: 0, TasksPerS: 0, PendingMin: 3, PendingEnd: 3, InFlightEnd: 2},
		{Index: 2, FromS: 10, ToS: 15, FromRev: 30, ToRev: 40, Completed: 4, Events: 4, TasksPerS: 0.8, PendingMin: 3, PendingEnd: 6, InFlightEnd: 4, ShardWrites: 2},
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("interval %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
	if got := bucketRows(nil, bounds[:1]); len(got) != 0 {
		t.Errorf("one bound: %d intervals, want 0", len(got))
	}
}

func TestThroughputRatio(t *testing.T) {
	// 2,000 tasks/s x 6 writes = 12,000 keys/s of a 30,000 keys/s ceiling.
	if got := throughputRatio(2000, 6, 30000); got != 0.4 {
		t.Errorf("ratio %v, want 0.4", got)
	}
	if got := throughputRatio(2000, 6, 0); got != 0 {
		t.Errorf("no ceiling: ratio %v, want 0", got)
	}
	r := ThroughputRun{CeilingKeysPerS: 30000, WritesPerTask: 6}
	if got := r.CeilingTasksPerS(); got != 5000 {
		t.Errorf("ceiling tasks/s %v, want 5000", got)
	}
}

func TestPartOf(t *testing.T) {
	for key, want := range map[string]string{
		"/apiary/tasks/00001/j/000001": "tasks", "/apiary/assign/n/j/1": "assign", "/apiary/results/00001/j/1/1": "results",
		"/apiary/nodes/n/alive": "nodes", "/apiary/jobs/00001/j": "jobs", "/apiary/dedup/c/r": "dedup",
		"/apiary/shards/00003/owner": "shards", "/apiary/members/c1": "other", "/apiary/meta": "other", "/elsewhere": "other",
	} {
		if got := throughputParts[tpPartOf(key)]; got != want {
			t.Errorf("%s: %s, want %s", key, got, want)
		}
	}
}

// TestThroughputWatchTask checks the watch's task accounting: a task
// counts once, from a creation the watch saw to COMPLETE; a rewrite after
// COMPLETE and a task created before the watch do not count.
func TestThroughputWatchTask(t *testing.T) {
	w := &throughputWatch{state: map[string]apiaryv1.TaskState{}}
	put := func(key string, create bool, state apiaryv1.TaskState, attempt int32) *clientv3.Event {
		b, _ := json.Marshal(taskstate.Task{State: state, Attempt: attempt})
		kv := &mvccpb.KeyValue{Key: []byte(key), Value: b, ModRevision: 2, CreateRevision: 2}
		if !create {
			kv.CreateRevision = 1
		}
		return &clientv3.Event{Type: clientv3.EventTypePut, Kv: kv}
	}
	var row revRow
	const (
		pending  = apiaryv1.TaskState_TASK_STATE_PENDING
		assigned = apiaryv1.TaskState_TASK_STATE_ASSIGNED
		complete = apiaryv1.TaskState_TASK_STATE_COMPLETE
	)
	w.task(&row, "a", put("a", true, pending, 0))
	w.task(&row, "b", put("b", true, pending, 0))
	w.task(&row, "old", put("old", false, assigned, 1)) // created before the watch
	if w.pending != 2 {
		t.Fatalf("pending %d, want 2", w.pending)
	}
	w.task(&row, "a", put("a", false, assigned, 1))
	w.task(&row, "a", put("a", false, pending, 1)) // refused: back to PENDING
	w.task(&row, "a", put("a", false, assigned, 2))
	w.task(&row, "a", put("a", false, complete, 2))
	w.task(&row, "a", put("a", false, complete, 2)) // rewritten once terminal
	w.task(&row, "old", put("old", false, complete, 1))
	if row.complete != 1 || row.retried != 1 || w.finished.Load() != 1 || w.pending != 1 {
		t.Errorf("complete %d retried %d finished %d pending %d, want 1 1 1 1", row.complete, row.retried, w.finished.Load(), w.pending)
	}
	w.task(&row, "b", &clientv3.Event{Type: clientv3.EventTypeDelete, Kv: &mvccpb.KeyValue{Key: []byte("b"), ModRevision: 3}})
	if w.pending != 0 || len(w.state) != 0 {
		t.Errorf("after delete: pending %d, %d tracked, want 0 0", w.pending, len(w.state))
	}
}

// TestWriteThroughput writes the CSVs, the PNG and the section for one
// good and one failed run.
func TestWriteThroughput(t *testing.T) {
	dir := t.TempDir()
	good := ThroughputRun{Run: 1, WindowS: 10, Completed: 20000, TasksPerS: 2000, Events: 120000, WritesPerTask: 6,
		EventsBy: map[string]int64{"tasks": 60000, "shards": 0}, CeilingKeysPerS: 30000, Ratio: 0.4, PendingMin: 100, LiveStart: 5000, LiveEnd: 9000,
		Intervals: []ThroughputInterval{{Index: 0, FromS: 0, ToS: 5, Completed: 10000, TasksPerS: 2000}, {Index: 1, FromS: 5, ToS: 10, Completed: 10000, TasksPerS: 2000}},
		Coords:    []ProcUsage{{ID: "c1", CPU: 5}}}
	md, err := WriteThroughput(dir, ThroughputResult{Options: DefaultThroughput, Runs: []ThroughputRun{good, {Run: 2, Err: "boom"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| 1 | 20,000 | 2,000 | 6.00 |", "| 2 | failed: boom", "ratio 0.400", "Backlog not steady", "not met"} {
		if !strings.Contains(md, want) {
			t.Errorf("section lacks %q:\n%s", want, md)
		}
	}
	for _, f := range []string{"throughput.csv", "throughput-intervals.csv", "throughput.png"} {
		if fi, err := os.Stat(filepath.Join(dir, f)); err != nil || fi.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
}
