package scheduler

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/priority"
	"apiary.dev/apiary/placement"
	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/regional/taskstate"
)

// Preemption, committed (docs/architecture.md, "Preemption"). A pending
// task that fits nowhere and has priority.PreemptionDelta over running
// tasks gets the engine's proposal (placement's preempt: the fewest
// victims of the lowest classes and priorities on one node), and the owner
// commits it in one fenced Txn (preemptWrite):
//
//   - each victim's attempt is marked preempted (taskstate.Preempt) and its
//     assignment rewritten as a CANCEL (the agent kills it and reports it;
//     that report requeues the task at once, not charged);
//   - the preemptor records a reservation on the node epoch
//     (taskstate.Reserve) that every owner counts as used there (usedBy), and
//     the node's usage key is rewritten with it, so that no plan computed
//     before the Txn commits on that node;
//   - the preemptor is placed only once every victim has stopped
//     (dispatchReserved), in the room the reservation held; nothing is ever
//     over-committed on the agent.
//
// A reservation ends without a placement when its node epoch ends, when
// its victims do not stop within reservationTTL, or when the room is gone
// (the node was quarantined meanwhile, say); the task may then preempt
// again, on any node, up to taskstate.MaxReservations times per placement
// (so a placement that keeps failing does not go on stopping others).

const (
	// DefaultMaxPreemptions is Deps.MaxPreemptions when 0: preemptors
	// committed per round and owner.
	DefaultMaxPreemptions = 8
	// reservationTTL is how long a preemptor holds its room for the victims
	// to stop: longer than an agent's kill grace (SIGTERM, then SIGKILL)
	// plus a report's round trip.
	reservationTTL = 30 * time.Second
	// preemptRetry is how long a task whose preemption pass found nothing
	// waits before the next pass considers it (the pass reads every active
	// task of the region).
	preemptRetry = time.Second
)

// maxPreemptions is the round's bound (0: preemption off).
func (s *Loop) maxPreemptions() int {
	switch n := s.d.MaxPreemptions; {
	case n < 0 || s.d.Preempter == nil:
		return 0
	case n == 0:
		return DefaultMaxPreemptions
	default:
		return n
	}
}

// preempt runs the preemption pass over the round's unplaced tasks: those
// with enough priority to preempt the lowest-priority active task
// (ownerCache.lowestVictim; a region whose tasks share one priority never
// runs the pass), that may preempt (taskstate.MayPreempt) and were not
// tried in the last
// preemptRetry, at most maxPreemptions of them, most urgent first. The
// engine sees every active task of the ready nodes (but those being
// preempted or cancelled already); each proposal is committed by
// preemptWrite.
func (s *Loop) preempt(ctx context.Context, unplaced []placement.Unplaced, byKey map[string]*cTask, now time.Time) error {
	limit := s.maxPreemptions()
	if limit == 0 || len(unplaced) == 0 {
		return nil
	}
	c := s.cache
	low, ok := c.lowestVictim()
	if !ok {
		return nil
	}
	for k, at := range s.preemptTried {
		if now.Sub(at) >= preemptRetry {
			delete(s.preemptTried, k)
		}
	}
	var cands []*cTask
	for _, u := range unplaced {
		ct := byKey[u.TaskID]
		if ct == nil || !taskstate.MayPreempt(ct.rec) {
			continue
		}
		if _, tried := s.preemptTried[ct.key]; tried || c.jobs[ct.rec.JobID].priority()-low < priority.PreemptionDelta {
			continue
		}
		cands = append(cands, ct)
	}
	if len(cands) == 0 {
		return nil
	}
	slices.SortFunc(cands, func(a, b *cTask) int {
		ja, jb := c.jobs[a.rec.JobID], c.jobs[b.rec.JobID]
		return cmp.Or(cmp.Compare(jb.priority(), ja.priority()), cmp.Compare(ja.rec.SubmitMs, jb.rec.SubmitMs), cmp.Compare(a.key, b.key))
	})
	cands = cands[:min(len(cands), limit)]
	nowMs := now.UnixMilli()
	snap := s.snap.build()
	snap.Existing = s.snap.allActive()
	ptasks := make([]placement.Task, len(cands))
	for i, ct := range cands {
		ptasks[i] = placementTask(c, ct, nowMs, s.snap.datasetSize)
		s.preemptTried[ct.key] = now
	}
	plan := s.d.Preempter.Place(snap, ptasks)
	var ws []write
	for _, p := range plan.Preemptions {
		if w, ok := s.preemptWrite(p, byKey[p.ForTaskID], nowMs); ok {
			ws = append(ws, w)
		}
	}
	return s.commit(ctx, ws)
}

// preemptedBy names a preemptor for its victims' records and job status.
func (s *Loop) preemptedBy(ct *cTask) string {
	p := s.cache.jobs[ct.rec.JobID].priority()
	return fmt.Sprintf("job %s task %d (priority %d, %s)", ct.rec.JobID, ct.rec.Index, p, priority.Of(p))
}

// preemptWrite builds the fenced write of one preemption: the preemptor's
// reservation, each victim marked preempted with its assignment rewritten
// as a CANCEL, and the node's usage key with the reservation added, under
// compares of every task's ModRevision and the node's epoch and usage.
// False when the node or a victim is gone from the cache or a transition
// is refused (the next round decides again).
func (s *Loop) preemptWrite(p placement.Preemption, pre *cTask, nowMs int64) (write, bool) {
	c := s.cache
	n := c.nodes[p.NodeID]
	if pre == nil || n == nil || !n.Ready() {
		return write{}, false
	}
	by := s.preemptedBy(pre)
	res := taskstate.Reservation{NodeID: p.NodeID, NodeEpoch: n.Alive, UntilMs: nowMs + reservationTTL.Milliseconds()}
	aliveKey, usageKey := store.KeyNodeAlive(p.NodeID), store.KeyNodeUsage(p.NodeID)
	w := write{node: p.NodeID, shards: []int{pre.shard},
		cmps: []clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(aliveKey), "=", n.Alive),
			clientv3.Compare(clientv3.ModRevision(usageKey), "=", n.UsageRev),
			clientv3.Compare(clientv3.ModRevision(pre.key), "=", pre.modRev),
		},
		keys: []string{aliveKey, usageKey, pre.key}}
	type victim struct {
		ct  *cTask
		rec taskstate.Task
	}
	var vs []victim
	for _, key := range p.Evict {
		vt := c.tasks[key]
		if vt == nil {
			return write{}, false
		}
		rec, err := taskstate.Preempt(vt.rec, by)
		if err != nil {
			s.skip("preempt", key, err)
			return write{}, false
		}
		a := &apiaryv1.Assignment{Kind: apiaryv1.Assignment_KIND_CANCEL, JobId: vt.rec.JobID, TaskIndex: vt.rec.Index,
			Attempt: vt.rec.Attempt, NodeEpoch: vt.rec.NodeEpoch, Region: s.d.Region, FailoverEpoch: vt.rec.FencingToken >> store.FailoverTokenShift}
		b, err := proto.Marshal(a)
		if err != nil {
			s.skip("marshal", key, err)
			return write{}, false
		}
		ak := store.KeyAssign(vt.rec.NodeID, vt.rec.JobID, vt.rec.Index)
		w.cmps = append(w.cmps, clientv3.Compare(clientv3.ModRevision(key), "=", vt.modRev))
		// Only an assignment that still exists is rewritten (a Put keeps
		// its CreateRevision, the attempt's fencing token), as cancels does.
		w.ops = append(w.ops, clientv3.OpPut(key, store.MustJSON(&rec)),
			clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(ak), ">", 0)},
				[]clientv3.Op{clientv3.OpPut(ak, string(b))}, nil))
		w.keys = append(w.keys, key)
		res.Victims = append(res.Victims, taskstate.Victim{Key: key, Attempt: vt.rec.Attempt})
		vs = append(vs, victim{vt, rec})
	}
	if len(vs) == 0 {
		return write{}, false
	}
	reason := fmt.Sprintf("preempting %d task(s) of lower priority on node %s; placed there once they stop", len(vs), p.NodeID)
	rec, err := taskstate.Reserve(pre.rec, res, reason)
	if err != nil {
		s.skip("preempt", pre.key, err)
		return write{}, false
	}
	u := s.snap.usage(n).UsageRecord
	u.Add(c.request(&pre.rec))
	w.ops = append(w.ops, clientv3.OpPut(pre.key, store.MustJSON(&rec)), clientv3.OpPut(usageKey, store.MustJSON(u)))
	w.after = func(rev int64) {
		c.setTask(pre.key, &cTask{key: pre.key, shard: pre.shard, rec: rec, modRev: rev})
		for _, v := range vs {
			c.setTask(v.ct.key, &cTask{key: v.ct.key, shard: v.ct.shard, rec: v.rec, modRev: rev})
		}
		n.Usage, n.UsageRev = &u, rev
		s.d.Metrics.Preemptions.WithLabelValues("reserved").Inc()
		s.d.Metrics.Preemptions.WithLabelValues("victim").Add(float64(len(vs)))
		s.d.Log.Info("preempting", "preemptor", pre.key, "node", p.NodeID, "victims", len(vs), "first", vs[0].ct.key)
	}
	return w, true
}

// dispatchReserved handles the reservations of the owned pending tasks: a
// reservation whose victims have all stopped is placed on its node (the
// engine on a snapshot of that node alone, with the room the reservation
// held given back, so every other rule still holds); one whose node epoch
// ended, whose victims did not stop by its deadline, or whose room is
// gone ends (taskstate.EndReservation) and the task waits like any other.
// It returns how long until the next deadline (a minute when none).
func (s *Loop) dispatchReserved(ctx context.Context, now time.Time) (time.Duration, error) {
	c := s.cache
	next := time.Minute
	if len(c.reserved) == 0 {
		return next, nil
	}
	nowMs := now.UnixMilli()
	var ends []write
	ready := map[string][]*cTask{} // node -> tasks whose victims stopped
	end := func(ct *cTask, event, reason string) {
		rec, ok := taskstate.EndReservation(ct.rec, reason)
		if !ok {
			return
		}
		w := s.taskWrite(ct, rec)
		after := w.after
		w.after = func(rev int64) {
			after(rev)
			s.d.Metrics.Preemptions.WithLabelValues(event).Inc()
			s.d.Log.Info("reservation ended without a placement", "task", ct.key, "event", event, "reason", reason,
				"reservations", rec.Reservations, "may_preempt_again", taskstate.MayPreempt(rec))
		}
		ends = append(ends, w)
	}
	for nodeID, keys := range c.reserved {
		for key := range keys {
			ct := c.tasks[key]
			if ct == nil || !s.owns(ct.shard) {
				continue
			}
			r := ct.rec.Reservation
			n := c.nodes[nodeID]
			switch {
			case n == nil || !n.Ready() || n.Alive != r.NodeEpoch:
				end(ct, "lost", fmt.Sprintf("node %s epoch %d, where it preempted tasks, ended before it was placed there", nodeID, r.NodeEpoch))
			case c.victimsStopped(r):
				ready[nodeID] = append(ready[nodeID], ct)
			case nowMs >= r.UntilMs:
				end(ct, "expired", fmt.Sprintf("the tasks it preempted on node %s did not stop within %s", nodeID, reservationTTL))
			default:
				next = min(next, time.Duration(r.UntilMs-nowMs)*time.Millisecond)
			}
		}
	}
	if err := s.commit(ctx, ends); err != nil {
		return 0, err
	}
	if len(ready) == 0 {
		return next, nil
	}
	s.snap.build()
	var all []*cTask
	for _, ts := range ready {
		all = append(all, ts...)
	}
	existing := s.snap.existing(all)
	used := map[string]store.UsageRecord{}
	scopes := map[string]bool{}
	byKey := map[string]*cTask{}
	var ws []write
	var chunks []*placedChunk
	ends = nil // the first batch is committed: a new slice for this pass
	for nodeID, ts := range ready {
		n, pn := c.nodes[nodeID], s.snap.idx[nodeID]
		if pn == nil {
			for _, ct := range ts {
				end(ct, "lost", fmt.Sprintf("node %s, where it preempted tasks, is no longer ready", nodeID))
			}
			continue
		}
		except := map[string]bool{}
		ptasks := make([]placement.Task, len(ts))
		for i, ct := range ts {
			except[ct.key] = true
			byKey[ct.key] = ct
			ptasks[i] = placementTask(c, ct, nowMs, s.snap.datasetSize)
		}
		// The node as it is without these reservations: the room they
		// held is theirs to take.
		u := s.snap.usedBy(n, except)
		alone := *pn
		setUsage(&alone, u)
		alone.Reserved = false
		plan := s.d.Placer.Place(&placement.Snapshot{Nodes: []*placement.Node{&alone}, Existing: existing}, ptasks)
		for _, un := range plan.Unplaced {
			if ct := byKey[un.TaskID]; ct != nil {
				end(ct, "taken", fmt.Sprintf("the room it preempted tasks for on node %s is gone: %s", nodeID, un.Reason))
			}
		}
		if len(plan.Placements) == 0 {
			continue
		}
		used[nodeID] = u.UsageRecord
		w, ok := s.planWrite(nodeID, plan.Placements, byKey, used, scopes, nowMs)
		if !ok {
			continue
		}
		pc := &placedChunk{nodeID: nodeID, ps: plan.Placements}
		chunks = append(chunks, pc)
		after := w.after
		w.after = func(rev int64) {
			after(rev)
			pc.committed = true
			s.d.Metrics.Preemptions.WithLabelValues("placed").Add(float64(len(pc.ps)))
		}
		ws = append(ws, w)
	}
	conflicts := s.conflicts
	if err := s.commit(ctx, append(ws, ends...)); err != nil {
		return 0, err
	}
	s.observePlacements(chunks, byKey, now, s.conflicts-conflicts)
	return next, nil
}

// victimsStopped reports whether every attempt a reservation preempts has
// stopped holding its node: its task is gone, inactive, or on another
// attempt, node or epoch.
func (c *ownerCache) victimsStopped(r *taskstate.Reservation) bool {
	for _, v := range r.Victims {
		ct := c.tasks[v.Key]
		if ct != nil && taskstate.Active(ct.rec.State) && ct.rec.Attempt == v.Attempt &&
			ct.rec.NodeID == r.NodeID && ct.rec.NodeEpoch == r.NodeEpoch {
			return false
		}
	}
	return true
}
