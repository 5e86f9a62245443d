package regional

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/federation"
	"apiary.dev/apiary/internal/ids"
	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/shards"
)

// Idempotency across regions (docs/architecture.md, "Idempotency across
// regions"): the router sends an idempotent request (client id, request id)
// to its home region first. The home region's dedup key is the request's one
// source of truth: it names the job the home region made for it, or the
// region the request was forwarded to when the home region could not take it
// (a forward record, written once by ForwardRequest). A submission that finds
// a forward record is refused with FAILED_PRECONDITION and an ErrorInfo
// whose Reason is ids.ReasonRequestForwarded and whose metadata "region"
// names the region to send it to.

// forwardTTL bounds how long a forward record is kept: the job retention
// (the dedup window of a job the home region holds itself) plus an hour; no
// expiry when jobs are kept forever.
func (c *Coordinator) forwardTTL() time.Duration {
	if c.cfg.JobRetention <= 0 {
		return 0
	}
	return c.cfg.JobRetention + time.Hour
}

// readDedup reads the dedup record of (clientID, requestID); nil, nil when
// there is none. Errors are gRPC statuses (UNAVAILABLE, INTERNAL).
func (c *Coordinator) readDedup(ctx context.Context, clientID, requestID string) (*store.DedupRecord, error) {
	gctx, cancel := context.WithTimeout(ctx, commitAttemptTimeout)
	defer cancel()
	resp, err := c.cli.Get(gctx, store.KeyDedup(clientID, requestID))
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "read dedup key: %v", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	var d store.DedupRecord
	if err := json.Unmarshal(resp.Kvs[0].Value, &d); err != nil {
		return nil, status.Error(codes.Internal, "dedup record unreadable")
	}
	return c.standbyDedup(ctx, &d)
}

// standbyDedup turns the dedup record of a job held here only on standby
// (written by its standby record, before the job committed at its home)
// into a forward to the job's home region: only the home knows whether the
// job exists (it may never have committed), so the repeat goes there. Once
// the job is activated here, the record answers as any other.
func (c *Coordinator) standbyDedup(ctx context.Context, d *store.DedupRecord) (*store.DedupRecord, error) {
	if !d.Standby || d.JobID == "" {
		return d, nil
	}
	gctx, cancel := context.WithTimeout(ctx, commitAttemptTimeout)
	defer cancel()
	resp, err := c.cli.Get(gctx, store.KeyJob(shards.Of(d.JobID, c.meta.ShardCount), d.JobID), clientv3.WithKeysOnly())
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "read job of a dedup key: %v", err)
	}
	if len(resp.Kvs) > 0 {
		return d, nil
	}
	return &store.DedupRecord{Hash: d.Hash, Forward: ids.RegionOf(d.JobID), Standby: true}, nil
}

// lookupRequest reads the dedup key of an idempotent submission before any
// admission check, so a repeat is answered with its job (or its forward)
// even when the backlog bound or the region's nodes would refuse a new job.
// It returns nil, nil when the request is new here.
func (c *Coordinator) lookupRequest(ctx context.Context, clientID, requestID, hash string) (*apiaryv1.SubmitJobResponse, error) {
	d, err := c.readDedup(ctx, clientID, requestID)
	if err != nil || d == nil {
		return nil, err
	}
	r := c.dedupAnswer(*d, clientID, requestID, hash)
	if r.err != nil {
		return nil, r.err
	}
	return &apiaryv1.SubmitJobResponse{JobId: r.jobID, Region: c.meta.Region, Deduplicated: true}, nil
}

// dedupAnswer turns an existing dedup record into the answer to a repeat:
// the same job, ALREADY_EXISTS for another payload, or the forward.
func (c *Coordinator) dedupAnswer(d store.DedupRecord, clientID, requestID, hash string) submitResult {
	if d.Hash != hash {
		what := "job " + d.JobID
		if d.JobID == "" {
			what = "a job forwarded to region " + d.Forward
		} else if c.cfg.ACL {
			// That job may be of a namespace the caller may not read.
			what = "another job"
		}
		return submitResult{err: status.Errorf(codes.AlreadyExists,
			"request_id: %q of client %q was already used for %s with a different payload", requestID, clientID, what)}
	}
	if d.JobID == "" && d.Forward != "" && d.Standby {
		return submitResult{err: requestError(d.Forward,
			fmt.Sprintf("request_id: %q belongs to a job of region %s that region %s holds only on standby; submit it there", requestID, d.Forward, c.meta.Region))}
	}
	if d.JobID == "" && d.Forward != "" {
		return submitResult{err: forwardedError(c.meta.Region, requestID, d.Forward)}
	}
	return submitResult{jobID: d.JobID, deduplicated: true}
}

// forwardedError is the refusal that sends a router on to the region that
// holds the request.
func forwardedError(home, requestID, to string) error {
	return requestError(to, fmt.Sprintf("request_id: %q was forwarded by its home region %s to region %s; submit it there", requestID, home, to))
}

// requestError is FAILED_PRECONDITION with msg, marked (ids.ReasonRequestForwarded)
// so that a router submits the request to region to.
func requestError(to, msg string) error {
	st := status.New(codes.FailedPrecondition, msg)
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: ids.ReasonRequestForwarded, Domain: ids.ErrorDomain,
		Metadata: map[string]string{"region": to}}); err == nil {
		return d.Err()
	}
	return st.Err()
}

// forwardRequest records, once, that an idempotent request whose home is
// this region lives in req.region. Validation happens before any write;
// the write is one Txn guarded by "no dedup key yet", so of two routers
// racing, one record wins and both are told which.
func (c *Coordinator) forwardRequest(ctx context.Context, req *apiaryv1.ForwardRequestRequest) (*apiaryv1.ForwardRequestResponse, error) {
	switch {
	case !idRE.MatchString(req.GetClientId()):
		return nil, status.Errorf(codes.InvalidArgument, "client_id: must match %s", idRE)
	case !idRE.MatchString(req.GetRequestId()):
		return nil, status.Errorf(codes.InvalidArgument, "request_id: must match %s", idRE)
	case !payloadHashRE.MatchString(req.GetPayloadHash()):
		return nil, status.Error(codes.InvalidArgument, "payload_hash: must be the 64 lower-case hex digits of jobspec.PayloadHash")
	case !ids.Region.MatchString(req.GetRegion()):
		return nil, status.Errorf(codes.InvalidArgument, "region: must be a region name matching %s", ids.Region)
	case req.GetRegion() == c.meta.Region:
		return nil, status.Errorf(codes.InvalidArgument, "region: a request cannot be forwarded to its home region %s itself", c.meta.Region)
	}
	if known := c.wanRegions(); !slices.Contains(known, req.GetRegion()) {
		// A forward is written once and kept for the dedup window: never
		// to a region this coordinator's WAN pool does not know.
		return nil, status.Errorf(codes.InvalidArgument, "region: %q is not a region of this coordinator's WAN pool (known: %s)",
			req.GetRegion(), strings.Join(known, ", "))
	}
	k := store.KeyDedup(req.GetClientId(), req.GetRequestId())
	rec := store.DedupRecord{Hash: req.GetPayloadHash(), Forward: req.GetRegion(), AtMs: time.Now().UnixMilli()}
	var opts []clientv3.OpOption
	if ttl := c.forwardTTL(); ttl > 0 {
		lctx, cancel := context.WithTimeout(ctx, commitAttemptTimeout)
		lease, err := c.cli.Grant(lctx, int64(ttl/time.Second))
		cancel()
		if err != nil {
			return nil, status.Errorf(codes.Unavailable, "grant forward lease: %v", err)
		}
		opts = append(opts, clientv3.WithLease(lease.ID))
	}
	resp, err := c.txnRetry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return c.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
			Then(clientv3.OpPut(k, store.MustJSON(rec), opts...)).Else(clientv3.OpGet(k)).Commit()
	})
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "write forward record: %v", err)
	}
	if resp.Succeeded {
		c.log.Info("idempotent request forwarded", "client_id", req.GetClientId(), "request_id", req.GetRequestId(), "to", req.GetRegion())
		return &apiaryv1.ForwardRequestResponse{Region: req.GetRegion()}, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	var d store.DedupRecord
	if len(kvs) == 0 || json.Unmarshal(kvs[0].Value, &d) != nil {
		return nil, status.Error(codes.Internal, "dedup record unreadable")
	}
	if d.Hash != req.GetPayloadHash() {
		return nil, status.Errorf(codes.AlreadyExists, "request_id: %q of client %q was already used with a different payload", req.GetRequestId(), req.GetClientId())
	}
	if d.JobID != "" {
		return &apiaryv1.ForwardRequestResponse{JobId: d.JobID}, nil
	}
	return &apiaryv1.ForwardRequestResponse{Region: d.Forward}, nil
}

// payloadHashRE is the shape of jobspec.PayloadHash (hex SHA-256).
var payloadHashRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// wanRegions lists the regions this coordinator's WAN member knows (alive,
// failed or left), sorted; empty outside a pool.
func (c *Coordinator) wanRegions() []string {
	c.wan.mu.Lock()
	sf := c.wan.serf
	c.wan.mu.Unlock()
	if sf == nil {
		return nil
	}
	var out []string
	for _, reg := range federation.BuildRegions(sf.Members(), func(string) bool { return false }) {
		out = append(out, reg.Name)
	}
	return out
}

// lookupOnly answers the router's LookupRequest: the dedup record of a
// request, read-only.
func (c *Coordinator) lookupOnly(ctx context.Context, req *apiaryv1.LookupRequestRequest) (*apiaryv1.LookupRequestResponse, error) {
	if !idRE.MatchString(req.GetClientId()) {
		return nil, status.Errorf(codes.InvalidArgument, "client_id: must match %s", idRE)
	}
	if !idRE.MatchString(req.GetRequestId()) {
		return nil, status.Errorf(codes.InvalidArgument, "request_id: must match %s", idRE)
	}
	d, err := c.readDedup(ctx, req.GetClientId(), req.GetRequestId())
	if err != nil {
		return nil, err
	}
	if d == nil {
		return &apiaryv1.LookupRequestResponse{}, nil
	}
	return &apiaryv1.LookupRequestResponse{Found: true, JobId: d.JobID, ForwardedTo: d.Forward, PayloadHash: d.Hash}, nil
}

// LookupRequest serves the router's lookup (see lookupOnly).
func (s *jobServer) LookupRequest(ctx context.Context, req *apiaryv1.LookupRequestRequest) (*apiaryv1.LookupRequestResponse, error) {
	return s.c.lookupOnly(ctx, req)
}

// ForwardRequest serves the router's forward (see forwardRequest).
func (s *jobServer) ForwardRequest(ctx context.Context, req *apiaryv1.ForwardRequestRequest) (*apiaryv1.ForwardRequestResponse, error) {
	resp, err := s.c.forwardRequest(ctx, req)
	if err != nil {
		return nil, err
	}
	return resp, nil
}
