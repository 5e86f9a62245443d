package scheduler

import (
	"fmt"
	"testing"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/regional/taskstate"
)

// benchScheduler fills a scheduler's caches (no etcd) with nodes ready
// nodes and perNode running tasks on each, in jobs of 100 tasks.
func benchScheduler(nodes, perNode int) *Loop {
	s := New(Deps{Jurisdiction: "eu"}, NewShardSet())
	c := s.cache
	spec := &apiaryv1.JobSpec{Tasks: []*apiaryv1.TaskGroup{{Name: "g", Count: 100,
		Resources: &apiaryv1.Resources{CpuMillis: 500, MemoryMb: 512}}}}
	k := 0
	for i := 0; i < nodes; i++ {
		id := fmt.Sprintf("node-%06d", i)
		c.nodes[id] = &cNode{id: id, NodeView: store.NodeView{Alive: 1, Rec: &store.NodeRecord{ID: id, Epoch: 1,
			Labels:   map[string]string{"zone": fmt.Sprintf("z%d", i%16)},
			Capacity: &apiaryv1.Resources{CpuMillis: 64000, MemoryMb: 262144}}}}
		for j := 0; j < perNode; j++ {
			jobID := fmt.Sprintf("job-%d", k/100)
			if c.jobs[jobID] == nil {
				c.jobs[jobID] = &cJob{rec: store.JobRecord{ID: jobID, Spec: spec}}
			}
			key := fmt.Sprintf("%s/%d", jobID, k%100)
			c.setTask(key, &cTask{key: key, rec: taskstate.Task{JobID: jobID, Index: int32(k % 100),
				State: apiaryv1.TaskState_TASK_STATE_RUNNING, NodeID: id, NodeEpoch: 1}})
			k++
		}
	}
	return s
}

// BenchmarkRoundSnapshot measures the per-round cost of building the
// placement input from the scheduler's cache at 1k and 10k nodes with 10
// running tasks per node: "rebuild" after a node change (every node's usage
// recomputed from its tasks), "round" after 10 tasks on 10 nodes changed
// (the common case), and "existing" the existing allocations of a batch of
// one job's group (100 tasks). It is the part of a scheduling round that
// grows with the region, whatever the batch size.
func BenchmarkRoundSnapshot(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		s := benchScheduler(n, 10)
		name := fmt.Sprintf("nodes=%d/tasks=%d", n, n*10)
		b.Run(name+"/rebuild", func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				s.cache.nodesGen++
				s.snap.build()
			}
		})
		b.Run(name+"/round", func(b *testing.B) {
			s.snap.build()
			keys := make([]string, 0, 10)
			for key := range s.cache.jobTasks["job-0"] {
				keys = append(keys, key)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for _, key := range keys[:10] {
					s.cache.setTask(key, s.cache.tasks[key])
				}
				s.snap.build()
			}
		})
		b.Run(name+"/existing", func(b *testing.B) {
			batch := []*cTask{s.cache.tasks["job-0/0"]}
			for i := 0; i < b.N; i++ {
				if got := len(s.snap.existing(batch)); got != 100 {
					b.Fatalf("existing: %d allocations, want 100", got)
				}
			}
		})
	}
}

func TestGPULayout(t *testing.T) {
	for _, c := range []struct {
		gpus, whole int
		shares      []int
		want        []int
	}{
		{2, 0, nil, []int{1000, 1000}},
		{2, 1, nil, []int{0, 1000}},
		{4, 2, []int{300, 600, 500}, []int{0, 0, 100, 500}},
		{2, 3, nil, []int{0, 0}},            // over-committed: no device left
		{1, 0, []int{700, 700}, []int{300}}, // the second share fits nowhere
	} {
		got := gpuLayout(c.gpus, nil, c.whole, c.shares)
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("gpuLayout(%d, %d, %v) = %v, want %v", c.gpus, c.whole, c.shares, got, c.want)
		}
	}
	// Recorded devices are taken as recorded, before the inferred ones.
	placed := []gpuHold{{devices: []int32{1}}, {devices: []int32{3}, milli: 250}, {devices: []int32{9}}}
	if got := fmt.Sprint(gpuLayout(4, placed, 1, []int{700})); got != "[0 0 1000 50]" {
		t.Errorf("gpuLayout with recorded devices = %s, want [0 0 1000 50]", got)
	}
}

// TestSnapshotFollowsTaskChanges: the kept snapshot sees a task change on a
// node even when another reader of the usage cache (syncUsage) consumed the
// node's dirty flag first.
func TestSnapshotFollowsTaskChanges(t *testing.T) {
	s := benchScheduler(3, 2)
	running := func() int {
		for _, pn := range s.snap.build().Nodes {
			if pn.ID == "node-000000" {
				return pn.RunningTasks
			}
		}
		t.Fatal("node-000000 not in the snapshot")
		return 0
	}
	if got := running(); got != 2 {
		t.Fatalf("running tasks %d, want 2", got)
	}
	s.cache.setTask("job-0/0", nil) // a task on node-000000 ends
	s.snap.usage(s.cache.nodes["node-000000"])
	if got := running(); got != 1 {
		t.Fatalf("after a task ended and the usage was read elsewhere: running tasks %d, want 1", got)
	}
	s.cache.nodesGen++ // a node change rebuilds the list
	if got := running(); got != 1 {
		t.Fatalf("after a rebuild: running tasks %d, want 1", got)
	}
}

// TestUsageCountsShares: a node's usage record (what `node list` shows)
// sums its tasks' GPU shares besides its whole GPUs.
func TestUsageCountsShares(t *testing.T) {
	s := benchScheduler(1, 0)
	n := s.cache.nodes["node-000000"]
	n.Rec.Capacity.Gpus = 3
	for i, r := range []*apiaryv1.Resources{{Gpus: 1}, {GpuMilli: 470}, {GpuMilli: 650}} {
		jobID := fmt.Sprintf("gpu-%d", i)
		s.cache.jobs[jobID] = &cJob{rec: store.JobRecord{ID: jobID, Spec: &apiaryv1.JobSpec{Tasks: []*apiaryv1.TaskGroup{{Name: "g", Count: 1, Resources: r}}}}}
		key := jobID + "/0"
		s.cache.setTask(key, &cTask{key: key, rec: taskstate.Task{JobID: jobID, State: apiaryv1.TaskState_TASK_STATE_RUNNING, NodeID: n.id, NodeEpoch: 1}})
	}
	u := s.snap.usedBy(n, nil)
	if u.GPUs != 1 || u.GPUMilli != 1120 || u.Tasks != 3 {
		t.Fatalf("usage %+v, want 1 whole GPU, 1120 milli of shares, 3 tasks", u.UsageRecord)
	}
}
