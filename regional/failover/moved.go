package failover

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/regional/taskstate"
	"apiary.dev/apiary/shards"
)

// movedLoop, on every coordinator, asks each region of the pool that is up
// (every movedEvery) which of this region's jobs it activated, and marks
// them MOVED here: the
// job record gets the active region and a cancel request, so the shard
// owner kills their running attempts and dispatches nothing more of them,
// and reports of their old attempts no longer count (regional/reports.go).
// Until a standby of a failover job has answered within after/2, seeing
// this region up, the job is held (Hold): a region that comes back, or that
// was paused or cut off, dispatches none of its failover jobs before it
// knows which moved.
func (m *Manager) movedLoop(ctx context.Context) {
	for {
		m.movedOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-time.After(movedEvery):
		}
	}
}

func (m *Manager) movedOnce(ctx context.Context) {
	me := m.cfg.Meta.Region
	for _, r := range m.Regions() {
		if r.Name == me || !r.Up {
			continue
		}
		// Each region on its own: a slow one delays no other's answer
		// (Hold's freshness is per standby); at most one ask in flight
		// per region.
		m.mu.Lock()
		busy := m.asking[r.Name]
		if !busy {
			if m.asking == nil {
				m.asking = map[string]bool{}
			}
			m.asking[r.Name] = true
		}
		m.mu.Unlock()
		if busy {
			continue
		}
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			m.askMoved(ctx, r.Name)
			m.mu.Lock()
			delete(m.asking, r.Name)
			m.mu.Unlock()
		}()
	}
}

// askMoved asks region which of this region's jobs it activated, marks
// them, and records when it answered.
func (m *Manager) askMoved(ctx context.Context, region string) {
	var resp *apiaryv1.MovedJobsResponse
	asked := m.cfg.Now()
	m.mu.Lock()
	acks := m.acks[region]
	m.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, putTimeout)
	err := m.call(cctx, region, func(ctx context.Context, c apiaryv1.FailoverServiceClient) (err error) {
		resp, err = c.MovedJobs(ctx, &apiaryv1.MovedJobsRequest{HomeRegion: m.cfg.Meta.Region, Acknowledged: acks})
		return err
	})
	cancel()
	if err != nil {
		m.cfg.Log.Debug("failover: moved jobs", "region", region, "err", err)
		return
	}
	// What this answer lists and this region's job records now say moved
	// is acknowledged on the next call, and dropped there.
	var next []string
	defer func() {
		m.mu.Lock()
		m.acks[region] = next
		m.mu.Unlock()
	}()
	for _, mj := range resp.GetMoved() {
		known, err := m.markMoved(ctx, mj)
		if err != nil {
			m.cfg.Log.Warn("failover: mark a moved job", "job", mj.GetJobId(), "active", mj.GetActiveRegion(), "err", err)
			return
		}
		// A job with no record here is not acknowledged: its commit may
		// still be on the way (the standby's record then keeps it MOVED).
		if known && len(next) < maxAcks {
			next = append(next, mj.GetJobId())
		}
	}
	for _, c := range resp.GetClaimed() {
		if to, _ := m.MovedTo(c.GetJobId()); to != "" && len(next) < maxAcks {
			next = append(next, c.GetJobId())
		}
	}
	m.recordAnswer(region, asked, resp)
	for _, c := range resp.GetClaimed() {
		m.releaseLater(ctx, c.GetJobId(), c.GetClaimedBy(), region)
	}
}

// releaseFresh: how recent the claimer's answer seeing this region up must
// be for a claim left behind to be released.
var releaseFresh = 2 * time.Second

// releaseLater starts the release of a claim left behind on job id (granted
// at granter to claimer), unless one is in flight: only while the claimer
// itself answered MovedJobs within releaseFresh seeing this region up, so
// a claimer that is activating the job because it sees this region down is
// never asked to give it up.
func (m *Manager) releaseLater(ctx context.Context, id, claimer, granter string) {
	now := m.cfg.Now()
	m.mu.Lock()
	at, seen := m.answered[claimer]
	ok := seen && !m.seenDown[claimer] && now.Sub(at) <= releaseFresh && !m.releasing[id]
	if ok {
		if m.releasing == nil {
			m.releasing = map[string]bool{}
		}
		m.releasing[id] = true
	}
	m.mu.Unlock()
	if !ok {
		return
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer func() {
			m.mu.Lock()
			delete(m.releasing, id)
			m.mu.Unlock()
		}()
		if err := m.release(ctx, id, claimer, granter); err != nil {
			m.cfg.Log.Info("failover: release a claim left behind", "job", id, "claimer", claimer, "granter", granter, "err", err)
		}
	}()
}

// release ends a claim left behind on a job of this region: another
// standby (claimer) claimed the job from the others while this region was
// down, but did not activate it before this region came back (it died, or
// never heard the grant), so the job is held here (Hold) and the claimer,
// seeing this region up, will never activate it. In order:
//  1. the claimer writes its standby record again, with a new stored time,
//     in a Txn that requires the job not activated there (ReleaseJob; if it
//     was activated, the job is marked MOVED here instead);
//  2. every other standby drops the claim (DropClaim) and gets its record
//     again, with the job's progress.
//
// After 1 the claimer's activation in flight fails, and it is due again
// only after a new outage of after, for which the others grant only by the
// witness rule. Should this region die between the steps, the claimer
// still holds the record. Once no answer lists the claim, Hold lets the
// job run here.
func (m *Manager) release(ctx context.Context, id, claimer, granter string) error {
	rec, err := m.homeJob(ctx, id)
	if err == nil && rec.Moved() {
		// Marked before this coordinator started: the note lets askMoved
		// acknowledge the claim, which the granter then drops.
		m.noteMoved(id, rec.Failover.MovedTo, rec.Failover.MovedEpoch)
		return nil
	}
	if err != nil || rec == nil || rec.Failover == nil || rec.Failover.Epoch != 0 {
		return err // gone, or not a failover job of this region: nothing held
	}
	var rel *apiaryv1.ReleaseJobResponse
	cctx, cancel := context.WithTimeout(ctx, putTimeout)
	err = m.call(cctx, claimer, func(ctx context.Context, c apiaryv1.FailoverServiceClient) (err error) {
		rel, err = c.ReleaseJob(ctx, &apiaryv1.ReleaseJobRequest{HomeRegion: m.cfg.Meta.Region, JobId: id})
		return err
	})
	cancel()
	if err != nil {
		return fmt.Errorf("claimer %s: %w", claimer, err)
	}
	if !rel.GetReleased() {
		if mv := rel.GetMoved(); mv != nil {
			_, err := m.markMoved(ctx, mv)
			return err
		}
		return fmt.Errorf("claimer %s neither released nor activated the job", claimer)
	}
	// From here the claim cannot make the claimer activate (its record is
	// new; a new grant needs the witness rule): it no longer holds the job,
	// even while a granter that still lists it is unreachable (Hold).
	m.mu.Lock()
	if m.released == nil {
		m.released = map[string]string{}
	}
	m.released[id] = claimer
	m.mu.Unlock()
	others := append([]string{granter}, rec.Failover.Standbys...)
	done := map[string]bool{claimer: true}
	for _, g := range others {
		if done[g] {
			continue
		}
		done[g] = true
		cctx, cancel := context.WithTimeout(ctx, putTimeout)
		err := m.call(cctx, g, func(ctx context.Context, c apiaryv1.FailoverServiceClient) error {
			_, err := c.DropClaim(ctx, &apiaryv1.DropClaimRequest{HomeRegion: m.cfg.Meta.Region, JobId: id, ClaimedBy: claimer})
			return err
		})
		cancel()
		if err != nil {
			return fmt.Errorf("drop the claim at %s: %w", g, err)
		}
		m.restore(ctx, rec, g)
	}
	m.cfg.Log.Warn("failover: a claim left behind by a standby that never activated the job was released; the job runs here again",
		"job", id, "claimer", claimer, "granter", granter)
	return nil
}

// homeJob reads a job record of this region (nil when there is none).
func (m *Manager) homeJob(ctx context.Context, id string) (*store.JobRecord, error) {
	cctx, cancel := store.EtcdCtx(ctx)
	defer cancel()
	resp, err := m.cfg.Client.Get(cctx, store.KeyJob(shards.Of(id, m.cfg.Meta.ShardCount), id))
	if err != nil || len(resp.Kvs) == 0 {
		return nil, err
	}
	var rec store.JobRecord
	if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
		return nil, err
	}
	return &rec, nil
}

// restore writes a failover job's standby record in region again (when it
// is one of the job's standbys) with the completions so far: after a
// release, the job is protected there as before. Best effort: a failure is
// logged (the job then simply has one standby fewer).
func (m *Manager) restore(ctx context.Context, rec *store.JobRecord, region string) {
	if !slices.Contains(rec.Failover.Standbys, region) {
		return
	}
	cctx, cancel := store.EtcdCtx(ctx)
	tr, err := m.cfg.Client.Get(cctx, store.PrefJobTasks(rec.Shard, rec.ID), clientv3.WithPrefix())
	cancel()
	var done []*apiaryv1.TaskDone
	if err == nil {
		for _, kv := range tr.Kvs {
			var t taskstate.Task
			if json.Unmarshal(kv.Value, &t) == nil && t.State == apiaryv1.TaskState_TASK_STATE_COMPLETE {
				done = append(done, &apiaryv1.TaskDone{JobId: rec.ID, TaskIndex: t.Index, Attempt: t.Attempt, FencingToken: t.FencingToken,
					DoneTimeMs: t.FinishedMs, NodeId: t.NodeID, StartTimeMs: t.StartedMs})
			}
		}
	}
	sj := m.standbyJob(rec)
	cctx, cancel = context.WithTimeout(ctx, putTimeout)
	defer cancel()
	err = m.call(cctx, region, func(ctx context.Context, c apiaryv1.FailoverServiceClient) error {
		if _, err := c.PutStandby(ctx, &apiaryv1.PutStandbyRequest{Job: sj}); err != nil {
			return err
		}
		for start := 0; start < len(done); start += maxBatch {
			if _, err := c.PushProgress(ctx, &apiaryv1.PushProgressRequest{HomeRegion: m.cfg.Meta.Region, Done: done[start:min(start+maxBatch, len(done))]}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		m.cfg.Log.Warn("failover: could not write a released job's standby record again; it has one standby fewer", "job", rec.ID, "standby", region, "err", err)
	}
}

// recordAnswer keeps what a standby region answered MovedJobs at asked: the
// start of this region's lease from it and the jobs claimed there (Hold).
func (m *Manager) recordAnswer(region string, asked time.Time, resp *apiaryv1.MovedJobsResponse) {
	claimed := map[string]string{}
	for _, c := range resp.GetClaimed() {
		claimed[c.GetJobId()] = c.GetClaimedBy()
	}
	// The lease counts from when the standby's majority last saw this
	// region up: the call's start, less how long they have seen it down.
	start := asked.Add(-time.Duration(max(resp.GetHomeDownForMs(), 0)) * time.Millisecond)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.answered[region].IsZero() {
		m.cfg.Log.Info("failover: learned which jobs moved", "peer", region, "moved", len(resp.GetMoved()), "claimed", len(claimed))
	}
	// Said once per change, not per answer (4 a second).
	if down := resp.GetHomeDownForMs() > 0; down != m.seenDown[region] {
		if down {
			m.cfg.Log.Warn("failover: another region sees this region down; failover jobs standing by there are held unless another of their standbys sees it up",
				"peer", region, "down_for_ms", resp.GetHomeDownForMs())
		} else {
			m.cfg.Log.Info("failover: another region sees this region up again", "peer", region)
		}
		m.seenDown[region] = down
	}
	m.answered[region] = start
	m.claimed[region] = claimed
}

// markMoved records in the job's record that it moved to mj's region (and
// requests its cancellation here), unless it says so already. known: the
// record here says so now (false when there is no record).
func (m *Manager) markMoved(ctx context.Context, mj *apiaryv1.MovedJob) (known bool, err error) {
	id := mj.GetJobId()
	shard := shards.Of(id, m.cfg.Meta.ShardCount)
	key := store.KeyJob(shard, id)
	cctx, cancel := store.EtcdCtx(ctx)
	resp, err := m.cfg.Client.Get(cctx, key)
	cancel()
	if err != nil {
		return false, err
	}
	if len(resp.Kvs) == 0 {
		return false, nil // deleted by retention, or never committed here
	}
	var rec store.JobRecord
	if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
		return false, err
	}
	if rec.Failover == nil || rec.Failover.Epoch >= mj.GetEpoch() {
		return false, nil
	}
	if rec.Moved() {
		m.noteMoved(id, mj.GetActiveRegion(), mj.GetEpoch())
		return true, nil
	}
	rec.Failover.MovedTo, rec.Failover.MovedEpoch, rec.Failover.MovedMs = mj.GetActiveRegion(), mj.GetEpoch(), mj.GetMovedTimeMs()
	rec.CancelRequested = true
	tresp, err := m.cfg.Retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return m.cfg.Client.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", resp.Kvs[0].ModRevision)).
			Then(clientv3.OpPut(key, store.MustJSON(&rec)), clientv3.OpDelete(store.KeyFailoverHome(id))).Commit()
	})
	if err != nil {
		return false, err
	}
	if !tresp.Succeeded {
		return false, nil // the record changed meanwhile: marked on the next answer
	}
	// Only once the record says so: a claimed job is acknowledged (and its
	// claim dropped at the granter) by this note (askMoved).
	m.noteMoved(id, mj.GetActiveRegion(), mj.GetEpoch())
	m.cfg.Log.Warn("failover: job moved while this region was away; its attempts here are cancelled", "job", id,
		"active", mj.GetActiveRegion(), "epoch", mj.GetEpoch())
	return true, nil
}

type movedMark struct {
	to    string
	epoch int64
}

func (m *Manager) noteMoved(id, to string, epoch int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.moved == nil {
		m.moved = map[string]movedMark{}
	}
	m.moved[id] = movedMark{to, epoch}
}

// MovedTo is the region and epoch job id moved to, as this coordinator
// learned from its standbys ("" if not): a report read with an older job
// record is judged by it.
func (m *Manager) MovedTo(id string) (string, int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	mm := m.moved[id]
	return mm.to, mm.epoch
}
