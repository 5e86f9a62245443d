package placement

import "fmt"

// taskCtx is a task compiled for one placement: its normalised request, its
// rules parsed once, and the filter and score stages its job needs, in order.
// Building the pipeline per task is what makes stages composable per job:
// a task without constraints pays for no constraint filter.
type taskCtx struct {
	t      *Task
	req    Resources
	group  string
	policy Policy

	aff        []affinityRule
	inputBytes int64
	spread     []spreadCache // per Spread, boost per label value (score.go)

	// filters run before resources; the resource filter is last. nonRes is
	// the count of filters that are not about capacity (used to tell
	// fragmentation from exclusion in explanations).
	filters []filter
	nonRes  int
	static  int // filters[:static] need no usage view
	// scan is filters[:static] in the order the candidate scan runs them
	// (any order gives the same yes/no; explanations use filters' order).
	scan []filter

	scorers []scoreStage
	wsum    float64

	// avoidFailed: the task is unplaced while nodes it failed on
	// (t.FailedOn) are kept out because another node could run it; explain
	// counts them under ReasonFailedHere.
	avoidFailed bool
}

type affinityRule struct {
	m      matcher
	weight int
	memo   codeMemo
}

type scoreStage struct {
	s scorer
	w float64
	n normKind
}

func (e *Engine) compileTask(t *Task) *taskCtx {
	c := &taskCtx{t: t, req: normRequest(t.Request), group: groupKey(t), policy: t.Policy,
		filters: make([]filter, 0, 8+len(t.Constraints)), scorers: make([]scoreStage, 0, 6)}
	if c.policy == "" {
		c.policy = e.opts.Policy
	}
	// Filters: structural and cheap first, capacity last.
	c.filters = append(c.filters, eligibilityFilter{})
	if len(t.ExcludedNodes) > 0 {
		c.filters = append(c.filters, excludedFilter{})
	}
	if len(t.Jurisdictions) > 0 {
		c.filters = append(c.filters, &jurisdictionFilter{})
	}
	for _, k := range t.Constraints {
		m := compileMatcher(k.Label, k.Op, k.Values)
		c.filters = append(c.filters, &constraintFilter{m: m})
	}
	if len(t.GPUModels) > 0 && (c.req.GPUs > 0 || c.req.GPUMilli > 0) {
		c.filters = append(c.filters, gpuModelFilter{})
	}
	// Everything above reads only the node, not its usage.
	c.static = len(c.filters)
	// The scan runs the label filters first: they read compact per-label
	// value codes, so a node they reject is never dereferenced.
	c.scan = make([]filter, 0, c.static)
	for _, f := range c.filters {
		switch f.(type) {
		case *jurisdictionFilter, *constraintFilter:
			c.scan = append(c.scan, f)
		}
	}
	for _, f := range c.filters[:c.static] {
		switch f.(type) {
		case *jurisdictionFilter, *constraintFilter:
		default:
			c.scan = append(c.scan, f)
		}
	}
	if t.DistinctHosts {
		c.filters = append(c.filters, distinctHostsFilter{})
	}
	c.filters = append(c.filters, antiAffinityFilter{})
	if aa := t.AntiAffinity; aa.Group != "" {
		sc := normScope(aa.Scope)
		f := &groupAntiAffinityFilter{name: aa.Group, scope: sc, reason: ReasonAntiAffinity + " group " + aa.Group + " per " + sc}
		c.filters = append(c.filters, f)
	}
	for _, d := range t.DistinctProperties {
		mx := d.MaxPerValue
		if mx <= 0 {
			mx = 1
		}
		c.filters = append(c.filters, &distinctPropertyFilter{label: d.Label, max: mx,
			reason: fmt.Sprintf("distinct property %s (max %d)", d.Label, mx)})
	}
	c.filters = append(c.filters, maxTasksFilter{})
	c.nonRes = len(c.filters)
	c.filters = append(c.filters, resourceFilter{})

	// Scores.
	w := e.w
	switch c.policy {
	case PolicySpread:
		c.addScore(fitScorer{spread: true}, w.Fit, normFixed)
	case PolicyFragmentation:
		c.addScore(e.fragScorer, w.Fit, normMinMax)
		// Bin-packing breaks ties between equally fragmenting nodes.
		c.addScore(fitScorer{}, w.Fit*fragTieBreak, normFixed)
	case PolicyBestFit:
		c.addScore(bestFitScorer{}, w.Fit, normFixed)
	case PolicyRandom:
		// No fit score: the seeded tie-break picks uniformly.
	default:
		c.addScore(fitScorer{}, w.Fit, normFixed)
	}
	if len(t.Affinities) > 0 {
		for _, a := range t.Affinities {
			c.aff = append(c.aff, affinityRule{m: compileMatcher(a.Label, a.Op, a.Values), weight: a.Weight})
		}
		c.addScore(affinityScorer{}, w.Affinity, normFixed)
	}
	if len(t.Spreads) > 0 {
		c.addScore(spreadScorer{}, w.Spread, normFixed)
	}
	for _, d := range t.Datasets {
		c.inputBytes += max(d.SizeBytes, 0)
	}
	if c.inputBytes > 0 {
		c.addScore(localityScorer{}, w.Locality, normFixed)
	}
	if len(t.FailedOn) > 0 {
		c.addScore(failureScorer{}, w.FailurePenalty, normFixed)
	}
	return c
}

func (c *taskCtx) addScore(s scorer, w float64, n normKind) {
	c.scorers = append(c.scorers, scoreStage{s: s, w: w, n: n})
	c.wsum += w
}

// feasible runs the filter stage on node i: "" or the first reason.
func (c *taskCtx) feasible(st *state, i int, v *view) string {
	for _, f := range c.filters {
		if r := f.check(c, st, i, v); r != "" {
			return r
		}
	}
	return ""
}

// staticOK runs the filters that read only the node (labels, flags), so the
// scan can skip building a usage view for nodes they reject.
func (c *taskCtx) staticOK(st *state, i int) bool {
	for _, f := range c.scan {
		if f.check(c, st, i, nil) != "" {
			return false
		}
	}
	return true
}

// dynamicOK runs the remaining filters.
func (c *taskCtx) dynamicOK(st *state, i int, v *view) bool {
	for _, f := range c.filters[c.static:] {
		if f.check(c, st, i, v) != "" {
			return false
		}
	}
	return true
}
