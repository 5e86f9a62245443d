package placement

import (
	"math"
	"strings"
	"testing"
)

func TestScores(t *testing.T) {
	req := Resources{CPUMillis: 1000, MemoryMiB: 1000}
	twoNodes := func() []*Node {
		a := node("full", 4000, 4000, 0, map[string]string{"zone": "a", "rack": "r1"})
		a.Allocated = Resources{CPUMillis: 2000, MemoryMiB: 2000}
		b := node("empty", 4000, 4000, 0, map[string]string{"zone": "b", "rack": "r2"})
		return []*Node{a, b}
	}
	cases := []struct {
		name string
		opts Options
		snap func() *Snapshot
		task Task
		want string
	}{
		{name: "binpack prefers the fuller node", snap: func() *Snapshot { return &Snapshot{Nodes: twoNodes()} }, task: Task{Request: req}, want: "full"},
		{name: "spread prefers the emptier node", opts: Options{Policy: PolicySpread}, snap: func() *Snapshot { return &Snapshot{Nodes: twoNodes()} }, task: Task{Request: req}, want: "empty"},
		{name: "task policy overrides engine default", snap: func() *Snapshot { return &Snapshot{Nodes: twoNodes()} }, task: Task{Request: req, Policy: PolicySpread}, want: "empty"},
		{name: "affinity outweighs bin-packing", snap: func() *Snapshot { return &Snapshot{Nodes: twoNodes()} },
			task: Task{Request: req, Affinities: []Affinity{{Label: "zone", Op: "=", Values: []string{"b"}, Weight: 100}}}, want: "empty"},
		{name: "negative affinity repels", opts: Options{Policy: PolicySpread}, snap: func() *Snapshot { return &Snapshot{Nodes: twoNodes()} },
			task: Task{Request: req, Affinities: []Affinity{{Label: "zone", Op: "=", Values: []string{"b"}, Weight: -100}}}, want: "full"},
		{name: "data locality prefers the node holding the bytes", snap: func() *Snapshot {
			ns := twoNodes()
			ns[1].Datasets = map[string]int64{"imagenet": 150 << 30}
			ns[0].Datasets = map[string]int64{"labels": 1 << 20}
			return &Snapshot{Nodes: ns}
		}, task: Task{Request: req, Datasets: []Dataset{{Name: "imagenet", SizeBytes: 150 << 30}, {Name: "labels", SizeBytes: 1 << 20}}}, want: "empty"},
		{name: "failure penalty moves the task", snap: func() *Snapshot { return &Snapshot{Nodes: twoNodes()} },
			task: Task{Request: req, FailedOn: map[string]int{"full": 3}}, want: "empty"},
		{name: "spread toward the emptier zone", snap: func() *Snapshot {
			return &Snapshot{Nodes: twoNodes(), Existing: []Allocation{{TaskID: "x", GroupKey: "g", NodeID: "full"}}}
		}, task: Task{GroupKey: "g", Request: req, Spreads: []Spread{{Label: "zone", Weight: 100}}}, want: "empty"},
		{name: "spread toward target percentages", opts: Options{Policy: PolicySpread}, snap: func() *Snapshot {
			return &Snapshot{Nodes: twoNodes(), Existing: []Allocation{{TaskID: "x", GroupKey: "g", NodeID: "empty"}}}
		}, task: Task{GroupKey: "g", Request: req, Spreads: []Spread{{Label: "zone", Weight: 100, Targets: map[string]int{"a": 80, "b": 20}}}}, want: "full"},
		{name: "fragmentation keeps the idle 8-GPU node whole", opts: Options{Policy: PolicyFragmentation}, snap: func() *Snapshot {
			idle := node("idle8", 96000, 393216, 8, nil)
			part := node("part8", 96000, 393216, 8, nil)
			part.GPUFreeMilli = []int{500, 0, 0, 0, 0, 0, 0, 0}
			idle.GPUModel, part.GPUModel = "V100", "V100"
			return &Snapshot{Nodes: []*Node{idle, part}}
		}, task: Task{Request: Resources{CPUMillis: 4000, MemoryMiB: 8000, GPUMilli: 500}}, want: "part8"},
		{name: "cpu-only task goes where no GPU is left to strand", opts: Options{Policy: PolicyFragmentation}, snap: func() *Snapshot {
			free := node("gpus-free", 16000, 65536, 2, nil)
			used := node("gpus-used", 16000, 65536, 2, nil)
			used.GPUFreeMilli = []int{0, 0}
			free.GPUModel, used.GPUModel = "T4", "T4"
			used.Allocated = Resources{CPUMillis: 2000, MemoryMiB: 8000}
			return &Snapshot{Nodes: []*Node{free, used}}
		}, task: Task{Request: Resources{CPUMillis: 12000, MemoryMiB: 16000}}, want: "gpus-used"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.task.ID = "t"
			for seed := int64(0); seed < 5; seed++ {
				o := tc.opts
				o.Seed = seed
				got, p := placeOne(t, o, tc.snap(), tc.task)
				if got != tc.want {
					t.Fatalf("seed %d: placed on %q, want %q (plan %+v)", seed, got, tc.want, p)
				}
			}
		})
	}
}

func TestFragmentationPicksGPU(t *testing.T) {
	// A 300-milli share on a node with GPUs free 1000, 400 and 300: best fit
	// and FGD both take the 300 GPU, keeping the idle one whole.
	n := node("n", 32000, 65536, 3, nil)
	n.GPUModel = "T4"
	n.GPUFreeMilli = []int{1000, 400, 300}
	for _, pol := range []Policy{PolicyFragmentation, PolicyBinpack} {
		_, p := placeOne(t, Options{Policy: pol}, &Snapshot{Nodes: []*Node{n}}, Task{ID: "t", Request: Resources{GPUMilli: 300}})
		if got := p.Placements[0].GPUIndices; len(got) != 1 || got[0] != 2 {
			t.Fatalf("%s: GPUs %v, want [2]", pol, got)
		}
	}
	_, p := placeOne(t, Options{Policy: PolicySpread}, &Snapshot{Nodes: []*Node{n}}, Task{ID: "t", Request: Resources{GPUMilli: 300}})
	if got := p.Placements[0].GPUIndices; got[0] != 0 {
		t.Fatalf("spread: GPUs %v, want [0]", got)
	}
}

func TestBatchDoesNotOvercommit(t *testing.T) {
	n := node("n", 2000, 2000, 2, nil)
	n.GPUModel = "T4"
	tasks := []Task{
		{ID: "a", Request: Resources{CPUMillis: 500, GPUMilli: 600}},
		{ID: "b", Request: Resources{CPUMillis: 500, GPUMilli: 600}},
		{ID: "c", Request: Resources{CPUMillis: 500, GPUMilli: 600}},
		{ID: "d", Request: Resources{CPUMillis: 100, GPUs: 1}},
	}
	p := New(Options{}).Place(&Snapshot{Nodes: []*Node{n}}, tasks)
	if len(p.Placements) != 2 || len(p.Unplaced) != 2 {
		t.Fatalf("plan %+v", p)
	}
	if p.Placements[0].GPUIndices[0] == p.Placements[1].GPUIndices[0] {
		t.Fatalf("two 600-milli shares on one GPU: %+v", p.Placements)
	}
	if n.GPUFreeMilli != nil || n.Allocated.CPUMillis != 0 {
		t.Fatal("snapshot mutated")
	}
}

func TestPreemption(t *testing.T) {
	mk := func() *Snapshot {
		a := node("a", 4000, 4000, 0, nil)
		a.Allocated = Resources{CPUMillis: 4000, MemoryMiB: 3000}
		b := node("b", 4000, 4000, 0, nil)
		b.Allocated = Resources{CPUMillis: 4000, MemoryMiB: 3000}
		return &Snapshot{Nodes: []*Node{a, b}, Existing: []Allocation{
			{TaskID: "a1", NodeID: "a", Priority: 10, Request: Resources{CPUMillis: 1000, MemoryMiB: 1000}},
			{TaskID: "a2", NodeID: "a", Priority: 10, Request: Resources{CPUMillis: 1000, MemoryMiB: 1000}},
			{TaskID: "a3", NodeID: "a", Priority: 60, Request: Resources{CPUMillis: 2000, MemoryMiB: 1000}},
			{TaskID: "b1", NodeID: "b", Priority: 20, Request: Resources{CPUMillis: 2000, MemoryMiB: 1000}},
			{TaskID: "b2", NodeID: "b", Priority: 90, Request: Resources{CPUMillis: 2000, MemoryMiB: 2000}},
		}}
	}
	task := Task{ID: "hi", Priority: 70, Request: Resources{CPUMillis: 2000, MemoryMiB: 500}}
	_, p := placeOne(t, Options{}, mk(), task)
	// One eviction (b1, priority 20) beats two (a1, a2, priority 10).
	if len(p.Preemptions) != 1 || p.Preemptions[0].NodeID != "b" || len(p.Preemptions[0].Evict) != 1 || p.Preemptions[0].Evict[0] != "b1" {
		t.Fatalf("preemptions %+v", p.Preemptions)
	}
	if p.Unplaced[0].TaskID != "hi" {
		t.Fatalf("the preempting task is unplaced until the evictions commit: %+v", p)
	}
	// Not enough priority margin: nothing to propose.
	low := task
	low.Priority = 19 // victims need priority <= 9
	_, p = placeOne(t, Options{}, mk(), low)
	if len(p.Preemptions) != 0 {
		t.Fatalf("preemptions %+v", p.Preemptions)
	}
	// Two preemptors in one batch never share a victim or a node.
	p = New(Options{}).Place(mk(), []Task{task, {ID: "hi2", Priority: 70, Request: task.Request}})
	if len(p.Preemptions) != 2 || p.Preemptions[0].NodeID == p.Preemptions[1].NodeID {
		t.Fatalf("preemptions %+v", p.Preemptions)
	}
	if _, off := placeOne(t, Options{DisablePreemption: true}, mk(), task); len(off.Preemptions) != 0 {
		t.Fatal("preemption proposed while disabled")
	}
}

// TestPreemptionQoS: BestEffort victims go first, then Burstable; a
// Guaranteed allocation is taken only for a Guaranteed task.
func TestPreemptionQoS(t *testing.T) {
	mk := func() *Snapshot {
		a := node("a", 4000, 4000, 0, nil)
		a.Allocated = Resources{CPUMillis: 4000, MemoryMiB: 2000}
		b := node("b", 4000, 4000, 0, nil)
		b.Allocated = Resources{CPUMillis: 4000, MemoryMiB: 2000}
		return &Snapshot{Nodes: []*Node{a, b}, Existing: []Allocation{
			// a: one Guaranteed at priority 10 would do, a Burstable at 20
			// too; b: only Guaranteed.
			{TaskID: "a-g", NodeID: "a", Priority: 10, QoS: QoSGuaranteed, Request: Resources{CPUMillis: 2000, MemoryMiB: 1000}},
			{TaskID: "a-b", NodeID: "a", Priority: 20, Request: Resources{CPUMillis: 2000, MemoryMiB: 1000}},
			{TaskID: "b-g", NodeID: "b", Priority: 10, QoS: QoSGuaranteed, Request: Resources{CPUMillis: 4000, MemoryMiB: 2000}},
		}}
	}
	burst := Task{ID: "hi", Priority: 90, Request: Resources{CPUMillis: 2000, MemoryMiB: 500}}
	_, p := placeOne(t, Options{}, mk(), burst)
	if len(p.Preemptions) != 1 || len(p.Preemptions[0].Evict) != 1 || p.Preemptions[0].Evict[0] != "a-b" {
		t.Fatalf("a Burstable preemptor must take the Burstable victim, never a Guaranteed one: %+v", p.Preemptions)
	}
	guar := burst
	guar.QoS = QoSGuaranteed
	_, p = placeOne(t, Options{}, mk(), guar)
	// Burstable goes before Guaranteed even at a higher priority.
	if len(p.Preemptions) != 1 || p.Preemptions[0].Evict[0] != "a-b" {
		t.Fatalf("Burstable victims go before Guaranteed ones: %+v", p.Preemptions)
	}
	only := mk()
	only.Existing = only.Existing[:1]
	only.Existing = append(only.Existing, Allocation{TaskID: "a-be", NodeID: "a", Priority: 5, QoS: QoSBestEffort})
	only.Nodes = only.Nodes[:1]
	only.Nodes[0].Allocated = Resources{CPUMillis: 2000, MemoryMiB: 1000}
	only.Nodes[0].MaxTasks = 2
	only.Nodes[0].RunningTasks = 2
	// A full task slot: the BestEffort task (which holds no resources)
	// frees it before the Guaranteed one would.
	_, p = placeOne(t, Options{}, only, guar)
	if len(p.Preemptions) != 1 || len(p.Preemptions[0].Evict) != 1 || p.Preemptions[0].Evict[0] != "a-be" {
		t.Fatalf("BestEffort goes first: %+v", p.Preemptions)
	}
	_, p = placeOne(t, Options{}, func() *Snapshot { s := mk(); s.Existing = s.Existing[2:]; s.Nodes = s.Nodes[1:]; return s }(), burst)
	if len(p.Preemptions) != 0 {
		t.Fatalf("a Burstable task preempted a Guaranteed one: %+v", p.Preemptions)
	}
}

func TestPow10Frac(t *testing.T) {
	for k := 0; k <= 100000; k++ {
		f := float64(k) / 100000
		want := math.Pow(10, f)
		if got := pow10Frac(f); math.Abs(got-want)/want > 1e-7 {
			t.Fatalf("pow10Frac(%v) = %v, want %v", f, got, want)
		}
	}
	if pow10Frac(-0.5) != 1 || pow10Frac(1.5) != 10 {
		t.Fatalf("pow10Frac does not clamp: %v %v", pow10Frac(-0.5), pow10Frac(1.5))
	}
}

// TestWorkloadByGPUShape: one class per GPU request shape and model set,
// weighted by count, with the lower median CPU and memory; CPU-only tasks
// are left out. DefaultWorkload was made this way from the Alibaba trace.
func TestWorkloadByGPUShape(t *testing.T) {
	tasks := []Task{
		{Request: Resources{CPUMillis: 4000, MemoryMiB: 100, GPUMilli: 470}},
		{Request: Resources{CPUMillis: 1000, MemoryMiB: 300, GPUMilli: 470}},
		{Request: Resources{CPUMillis: 9000, MemoryMiB: 200, GPUMilli: 470}},
		{Request: Resources{CPUMillis: 2000, MemoryMiB: 400, GPUMilli: 470}},
		{Request: Resources{CPUMillis: 8000, MemoryMiB: 800, GPUs: 1}, GPUModels: []string{"V100", "A100"}},
		{Request: Resources{CPUMillis: 6000, MemoryMiB: 600, GPUs: 1}, GPUModels: []string{"A100", "V100"}},
		{Request: Resources{CPUMillis: 500, MemoryMiB: 64}},
	}
	wl := WorkloadByGPUShape(tasks)
	if len(wl) != 2 {
		t.Fatalf("%d classes, want 2: %+v", len(wl), wl)
	}
	if c := wl[0]; c.Request != (Resources{CPUMillis: 2000, MemoryMiB: 200, GPUMilli: 470}) || c.Weight != 4 || len(c.GPUModels) != 0 {
		t.Errorf("share class %+v, want 470 milli, lower medians 2000m / 200 MiB, weight 4", c)
	}
	if c := wl[1]; c.Request != (Resources{CPUMillis: 6000, MemoryMiB: 600, GPUs: 1}) || c.Weight != 2 || strings.Join(c.GPUModels, ",") != "A100,V100" {
		t.Errorf("whole-GPU class %+v, want 1 GPU, A100,V100, lower medians 6000m / 600 MiB, weight 2", c)
	}
}
