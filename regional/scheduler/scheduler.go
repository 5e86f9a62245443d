package scheduler

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/telemetry"
	"apiary.dev/apiary/placement"
	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/regional/taskstate"
	"apiary.dev/apiary/shards"
)

// Limits of one scheduling round.
const (
	maxPlaceBatch   = 4096 // pending tasks considered per round
	maxTasksPerPlan = 512  // placements committed per plan Txn
	maxOpsPerFenced = 2048 // ops per reclaim / cancel / reason Txn
)

// Deps is everything the loop takes from its coordinator (regional builds
// it in ownership.go). Commit and Metrics are required; Client only by Run.
type Deps struct {
	Region       string // stamped on assignments
	Jurisdiction string // of nodes without a "jurisdiction" label
	CoordID      string // span attribute
	Placer       placement.Placer
	// ShardCount is the region's S (a node's home shard is shards.Of of
	// its id: the shard whose owner syncs its usage key).
	ShardCount int
	// Publish receives the per-shard counts (index: shard) for ListShards
	// once a second (nil: none).
	Publish   func([]ShardStat)
	Retention time.Duration // JobRetention; <= 0 keeps jobs forever
	// Client feeds the cache (load, watches); unused by round, so nil in
	// unit tests.
	Client *clientv3.Client
	// Commit is the write path: every write of the loop goes through it
	// (store.EtcdCommitter in the coordinator).
	Commit  Committer
	Specs   *store.SpecCache // shared with report commit; may be nil
	Log     *slog.Logger
	Metrics *telemetry.RegionMetrics
	Skipped *prometheus.CounterVec // by what (SkippedCounter); may be nil
	Tracer  trace.Tracer
	Tracing bool
	// DefaultLostAfter is lost_after for jobs that leave it unset.
	DefaultLostAfter time.Duration
	// GraceUntil: before it, no lost epoch is reclaimed but those that left
	// cleanly (regional.Config.FailoverGrace).
	GraceUntil time.Time
	// Owners is the region's shard owners, for the home-node rule
	// (homenodes.go); nil turns the rule off (every owner plans on every
	// node, conflicts caught by the usage compare only).
	Owners OwnerView
	// Preempter is the engine of the preemption pass (preempt.go): Placer's
	// options with preemption on. Nil turns preemption off.
	Preempter placement.Placer
	// MaxPreemptions bounds the preemptors committed per round (0:
	// DefaultMaxPreemptions; negative: preemption off).
	MaxPreemptions int
	// Jobs is the job index the loop's cache keeps for ListJobs (nil:
	// none). It is reset whenever a new loop loads its cache.
	Jobs *JobIndex
	// Nodes is the node index the loop's cache keeps for the capacity
	// summary (nil: none). It is reset whenever a new loop loads its
	// cache.
	Nodes *NodeIndex
	// Hold tells whether a job's tasks must not be placed yet (nil: none
	// held): a failover job of a region that came back, until its
	// standbys said whether it moved (regional/failover, Manager.Hold).
	Hold func(*store.JobRecord) bool
}

// Loop is the scheduling loop of the shards a coordinator owns: a cache of
// the region's jobs, tasks and nodes kept by a range read plus one watch,
// and rounds of reclaim → cancel → place → commit over the tasks of the
// owned shards. Every write it makes goes through d.Commit, fenced on the
// shards it writes for.
type Loop struct {
	d   Deps
	set *ShardSet
	// owned is the shards this round may write for (set.current() at the
	// round's start, less those found fenced during it).
	owned map[int]shards.Epoch
	cache *ownerCache
	snap  *nodeSnapshot
	// reasons gates unplaced-reason writes.
	reasons *reasonGate
	// conflicts counts failed plan/write compares (for the plan metrics).
	conflicts int
	// When the periodic passes last ran.
	usageSynced, swept, gaugesAt time.Time
	// skipLogged rate-limits the log of skipped records (per kind).
	skipLogged map[string]time.Time
	// lostSince is when this owner first saw each lost node epoch that
	// still holds tasks (disconnect.replace: false waits from it).
	lostSince map[nodeEpoch]time.Time
	// home is the home-node rule's state (nil when Deps.Owners is).
	home *homeNodes
	// preemptTried is when the preemption pass last considered each task
	// (preemptRetry).
	preemptTried map[string]time.Time
}

// New builds the loop over an empty cache (Run fills it). It schedules the
// shards of set, which the coordinator's reconciler keeps (ShardSet.Set,
// ShardSet.HandBack). The coordinator builds a new loop (a fresh cache) each
// time Run fails.
func New(d Deps, set *ShardSet) *Loop {
	s := &Loop{d: d, set: set, owned: map[int]shards.Epoch{}, cache: newOwnerCache(d.Specs), reasons: newReasonGate(),
		skipLogged: map[string]time.Time{}, lostSince: map[nodeEpoch]time.Time{}, home: newHomeNodes(d.Owners),
		preemptTried: map[string]time.Time{}}
	s.snap = newNodeSnapshot(s.cache, d.Jurisdiction)
	s.cache.index = d.Jobs
	s.cache.nodeIndex = d.Nodes
	s.cache.leftPending = s.reasons.forget
	s.cache.skipped = s.skip
	return s
}

// skip counts and logs a record the loop leaves out: one that does not
// decode (what: task, job, node) or a planned task it cannot write (what:
// assign, marshal). The log is limited to one line per kind and second.
func (s *Loop) skip(what, key string, err error) {
	if s.d.Skipped != nil {
		s.d.Skipped.WithLabelValues(what).Inc()
	}
	if now := time.Now(); now.Sub(s.skipLogged[what]) >= time.Second {
		s.skipLogged[what] = now
		s.d.Log.Warn("owner loop skipped a record", "what", what, "key", key, "err", err)
	}
}

// Run loads the cache and runs rounds until ctx ends or the loop fails (a
// closed watch, an etcd error; the coordinator then rebuilds it); it
// returns ctx's error or the failure. Losing a
// shard does not end it: the shard leaves the owned set.
//
// One watch covers jobs, nodes and tasks (the key range between them holds
// a few other prefixes the cache ignores): etcd delivers every event of a
// revision in one response, so the cache never holds a node's usage key at
// a revision whose task writes it has not applied (see reread).
func (s *Loop) Run(ctx context.Context) error {
	cli := s.d.Client
	rev, err := s.cache.load(ctx, cli)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	events := cli.Watch(wctx, store.PrefJobs, clientv3.WithRange(clientv3.GetPrefixRangeEnd(store.PrefTasks)), clientv3.WithRev(rev+1))
	timer := time.NewTimer(0)
	defer timer.Stop()
	// take applies one watch response; block chooses whether to wait for it.
	take := func(block bool) (bool, error) {
		var wr clientv3.WatchResponse
		var ok bool
		if block {
			select {
			case <-ctx.Done():
				return false, ctx.Err()
			case <-s.set.changed:
				return false, nil
			case wr, ok = <-events:
			case <-timer.C:
				return false, nil
			}
		} else {
			select {
			case wr, ok = <-events:
			default:
				return false, nil
			}
		}
		return true, s.cache.applyWatch(wr, ok)
	}
	var lastRound time.Time
	for {
		if _, err := take(true); err != nil {
			return err
		}
		// Take every event already delivered before the round.
		for {
			more, err := take(false)
			if err != nil {
				return err
			}
			if !more {
				break
			}
		}
		resetTimer := func(d time.Duration) {
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
			timer.Reset(d)
		}
		// Coalesce: under a stream of reports, run at most one round per
		// minRoundGap; the events keep being applied in between.
		if since := time.Since(lastRound); since < minRoundGap {
			resetTimer(minRoundGap - since)
			continue
		}
		if !s.set.beginRound(ctx) {
			return ctx.Err()
		}
		s.refreshOwned()
		next, err := s.round(ctx)
		s.set.endRound()
		if err != nil {
			return err
		}
		lastRound = time.Now()
		resetTimer(next)
	}
}

// minRoundGap is the least time between two scheduling rounds.
const minRoundGap = 15 * time.Millisecond

// round runs one pass and returns how long to wait for the next one if no
// event comes first.
func (s *Loop) round(ctx context.Context) (time.Duration, error) {
	now := time.Now()
	if len(s.owned) == 0 {
		// Owns nothing: keep the published per-shard counts fresh only.
		s.updateGauges(now)
		return time.Second, nil
	}
	before := s.conflicts
	defer func() { s.d.Metrics.RoundConflicts.Observe(float64(s.conflicts - before)) }()
	reclaimNext, err := s.reclaim(ctx, now)
	if err != nil {
		return 0, err
	}
	if err := s.cancels(ctx, now); err != nil {
		return 0, err
	}
	reservedNext, err := s.dispatchReserved(ctx, now)
	if err != nil {
		return 0, err
	}
	next, err := s.place(ctx, now)
	if err != nil {
		return 0, err
	}
	next = min(next, reclaimNext, reservedNext)
	s.updateGauges(now)
	if time.Since(s.usageSynced) > 500*time.Millisecond {
		if err := s.syncUsage(ctx); err != nil {
			return 0, err
		}
		s.usageSynced = time.Now()
	}
	if every := min(10*time.Second, max(s.d.Retention/2, 100*time.Millisecond)); time.Since(s.swept) > every {
		if err := s.sweepRetention(ctx, now); err != nil {
			return 0, err
		}
		if err := s.sweepScopeKeys(ctx); err != nil {
			return 0, err
		}
		s.swept = time.Now()
	}
	return next, nil
}

// reclaim returns the active tasks of lost node epochs to PENDING (or FAILED
// when their budget is spent), in fenced writes. A task whose job asked not
// to be replaced (disconnect.replace: false) is left on its lost epoch until
// its lost_after has passed since this owner first saw the epoch lost (an
// agent that comes back within it adopts the attempt); the returned duration
// is how long until the next such task is due (a minute when none waits).
func (s *Loop) reclaim(ctx context.Context, now time.Time) (time.Duration, error) {
	c := s.cache
	var ws []write
	next := time.Minute
	lostEpochs := map[int64]bool{}
	seenLost := map[nodeEpoch]bool{}
	for nodeID, keys := range c.byNode {
		n := c.nodes[nodeID]
		if n != nil && n.Alive != 0 && c.onlyLiveEpoch(nodeID, n.Alive) {
			continue // every task there runs under the live epoch
		}
		perEpoch := c.byNodeEpoch[nodeID] // active tasks per epoch
		for key := range keys {
			ct := c.tasks[key]
			if !s.owns(ct.shard) || (n != nil && n.Alive != 0 && n.Alive == ct.rec.NodeEpoch) {
				continue
			}
			ne := nodeEpoch{nodeID, ct.rec.NodeEpoch}
			seenLost[ne] = true
			since, ok := s.lostSince[ne]
			if !ok {
				since = now
				s.lostSince[ne] = now
			}
			p, _ := c.jobPolicy(&ct.rec)
			// An epoch first seen lost while this coordinator was in its
			// failover grace most likely lapsed while the region was down
			// (its agent may have killed the attempt at lost_after): the
			// control plane's outage is no task's doing, so it is not charged.
			loss := taskstate.Loss{Alone: perEpoch[ct.rec.NodeEpoch] == 1 && !since.Before(s.d.GraceUntil),
				Drained: n != nil && n.Rec != nil && n.Rec.Left && n.Rec.Epoch == ct.rec.NodeEpoch}
			if grace := s.d.GraceUntil; !loss.Drained && now.Before(grace) {
				// A coordinator that just started (often: the region is
				// back from an outage, in which node leases lapsed although
				// their agents kept running) lets agents reconnect and adopt
				// their attempts before it replaces them; Nomad resets node
				// TTLs to failover_heartbeat_ttl on leader change for the
				// same reason.
				next = min(next, grace.Sub(now))
				continue
			}
			if !p.Replace && !loss.Drained && !ct.rec.CancelRequested {
				wait := p.LostAfter
				if wait <= 0 {
					wait = s.d.DefaultLostAfter
				}
				if due := since.Add(wait); now.Before(due) {
					next = min(next, due.Sub(now))
					continue
				}
			}
			res, ok := taskstate.NodeLost(ct.rec, p, nodeID, ct.rec.NodeEpoch, loss, now.UnixMilli())
			if !ok {
				continue
			}
			why := fmt.Sprintf("node %s epoch %d lost (lease expired or revoked)", nodeID, ct.rec.NodeEpoch)
			if loss.Drained {
				why = fmt.Sprintf("node %s epoch %d left (agent shut down); requeued without charge", nodeID, ct.rec.NodeEpoch)
			}
			result := &apiaryv1.AttemptResult{Attempt: ct.rec.Attempt, NodeId: nodeID, NodeEpoch: ct.rec.NodeEpoch,
				FencingToken: ct.rec.FencingToken, Outcome: res.Outcome, ExitCode: -1,
				Error: why, StartTimeMs: ct.rec.StartedMs, EndTimeMs: now.UnixMilli()}
			newRec := res.Task
			lostEpochs[ct.rec.NodeEpoch] = true
			ws = append(ws, write{shards: []int{ct.shard},
				cmps: []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", ct.modRev)},
				ops: []clientv3.Op{clientv3.OpPut(key, store.MustJSON(&newRec)),
					clientv3.OpPut(store.KeyResult(ct.shard, ct.rec.JobID, ct.rec.Index, ct.rec.Attempt), store.MustJSON(result)),
					clientv3.OpDelete(store.KeyAssign(nodeID, ct.rec.JobID, ct.rec.Index))},
				keys: []string{key},
				after: func(rev int64) {
					s.observeReclaim(ct, &newRec, nodeID, why, now)
					c.setTask(key, &cTask{key: key, shard: ct.shard, rec: newRec, modRev: rev})
				},
			})
		}
	}
	for ne := range s.lostSince {
		if !seenLost[ne] {
			delete(s.lostSince, ne)
		}
	}
	if len(ws) > 0 {
		s.d.Log.Info("reclaiming tasks of lost nodes", "tasks", len(ws))
		s.d.Metrics.LeaseExpiries.Add(float64(len(lostEpochs)))
	}
	return next, s.commit(ctx, ws)
}

// nodeEpoch names one epoch of one node.
type nodeEpoch struct {
	node  string
	epoch int64
}

// cancels applies job cancellations: pending tasks become CANCELLED, active
// ones are marked and their assignment turns into a cancel for the agent.
func (s *Loop) cancels(ctx context.Context, now time.Time) error {
	c := s.cache
	var ws []write
	for jobID := range c.dirtyCancel {
		delete(c.dirtyCancel, jobID)
		j := c.jobs[jobID]
		if j == nil || !s.owns(j.rec.Shard) {
			continue // another owner's (marked again if this one gains it)
		}
		for key := range c.jobTasks[jobID] {
			ct := c.tasks[key]
			newRec, changed, kill := taskstate.Cancel(ct.rec, now.UnixMilli())
			if !changed {
				continue
			}
			ops := []clientv3.Op{clientv3.OpPut(key, store.MustJSON(&newRec))}
			if kill {
				a := &apiaryv1.Assignment{Kind: apiaryv1.Assignment_KIND_CANCEL, JobId: jobID, TaskIndex: ct.rec.Index,
					Attempt: ct.rec.Attempt, NodeEpoch: ct.rec.NodeEpoch, Region: s.d.Region, FailoverEpoch: ct.rec.FencingToken >> store.FailoverTokenShift}
				b, err := proto.Marshal(a)
				if err != nil {
					s.skip("marshal", key, err)
					continue
				}
				ak := store.KeyAssign(ct.rec.NodeID, jobID, ct.rec.Index)
				// Only rewrite an assignment that still exists (its
				// CreateRevision, the fencing token, is kept by a Put).
				ops = append(ops, clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(ak), ">", 0)},
					[]clientv3.Op{clientv3.OpPut(ak, string(b))}, nil))
			}

			ws = append(ws, write{shards: []int{ct.shard},
				cmps: []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", ct.modRev)},
				ops:  ops, keys: []string{key},
				after: func(rev int64) {
					c.setTask(key, &cTask{key: key, shard: ct.shard, rec: newRec, modRev: rev})
				},
			})
		}
	}
	before := s.conflicts
	if err := s.commit(ctx, ws); err != nil {
		return err
	}
	if s.conflicts != before {
		// Retry the jobs whose writes conflicted in the next round.
		for _, w := range ws {
			for _, k := range w.keys {
				if ct := c.tasks[k]; ct != nil {
					c.dirtyCancel[ct.rec.JobID] = true
				}
			}
		}
	}
	return nil
}

// refreshOwned takes the round's owned shards from the shard set. For each
// shard gained, its jobs' pending cancellations are marked for the cancels
// pass (another owner may have left them).
func (s *Loop) refreshOwned() {
	now := s.set.current()
	var gained []int
	for sh, e := range now {
		if old, ok := s.owned[sh]; !ok || old != e {
			gained = append(gained, sh)
		}
	}
	lost := 0
	for sh := range s.owned {
		if _, ok := now[sh]; !ok {
			lost++
		}
	}
	s.owned = now
	if len(gained) == 0 && lost == 0 {
		return
	}
	if len(gained) > 0 {
		g := make(map[int]bool, len(gained))
		for _, sh := range gained {
			g[sh] = true
		}
		for id, j := range s.cache.jobs {
			if g[j.rec.Shard] && j.rec.CancelRequested {
				s.cache.dirtyCancel[id] = true
			}
		}
	}
	s.d.Log.Info("scheduling shards", "owned", len(now), "gained", len(gained), "dropped", lost)
}

// owns reports whether this round may write for shard sh.
func (s *Loop) owns(sh int) bool {
	_, ok := s.owned[sh]
	return ok
}

// fences returns the fences of a write's shards; false when one of them is
// not owned (any more).
func (s *Loop) fences(shs []int) ([]store.Fence, bool) {
	out := make([]store.Fence, 0, len(shs))
	for _, sh := range shs {
		e, ok := s.owned[sh]
		if !ok {
			return nil, false
		}
		out = append(out, store.Fence{Shard: sh, Epoch: e})
	}
	return out, true
}

// dropShards stops writing for shards whose fence failed: another
// coordinator owns them now (this one's lease lapsed or was revoked, or it
// handed them back). The reconciler learns the same from its owners view.
func (s *Loop) dropShards(fs []store.Fence, why string) {
	for _, f := range fs {
		delete(s.owned, f.Shard)
	}
	s.set.drop(fs)
	s.d.Metrics.FencedWrites.Inc()
	s.d.Log.Warn("shards lost: "+why+" found another owner", "shards", len(fs), "first", fs[0].Shard, "epoch", int64(fs[0].Epoch))
}

// homeShard is the shard whose owner keeps node id's usage key in step
// (syncUsage): one writer per node, spread like the jobs.
func (s *Loop) homeShard(id string) int {
	if s.d.ShardCount <= 0 {
		return 0
	}
	return shards.Of(id, s.d.ShardCount)
}
