package scheduler

import (
	"strconv"

	"apiary.dev/apiary/placement"
	"apiary.dev/apiary/regional/taskstate"
)

// Conversion of the owner's records (protobuf specs, JSON records) into the
// placement engine's types. Nothing here reads etcd or decides.

// placementNode converts a ready node for the engine (without its usage,
// which setUsage fills). A node without a "jurisdiction" label gets the
// region's (jurisdiction, when not empty).
func placementNode(n *cNode, jurisdiction string) *placement.Node {
	labels := n.Rec.Labels
	if _, ok := labels["jurisdiction"]; !ok && jurisdiction != "" {
		labels = make(map[string]string, len(n.Rec.Labels)+1)
		for k, v := range n.Rec.Labels {
			labels[k] = v
		}
		labels["jurisdiction"] = jurisdiction
	}
	return &placement.Node{ID: n.id, Labels: labels,
		Capacity: placement.Resources{CPUMillis: n.Rec.Capacity.GetCpuMillis(), MemoryMiB: n.Rec.Capacity.GetMemoryMb(), GPUs: int(n.Rec.Capacity.GetGpus())},
		GPUModel: n.Rec.GPUModel, MaxTasks: int(n.Rec.MaxTasks), Quarantined: n.Rec.Quarantined || n.Health.Quarantine != nil,
		Ineligible: n.Rec.Draining || n.Rec.Ineligible, Datasets: n.Datasets()}
}

// groupKey names a task's group for the engine: "<jobID>/<group index>".
func groupKey(t *taskstate.Task) string { return t.JobID + "/" + strconv.Itoa(int(t.Group)) }

// placementTask converts a cached task (of a cached job) for the engine;
// nowMs decides which of its node exclusions still hold. An input dataset
// without size_bytes takes its size from sizes (its largest copy on a ready
// node), so that locality prefers the node that holds it.
func placementTask(c *ownerCache, ct *cTask, nowMs int64, sizes map[string]int64) placement.Task {
	j := c.jobs[ct.rec.JobID]
	g := c.group(&ct.rec)
	pt := placement.Task{ID: ct.key, GroupKey: groupKey(&ct.rec), Priority: int(j.priority()),
		Request: c.request(&ct.rec), GPUModels: g.GetResources().GetGpuModels(),
		DistinctHosts: g.GetDistinctHosts(), FailedOn: ct.rec.FailedOn, QoS: c.qos(&ct.rec),
		Policy: placement.Policy(j.rec.Spec.GetScheduler())}
	for _, cn := range g.GetConstraints() {
		pt.Constraints = append(pt.Constraints, placement.Constraint{Label: cn.GetLabel(), Op: cn.GetOp(), Values: cn.GetValues()})
	}
	for _, a := range g.GetAffinities() {
		pt.Affinities = append(pt.Affinities, placement.Affinity{Label: a.GetLabel(), Op: a.GetOp(), Values: a.GetValues(), Weight: int(a.GetWeight())})
	}
	for _, sp := range g.GetSpreads() {
		targets := map[string]int{}
		for k, v := range sp.GetTargets() {
			targets[k] = int(v)
		}
		pt.Spreads = append(pt.Spreads, placement.Spread{Label: sp.GetLabel(), Targets: targets, Weight: int(sp.GetWeight())})
	}
	for _, dp := range g.GetDistinctProperties() {
		pt.DistinctProperties = append(pt.DistinctProperties, placement.DistinctProperty{Label: dp.GetLabel(), MaxPerValue: int(dp.GetMaxPerValue())})
	}
	if aa := g.GetAntiAffinity(); aa.GetGroup() != "" {
		pt.AntiAffinity = placement.AntiAffinity{Group: aa.GetGroup(), Scope: aa.GetScope()}
	}
	for _, d := range g.GetDatasets() {
		size := d.GetSizeBytes()
		if size <= 0 {
			size = sizes[d.GetName()]
		}
		pt.Datasets = append(pt.Datasets, placement.Dataset{Name: d.GetName(), SizeBytes: size})
	}
	switch w := j.rec.Where; {
	case w != nil && !w.Any:
		// The policy's set, resolved at admission (never empty: admission
		// refuses a job the policy allows nowhere).
		pt.Jurisdictions = append([]string{}, w.Jurisdictions...)
	case w == nil && j.rec.Spec.GetJurisdiction() != "":
		pt.Jurisdictions = []string{j.rec.Spec.GetJurisdiction()}
	}
	for node, until := range ct.rec.Excluded {
		if until > nowMs {
			if pt.ExcludedNodes == nil {
				pt.ExcludedNodes = map[string]bool{}
			}
			pt.ExcludedNodes[node] = true
		}
	}
	return pt
}

// fetchBytes is the bytes of t's input datasets that node nodeID does not
// hold: per dataset its size (size_bytes, or the largest copy the region
// knows: sizes) less what the node holds. 0 without datasets.
func fetchBytes(c *ownerCache, t *taskstate.Task, node *placement.Node, sizes map[string]int64) int64 {
	ds := c.group(t).GetDatasets()
	var out int64
	for _, d := range ds {
		size := d.GetSizeBytes()
		if size <= 0 {
			size = sizes[d.GetName()]
		}
		var held int64
		if node != nil {
			held = node.Datasets[d.GetName()]
		}
		out += max(0, size-held)
	}
	return out
}
