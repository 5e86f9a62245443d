package placement

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
)

// Options configures an engine. The zero value is a valid bin-packing engine.
type Options struct {
	// Policy is the default scoring policy (a region default); a task's own
	// Policy overrides it. Empty means PolicyBinpack.
	Policy Policy
	// Seed makes selection deterministic: the same seed, snapshot and tasks
	// give the same plan. It drives the candidate scan order and ties.
	Seed int64
	// CandidateLimit bounds the scan per task: the engine visits nodes in a
	// seeded pseudo-random order and stops once it has found this many
	// feasible nodes, then scores only those (K8s percentageOfNodesToScore,
	// Nomad's LimitIterator). 0 means DefaultCandidateLimit; negative means
	// every feasible node is scored. A task that fits nowhere is always
	// checked against every node, so "unplaced" never comes from sampling.
	CandidateLimit int
	// Weights of the score stages; zero fields take their defaults.
	Weights Weights
	// Workload is the observed task-size distribution the fragmentation
	// score measures against (FGD's "target workload"). Empty means the
	// engine uses DefaultWorkload.
	Workload []WorkloadClass
	// PreemptionDelta is the priority margin a task needs over the tasks it
	// would evict: victims have Priority <= task Priority - PreemptionDelta.
	// 0 means 10 (Nomad's preemption rule); set DisablePreemption to turn
	// preemption proposals off.
	PreemptionDelta   int
	DisablePreemption bool
	// PreemptionCandidates bounds the nodes with a set of victims a
	// preemptor compares (in the seeded scan order; Kubernetes'
	// DefaultPreemption bounds its candidates likewise). 0 means
	// DefaultPreemptionCandidates; negative means every node.
	PreemptionCandidates int
	// FragModel selects the fragmentation measure of PolicyFragmentation;
	// empty means FragModelHybrid.
	FragModel FragModel
	// ScarcityWeight weighs the GPU-model scarcity charge of the hybrid
	// fragmentation measure (fgd.go, modelPressure): 0 means the default
	// DefaultScarcityWeight (so does NaN), negative turns it off; values
	// above 1e6 count as 1e6. It has no effect when the workload has no
	// GPU-model constraints, or under FragModelFGD.
	ScarcityWeight float64
	// PackingWeight weighs the GPU-share packing charge of the hybrid
	// fragmentation measure (shareprice.go): 0 means DefaultPackingWeight
	// (so does NaN), negative turns it off; values above 1e6 count as 1e6.
	// It has no effect under FragModelFGD or FragModelFill, or when the
	// workload has no GPU shares.
	PackingWeight float64
}

// maxChargeWeight caps ScarcityWeight and PackingWeight: far above any
// useful value, and small enough that a charge stays finite (an infinite
// one would make every candidate's normalised score NaN).
const maxChargeWeight = 1e6

// chargeWeight is the weight in effect for an Options charge weight w:
// def for 0 or NaN, 0 (off) for a negative w, at most maxChargeWeight.
func chargeWeight(w, def float64) float64 {
	switch {
	case w == 0 || math.IsNaN(w):
		return def
	case w < 0:
		return 0
	}
	return min(w, maxChargeWeight)
}

// DefaultPackingWeight is the default Options.PackingWeight. Chosen on
// seeds 52-61 of the Alibaba trace, disjoint from the reported 42-51 (full
// scan, GPU allocation at 100% arrival, default / gpuspec33): off -> 95.87
// / 95.17, 3 -> 96.03 / 95.25, 10 -> 96.13 / 95.27, 20 -> 96.17 / 95.29,
// 30 -> 96.17 / 95.30, 1000 -> 96.17 / 95.23. At 30 and above the charge
// all but decides among placements of different loss, since a loss is a
// multiple of a price step (1/12 GPU on that trace); BENCHMARKS.md.
const DefaultPackingWeight = 30.0

// DefaultScarcityWeight is the default Options.ScarcityWeight, measured on
// gpuspec33 (seeds 42-44, full scan: 0.3 -> 89.3%, 1 -> 94.4%, 2 -> 94.6%,
// 3 -> 94.5%, 10 -> 94.5% GPU allocation at 100% arrival).
const DefaultScarcityWeight = 2.0

// DefaultPreemptionCandidates is the default Options.PreemptionCandidates:
// at 10,000 full nodes 16 candidates decided about twice as fast as 64
// (BenchmarkPreemption; BENCHMARKS.md) with as many victims per
// preemption in that workload.
const DefaultPreemptionCandidates = 16

// DefaultCandidateLimit is the default number of feasible nodes scored per
// task. Measured on the Alibaba trace (BENCHMARKS.md, 10 seeds): scoring 64
// instead of every node costs 0.07 points of GPU allocation on the default
// task file and gains 1.4 on gpuspec33, at 3.5x the speed.
const DefaultCandidateLimit = 64

// Weights weigh the score stages in the final weighted mean (Nomad averages
// its rank scores; K8s sums plugin scores times plugin weights). Zero means
// the default shown.
type Weights struct {
	Fit            float64 // resource fit (bin-pack/spread/fragmentation): 1
	Affinity       float64 // label affinities: 1
	Spread         float64 // spread across a label: 1
	Locality       float64 // data locality: 1 (negative: off)
	FailurePenalty float64 // earlier failures of the task on the node: 1
}

func (w Weights) withDefaults() Weights {
	d := func(x *float64) {
		if *x == 0 {
			*x = 1
		}
	}
	d(&w.Fit)
	d(&w.Affinity)
	d(&w.Spread)
	d(&w.Locality)
	d(&w.FailurePenalty)
	if w.Locality < 0 {
		w.Locality = 0 // off (measurements of locality's effect)
	}
	return w
}

// Engine is the placement engine. It is safe for concurrent use: all state
// of a Place call lives in that call.
type Engine struct {
	opts     Options
	w        Weights
	frag     *fragModel
	scarcity float64
	// fragScorer is shared by every task's pipeline (it holds no per-task
	// state), so compiling a task does not box a new one.
	fragScorer scorer

	// slotBufs are Place's reusable scan-slot arrays (state.go).
	slotBufs sync.Pool

	// mu guards tabs, the node tables of recent snapshot generations
	// (table.go).
	mu   sync.Mutex
	tabs []*nodeTable
}

// New returns the placement engine as a Placer.
func New(opts Options) Placer { return NewEngine(opts) }

// NewEngine returns the placement engine.
func NewEngine(opts Options) *Engine {
	if opts.Policy == "" {
		opts.Policy = PolicyBinpack
	}
	if opts.PreemptionCandidates == 0 {
		opts.PreemptionCandidates = DefaultPreemptionCandidates
	}
	if opts.CandidateLimit == 0 {
		opts.CandidateLimit = DefaultCandidateLimit
	}
	if opts.PreemptionDelta == 0 {
		opts.PreemptionDelta = 10
	}
	wl := opts.Workload
	if len(wl) == 0 {
		wl = DefaultWorkload
	}
	fm := newFragModel(wl)
	fm.kind = opts.FragModel
	e := &Engine{opts: opts, w: opts.Weights.withDefaults(), frag: fm}
	if fm.kind != FragModelFGD {
		e.scarcity = chargeWeight(opts.ScarcityWeight, DefaultScarcityWeight)
	}
	if fm.kind == "" || fm.kind == FragModelHybrid {
		fm.packWeight = chargeWeight(opts.PackingWeight, DefaultPackingWeight)
	}
	e.fragScorer = fragScorer{m: fm, scarcity: e.scarcity}
	return e
}

// Place places tasks in order of descending Priority (stable), each against
// the usage left by the ones before it.
func (e *Engine) Place(snap *Snapshot, tasks []Task) Plan {
	buf, _ := e.slotBufs.Get().(*slotBuf)
	if buf == nil {
		buf = &slotBuf{}
	}
	defer e.slotBufs.Put(buf) // nothing of the session outlives the call
	s := e.newSession(snap, tasks, buf)
	order := make([]int, len(tasks))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(tasks[b].Priority, tasks[a].Priority) })
	var plan Plan
	for _, k := range order {
		r := s.PlaceOne(&tasks[k])
		switch {
		case r.Placement != nil:
			plan.Placements = append(plan.Placements, *r.Placement)
		case r.Unplaced != nil:
			plan.Unplaced = append(plan.Unplaced, *r.Unplaced)
			if r.Preemption != nil {
				plan.Preemptions = append(plan.Preemptions, *r.Preemption)
			}
		}
	}
	return plan
}

// Session places tasks one at a time against a working copy of a snapshot;
// each placement is applied to the working copy before the next. Place is a
// Session over the batch. A Session is not safe for concurrent use.
type Session struct {
	e   *Engine
	st  *state
	rng *rand.Rand

	cands []cand
	raw   []float64
	// avoided and avoidedRaw hold the feasible nodes the task failed on
	// (Task.FailedOn), used only when no other node could run it.
	avoided    []cand
	avoidedRaw []float64
	gbuf       []int
	v          view // the scan's view of the node being visited
}

type cand struct {
	i     int
	share int // GPU index for a share request, -1 otherwise
}

// Result is the outcome for one task: exactly one of Placement and Unplaced
// is set; Preemption may accompany Unplaced.
type Result struct {
	Placement  *Placement
	Unplaced   *Unplaced
	Preemption *Preemption
}

// NewSession starts a session. batch lists the tasks that will be placed (it
// may be nil): existing allocations with their IDs are being re-placed and
// stop counting toward group rules.
func (e *Engine) NewSession(snap *Snapshot, batch []Task) *Session {
	return e.newSession(snap, batch, &slotBuf{})
}

func (e *Engine) newSession(snap *Snapshot, batch []Task, buf *slotBuf) *Session {
	if snap == nil {
		snap = &Snapshot{}
	}
	seed := uint64(e.opts.Seed)
	return &Session{e: e, st: newState(snap, batch, e.table(snap), buf), rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// PlaceOne places t and applies it to the session's working copy.
//
// A node in t.FailedOn (the task failed there before) is hard-excluded while
// another node could run the task: it passes the node-only filters (labels,
// eligibility, exclusions) and its capacity can hold the request once free.
// The task then waits for such a node if none has room now (Unplaced reason
// "failed here before"). When no other node could ever run it, the task is
// placed on a node it failed on (ranked with the failure penalty) rather
// than never running.
func (s *Session) PlaceOne(t *Task) Result {
	c := s.e.compileTask(t)
	st := s.st
	n := len(st.nodes)
	if n == 0 {
		return Result{Unplaced: &Unplaced{TaskID: t.ID, Reason: "no nodes in snapshot", Excluded: map[string]int{}}}
	}
	cs := st.candidates(c)
	limit := s.e.opts.CandidateLimit
	if limit < 0 || limit > cs.total {
		limit = cs.total
	}
	s.cands = s.cands[:0]
	nsc := len(c.scorers)
	s.raw = s.raw[:0]
	s.avoided, s.avoidedRaw = s.avoided[:0], s.avoidedRaw[:0]
	avoid := len(t.FailedOn) > 0
	otherPossible := false // a node the task did not fail on could run it
	if cs.total > 0 && !st.noRoom(c.req) {
		start, stride := s.scanOrder(cs.total)
		for j, p := 0, start; j < cs.total && len(s.cands) < limit; j++ {
			i := cs.at(p)
			if !c.staticOK(st, i) {
				p += stride
				if p >= cs.total {
					p -= cs.total
				}
				continue
			}
			if avoid && !otherPossible && t.FailedOn[st.nodes[i].ID] <= 0 && fitsEmpty(st.nodes[i], c.req) {
				otherPossible = true
			}
			// v lives in the session: a local would escape to the heap
			// through the filter and scorer interfaces, once per node.
			v := &s.v
			*v = st.view(i)
			if c.dynamicOK(st, i, v) {
				share := -1
				if c.req.GPUMilli > 0 {
					share = c.pickShare(s.e, st, i, v)
				}
				gpus := s.gpuList(c, v, share)
				switch {
				case !avoid || t.FailedOn[st.nodes[i].ID] <= 0:
					s.cands = append(s.cands, cand{i: i, share: share})
					for _, sc := range c.scorers {
						s.raw = append(s.raw, sc.s.score(c, st, i, v, gpus))
					}
				case len(s.avoided) < limit:
					// Not counted toward limit: the scan goes on looking
					// for nodes the task has not failed on.
					s.avoided = append(s.avoided, cand{i: i, share: share})
					for _, sc := range c.scorers {
						s.avoidedRaw = append(s.avoidedRaw, sc.s.score(c, st, i, v, gpus))
					}
				}
			}
			p += stride
			if p >= cs.total {
				p -= cs.total
			}
		}
	}
	if len(s.cands) == 0 && len(s.avoided) > 0 && !otherPossible {
		// Only nodes the task failed on could run it: run there rather
		// than never.
		s.cands, s.avoided = s.avoided, s.cands
		s.raw, s.avoidedRaw = s.avoidedRaw, s.raw
	}
	if len(s.cands) == 0 {
		if !st.freeOK && len(s.avoided) == 0 {
			st.boundFree()
		}
		c.avoidFailed = avoid && otherPossible
		// A task that could run now on a node it failed on waits for
		// room elsewhere rather than evict anyone.
		if !s.e.opts.DisablePreemption && len(s.avoided) == 0 {
			if p := s.preempt(c); p != nil {
				// Its reason is the preemption: the per-filter count of
				// every node (explain, most of an unplaced task's cost)
				// is left out.
				return Result{Unplaced: &Unplaced{TaskID: t.ID, Reason: fmt.Sprintf("preempting %d allocation(s) on node %s", len(p.Evict), p.NodeID),
					Excluded: map[string]int{}}, Preemption: p}
			}
		}
		return Result{Unplaced: s.explain(c)}
	}
	// Normalise and select.
	for k, sc := range c.scorers {
		if sc.n != normMinMax {
			continue
		}
		lo, hi := math.Inf(1), math.Inf(-1)
		for j := range s.cands {
			x := s.raw[j*nsc+k]
			lo, hi = math.Min(lo, x), math.Max(hi, x)
		}
		// Candidates whose raw scores differ only by rounding (the same
		// sum taken in another order) are equal: stretching a 1e-13
		// difference to the full [0, 1] range would overrule the
		// tie-break scores.
		tied := hi-lo <= 1e-9*math.Max(1, math.Max(math.Abs(hi), math.Abs(lo)))
		for j := range s.cands {
			x := &s.raw[j*nsc+k]
			if !tied {
				*x = (*x - lo) / (hi - lo)
			} else {
				*x = 1
			}
		}
	}
	best, bestScore, ties := -1, math.Inf(-1), 0
	for j := range s.cands {
		var sum float64
		for k, sc := range c.scorers {
			sum += sc.w * s.raw[j*nsc+k]
		}
		if c.wsum > 0 {
			sum /= c.wsum
		}
		switch {
		case sum > bestScore+1e-12:
			best, bestScore, ties = j, sum, 1
		case sum >= bestScore-1e-12:
			ties++
			if s.rng.IntN(ties) == 0 {
				best = j
			}
		}
	}
	cb := s.cands[best]
	v := st.view(cb.i)
	gpus := append([]int(nil), s.gpuList(c, &v, cb.share)...)
	st.apply(cb.i, t, c.req, gpus)
	return Result{Placement: &Placement{TaskID: t.ID, NodeID: st.nodes[cb.i].ID, GPUIndices: gpus, Score: bestScore}}
}

// fitsEmpty reports whether node n's capacity can hold req once the node is
// free (the capacity part of "could ever run here").
func fitsEmpty(n *Node, req Resources) bool {
	c := n.Capacity
	switch {
	case c.CPUMillis < req.CPUMillis, c.MemoryMiB < req.MemoryMiB, c.GPUs < req.GPUs:
		return false
	case req.GPUMilli > 0 && c.GPUs < 1:
		return false
	}
	return true
}

// scanOrder returns a seeded start and a stride coprime with n, so the scan
// visits every node exactly once in a scattered order without an O(n)
// shuffle.
func (s *Session) scanOrder(n int) (start, stride int) {
	start = s.rng.IntN(n)
	if n <= 2 {
		return start, 1
	}
	for {
		stride = 1 + s.rng.IntN(n-1)
		if gcd(stride, n) == 1 {
			return start, stride
		}
	}
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// gpuList returns the GPUs the task would get on a node (a scratch slice).
func (s *Session) gpuList(c *taskCtx, v *view, share int) []int {
	s.gbuf = s.gbuf[:0]
	if share >= 0 {
		return append(s.gbuf, share)
	}
	if c.req.GPUs > 0 {
		for g, f := range v.gpuFree {
			if f >= 1000 {
				s.gbuf = append(s.gbuf, g)
				if len(s.gbuf) == c.req.GPUs {
					break
				}
			}
		}
	}
	return s.gbuf
}

// pickShare chooses the GPU for a share request on a feasible node: the one
// with the least free share that fits (best fit), the most free under the
// spread policy, or the least fragmenting under the fragmentation policy.
func (c *taskCtx) pickShare(e *Engine, st *state, i int, v *view) int {
	if c.policy == PolicyFragmentation {
		return e.frag.pickShare(c, st, i, v)
	}
	best := -1
	for g, f := range v.gpuFree {
		if f < c.req.GPUMilli {
			continue
		}
		if best < 0 || (c.policy == PolicySpread && f > v.gpuFree[best]) || (c.policy != PolicySpread && f < v.gpuFree[best]) {
			best = g
		}
	}
	return best
}

// NodeFree is a node's free capacity in a session's working copy.
type NodeFree struct {
	CPUMillis, MemoryMiB int64
	Tasks                int
	GPUFreeMilli         []int // per GPU; must not be modified
}

// Free returns the free capacity of the i-th snapshot node in the working
// copy (after the placements made so far).
func (s *Session) Free(i int) NodeFree {
	v := s.st.view(i)
	return NodeFree{CPUMillis: v.cpuFree, MemoryMiB: v.memFree, Tasks: v.tasks, GPUFreeMilli: v.gpuFree}
}

// Fragmentation returns the cluster's expected GPU fragmentation Σ_n F_n(M)
// in GPU milli, by FGD's published measure over the engine's workload
// (whatever FragModel scores with), in the working copy.
func (s *Session) Fragmentation() float64 {
	var f float64
	for i, n := range s.st.nodes {
		v := s.st.view(i)
		f += s.e.frag.fragRaw(v.cpuFree, v.memFree, n.GPUModel, v.gpuFree)
	}
	return f
}
