package placement

// groupIndex counts a task group's allocations per node and per label value,
// over the snapshot's existing allocations (minus those being re-placed in
// this batch) plus the placements made so far in the batch. Counts are built
// lazily, the first time a rule of the group needs them, then kept current.
type groupIndex struct {
	st       *state
	existing map[string][]int // group -> indices into Snapshot.Existing
	placed   map[string][]int // group -> node indices placed in this batch
	perNode  map[string]map[int]int
	perValue map[string]map[string]map[string]int // group -> label -> value -> n
	// aaScopes holds, per anti-affinity group, the scopes its members use.
	aaScopes map[string]map[string]bool
}

func newGroupIndex(st *state) *groupIndex {
	return &groupIndex{st: st, placed: map[string][]int{}}
}

// groupKey is the key group rules count under: the task's GroupKey, or its
// own ID for a task without a group.
func groupKey(t *Task) string {
	if t.GroupKey != "" {
		return t.GroupKey
	}
	return t.ID
}

func (g *groupIndex) init() {
	if g.existing != nil {
		return
	}
	g.existing = map[string][]int{}
	for i := range g.st.snap.Existing {
		a := &g.st.snap.Existing[i]
		if g.st.batchIDs[a.TaskID] {
			continue
		}
		k := a.GroupKey
		if k == "" {
			k = a.TaskID
		}
		g.existing[k] = append(g.existing[k], i)
		if a.AntiAffinityGroup != "" {
			ak := antiAffinityKey(a.AntiAffinityGroup)
			sk := antiAffinityScopeKey(a.AntiAffinityGroup, a.AntiAffinityScope)
			g.existing[ak] = append(g.existing[ak], i)
			g.existing[sk] = append(g.existing[sk], i)
			g.noteScope(a.AntiAffinityGroup, a.AntiAffinityScope)
		}
	}
}

// antiAffinityKey is the key all the members of anti-affinity group name
// are counted under, antiAffinityScopeKey the key of those of one scope
// (neither can be a GroupKey or a task ID: those never start with a NUL
// byte).
func antiAffinityKey(name string) string { return "\x00aa:" + name }

func antiAffinityScopeKey(name, scope string) string {
	return "\x00aa:" + name + "\x00" + normScope(scope)
}

// normScope is scope with "" spelled ScopeNode.
func normScope(scope string) string {
	if scope == "" {
		return ScopeNode
	}
	return scope
}

// noteScope records that a member of group name uses scope.
func (g *groupIndex) noteScope(name, scope string) {
	if g.aaScopes == nil {
		g.aaScopes = map[string]map[string]bool{}
	}
	m := g.aaScopes[name]
	if m == nil {
		m = map[string]bool{}
		g.aaScopes[name] = m
	}
	m[normScope(scope)] = true
}

// scopes is the scopes the members of group name use (existing and placed
// in this batch).
func (g *groupIndex) scopes(name string) map[string]bool {
	g.init()
	return g.aaScopes[name]
}

// nodeCounts returns group -> node index -> allocations.
func (g *groupIndex) nodeCounts(group string) map[int]int {
	if g.perNode == nil {
		g.perNode = map[string]map[int]int{}
	}
	if m, ok := g.perNode[group]; ok {
		return m
	}
	g.init()
	m := map[int]int{}
	for _, ai := range g.existing[group] {
		if i, ok := g.st.nodeIndex()[g.st.snap.Existing[ai].NodeID]; ok {
			m[i]++
		}
	}
	for _, i := range g.placed[group] {
		m[i]++
	}
	g.perNode[group] = m
	return m
}

// valueCounts returns label value -> allocations of the group on nodes with
// that value. Nodes without the label count under "".
func (g *groupIndex) valueCounts(group, label string) map[string]int {
	if g.perValue == nil {
		g.perValue = map[string]map[string]map[string]int{}
	}
	byLabel := g.perValue[group]
	if byLabel == nil {
		byLabel = map[string]map[string]int{}
		g.perValue[group] = byLabel
	}
	if m, ok := byLabel[label]; ok {
		return m
	}
	g.init()
	m := map[string]int{}
	for _, ai := range g.existing[group] {
		if i, ok := g.st.nodeIndex()[g.st.snap.Existing[ai].NodeID]; ok {
			m[g.st.nodes[i].Labels[label]]++
		}
	}
	for _, i := range g.placed[group] {
		m[g.st.nodes[i].Labels[label]]++
	}
	byLabel[label] = m
	return m
}

// add records a placement of t on node i: under its group, and under its
// anti-affinity group if it has one.
func (g *groupIndex) add(t *Task, i int) {
	g.addUnder(groupKey(t), i)
	if aa := t.AntiAffinity; aa.Group != "" {
		g.init()
		g.addUnder(antiAffinityKey(aa.Group), i)
		g.addUnder(antiAffinityScopeKey(aa.Group, aa.Scope), i)
		g.noteScope(aa.Group, aa.Scope)
	}
}

func (g *groupIndex) addUnder(group string, i int) {
	g.placed[group] = append(g.placed[group], i)
	if m, ok := g.perNode[group]; ok {
		m[i]++
	}
	for label, m := range g.perValue[group] {
		m[g.st.nodes[i].Labels[label]]++
	}
}
