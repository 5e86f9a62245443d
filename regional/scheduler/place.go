package scheduler

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/placement"
	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/regional/taskstate"
)

// place runs the engine over the placeable pending tasks and commits the
// plan optimistically: one fenced Txn per chunk comparing every task's
// ModRevision and every touched node's epoch and usage ModRevision. A failed
// compare re-reads those keys; the tasks stay PENDING and are placed again in
// the next round (reject and requeue).
//
// A round takes this owner's jobs most urgent first and stops once the
// admitter is full (admitter.full: no free room or a full batch, and every
// explanation used), so its cost follows the region's free room and the
// number of jobs with pending tasks, not the backlog's tasks: a job past the
// cut costs one comparison in the sort. Tasks of jobs past the cut are not
// looked at that round (no stage or backoff bookkeeping for them); they
// come first once the jobs ahead of them are placed. Nomad gets the same
// effect by blocking evaluations until capacity frees.
func (s *Loop) place(ctx context.Context, now time.Time) (time.Duration, error) {
	nowMs := now.UnixMilli()
	next := time.Second
	c := s.cache
	if len(c.pending) == 0 {
		return next, nil
	}
	if s.home != nil {
		s.home.refresh()
	}
	// This owner's jobs with pending tasks, to be sorted; other owners'
	// placeable tasks give their heads (homenodes.go).
	others := heads{}
	var mine []*cJob
	for jobID, tasks := range c.pendingByJob {
		j := c.jobs[jobID]
		if j == nil || j.rec.CancelRequested || (s.d.Hold != nil && s.d.Hold(&j.rec)) {
			continue
		}
		shard := -1 // the job's shard, as its task keys say
		for _, ct := range tasks {
			shard = ct.shard
			break
		}
		if s.owns(shard) {
			mine = append(mine, j)
			continue
		}
		if s.home == nil {
			continue // another coordinator's shard
		}
		// Another coordinator's shard: a task it can place (not one
		// waiting for its victims, its backoff or its stage) makes it an
		// owner with work; one such task says so.
		o := s.home.ownerOf(shard)
		if o == "" || o == s.d.CoordID {
			continue
		}
		st := c.stagesOf(jobID, j)
		for _, ct := range tasks {
			if ct.rec.Reservation == nil && ct.rec.NotBeforeMs <= nowMs && (st == nil || st.ready[ct.rec.Group]) {
				others.note(o, urgency{j.priority(), j.rec.SubmitMs})
				break
			}
		}
	}
	slices.SortFunc(mine, moreUrgent)

	var (
		stageWrites []write
		snap        *placement.Snapshot
		due         []*placement.Node
		ad          *admitter
		noNodes     bool
	)
	for _, j := range mine {
		groups := s.placeable(j, now, &next, &stageWrites)
		if len(groups) == 0 || noNodes {
			continue
		}
		if ad == nil {
			snap = s.snap.build()
			var d time.Duration
			due, d = s.snap.canaries(nowMs)
			if d > 0 && d < next {
				next = d
			}
			if len(snap.Nodes) == 0 {
				// Nothing can be placed; GetJob reports "no ready nodes"
				// itself, so the backlog is not rewritten (stage reasons
				// still are).
				noNodes = true
				continue
			}
			if s.home != nil {
				// j is this owner's most urgent job with a placeable task.
				reserved, wake := s.home.reserve(snap.Nodes, due, s.d.CoordID, urgency{j.priority(), j.rec.SubmitMs}, others, s.homeShard, s.d.ShardCount, now)
				defer func() {
					for _, pn := range reserved {
						pn.Reserved = false
					}
				}()
				if wake > 0 && wake < next {
					next = wake
				}
				s.d.Metrics.ReservedNodes.Observe(float64(len(reserved)))
			}
			ad = newAdmitter(c, snap)
		}
		for _, g := range groups {
			ad.add(g)
		}
		if ad.full() {
			break // the cut: the rest wait for room (see above)
		}
	}
	if err := s.commit(ctx, stageWrites); err != nil {
		return 0, err
	}
	if ad == nil {
		// No placeable task of this owner's (a coordinator owning none of
		// the pending tasks' shards stops here), or no ready node.
		return next, nil
	}
	// used accumulates the usage of the nodes this round's plan writes;
	// scopes the anti-affinity scope keys it writes.
	used := map[string]store.UsageRecord{}
	scopes := map[string]bool{}
	cands, waiting := ad.admitted, ad.waiting
	ptasks := make([]placement.Task, len(cands))
	byKey := make(map[string]*cTask, len(cands))
	for i, ct := range cands {
		ptasks[i] = placementTask(c, ct, nowMs, s.snap.datasetSize)
		byKey[ct.key] = ct
	}
	snap.Existing = s.snap.existing(cands)
	canaries, ptasks := s.placeCanaries(snap, due, ptasks)
	plan := s.d.Placer.Place(snap, ptasks)
	plan.Placements = append(canaries, plan.Placements...)

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
			w, ok := s.planWrite(nodeID, chunk, byKey, used, scopes, nowMs)
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
	if err := s.preempt(ctx, plan.Unplaced, byKey, now); err != nil {
		return 0, err
	}
	var unplaced []*cTask
	reasons := map[string]placement.Unplaced{}
	for _, u := range plan.Unplaced {
		if ct := byKey[u.TaskID]; ct != nil {
			unplaced = append(unplaced, ct)
			reasons[u.TaskID] = u
		}
	}
	if len(unplaced) > 0 {
		s.d.Metrics.Unplaced.Add(float64(len(unplaced)))
		var ws []write
		groupReason := map[string]string{}
		for _, ct := range unplaced {
			u := reasons[ct.key]
			reason := u.Reason // "fragmented: …" when u.Fragmented
			groupReason[ct.gkey()] = reason
			if w, ok := s.reasonWrite(ct, reason, time.Now()); ok {
				ws = append(ws, w)
			}
		}
		// Tasks that waited behind their group get its reason once.
		for _, ct := range waiting {
			if ct.rec.UnplacedReason != "" {
				continue
			}
			if r, ok := groupReason[ct.gkey()]; ok {
				if w, ok := s.reasonWrite(ct, r, time.Now()); ok {
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

// placeable returns job j's pending tasks that a round may place now, as
// one candGroup per task group in group order: not those waiting for their
// victims (dispatchReserved), their backoff (next is lowered to the first
// backoff's end) or an earlier stage (whose reason, or the failure of the
// stage they depend on, is appended to stageWrites).
func (s *Loop) placeable(j *cJob, now time.Time, next *time.Duration, stageWrites *[]write) []*candGroup {
	c := s.cache
	nowMs := now.UnixMilli()
	st := c.stagesOf(j.rec.ID, j)
	var groups []*candGroup
	byGroup := map[int32]*candGroup{}
	for _, ct := range c.pendingByJob[j.rec.ID] {
		if ct.rec.Reservation != nil {
			continue // waits for its victims (dispatchReserved)
		}
		if ct.rec.NotBeforeMs > nowMs {
			if d := time.Duration(ct.rec.NotBeforeMs-nowMs) * time.Millisecond; d < *next {
				*next = d
			}
			continue
		}
		if st != nil && !st.ready[ct.rec.Group] {
			if by := st.doomedBy[ct.rec.Group]; by != "" {
				if w, ok := s.dependencyWrite(ct, by, nowMs); ok {
					*stageWrites = append(*stageWrites, w)
				}
			} else if w, ok := s.reasonWrite(ct, waitingReason(st.waitFor[ct.rec.Group]), now); ok {
				*stageWrites = append(*stageWrites, w)
			}
			continue
		}
		g := byGroup[ct.rec.Group]
		if g == nil {
			g = &candGroup{key: ct.gkey(), job: j, index: ct.rec.Group}
			byGroup[ct.rec.Group] = g
			groups = append(groups, g)
		}
		g.tasks = append(g.tasks, ct)
	}
	slices.SortFunc(groups, func(a, b *candGroup) int { return cmp.Compare(a.index, b.index) })
	return groups
}

// placeCanaries gives each node whose canary is due (nodeSnapshot.canaries)
// its one task first: the engine places the candidates on a snapshot of
// that node alone (it takes one, by the engine's own order), and the node
// is then closed for the round's main pass. Without this a quarantined
// node's canary would wait until the healthy nodes were full, since they
// score better. It returns the canary placements and the tasks left for
// the main pass.
func (s *Loop) placeCanaries(snap *placement.Snapshot, due []*placement.Node, ptasks []placement.Task) ([]placement.Placement, []placement.Task) {
	var out []placement.Placement
	for _, pn := range due {
		if len(ptasks) == 0 {
			break
		}
		// Not a task that failed there already: alone in this snapshot
		// the node would be its only choice, and the engine falls back to
		// failed-on nodes then.
		fresh := slices.DeleteFunc(slices.Clone(ptasks), func(t placement.Task) bool { return t.FailedOn[pn.ID] > 0 })
		pn.Quarantined = true // the main pass leaves it alone
		if len(fresh) == 0 {
			continue
		}
		pn.Quarantined = false
		// Generation 0: a node set of its own, nothing reused.
		cp := s.d.Placer.Place(&placement.Snapshot{Nodes: []*placement.Node{pn}, Existing: snap.Existing}, fresh)
		pn.Quarantined = true
		if len(cp.Placements) == 0 {
			continue
		}
		p := cp.Placements[0]
		out = append(out, p)
		ptasks = slices.DeleteFunc(ptasks, func(t placement.Task) bool { return t.ID == p.TaskID })
	}
	return out, ptasks
}

// planWrite builds the fenced, compared write for placements on one node:
// it compares the node's alive epoch and usage ModRevision, that the
// region's automatic quarantines are those the cache knows, each task's
// ModRevision, and for a task whose anti-affinity group has a label scope,
// that scope's key (store.KeyAntiAffinity), which it rewrites: two owners
// placing members of one group in one label scope at once conflict there,
// as two plans on one node conflict on its usage key. A placement whose
// task cannot be assigned, whose assignment cannot be encoded, or whose
// scope key this round wrote already is left out (counted and logged by
// skip); the task stays PENDING.
func (s *Loop) planWrite(nodeID string, ps []placement.Placement, byKey map[string]*cTask, used map[string]store.UsageRecord,
	scopes map[string]bool, nowMs int64) (write, bool) {
	c := s.cache
	n := c.nodes[nodeID]
	if n == nil || !n.Ready() {
		return write{}, false
	}
	u, ok := used[nodeID]
	if !ok {
		u = s.snap.usage(n).UsageRecord
	}
	aliveKey, usageKey := store.KeyNodeAlive(nodeID), store.KeyNodeUsage(nodeID)
	w := write{cmps: []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(aliveKey), "=", n.Alive),
		clientv3.Compare(clientv3.ModRevision(usageKey), "=", n.UsageRev),
		// No automatic quarantine (or release) committed since the
		// cache's view: a report that quarantines the node must stop a
		// plan computed before it (regional/health.go).
		clientv3.Compare(clientv3.ModRevision(store.KeyQuarantineSet), "<", c.nodesRev+1),
	}, keys: []string{aliveKey, usageKey}, node: nodeID}
	type upd struct {
		ct     *cTask
		rec    taskstate.Task
		scopes []string // anti-affinity scope keys written
	}
	var upds []upd
	for _, p := range ps {
		ct := byKey[p.TaskID]
		sks := s.scopeKeys(&ct.rec, nodeID)
		if i := slices.IndexFunc(sks, func(k string) bool { return scopes[k] }); i >= 0 {
			s.skip("antiaffinity", ct.key, fmt.Errorf("this round placed a member of its anti-affinity group in %s already", sks[i]))
			continue
		}
		rec, err := taskstate.Assign(ct.rec, nodeID, n.Alive, nowMs)
		if err != nil {
			s.skip("assign", ct.key, err)
			continue
		}
		for _, g := range p.GPUIndices {
			rec.GPUDevices = append(rec.GPUDevices, int32(g))
		}
		rec.FetchBytes = fetchBytes(c, &ct.rec, s.snap.idx[nodeID], s.snap.datasetSize)
		g := c.group(&ct.rec)
		j := c.jobs[ct.rec.JobID]
		env := g.GetEnv()
		if len(g.GetSecretEnv()) > 0 {
			// No secret in etcd: the streaming coordinator opens them
			// (regional/secrets.go, withSecrets).
			env = maps.Clone(env)
			if env == nil {
				env = map[string]string{}
			}
			env[store.SecretEnvMarker] = strconv.Itoa(int(ct.rec.Group))
		}
		a := &apiaryv1.Assignment{Kind: apiaryv1.Assignment_KIND_RUN, JobId: ct.rec.JobID, TaskIndex: ct.rec.Index,
			Attempt: rec.Attempt, NodeEpoch: n.Alive, Command: g.GetCommand(), Args: g.GetArgs(), Env: env,
			Resources: g.GetResources(), TimeoutMs: g.GetTimeoutMs(), Region: s.d.Region, Traceparent: j.rec.Traceparent,
			GpuIndices: rec.GPUDevices, LostAfterMs: lostAfterMs(&j.rec), FailoverEpoch: j.rec.FailoverEpoch()}
		for _, d := range g.GetDatasets() {
			a.Datasets = append(a.Datasets, d.GetName())
		}
		a.Outputs = g.GetOutputs()
		b, err := proto.Marshal(a)
		if err != nil {
			s.skip("marshal", ct.key, err)
			continue
		}
		req := c.request(&ct.rec)
		u.Add(req)
		u.AddLimits(g.GetResources().GetLimits())
		w.cmps = append(w.cmps, clientv3.Compare(clientv3.ModRevision(ct.key), "=", ct.modRev))
		w.ops = append(w.ops, clientv3.OpPut(ct.key, store.MustJSON(&rec)),
			clientv3.OpPut(store.KeyAssign(nodeID, ct.rec.JobID, ct.rec.Index), string(b)))
		for _, sk := range sks {
			// Not re-read on a conflict (reread): the watch delivers it
			// with the member written beside it.
			scopes[sk] = true
			w.cmps = append(w.cmps, clientv3.Compare(clientv3.ModRevision(sk), "=", c.aaRev[sk]))
			w.ops = append(w.ops, clientv3.OpPut(sk, ct.key))
		}
		w.keys = append(w.keys, ct.key)
		w.forShard(ct.shard)
		upds = append(upds, upd{ct, rec, sks})
	}
	if len(upds) == 0 {
		return write{}, false
	}
	used[nodeID] = u
	w.ops = append(w.ops, clientv3.OpPut(usageKey, store.MustJSON(u)))
	w.after = func(rev int64) {
		n.Usage, n.UsageRev = &u, rev
		for _, x := range upds {
			c.setTask(x.ct.key, &cTask{key: x.ct.key, shard: x.ct.shard, rec: x.rec, modRev: rev})
			for _, sk := range x.scopes {
				c.aaRev[sk] = rev
			}
		}
	}
	return w, true
}

// scopeKeys are the anti-affinity scope keys a placement of t on nodeID
// writes: none unless t's group names an anti-affinity group; then, for
// each label scope any task group naming that group uses (t's own and the
// other jobs', so that members of different scopes meet on a key too), the
// key of nodeID's value of the label. The node's labels are the engine's
// (with the region's jurisdiction filled in); a node without the label is
// in the scope of value "", as the engine counts it.
func (s *Loop) scopeKeys(t *taskstate.Task, nodeID string) []string {
	name := s.cache.antiAffinityGroup(t)
	if name == "" {
		return nil
	}
	labels := s.cache.antiAffinityLabelScopes(name)
	if own := s.cache.antiAffinityScope(t); own != placement.ScopeNode && !slices.Contains(labels, own) {
		labels = append(labels, own)
	}
	var out []string
	for _, l := range labels {
		var v string
		if pn := s.snap.idx[nodeID]; pn != nil {
			v = pn.Labels[l]
		}
		out = append(out, store.KeyAntiAffinity(name, l, v))
	}
	return out
}

// reasonWrite records why a task is not placed, when the reason gate says
// it is due (after reasonAfter of waiting, only when the reason changed, at
// most every reasonEvery).
func (s *Loop) reasonWrite(ct *cTask, reason string, now time.Time) (write, bool) {
	if !s.reasons.due(ct.key, ct.rec.UnplacedReason, reason, now) {
		return write{}, false
	}
	rec := ct.rec
	rec.UnplacedReason = reason
	return s.taskWrite(ct, rec), true
}

// taskWrite rewrites ct's record as rec, fenced on its shard and compared
// on its ModRevision; the cache takes rec when it commits.
func (s *Loop) taskWrite(ct *cTask, rec taskstate.Task) write {
	return write{shards: []int{ct.shard},
		cmps: []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(ct.key), "=", ct.modRev)},
		ops:  []clientv3.Op{clientv3.OpPut(ct.key, store.MustJSON(&rec))},
		keys: []string{ct.key},
		after: func(rev int64) {
			s.cache.setTask(ct.key, &cTask{key: ct.key, shard: ct.shard, rec: rec, modRev: rev})
		},
	}
}

// syncUsage writes the usage key of every ready node whose derived usage
// differs from the stored one (tasks finished since the last plan on it),
// for the nodes whose home shard this loop owns (one writer per node).
func (s *Loop) syncUsage(ctx context.Context) error {
	var ws []write
	for id, n := range s.cache.nodes {
		home := s.homeShard(id)
		if !n.Ready() || !s.owns(home) {
			continue
		}
		u := s.snap.usage(n).UsageRecord
		if n.Usage != nil && u == *n.Usage {
			continue
		}

		k := store.KeyNodeUsage(id)
		ws = append(ws, write{shards: []int{home},
			cmps: []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(k), "=", n.UsageRev)},
			ops:  []clientv3.Op{clientv3.OpPut(k, store.MustJSON(u))},
			keys: []string{k},
			after: func(rev int64) {
				n.Usage, n.UsageRev = &u, rev
			},
		})
	}
	return s.commit(ctx, ws)
}

// lostAfterMs is how long an agent that reaches no coordinator keeps the
// job's attempts (Assignment.lost_after_ms): the job's disconnect.lost_after,
// else, for a job that may fail over from this region, its failover.after
// (by then a standby may run the tasks again: the home's copies should not
// run on beside them), else 0 (the agent's --disconnect-grace).
func lostAfterMs(rec *store.JobRecord) int64 {
	if la := rec.Spec.GetDisconnect().GetLostAfterMs(); la > 0 {
		return la
	}
	if f := rec.Failover; f != nil && f.Epoch == 0 && len(f.Standbys) > 0 {
		return f.AfterMs
	}
	return 0
}
