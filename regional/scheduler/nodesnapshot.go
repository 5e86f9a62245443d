package scheduler

import (
	"sort"
	"time"

	"apiary.dev/apiary/placement"
	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/regional/taskstate"
)

// nodeSnapshot is the placement input kept between rounds: the ready nodes,
// sorted by id, with their usage derived from the cache's active tasks. The
// node list and each node's usage are kept between rounds (a round at 10k
// nodes and 100k running tasks rebuilt them in ~140 ms;
// BenchmarkRoundSnapshot): the list is rebuilt when the cache's nodesGen
// changes, and then every node's usage; otherwise only the usage of the
// nodes where a task changed (cache.useDirty).
type nodeSnapshot struct {
	cache *ownerCache
	// jurisdiction labels a node that has no "jurisdiction" label (the
	// region's).
	jurisdiction string
	// gen is the cache's nodesGen+1 the list was built at (0: never).
	gen   uint64
	nodes []*placement.Node
	idx   map[string]*placement.Node // id -> its entry in nodes
	// use caches each node's usage, recomputed for the nodes in
	// cache.useDirty and for all when the node set changes.
	use map[string]nodeUse
	// auto lists the entries of the nodes under an automatic quarantine
	// (canaries decides, each round, whether one may take its canary).
	auto []*placement.Node
	// datasetSize is each dataset's largest copy on a node the cache knows
	// (ready or not: a lost node's copy still tells the size), in bytes
	// (the size of a task's input that names no size_bytes).
	datasetSize map[string]int64
}

func newNodeSnapshot(cache *ownerCache, jurisdiction string) *nodeSnapshot {
	return &nodeSnapshot{cache: cache, jurisdiction: jurisdiction, use: map[string]nodeUse{}}
}

// nodeUse is what the active tasks of a node's current epoch hold: the
// usage record, and the free share of each GPU (nil when no task uses one).
type nodeUse struct {
	store.UsageRecord
	gpuFree []int
}

// usedBy returns what the active tasks of (node, epoch) and the
// reservations on it (preempt.go; but those of the tasks in except) hold,
// derived from the task cache (the usage key mirrors it for other owners
// and operators). The per-GPU free share comes from the devices recorded
// on each task (Task.GPUDevices, set with the plan); see gpuLayout for
// tasks without, and for reservations.
func (ns *nodeSnapshot) usedBy(n *cNode, except map[string]bool) nodeUse {
	c := ns.cache
	u := nodeUse{UsageRecord: store.UsageRecord{Epoch: n.Alive}}
	whole := 0
	var shares []int
	var placed []gpuHold
	for key := range c.byNode[n.id] {
		ct := c.tasks[key]
		if ct.rec.NodeEpoch != n.Alive {
			continue
		}
		r := c.request(&ct.rec)
		u.Add(r)
		u.AddLimits(c.group(&ct.rec).GetResources().GetLimits())
		switch {
		case r.GPUs == 0 && r.GPUMilli == 0:
		case len(ct.rec.GPUDevices) > 0:
			placed = append(placed, gpuHold{devices: ct.rec.GPUDevices, milli: r.GPUMilli})
		case r.GPUs > 0:
			whole += r.GPUs
		default:
			shares = append(shares, r.GPUMilli)
		}
	}
	for key := range c.reserved[n.id] {
		ct := c.tasks[key]
		if ct == nil || except[key] || ct.rec.Reservation.NodeEpoch != n.Alive {
			continue
		}
		r := c.request(&ct.rec)
		u.Add(r)
		if r.GPUs > 0 {
			whole += r.GPUs
		} else if r.GPUMilli > 0 {
			shares = append(shares, r.GPUMilli)
		}
	}
	if n.Rec != nil && (whole > 0 || len(shares) > 0 || len(placed) > 0) {
		u.gpuFree = gpuLayout(int(n.Rec.Capacity.GetGpus()), placed, whole, shares)
	}
	return u
}

// gpuHold is a task's recorded GPU devices: whole GPUs (milli 0) or the
// one device of a share of milli.
type gpuHold struct {
	devices []int32
	milli   int
}

// usage is usedBy, cached until a task on the node changes (useDirty) or
// the node's epoch does.
func (ns *nodeSnapshot) usage(n *cNode) nodeUse {
	c := ns.cache
	if u, ok := ns.use[n.id]; ok && !c.useDirty[n.id] && u.Epoch == n.Alive {
		return u
	}
	u := ns.usedBy(n, nil)
	ns.use[n.id] = u
	delete(c.useDirty, n.id)
	// The flag is cleared here for every caller (syncUsage too), so the
	// snapshot's copy is refreshed here as well.
	if pn := ns.idx[n.id]; pn != nil {
		setUsage(pn, u)
	}
	return u
}

// gpuLayout is the free milli of each of a node's gpus devices: first the
// tasks whose devices are recorded (placed) take exactly those; then, for
// tasks without (assigned before devices were recorded), whole GPUs take
// idle devices lowest index first and shares, largest first, the device
// with the least free share that holds them, as the agent's ledger picks
// when an assignment names no device.
func gpuLayout(gpus int, placed []gpuHold, whole int, shares []int) []int {
	free := make([]int, max(gpus, 0))
	for i := range free {
		free[i] = 1000
	}
	for _, h := range placed {
		for _, d := range h.devices {
			if d < 0 || int(d) >= len(free) {
				continue
			}
			if h.milli > 0 {
				free[d] = max(free[d]-h.milli, 0)
			} else {
				free[d] = 0
			}
		}
	}
	for i := range free {
		if whole == 0 {
			break
		}
		if free[i] == 1000 {
			free[i] = 0
			whole--
		}
	}
	sort.Sort(sort.Reverse(sort.IntSlice(shares)))
	for _, sh := range shares {
		best := -1
		for i, f := range free {
			if f >= sh && (best < 0 || f < free[best]) {
				best = i
			}
		}
		if best >= 0 {
			free[best] -= sh
		}
	}
	return free
}

// build returns the placement input from the cache: the ready nodes, sorted
// by id, with their usage, rebuilt as little as the changes since the last
// call need. Existing allocations are added per batch (existing).
func (ns *nodeSnapshot) build() *placement.Snapshot {
	c := ns.cache
	if ns.gen != c.nodesGen+1 {
		ns.gen = c.nodesGen + 1
		ids := make([]string, 0, len(c.nodes))
		for id, n := range c.nodes {
			if n.Ready() {
				ids = append(ids, id)
			}
		}
		sort.Strings(ids)
		ns.nodes, ns.auto = ns.nodes[:0], ns.auto[:0]
		ns.idx = make(map[string]*placement.Node, len(ids))
		ns.datasetSize = map[string]int64{}
		for _, id := range ids {
			pn := placementNode(c.nodes[id], ns.jurisdiction)
			ns.nodes = append(ns.nodes, pn)
			ns.idx[id] = pn
			if c.nodes[id].AutoQuarantined() {
				ns.auto = append(ns.auto, pn)
			}
		}
		for _, n := range c.nodes {
			for name, b := range n.Datasets() {
				ns.datasetSize[name] = max(ns.datasetSize[name], b)
			}
		}
		// Every node's usage is recomputed: the cache may hold nodes that
		// left and epochs that moved.
		clear(ns.use)
		clear(c.useDirty)
		for _, pn := range ns.nodes {
			ns.usage(c.nodes[pn.ID])
		}
	}
	for id := range c.useDirty {
		if ns.idx[id] != nil {
			ns.usage(c.nodes[id]) // refreshes the snapshot's node, clears the flag
		} else {
			delete(c.useDirty, id) // not ready: recomputed when it is
		}
	}
	return &placement.Snapshot{Generation: ns.gen, Nodes: ns.nodes}
}

// canaries applies the automatic quarantines to the snapshot at nowMs: a
// quarantined node whose canary is due (nodehealth.Quarantine.CanaryDue:
// the backoff passed and none of its active attempts was assigned since)
// is returned in due, offered for exactly one more task (MaxTasks =
// running + 1), which place gives it first, so that a canary runs even
// when other nodes would score better (its outcome releases the node or
// pushes the next canary out, regional/health.go); the others stay quarantined.
// next is how long until the next canary falls due (0: none), so that the
// round after it is not later.
func (ns *nodeSnapshot) canaries(nowMs int64) (due []*placement.Node, next time.Duration) {
	c := ns.cache
	for _, pn := range ns.auto {
		n := c.nodes[pn.ID]
		q := n.Health.Quarantine
		latest := int64(0)
		for key := range c.byNode[n.id] {
			if ct := c.tasks[key]; ct != nil && ct.rec.NodeEpoch == n.Alive && taskstate.Active(ct.rec.State) {
				latest = max(latest, ct.rec.AssignedMs)
			}
		}
		pn.Quarantined, pn.MaxTasks = true, int(n.Rec.MaxTasks)
		switch {
		case q.CanaryDue(nowMs, latest):
			pn.Quarantined, pn.MaxTasks = false, pn.RunningTasks+1
			if n.Rec.MaxTasks > 0 {
				pn.MaxTasks = min(pn.MaxTasks, int(n.Rec.MaxTasks))
			}
			due = append(due, pn)
		case q.ProbeAtMs > nowMs:
			if d := time.Duration(q.ProbeAtMs-nowMs) * time.Millisecond; next == 0 || d < next {
				next = d
			}
		}
	}
	return due, next
}

// setUsage copies a node's usage into its snapshot entry.
func setUsage(pn *placement.Node, u nodeUse) {
	pn.Allocated = placement.Resources{CPUMillis: u.CPUMillis, MemoryMiB: u.MemoryMiB, GPUs: int(u.GPUs)}
	pn.GPUFreeMilli = u.gpuFree
	pn.RunningTasks = int(u.Tasks)
}

// existing lists as existing allocations the active tasks of the batch's
// groups (what the engine's group rules, distinct hosts, spread and
// distinct property, count) and of every task group, in any job and shard,
// that names an anti-affinity group a batch task names (what the engine's
// anti-affinity across jobs counts). Other tasks only matter to
// preemption, which the coordinator does not use.
func (ns *nodeSnapshot) existing(batch []*cTask) []placement.Allocation {
	c := ns.cache
	type jg struct {
		job   string
		group int32
	}
	seen := map[jg]bool{}
	antiGroups := map[string]bool{}
	added := map[string]bool{}
	var out []placement.Allocation
	add := func(key string, ct *cTask) {
		if added[key] {
			return
		}
		added[key] = true
		out = append(out, allocation(c, key, ct))
	}
	for _, bt := range batch {
		k := jg{bt.rec.JobID, bt.rec.Group}
		if seen[k] {
			continue
		}
		seen[k] = true
		if name := c.antiAffinityGroup(&bt.rec); name != "" {
			antiGroups[name] = true
		}
		for key := range c.jobTasks[k.job] {
			ct := c.tasks[key]
			if ct == nil || ct.rec.Group != k.group || !taskstate.Active(ct.rec.State) || ct.rec.NodeID == "" {
				continue
			}
			add(key, ct)
		}
	}
	for name := range antiGroups {
		for job := range c.aaJobs[name] {
			for key := range c.jobTasks[job] {
				ct := c.tasks[key]
				if ct == nil || !taskstate.Active(ct.rec.State) || ct.rec.NodeID == "" || c.antiAffinityGroup(&ct.rec) != name {
					continue
				}
				add(key, ct)
			}
		}
	}
	// Deterministic order: the engine is deterministic for a given input.
	sort.Slice(out, func(a, b int) bool { return out[a].TaskID < out[b].TaskID })
	return out
}

// allocation is an active task as an existing allocation for the engine.
func allocation(c *ownerCache, key string, ct *cTask) placement.Allocation {
	a := placement.Allocation{TaskID: key, GroupKey: ct.gkey(), NodeID: ct.rec.NodeID,
		Priority: int(c.jobs[ct.rec.JobID].priority()), Request: c.request(&ct.rec), QoS: c.qos(&ct.rec),
		AntiAffinityGroup: c.antiAffinityGroup(&ct.rec), AntiAffinityScope: c.antiAffinityScope(&ct.rec)}
	for _, g := range ct.rec.GPUDevices {
		a.GPUIndices = append(a.GPUIndices, int(g))
	}
	return a
}

// allActive lists every active task of the current epoch of every ready
// node as an existing allocation (what the preemption pass chooses victims
// from, and counts for every group rule), but those being preempted or
// cancelled already (they are leaving), sorted by task key.
func (ns *nodeSnapshot) allActive() []placement.Allocation {
	c := ns.cache
	var out []placement.Allocation
	for id := range ns.idx {
		n := c.nodes[id]
		for key := range c.byNode[id] {
			ct := c.tasks[key]
			if ct == nil || ct.rec.NodeEpoch != n.Alive || ct.rec.PreemptedBy != "" || ct.rec.CancelRequested {
				continue
			}
			out = append(out, allocation(c, key, ct))
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].TaskID < out[b].TaskID })
	return out
}
