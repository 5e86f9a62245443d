package placement

import "sync"

// nodeTable holds what the engine derives from the node set alone (IDs,
// labels, capacities, GPU models), never from usage: per-label value codes
// and indexes, the GPU index, the ID -> index map, the distinct values of a
// label, the largest capacity and the GPU capacity per model. Each part is
// built on first use, in one O(nodes) pass.
//
// A table lives for one Place call (or Session) unless the caller sets
// Snapshot.Generation: then the engine keeps the tables of the last few
// generations and reuses one when a later snapshot has the same Generation
// and the same node IDs in the same order (checked on every call, O(nodes)
// string compares, much cheaper than rebuilding maps). Usage (Allocated,
// GPUFreeMilli, RunningTasks) and the Quarantined/Ineligible/Reserved/MaxTasks flags
// are never cached: they are read from the snapshot on every call.
//
// A table is shared by the sessions that reuse it, possibly concurrently:
// builds happen under mu, and a session copies what it got into its own
// state so it locks at most once per label and part.
type nodeTable struct {
	mu  sync.Mutex
	gen uint64
	ids []string // node IDs, for the reuse check

	codes    map[string]*labelCodes
	idx      map[string]map[string][]int
	gpuIdx   map[string][]int
	gpuAll   []int
	byID     map[string]int
	values   map[string][]string
	maxCap   *Resources
	modelCap map[string]float64 // GPU milli capacity per model
	capAll   float64
}

// tableCacheSize is how many generations an engine keeps tables for (a
// coordinator may alternate between a few shards).
const tableCacheSize = 4

func newTable(snap *Snapshot) *nodeTable {
	return &nodeTable{gen: snap.Generation}
}

// table returns the node table for snap: a cached one when snap carries a
// Generation the engine has seen with the same node IDs, else a new one
// (cached when Generation is set).
func (e *Engine) table(snap *Snapshot) *nodeTable {
	if snap.Generation == 0 {
		return newTable(snap)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, t := range e.tabs {
		if t.gen != snap.Generation {
			continue
		}
		if t.sameNodes(snap.Nodes) {
			// Move to front (most recently used).
			copy(e.tabs[1:k+1], e.tabs[:k])
			e.tabs[0] = t
			return t
		}
		// Same generation, different nodes: the caller broke the contract
		// or reuses generations across shards; do not trust the entry.
		e.tabs = append(e.tabs[:k], e.tabs[k+1:]...)
		break
	}
	t := newTable(snap)
	t.ids = make([]string, len(snap.Nodes))
	for i, n := range snap.Nodes {
		t.ids[i] = n.ID
	}
	if len(e.tabs) >= tableCacheSize {
		e.tabs = e.tabs[:tableCacheSize-1]
	}
	e.tabs = append([]*nodeTable{t}, e.tabs...)
	return t
}

func (t *nodeTable) sameNodes(nodes []*Node) bool {
	if len(nodes) != len(t.ids) {
		return false
	}
	for i, n := range nodes {
		if n.ID != t.ids[i] {
			return false
		}
	}
	return true
}

// codes returns the value codes of label (filter.go).
func (st *state) codes(label string) *labelCodes {
	if lc, ok := st.labelCode[label]; ok {
		return lc
	}
	t := st.tab
	t.mu.Lock()
	lc, ok := t.codes[label]
	if !ok {
		lc = buildCodes(st.nodes, label)
		if t.codes == nil {
			t.codes = map[string]*labelCodes{}
		}
		t.codes[label] = lc
	}
	t.mu.Unlock()
	if st.labelCode == nil {
		st.labelCode = map[string]*labelCodes{}
	}
	st.labelCode[label] = lc
	return lc
}

func buildCodes(nodes []*Node, label string) *labelCodes {
	lc := &labelCodes{of: make([]int32, len(nodes)), code: map[string]int32{}}
	for i, n := range nodes {
		v, ok := n.Labels[label]
		if !ok {
			lc.of[i] = -1
			continue
		}
		k, seen := lc.code[v]
		if !seen {
			k = int32(len(lc.values))
			lc.code[v] = k
			lc.values = append(lc.values, v)
		}
		lc.of[i] = k
	}
	return lc
}

// labelIndex returns value -> node indices for label (index.go).
func (st *state) labelIndex(label string) map[string][]int {
	if m, ok := st.labelIdx[label]; ok {
		return m
	}
	lc := st.codes(label)
	t := st.tab
	t.mu.Lock()
	m, ok := t.idx[label]
	if !ok {
		m = make(map[string][]int, len(lc.values))
		lists := make([][]int, len(lc.values))
		for i, k := range lc.of {
			if k >= 0 {
				lists[k] = append(lists[k], i)
			}
		}
		for k, v := range lc.values {
			m[v] = lists[k]
		}
		if t.idx == nil {
			t.idx = map[string]map[string][]int{}
		}
		t.idx[label] = m
	}
	t.mu.Unlock()
	if st.labelIdx == nil {
		st.labelIdx = map[string]map[string][]int{}
	}
	st.labelIdx[label] = m
	return m
}

// gpuIndex returns GPU model -> indices of the nodes with GPUs; st.gpuAll
// lists all of them.
func (st *state) gpuIndex() map[string][]int {
	if st.gpuIdx != nil {
		return st.gpuIdx
	}
	t := st.tab
	t.mu.Lock()
	if t.gpuIdx == nil {
		t.gpuIdx = map[string][]int{}
		for i, n := range st.nodes {
			if n.Capacity.GPUs > 0 {
				t.gpuIdx[n.GPUModel] = append(t.gpuIdx[n.GPUModel], i)
				t.gpuAll = append(t.gpuAll, i)
			}
		}
	}
	st.gpuIdx, st.gpuAll = t.gpuIdx, t.gpuAll
	t.mu.Unlock()
	return st.gpuIdx
}

// nodeIndex returns node ID -> index.
func (st *state) nodeIndex() map[string]int {
	if st.byID != nil {
		return st.byID
	}
	t := st.tab
	t.mu.Lock()
	if t.byID == nil {
		t.byID = make(map[string]int, len(st.nodes))
		for i, n := range st.nodes {
			t.byID[n.ID] = i
		}
	}
	st.byID = t.byID
	t.mu.Unlock()
	return st.byID
}

// labelValues returns the distinct values of label over the snapshot's
// nodes (spread scoring).
func (st *state) labelValues(label string) []string {
	return st.codes(label).values
}

// maxCapacity is the largest node capacity per dimension (best-fit scale).
func (st *state) maxCapacity() *Resources {
	if st.maxCap != nil {
		return st.maxCap
	}
	t := st.tab
	t.mu.Lock()
	if t.maxCap == nil {
		var r Resources
		for _, n := range st.nodes {
			r.CPUMillis = max(r.CPUMillis, n.Capacity.CPUMillis)
			r.MemoryMiB = max(r.MemoryMiB, n.Capacity.MemoryMiB)
			r.GPUs = max(r.GPUs, n.Capacity.GPUs)
		}
		t.maxCap = &r
	}
	st.maxCap = t.maxCap
	t.mu.Unlock()
	return st.maxCap
}

// gpuCapacity returns GPU milli capacity per model and in total.
func (st *state) gpuCapacity() (map[string]float64, float64) {
	t := st.tab
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.modelCap == nil {
		t.modelCap = map[string]float64{}
		for _, n := range st.nodes {
			if n.Capacity.GPUs > 0 {
				t.modelCap[n.GPUModel] += float64(n.Capacity.GPUs) * 1000
				t.capAll += float64(n.Capacity.GPUs) * 1000
			}
		}
	}
	return t.modelCap, t.capAll
}

// codeMemo decides a label rule once per distinct value of its label: the
// outcome of a matcher depends only on the node's value (matchValue). Labels
// with very many distinct values (host names) are matched per node instead,
// to keep the per-task memo small.
type codeMemo struct {
	lc   *labelCodes
	memo []int8 // per value code, last slot = label missing: 0 unknown, 1 match, 2 no match
	off  bool
}

const codeMemoMaxValues = 4096

func (cm *codeMemo) match(m *matcher, st *state, i int) bool {
	if cm.off {
		return m.match(st.nodes[i].Labels)
	}
	if cm.lc == nil {
		cm.lc = st.codes(m.label)
		if len(cm.lc.values) > codeMemoMaxValues {
			cm.off = true
			return m.match(st.nodes[i].Labels)
		}
		cm.memo = make([]int8, len(cm.lc.values)+1)
	}
	k := cm.lc.of[i]
	if k < 0 {
		k = int32(len(cm.lc.values))
	}
	switch cm.memo[k] {
	case 1:
		return true
	case 2:
		return false
	}
	var ok bool
	if int(k) < len(cm.lc.values) {
		ok = m.matchValue(cm.lc.values[k], true)
	} else {
		ok = m.matchValue("", false)
	}
	cm.memo[k] = 2
	if ok {
		cm.memo[k] = 1
	}
	return ok
}
