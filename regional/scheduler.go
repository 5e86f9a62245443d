package regional

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/placement"
	"apiary.dev/apiary/regional/taskstate"
	"apiary.dev/apiary/shards"
)

// errFenced means a fenced write found the owner key gone or replaced: this
// coordinator no longer owns the shards and must stop writing for them.
var errFenced = errors.New("fenced: shard ownership lost")

// Limits of one scheduling round.
const (
	maxPlaceBatch   = 4096 // pending tasks considered per round
	maxTasksPerPlan = 512  // placements committed per plan Txn
	maxOpsPerFenced = 2048 // ops per reclaim / cancel / reason Txn
)

// scheduler is the shard owner's loop: a cache of jobs, tasks and nodes kept
// by a range read plus watches, and rounds of reclaim → cancel → place →
// commit. Every write it makes goes through fencedTxn.
type scheduler struct {
	c      *Coordinator
	term   *shards.Term
	placer placement.Placer
	rng    *rand.Rand

	jobs        map[string]*cJob
	jobTasks    map[string]map[string]bool // job id -> task keys
	tasks       map[string]*cTask
	nodes       map[string]*cNode
	pending     map[string]bool            // task keys in PENDING
	byNode      map[string]map[string]bool // node id -> active task keys
	dirtyCancel map[string]bool
	usageSynced time.Time
	swept       time.Time
	// nodesGen counts node record and liveness changes (Snapshot.Generation).
	nodesGen uint64
	// unplacedSince and reasonAt gate unplaced-reason writes: a task's
	// reason is recorded once it has waited reasonAfter, then at most every
	// reasonEvery, so a busy region does not rewrite its queue every round.
	unplacedSince map[string]time.Time
	reasonAt      map[string]time.Time
	// conflicts counts failed plan/write compares (for the plan metrics).
	conflicts int
	// The placement input kept between rounds (snapshot in place.go):
	// snapNodes are the ready nodes, sorted, built at nodesGen snapGen-1;
	// nodeUse caches each node's usage from its active tasks, recomputed
	// for the nodes in useDirty (a task on them changed) and for all when
	// the node set changes.
	snapGen   uint64
	snapNodes []*placement.Node
	snapIdx   map[string]*placement.Node // id -> its entry in snapNodes
	nodeUse   map[string]nodeUse
	useDirty  map[string]bool
	gaugesAt  time.Time // metrics gauges last set (telemetry.go)
}

type cJob struct {
	rec    jobRecord
	modRev int64
}

type cTask struct {
	key    string
	shard  int
	rec    taskstate.Task
	modRev int64
}

type cNode struct {
	id       string
	rec      *nodeRecord
	alive    int64
	usage    usageRecord
	usageRev int64
}

func newScheduler(c *Coordinator, term *shards.Term) *scheduler {
	p := c.cfg.Placer
	if p == nil {
		// Preemption proposals are not committed by the coordinator (yet),
		// and the snapshot carries only the existing allocations of the
		// batch's groups, so the engine does not compute them.
		p = placement.New(placement.Options{Policy: c.cfg.SchedulerPolicy, Seed: term.Epoch, DisablePreemption: true,
			Workload: c.cfg.Workload})
	}
	return &scheduler{c: c, term: term, placer: p, rng: rand.New(rand.NewPCG(uint64(term.Epoch), 7)),
		jobs: map[string]*cJob{}, jobTasks: map[string]map[string]bool{}, tasks: map[string]*cTask{},
		nodes: map[string]*cNode{}, pending: map[string]bool{}, byNode: map[string]map[string]bool{},
		dirtyCancel: map[string]bool{}, unplacedSince: map[string]time.Time{}, reasonAt: map[string]time.Time{},
		nodeUse: map[string]nodeUse{}, useDirty: map[string]bool{}}
}

// fencedTxn is the one path for every owner write: the ops commit only if
// the owner key still has this term's epoch (and the extra compares hold).
// It returns errFenced when the epoch compare is what failed, and
// (false, nil) for any other failed compare.
//
// A Txn whose outcome is unknown (timeout) is retried as is: its compares
// (the fence plus each touched key's revision) fail if it was applied.
func (s *scheduler) fencedTxn(ctx context.Context, cmps []clientv3.Cmp, ops []clientv3.Op) (*clientv3.TxnResponse, error) {
	all := append([]clientv3.Cmp{s.term.Fence()}, cmps...)
	resp, err := s.c.txnRetry(ctx, func(actx context.Context) (*clientv3.TxnResponse, error) {
		return s.c.cli.Txn(actx).If(all...).Then(ops...).Commit()
	})
	if err != nil {
		return nil, err
	}
	if resp.Succeeded {
		return resp, nil
	}
	cctx, cancel := etcdCtx(ctx)
	defer cancel()
	chk, err := s.c.cli.Txn(cctx).If(s.term.Fence()).Commit()
	if err != nil {
		return nil, err
	}
	if !chk.Succeeded {
		return nil, errFenced
	}
	return resp, nil
}

func (s *scheduler) run(ctx context.Context) error {
	rev, err := s.load(ctx)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	jobsW := s.c.cli.Watch(wctx, prefJobs, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	tasksW := s.c.cli.Watch(wctx, prefTasks, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	nodesW := s.c.cli.Watch(wctx, prefNodes, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
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
			case <-s.term.Done():
				return false, errors.New("owner lease ended")
			case wr, ok = <-jobsW:
			case wr, ok = <-tasksW:
			case wr, ok = <-nodesW:
			case <-timer.C:
				return false, nil
			}
		} else {
			select {
			case wr, ok = <-jobsW:
			case wr, ok = <-tasksW:
			case wr, ok = <-nodesW:
			default:
				return false, nil
			}
		}
		return true, s.applyWatch(wr, ok)
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
		next, err := s.round(ctx)
		if err != nil {
			return err
		}
		lastRound = time.Now()
		resetTimer(next)
	}
}

// minRoundGap is the least time between two scheduling rounds.
const minRoundGap = 15 * time.Millisecond

func (s *scheduler) applyWatch(wr clientv3.WatchResponse, ok bool) error {
	if !ok {
		return errors.New("watch closed")
	}
	if err := wr.Err(); err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	for _, ev := range wr.Events {
		s.apply(ev.Kv, ev.Type == clientv3.EventTypeDelete)
	}
	return nil
}

// load reads jobs, tasks and nodes at one revision.
func (s *scheduler) load(ctx context.Context) (int64, error) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := s.c.cli.Txn(cctx).Then(clientv3.OpGet(prefJobs, clientv3.WithPrefix()),
		clientv3.OpGet(prefTasks, clientv3.WithPrefix()), clientv3.OpGet(prefNodes, clientv3.WithPrefix())).Commit()
	if err != nil {
		return 0, fmt.Errorf("load: %w", err)
	}
	for _, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().Kvs {
			s.apply(kv, false)
		}
	}
	return resp.Header.Revision, nil
}

// apply folds one key's new value (or deletion) into the cache; older
// revisions than the cached one are ignored (own writes are applied at
// commit time and seen again from the watch).
func (s *scheduler) apply(kv *mvccpb.KeyValue, deleted bool) {
	key := string(kv.Key)
	switch {
	case hasPrefix(key, prefTasks):
		shard, jobID, _, ok := parseTaskKey(key)
		if !ok {
			return
		}
		old := s.tasks[key]
		if old != nil && kv.ModRevision <= old.modRev {
			return
		}
		if deleted {
			s.setTask(key, nil)
			return
		}
		var t taskstate.Task
		if json.Unmarshal(kv.Value, &t) != nil {
			return
		}
		_ = jobID
		s.setTask(key, &cTask{key: key, shard: shard, rec: t, modRev: kv.ModRevision})
	case hasPrefix(key, prefJobs):
		_, jobID, ok := parseJobKey(key)
		if !ok {
			return
		}
		if deleted {
			delete(s.jobs, jobID)
			return
		}
		if old := s.jobs[jobID]; old != nil && kv.ModRevision <= old.modRev {
			return
		}
		var j jobRecord
		if json.Unmarshal(kv.Value, &j) != nil {
			return
		}
		s.jobs[jobID] = &cJob{rec: j, modRev: kv.ModRevision}
		s.c.specs.put(&j)
		if j.CancelRequested {
			s.dirtyCancel[jobID] = true
		}
	case hasPrefix(key, prefNodes):
		id, kind, ok := nodeKeyKind(key)
		if !ok {
			return
		}
		if kind != "usage" {
			// Node set, labels or capacity may change: the placement
			// engine must rebuild its per-snapshot indexes.
			s.nodesGen++
		}
		n := s.nodes[id]
		if n == nil {
			n = &cNode{id: id}
			s.nodes[id] = n
		}
		switch kind {
		case "record":
			if deleted {
				n.rec = nil
				return
			}
			var r nodeRecord
			if json.Unmarshal(kv.Value, &r) == nil {
				n.rec = &r
			}
		case "alive":
			if deleted {
				n.alive = 0
			} else {
				n.alive = kv.CreateRevision
			}
		case "usage":
			if kv.ModRevision <= n.usageRev && !deleted {
				return
			}
			if deleted {
				n.usage, n.usageRev = usageRecord{}, 0
				return
			}
			var u usageRecord
			if json.Unmarshal(kv.Value, &u) == nil {
				n.usage, n.usageRev = u, kv.ModRevision
			}
		}
	}
}

func hasPrefix(s, p string) bool { return len(s) >= len(p) && s[:len(p)] == p }

// setTask replaces a cached task and keeps the indexes in step.
func (s *scheduler) setTask(key string, t *cTask) {
	if t != nil && t.rec.NodeID != "" {
		s.useDirty[t.rec.NodeID] = true
	}
	if old := s.tasks[key]; old != nil {
		if old.rec.NodeID != "" {
			s.useDirty[old.rec.NodeID] = true
		}
		delete(s.pending, key)
		if m := s.byNode[old.rec.NodeID]; m != nil {
			delete(m, key)
		}
		if t == nil {
			delete(s.unplacedSince, key)
			delete(s.reasonAt, key)
			delete(s.tasks, key)
			if m := s.jobTasks[old.rec.JobID]; m != nil {
				delete(m, key)
			}
			return
		}
	}
	if t == nil {
		return
	}
	s.tasks[key] = t
	m := s.jobTasks[t.rec.JobID]
	if m == nil {
		m = map[string]bool{}
		s.jobTasks[t.rec.JobID] = m
	}
	m[key] = true
	if t.rec.State != apiaryv1.TaskState_TASK_STATE_PENDING {
		delete(s.unplacedSince, key)
		delete(s.reasonAt, key)
	}
	switch {
	case t.rec.State == apiaryv1.TaskState_TASK_STATE_PENDING:
		s.pending[key] = true
	case taskstate.Active(t.rec.State):
		bn := s.byNode[t.rec.NodeID]
		if bn == nil {
			bn = map[string]bool{}
			s.byNode[t.rec.NodeID] = bn
		}
		bn[key] = true
	}
}

// round runs one pass and returns how long to wait for the next one if no
// event comes first.
func (s *scheduler) round(ctx context.Context) (time.Duration, error) {
	now := time.Now()
	if err := s.reclaim(ctx, now); err != nil {
		return 0, err
	}
	if err := s.cancels(ctx, now); err != nil {
		return 0, err
	}
	next, err := s.place(ctx, now)
	if err != nil {
		return 0, err
	}
	s.updateGauges(now)
	if time.Since(s.usageSynced) > 500*time.Millisecond {
		if err := s.syncUsage(ctx); err != nil {
			return 0, err
		}
		s.usageSynced = time.Now()
	}
	if every := min(10*time.Second, max(s.c.cfg.JobRetention/2, 100*time.Millisecond)); time.Since(s.swept) > every {
		if err := s.sweepRetention(ctx, now); err != nil {
			return 0, err
		}
		s.swept = time.Now()
	}
	return next, nil
}

// commitChunks runs fencedTxn over groups of writes; a failed compare
// (other than the fence) re-reads the keys involved.
type write struct {
	cmps []clientv3.Cmp
	ops  []clientv3.Op
	keys []string
	// after runs when the chunk committed, with the commit revision.
	after func(rev int64)
}

func (s *scheduler) commit(ctx context.Context, ws []write) error {
	for len(ws) > 0 {
		var cmps []clientv3.Cmp
		var ops []clientv3.Op
		var keys []string
		n := 0
		for n < len(ws) && (n == 0 || len(ops)+len(ws[n].ops) <= maxOpsPerFenced) {
			cmps = append(cmps, ws[n].cmps...)
			ops = append(ops, ws[n].ops...)
			keys = append(keys, ws[n].keys...)
			n++
		}
		resp, err := s.fencedTxn(ctx, cmps, ops)
		if err != nil {
			return err
		}
		if resp.Succeeded {
			for _, w := range ws[:n] {
				if w.after != nil {
					w.after(resp.Header.Revision)
				}
			}
		} else {
			s.conflicts++
			if err := s.reread(ctx, keys); err != nil {
				return err
			}
		}
		ws = ws[n:]
	}
	return nil
}

// reread refreshes the cache for keys after a failed compare.
func (s *scheduler) reread(ctx context.Context, keys []string) error {
	cctx, cancel := etcdCtx(ctx)
	defer cancel()
	ops := make([]clientv3.Op, 0, len(keys))
	for _, k := range keys {
		ops = append(ops, clientv3.OpGet(k))
	}
	resp, err := s.c.cli.Txn(cctx).Then(ops...).Commit()
	if err != nil {
		return err
	}
	for i, r := range resp.Responses {
		kvs := r.GetResponseRange().Kvs
		if len(kvs) == 0 {
			s.apply(&mvccpb.KeyValue{Key: []byte(keys[i]), ModRevision: resp.Header.Revision}, true)
			continue
		}
		s.apply(kvs[0], false)
	}
	return nil
}

func (s *scheduler) jobPolicy(t *taskstate.Task) (taskstate.Policy, *jobRecord) {
	j := s.jobs[t.JobID]
	if j == nil {
		return taskstate.Policy{MaxAttempts: 3}, nil
	}
	return policyOf(j.rec.Spec, t.Group), &j.rec
}

// reclaim returns the active tasks of lost node epochs to PENDING (or FAILED
// when their budget is spent), in fenced writes.
func (s *scheduler) reclaim(ctx context.Context, now time.Time) error {
	var ws []write
	lostEpochs := map[int64]bool{}
	for nodeID, keys := range s.byNode {
		n := s.nodes[nodeID]
		for key := range keys {
			ct := s.tasks[key]
			if n != nil && n.alive != 0 && n.alive == ct.rec.NodeEpoch {
				continue
			}
			p, _ := s.jobPolicy(&ct.rec)
			res, ok := taskstate.NodeLost(ct.rec, p, nodeID, ct.rec.NodeEpoch, now.UnixMilli())
			if !ok {
				continue
			}

			result := &apiaryv1.AttemptResult{Attempt: ct.rec.Attempt, NodeId: nodeID, NodeEpoch: ct.rec.NodeEpoch,
				FencingToken: ct.rec.FencingToken, Outcome: res.Outcome, ExitCode: -1,
				Error:       fmt.Sprintf("node %s epoch %d lost (lease expired or revoked)", nodeID, ct.rec.NodeEpoch),
				StartTimeMs: ct.rec.StartedMs, EndTimeMs: now.UnixMilli()}
			newRec := res.Task
			lostEpochs[ct.rec.NodeEpoch] = true
			ws = append(ws, write{
				cmps: []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", ct.modRev)},
				ops: []clientv3.Op{clientv3.OpPut(key, mustJSON(&newRec)),
					clientv3.OpPut(keyResult(ct.shard, ct.rec.JobID, ct.rec.Index, ct.rec.Attempt), mustJSON(result)),
					clientv3.OpDelete(keyAssign(nodeID, ct.rec.JobID, ct.rec.Index))},
				keys: []string{key},
				after: func(rev int64) {
					s.observeReclaim(ct, &newRec, nodeID, now)
					s.setTask(key, &cTask{key: key, shard: ct.shard, rec: newRec, modRev: rev})
				},
			})
		}
	}
	if len(ws) > 0 {
		s.c.log.Info("reclaiming tasks of lost nodes", "tasks", len(ws))
		s.c.metrics.LeaseExpiries.Add(float64(len(lostEpochs)))
	}
	return s.commit(ctx, ws)
}

// cancels applies job cancellations: pending tasks become CANCELLED, active
// ones are marked and their assignment turns into a cancel for the agent.
func (s *scheduler) cancels(ctx context.Context, now time.Time) error {
	var ws []write
	for jobID := range s.dirtyCancel {
		delete(s.dirtyCancel, jobID)
		j := s.jobs[jobID]
		if j == nil {
			continue
		}
		for key := range s.jobTasks[jobID] {
			ct := s.tasks[key]
			newRec, changed, kill := taskstate.Cancel(ct.rec, now.UnixMilli())
			if !changed {
				continue
			}
			ops := []clientv3.Op{clientv3.OpPut(key, mustJSON(&newRec))}
			if kill {
				a := &apiaryv1.Assignment{Kind: apiaryv1.Assignment_KIND_CANCEL, JobId: jobID, TaskIndex: ct.rec.Index,
					Attempt: ct.rec.Attempt, NodeEpoch: ct.rec.NodeEpoch, Region: s.c.meta.Region}
				b, _ := proto.Marshal(a)
				ak := keyAssign(ct.rec.NodeID, jobID, ct.rec.Index)
				// Only rewrite an assignment that still exists (its
				// CreateRevision, the fencing token, is kept by a Put).
				ops = append(ops, clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(ak), ">", 0)},
					[]clientv3.Op{clientv3.OpPut(ak, string(b))}, nil))
			}

			ws = append(ws, write{
				cmps: []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", ct.modRev)},
				ops:  ops, keys: []string{key},
				after: func(rev int64) {
					s.setTask(key, &cTask{key: key, shard: ct.shard, rec: newRec, modRev: rev})
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
				if ct := s.tasks[k]; ct != nil {
					s.dirtyCancel[ct.rec.JobID] = true
				}
			}
		}
	}
	return nil
}
