package failover

import (
	"context"
	"encoding/json"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/regional/store"
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
