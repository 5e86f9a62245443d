package sim

import (
	"math"
	"math/rand/v2"
	"time"

	"apiary.dev/apiary/placement"
)

// Config is one simulation run.
type Config struct {
	Policy placement.Policy
	// Seed shuffles and samples the trace and seeds the engine.
	Seed int64
	// ArrivalPct is the total GPU request to replay, in percent of the
	// cluster's GPU capacity. 0 means 130 (the FGD paper's setting).
	ArrivalPct float64
	// CandidateLimit is passed to the engine. 0 means -1: every feasible
	// node is scored, as in the published method.
	CandidateLimit int
	// Workload for the fragmentation score and metric; nil means
	// placement.WorkloadFromTasks of the trace (FGD's "typical pods").
	Workload []placement.WorkloadClass
	// FragModel is passed to the engine ("" = hybrid).
	FragModel placement.FragModel
	// ScarcityWeight is passed to the engine (0 = its default).
	ScarcityWeight float64
	// PackingWeight is passed to the engine (0 = its default, negative =
	// off).
	PackingWeight float64
	// Now times the run for placements per second; nil means time.Now.
	Now func() time.Time
	// Observe, if set, sees every task after its placement try, with the
	// arrived GPU demand so far (milli, including this task) and the
	// cluster's GPU capacity (milli).
	Observe func(t *placement.Task, r placement.Result, arrivedMilli, capMilli int64)
}

// Result is the outcome of one run. Percentages are 0..100.
type Result struct {
	Policy placement.Policy `json:"policy"`
	Seed   int64            `json:"seed"`
	// Arrived is the number of tasks replayed, Placed how many fitted.
	Arrived int `json:"arrived"`
	Placed  int `json:"placed"`
	// At the moment the arrived GPU demand first reaches 100% of capacity:
	// allocated / capacity for GPU (milli), CPU and memory, and the
	// expected GPU fragmentation Σ_n F_n(M) / GPU capacity.
	GPUAllocPctAt100 float64 `json:"gpu_alloc_pct_at_100"`
	CPUAllocPctAt100 float64 `json:"cpu_alloc_pct_at_100"`
	MemAllocPctAt100 float64 `json:"mem_alloc_pct_at_100"`
	FragGPUPctAt100  float64 `json:"frag_gpu_pct_at_100"`
	// GPUAllocPctEnd is the GPU allocation after the whole arrival.
	GPUAllocPctEnd float64 `json:"gpu_alloc_pct_end"`
	// PlacementsPerSec is tasks tried per second of engine time.
	PlacementsPerSec float64 `json:"placements_per_s"`
}

// GPUNodes returns the nodes with at least one GPU (the published method
// simulates the trace's 1,213 GPU nodes).
func GPUNodes(nodes []*placement.Node) []*placement.Node {
	var out []*placement.Node
	for _, n := range nodes {
		if n.Capacity.GPUs > 0 {
			out = append(out, n)
		}
	}
	return out
}

// Arrivals builds the arrival sequence: trace shuffled with seed, then tasks
// drawn uniformly with replacement until the total GPU request reaches
// arrivalPct of gpuCapMilli.
func Arrivals(trace []placement.Task, seed int64, arrivalPct float64, gpuCapMilli int64) []placement.Task {
	rng := rand.New(rand.NewPCG(uint64(seed), 0x5eed))
	seq := make([]placement.Task, len(trace))
	copy(seq, trace)
	rng.Shuffle(len(seq), func(i, j int) { seq[i], seq[j] = seq[j], seq[i] })
	target := int64(math.Ceil(arrivalPct / 100 * float64(gpuCapMilli)))
	var sum int64
	for i := range seq {
		sum += gpuMilli(seq[i].Request)
	}
	if len(trace) > 0 && sum > 0 {
		for sum < target {
			t := trace[rng.IntN(len(trace))]
			seq = append(seq, t)
			sum += gpuMilli(t.Request)
		}
	}
	return seq
}

func gpuMilli(r placement.Resources) int64 {
	return int64(r.GPUs)*1000 + int64(r.GPUMilli)
}

// Run replays trace onto nodes under cfg.
func Run(nodes []*placement.Node, trace []placement.Task, cfg Config) Result {
	if cfg.ArrivalPct == 0 {
		cfg.ArrivalPct = 130
	}
	if cfg.CandidateLimit == 0 {
		cfg.CandidateLimit = -1
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	wl := cfg.Workload
	if wl == nil {
		wl = placement.WorkloadFromTasks(trace)
	}
	var gpuCap, cpuCap, memCap int64
	for _, n := range nodes {
		gpuCap += int64(n.Capacity.GPUs) * 1000
		cpuCap += n.Capacity.CPUMillis
		memCap += n.Capacity.MemoryMiB
	}
	seq := Arrivals(trace, cfg.Seed, cfg.ArrivalPct, gpuCap)
	eng := placement.NewEngine(placement.Options{Policy: cfg.Policy, Seed: cfg.Seed,
		CandidateLimit: cfg.CandidateLimit, Workload: wl, DisablePreemption: true, FragModel: cfg.FragModel,
		ScarcityWeight: cfg.ScarcityWeight, PackingWeight: cfg.PackingWeight})
	snap := &placement.Snapshot{Nodes: nodes}
	sess := eng.NewSession(snap, nil)

	res := Result{Policy: cfg.Policy, Seed: cfg.Seed, Arrived: len(seq)}
	var arrived, gpuAlloc, cpuAlloc, memAlloc int64
	var spent time.Duration
	recorded := false
	for k := range seq {
		t := &seq[k]
		t0 := cfg.Now()
		r := sess.PlaceOne(t)
		spent += cfg.Now().Sub(t0)
		arrived += gpuMilli(t.Request)
		if cfg.Observe != nil {
			cfg.Observe(t, r, arrived, gpuCap)
		}
		if r.Placement != nil {
			res.Placed++
			gpuAlloc += gpuMilli(t.Request)
			cpuAlloc += t.Request.CPUMillis
			memAlloc += t.Request.MemoryMiB
		}
		if !recorded && gpuCap > 0 && arrived >= gpuCap {
			recorded = true
			res.GPUAllocPctAt100 = pct(gpuAlloc, gpuCap)
			res.CPUAllocPctAt100 = pct(cpuAlloc, cpuCap)
			res.MemAllocPctAt100 = pct(memAlloc, memCap)
			res.FragGPUPctAt100 = 100 * sess.Fragmentation() / float64(gpuCap)
		}
	}
	res.GPUAllocPctEnd = pct(gpuAlloc, gpuCap)
	if s := spent.Seconds(); s > 0 {
		res.PlacementsPerSec = float64(len(seq)) / s
	}
	return res
}

func pct(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}

// Summary aggregates runs of one policy over seeds.
type Summary struct {
	Policy placement.Policy `json:"policy"`
	N      int              `json:"n"`
	// Means over the runs, and the sample standard deviation, min and max
	// of the GPU allocation at 100% arrival.
	GPUAllocPctAt100 float64 `json:"gpu_alloc_pct_at_100"`
	GPUAllocStd      float64 `json:"gpu_alloc_pct_at_100_std"`
	GPUAllocMin      float64 `json:"gpu_alloc_pct_at_100_min"`
	GPUAllocMax      float64 `json:"gpu_alloc_pct_at_100_max"`
	CPUAllocPctAt100 float64 `json:"cpu_alloc_pct_at_100"`
	MemAllocPctAt100 float64 `json:"mem_alloc_pct_at_100"`
	FragGPUPctAt100  float64 `json:"frag_gpu_pct_at_100"`
	PlacementsPerSec float64 `json:"placements_per_s"`
}

// Summarize aggregates runs (all of one policy).
func Summarize(runs []Result) Summary {
	var s Summary
	s.N = len(runs)
	if s.N == 0 {
		return s
	}
	s.Policy = runs[0].Policy
	s.GPUAllocMin, s.GPUAllocMax = math.Inf(1), math.Inf(-1)
	for _, r := range runs {
		s.GPUAllocPctAt100 += r.GPUAllocPctAt100
		s.CPUAllocPctAt100 += r.CPUAllocPctAt100
		s.MemAllocPctAt100 += r.MemAllocPctAt100
		s.FragGPUPctAt100 += r.FragGPUPctAt100
		s.PlacementsPerSec += r.PlacementsPerSec
		s.GPUAllocMin = math.Min(s.GPUAllocMin, r.GPUAllocPctAt100)
		s.GPUAllocMax = math.Max(s.GPUAllocMax, r.GPUAllocPctAt100)
	}
	n := float64(s.N)
	s.GPUAllocPctAt100 /= n
	s.CPUAllocPctAt100 /= n
	s.MemAllocPctAt100 /= n
	s.FragGPUPctAt100 /= n
	s.PlacementsPerSec /= n
	if s.N > 1 {
		var v float64
		for _, r := range runs {
			d := r.GPUAllocPctAt100 - s.GPUAllocPctAt100
			v += d * d
		}
		s.GPUAllocStd = math.Sqrt(v / (n - 1))
	}
	return s
}
