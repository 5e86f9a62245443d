package failover

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/jobspec"
	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/regional/taskstate"
	"apiary.dev/apiary/shards"
)

// activateLoop, on the region's failover leader, activates the standby jobs
// whose home region has been down for their failover.after.
func (m *Manager) activateLoop(ctx context.Context) { m.leaderLoop(ctx, activateEvery, m.activateDue) }

// leaderLoop runs fn every period while this coordinator is the region's
// failover leader, until ctx ends.
func (m *Manager) leaderLoop(ctx context.Context, every time.Duration, fn func(context.Context)) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if m.leader(ctx) {
			fn(ctx)
		}
	}
}

// confirmed counts, per home region, the region's coordinators whose
// observation says the home has been down for at least after, and the
// region's live members.
func (m *Manager) confirmations(ctx context.Context, home string) (since []int64, members int64, err error) {
	cctx, cancel := store.EtcdCtx(ctx)
	defer cancel()
	resp, err := m.cfg.Client.Txn(cctx).Then(
		clientv3.OpGet(store.PrefObserve(home), clientv3.WithPrefix()),
		clientv3.OpGet(store.PrefMembers, clientv3.WithPrefix(), clientv3.WithCountOnly())).Commit()
	if err != nil {
		return nil, 0, err
	}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		var o store.ObserveRecord
		if json.Unmarshal(kv.Value, &o) == nil && o.DownSinceMs > 0 {
			since = append(since, o.DownSinceMs)
		}
	}
	return since, resp.Responses[1].GetResponseRange().Count, nil
}

// due reports whether a standby job stored at storedMs may be activated
// now: a majority of the region's live coordinators (not one observer) have
// seen its home down for after, since after the record was stored. A record
// stored while the home looked down proves the home alive then (it wrote
// the record): a region that came back and took new jobs before the
// standbys saw it up must not lose them at once.
func due(afterMs, nowMs, storedMs int64, since []int64, members int64) bool {
	n := int64(0)
	for _, s := range since {
		if nowMs-s >= afterMs && s > storedMs {
			n++
		}
	}
	return members > 0 && n > members/2
}

// majorityDownFor is how long (ms) a majority of a region's members have
// seen a home down, given each observer's down-since (ms, unordered) and
// the live member count (0: fewer than a majority see it down). due's
// majority rule, without the record's age: a standby whose majority has
// seen the home down for less than after cannot activate yet, nor grant a
// claim (ClaimJob).
func majorityDownFor(nowMs int64, since []int64, members int64) int64 {
	need := members/2 + 1
	if members <= 0 || int64(len(since)) < need {
		return 0
	}
	s := slices.Sorted(slices.Values(since))
	return max(nowMs-s[need-1], 0)
}

// witnessDownFor is how long a majority of this region's coordinators have
// seen home down (majorityDownFor over the stored observations).
func (m *Manager) witnessDownFor(ctx context.Context, home string) (time.Duration, error) {
	since, members, err := m.confirmations(ctx, home)
	if err != nil {
		return 0, err
	}
	return time.Duration(majorityDownFor(m.cfg.Now().UnixMilli(), since, members)) * time.Millisecond, nil
}

func (m *Manager) activateDue(ctx context.Context) {
	// Only the records of homes that a majority of this region's
	// coordinators see down can be due (by their observations, not by the
	// leader's own view alone: a leader that still reaches the home while
	// the others do not must not stall the job, which this region would
	// also refuse to give up to a later standby, ClaimJob).
	homes, err := m.standbyHomes(ctx)
	if err != nil {
		return
	}
	type conf struct {
		since   []int64
		members int64
	}
	byHome := map[string]*conf{}
	nowMs := m.cfg.Now().UnixMilli()
	var recs []standbyKV
	for home := range homes {
		since, members, err := m.confirmations(ctx, home)
		if err != nil {
			return
		}
		if majorityDownFor(nowMs, since, members) <= 0 {
			continue
		}
		byHome[home] = &conf{since, members}
		rs, err := m.standbys(ctx, home)
		if err != nil {
			return
		}
		recs = append(recs, rs...)
	}
	for _, r := range recs {
		// The k-th standby in the job's order waits k × claimStagger more,
		// so the preferred standby normally activates the job; the claim
		// makes it exactly one either way.
		k := max(slices.Index(r.rec.Standbys, m.cfg.Meta.Region), 0)
		after := time.Duration(r.rec.AfterMs)*time.Millisecond + time.Duration(k)*claimStagger
		c := byHome[r.rec.Home]
		if c == nil || !due(after.Milliseconds(), nowMs, r.rec.StoredMs, c.since, c.members) {
			continue
		}
		if !m.claimOthers(ctx, r) {
			continue
		}
		if err := m.activate(ctx, r); err != nil {
			m.cfg.Log.Warn("failover: activate", "job", r.rec.ID, "home", r.rec.Home, "err", err)
		}
	}
}

// claimOthers asks every other standby of the job, earlier and later in
// its order, to give the job up (ClaimJob) before this region activates it:
// a grant bars that region from activating it ever (its activation Txn
// requires no claim), so of two standbys that both come to activate, the
// second asks the first and learns it is active. None is skipped, not even
// one that looks down: a region grants only when a majority of its own
// coordinators have seen the home down for after, which is what lets a
// home run its job while any one standby answers it (Hold). The price: a
// job whose home and other standby are both lost waits for one of them.
// It returns false when another standby activated or claimed the job (this
// region's standby record is then dropped), refused, or could not be
// asked.
func (m *Manager) claimOthers(ctx context.Context, r standbyKV) bool {
	me := m.cfg.Meta.Region
	for _, other := range r.rec.Standbys {
		if other == me {
			continue
		}
		if m.DownFor(other) > 0 {
			m.cfg.Log.Debug("failover: another standby is down; it must grant the claim first", "job", r.rec.ID, "standby", other)
			return false
		}
		var resp *apiaryv1.ClaimJobResponse
		cctx, cancel := context.WithTimeout(ctx, putTimeout)
		err := m.call(cctx, other, func(ctx context.Context, c apiaryv1.FailoverServiceClient) (err error) {
			resp, err = c.ClaimJob(ctx, &apiaryv1.ClaimJobRequest{JobId: r.rec.ID, StandbyRegion: me, AfterMs: r.rec.AfterMs})
			return err
		})
		cancel()
		if err != nil {
			m.cfg.Log.Debug("failover: another standby did not grant the claim", "job", r.rec.ID, "standby", other, "err", err)
			return false
		}
		if !resp.GetGranted() {
			m.cfg.Log.Info("failover: another standby has the job", "job", r.rec.ID, "standby", other, "active", resp.GetActiveRegion())
			m.drop(ctx, r)
			return false
		}
	}
	return true
}

// drop deletes a standby record that will never be activated here.
func (m *Manager) drop(ctx context.Context, r standbyKV) {
	_, err := m.cfg.Retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return m.cfg.Client.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(store.KeyStandby(r.rec.ID)), "=", r.modRev)).
			Then(m.dropOps(&r.rec)...).Commit()
	})
	if err != nil {
		m.cfg.Log.Warn("failover: drop standby record", "job", r.rec.ID, "err", err)
	}
}

// activate makes a standby job this region's: its job record and its tasks
// (those whose completion was replicated COMPLETE with the home's attempt
// and token, the others PENDING) under failover epoch home_epoch + 1, and
// its moved record, in one Txn that succeeds only once: the job key and the
// moved key must not exist, no later standby may have claimed the job, and
// the standby record must be the one read.
func (m *Manager) activate(ctx context.Context, r standbyKV) error {
	cctx, cancel := store.EtcdCtx(ctx)
	resp, err := m.cfg.Client.Get(cctx, store.PrefStandbyTasks(r.rec.ID), clientv3.WithPrefix())
	cancel()
	if err != nil {
		return err
	}
	done := map[int32]store.TaskDoneRecord{}
	for _, kv := range resp.Kvs {
		k := string(kv.Key)
		idx, err := strconv.Atoi(k[strings.LastIndexByte(k, '/')+1:])
		var d store.TaskDoneRecord
		if err == nil && json.Unmarshal(kv.Value, &d) == nil {
			done[int32(idx)] = d
		}
	}
	now := m.cfg.Now()
	sr := r.rec
	// One epoch per standby (its place in the job's order, from 1): should
	// two ever activate the job, their tokens still differ.
	epoch := sr.HomeEpoch + 1 + int64(max(slices.Index(sr.Standbys, m.cfg.Meta.Region), 0))
	shard := shards.Of(sr.ID, m.cfg.Meta.ShardCount)
	job := store.JobRecord{ID: sr.ID, Region: m.cfg.Meta.Region, Shard: shard, Spec: sr.Spec, SubmitMs: sr.SubmitMs,
		ClientID: sr.ClientID, RequestID: sr.RequestID, Traceparent: sr.Traceparent, TaskCount: int32(jobspec.TaskCount(sr.Spec)),
		Where: sr.Where, Failover: &store.FailoverRecord{AfterMs: sr.AfterMs, Standbys: sr.Standbys, Home: sr.Home, Epoch: epoch, MovedMs: now.UnixMilli()}}
	if job.RequestID != "" {
		job.PayloadHash = jobspec.PayloadHash(sr.Spec)
	}
	ops := []clientv3.Op{clientv3.OpPut(store.KeyJob(shard, sr.ID), store.MustJSON(job))}
	idx := int32(0)
	skipped := 0
	for g, grp := range sr.Spec.GetTasks() {
		for i := int32(0); i < grp.GetCount(); i++ {
			t := taskstate.Task{JobID: sr.ID, Index: idx, Group: int32(g), State: apiaryv1.TaskState_TASK_STATE_PENDING}
			if d, ok := done[idx]; ok {
				// Completed at home: kept, with the home's attempt, node
				// and token, and its result, so status and logs show it.
				t.State, t.Attempt, t.FencingToken, t.FinishedMs = apiaryv1.TaskState_TASK_STATE_COMPLETE, d.Attempt, d.Token, d.DoneMs
				t.NodeID, t.StartedMs = d.Node, d.StartMs
				skipped++
				res := &apiaryv1.AttemptResult{Attempt: d.Attempt, NodeId: d.Node, FencingToken: d.Token, Outcome: taskstate.OutcomeComplete,
					StartTimeMs: d.StartMs, EndTimeMs: d.DoneMs, StdoutTail: fmt.Sprintf("(completed in region %s before the job moved; its output stayed there)", sr.Home)}
				ops = append(ops, clientv3.OpPut(store.KeyResult(shard, sr.ID, idx, d.Attempt), store.MustJSON(res)))
			}
			ops = append(ops, clientv3.OpPut(store.KeyTask(shard, sr.ID, idx), store.MustJSON(&t)))
			idx++
		}
	}
	ops = append(ops, clientv3.OpPut(store.KeyMoved(sr.ID), store.MustJSON(store.MovedRecord{Home: sr.Home, Epoch: epoch, MovedMs: now.UnixMilli()})),
		clientv3.OpDelete(store.KeyStandby(sr.ID)), clientv3.OpDelete(store.PrefStandbyTasks(sr.ID), clientv3.WithPrefix()))
	tresp, err := m.cfg.Retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return m.cfg.Client.Txn(ctx).If(
			clientv3.Compare(clientv3.CreateRevision(store.KeyJob(shard, sr.ID)), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(store.KeyMoved(sr.ID)), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(store.KeyClaimed(sr.ID)), "=", 0),
			clientv3.Compare(clientv3.ModRevision(store.KeyStandby(sr.ID)), "=", r.modRev),
		).Then(ops...).Commit()
	})
	if err != nil {
		return err
	}
	if tresp.Succeeded {
		m.cfg.Log.Warn("failover: job activated here; its home region is down", "job", sr.ID, "home", sr.Home, "epoch", epoch,
			"down_for", m.DownFor(sr.Home).Round(time.Millisecond), "after_ms", sr.AfterMs, "tasks_not_rerun", skipped, "tasks", idx)
	}
	return nil
}
