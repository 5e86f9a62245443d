package regional

import (
	"container/heap"
	"context"
	"sort"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/placement"
	"apiary.dev/apiary/regional/taskstate"
)

// nodeUse is what the active tasks of a node's current epoch hold: the
// usage record, and the free share of each GPU (nil when no task uses one).
type nodeUse struct {
	usageRecord
	gpuFree []int
}

// usedBy returns what the active tasks of (node, epoch) hold, derived from
// the task cache (the usage key mirrors it for other owners and operators).
// The per-GPU free share comes from the devices recorded on each task
// (Task.GPUDevices, set with the plan); see gpuLayout for tasks without.
func (s *scheduler) usedBy(n *cNode) nodeUse {
	u := nodeUse{usageRecord: usageRecord{Epoch: n.alive}}
	whole := 0
	var shares []int
	var placed []gpuHold
	for key := range s.byNode[n.id] {
		ct := s.tasks[key]
		if ct.rec.NodeEpoch != n.alive {
			continue
		}
		r := s.request(&ct.rec)
		u.add(r)
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
	if n.rec != nil && (whole > 0 || len(shares) > 0 || len(placed) > 0) {
		u.gpuFree = gpuLayout(int(n.rec.Capacity.GetGpus()), placed, whole, shares)
	}
	return u
}

// gpuHold is a task's recorded GPU devices: whole GPUs (milli 0) or the
// one device of a share of milli.
type gpuHold struct {
	devices []int32
	milli   int
}

// nodeUsage is usedBy, cached until a task on the node changes (useDirty)
// or the node's epoch does.
func (s *scheduler) nodeUsage(n *cNode) nodeUse {
	if u, ok := s.nodeUse[n.id]; ok && !s.useDirty[n.id] && u.Epoch == n.alive {
		return u
	}
	u := s.usedBy(n)
	s.nodeUse[n.id] = u
	delete(s.useDirty, n.id)
	// The flag is cleared here for every caller (syncUsage too), so the
	// snapshot's copy is refreshed here as well.
	if pn := s.snapIdx[n.id]; pn != nil {
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

func (s *scheduler) group(t *taskstate.Task) *apiaryv1.TaskGroup {
	j := s.jobs[t.JobID]
	if j == nil || int(t.Group) >= len(j.rec.Spec.GetTasks()) {
		return nil
	}
	return j.rec.Spec.GetTasks()[t.Group]
}

func (s *scheduler) request(t *taskstate.Task) placement.Resources {
	r := s.group(t).GetResources()
	return placement.Resources{CPUMillis: r.GetCpuMillis(), MemoryMiB: r.GetMemoryMb(), GPUs: int(r.GetGpus()), GPUMilli: int(r.GetGpuMilli())}
}

// readyNode reports whether a node may take placements: its lease is alive
// and its record is of the same epoch.
func readyNode(n *cNode) bool {
	return n.alive != 0 && n.rec != nil && n.rec.Epoch == n.alive
}

// snapshot builds the placement input from the cache: the ready nodes,
// sorted by id, with their usage. The node list and each node's usage are
// kept between rounds (a round at 10k nodes and 100k running tasks rebuilt
// them in ~140 ms; BenchmarkRoundSnapshot): the list is rebuilt when
// nodesGen changes, and then every node's usage; otherwise only the usage
// of the nodes where a task changed (useDirty). Existing allocations are
// added per batch (existing).
func (s *scheduler) snapshot() *placement.Snapshot {
	if s.snapGen != s.nodesGen+1 {
		s.snapGen = s.nodesGen + 1
		ids := make([]string, 0, len(s.nodes))
		for id, n := range s.nodes {
			if readyNode(n) {
				ids = append(ids, id)
			}
		}
		sort.Strings(ids)
		s.snapNodes = s.snapNodes[:0]
		s.snapIdx = make(map[string]*placement.Node, len(ids))
		for _, id := range ids {
			n := s.nodes[id]
			labels := n.rec.Labels
			if _, ok := labels["jurisdiction"]; !ok && s.c.meta.Jurisdiction != "" {
				labels = make(map[string]string, len(n.rec.Labels)+1)
				for k, v := range n.rec.Labels {
					labels[k] = v
				}
				labels["jurisdiction"] = s.c.meta.Jurisdiction
			}
			pn := &placement.Node{ID: id, Labels: labels,
				Capacity: placement.Resources{CPUMillis: n.rec.Capacity.GetCpuMillis(), MemoryMiB: n.rec.Capacity.GetMemoryMb(), GPUs: int(n.rec.Capacity.GetGpus())},
				GPUModel: n.rec.GPUModel, MaxTasks: int(n.rec.MaxTasks), Quarantined: n.rec.Quarantined}
			s.snapNodes = append(s.snapNodes, pn)
			s.snapIdx[id] = pn
		}
		// Every node's usage is recomputed: the cache may hold nodes that
		// left and epochs that moved.
		clear(s.nodeUse)
		clear(s.useDirty)
		for _, pn := range s.snapNodes {
			s.nodeUsage(s.nodes[pn.ID])
		}
	}
	for id := range s.useDirty {
		if s.snapIdx[id] != nil {
			s.nodeUsage(s.nodes[id]) // refreshes the snapshot's node, clears the flag
		} else {
			delete(s.useDirty, id) // not ready: recomputed when it is
		}
	}
	return &placement.Snapshot{Generation: s.snapGen, Nodes: s.snapNodes}
}

// setUsage copies a node's usage into its snapshot entry.
func setUsage(pn *placement.Node, u nodeUse) {
	pn.Allocated = placement.Resources{CPUMillis: u.CPUMillis, MemoryMiB: u.MemoryMiB, GPUs: int(u.GPUs)}
	pn.GPUFreeMilli = u.gpuFree
	pn.RunningTasks = int(u.Tasks)
}

// existing lists the active tasks of the batch's groups as existing
// allocations: what the engine's group rules (distinct hosts, spread,
// distinct property) count. Other groups' tasks only matter to preemption,
// which the coordinator does not use.
func (s *scheduler) existing(batch []*cTask) []placement.Allocation {
	type jg struct {
		job   string
		group int32
	}
	seen := map[jg]bool{}
	var out []placement.Allocation
	for _, bt := range batch {
		k := jg{bt.rec.JobID, bt.rec.Group}
		if seen[k] {
			continue
		}
		seen[k] = true
		for key := range s.jobTasks[k.job] {
			ct := s.tasks[key]
			if ct == nil || ct.rec.Group != k.group || !taskstate.Active(ct.rec.State) || ct.rec.NodeID == "" {
				continue
			}
			out = append(out, placement.Allocation{TaskID: key, GroupKey: groupKey(&ct.rec), NodeID: ct.rec.NodeID,
				Priority: int(s.jobs[ct.rec.JobID].priority()), Request: s.request(&ct.rec)})
		}
	}
	// Deterministic order: the engine is deterministic for a given input.
	sort.Slice(out, func(a, b int) bool { return out[a].TaskID < out[b].TaskID })
	return out
}

func (j *cJob) priority() int32 {
	if j == nil {
		return 0
	}
	return j.rec.Spec.GetPriority()
}

func groupKey(t *taskstate.Task) string { return t.JobID + "/" + strconv.Itoa(int(t.Group)) }

// placementTask converts a cached task for the engine.
func (s *scheduler) placementTask(ct *cTask, nowMs int64) placement.Task {
	j := s.jobs[ct.rec.JobID]
	g := s.group(&ct.rec)
	pt := placement.Task{ID: ct.key, GroupKey: groupKey(&ct.rec), Priority: int(j.priority()),
		Request: s.request(&ct.rec), GPUModels: g.GetResources().GetGpuModels(),
		DistinctHosts: g.GetDistinctHosts(), FailedOn: ct.rec.FailedOn,
		Policy: placement.Policy(j.rec.Spec.GetScheduler())}
	for _, c := range g.GetConstraints() {
		pt.Constraints = append(pt.Constraints, placement.Constraint{Label: c.GetLabel(), Op: c.GetOp(), Values: c.GetValues()})
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
	for _, d := range g.GetDatasets() {
		pt.Datasets = append(pt.Datasets, placement.Dataset{Name: d.GetName(), SizeBytes: d.GetSizeBytes()})
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

// place runs the engine over the placeable pending tasks and commits the
// plan optimistically: one fenced Txn per chunk comparing every task's
// ModRevision and every touched node's epoch and usage ModRevision. A failed
// compare re-reads those keys; the tasks stay PENDING and are placed again in
// the next round (reject and requeue).
func (s *scheduler) place(ctx context.Context, now time.Time) (time.Duration, error) {
	nowMs := now.UnixMilli()
	next := time.Second
	if len(s.pending) == 0 {
		return next, nil
	}
	snap := s.snapshot()
	// used accumulates the usage of the nodes this round's plan writes.
	used := map[string]usageRecord{}
	if len(snap.Nodes) == 0 {
		// Nothing can be placed; GetJob reports "no ready nodes" itself,
		// so the backlog is not rewritten.
		return next, nil
	}
	// Bucket placeable tasks by group: a group's tasks are identical in size.
	groups := map[string]*candGroup{}
	for key := range s.pending {
		ct := s.tasks[key]
		j := s.jobs[ct.rec.JobID]
		if j == nil || j.rec.CancelRequested {
			continue
		}
		if ct.rec.NotBeforeMs > nowMs {
			if d := time.Duration(ct.rec.NotBeforeMs-nowMs) * time.Millisecond; d < next {
				next = d
			}
			continue
		}
		gk := groupKey(&ct.rec)
		g := groups[gk]
		if g == nil {
			g = &candGroup{key: gk, job: j}
			groups[gk] = g
		}
		g.tasks = append(g.tasks, ct)
	}
	if len(groups) == 0 {
		return next, nil
	}
	cands, waiting := s.admit(groups, snap)
	ptasks := make([]placement.Task, len(cands))
	byKey := make(map[string]*cTask, len(cands))
	for i, ct := range cands {
		ptasks[i] = s.placementTask(ct, nowMs)
		byKey[ct.key] = ct
	}
	snap.Existing = s.existing(cands)
	plan := s.placer.Place(snap, ptasks)

	// Group placements by node so a chunk carries whole nodes.
	byNode := map[string][]placement.Placement{}
	var nodeOrder []string
	for _, p := range plan.Placements {
		if byNode[p.NodeID] == nil {
			nodeOrder = append(nodeOrder, p.NodeID)
		}
		byNode[p.NodeID] = append(byNode[p.NodeID], p)
	}
	var ws []write
	var chunks []*placedChunk
	for _, nodeID := range nodeOrder {
		ps := byNode[nodeID]
		for len(ps) > 0 {
			chunk := ps
			if len(chunk) > maxTasksPerPlan {
				chunk = chunk[:maxTasksPerPlan]
			}
			ps = ps[len(chunk):]
			w, ok := s.planWrite(nodeID, chunk, byKey, used, nowMs)
			if ok {
				pc := &placedChunk{nodeID: nodeID, ps: chunk}
				chunks = append(chunks, pc)
				after := w.after
				w.after = func(rev int64) { after(rev); pc.committed = true }
				ws = append(ws, w)
			}
		}
	}
	conflicts := s.conflicts
	if err := s.commit(ctx, ws); err != nil {
		return 0, err
	}
	s.observePlacements(chunks, byKey, now, s.conflicts-conflicts)
	var unplaced []*cTask
	reasons := map[string]placement.Unplaced{}
	for _, u := range plan.Unplaced {
		if ct := byKey[u.TaskID]; ct != nil {
			unplaced = append(unplaced, ct)
			reasons[u.TaskID] = u
		}
	}
	if len(unplaced) > 0 {
		s.c.metrics.Unplaced.Add(float64(len(unplaced)))
		var ws []write
		groupReason := map[string]string{}
		for _, ct := range unplaced {
			u := reasons[ct.key]
			reason := u.Reason // "fragmented: …" when u.Fragmented
			groupReason[groupKey(&ct.rec)] = reason
			if w, ok := s.reasonWrite(ct, reason); ok {
				ws = append(ws, w)
			}
		}
		// Tasks that waited behind their group get its reason once.
		for _, ct := range waiting {
			if r, ok := groupReason[groupKey(&ct.rec)]; ok && ct.rec.UnplacedReason == "" {
				if w, ok := s.reasonWrite(ct, r); ok {
					ws = append(ws, w)
				}
			}
		}
		if err := s.commit(ctx, ws); err != nil {
			return 0, err
		}
	}
	if len(plan.Placements) > 0 {
		return 0, nil // more may fit right away
	}
	return next, nil
}

// planWrite builds the fenced, compared write for placements on one node.
func (s *scheduler) planWrite(nodeID string, ps []placement.Placement, byKey map[string]*cTask, used map[string]usageRecord, nowMs int64) (write, bool) {
	n := s.nodes[nodeID]
	if n == nil || !readyNode(n) {
		return write{}, false
	}
	u, ok := used[nodeID]
	if !ok {
		u = s.nodeUsage(n).usageRecord
	}
	aliveKey, usageKey := keyNodeAlive(nodeID), keyNodeUsage(nodeID)
	w := write{cmps: []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(aliveKey), "=", n.alive),
		clientv3.Compare(clientv3.ModRevision(usageKey), "=", n.usageRev),
	}, keys: []string{aliveKey, usageKey}}
	type upd struct {
		ct  *cTask
		rec taskstate.Task
	}
	var upds []upd
	for _, p := range ps {
		ct := byKey[p.TaskID]
		rec, err := taskstate.Assign(ct.rec, nodeID, n.alive, nowMs)
		if err != nil {
			continue
		}
		for _, g := range p.GPUIndices {
			rec.GPUDevices = append(rec.GPUDevices, int32(g))
		}
		g := s.group(&ct.rec)
		j := s.jobs[ct.rec.JobID]
		a := &apiaryv1.Assignment{Kind: apiaryv1.Assignment_KIND_RUN, JobId: ct.rec.JobID, TaskIndex: ct.rec.Index,
			Attempt: rec.Attempt, NodeEpoch: n.alive, Command: g.GetCommand(), Args: g.GetArgs(), Env: g.GetEnv(),
			Resources: g.GetResources(), TimeoutMs: g.GetTimeoutMs(), Region: s.c.meta.Region, Traceparent: j.rec.Traceparent,
			GpuIndices: rec.GPUDevices}
		b, err := proto.Marshal(a)
		if err != nil {
			continue
		}
		req := s.request(&ct.rec)
		u.add(req)
		w.cmps = append(w.cmps, clientv3.Compare(clientv3.ModRevision(ct.key), "=", ct.modRev))
		w.ops = append(w.ops, clientv3.OpPut(ct.key, mustJSON(&rec)),
			clientv3.OpPut(keyAssign(nodeID, ct.rec.JobID, ct.rec.Index), string(b)))
		w.keys = append(w.keys, ct.key)
		upds = append(upds, upd{ct, rec})
	}
	if len(upds) == 0 {
		return write{}, false
	}
	used[nodeID] = u
	w.ops = append(w.ops, clientv3.OpPut(usageKey, mustJSON(u)))
	w.after = func(rev int64) {
		n.usage, n.usageRev = u, rev
		for _, x := range upds {
			s.setTask(x.ct.key, &cTask{key: x.ct.key, shard: x.ct.shard, rec: x.rec, modRev: rev})
		}
	}
	return w, true
}

// Unplaced-reason write gating (see scheduler.unplacedSince).
const (
	reasonAfter = 2 * time.Second
	reasonEvery = 5 * time.Second
)

// reasonWrite records why a task is not placed: only after it has waited
// reasonAfter, only when the reason changed, and at most every reasonEvery.
func (s *scheduler) reasonWrite(ct *cTask, reason string) (write, bool) {
	now := time.Now()
	since, ok := s.unplacedSince[ct.key]
	if !ok {
		s.unplacedSince[ct.key] = now
		return write{}, false
	}
	if ct.rec.UnplacedReason == reason || now.Sub(since) < reasonAfter ||
		(ct.rec.UnplacedReason != "" && now.Sub(s.reasonAt[ct.key]) < reasonEvery) {
		return write{}, false
	}
	s.reasonAt[ct.key] = now
	rec := ct.rec
	rec.UnplacedReason = reason
	return write{
		cmps: []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(ct.key), "=", ct.modRev)},
		ops:  []clientv3.Op{clientv3.OpPut(ct.key, mustJSON(&rec))},
		keys: []string{ct.key},
		after: func(rev int64) {
			s.setTask(ct.key, &cTask{key: ct.key, shard: ct.shard, rec: rec, modRev: rev})
		},
	}, true
}

// syncUsage writes the usage key of every ready node whose derived usage
// differs from the stored one (tasks finished since the last plan on it).
func (s *scheduler) syncUsage(ctx context.Context) error {
	var ws []write
	for id, n := range s.nodes {
		if !readyNode(n) {
			continue
		}
		u := s.nodeUsage(n).usageRecord
		if u == n.usage {
			continue
		}

		k := keyNodeUsage(id)
		ws = append(ws, write{
			cmps: []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(k), "=", n.usageRev)},
			ops:  []clientv3.Op{clientv3.OpPut(k, mustJSON(u))},
			keys: []string{k},
			after: func(rev int64) {
				n.usage, n.usageRev = u, rev
			},
		})
	}
	return s.commit(ctx, ws)
}

// candGroup is the placeable pending tasks of one task group.
type candGroup struct {
	key   string
	job   *cJob
	tasks []*cTask
}

// maxExplain bounds the tasks admitted per round only to learn why they do
// not fit (one per group that has no room).
const maxExplain = 64

// admit picks the candidates worth a placement pass, highest priority and
// oldest job first. It reserves room for them in a copy of the nodes' free
// capacity (resources and task caps, ignoring constraints: an upper bound),
// so the round considers at most about as many tasks as the region can take;
// a group with no room left gets one candidate, which the engine uses to say
// why the group waits (at most maxExplain per round). The rest wait for the
// next round instead of being filtered against every node again: a round's
// cost follows free capacity, not the backlog (Nomad gets the same effect by
// blocking evaluations until capacity frees).
func (s *scheduler) admit(groups map[string]*candGroup, snap *placement.Snapshot) (admitted, waiting []*cTask) {
	// A heap, not a sort: once the region is full only the first groups
	// (and maxExplain more) are popped, so a large backlog costs O(groups).
	order := &groupHeap{}
	for _, g := range groups {
		order.gs = append(order.gs, g)
	}
	heap.Init(order)
	free := newFreeRoom(snap.Nodes)
	explain := maxExplain
	for order.Len() > 0 {
		if len(free.nodes) == 0 && explain == 0 {
			for _, g := range order.gs {
				waiting = append(waiting, g.tasks...)
			}
			break
		}
		g := heap.Pop(order).(*candGroup)
		k := 0
		if len(admitted) < maxPlaceBatch {
			k = free.take(s.request(&g.tasks[0].rec), min(len(g.tasks), maxPlaceBatch-len(admitted)))
		}
		if k < len(g.tasks) {
			sort.Slice(g.tasks, func(a, b int) bool { return g.tasks[a].rec.Index < g.tasks[b].rec.Index })
			if k == 0 && explain > 0 {
				k, explain = 1, explain-1
			}
		}
		admitted = append(admitted, g.tasks[:k]...)
		waiting = append(waiting, g.tasks[k:]...)
	}
	return admitted, waiting
}

// groupHeap orders candidate groups: higher priority, then older job, then
// key.
type groupHeap struct{ gs []*candGroup }

func (h *groupHeap) Len() int { return len(h.gs) }
func (h *groupHeap) Less(a, b int) bool {
	ga, gb := h.gs[a], h.gs[b]
	if pa, pb := ga.job.priority(), gb.job.priority(); pa != pb {
		return pa > pb
	}
	if ga.job.rec.SubmitMs != gb.job.rec.SubmitMs {
		return ga.job.rec.SubmitMs < gb.job.rec.SubmitMs
	}
	return ga.key < gb.key
}
func (h *groupHeap) Swap(a, b int) { h.gs[a], h.gs[b] = h.gs[b], h.gs[a] }
func (h *groupHeap) Push(x any)    { h.gs = append(h.gs, x.(*candGroup)) }
func (h *groupHeap) Pop() any {
	g := h.gs[len(h.gs)-1]
	h.gs = h.gs[:len(h.gs)-1]
	return g
}

// freeRoom is a scratch copy of the nodes' free capacity; nodes that are full
// drop out, so once the region is full a group costs O(1).
type freeRoom struct {
	nodes []freeNode
}

type freeNode struct {
	cpu, mem int64
	gpus     int
	tasks    int
}

func newFreeRoom(nodes []*placement.Node) *freeRoom {
	f := &freeRoom{}
	for _, n := range nodes {
		if n.Quarantined || n.Ineligible {
			continue
		}
		fn := freeNode{cpu: n.Capacity.CPUMillis - n.Allocated.CPUMillis, mem: n.Capacity.MemoryMiB - n.Allocated.MemoryMiB,
			gpus: n.Capacity.GPUs - n.Allocated.GPUs, tasks: 1 << 30}
		if n.MaxTasks > 0 {
			fn.tasks = n.MaxTasks - n.RunningTasks
		}
		if fn.tasks > 0 && fn.cpu > 0 && fn.mem > 0 {
			f.nodes = append(f.nodes, fn)
		}
	}
	return f
}

// take reserves room for up to want tasks of size req and returns how many
// fit.
func (f *freeRoom) take(req placement.Resources, want int) int {
	got := 0
	for i := 0; i < len(f.nodes) && got < want; {
		n := &f.nodes[i]
		c := n.tasks
		if req.CPUMillis > 0 {
			c = min(c, int(n.cpu/req.CPUMillis))
		}
		if req.MemoryMiB > 0 {
			c = min(c, int(n.mem/req.MemoryMiB))
		}
		if req.GPUs > 0 {
			c = min(c, n.gpus/req.GPUs)
		}
		c = min(c, want-got)
		if c > 0 {
			got += c
			n.tasks -= c
			n.cpu -= int64(c) * req.CPUMillis
			n.mem -= int64(c) * req.MemoryMiB
			n.gpus -= c * req.GPUs
		}
		if n.tasks <= 0 || n.cpu <= 0 || n.mem <= 0 {
			f.nodes[i] = f.nodes[len(f.nodes)-1]
			f.nodes = f.nodes[:len(f.nodes)-1]
			continue
		}
		i++
	}
	return got
}
