package placement

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// synthCluster builds n synthetic nodes: 3 jurisdictions, 16 zones, racks,
// a "cores" and a "kernel" label, a quarter of them with 4 or 8 GPUs of two
// models, part of each node already allocated.
func synthCluster(n int, seed uint64) *Snapshot {
	rng := rand.New(rand.NewPCG(seed, 1))
	snap := &Snapshot{}
	jur := []string{"eu", "us", "apac"}
	for i := 0; i < n; i++ {
		nd := &Node{ID: fmt.Sprintf("node-%06d", i), Labels: map[string]string{
			"jurisdiction": jur[rng.IntN(3)],
			"zone":         fmt.Sprintf("z%d", rng.IntN(16)),
			"rack":         fmt.Sprintf("r%d", rng.IntN(256)),
			"cores":        fmt.Sprint(16 << rng.IntN(3)),
			"kernel":       fmt.Sprintf("6.%d.0", rng.IntN(8)),
		}, Capacity: Resources{CPUMillis: 64000, MemoryMiB: 262144}}
		nd.Allocated = Resources{CPUMillis: int64(rng.IntN(32000)), MemoryMiB: int64(rng.IntN(131072))}
		if rng.IntN(4) == 0 {
			nd.Capacity.GPUs = 4 << rng.IntN(2)
			nd.GPUModel = []string{"A100", "T4"}[rng.IntN(2)]
		}
		if rng.IntN(200) == 0 {
			nd.Quarantined = true
		}
		if rng.IntN(20) == 0 {
			nd.Datasets = map[string]int64{"ds": 1 << 30}
		}
		snap.Nodes = append(snap.Nodes, nd)
	}
	return snap
}

// synthTasks builds a batch with mixed constraints and preferences: every
// task has a jurisdiction; about half a zone constraint, a third an
// affinity, a fifth a spread, a tenth a version constraint, distinct hosts
// or a GPU.
func synthTasks(k int, seed uint64) []Task {
	rng := rand.New(rand.NewPCG(seed, 2))
	var out []Task
	for i := 0; i < k; i++ {
		t := Task{ID: fmt.Sprintf("job-%d/%d", i/10, i%10), GroupKey: fmt.Sprintf("job-%d/g", i/10), Priority: rng.IntN(100),
			Request:       Resources{CPUMillis: int64(250 + rng.IntN(4000)), MemoryMiB: int64(256 + rng.IntN(8192))},
			Jurisdictions: []string{[]string{"eu", "us"}[rng.IntN(2)]}}
		if rng.IntN(2) == 0 {
			t.Constraints = append(t.Constraints, Constraint{Label: "zone", Op: "in", Values: []string{fmt.Sprintf("z%d", rng.IntN(16)), fmt.Sprintf("z%d", rng.IntN(16)), fmt.Sprintf("z%d", rng.IntN(16)), fmt.Sprintf("z%d", rng.IntN(16))}})
		}
		if rng.IntN(10) == 0 {
			t.Constraints = append(t.Constraints, Constraint{Label: "kernel", Op: "version", Values: []string{">= 6.2, < 7"}})
		}
		if rng.IntN(3) == 0 {
			t.Affinities = []Affinity{{Label: "cores", Op: ">", Values: []string{"20"}, Weight: 50}}
		}
		if rng.IntN(5) == 0 {
			t.Spreads = []Spread{{Label: "zone", Weight: 50}}
		}
		if rng.IntN(10) == 0 {
			t.DistinctHosts = true
		}
		if rng.IntN(10) == 0 {
			t.Datasets = []Dataset{{Name: "ds", SizeBytes: 1 << 30}}
		}
		if rng.IntN(10) == 0 {
			if rng.IntN(2) == 0 {
				t.Request.GPUs = 1
			} else {
				t.Request.GPUMilli = 250 + rng.IntN(500)
			}
		}
		out = append(out, t)
	}
	return out
}

// BenchmarkThroughput measures placements per second (one goroutine, so one
// core) for a batch of 1,000 tasks on 1k, 10k and 100k synthetic nodes, with
// the default candidate limit and with every feasible node scored. Without
// "/gen=1" the snapshot has no Generation, so every Place call rebuilds its
// label indexes and value codes (the worst case, a caller that never sets
// it); with "/gen=1" each call gets a fresh Snapshot value with the same
// Nodes and Generation, as the coordinator's rounds would, and the engine
// reuses them (the first, building call is before the timer).
func BenchmarkThroughput(b *testing.B) {
	for _, n := range []int{1000, 10000, 100000} {
		snap := synthCluster(n, 7)
		tasks := synthTasks(1000, 11)
		for _, limit := range []int{256, 64, 16, -1} {
			if limit < 0 && n > 10000 {
				continue // a full scan at 100k is too slow to be a useful benchmark
			}
			for _, gen := range []uint64{0, 1} {
				for _, pol := range []Policy{PolicyBinpack, PolicyFragmentation} {
					name := fmt.Sprintf("nodes=%d/limit=%d/policy=%s", n, limit, pol)
					if gen != 0 {
						name += "/gen=1"
					}
					b.Run(name, func(b *testing.B) {
						e := New(Options{Policy: pol, Seed: 1, CandidateLimit: limit})
						round := func() Plan {
							s := *snap
							s.Generation = gen
							return e.Place(&s, tasks)
						}
						if gen != 0 {
							round()
						}
						placed := 0
						b.ResetTimer()
						for i := 0; i < b.N; i++ {
							placed = len(round().Placements)
						}
						b.ReportMetric(float64(len(tasks))*float64(b.N)/b.Elapsed().Seconds(), "placements/s")
						b.ReportMetric(float64(placed), "placed/batch")
					})
				}
			}
		}
	}
}

// BenchmarkSmallBatch is the per-call cost a coordinator pays when only a few
// tasks are pending: 10 tasks per Place call (bin-pack, Generation set) on
// 10k and 100k synthetic nodes, so the work that grows with the node count
// rather than with the batch shows.
func BenchmarkSmallBatch(b *testing.B) {
	for _, n := range []int{10000, 100000} {
		snap := synthCluster(n, 7)
		tasks := synthTasks(10, 11)
		b.Run(fmt.Sprintf("nodes=%d/batch=10", n), func(b *testing.B) {
			e := New(Options{Policy: PolicyBinpack, Seed: 1})
			round := func() {
				s := *snap
				s.Generation = 1
				e.Place(&s, tasks)
			}
			round()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				round()
			}
			b.ReportMetric(float64(len(tasks))*float64(b.N)/b.Elapsed().Seconds(), "placements/s")
		})
	}
}

// preemptCluster is synthCluster with every node's allocation spelled out
// as existing allocations (4 per node, priorities 0-59, a third
// Guaranteed, a tenth BestEffort) and, when full, every node's CPU and
// memory taken, so that every task of priority 90 must preempt.
func preemptCluster(n int, full bool, seed uint64) *Snapshot {
	snap := synthCluster(n, seed)
	rng := rand.New(rand.NewPCG(seed, 3))
	for _, nd := range snap.Nodes {
		if full {
			nd.Allocated = Resources{CPUMillis: nd.Capacity.CPUMillis, MemoryMiB: nd.Capacity.MemoryMiB}
		}
		for k := range 4 {
			q := QoSBurstable
			switch rng.IntN(10) {
			case 0, 1, 2:
				q = QoSGuaranteed
			case 3:
				q = QoSBestEffort
			}
			snap.Existing = append(snap.Existing, Allocation{TaskID: fmt.Sprintf("%s/%d", nd.ID, k), GroupKey: fmt.Sprintf("old-%d/g", rng.IntN(1000)),
				NodeID: nd.ID, Priority: rng.IntN(60), QoS: q,
				Request: Resources{CPUMillis: nd.Allocated.CPUMillis / 4, MemoryMiB: nd.Allocated.MemoryMiB / 4}})
		}
	}
	return snap
}

// BenchmarkPreemption measures decisions per second (a placement, or an
// unplaced task with or without a preemption proposal) with preemption on,
// 10,000 nodes with 40,000 existing allocations, batch 1,000 at priority
// 90, bin-pack, Generation set, 16 and 64 preemption candidates: "full"
// (every node full: every task needs a preemption, at most one per node
// per call) and "mixed" (synthCluster's partial allocation; one task in
// ten asks for a whole node's CPU, so it places only by preempting).
func BenchmarkPreemption(b *testing.B) {
	for _, cands := range []int{16, 64} {
		for _, full := range []bool{true, false} {
			snap := preemptCluster(10000, full, 7)
			snap.Generation = 1
			tasks := synthTasks(1000, 11)
			for i := range tasks {
				tasks[i].Priority = 90
				if i%3 == 0 {
					tasks[i].QoS = QoSGuaranteed
				}
				if !full && i%10 == 0 {
					// A whole node's CPU: fits only where victims leave.
					tasks[i].Request.CPUMillis = 64000
				}
			}
			name := fmt.Sprintf("nodes=10000/existing=40000/candidates=%d/mixed", cands)
			if full {
				name = fmt.Sprintf("nodes=10000/existing=40000/candidates=%d/full", cands)
			}
			b.Run(name, func(b *testing.B) {
				e := New(Options{Policy: PolicyBinpack, Seed: 1, PreemptionCandidates: cands})
				e.Place(snap, tasks) // index build, before the timer
				var p Plan
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					s := *snap
					p = e.Place(&s, tasks)
				}
				b.ReportMetric(float64(len(tasks))*float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
				b.ReportMetric(float64(len(p.Placements)), "placed/batch")
				b.ReportMetric(float64(len(p.Preemptions)), "preemptions/batch")
				victims := 0
				for _, x := range p.Preemptions {
					victims += len(x.Evict)
				}
				b.ReportMetric(float64(victims), "victims/batch")
			})
		}
	}
}
