package placement

import "math"

// state is the engine's working copy of node usage for one Place call. It
// never mutates the Snapshot: each node's free capacity and flags are copied
// into a compact slot per call (one sequential O(nodes) pass), its GPU
// vector on the first placement there (copy-on-write), and a plan can never
// over-commit a node across its tasks.
type state struct {
	snap  *Snapshot
	nodes []*Node
	// slots[i] is the working usage of node i (copied from the snapshot on
	// first use, see state.slot; GPU slices copied on first write).
	slots []slot
	epoch uint32 // this state's stamp on its slots

	// batchIDs are the task IDs being placed in this call. An existing
	// allocation with one of these IDs is being re-placed and does not count
	// toward group rules (its task's new placement supersedes it).
	batchIDs map[string]bool

	groups *groupIndex
	// antiOn[i] holds the groups that tasks placed on node i in this batch
	// are anti-affine to.
	antiOn map[int]map[string]bool
	// tab is the node table (table.go); the fields below copy what this
	// state got from it.
	tab  *nodeTable
	byID map[string]int
	// fmemo memoises the fragmentation of a node state (see fragModel).
	fmemo map[fragKey]float64
	// pressure is the per-GPU-model demand pressure (fgd.go).
	pressure map[string]float64
	// maxCap is the largest node capacity per dimension (best-fit scale).
	maxCap *Resources

	// Candidate indexes (index.go) and value codes (filter.go), from tab.
	labelIdx  map[string]map[string][]int
	gpuIdx    map[string][]int
	gpuAll    []int
	labelCode map[string]*labelCodes

	// Preemption bookkeeping, built on first use: existing allocations by
	// node index, victims already proposed (by index in Existing), nodes
	// already hosting a preemption.
	byNode    [][]victimRef
	claimed   []bool
	preempted []bool

	// freeBound is the most CPU and memory free on any node, computed once
	// a task found no node (freeOK): placements only lower free room in a
	// state, so it stays an upper bound, and a later task asking more than
	// it fits nowhere without a scan (a full region's preemptors).
	freeCPU, freeMem int64
	freeOK           bool
}

// noRoom reports whether req exceeds the free bound (no node can fit it).
func (st *state) noRoom(req Resources) bool {
	return st.freeOK && (req.CPUMillis > st.freeCPU || req.MemoryMiB > st.freeMem)
}

// boundFree computes freeBound over every node.
func (st *state) boundFree() {
	st.freeCPU, st.freeMem, st.freeOK = math.MinInt64, math.MinInt64, true
	for i := range st.nodes {
		s := st.slot(i)
		st.freeCPU, st.freeMem = max(st.freeCPU, s.cpuFree), max(st.freeMem, s.memFree)
	}
}

// idleGPUs[k] is a shared, read-only slice of k idle GPUs.
var idleGPUs = func() [][]int {
	out := make([][]int, 17)
	for k := range out {
		s := make([]int, k)
		for i := range s {
			s[i] = 1000
		}
		out[k] = s
	}
	return out
}()

func newState(snap *Snapshot, tasks []Task, tab *nodeTable, buf *slotBuf) *state {
	st := &state{snap: snap, nodes: snap.Nodes, tab: tab}
	st.epoch = buf.next(len(snap.Nodes))
	st.slots = buf.slots
	if len(tasks)*eagerFillFactor >= len(st.nodes) {
		// A batch this large visits most nodes anyway: fill in node order
		// (sequential reads of the Nodes) rather than in scan order.
		for i := range st.slots {
			fillSlot(&st.slots[i], st.nodes[i], st.epoch)
		}
	}
	st.batchIDs = make(map[string]bool, len(tasks))
	for i := range tasks {
		st.batchIDs[tasks[i].ID] = true
	}
	st.groups = newGroupIndex(st)
	return st
}

// snapGPUFree returns node n's per-GPU free milli as in the snapshot,
// normalised to Capacity.GPUs entries (missing entries are treated as busy,
// the conservative choice) of 0..1000 each (values outside are clamped).
// The result must not be modified.
func snapGPUFree(n *Node) []int {
	g := n.Capacity.GPUs
	if g <= 0 {
		return nil
	}
	if n.GPUFreeMilli == nil {
		if g < len(idleGPUs) {
			return idleGPUs[g]
		}
		s := make([]int, g)
		for i := range s {
			s[i] = 1000
		}
		return s
	}
	inRange := true
	for _, f := range n.GPUFreeMilli {
		if f < 0 || f > 1000 {
			inRange = false
			break
		}
	}
	if len(n.GPUFreeMilli) == g && inRange {
		return n.GPUFreeMilli
	}
	s := make([]int, g)
	copy(s, n.GPUFreeMilli)
	for i, f := range s {
		s[i] = min(max(f, 0), 1000)
	}
	return s
}

// view is a read-only look at node i's current usage.
type view struct {
	cpuFree, memFree int64
	tasks            int
	gpuFree          []int
}

// slot is node i's working usage and flags in one compact record, read by
// the candidate scan without dereferencing the Node (slots are contiguous;
// Nodes are scattered on the heap).
type slot struct {
	cpuFree, memFree int64
	cpuCap, memCap   int64
	gpuFree          []int // shared with the snapshot until owned
	gpuModel         string
	tasks            int32
	maxTasks         int32
	bad              uint8   // 0 eligible, else slotIneligible, slotQuarantined or slotReserved
	owned            bool    // gpuFree is this state's copy
	epoch            uint32  // the state this record was filled for (state.slot)
	frag             float64 // F_n(M) of the current usage, when fragOK (fgd.go fragNow)
	fragOK           bool
}

const (
	slotIneligible uint8 = 1 + iota
	slotQuarantined
	slotReserved
)

// slotBuf is a reusable slot array: a slot is valid for the state whose
// epoch it carries, so a reused array needs no clearing (Engine.Place pools
// them). Filling slots on first use (state.slot) makes a Place call cost
// O(nodes it visits), not O(nodes): at 100,000 nodes, copying every node's
// usage, and then clearing a fresh array, took most of a 10-task call.
type slotBuf struct {
	slots []slot
	epoch uint32
}

// next readies b for a state of n nodes and returns the state's epoch.
func (b *slotBuf) next(n int) uint32 {
	if cap(b.slots) < n {
		b.slots, b.epoch = make([]slot, n), 0
	}
	b.slots = b.slots[:n]
	b.epoch++
	if b.epoch == 0 { // wrapped: old stamps could match again
		clear(b.slots)
		b.epoch = 1
	}
	return b.epoch
}

// eagerFillFactor: a batch of k tasks fills every slot up front when
// k × eagerFillFactor ≥ nodes (each task visits about 64-200 nodes; at
// 10,000 nodes and 1,000 tasks, filling in scan order cost 7-10% of the
// call, n=6 A/B), else slots are filled on first use (at 100,000 nodes a
// 10-task call went from 17 ms to 0.8 ms).
const eagerFillFactor = 16

// slot returns node i's working record, filled from the snapshot on first
// use in this state.
func (st *state) slot(i int) *slot {
	s := &st.slots[i]
	if s.epoch != st.epoch {
		fillSlot(s, st.nodes[i], st.epoch)
	}
	return s
}

func fillSlot(s *slot, n *Node, epoch uint32) {
	*s = slot{epoch: epoch,
		cpuFree: n.Capacity.CPUMillis - n.Allocated.CPUMillis, memFree: n.Capacity.MemoryMiB - n.Allocated.MemoryMiB,
		cpuCap: n.Capacity.CPUMillis, memCap: n.Capacity.MemoryMiB,
		gpuFree: snapGPUFree(n), gpuModel: n.GPUModel,
		tasks: int32(min(n.RunningTasks, 1<<30)), maxTasks: int32(min(n.MaxTasks, 1<<30))}
	switch {
	case n.Ineligible:
		s.bad = slotIneligible
	case n.Quarantined:
		s.bad = slotQuarantined
	case n.Reserved:
		s.bad = slotReserved
	}
}

func (st *state) view(i int) view {
	s := st.slot(i)
	return view{cpuFree: s.cpuFree, memFree: s.memFree, tasks: int(s.tasks), gpuFree: s.gpuFree}
}

// apply commits task t to node i with the given GPUs in the working copy.
func (st *state) apply(i int, t *Task, req Resources, gpus []int) {
	u := st.slot(i)
	u.fragOK = false
	u.cpuFree -= req.CPUMillis
	u.memFree -= req.MemoryMiB
	u.tasks++
	if len(gpus) > 0 && !u.owned {
		u.gpuFree = append([]int(nil), u.gpuFree...)
		u.owned = true
	}
	for _, g := range gpus {
		if req.GPUs > 0 {
			u.gpuFree[g] = 0
		} else {
			u.gpuFree[g] -= req.GPUMilli
		}
	}
	st.groups.add(t, i)
	if len(t.AntiAffinityGroups) > 0 {
		if st.antiOn == nil {
			st.antiOn = map[int]map[string]bool{}
		}
		if st.antiOn[i] == nil {
			st.antiOn[i] = map[string]bool{}
		}
		for _, g := range t.AntiAffinityGroups {
			st.antiOn[i][g] = true
		}
	}
}

// normRequest normalises a request: a GPUMilli share of 1000 or more is
// whole GPUs; GPUs takes precedence over GPUMilli when both are set.
func normRequest(r Resources) Resources {
	if r.GPUs > 0 {
		r.GPUMilli = 0
	} else if r.GPUMilli >= 1000 {
		r.GPUs = r.GPUMilli / 1000
		r.GPUMilli = 0
	}
	if r.GPUs < 0 {
		r.GPUs = 0
	}
	if r.GPUMilli < 0 {
		r.GPUMilli = 0
	}
	return r
}

// countIdle is the number of fully idle GPUs.
func countIdle(gpu []int) int {
	k := 0
	for _, f := range gpu {
		if f >= 1000 {
			k++
		}
	}
	return k
}

// maxFree is the largest free share of any single GPU.
func maxFree(gpu []int) int {
	m := 0
	for _, f := range gpu {
		if f > m {
			m = f
		}
	}
	return m
}

func sumFree(gpu []int) int {
	s := 0
	for _, f := range gpu {
		s += f
	}
	return s
}
