package placement_test

import (
	"fmt"

	"apiary.dev/apiary/placement"
)

// Place a batch on a snapshot of the region's nodes: the plan says where
// each task goes, and why a task goes nowhere. Binpack fills the busier node
// first; the constraint keeps the GPU-less task off the gpu pool.
func Example() {
	snap := &placement.Snapshot{Generation: 1, Nodes: []*placement.Node{
		{ID: "a", Labels: map[string]string{"pool": "cpu"},
			Capacity:  placement.Resources{CPUMillis: 8000, MemoryMiB: 16384},
			Allocated: placement.Resources{CPUMillis: 4000, MemoryMiB: 8192}, RunningTasks: 2},
		{ID: "b", Labels: map[string]string{"pool": "cpu"},
			Capacity: placement.Resources{CPUMillis: 8000, MemoryMiB: 16384}},
		{ID: "g", Labels: map[string]string{"pool": "gpu"},
			Capacity: placement.Resources{CPUMillis: 8000, MemoryMiB: 16384, GPUs: 2}},
	}}
	cpuOnly := []placement.Constraint{{Label: "pool", Op: "=", Values: []string{"cpu"}}}
	tasks := []placement.Task{
		{ID: "web/0", GroupKey: "web", Request: placement.Resources{CPUMillis: 2000, MemoryMiB: 2048}, Constraints: cpuOnly},
		{ID: "train/0", GroupKey: "train", Request: placement.Resources{CPUMillis: 1000, MemoryMiB: 1024, GPUs: 1}},
		{ID: "huge/0", GroupKey: "huge", Request: placement.Resources{CPUMillis: 64000, MemoryMiB: 1024}},
	}
	plan := placement.New(placement.Options{Policy: placement.PolicyBinpack, Seed: 1}).Place(snap, tasks)
	for _, p := range plan.Placements {
		fmt.Println(p.TaskID, "->", p.NodeID, p.GPUIndices)
	}
	for _, u := range plan.Unplaced {
		fmt.Println(u.TaskID, "unplaced:", u.Reason)
	}
	// Output:
	// web/0 -> a []
	// train/0 -> g [0]
	// huge/0 unplaced: cpu: 3 nodes
}
