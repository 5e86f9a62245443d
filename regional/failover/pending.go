package failover

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sort"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/regional/store"
)

// A failover submission writes its standby records before its job commits
// here. If the job then never commits (the commit failed, a concurrent
// repeat of the same request won, or the coordinator died in between), the
// standby records must go, or they would run as a second job at the home's
// next outage. The pending record (store.PendingRecord) makes that durable:
// written before the standby records, deleted by the job's commit (which
// requires it unchanged), and otherwise marked abandoned and kept until
// every standby has dropped its record (PushProgress with the job ended,
// which also leaves a tombstone there that refuses a late standby write).

var (
	// pendingGrace: how long a pending submission may stay uncommitted
	// before the region's failover leader abandons it (its coordinator
	// died between its standby writes and its commit).
	pendingGrace = 30 * time.Second
	// pendingEvery: how often the leader looks at pending submissions.
	pendingEvery = time.Second
)

// Begin records that the submission of rec (a failover job with standbys,
// not committed yet) is about to write standby records. It returns the
// pending record's revision: the job's commit requires it unchanged
// (PendingGuard) and deletes it (PendingDelete). Call it before Replicate.
func (m *Manager) Begin(ctx context.Context, rec *store.JobRecord) (int64, error) {
	p := store.PendingRecord{Shard: rec.Shard, Standbys: slices.Clone(rec.Failover.Standbys), CreatedMs: m.cfg.Now().UnixMilli(),
		ClientID: rec.ClientID, RequestID: rec.RequestID}
	resp, err := m.cfg.Retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return m.cfg.Client.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(store.KeyFailoverPending(rec.ID)), "=", 0)).
			Then(clientv3.OpPut(store.KeyFailoverPending(rec.ID), store.MustJSON(p))).Commit()
	})
	if err != nil {
		return 0, err
	}
	if !resp.Succeeded {
		return 0, errPendingExists
	}
	return resp.Header.Revision, nil
}

// Supersede abandons every pending submission of the same idempotency key
// (client, request) whose job has not committed, and tells their standbys
// at once, before a new attempt at that request writes standby records of
// its own: a coordinator that died between its standby writes and its
// commit, or a concurrent repeat, leaves no second job on standby (should
// the home be lost before the pending loop's grace, the standbys would
// otherwise hold two jobs of one request). An earlier attempt still in
// flight then fails its commit (its guard) and answers UNAVAILABLE; its
// client's retry finds this attempt's job. A request without a key is a
// no-op.
func (m *Manager) Supersede(ctx context.Context, clientID, requestID string) error {
	if requestID == "" {
		return nil
	}
	cctx, cancel := store.EtcdCtx(ctx)
	resp, err := m.cfg.Client.Get(cctx, store.PrefFailoverPending, clientv3.WithPrefix())
	cancel()
	if err != nil {
		return err
	}
	for _, kv := range resp.Kvs {
		var p store.PendingRecord
		if json.Unmarshal(kv.Value, &p) != nil || p.Abandoned || p.ClientID != clientID || p.RequestID != requestID {
			continue
		}
		id := string(kv.Key[len(store.PrefFailoverPending):])
		if _, err := m.Abandon(ctx, id, p.Shard, kv.ModRevision, "superseded by a later attempt at the same request"); err != nil {
			return err
		}
	}
	return nil
}

var errPendingExists = errors.New("failover: a pending record of this job id exists already")

// PendingGuard is the compare a pending submission's commit Txn carries:
// its pending record is still the one Begin wrote (not abandoned).
func PendingGuard(id string, rev int64) clientv3.Cmp {
	return clientv3.Compare(clientv3.ModRevision(store.KeyFailoverPending(id)), "=", rev)
}

// PendingDelete is the op a pending submission's commit Txn carries.
func PendingDelete(id string) clientv3.Op { return clientv3.OpDelete(store.KeyFailoverPending(id)) }

// PendingGet reads a submission's pending record inside a Txn (Abandoned
// reports whether its value says the submission was abandoned).
func PendingGet(id string) clientv3.Op { return clientv3.OpGet(store.KeyFailoverPending(id)) }

// Abandoned reports whether a pending record's value (nil: deleted) says
// the job will never commit.
func Abandoned(value []byte) bool {
	var p store.PendingRecord
	return value == nil || (json.Unmarshal(value, &p) == nil && p.Abandoned)
}

// Abandon marks the pending submission of job id (shard, revision rev from
// Begin) abandoned, unless its job committed meanwhile, and tells its
// standbys at once to drop their records; what they do not take now the
// leader's pending loop retries until they do. It reports whether the
// submission was abandoned (false: the job exists, so its records stay).
func (m *Manager) Abandon(ctx context.Context, id string, shard int, rev int64, reason string) (bool, error) {
	cctx, cancel := store.EtcdCtx(ctx)
	resp, err := m.cfg.Client.Get(cctx, store.KeyFailoverPending(id))
	cancel()
	if err != nil {
		return false, err
	}
	if len(resp.Kvs) == 0 {
		return false, nil // committed (the commit deletes it)
	}
	var p store.PendingRecord
	if err := json.Unmarshal(resp.Kvs[0].Value, &p); err != nil {
		return false, err
	}
	modRev := resp.Kvs[0].ModRevision
	if !p.Abandoned {
		if rev != 0 && modRev != rev {
			return false, nil
		}
		ok, newRev, err := m.markAbandoned(ctx, id, &p, modRev, reason)
		if err != nil || !ok {
			return false, err
		}
		modRev = newRev
	}
	m.deliverAbandoned(ctx, map[string]pendingKV{id: {rec: p, modRev: modRev}})
	return true, nil
}

type pendingKV struct {
	rec    store.PendingRecord
	modRev int64
}

// markAbandoned marks a pending record abandoned in a Txn that requires
// its job absent and the record unchanged; a record whose job exists is
// deleted (its commit should have). It returns whether it marked it, and
// the record's new revision.
func (m *Manager) markAbandoned(ctx context.Context, id string, p *store.PendingRecord, modRev int64, reason string) (bool, int64, error) {
	pk, jk := store.KeyFailoverPending(id), store.KeyJob(p.Shard, id)
	p.Abandoned, p.AbandonedMs, p.Reason = true, m.cfg.Now().UnixMilli(), reason
	resp, err := m.cfg.Retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return m.cfg.Client.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(jk), "=", 0), clientv3.Compare(clientv3.ModRevision(pk), "=", modRev)).
			Then(clientv3.OpPut(pk, store.MustJSON(p))).Else(clientv3.OpGet(jk, clientv3.WithKeysOnly())).Commit()
	})
	if err != nil {
		return false, 0, err
	}
	if resp.Succeeded {
		m.cfg.Log.Warn("failover: a submission whose standby records were written did not commit; the standbys drop them", "job", id, "reason", reason, "standbys", p.Standbys)
		return true, resp.Header.Revision, nil
	}
	if len(resp.Responses[0].GetResponseRange().Kvs) > 0 {
		_, err := m.cfg.Client.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(pk), "=", modRev)).Then(clientv3.OpDelete(pk)).Commit()
		return false, 0, err
	}
	return false, 0, nil
}

// pendingLoop, on the region's failover leader, abandons pending
// submissions older than pendingGrace and tells the standbys of abandoned
// ones to drop their records, until every one of them has.
func (m *Manager) pendingLoop(ctx context.Context) { m.leaderLoop(ctx, pendingEvery, m.sweepPending) }

func (m *Manager) sweepPending(ctx context.Context) {
	cctx, cancel := store.EtcdCtx(ctx)
	resp, err := m.cfg.Client.Get(cctx, store.PrefFailoverPending, clientv3.WithPrefix())
	cancel()
	if err != nil {
		return
	}
	nowMs := m.cfg.Now().UnixMilli()
	abandoned := map[string]pendingKV{}
	for _, kv := range resp.Kvs {
		id := string(kv.Key[len(store.PrefFailoverPending):])
		var p store.PendingRecord
		if json.Unmarshal(kv.Value, &p) != nil {
			continue
		}
		modRev := kv.ModRevision
		if !p.Abandoned {
			if nowMs-p.CreatedMs < pendingGrace.Milliseconds() {
				continue
			}
			ok, rev, err := m.markAbandoned(ctx, id, &p, modRev, "not committed within "+pendingGrace.String()+" of its standby writes (its coordinator stopped, or its commit failed)")
			if err != nil || !ok {
				continue
			}
			modRev = rev
		}
		abandoned[id] = pendingKV{rec: p, modRev: modRev}
	}
	if len(abandoned) > 0 {
		m.deliverAbandoned(ctx, abandoned)
	}
}

// deliverAbandoned tells each standby of the abandoned submissions, that
// is up, that their jobs ended (it drops its records and keeps a
// tombstone), and records which did: a pending record is deleted once
// every standby took it, else rewritten with the standbys left.
func (m *Manager) deliverAbandoned(ctx context.Context, recs map[string]pendingKV) {
	up := map[string]bool{}
	for _, r := range m.Regions() {
		up[r.Name] = r.Up
	}
	byRegion := map[string][]string{}
	for id, p := range recs {
		for _, s := range p.rec.Standbys {
			byRegion[s] = append(byRegion[s], id)
		}
	}
	took := map[string][]string{}
	for region, jobs := range byRegion {
		if !up[region] {
			continue
		}
		sort.Strings(jobs)
		for start := 0; start < len(jobs); start += maxBatch {
			chunk := jobs[start:min(start+maxBatch, len(jobs))]
			cctx, cancel := context.WithTimeout(ctx, putTimeout)
			err := m.call(cctx, region, func(ctx context.Context, c apiaryv1.FailoverServiceClient) error {
				_, err := c.PushProgress(ctx, &apiaryv1.PushProgressRequest{HomeRegion: m.cfg.Meta.Region, Ended: chunk})
				return err
			})
			cancel()
			if err != nil {
				m.cfg.Log.Debug("failover: tell a standby to drop abandoned submissions", "standby", region, "jobs", len(chunk), "err", err)
				break
			}
			for _, id := range chunk {
				took[id] = append(took[id], region)
			}
		}
	}
	for id, regions := range took {
		p := recs[id]
		left := slices.DeleteFunc(slices.Clone(p.rec.Standbys), func(s string) bool { return slices.Contains(regions, s) })
		pk := store.KeyFailoverPending(id)
		var op clientv3.Op
		if len(left) == 0 {
			op = clientv3.OpDelete(pk)
		} else {
			p.rec.Standbys = left
			op = clientv3.OpPut(pk, store.MustJSON(p.rec))
		}
		cctx, cancel := store.EtcdCtx(ctx)
		_, err := m.cfg.Client.Txn(cctx).If(clientv3.Compare(clientv3.ModRevision(pk), "=", p.modRev)).Then(op).Commit()
		cancel()
		if err != nil {
			m.cfg.Log.Debug("failover: update an abandoned submission's record", "job", id, "err", err)
		}
	}
}
