package scheduler

import (
	"fmt"
	"runtime"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/regional/taskstate"
)

// BenchmarkOwnerCacheMemoryPerTask measures what a coordinator holds per
// task record in its scheduling loop's watch cache (ownerCache) with the
// job index beside it: heap bytes after a GC, per task, for n tasks in
// jobs of 1,000 (one group each), every task COMPLETE after one attempt on
// one of 1,000 nodes (the shape a region holds most of under retention
// off). Reported as the B/task metric; ns/op is the load time of the n
// records. Run: go test -run '^$' -bench OwnerCacheMemory ./regional/scheduler
func BenchmarkOwnerCacheMemoryPerTask(b *testing.B) {
	for _, n := range []int{10_000, 100_000, 1_000_000} {
		b.Run(fmt.Sprintf("tasks=%d", n), func(b *testing.B) {
			for range b.N {
				kvs := taskKVs(n)
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				c := newOwnerCache(nil)
				c.index = NewJobIndex()
				for _, kv := range kvs {
					c.apply(kv, false)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(n), "B/task")
				if len(c.tasks) != n {
					b.Fatalf("cache holds %d tasks, want %d", len(c.tasks), n)
				}
				runtime.KeepAlive(c)
				runtime.KeepAlive(kvs) // held across both reads: only the cache differs
			}
		})
	}
}

// taskKVs is n task records (and their jobs' records, 1,000 tasks each) as
// the watch delivers them.
func taskKVs(n int) []*mvccpb.KeyValue {
	var kvs []*mvccpb.KeyValue
	rev := int64(1)
	for i := 0; i < n; i++ {
		job := fmt.Sprintf("eu-west-%020d", i/1000)
		if i%1000 == 0 {
			spec := &apiaryv1.JobSpec{Name: job, Tasks: []*apiaryv1.TaskGroup{{Name: "g", Count: 1000,
				Command: "/bin/true", Resources: &apiaryv1.Resources{CpuMillis: 100, MemoryMb: 16}}}}
			rec := store.JobRecord{ID: job, Region: "eu-west", Spec: spec, SubmitMs: 1, TaskCount: 1000}
			kvs = append(kvs, &mvccpb.KeyValue{Key: []byte(store.KeyJob(i/1000%256, job)), Value: []byte(store.MustJSON(rec)), ModRevision: rev, CreateRevision: rev})
			rev++
		}
		t := taskstate.Task{JobID: job, Index: int32(i % 1000), State: apiaryv1.TaskState_TASK_STATE_COMPLETE, Attempt: 1, Used: 1,
			NodeID: fmt.Sprintf("node-%04d", i%1000), NodeEpoch: 1234567, FencingToken: rev, AssignedMs: 1_764_000_000_000,
			StartedMs: 1_764_000_000_100, FinishedMs: 1_764_000_000_200}
		kvs = append(kvs, &mvccpb.KeyValue{Key: []byte(store.KeyTask(i/1000%256, job, int32(i%1000))), Value: []byte(store.MustJSON(&t)), ModRevision: rev, CreateRevision: rev})
		rev++
	}
	return kvs
}
