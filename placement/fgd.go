package placement

import (
	"math"
	"math/bits"
	"slices"
	"sync"
)

// This file is the fragmentation-aware score, after Fragmentation Gradient
// Descent (FGD): Weng et al., "Beware of Fragmentation: Scheduling
// GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC
// 2023, https://www.usenix.org/conference/atc23/presentation/weng, and its
// simulator (github.com/hkust-adsl/kubernetes-scheduler-simulator,
// pkg/utils/frag.go).
//
// For a node n and a task class m, the fragment F_n(m) is the free GPU
// capacity of n (in GPU milli) that m cannot use:
//
//   - m does not fit n at all (CPU, memory, GPU model, not enough GPUs):
//     all of n's free GPU milli;
//   - m asks for a share d of one GPU: the free milli of the GPUs with less
//     than d free;
//   - m asks for k whole GPUs: the free milli of the partly used GPUs.
//
// The expected fragmentation over the workload M is F_n(M) = Σ_m p_m F_n(m),
// p_m the popularity of class m. FGD places a task on the node, and on the
// GPU within it, where F_n(M) grows least. Classes without GPUs are left out:
// in the FGD simulator they count all free GPU as fragment on every node,
// which adds the same constant to every candidate and changes no choice.
//
// Differences from the published FGD: memory is part of "fits" (the paper's
// simulator checks only CPU and GPU), the score is exact rather than a
// sigmoid rounded to 0..100, and equally fragmenting nodes are told apart by
// bin-packing rather than at random. By default the measure is the sum of
// FGD's F_n(M) and a fill-aware fragment (fragFill), which also sees GPUs
// that CPU or memory will strand after a few more tasks; on the Alibaba
// trace this places 0.5-0.8 points more of the GPU demand than FGD alone
// (BENCHMARKS.md). The score under that measure also charges the growth of
// the GPU a node's CPU strands under the workload's average mix (stranded),
// another 0.3 points. FragModelFGD selects the published measure.

// FragModel selects the fragmentation measure of PolicyFragmentation.
type FragModel string

const (
	// FragModelHybrid (the default) scores F_FGD + F_fill, plus the
	// stranding charge in the score.
	FragModelHybrid FragModel = "hybrid"
	// FragModelFGD is the published F_n(M) of FGD.
	FragModelFGD FragModel = "fgd"
	// FragModelFill is the fill-aware fragment alone.
	FragModelFill FragModel = "fill"
)

// WorkloadClass is one class of the expected workload for the fragmentation
// score: a request shape and its relative frequency.
type WorkloadClass struct {
	Request   Resources
	GPUModels []string // allowed GPU models; empty means any
	Weight    float64  // relative frequency; need not sum to 1; classes whose weight is not a positive finite number are ignored
}

// DefaultWorkload is the task-size distribution of the Alibaba GPU trace
// (openb_pod_list_default.csv, cluster-trace-gpu-v2023, 8,152 tasks), reduced
// to its GPU request classes (num_gpu, gpu_milli) with at least 15 tasks (17
// of 25 classes, 7,038 of the 7,064 GPU tasks), each with the lower median
// CPU and memory of its tasks and its task count as weight. Use
// WorkloadFromTasks to measure your own.
var DefaultWorkload = []WorkloadClass{
	{Request: Resources{CPUMillis: 11400, MemoryMiB: 48128, GPUs: 1}, Weight: 3911},
	{Request: Resources{CPUMillis: 3152, MemoryMiB: 5600, GPUMilli: 810}, Weight: 1078},
	{Request: Resources{CPUMillis: 11908, MemoryMiB: 47104, GPUMilli: 470}, Weight: 750},
	{Request: Resources{CPUMillis: 4000, MemoryMiB: 22888, GPUMilli: 320}, Weight: 328},
	{Request: Resources{CPUMillis: 11908, MemoryMiB: 47104, GPUMilli: 650}, Weight: 253},
	{Request: Resources{CPUMillis: 4000, MemoryMiB: 30517, GPUMilli: 230}, Weight: 140},
	{Request: Resources{CPUMillis: 6000, MemoryMiB: 12288, GPUMilli: 460}, Weight: 128},
	{Request: Resources{CPUMillis: 3152, MemoryMiB: 5600, GPUMilli: 590}, Weight: 75},
	{Request: Resources{CPUMillis: 4000, MemoryMiB: 15258, GPUMilli: 160}, Weight: 74},
	{Request: Resources{CPUMillis: 4152, MemoryMiB: 10600, GPUMilli: 550}, Weight: 72},
	{Request: Resources{CPUMillis: 4000, MemoryMiB: 22888, GPUMilli: 220}, Weight: 62},
	{Request: Resources{CPUMillis: 4152, MemoryMiB: 10600, GPUMilli: 370}, Weight: 47},
	{Request: Resources{CPUMillis: 88000, MemoryMiB: 327680, GPUs: 8}, Weight: 44},
	{Request: Resources{CPUMillis: 4000, MemoryMiB: 22888, GPUMilli: 110}, Weight: 24},
	{Request: Resources{CPUMillis: 4000, MemoryMiB: 22888, GPUMilli: 480}, Weight: 19},
	{Request: Resources{CPUMillis: 16200, MemoryMiB: 66560, GPUs: 2}, Weight: 16},
	{Request: Resources{CPUMillis: 32200, MemoryMiB: 132096, GPUs: 4}, Weight: 15},
}

// WorkloadFromTasks measures the workload distribution of tasks: one class
// per distinct (CPU, memory, GPU request, GPU models), weighted by count.
// Tasks without GPUs are skipped (see the note on F_n(M) above).
func WorkloadFromTasks(tasks []Task) []WorkloadClass {
	type key struct {
		r      Resources
		models string
	}
	idx := map[key]int{}
	var out []WorkloadClass
	for i := range tasks {
		r, ms, ok := gpuShape(&tasks[i])
		if !ok {
			continue
		}
		k := key{r, joinModels(ms)}
		if j, ok := idx[k]; ok {
			out[j].Weight++
			continue
		}
		idx[k] = len(out)
		out = append(out, WorkloadClass{Request: r, GPUModels: ms, Weight: 1})
	}
	return out
}

// WorkloadByGPUShape measures tasks the way DefaultWorkload was made: one
// class per GPU request shape (whole GPUs or share, and allowed GPU models),
// weighted by its task count, with the lower median CPU and memory of its
// tasks. A region's workload file may hold millions of tasks of thousands
// of CPU and memory sizes; their GPU shapes are few, which keeps the
// fragmentation measure and the share prices cheap. Tasks without GPUs are
// skipped.
func WorkloadByGPUShape(tasks []Task) []WorkloadClass {
	type key struct {
		gpus, milli int
		models      string
	}
	type acc struct {
		models   []string
		cpu, mem []int64
	}
	idx := map[key]*acc{}
	var order []key
	for i := range tasks {
		r, ms, ok := gpuShape(&tasks[i])
		if !ok {
			continue
		}
		k := key{r.GPUs, r.GPUMilli, joinModels(ms)}
		a := idx[k]
		if a == nil {
			a = &acc{models: ms}
			idx[k] = a
			order = append(order, k)
		}
		a.cpu = append(a.cpu, r.CPUMillis)
		a.mem = append(a.mem, r.MemoryMiB)
	}
	lowerMedian := func(v []int64) int64 {
		slices.Sort(v)
		return v[(len(v)-1)/2]
	}
	out := make([]WorkloadClass, 0, len(order))
	for _, k := range order {
		a := idx[k]
		out = append(out, WorkloadClass{
			Request:   Resources{CPUMillis: lowerMedian(a.cpu), MemoryMiB: lowerMedian(a.mem), GPUs: k.gpus, GPUMilli: k.milli},
			GPUModels: a.models, Weight: float64(len(a.cpu))})
	}
	return out
}

// gpuShape is a task's normalised request and its sorted GPU models; ok is
// false for a task without GPUs.
func gpuShape(t *Task) (r Resources, models []string, ok bool) {
	r = normRequest(t.Request)
	if r.GPUs == 0 && r.GPUMilli == 0 {
		return r, nil, false
	}
	models = slices.Clone(t.GPUModels)
	slices.Sort(models)
	return r, models, true
}

func joinModels(ms []string) string {
	s := ""
	for i, m := range ms {
		if i > 0 {
			s += "|"
		}
		s += m
	}
	return s
}

// fragModel is a compiled workload.
type fragModel struct {
	kind    FragModel
	classes []fragClass
	models  map[string]int // GPU model -> bit in fragClass.allowed
	// gpuPerCPU is the workload's expected GPU milli per CPU millicore
	// (Σ p g / Σ p cpu), for the stranding charge.
	gpuPerCPU float64
	// packWeight weighs the packing charge (shareprice.go), 0 when it is
	// off; the price table is solved on first use (pricesOnce).
	packWeight float64
	pricesOnce sync.Once
	prices     *sharePrices
}

type fragClass struct {
	cpu, mem int64
	gpus     int // whole GPUs, or 0
	milli    int // share of one GPU, or 0
	p        float64
	perIdle  int // shares of milli an idle GPU holds (1000/milli), or 0
	anyModel bool
	allowed  uint64 // bit per model index (models past 64 never match)
}

func newFragModel(wl []WorkloadClass) *fragModel {
	m := &fragModel{models: map[string]int{}}
	var tot float64
	// A class counts if it asks for GPUs and its weight is a positive
	// finite number.
	counts := func(w *WorkloadClass) (Resources, bool) {
		r := normRequest(w.Request)
		return r, (r.GPUs > 0 || r.GPUMilli > 0) && w.Weight > 0 && !math.IsInf(w.Weight, 1)
	}
	for i := range wl {
		if _, ok := counts(&wl[i]); ok {
			tot += wl[i].Weight
		}
	}
	for i := range wl {
		w := &wl[i]
		r, ok := counts(w)
		if !ok {
			continue
		}
		k := fragClass{cpu: r.CPUMillis, mem: r.MemoryMiB, gpus: r.GPUs, milli: r.GPUMilli, p: w.Weight / tot, anyModel: len(w.GPUModels) == 0}
		if k.milli > 0 {
			k.perIdle = 1000 / k.milli
		}
		for _, mo := range w.GPUModels {
			b, ok := m.models[mo]
			if !ok {
				b = len(m.models)
				m.models[mo] = b
			}
			if b < 64 {
				k.allowed |= 1 << b
			}
		}
		m.classes = append(m.classes, k)
	}
	var g, c float64
	for _, k := range m.classes {
		g += k.p * float64(k.gpus*1000+k.milli)
		c += k.p * float64(k.cpu)
	}
	if c > 0 {
		m.gpuPerCPU = g / c
	}
	return m
}

// strandWeight weighs the stranding charge against the fragmentation delta
// under the hybrid measure. Measured on the Alibaba trace, full scan, seeds
// 42-45 (default trace): 0.1 -> 95.62, 0.3 -> 95.73, 0.6 -> 95.86,
// 1 -> 95.90, 1.5 -> 95.89, 2 -> 95.91, 3 -> 95.88 (95.56 without);
// gpuspec33: 1 -> 95.08, 2 -> 94.26 (94.56 without). BENCHMARKS.md.
const strandWeight = 1.0

// stranded is the free GPU milli of a node that its free CPU cannot serve
// when the workload arrives in its average mix: the part of gpuFree beyond
// cpuFree × (expected GPU milli per CPU millicore). A fluid view of the
// "stranded GPU": fragFill packs one class at a time and so misses a node
// whose CPU goes faster than its GPUs under the mix (CPU-heavy GPU shares on
// an 8-GPU node, leaving idle GPUs no 1-GPU task has the cores for).
// Memory is left out: adding it measured no better (BENCHMARKS.md).
func (m *fragModel) stranded(cpuFree int64, gpuFree int) float64 {
	if m.gpuPerCPU <= 0 {
		return 0
	}
	return max(0, float64(gpuFree)-float64(cpuFree)*m.gpuPerCPU)
}

// fragKey identifies a node state for memoisation: nodes in the same state
// have the same fragmentation. The memo pays only when the workload has many
// classes (a trace's measured workload has hundreds; evaluating them costs
// more than a map access), not for a short list such as DefaultWorkload,
// where most lookups miss and the map inserts cost more than they save
// (BENCHMARKS.md).
type fragKey struct {
	cpu, mem int64
	model    string
	n        int8
	g        [8]int16 // sorted free milli
}

// memoMinClasses is the workload size from which frag memoises.
const memoMinClasses = 32

// frag returns F_n(M) in GPU milli for a node with the given free CPU,
// memory and per-GPU free milli.
func (m *fragModel) frag(st *state, cpuFree, memFree int64, model string, gpu []int) float64 {
	if len(gpu) == 0 {
		return 0
	}
	var key fragKey
	memo := len(m.classes) > memoMinClasses && len(gpu) <= 8 && st != nil
	if memo {
		key = fragKey{cpu: cpuFree, mem: memFree, model: model, n: int8(len(gpu))}
		for i, f := range gpu {
			key.g[i] = int16(f)
		}
		slices.Sort(key.g[:len(gpu)])
		if st.fmemo == nil {
			st.fmemo = map[fragKey]float64{}
		}
		if f, ok := st.fmemo[key]; ok {
			return f
		}
	}
	var f float64
	var g gpuSummary
	g.of(gpu)
	switch m.kind {
	case FragModelFGD:
		f = m.fragRawSum(cpuFree, memFree, model, &g)
	case FragModelFill:
		f = m.fragFillSum(cpuFree, memFree, model, &g)
	default:
		f = m.fragHybridSum(cpuFree, memFree, model, &g)
	}
	if memo {
		st.fmemo[key] = f
	}
	return f
}

func (m *fragModel) fragRaw(cpuFree, memFree int64, model string, gpu []int) float64 {
	var g gpuSummary
	g.of(gpu)
	return m.fragRawSum(cpuFree, memFree, model, &g)
}

// gpuSummary is what the fragment measures read of a node's GPUs: totals,
// the idle count and the free share of each partly used GPU (an idle GPU
// holds floor(1000/d) shares of d and is never short of one, so only the
// partly used ones need a per-GPU look).
type gpuSummary struct {
	total, idle, partial int
	np                   int // partly used GPUs: buf[:np], or extra past 16
	buf                  [16]int
	extra                []int
}

func (g *gpuSummary) of(gpu []int) {
	for _, f := range gpu {
		g.total += f
		if f >= 1000 {
			g.idle++
		} else if f > 0 {
			g.partial += f
			if g.np < len(g.buf) {
				g.buf[g.np] = f
			} else {
				if g.extra == nil {
					g.extra = append([]int(nil), g.buf[:]...)
				}
				g.extra = append(g.extra, f)
			}
			g.np++
		}
	}
}

// parts is the free milli of each partly used GPU. (A slice of buf kept in
// the struct itself would make every summary escape to the heap.)
func (g *gpuSummary) parts() []int {
	if g.extra != nil {
		return g.extra
	}
	return g.buf[:g.np]
}

// capBy is min(n, free/per) for n >= 0 and per > 0, without dividing when
// free holds all n and without overflow; negative free holds none.
func capBy(n, free, per int64) int64 {
	if free < 0 {
		return 0
	}
	if hi, lo := bits.Mul64(uint64(per), uint64(n)); hi == 0 && lo <= uint64(free) {
		return n
	}
	return free / per
}

// modelBit is the bit of a GPU model in fragClass.allowed; known is false
// for a model no class names (no map access when none does).
func (m *fragModel) modelBit(model string) (bit int, known bool) {
	if len(m.models) == 0 {
		return 0, false
	}
	bit, known = m.models[model]
	return bit, known
}

// modelOK reports whether class c may use GPUs of the given model.
func (m *fragModel) modelOK(c *fragClass, bit int, known bool) bool {
	return c.anyModel || (known && bit < 64 && c.allowed&(1<<bit) != 0)
}

func (m *fragModel) fragRawSum(cpuFree, memFree int64, model string, g *gpuSummary) float64 {
	if g.total == 0 {
		return 0
	}
	bit, known := m.modelBit(model)
	total := float64(g.total)
	var F float64
	for k := range m.classes {
		c := &m.classes[k]
		if c.cpu > cpuFree || c.mem > memFree || !m.modelOK(c, bit, known) {
			F += c.p * total
			continue
		}
		if c.gpus > 0 {
			if g.idle < c.gpus {
				F += c.p * total
			} else {
				F += c.p * float64(g.partial)
			}
			continue
		}
		s := 0
		for _, f := range g.parts() {
			if f < c.milli {
				s += f
			}
		}
		F += c.p * float64(s)
	}
	return F
}

// fragNow is F_n(M) of node i in its current state v, cached in the node's
// slot until a placement on the node (state.apply) changes it: the scan asks
// for it once per visit and pickShare once per GPU choice.
func (m *fragModel) fragNow(st *state, i int, v *view) float64 {
	s := st.slot(i)
	if !s.fragOK {
		s.frag, s.fragOK = m.frag(st, v.cpuFree, v.memFree, s.gpuModel, v.gpuFree), true
	}
	return s.frag
}

// fragDelta is F_n(M) after placing req with the given GPUs minus before.
func (m *fragModel) fragDelta(st *state, i int, v *view, req Resources, gpus []int) float64 {
	if len(v.gpuFree) == 0 {
		return 0 // no GPUs, no fragment (and no read of the Node)
	}
	model := st.slot(i).gpuModel
	before := m.fragNow(st, i, v)
	var buf [16]int
	after := buf[:0]
	if len(v.gpuFree) > len(buf) {
		after = make([]int, 0, len(v.gpuFree))
	}
	after = append(after, v.gpuFree...)
	for _, g := range gpus {
		if req.GPUs > 0 {
			after[g] = 0
		} else {
			after[g] -= req.GPUMilli
		}
	}
	return m.frag(st, v.cpuFree-req.CPUMillis, v.memFree-req.MemoryMiB, model, after) - before
}

// pickShare chooses, for a GPU-share request, the GPU whose use grows the
// node's fragmentation least; ties go to the GPU with the least free share.
func (m *fragModel) pickShare(c *taskCtx, st *state, i int, v *view) int {
	best, bestD := -1, 0.0
	var one [1]int
	for g, f := range v.gpuFree {
		if f < c.req.GPUMilli {
			continue
		}
		// GPUs with the same free share are interchangeable.
		dup := false
		for h := 0; h < g; h++ {
			if v.gpuFree[h] == f {
				dup = true
				break
			}
		}
		if dup {
			continue
		}
		one[0] = g
		d := m.fragDelta(st, i, v, c.req, one[:]) + m.packingCharge(f, c.req)
		if best < 0 || d < bestD-1e-9 || (d <= bestD+1e-9 && f < v.gpuFree[best]) {
			best, bestD = g, d
		}
	}
	return best
}

// fragScorer scores -ΔF_n(M) (GPU milli), normalised min-max over the
// candidates: 1 for the least fragmenting node.
type fragScorer struct {
	m        *fragModel
	scarcity float64 // weight of the model-pressure charge (0: off)
}

func (fragScorer) norm() normKind { return normMinMax }

func (s fragScorer) score(c *taskCtx, st *state, i int, v *view, gpus []int) float64 {
	if len(v.gpuFree) == 0 {
		return 0 // every term below is 0 on a node without GPUs
	}
	d := s.m.fragDelta(st, i, v, c.req, gpus)
	if len(gpus) == 1 {
		d += s.m.packingCharge(v.gpuFree[gpus[0]], c.req) // 0 unless a share
	}
	if s.m.kind == "" || s.m.kind == FragModelHybrid {
		// Stranding charge: how much more of the node's free GPU its free
		// CPU can no longer serve at the workload's CPU-per-GPU mix.
		gf := sumFree(v.gpuFree)
		d += strandWeight * (s.m.stranded(v.cpuFree-c.req.CPUMillis, gf-c.req.GPUs*1000-c.req.GPUMilli) - s.m.stranded(v.cpuFree, gf))
	}
	if s.scarcity > 0 {
		if rho := st.modelPressure(s.m)[st.slot(i).gpuModel]; rho > 0 {
			d += s.scarcity * rho * float64(c.req.GPUs*1000+c.req.GPUMilli)
		}
	}
	return -d
}

// modelPressure is, per GPU model, the share of the model's capacity that
// the model-constrained part of the workload needs: ρ_X = D_X / cap_X ×
// cap / D, with D the workload's expected GPU demand per task (Σ_m p_m g_m),
// D_X the part of it from classes that allow X among other models, split in
// proportion to the capacity of the allowed models present, cap_X the GPU
// capacity of X in the snapshot and cap the total. A model that only
// constrained tasks can use and that they oversubscribe has ρ ≥ 1; a model
// no constrained class asks for has ρ = 0. Computed once per session.
//
// The fragmentation score charges ρ_X per GPU milli placed on a node of
// model X (scarcity term): FGD alone sends unconstrained tasks to the nodes
// whose whole-node classes they break least (small nodes), which on
// gpuspec33 are the T4, P100 and V100 nodes the constrained tasks need
// (BENCHMARKS.md). Tasks that can only use X pay the same charge on every
// candidate, so only tasks with a choice of models are steered.
func (st *state) modelPressure(m *fragModel) map[string]float64 {
	if st.pressure != nil {
		return st.pressure
	}
	st.pressure = map[string]float64{}
	capBy, capAll := st.gpuCapacity()
	names := make([]string, len(m.models))
	for name, b := range m.models {
		names[b] = name
	}
	var dAll float64
	dBy := map[string]float64{}
	for k := range m.classes {
		c := &m.classes[k]
		g := c.p * float64(c.gpus*1000+c.milli)
		dAll += g
		if c.anyModel {
			continue
		}
		var capAllowed float64
		for b, name := range names {
			if b < 64 && c.allowed&(1<<b) != 0 {
				capAllowed += capBy[name]
			}
		}
		if capAllowed == 0 {
			continue
		}
		for b, name := range names {
			if b < 64 && c.allowed&(1<<b) != 0 && capBy[name] > 0 {
				dBy[name] += g * capBy[name] / capAllowed
			}
		}
	}
	if dAll == 0 || capAll == 0 {
		return st.pressure
	}
	for name, d := range dBy {
		st.pressure[name] = d / capBy[name] * capAll / dAll
	}
	return st.pressure
}

// fragTieBreak is the weight of bin-packing relative to the fragmentation
// score under PolicyFragmentation: enough to order equally fragmenting
// nodes, too little to overrule a real difference.
const fragTieBreak = 1e-4

// bestFitScorer is the FGD paper's best-fit baseline: the node left with the
// least free CPU and GPU after placement, each scaled by the largest node in
// the snapshot and weighted 1/2: 1 - Σ_d ½ (free_d - req_d) / max_d.
type bestFitScorer struct{}

func (bestFitScorer) norm() normKind { return normFixed }

func (bestFitScorer) score(c *taskCtx, st *state, i int, v *view, _ []int) float64 {
	mc := st.maxCapacity()
	var s float64
	if mc.CPUMillis > 0 {
		s += 0.5 * float64(v.cpuFree-c.req.CPUMillis) / float64(mc.CPUMillis)
	}
	if mc.GPUs > 0 {
		s += 0.5 * float64(sumFree(v.gpuFree)-c.req.GPUs*1000-c.req.GPUMilli) / float64(mc.GPUs*1000)
	}
	return 1 - s
}

// fragFill is the fill-aware fragment: for each class m, the free GPU milli
// left unusable after packing as many tasks of m onto the node as its free
// CPU, memory and GPUs allow. FGD's F_n(m) asks only whether one task of m
// fits; on the Alibaba trace CPU runs out before GPUs on many nodes, and a
// node that fits one more 1-GPU task but not four strands three GPUs, which
// F_n(m) does not see.
func (m *fragModel) fragFill(cpuFree, memFree int64, model string, gpu []int) float64 {
	var g gpuSummary
	g.of(gpu)
	return m.fragFillSum(cpuFree, memFree, model, &g)
}

func (m *fragModel) fragFillSum(cpuFree, memFree int64, model string, g *gpuSummary) float64 {
	if g.total == 0 {
		return 0
	}
	bit, known := m.modelBit(model)
	total := float64(g.total)
	var F float64
	for k := range m.classes {
		c := &m.classes[k]
		if !m.modelOK(c, bit, known) {
			F += c.p * total
			continue
		}
		// n: how many tasks of c the GPUs hold; then cut to what the free
		// CPU and memory hold (divisions only when they bind).
		var n, size int64
		if c.gpus > 0 {
			n, size = int64(g.idle/c.gpus), int64(c.gpus)*1000
		} else {
			n, size = int64(g.idle*c.perIdle), int64(c.milli)
			for _, f := range g.parts() {
				n += int64(f / c.milli)
			}
		}
		if c.cpu > 0 {
			n = capBy(n, cpuFree, c.cpu)
		}
		if c.mem > 0 {
			n = capBy(n, memFree, c.mem)
		}
		F += c.p * (total - float64(n*size))
	}
	return F
}

// fragHybridSum is fragRawSum + fragFillSum in one pass over the classes.
func (m *fragModel) fragHybridSum(cpuFree, memFree int64, model string, g *gpuSummary) float64 {
	if g.total == 0 {
		return 0
	}
	bit, known := m.modelBit(model)
	total := float64(g.total)
	parts := g.parts()
	var F float64
	for k := range m.classes {
		c := &m.classes[k]
		if !m.modelOK(c, bit, known) {
			F += 2 * c.p * total
			continue
		}
		var raw float64
		var n, size int64
		if c.gpus > 0 {
			n, size = int64(g.idle/c.gpus), int64(c.gpus)*1000
			if n == 0 {
				raw = total
			} else {
				raw = float64(g.partial)
			}
		} else {
			n, size = int64(g.idle*c.perIdle), int64(c.milli)
			s := 0
			for _, f := range parts {
				n += int64(f / c.milli)
				if f < c.milli {
					s += f
				}
			}
			raw = float64(s)
		}
		if c.cpu > cpuFree || c.mem > memFree {
			raw = total
		}
		if c.cpu > 0 {
			n = capBy(n, cpuFree, c.cpu)
		}
		if c.mem > 0 {
			n = capBy(n, memFree, c.mem)
		}
		F += c.p * (raw + total - float64(n*size))
	}
	return F
}
