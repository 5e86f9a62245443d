package placement

// state is the engine's working copy of node usage for one Place call. It
// never mutates the Snapshot: a node is copied into an overlay the first time
// a placement touches it (copy-on-write), so preparing a batch costs O(1) per
// untouched node and a plan can never over-commit a node across its tasks.
type state struct {
	snap  *Snapshot
	nodes []*Node
	// over[i] is the working usage of node i once touched; nil means "as in
	// the snapshot".
	over []*nodeUsage

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
	// node, victims already proposed, nodes already hosting a preemption.
	byNode    map[string][]int
	claimed   map[string]bool
	preempted map[int]bool
}

// nodeUsage is the mutable usage of one node. Units as in Resources.
type nodeUsage struct {
	cpu, mem int64 // allocated millicores, MiB
	tasks    int
	gpuFree  []int // free milli per GPU, len == Capacity.GPUs
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

func newState(snap *Snapshot, tasks []Task, tab *nodeTable) *state {
	st := &state{snap: snap, nodes: snap.Nodes, over: make([]*nodeUsage, len(snap.Nodes)), tab: tab}
	st.batchIDs = make(map[string]bool, len(tasks))
	for i := range tasks {
		st.batchIDs[tasks[i].ID] = true
	}
	st.groups = newGroupIndex(st)
	return st
}

// snapGPUFree returns node n's per-GPU free milli as in the snapshot,
// normalised to Capacity.GPUs entries (missing entries are treated as busy,
// the conservative choice). The result must not be modified.
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
	if len(n.GPUFreeMilli) == g {
		return n.GPUFreeMilli
	}
	s := make([]int, g)
	copy(s, n.GPUFreeMilli)
	return s
}

// view is a read-only look at node i's current usage.
type view struct {
	cpuFree, memFree int64
	tasks            int
	gpuFree          []int
}

func (st *state) view(i int) view {
	n := st.nodes[i]
	if u := st.over[i]; u != nil {
		return view{cpuFree: n.Capacity.CPUMillis - u.cpu, memFree: n.Capacity.MemoryMiB - u.mem, tasks: u.tasks, gpuFree: u.gpuFree}
	}
	return view{
		cpuFree: n.Capacity.CPUMillis - n.Allocated.CPUMillis,
		memFree: n.Capacity.MemoryMiB - n.Allocated.MemoryMiB,
		tasks:   n.RunningTasks,
		gpuFree: snapGPUFree(n),
	}
}

// touch returns the writable usage of node i, copying it from the snapshot
// on first use.
func (st *state) touch(i int) *nodeUsage {
	if u := st.over[i]; u != nil {
		return u
	}
	n := st.nodes[i]
	g := snapGPUFree(n)
	u := &nodeUsage{cpu: n.Allocated.CPUMillis, mem: n.Allocated.MemoryMiB, tasks: n.RunningTasks, gpuFree: append([]int(nil), g...)}
	st.over[i] = u
	return u
}

// apply commits task t to node i with the given GPUs in the working copy.
func (st *state) apply(i int, t *Task, req Resources, gpus []int) {
	u := st.touch(i)
	u.cpu += req.CPUMillis
	u.mem += req.MemoryMiB
	u.tasks++
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
