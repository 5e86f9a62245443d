package regional

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/acl"
	"apiary.dev/apiary/internal/ids"
	"apiary.dev/apiary/internal/jobspec"
	"apiary.dev/apiary/internal/sovereignty"
	"apiary.dev/apiary/regional/failover"
	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/regional/taskstate"
	"apiary.dev/apiary/shards"
)

var idRE = ids.Idempotency

// submitItem is one accepted-for-commit submission waiting in the group
// commit queue.
type submitItem struct {
	job   store.JobRecord
	tasks []taskstate.Task
	done  chan submitResult
	// plain is the spec before its secret_env was sealed (job.Spec holds
	// the sealed values): a repeat's values are compared with it.
	plain *apiaryv1.JobSpec
	// pendingRev is the revision of the job's failover pending record
	// (0: none): the commit requires it unchanged and deletes it.
	pendingRev int64
	// unacked are the standbys whose record write failed.
	unacked []string
}

type submitResult struct {
	jobID        string
	deduplicated bool
	err          error
}

// submit validates a request, then commits the job and its PENDING tasks (and
// the dedup key) in one Txn, group-committed with concurrent submissions.
// Nothing is written for an invalid request.
func (c *Coordinator) submit(ctx context.Context, req *apiaryv1.SubmitJobRequest) (resp *apiaryv1.SubmitJobResponse, err error) {
	ctx, span := c.startAccept(ctx, req)
	var rec *store.JobRecord
	defer func() { c.endAccept(span, rec, resp, err) }()
	if req.GetSpec() == nil {
		return nil, status.Error(codes.InvalidArgument, "spec: is required")
	}
	spec, err := jobspec.Prepare(req.GetSpec())
	if err != nil {
		return nil, err
	}
	// Before the dedup lookup: a repeat must not tell a token about a job
	// of a namespace it may not submit to.
	if err := c.aclCheck(ctx, apiaryv1.JobService_SubmitJob_FullMethodName, spec.GetNamespace(), acl.CapSubmit); err != nil {
		return nil, err
	}
	secrets := jobspec.HasSecrets(spec)
	var keys sealKeys
	if secrets {
		if keys, err = c.submitKeys(); err != nil {
			return nil, err
		}
	}
	if req.GetRequestId() != "" || req.GetClientId() != "" {
		if !idRE.MatchString(req.GetClientId()) {
			return nil, status.Errorf(codes.InvalidArgument, "client_id: must match %s when request_id is set", idRE)
		}
		if !idRE.MatchString(req.GetRequestId()) {
			return nil, status.Errorf(codes.InvalidArgument, "request_id: must match %s when client_id is set", idRE)
		}
	}
	if req.GetRequestId() != "" {
		// A repeat is answered from its dedup key before any admission
		// check: the job it made, or where its home region forwarded it.
		prior, err := c.lookupRequest(ctx, req.GetClientId(), req.GetRequestId(), jobspec.PayloadHash(spec))
		if err == nil && prior != nil && secrets {
			err = c.checkRepeatSecrets(ctx, prior.GetJobId(), req.GetClientId(), req.GetRequestId(), spec)
		}
		if err != nil {
			return nil, err
		}
		if prior != nil {
			return prior, nil
		}
	}
	where, err := c.mayRun(spec)
	if err != nil {
		return nil, err
	}
	if err := c.admit(spec); err != nil {
		return nil, err
	}
	now := time.Now()
	id := ids.NewJobID(c.meta.Region, now)
	shard := shards.Of(id, c.meta.ShardCount)
	rec = &store.JobRecord{ID: id, Region: c.meta.Region, Shard: shard, Spec: spec, SubmitMs: now.UnixMilli(),
		ClientID: req.GetClientId(), RequestID: req.GetRequestId(), Traceparent: jobTraceparent(ctx, req),
		TaskCount: int32(jobspec.TaskCount(spec)), Where: where}
	if rec.RequestID != "" {
		rec.PayloadHash = jobspec.PayloadHash(spec)
	}
	var pendingRev int64
	var unacked []string
	if c.fo != nil {
		if rec.Failover = c.fo.Plan(spec); rec.Failover != nil && len(rec.Failover.Standbys) > 0 {
			// The standbys hold the spec before the job exists here: an
			// acknowledged failover job cannot be lost with this region.
			// The pending record, written first, makes sure their records
			// go if the job never commits (regional/failover/pending.go).
			if err := c.fo.Supersede(ctx, rec.ClientID, rec.RequestID); err != nil {
				return nil, status.Errorf(codes.Unavailable, "commit job: abandon an earlier attempt at this request: %v", err)
			}
			if pendingRev, err = c.fo.Begin(ctx, rec); err != nil {
				return nil, status.Errorf(codes.Unavailable, "commit job: record the pending failover submission: %v", err)
			}
			planned := rec.Failover.Standbys
			acked, err := c.fo.Replicate(ctx, rec)
			if err != nil {
				c.abandonStandby(rec, pendingRev, "", "no standby took the job's record")
				return nil, err
			}
			for _, s := range planned {
				if !slices.Contains(acked, s) {
					unacked = append(unacked, s)
				}
			}
			rec.Failover.Standbys = acked
		}
	}
	if secrets {
		// Sealed before the record exists anywhere but here: etcd, the
		// caches and every later reader see only sealed values.
		if rec.Spec, err = sealSpec(spec, id, keys.primary); err != nil {
			c.abandonStandby(rec, pendingRev, "", "secret_env could not be sealed")
			return nil, status.Errorf(codes.Internal, "secret_env: seal: %v", err)
		}
	}
	tasks := make([]taskstate.Task, 0, rec.TaskCount)
	for g, grp := range spec.GetTasks() {
		for i := int32(0); i < grp.GetCount(); i++ {
			tasks = append(tasks, taskstate.Task{JobID: id, Index: int32(len(tasks)), Group: int32(g), State: apiaryv1.TaskState_TASK_STATE_PENDING})
		}
	}
	it := &submitItem{job: *rec, tasks: tasks, done: make(chan submitResult, 1), plain: spec, pendingRev: pendingRev, unacked: unacked}
	if err := c.submits.submit(ctx, it); err != nil {
		c.abandonStandby(rec, pendingRev, "", "the submission was not queued for commit: "+err.Error())
		return nil, status.FromContextError(err).Err()
	}
	select {
	case r := <-it.done:
		if r.err != nil || r.jobID != id {
			// Not committed (or a repeat answered with its earlier job):
			// the standbys drop the record of this id.
			why := "a concurrent repeat of the same request committed first"
			if r.err != nil {
				why = "its commit failed: " + status.Convert(r.err).Message()
			}
			c.abandonStandby(rec, pendingRev, r.jobID, why)
		}
		if r.err != nil {
			return nil, r.err
		}
		if !r.deduplicated {
			c.admitted(r.jobID, spec)
		}
		return &apiaryv1.SubmitJobResponse{JobId: r.jobID, Region: c.meta.Region, Deduplicated: r.deduplicated,
			Warnings: append(c.submitWarnings(spec), c.failoverWarnings(spec, rec.Failover)...)}, nil
	case <-ctx.Done():
		// The outcome is unknown to the client; a retry with the same
		// request id finds the job through its dedup key.
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// mayRun is whether this region may run spec at all: its sovereignty
// decision (resolveWhere) and its region selector against the region's
// labels (FAILED_PRECONDITION naming the label). A submission and a standby
// record of another region's failover job (regional/failover) both pass it.
func (c *Coordinator) mayRun(spec *apiaryv1.JobSpec) (*store.WhereRecord, error) {
	where, err := c.resolveWhere(spec)
	if err != nil {
		return nil, err
	}
	for k, v := range spec.GetRegion().GetSelector() {
		if c.meta.Labels[k] != v {
			return nil, status.Errorf(codes.FailedPrecondition, "region.selector: region %s has %s=%q, job requires %q", c.meta.Region, k, c.meta.Labels[k], v)
		}
	}
	return where, nil
}

// resolveWhere applies the sovereignty policy at admission: the job's
// jurisdiction and data class must be values the policy knows
// (INVALID_ARGUMENT otherwise), and the policy must allow this region's
// jurisdiction (FAILED_PRECONDITION otherwise, so a router tries the next
// region). It returns the decision stored with the job, which the placement
// filter enforces on every node (sovereignty.Resolve is the one definition the
// router, this check and placement share).
func (c *Coordinator) resolveWhere(spec *apiaryv1.JobSpec) (*store.WhereRecord, error) {
	jur, class := spec.GetJurisdiction(), spec.GetDataClass()
	if c.cfg.Policy != nil {
		if err := c.cfg.Policy.CheckValues(jur, class); err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
	}
	d := sovereignty.Resolve(c.cfg.Policy, jur, class)
	if jur != "" && c.meta.Jurisdiction == "" && !d.Any {
		// A region that declares no jurisdiction cannot prove where its
		// nodes are: refuse rather than accept a job it can never place.
		return nil, status.Errorf(codes.FailedPrecondition, "jurisdiction: job requires one of [%s]; region %s declares no jurisdiction (start its coordinators with --jurisdiction)",
			strings.Join(d.Allowed, ", "), c.meta.Region)
	}
	if !d.Any && !d.Allows(c.meta.Jurisdiction) {
		return nil, status.Error(codes.FailedPrecondition, d.Refusal(jur, class, c.meta.Region, c.meta.Jurisdiction).Error())
	}
	return &store.WhereRecord{Rule: d.Rule, Any: d.Any, Jurisdictions: d.Jurisdictions()}, nil
}

func (it *submitItem) ops() []clientv3.Op {
	ops := make([]clientv3.Op, 0, len(it.tasks)+3)
	ops = append(ops, clientv3.OpPut(store.KeyJob(it.job.Shard, it.job.ID), store.MustJSON(it.job)))
	for i := range it.tasks {
		ops = append(ops, clientv3.OpPut(store.KeyTask(it.job.Shard, it.job.ID, it.tasks[i].Index), store.MustJSON(&it.tasks[i])))
	}
	if it.job.RequestID != "" {
		ops = append(ops, clientv3.OpPut(store.KeyDedup(it.job.ClientID, it.job.RequestID), store.MustJSON(store.DedupRecord{JobID: it.job.ID, Hash: it.job.PayloadHash})))
	}
	if f := it.job.Failover; f != nil && len(f.Standbys) > 0 {
		ops = append(ops, clientv3.OpPut(store.KeyFailoverHome(it.job.ID), store.MustJSON(store.HomeIndexRecord{Shard: it.job.Shard, Standbys: f.Standbys,
			TaskCount: it.job.TaskCount, Unacked: it.unacked})))
	}
	if it.pendingRev != 0 {
		ops = append(ops, failover.PendingDelete(it.job.ID))
	}
	return ops
}

func (it *submitItem) dedupKey() string {
	if it.job.RequestID == "" {
		return ""
	}
	return store.KeyDedup(it.job.ClientID, it.job.RequestID)
}

const maxOpsPerTxn = 16384

// maxSubmitBatchBytes bounds the estimated size of one group-commit Txn
// (etcd refuses requests over its MaxRequestBytes, 16 MiB here); a single
// submission is at most about 1 MiB of spec (jobspec limit) plus its tasks.
const maxSubmitBatchBytes = 4 << 20

// bytes estimates the encoded size of a submission's writes.
func (it *submitItem) bytes() int {
	return 2*proto.Size(it.job.Spec) + 256*len(it.tasks) + 512
}

// flushSubmits commits a batch in one Txn guarded by "no dedup key exists".
// If that guard fails (some request id was seen before) or a batch holds the
// same request id twice, it falls back to one Txn per submission.
func (c *Coordinator) flushSubmits(batch []*submitItem) {
	var together, alone []*submitItem
	seen := map[string]bool{}
	nops, size := 0, 0
	for _, it := range batch {
		k := it.dedupKey()
		n := len(it.tasks) + 3
		b := it.bytes()
		if (k != "" && seen[k]) || nops+n > maxOpsPerTxn || size+b > maxSubmitBatchBytes {
			alone = append(alone, it)
			continue
		}
		seen[k] = true
		nops += n
		size += b
		together = append(together, it)
	}
	if len(together) == 1 {
		alone = append(alone, together[0])
	} else if len(together) > 1 {
		var cmps []clientv3.Cmp
		var ops []clientv3.Op
		for _, it := range together {
			cmps = append(cmps, it.guards()...)
			ops = append(ops, it.ops()...)
		}
		resp, err := c.txnRetry(context.Background(), func(ctx context.Context) (*clientv3.TxnResponse, error) {
			return c.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
		})
		switch {
		case err != nil:
			for _, it := range together {
				it.done <- submitResult{err: status.Errorf(codes.Unavailable, "commit job: %v", err)}
			}
		case resp.Succeeded:
			for _, it := range together {
				it.done <- submitResult{jobID: it.job.ID}
			}
		default:
			alone = append(alone, together...)
		}
	}
	for _, it := range alone {
		it.done <- c.submitOne(it)
	}
}

func (c *Coordinator) submitOne(it *submitItem) submitResult {
	jk := store.KeyJob(it.job.Shard, it.job.ID)
	var elseOps []clientv3.Op
	if k := it.dedupKey(); k != "" {
		elseOps = append(elseOps, clientv3.OpGet(k))
	}
	if it.pendingRev != 0 {
		elseOps = append(elseOps, failover.PendingGet(it.job.ID))
	}
	elseOps = append(elseOps, clientv3.OpGet(jk, clientv3.WithKeysOnly()))
	resp, err := c.txnRetry(context.Background(), func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return c.cli.Txn(ctx).If(it.guards()...).Then(it.ops()...).Else(elseOps...).Commit()
	})
	if err != nil {
		return submitResult{err: status.Errorf(codes.Unavailable, "commit job: %v", err)}
	}
	if resp.Succeeded {
		return submitResult{jobID: it.job.ID}
	}
	// The job key exists: an earlier attempt of this very Txn committed.
	if kvs := resp.Responses[len(resp.Responses)-1].GetResponseRange().Kvs; len(kvs) > 0 {
		return submitResult{jobID: it.job.ID}
	}
	var kvs []*mvccpb.KeyValue
	if it.dedupKey() != "" {
		kvs = resp.Responses[0].GetResponseRange().Kvs
	}
	if it.pendingRev != 0 && len(kvs) == 0 {
		if pkv := resp.Responses[len(resp.Responses)-2].GetResponseRange().Kvs; len(pkv) == 0 || pkv[0].ModRevision != it.pendingRev {
			// Abandoned: by the failover leader (it took longer than the
			// pending grace) or by a later attempt at the same request;
			// its standby records are dropped.
			return submitResult{err: status.Error(codes.Unavailable, "commit job: this attempt was abandoned (it took too long, or a later attempt at the same request superseded it) and its standby records are dropped; retry with the same request id")}
		}
	}
	var d store.DedupRecord
	if len(kvs) == 0 || json.Unmarshal(kvs[0].Value, &d) != nil {
		return submitResult{err: status.Error(codes.Internal, "dedup record unreadable")}
	}
	ctx, cancel := context.WithTimeout(context.Background(), commitAttempts*commitAttemptTimeout)
	defer cancel()
	dd, err := c.standbyDedup(ctx, &d)
	if err != nil {
		return submitResult{err: err}
	}
	r := c.dedupAnswer(*dd, it.job.ClientID, it.job.RequestID, it.job.PayloadHash)
	if r.err == nil && r.jobID != "" && jobspec.HasSecrets(it.plain) {
		r.err = c.checkRepeatSecrets(ctx, r.jobID, it.job.ClientID, it.job.RequestID, it.plain)
	}
	return r
}

// guards are the compares that make a submission's Txn safe to repeat: the
// job key (a fresh id) and the dedup key must not exist yet.
func (it *submitItem) guards() []clientv3.Cmp {
	g := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(store.KeyJob(it.job.Shard, it.job.ID)), "=", 0)}
	if k := it.dedupKey(); k != "" {
		g = append(g, clientv3.Compare(clientv3.CreateRevision(k), "=", 0))
	}
	if it.pendingRev != 0 {
		// Not abandoned meanwhile (its standby records being dropped).
		g = append(g, failover.PendingGuard(it.job.ID, it.pendingRev))
	}
	return g
}
