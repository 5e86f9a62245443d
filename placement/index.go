package placement

// Per-label indexes for the bounded candidate scan. A task whose hard rules
// pin a label to a few values (jurisdiction, "=" and "in" constraints) or
// that needs a GPU (of given models) is scanned only over the nodes that can
// pass that rule, the smallest such set: Nomad's "feasible node" iterators
// and K8s's node-name/label pre-filters do the same. An index is built on
// first use, in one O(nodes) pass per label, and kept with the node table
// (table.go) across calls when the caller sets Snapshot.Generation. Explanations never use indexes:
// they always count every node.

// candSet is a virtual concatenation of node-index lists (disjoint); nil
// lists means every node.
type candSet struct {
	lists [][]int
	total int
}

func (cs *candSet) at(p int) int {
	if cs.lists == nil {
		return p
	}
	for _, l := range cs.lists {
		if p < len(l) {
			return l[p]
		}
		p -= len(l)
	}
	return -1
}

// candidates returns the smallest node set the task can be placed in.
func (st *state) candidates(c *taskCtx) candSet {
	best := candSet{total: len(st.nodes)}
	consider := func(idx map[string][]int, values []string) {
		var cs candSet
		for k, v := range values {
			dup := false
			for _, w := range values[:k] {
				if w == v {
					dup = true
					break
				}
			}
			if l := idx[v]; !dup && len(l) > 0 {
				cs.lists = append(cs.lists, l)
				cs.total += len(l)
			}
		}
		if cs.lists == nil {
			cs.lists = [][]int{} // nothing can match: an empty, non-nil set
		}
		if cs.total < best.total || (best.lists == nil && cs.total <= best.total) {
			best = cs
		}
	}
	if len(c.t.Jurisdictions) > 0 {
		consider(st.labelIndex(JurisdictionLabel), c.t.Jurisdictions)
	}
	for _, k := range c.t.Constraints {
		if (k.Op == OpEq && len(k.Values) == 1) || k.Op == OpIn {
			consider(st.labelIndex(k.Label), k.Values)
		}
	}
	if c.req.GPUs > 0 || c.req.GPUMilli > 0 {
		idx := st.gpuIndex()
		if len(c.t.GPUModels) > 0 {
			consider(idx, c.t.GPUModels)
		} else if len(st.gpuAll) < best.total {
			best = candSet{lists: [][]int{st.gpuAll}, total: len(st.gpuAll)}
		}
	}
	return best
}
