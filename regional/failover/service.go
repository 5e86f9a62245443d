package failover

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/ids"
	"apiary.dev/apiary/internal/jobspec"
	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/shards"
)

// maxOpsPerTxn bounds the ops of one progress Txn.
const maxOpsPerTxn = 1000

// maxAcks bounds MovedJobsRequest.acknowledged.
const maxAcks = 10000

// Server is the region's FailoverService (authz admits only other regions'
// coordinators, each acting for its own region).
type Server struct {
	apiaryv1.UnimplementedFailoverServiceServer
	m *Manager
}

// Server returns the manager's FailoverService.
func (m *Manager) Server() *Server { return &Server{m: m} }

// PutStandby stores another region's failover job here, not scheduled. It
// refuses (INVALID_ARGUMENT) a malformed job, and (FAILED_PRECONDITION) a
// job this region does not stand by for or may not run: not in its
// standbys, its region selector unmatched, or its data's jurisdiction not
// allowed here by this region's sovereignty policy. A repeat is a no-op;
// so is a job this region activated already.
func (s *Server) PutStandby(ctx context.Context, req *apiaryv1.PutStandbyRequest) (*apiaryv1.PutStandbyResponse, error) {
	m := s.m
	j := req.GetJob()
	me := m.cfg.Meta.Region
	switch {
	case !ids.IsJobID(j.GetJobId()):
		return nil, status.Errorf(codes.InvalidArgument, "job.job_id: %q is not a job id", j.GetJobId())
	case j.GetHomeEpoch() != 0:
		return nil, status.Errorf(codes.InvalidArgument, "job.home_epoch: must be 0 (a job that moved does not move again), got %d", j.GetHomeEpoch())
	case ids.RegionOf(j.GetJobId()) != j.GetHomeRegion():
		return nil, status.Errorf(codes.InvalidArgument, "job.job_id: %s is not a job of region %s", j.GetJobId(), j.GetHomeRegion())
	case j.GetHomeRegion() == "" || j.GetHomeRegion() == me:
		return nil, status.Errorf(codes.InvalidArgument, "job.home_region: must name another region than %s (got %q)", me, j.GetHomeRegion())
	case j.GetSpec() == nil:
		return nil, status.Error(codes.InvalidArgument, "job.spec: is required")
	case !slices.Contains(j.GetStandbys(), me):
		return nil, status.Errorf(codes.FailedPrecondition, "job.standbys: %v does not name region %s", j.GetStandbys(), me)
	case j.GetAfterMs() < jobspec.MinFailoverAfter.Milliseconds() || j.GetAfterMs() > jobspec.MaxFailoverAfter.Milliseconds():
		return nil, status.Errorf(codes.InvalidArgument, "job.after_ms: must be between 1s and 24h (got %dms)", j.GetAfterMs())
	}
	// The spec as this region would store a submission (defaults
	// applied, validated), and where it may run decided by this region's
	// own policy, never by what the caller sent.
	spec, err := jobspec.Prepare(j.GetSpec())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "job.spec: %v", status.Convert(err).Message())
	}
	if jobspec.HasSecrets(spec) {
		return nil, status.Error(codes.InvalidArgument, "job.spec: secret_env cannot fail over (sealed under the home region's keyring)")
	}
	if m.cfg.MayRun == nil {
		return nil, status.Error(codes.FailedPrecondition, "this region cannot judge where the job may run (no admission check configured)")
	}
	where, err := m.cfg.MayRun(spec)
	if err != nil {
		return nil, err
	}
	m.sawAlive(j.GetHomeRegion())
	rec := store.StandbyRecord{ID: j.GetJobId(), Home: j.GetHomeRegion(), Spec: spec, SubmitMs: j.GetSubmitTimeMs(),
		ClientID: j.GetClientId(), RequestID: j.GetRequestId(), Traceparent: j.GetTraceparent(), AfterMs: j.GetAfterMs(),
		Standbys: j.GetStandbys(), StoredMs: m.cfg.Now().UnixMilli(), Where: where}
	ops := []clientv3.Op{clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(store.KeyStandby(rec.ID)), "=", 0)},
		[]clientv3.Op{clientv3.OpPut(store.KeyStandby(rec.ID), store.MustJSON(rec))}, nil)}
	if rec.RequestID != "" && ids.Idempotency.MatchString(rec.ClientID) && ids.Idempotency.MatchString(rec.RequestID) {
		// A retry of the submission that reaches this region while the
		// home is down finds the job by its key (the home's dedup key is
		// the one of record; this one is deleted with the standby record).
		dk := store.KeyDedup(rec.ClientID, rec.RequestID)
		ops = append(ops, clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(dk), "=", 0)},
			[]clientv3.Op{clientv3.OpPut(dk, store.MustJSON(store.DedupRecord{JobID: rec.ID, Hash: jobspec.PayloadHash(rec.Spec), Standby: true}))}, nil))
	}
	presp, err := m.cfg.Retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return m.cfg.Client.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(store.KeyMoved(rec.ID)), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(store.KeyClaimed(rec.ID)), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(store.KeyEnded(rec.ID)), "=", 0)).Then(ops...).Commit()
	})
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "store standby record: %v", err)
	}
	if !presp.Succeeded {
		return nil, status.Errorf(codes.FailedPrecondition, "job %s was activated here, claimed by another standby, or ended at its home: region %s cannot stand by for it", rec.ID, me)
	}
	return &apiaryv1.PutStandbyResponse{Region: me}, nil
}

// PushProgress records completed tasks of standby jobs, and drops the
// standby records of jobs that ended in their home region. Entries for a
// job this region holds no standby record of are skipped and listed in
// unknown.
func (s *Server) PushProgress(ctx context.Context, req *apiaryv1.PushProgressRequest) (*apiaryv1.PushProgressResponse, error) {
	m := s.m
	m.sawAlive(req.GetHomeRegion())
	idsSeen := map[string]bool{}
	var jobIDs []string
	for _, d := range req.GetDone() {
		if !ids.IsJobID(d.GetJobId()) || d.GetTaskIndex() < 0 || d.GetTaskIndex() >= jobspec.MaxTasks || d.GetFencingToken() <= 0 || d.GetAttempt() <= 0 {
			return nil, status.Errorf(codes.InvalidArgument, "done: %q task %d attempt %d token %d is not a completed attempt of a job", d.GetJobId(), d.GetTaskIndex(), d.GetAttempt(), d.GetFencingToken())
		}
		if !idsSeen[d.GetJobId()] {
			idsSeen[d.GetJobId()] = true
			jobIDs = append(jobIDs, d.GetJobId())
		}
	}
	for _, id := range req.GetEnded() {
		if !ids.IsJobID(id) {
			return nil, status.Errorf(codes.InvalidArgument, "ended: %q is not a job id", id)
		}
		if !idsSeen[id] {
			idsSeen[id] = true
			jobIDs = append(jobIDs, id)
		}
	}
	held := map[string]*store.StandbyRecord{}
	for start := 0; start < len(jobIDs); start += maxOpsPerTxn {
		chunk := jobIDs[start:min(start+maxOpsPerTxn, len(jobIDs))]
		gets := make([]clientv3.Op, len(chunk))
		for i, id := range chunk {
			gets[i] = clientv3.OpGet(store.KeyStandby(id))
		}
		cctx, cancel := store.EtcdCtx(ctx)
		resp, err := m.cfg.Client.Txn(cctx).Then(gets...).Commit()
		cancel()
		if err != nil {
			return nil, status.Errorf(codes.Unavailable, "read standby records: %v", err)
		}
		for i, r := range resp.Responses {
			if kvs := r.GetResponseRange().Kvs; len(kvs) == 1 {
				var rec store.StandbyRecord
				if json.Unmarshal(kvs[0].Value, &rec) == nil && rec.Home == req.GetHomeRegion() {
					held[chunk[i]] = &rec
				}
			}
		}
	}
	out := &apiaryv1.PushProgressResponse{}
	var cmps []clientv3.Cmp
	var ops []clientv3.Op
	guarded := map[string]bool{}
	flush := func() error {
		if len(ops) == 0 {
			return nil
		}
		resp, err := m.cfg.Retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
			return m.cfg.Client.Txn(ctx).If(cmps...).Then(ops...).Commit()
		})
		cmps, ops, guarded = nil, nil, map[string]bool{}
		if err != nil {
			m.dropTombstoneLease() // it may be gone (revoked, expired): a new one next time
			return status.Errorf(codes.Unavailable, "record progress: %v", err)
		}
		if !resp.Succeeded {
			// A standby record went (activated or dropped) meanwhile: the
			// home sends the batch again and learns which.
			return status.Error(codes.Unavailable, "record progress: a standby record changed meanwhile; retry")
		}
		return nil
	}
	guard := func(id string) {
		if !guarded[id] {
			guarded[id] = true
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(store.KeyStandby(id)), ">", 0))
		}
	}
	unknown := map[string]bool{}
	for _, d := range req.GetDone() {
		if held[d.GetJobId()] == nil {
			if !unknown[d.GetJobId()] {
				unknown[d.GetJobId()] = true
				out.Unknown = append(out.Unknown, d.GetJobId())
			}
			continue
		}
		if n := int32(jobspec.TaskCount(held[d.GetJobId()].Spec)); d.GetTaskIndex() >= n {
			return nil, status.Errorf(codes.InvalidArgument, "done: job %s has %d tasks, no task %d", d.GetJobId(), n, d.GetTaskIndex())
		}
		guard(d.GetJobId())
		ops = append(ops, clientv3.OpPut(store.KeyStandbyDone(d.GetJobId(), d.GetTaskIndex()),
			store.MustJSON(store.TaskDoneRecord{Attempt: d.GetAttempt(), Token: d.GetFencingToken(), DoneMs: d.GetDoneTimeMs(),
				Node: d.GetNodeId(), StartMs: d.GetStartTimeMs()})))
		if len(ops) >= maxOpsPerTxn {
			if err := flush(); err != nil {
				return nil, err
			}
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	// Every ended job leaves a tombstone here, held or not: a standby that
	// missed the end (it was down, or its record came late) must not get
	// this region's grant to run a finished job (ClaimJob).
	var tomb clientv3.LeaseID
	if len(req.GetEnded()) > 0 {
		var err error
		if tomb, err = m.tombstoneLease(ctx); err != nil {
			return nil, status.Errorf(codes.Unavailable, "record progress: %v", err)
		}
	}
	for _, id := range req.GetEnded() {
		ops = append(ops, clientv3.OpPut(store.KeyEnded(id), req.GetHomeRegion(), clientv3.WithLease(tomb)))
		if rec := held[id]; rec != nil {
			guard(id)
			ops = append(ops, m.dropOps(rec)...)
		}
		if len(ops) >= maxOpsPerTxn {
			if err := flush(); err != nil {
				return nil, err
			}
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return out, nil
}

// EndedTTL is how long a standby region keeps the tombstone of a job that
// ended at its home (store.KeyEnded), at least; tombstones share one lease
// per tombstoneShare, so each lives up to that much longer.
var EndedTTL = 7 * 24 * time.Hour

const tombstoneShare = time.Hour

// tombstoneLease is the lease the tombstones written now go under: one per
// tombstoneShare (granted for EndedTTL + tombstoneShare), not one per call,
// which would leave etcd millions of leases a week.
func (m *Manager) tombstoneLease(ctx context.Context) (clientv3.LeaseID, error) {
	now := m.cfg.Now()
	m.mu.Lock()
	id, at := m.tomb, m.tombAt
	m.mu.Unlock()
	if id != clientv3.NoLease && now.Sub(at) < tombstoneShare {
		return id, nil
	}
	lctx, cancel := store.EtcdCtx(ctx)
	defer cancel()
	l, err := m.cfg.Client.Grant(lctx, int64((EndedTTL + tombstoneShare).Seconds()))
	if err != nil {
		return clientv3.NoLease, err
	}
	m.mu.Lock()
	m.tomb, m.tombAt = l.ID, now
	m.mu.Unlock()
	return l.ID, nil
}

func (m *Manager) dropTombstoneLease() {
	m.mu.Lock()
	m.tomb = clientv3.NoLease
	m.mu.Unlock()
}

// dropOps delete a standby record, its progress and its dedup key.
func (m *Manager) dropOps(rec *store.StandbyRecord) []clientv3.Op {
	ops := []clientv3.Op{clientv3.OpDelete(store.KeyStandby(rec.ID)), clientv3.OpDelete(store.PrefStandbyTasks(rec.ID), clientv3.WithPrefix())}
	if rec.RequestID != "" {
		dk := store.KeyDedup(rec.ClientID, rec.RequestID)
		val := store.MustJSON(store.DedupRecord{JobID: rec.ID, Hash: jobspec.PayloadHash(rec.Spec), Standby: true})
		ops = append(ops, clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.Value(dk), "=", val)}, []clientv3.Op{clientv3.OpDelete(dk)}, nil))
	}
	return ops
}

// MovedJobs lists the jobs of home_region that this region activated.
func (s *Server) MovedJobs(ctx context.Context, req *apiaryv1.MovedJobsRequest) (*apiaryv1.MovedJobsResponse, error) {
	m := s.m
	home := req.GetHomeRegion()
	if home == "" || home == m.cfg.Meta.Region {
		return nil, status.Errorf(codes.InvalidArgument, "home_region: must name another region than %s (got %q)", m.cfg.Meta.Region, home)
	}
	acked := req.GetAcknowledged()
	if len(acked) > maxAcks {
		return nil, status.Errorf(codes.InvalidArgument, "acknowledged: at most %d job ids per call (got %d)", maxAcks, len(acked))
	}
	for i, id := range acked {
		if !ids.IsJobID(id) || ids.RegionOf(id) != home {
			return nil, status.Errorf(codes.InvalidArgument, "acknowledged[%d]: %q is not a job id of region %s", i, id, home)
		}
	}
	// The caller marked these MOVED in its own etcd: their records here
	// are no longer needed (a claim barred a region whose standby record
	// is long dropped; the activated job keeps its own key).
	for start := 0; start < len(acked); start += maxOpsPerTxn / 2 {
		var ops []clientv3.Op
		for _, id := range acked[start:min(start+maxOpsPerTxn/2, len(acked))] {
			ops = append(ops, clientv3.OpDelete(store.KeyMoved(id)), clientv3.OpDelete(store.KeyClaimed(id)))
		}
		cctx, cancel := store.EtcdCtx(ctx)
		_, err := m.cfg.Client.Txn(cctx).Then(ops...).Commit()
		cancel()
		if err != nil {
			return nil, status.Errorf(codes.Unavailable, "delete acknowledged moved records: %v", err)
		}
	}
	moved, claimed, err := m.movedHere(ctx)
	if err != nil {
		return nil, err
	}
	downFor, err := m.witnessDownFor(ctx, home)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "read observations: %v", err)
	}
	out := &apiaryv1.MovedJobsResponse{HomeDownForMs: downFor.Milliseconds()}
	for id, r := range moved {
		if r.Home == home {
			out.Moved = append(out.Moved, &apiaryv1.MovedJob{JobId: id, ActiveRegion: m.cfg.Meta.Region, Epoch: r.Epoch, MovedTimeMs: r.MovedMs})
		}
	}
	for id, c := range claimed {
		if _, ok := moved[id]; !ok && ids.RegionOf(id) == home {
			out.Claimed = append(out.Claimed, &apiaryv1.ClaimedJob{JobId: id, ClaimedBy: c.By})
		}
	}
	slices.SortFunc(out.Moved, func(a, b *apiaryv1.MovedJob) int { return strings.Compare(a.JobId, b.JobId) })
	slices.SortFunc(out.Claimed, func(a, b *apiaryv1.ClaimedJob) int { return strings.Compare(a.JobId, b.JobId) })
	return out, nil
}

// movedHere reads the region's moved records and the claims it granted, by
// job id.
func (m *Manager) movedHere(ctx context.Context) (map[string]store.MovedRecord, map[string]store.ClaimRecord, error) {
	cctx, cancel := store.EtcdCtx(ctx)
	defer cancel()
	resp, err := m.cfg.Client.Txn(cctx).Then(clientv3.OpGet(store.PrefMoved, clientv3.WithPrefix()),
		clientv3.OpGet(store.PrefClaimed, clientv3.WithPrefix())).Commit()
	if err != nil {
		return nil, nil, status.Errorf(codes.Unavailable, "read moved jobs: %v", err)
	}
	moved := map[string]store.MovedRecord{}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		var r store.MovedRecord
		if json.Unmarshal(kv.Value, &r) == nil {
			moved[string(kv.Key[len(store.PrefMoved):])] = r
		}
	}
	claimed := map[string]store.ClaimRecord{}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		var c store.ClaimRecord
		if json.Unmarshal(kv.Value, &c) == nil {
			claimed[string(kv.Key[len(store.PrefClaimed):])] = c
		}
	}
	return moved, claimed, nil
}

// ClaimJob gives a standby job up to another standby: granted unless this
// region activated the job already (then active_region is this region) or
// granted it to another, and only once a majority of this region's
// coordinators have seen the job's home down for the job's after (ABORTED
// before: this region witnesses the home alive).
// Once granted, this region never activates the job (its activation Txn
// requires that no claim exists), and its standby record is dropped in the
// same Txn.
func (s *Server) ClaimJob(ctx context.Context, req *apiaryv1.ClaimJobRequest) (*apiaryv1.ClaimJobResponse, error) {
	m := s.m
	id, by := req.GetJobId(), req.GetStandbyRegion()
	if !ids.IsJobID(id) {
		return nil, status.Errorf(codes.InvalidArgument, "job_id: %q is not a job id", id)
	}
	if by == "" || by == m.cfg.Meta.Region {
		return nil, status.Errorf(codes.InvalidArgument, "standby_region: must be another region than %s", m.cfg.Meta.Region)
	}
	ck, sk := store.KeyClaimed(id), store.KeyStandby(id)
	cctx, cancel := store.EtcdCtx(ctx)
	cur, err := m.cfg.Client.Txn(cctx).Then(clientv3.OpGet(sk), clientv3.OpGet(store.KeyMoved(id)), clientv3.OpGet(ck),
		clientv3.OpGet(store.KeyEnded(id), clientv3.WithKeysOnly())).Commit()
	cancel()
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "claim: %v", err)
	}
	if mv := cur.Responses[1].GetResponseRange().Kvs; len(mv) == 1 {
		return &apiaryv1.ClaimJobResponse{Granted: false, ActiveRegion: m.cfg.Meta.Region}, nil
	}
	if len(cur.Responses[3].GetResponseRange().Kvs) == 1 {
		// Its home said it ended: the claimer's record is a leftover (it
		// missed the end), which it drops on this answer.
		return &apiaryv1.ClaimJobResponse{Granted: false, ActiveRegion: "none: the job ended at its home region"}, nil
	}
	home := ids.RegionOf(id)
	downFor, err := m.witnessDownFor(ctx, home)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "claim: read observations: %v", err)
	}
	afterMs := req.GetAfterMs()
	if ckv := cur.Responses[2].GetResponseRange().Kvs; len(ckv) == 1 {
		// Claimed before: by the same region (a retry after a failed
		// activation), granted again, by the witness rule as the first
		// time (a claim left behind, which its home is releasing, must not
		// let the claimer activate while this region sees the home up);
		// by another, not this caller's.
		var c store.ClaimRecord
		if json.Unmarshal(ckv[0].Value, &c) != nil || c.By != by {
			return &apiaryv1.ClaimJobResponse{Granted: false, ActiveRegion: fmt.Sprintf("claimed by %s", c.By)}, nil
		}
		if afterMs < jobspec.MinFailoverAfter.Milliseconds() || afterMs > jobspec.MaxFailoverAfter.Milliseconds() {
			return nil, status.Errorf(codes.InvalidArgument, "after_ms: must be between 1s and 24h (got %dms)", afterMs)
		}
		if after := time.Duration(afterMs) * time.Millisecond; downFor < after {
			return nil, status.Errorf(codes.Aborted, "claim: a majority of region %s's coordinators have seen home region %s down for %v, not yet the job's after (%v); ask again",
				m.cfg.Meta.Region, home, downFor.Round(time.Millisecond), after)
		}
		return &apiaryv1.ClaimJobResponse{Granted: true}, nil
	}
	grant := []clientv3.Op{clientv3.OpPut(ck, store.MustJSON(store.ClaimRecord{By: by, AtMs: m.cfg.Now().UnixMilli()}))}
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(store.KeyMoved(id)), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(ck), "=", 0)}
	if skv := cur.Responses[0].GetResponseRange().Kvs; len(skv) == 1 {
		var rec store.StandbyRecord
		if json.Unmarshal(skv[0].Value, &rec) != nil {
			return nil, status.Errorf(codes.Internal, "standby record of job %s does not decode", id)
		}
		mine, theirs := slices.Index(rec.Standbys, m.cfg.Meta.Region), slices.Index(rec.Standbys, by)
		if theirs < 0 {
			return nil, status.Errorf(codes.PermissionDenied, "standby_region: %s is not a standby of job %s (its standbys: %v)", by, id, rec.Standbys)
		}
		if mine >= 0 && mine < theirs && downFor >= time.Duration(rec.AfterMs)*time.Millisecond {
			// This region comes first in the job's order and is due to
			// take it over itself: two standbys granting each other's
			// claims at once would leave the job to neither.
			return nil, status.Errorf(codes.Aborted, "claim: region %s, an earlier standby of job %s, is taking it over; ask again", m.cfg.Meta.Region, id)
		}
		afterMs = rec.AfterMs
		grant = append(grant, m.dropOps(&rec)...)
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(sk), "=", skv[0].ModRevision))
	} else {
		// No record here (this region never took the job, or its write
		// failed): the grant bars a late PutStandby from activating it.
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(sk), "=", 0))
	}
	// The witness rule: this region grants only once a majority of its
	// coordinators have seen the job's home down for after, so a home that
	// this region sees alive (and may hold a lease on the job from it,
	// Hold) never has the job activated elsewhere.
	if afterMs < jobspec.MinFailoverAfter.Milliseconds() || afterMs > jobspec.MaxFailoverAfter.Milliseconds() {
		return nil, status.Errorf(codes.InvalidArgument, "after_ms: must be between 1s and 24h (got %dms)", afterMs)
	}
	if after := time.Duration(afterMs) * time.Millisecond; downFor < after {
		return nil, status.Errorf(codes.Aborted, "claim: a majority of region %s's coordinators have seen home region %s down for %v, not yet the job's after (%v); ask again",
			m.cfg.Meta.Region, home, downFor.Round(time.Millisecond), after)
	}
	resp, err := m.cfg.Retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return m.cfg.Client.Txn(ctx).If(cmps...).Then(grant...).Commit()
	})
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "claim: %v", err)
	}
	if !resp.Succeeded {
		return nil, status.Error(codes.Aborted, "claim: the job changed here meanwhile; ask again")
	}
	return &apiaryv1.ClaimJobResponse{Granted: true}, nil
}

// ReleaseJob gives up a job this region claimed from the other standbys
// but did not activate, at its home region's request: the home is back and
// the claim left behind holds the job there (the claimer died before
// activating, or never heard the grant). The standby record is written
// again, with a new stored time, in a Txn that requires the job not
// activated here (no moved key, no job key): an activation in flight fails,
// and the job is due again only after a new outage of its after, for
// which the other standbys grant again only by the witness rule. The home
// then has the claim dropped (DropClaim).
// ABORTED while a majority of this region's coordinators see the home down
// (it may be activating the job: the home asks again once they see it up).
func (s *Server) ReleaseJob(ctx context.Context, req *apiaryv1.ReleaseJobRequest) (*apiaryv1.ReleaseJobResponse, error) {
	m := s.m
	home, id := req.GetHomeRegion(), req.GetJobId()
	if home == "" || home == m.cfg.Meta.Region {
		return nil, status.Errorf(codes.InvalidArgument, "home_region: must name another region than %s (got %q)", m.cfg.Meta.Region, home)
	}
	if !ids.IsJobID(id) || ids.RegionOf(id) != home {
		return nil, status.Errorf(codes.InvalidArgument, "job_id: %q is not a job id of region %s", id, home)
	}
	downFor, err := m.witnessDownFor(ctx, home)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "release: read observations: %v", err)
	}
	if downFor > 0 {
		return nil, status.Errorf(codes.Aborted, "release: a majority of region %s's coordinators have seen region %s down for %v, and may be activating job %s; ask again once they see it up",
			m.cfg.Meta.Region, home, downFor.Round(time.Millisecond), id)
	}
	sk, mk, jk := store.KeyStandby(id), store.KeyMoved(id), store.KeyJob(shards.Of(id, m.cfg.Meta.ShardCount), id)
	cctx, cancel := store.EtcdCtx(ctx)
	cur, err := m.cfg.Client.Txn(cctx).Then(clientv3.OpGet(sk), clientv3.OpGet(mk), clientv3.OpGet(jk)).Commit()
	cancel()
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "release: %v", err)
	}
	if mv := cur.Responses[1].GetResponseRange().Kvs; len(mv) == 1 {
		var r store.MovedRecord
		if json.Unmarshal(mv[0].Value, &r) != nil {
			return nil, status.Errorf(codes.Internal, "moved record of job %s does not decode", id)
		}
		return &apiaryv1.ReleaseJobResponse{Moved: &apiaryv1.MovedJob{JobId: id, ActiveRegion: m.cfg.Meta.Region, Epoch: r.Epoch, MovedTimeMs: r.MovedMs}}, nil
	}
	if jv := cur.Responses[2].GetResponseRange().Kvs; len(jv) == 1 {
		// Activated here, and its moved record acknowledged and deleted.
		var j store.JobRecord
		if json.Unmarshal(jv[0].Value, &j) != nil || j.Failover == nil {
			return nil, status.Errorf(codes.Internal, "job %s exists here but its record has no failover state", id)
		}
		return &apiaryv1.ReleaseJobResponse{Moved: &apiaryv1.MovedJob{JobId: id, ActiveRegion: m.cfg.Meta.Region, Epoch: j.Failover.Epoch, MovedTimeMs: j.Failover.MovedMs}}, nil
	}
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(mk), "=", 0), clientv3.Compare(clientv3.CreateRevision(jk), "=", 0)}
	var ops []clientv3.Op
	if skv := cur.Responses[0].GetResponseRange().Kvs; len(skv) == 1 {
		var rec store.StandbyRecord
		if json.Unmarshal(skv[0].Value, &rec) != nil {
			return nil, status.Errorf(codes.Internal, "standby record of job %s does not decode", id)
		}
		// Written again, not dropped: its new revision fails an activation
		// in flight (activate compares it), and its new stored time makes
		// the job due only after a new outage of after; the record, with
		// its progress, still protects the job should the home die now.
		rec.StoredMs = m.cfg.Now().UnixMilli()
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(sk), "=", skv[0].ModRevision))
		ops = []clientv3.Op{clientv3.OpPut(sk, store.MustJSON(rec))}
	} else {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(sk), "=", 0))
	}
	resp, err := m.cfg.Retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return m.cfg.Client.Txn(ctx).If(cmps...).Then(ops...).Commit()
	})
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "release: %v", err)
	}
	if !resp.Succeeded {
		return nil, status.Errorf(codes.Aborted, "release: job %s changed here meanwhile; ask again", id)
	}
	m.sawAlive(home)
	m.cfg.Log.Info("failover: released a claimed job to its home region, which is back", "job", id, "home", home, "record_kept", len(ops) > 0)
	return &apiaryv1.ReleaseJobResponse{Released: true}, nil
}

// DropClaim deletes the claim on a job that this region granted to
// claimed_by, at the job's home region's request once claimed_by released
// it (ReleaseJob). The home then writes this region's standby record of
// the job again. FAILED_PRECONDITION when the job was claimed here by
// another region.
func (s *Server) DropClaim(ctx context.Context, req *apiaryv1.DropClaimRequest) (*apiaryv1.DropClaimResponse, error) {
	m := s.m
	home, id, by := req.GetHomeRegion(), req.GetJobId(), req.GetClaimedBy()
	if home == "" || home == m.cfg.Meta.Region {
		return nil, status.Errorf(codes.InvalidArgument, "home_region: must name another region than %s (got %q)", m.cfg.Meta.Region, home)
	}
	if !ids.IsJobID(id) || ids.RegionOf(id) != home {
		return nil, status.Errorf(codes.InvalidArgument, "job_id: %q is not a job id of region %s", id, home)
	}
	if by == "" || by == home {
		return nil, status.Errorf(codes.InvalidArgument, "claimed_by: must name the standby region the claim was granted to (got %q)", by)
	}
	ck := store.KeyClaimed(id)
	cctx, cancel := store.EtcdCtx(ctx)
	cur, err := m.cfg.Client.Get(cctx, ck)
	cancel()
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "drop claim: %v", err)
	}
	if len(cur.Kvs) == 0 {
		return &apiaryv1.DropClaimResponse{Dropped: true}, nil
	}
	var c store.ClaimRecord
	if json.Unmarshal(cur.Kvs[0].Value, &c) != nil {
		return nil, status.Errorf(codes.Internal, "claim record of job %s does not decode", id)
	}
	if c.By != by {
		return nil, status.Errorf(codes.FailedPrecondition, "claimed_by: job %s was claimed here by %s, not %s", id, c.By, by)
	}
	resp, err := m.cfg.Retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return m.cfg.Client.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(ck), "=", cur.Kvs[0].ModRevision)).Then(clientv3.OpDelete(ck)).Commit()
	})
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "drop claim: %v", err)
	}
	if !resp.Succeeded {
		return nil, status.Errorf(codes.Aborted, "drop claim: the claim on job %s changed meanwhile; ask again", id)
	}
	m.sawAlive(home)
	return &apiaryv1.DropClaimResponse{Dropped: true}, nil
}
