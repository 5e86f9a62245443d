package placement

// Filters are the feasibility stage: the Kubernetes scheduling framework's
// Filter extension point, Nomad's FeasibilityChecker iterators. Each filter
// has one job and answers, for one task and one node, "" (feasible) or the
// reason key under which the node is counted in an explanation. The pipeline
// for a task holds only the filters its job needs (see compileTask) and runs
// them in order, cheapest and most structural first and resources last, so a
// node is counted once, under the first filter that rejected it (Nomad's
// AllocMetric.ConstraintFiltered/DimensionExhausted, K8s's FitError).
type filter interface {
	// check returns "" if node i can run the task, else the reason key.
	check(c *taskCtx, st *state, i int, v *view) string
}

// Reason keys for the built-in filters.
const (
	ReasonIneligible    = "ineligible"
	ReasonQuarantined   = "quarantined"
	ReasonReserved      = "reserved for another shard owner"
	ReasonExcluded      = "excluded"
	ReasonJurisdiction  = "jurisdiction"
	ReasonGPUModel      = "gpu model"
	ReasonDistinctHosts = "distinct hosts"
	ReasonAntiAffinity  = "anti-affinity"
	ReasonMaxTasks      = "max tasks"
	ReasonCPU           = "cpu"
	ReasonMemory        = "memory"
	ReasonGPU           = "gpu"
	ReasonGPUShare      = "gpu share"

	// ReasonFailedHere counts nodes the task failed on, kept out while
	// another node could run it (see Session.PlaceOne).
	ReasonFailedHere = "failed here before"
)

// eligibilityFilter drops quarantined, ineligible (draining, not ready) and
// reserved nodes.
type eligibilityFilter struct{}

func (eligibilityFilter) check(_ *taskCtx, st *state, i int, _ *view) string {
	switch st.slot(i).bad {
	case slotIneligible:
		return ReasonIneligible
	case slotQuarantined:
		return ReasonQuarantined
	case slotReserved:
		return ReasonReserved
	}
	return ""
}

// excludedFilter drops nodes the task is hard-excluded from (it was refused
// there recently: the reject-and-requeue path of DESIGN.md).
type excludedFilter struct{}

func (excludedFilter) check(c *taskCtx, st *state, i int, _ *view) string {
	if c.t.ExcludedNodes[st.nodes[i].ID] {
		return ReasonExcluded
	}
	return ""
}

// JurisdictionLabel is the node label the jurisdiction filter reads.
const JurisdictionLabel = "jurisdiction"

// jurisdictionFilter re-checks sovereignty in the region (defence in depth):
// the node's "jurisdiction" label must be one of the task's Jurisdictions. A
// node without the label is outside every jurisdiction.
type jurisdictionFilter struct {
	lc      *labelCodes // st.codes(JurisdictionLabel), on first use
	allowed []bool      // by value code of lc
}

func (f *jurisdictionFilter) check(c *taskCtx, st *state, i int, _ *view) string {
	lc := f.lc
	if lc == nil {
		lc = st.codes(JurisdictionLabel)
		f.lc = lc
		f.allowed = make([]bool, len(lc.values)+1)
		for _, j := range c.t.Jurisdictions {
			if k, ok := lc.code[j]; ok {
				f.allowed[k] = true
			}
		}
	}
	k := lc.of[i]
	if k < 0 || !f.allowed[k] {
		return ReasonJurisdiction
	}
	return ""
}

// labelCodes maps each node to a small integer per value of one label, so a
// set-membership filter is an array read instead of a map lookup.
type labelCodes struct {
	of     []int32 // node index -> value code, -1 if the label is missing
	code   map[string]int32
	values []string
}

// constraintFilter enforces one hard label constraint.
type constraintFilter struct {
	m      matcher
	reason string   // "constraint <rule>", built on the first rejection
	memo   codeMemo // outcome per value of the label
}

func (f *constraintFilter) check(_ *taskCtx, st *state, i int, _ *view) string {
	if !f.m.bad && f.memo.match(&f.m, st, i) {
		return ""
	}
	if f.reason == "" {
		f.reason = "constraint " + describeRule(f.m.label, f.m.op, f.m.vals)
	}
	return f.reason
}

// gpuModelFilter keeps nodes whose GPU model is in the task's allowed set.
type gpuModelFilter struct{}

func (gpuModelFilter) check(c *taskCtx, st *state, i int, _ *view) string {
	if contains(c.t.GPUModels, st.nodes[i].GPUModel) {
		return ""
	}
	return ReasonGPUModel
}

// distinctHostsFilter keeps at most one task of the group per node (Nomad's
// distinct_hosts, K8s pod anti-affinity on kubernetes.io/hostname).
type distinctHostsFilter struct{}

func (distinctHostsFilter) check(c *taskCtx, st *state, i int, _ *view) string {
	if st.groups.nodeCounts(c.group)[i] > 0 {
		return ReasonDistinctHosts
	}
	return ""
}

// antiAffinityFilter keeps the task off nodes that run a task of any group in
// Task.AntiAffinityGroups, and off nodes whose batch-placed tasks are
// anti-affine to the task's group.
type antiAffinityFilter struct{}

func (antiAffinityFilter) check(c *taskCtx, st *state, i int, _ *view) string {
	for _, g := range c.t.AntiAffinityGroups {
		if st.groups.nodeCounts(g)[i] > 0 {
			return ReasonAntiAffinity
		}
	}
	if st.antiOn != nil && st.antiOn[i][c.group] {
		return ReasonAntiAffinity
	}
	return ""
}

// groupAntiAffinityFilter keeps the task out of every scope (a node, or the
// nodes sharing a value of the scope label) that holds another member of
// its anti-affinity group (Task.AntiAffinity).
type groupAntiAffinityFilter struct {
	name   string // the group
	scope  string // the task's scope (normScope)
	reason string // "anti-affinity group <name> per <scope>"
}

func (f *groupAntiAffinityFilter) check(_ *taskCtx, st *state, i int, _ *view) string {
	// Any member in this task's scope of node i.
	if inScope(st, antiAffinityKey(f.name), f.scope, i) {
		return f.reason
	}
	// Node i in the scope of a member of another scope.
	for s := range st.groups.scopes(f.name) {
		if s != f.scope && inScope(st, antiAffinityScopeKey(f.name, s), s, i) {
			return f.reason
		}
	}
	return ""
}

// inScope reports whether the members counted under key hold node i's
// scope: node i itself for ScopeNode, else node i's value of the label.
func inScope(st *state, key, scope string, i int) bool {
	if scope == ScopeNode {
		return st.groups.nodeCounts(key)[i] > 0
	}
	return st.groups.valueCounts(key, scope)[st.nodes[i].Labels[scope]] > 0
}

// distinctPropertyFilter caps the group's tasks per value of a label
// (Nomad's distinct_property). A node without the label counts under "".
type distinctPropertyFilter struct {
	label  string
	max    int
	reason string
}

func (f *distinctPropertyFilter) check(c *taskCtx, st *state, i int, _ *view) string {
	v := st.nodes[i].Labels[f.label]
	if st.groups.valueCounts(c.group, f.label)[v] >= f.max {
		return f.reason
	}
	return ""
}

// maxTasksFilter enforces Node.MaxTasks.
type maxTasksFilter struct{}

func (maxTasksFilter) check(_ *taskCtx, st *state, i int, v *view) string {
	if m := int(st.slot(i).maxTasks); m > 0 && v.tasks >= m {
		return ReasonMaxTasks
	}
	return ""
}

// resourceFilter checks CPU, memory, whole GPUs (fully idle devices) and a
// GPU share (one device with at least GPUMilli free), in that order (K8s
// NodeResourcesFit; GPU sharing as in the Alibaba GPU-sharing scheduler the
// FGD paper builds on).
type resourceFilter struct{}

func (resourceFilter) check(c *taskCtx, _ *state, _ int, v *view) string {
	return fits(c.req, v)
}

func fits(r Resources, v *view) string {
	if r.CPUMillis > v.cpuFree {
		return ReasonCPU
	}
	if r.MemoryMiB > v.memFree {
		return ReasonMemory
	}
	if r.GPUs > 0 && countIdle(v.gpuFree) < r.GPUs {
		return ReasonGPU
	}
	if r.GPUMilli > 0 && maxFree(v.gpuFree) < r.GPUMilli {
		return ReasonGPUShare
	}
	return ""
}
