package regional

// GetJobTrace and ExportSpans: a job's trace read over the API from the
// coordinators' in-memory span buffers (telemetry.SpanStore), which also
// hold the spans the region's agents ship to them. See
// docs/observability.md, "apiary trace".

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/acl"
	"apiary.dev/apiary/internal/ids"
	"apiary.dev/apiary/internal/telemetry"
	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/regional/taskstate"
	"apiary.dev/apiary/shards"
)

// peerTraceTimeout bounds the question to each peer coordinator.
const peerTraceTimeout = 3 * time.Second

// GetJobTrace answers from this coordinator's span buffer and, unless
// req.LocalOnly, from every other member of the region (asked in parallel,
// each for at most peerTraceTimeout; one that does not answer is named in
// Unavailable). It does not read the job: a job with no buffered spans
// gets an empty answer.
func (s *jobServer) GetJobTrace(ctx context.Context, req *apiaryv1.GetJobTraceRequest) (*apiaryv1.GetJobTraceResponse, error) {
	c := s.c
	shard, err := c.checkJobID(req.GetJobId())
	if err != nil {
		return nil, err
	}
	if !c.aclManagement(ctx) {
		// With ACLs, read needs the job's namespace: its record.
		if err := c.checkJobRead(ctx, apiaryv1.JobService_GetJobTrace_FullMethodName, shard, req.GetJobId()); err != nil {
			return nil, err
		}
	}
	out := &apiaryv1.GetJobTraceResponse{}
	if st := telemetry.StoreOf(c.cfg.TracerProvider); st != nil {
		out.SpansJsonl = st.JobJSONLines(req.GetJobId())
	} else {
		out.NotRecording = append(out.NotRecording, "coordinator "+c.cfg.ID)
	}
	if req.GetLocalOnly() {
		return out, nil
	}
	cctx, cancel := store.EtcdCtx(ctx)
	resp, err := c.cli.Get(cctx, store.PrefMembers, clientv3.WithPrefix())
	cancel()
	if err != nil {
		out.Unavailable = append(out.Unavailable, fmt.Sprintf("region %s's other coordinators: listing them: %v", c.meta.Region, err))
		return out, nil
	}
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	for _, kv := range resp.Kvs {
		var m store.MemberRecord
		if json.Unmarshal(kv.Value, &m) != nil || m.ID == c.cfg.ID || m.APIAddr == "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := askPeerTrace(ctx, c.peerDialOption(), m.APIAddr, req.GetJobId())
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				out.Unavailable = append(out.Unavailable, fmt.Sprintf("coordinator %s at %s: %s", m.ID, m.APIAddr, status.Convert(err).Message()))
				return
			}
			out.SpansJsonl = append(out.SpansJsonl, r.GetSpansJsonl()...)
			out.NotRecording = append(out.NotRecording, r.GetNotRecording()...)
		}()
	}
	wg.Wait()
	return out, nil
}

// checkJobRead is aclCheck of capability read on job id's namespace,
// read from its record: NOT_FOUND without one.
func (c *Coordinator) checkJobRead(ctx context.Context, method string, shard int, id string) error {
	cctx, cancel := store.EtcdCtx(ctx)
	defer cancel()
	resp, err := c.cli.Get(cctx, store.KeyJob(shard, id))
	if err != nil {
		return status.Errorf(codes.Unavailable, "read job: %v", err)
	}
	if len(resp.Kvs) == 0 {
		return status.Errorf(codes.NotFound, "job %s not found", id)
	}
	var rec store.JobRecord
	if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
		return status.Errorf(codes.Internal, "decode job: %v", err)
	}
	return c.aclCheck(ctx, method, rec.Spec.GetNamespace(), acl.CapRead)
}

// askPeerTrace asks the coordinator at addr for its own spans of jobID,
// dialing with creds (Coordinator.peerDialOption). The caller's ACL token
// goes along: a peer admits a region certificate as management, but
// without TLS the token is all it has.
func askPeerTrace(ctx context.Context, creds grpc.DialOption, addr, jobID string) (*apiaryv1.GetJobTraceResponse, error) {
	ctx = acl.ForwardToken(ctx, ctx)
	cc, err := grpc.NewClient(addr, creds)
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(ctx, peerTraceTimeout)
	defer cancel()
	return apiaryv1.NewJobServiceClient(cc).GetJobTrace(ctx, &apiaryv1.GetJobTraceRequest{JobId: jobID, LocalOnly: true},
		grpc.MaxCallRecvMsgSize(64<<20))
}

// ExportSpans keeps an agent's shipped spans in the span buffer (dropped
// when the coordinator keeps none), but only those of an attempt the calling
// node ran: a span is kept when its apiary.node.id attribute is the
// request's node_id (authz binds node_id to the agent certificate), it
// names a job of this region, a task index and an attempt, its trace is the
// job's (the job record's traceparent), and that attempt is the task's
// current one on this node or has a result of this node. Every other span
// (another node's job, a forged node or trace, no job at all) is refused:
// not counted in Kept, and the call logs one WARN naming the node, the
// jobs and the first reason. The check is one etcd read (a Txn of Gets) per
// batch of ExportSpansMaxChecks attempts; when etcd cannot be read the call
// fails with UNAVAILABLE and keeps nothing.
func (s *agentServer) ExportSpans(ctx context.Context, req *apiaryv1.ExportSpansRequest) (*apiaryv1.ExportSpansResponse, error) {
	c := s.c
	st := telemetry.StoreOf(c.cfg.TracerProvider)
	if st == nil {
		return &apiaryv1.ExportSpansResponse{}, nil
	}
	node := req.GetNodeId()
	var (
		spans   []shippedSpan
		refused spanRefusals
	)
	for _, line := range bytes.Split(req.GetSpansJsonl(), []byte{'\n'}) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		sp, why := c.parseShippedSpan(line, node)
		if why != "" {
			refused.add(sp.key.job, why)
			continue
		}
		spans = append(spans, sp)
	}
	verdicts, err := c.checkShippedAttempts(ctx, node, spans)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "checking the spans' attempts: %v", err)
	}
	var keep bytes.Buffer
	for _, sp := range spans {
		if why := verdicts[sp.key].why(sp.trace); why != "" {
			refused.add(sp.key.job, why)
			continue
		}
		keep.Write(sp.line)
		keep.WriteByte('\n')
	}
	if refused.n > 0 {
		c.log.Warn("refused spans shipped by an agent: not of an attempt of its node", "node", node,
			"refused", refused.n, "jobs", refused.jobs, "reason", refused.first)
	}
	return &apiaryv1.ExportSpansResponse{Kept: int32(st.AddJSONLines(keep.Bytes()))}, nil
}

// ExportSpansMaxChecks is how many distinct attempts one etcd read of
// ExportSpans checks (two Gets each, plus one per job, under etcd's
// default limit of 128 operations per Txn).
const ExportSpansMaxChecks = 40

// shippedAttempt is the attempt a shipped span names.
type shippedAttempt struct {
	job           string
	task, attempt int32
}

// shippedSpan is one line of an ExportSpansRequest and what it names.
type shippedSpan struct {
	line  []byte
	trace trace.TraceID
	key   shippedAttempt
}

// parseShippedSpan reads one shipped span; why is the reason it is refused
// ("" when it may be kept, subject to checkShippedAttempts).
func (c *Coordinator) parseShippedSpan(line []byte, node string) (sp shippedSpan, why string) {
	sp.line = line
	var r struct {
		TraceID    string         `json:"trace_id"`
		Attributes map[string]any `json:"attributes"`
	}
	if json.Unmarshal(line, &r) != nil {
		return sp, "not a JSON span record"
	}
	tid, err := trace.TraceIDFromHex(r.TraceID)
	if err != nil {
		return sp, "no valid trace_id"
	}
	sp.trace = tid
	job, _ := r.Attributes[string(telemetry.AttrJobID)].(string)
	sp.key.job = job
	if job == "" || strings.ContainsRune(job, '/') || ids.RegionOf(job) != c.meta.Region {
		return sp, "names no job of region " + c.meta.Region
	}
	if n, _ := r.Attributes[string(telemetry.AttrNodeID)].(string); node == "" || n != node {
		return sp, fmt.Sprintf("its %s %q is not the calling node", telemetry.AttrNodeID, n)
	}
	task, ok1 := spanInt(r.Attributes[string(telemetry.AttrTaskIndex)])
	attempt, ok2 := spanInt(r.Attributes[string(telemetry.AttrAttempt)])
	if !ok1 || !ok2 {
		return sp, "names no task index and attempt"
	}
	sp.key.task, sp.key.attempt = task, attempt
	return sp, ""
}

// spanInt is a JSON attribute value that is a non-negative int32.
func spanInt(v any) (int32, bool) {
	f, ok := v.(float64)
	if !ok || f < 0 || f > math.MaxInt32 || f != math.Trunc(f) {
		return 0, false
	}
	return int32(f), true
}

// attemptVerdict is what etcd says of a shipped span's attempt.
type attemptVerdict struct {
	ranOnNode bool          // the task's current attempt on the node, or a result of the node
	jobTrace  trace.TraceID // the job's trace (zero: the job is gone or has no trace)
	jobFound  bool
}

// why is the reason a span of trace tid is refused, or "".
func (v attemptVerdict) why(tid trace.TraceID) string {
	switch {
	case !v.jobFound:
		return "its job is not in the region"
	case !v.ranOnNode:
		return "its attempt did not run on the calling node"
	case !v.jobTrace.IsValid() || v.jobTrace != tid:
		return "its trace is not the job's"
	}
	return ""
}

// checkShippedAttempts reads, for each distinct attempt the spans name, its
// task record and its result, and each job's record: one Txn of Gets per
// ExportSpansMaxChecks attempts (a task and its result are read at the same
// revision, so an attempt that just ended is seen in one or the other).
func (c *Coordinator) checkShippedAttempts(ctx context.Context, node string, spans []shippedSpan) (map[shippedAttempt]attemptVerdict, error) {
	out := map[shippedAttempt]attemptVerdict{}
	var keys []shippedAttempt
	for _, sp := range spans {
		if _, ok := out[sp.key]; !ok {
			out[sp.key] = attemptVerdict{}
			keys = append(keys, sp.key)
		}
	}
	for len(keys) > 0 {
		chunk := keys[:min(len(keys), ExportSpansMaxChecks)]
		keys = keys[len(chunk):]
		var ops []clientv3.Op
		var jobs []string
		seen := map[string]bool{}
		for _, k := range chunk {
			sh := shards.Of(k.job, c.meta.ShardCount)
			ops = append(ops, clientv3.OpGet(store.KeyTask(sh, k.job, k.task)), clientv3.OpGet(store.KeyResult(sh, k.job, k.task, k.attempt)))
			if !seen[k.job] {
				seen[k.job] = true
				jobs = append(jobs, k.job)
			}
		}
		for _, j := range jobs {
			ops = append(ops, clientv3.OpGet(store.KeyJob(shards.Of(j, c.meta.ShardCount), j)))
		}
		cctx, cancel := store.EtcdCtx(ctx)
		resp, err := c.cli.Txn(cctx).Then(ops...).Commit()
		cancel()
		if err != nil {
			return nil, err
		}
		traces := map[string]trace.TraceID{}
		for i, j := range jobs {
			kvs := resp.Responses[2*len(chunk)+i].GetResponseRange().GetKvs()
			if len(kvs) == 0 {
				continue
			}
			var rec store.JobRecord
			if json.Unmarshal(kvs[0].Value, &rec) != nil {
				continue
			}
			traces[j] = telemetry.SpanContextOf(rec.Traceparent).TraceID()
		}
		for i, k := range chunk {
			tid, found := traces[k.job]
			v := attemptVerdict{jobFound: found, jobTrace: tid}
			if kvs := resp.Responses[2*i].GetResponseRange().GetKvs(); len(kvs) > 0 {
				var t taskstate.Task
				if json.Unmarshal(kvs[0].Value, &t) == nil && t.NodeID == node && t.Attempt == k.attempt {
					v.ranOnNode = true
				}
			}
			if kvs := resp.Responses[2*i+1].GetResponseRange().GetKvs(); len(kvs) > 0 {
				var r apiaryv1.AttemptResult
				if json.Unmarshal(kvs[0].Value, &r) == nil && r.GetNodeId() == node {
					v.ranOnNode = true
				}
			}
			out[k] = v
		}
	}
	return out, nil
}

// spanRefusals counts an ExportSpans call's refused spans for its one log
// line: how many, the jobs they named (at most 5) and the first reason.
type spanRefusals struct {
	n     int
	jobs  []string
	first string
}

func (r *spanRefusals) add(job, why string) {
	r.n++
	if r.first == "" {
		r.first = why
	}
	if job != "" && len(r.jobs) < 5 && !slices.Contains(r.jobs, job) {
		r.jobs = append(r.jobs, job)
	}
}
