package regional

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/telemetry"
	"apiary.dev/apiary/regional/taskstate"
	"apiary.dev/apiary/shards"
)

// agentServer serves AgentService on every coordinator. Registration and
// heartbeats touch only the node's keys; reports are compared writes on the
// task (attempt, node epoch) and the node's alive key, so a coordinator that
// does not own the shards may commit them.
type agentServer struct {
	apiaryv1.UnimplementedAgentServiceServer
	c *Coordinator
}

var (
	nodeIDRE   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	labelKeyRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._/-]{0,126}[A-Za-z0-9])?$`)
)

func (s *agentServer) RegisterNode(ctx context.Context, req *apiaryv1.RegisterNodeRequest) (*apiaryv1.RegisterNodeResponse, error) {
	c := s.c
	if !nodeIDRE.MatchString(req.GetNodeId()) {
		return nil, status.Errorf(codes.InvalidArgument, "node_id: must match %s", nodeIDRE)
	}
	cp := req.GetCapacity()
	if cp.GetCpuMillis() <= 0 || cp.GetMemoryMb() <= 0 || cp.GetGpus() < 0 {
		return nil, status.Error(codes.InvalidArgument, "capacity: cpu_millis and memory_mb must be > 0, gpus >= 0")
	}
	if req.GetMaxTasks() < 0 {
		return nil, status.Error(codes.InvalidArgument, "max_tasks: must be >= 0")
	}
	if cp.GetCpuMillis() > 1<<30 || cp.GetMemoryMb() > 1<<40 || cp.GetGpus() > 1024 || cp.GetGpuMilli() != 0 {
		return nil, status.Error(codes.InvalidArgument, "capacity: cpu_millis <= 2^30, memory_mb <= 2^40, gpus <= 1024, gpu_milli must be 0 (a node offers whole GPUs)")
	}
	if len(req.GetLabels()) > 64 {
		return nil, status.Error(codes.InvalidArgument, "labels: at most 64")
	}
	for k, v := range req.GetLabels() {
		if !labelKeyRE.MatchString(k) {
			return nil, status.Errorf(codes.InvalidArgument, "labels: key %q must match %s", k, labelKeyRE)
		}
		if len(v) > 256 || !utf8.ValidString(v) || strings.ContainsAny(v, "\x00\n") {
			return nil, status.Errorf(codes.InvalidArgument, "labels[%s]: value must be valid UTF-8 of at most 256 bytes without NUL or newline", k)
		}
	}
	if len(req.GetGpuModel()) > 128 {
		return nil, status.Error(codes.InvalidArgument, "gpu_model: at most 128 bytes")
	}
	ttl := int64(c.cfg.NodeLeaseTTL.Seconds() + 0.5)
	cctx, cancel := etcdCtx(ctx)
	defer cancel()
	alive := keyNodeAlive(req.GetNodeId())
	// End any earlier epoch: revoking its lease deletes its alive key, which
	// the shard owner sees as node loss (its tasks are reclaimed) and which
	// fails every later compare of that epoch.
	old, err := c.cli.Get(cctx, alive)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "register: %v", err)
	}
	if len(old.Kvs) == 1 && old.Kvs[0].Lease != 0 {
		if _, err := c.cli.Revoke(cctx, clientv3.LeaseID(old.Kvs[0].Lease)); err != nil && status.Code(err) != codes.NotFound {
			c.log.Warn("revoke previous node lease", "node", req.GetNodeId(), "err", err)
		}
	}
	lease, err := c.cli.Grant(cctx, ttl)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "register: grant lease: %v", err)
	}
	var epoch int64
	for i := 0; ; i++ {
		resp, err := c.cli.Txn(cctx).If(clientv3.Compare(clientv3.CreateRevision(alive), "=", 0)).
			Then(clientv3.OpPut(alive, req.GetNodeId(), clientv3.WithLease(lease.ID))).
			Else(clientv3.OpGet(alive)).Commit()
		if err != nil {
			return nil, status.Errorf(codes.Unavailable, "register: %v", err)
		}
		if resp.Succeeded {
			epoch = resp.Header.Revision
			break
		}
		if i >= 3 {
			return nil, status.Errorf(codes.Aborted, "register: node %s is registering concurrently", req.GetNodeId())
		}
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
			_, _ = c.cli.Revoke(cctx, clientv3.LeaseID(kvs[0].Lease))
		}
	}
	rec := nodeRecord{ID: req.GetNodeId(), Labels: req.GetLabels(), Capacity: cp, GPUModel: req.GetGpuModel(),
		MaxTasks: req.GetMaxTasks(), Epoch: epoch, LeaseID: int64(lease.ID), RegisteredMs: time.Now().UnixMilli()}
	usage := keyNodeUsage(req.GetNodeId())
	_, err = c.cli.Txn(cctx).If(clientv3.Compare(clientv3.CreateRevision(alive), "=", epoch)).
		Then(clientv3.OpPut(keyNode(req.GetNodeId()), mustJSON(rec)),
			clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(usage), "=", 0)},
				[]clientv3.Op{clientv3.OpPut(usage, mustJSON(usageRecord{}))}, nil)).Commit()
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "register: %v", err)
	}
	c.log.Info("node registered", "node", rec.ID, "epoch", epoch, "labels", rec.Labels)
	// Admission judges "fits no node" from the capacity summary: include
	// this node before the agent hears it is registered.
	c.refreshCapacity(ctx)
	return &apiaryv1.RegisterNodeResponse{NodeEpoch: epoch, LeaseTtlMs: ttl * 1000,
		HeartbeatIntervalMs: ttl * 1000 / 4, Region: c.meta.Region}, nil
}

// nodeLease checks that (node, epoch) is current and returns its lease.
func (c *Coordinator) nodeLease(ctx context.Context, nodeID string, epoch int64) (clientv3.LeaseID, error) {
	resp, err := c.cli.Get(ctx, keyNodeAlive(nodeID))
	if err != nil {
		return 0, status.Errorf(codes.Unavailable, "read node: %v", err)
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != epoch {
		return 0, status.Errorf(codes.FailedPrecondition, "node %s epoch %d is gone; re-register", nodeID, epoch)
	}
	return clientv3.LeaseID(resp.Kvs[0].Lease), nil
}

func (s *agentServer) Heartbeat(ctx context.Context, req *apiaryv1.HeartbeatRequest) (*apiaryv1.HeartbeatResponse, error) {
	cctx, cancel := etcdCtx(ctx)
	defer cancel()
	lease, err := s.c.nodeLease(cctx, req.GetNodeId(), req.GetNodeEpoch())
	if err != nil {
		return nil, err
	}
	ka, err := s.c.cli.KeepAliveOnce(cctx, lease)
	if err != nil {
		if status.Code(err) == codes.NotFound || err.Error() == "etcdserver: requested lease not found" {
			return nil, status.Errorf(codes.FailedPrecondition, "node %s epoch %d: lease expired; re-register", req.GetNodeId(), req.GetNodeEpoch())
		}
		return nil, status.Errorf(codes.Unavailable, "heartbeat: %v", err)
	}
	return &apiaryv1.HeartbeatResponse{LeaseTtlMs: ka.TTL * 1000}, nil
}

// StreamAssignments sends the node's current assignments, then every new one,
// from a watch on /apiary/assign/<node>/. The fencing token of an assignment
// is its key's CreateRevision: the revision of the plan that dispatched it.
func (s *agentServer) StreamAssignments(req *apiaryv1.StreamAssignmentsRequest, stream apiaryv1.AgentService_StreamAssignmentsServer) error {
	c := s.c
	ctx := stream.Context()
	cctx, cancel := etcdCtx(ctx)
	if _, err := c.nodeLease(cctx, req.GetNodeId(), req.GetNodeEpoch()); err != nil {
		cancel()
		return err
	}
	resp, err := c.cli.Get(cctx, prefNodeAssign(req.GetNodeId()), clientv3.WithPrefix())
	cancel()
	if err != nil {
		return status.Errorf(codes.Unavailable, "read assignments: %v", err)
	}
	send := func(value []byte, createRev int64) error {
		var a apiaryv1.Assignment
		if err := proto.Unmarshal(value, &a); err != nil {
			return status.Errorf(codes.Internal, "decode assignment: %v", err)
		}
		if a.NodeEpoch != req.GetNodeEpoch() {
			return nil
		}
		a.FencingToken = createRev
		span := c.dispatchSpan(&a)
		err := stream.Send(&apiaryv1.StreamAssignmentsResponse{Assignment: &a})
		if span != nil {
			span.SetAttributes(telemetry.AttrNodeID.String(req.GetNodeId()))
			telemetry.RecordError(span, err)
			span.End()
		}
		return err
	}
	for _, kv := range resp.Kvs {
		if err := send(kv.Value, kv.CreateRevision); err != nil {
			return err
		}
	}
	wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer wcancel()
	w := c.cli.Watch(wctx, prefNodeAssign(req.GetNodeId()), clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	aw := c.cli.Watch(wctx, keyNodeAlive(req.GetNodeId()), clientv3.WithRev(resp.Header.Revision+1))
	for {
		select {
		case <-ctx.Done():
			return nil
		case wr, ok := <-aw:
			if !ok || wr.Err() != nil {
				return status.Error(codes.Unavailable, "watch interrupted; reconnect")
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete || ev.Kv.CreateRevision != req.GetNodeEpoch() {
					return status.Errorf(codes.FailedPrecondition, "node %s epoch %d ended; re-register", req.GetNodeId(), req.GetNodeEpoch())
				}
			}
		case wr, ok := <-w:
			if !ok || wr.Err() != nil {
				return status.Error(codes.Unavailable, "watch interrupted; reconnect")
			}
			for _, ev := range wr.Events {
				if ev.Type != clientv3.EventTypePut {
					continue
				}
				if err := send(ev.Kv.Value, ev.Kv.CreateRevision); err != nil {
					return err
				}
			}
		}
	}
}

// reportItem is one report waiting for group commit.
type reportItem struct {
	req  *apiaryv1.ReportTaskStatusRequest
	done chan *apiaryv1.ReportTaskStatusResponse
	err  error
}

func (s *agentServer) ReportTaskStatus(ctx context.Context, req *apiaryv1.ReportTaskStatusRequest) (*apiaryv1.ReportTaskStatusResponse, error) {
	if req.GetKind() == apiaryv1.ReportKind_REPORT_KIND_UNSPECIFIED {
		return nil, status.Error(codes.InvalidArgument, "kind: is required")
	}
	if _, err := s.c.checkJobID(req.GetJobId()); err != nil {
		return nil, err
	}
	// Keep at most maxTailBytes of each stream (the end), whatever the agent
	// sent, so one report can never outgrow an etcd request.
	req.StdoutTail, req.StderrTail = capTail(req.GetStdoutTail()), capTail(req.GetStderrTail())
	if len(req.GetError()) > maxTailBytes {
		req.Error = req.GetError()[:maxTailBytes]
	}
	it := &reportItem{req: req, done: make(chan *apiaryv1.ReportTaskStatusResponse, 1)}
	if err := s.c.reports.submit(ctx, it); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	select {
	case r := <-it.done:
		if it.err != nil {
			return nil, it.err
		}
		return r, nil
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// specCache keeps immutable job specs (a spec never changes after submit).
type specCache struct {
	mu sync.Mutex
	m  map[string]*jobRecord
}

func (sc *specCache) get(id string) *jobRecord {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.m[id]
}

func (sc *specCache) put(r *jobRecord) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.m == nil || len(sc.m) > 50000 {
		sc.m = map[string]*jobRecord{}
	}
	sc.m[r.ID] = r
}

// policyOf is the retry policy of a job.
func policyOf(spec *apiaryv1.JobSpec, group int32) taskstate.Policy {
	p := taskstate.Policy{MaxAttempts: spec.GetMaxAttempts()}
	if g := spec.GetTasks(); int(group) < len(g) {
		p.RetryableCodes = g[group].GetRetryableExitCodes()
	}
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = 3
	}
	return p
}

// reportState is one task's state inside a report batch.
type reportState struct {
	shard     int
	taskKey   string
	task      taskstate.Task
	modRev    int64
	job       *jobRecord
	alive     int64 // node's current epoch (0: gone)
	token     int64 // fencing token of the current assignment
	changed   bool
	results   []*apiaryv1.AttemptResult
	release   bool
	nodeID    string
	nodeEpoch int64
}

var reportRNG = struct {
	sync.Mutex
	r *rand.Rand
}{r: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))}

// flushReports commits a batch of reports: one read Txn for every task, job
// and node alive key involved, the state machine in memory, then one write
// Txn whose compares pin each task's ModRevision and each node's epoch. If
// the write Txn fails (a concurrent change), every report is redone alone.
func (c *Coordinator) flushReports(batch []*reportItem) {
	// Split by bytes so that no Txn outgrows etcd's request limit.
	for len(batch) > 0 {
		n, size := 0, 0
		for n < len(batch) && (n == 0 || size+reportBytes(batch[n]) <= maxReportBatchBytes) {
			size += reportBytes(batch[n])
			n++
		}
		c.flushReportChunk(batch[:n])
		batch = batch[n:]
	}
}

func (c *Coordinator) flushReportChunk(batch []*reportItem) {
	if len(batch) > 1 {
		if ok, err := c.commitReports(batch, false); ok && err == nil {
			return
		}
	}
	for _, it := range batch {
		var ok bool
		var err error
		for try := 0; try < 5 && !ok; try++ {
			ok, err = c.commitReports([]*reportItem{it}, true)
		}
		if !ok {
			if err == nil {
				err = status.Error(codes.Aborted, "report: too many concurrent changes; retry")
			}
			it.err = err
			it.done <- nil
		}
	}
}

// commitReports commits a batch and answers every item, returning true. It
// returns false with nothing answered when the write Txn's compares failed,
// or when etcd failed and answer is false (the caller then retries the items
// one by one; with answer true the error is returned to the agents).
func (c *Coordinator) commitReports(batch []*reportItem, answer bool) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), commitAttempts*commitAttemptTimeout)
	defer cancel()
	start := time.Now()
	fail := func(err error) (bool, error) {
		c.log.Warn("report commit failed", "reports", len(batch), "err", err)
		if !answer {
			return false, err
		}
		for _, it := range batch {
			it.err = status.Errorf(codes.Unavailable, "report: %v", err)
			it.done <- nil
		}
		return true, nil
	}
	states := map[string]*reportState{}
	var order []string
	var reads []clientv3.Op
	nodes := map[string]bool{}
	for _, it := range batch {
		shard := shards.Of(it.req.GetJobId(), c.meta.ShardCount)
		k := keyTask(shard, it.req.GetJobId(), it.req.GetTaskIndex())
		if states[k] == nil {
			states[k] = &reportState{shard: shard, taskKey: k}
			order = append(order, k)
			reads = append(reads, clientv3.OpGet(k))
			if c.specs.get(it.req.GetJobId()) == nil {
				reads = append(reads, clientv3.OpGet(keyJob(shard, it.req.GetJobId())))
			}
			reads = append(reads, clientv3.OpGet(keyAssign(it.req.GetNodeId(), it.req.GetJobId(), it.req.GetTaskIndex())))
		}
		if !nodes[it.req.GetNodeId()] {
			nodes[it.req.GetNodeId()] = true
			reads = append(reads, clientv3.OpGet(keyNodeAlive(it.req.GetNodeId())))
		}
	}
	resp, err := c.txnRetry(ctx, func(actx context.Context) (*clientv3.TxnResponse, error) {
		return c.cli.Txn(actx).Then(reads...).Commit()
	})
	if err != nil {
		return fail(err)
	}
	alive := map[string]int64{}
	tokens := map[string]int64{}
	for _, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().Kvs {
			key := string(kv.Key)
			switch {
			case len(key) > len(prefTasks) && key[:len(prefTasks)] == prefTasks:
				st := states[key]
				if err := json.Unmarshal(kv.Value, &st.task); err != nil {
					return fail(fmt.Errorf("decode task: %w", err))
				}
				st.modRev = kv.ModRevision
			case len(key) > len(prefJobs) && key[:len(prefJobs)] == prefJobs:
				var jr jobRecord
				if err := json.Unmarshal(kv.Value, &jr); err != nil {
					return fail(fmt.Errorf("decode job: %w", err))
				}
				c.specs.put(&jr)
			case len(key) > len(prefAssign) && key[:len(prefAssign)] == prefAssign:
				tokens[key] = kv.CreateRevision
			default:
				if id, kind, ok := nodeKeyKind(key); ok && kind == "alive" {
					alive[id] = kv.CreateRevision
				}
			}
		}
	}
	answers := make([]*apiaryv1.ReportTaskStatusResponse, len(batch))
	outcomes := make([]string, len(batch))
	nowMs := time.Now().UnixMilli()
	for i, it := range batch {
		r := it.req
		st := states[keyTask(shards.Of(r.GetJobId(), c.meta.ShardCount), r.GetJobId(), r.GetTaskIndex())]
		if st.modRev == 0 {
			answers[i] = &apiaryv1.ReportTaskStatusResponse{Reason: fmt.Sprintf("task %s/%d not found", r.GetJobId(), r.GetTaskIndex())}
			continue
		}
		if st.job == nil {
			st.job = c.specs.get(r.GetJobId())
		}
		if st.job == nil {
			answers[i] = &apiaryv1.ReportTaskStatusResponse{Reason: "job record not found"}
			continue
		}
		reportRNG.Lock()
		res := taskstate.ApplyReport(st.task, policyOf(st.job.Spec, st.task.Group), taskstate.Report{
			Kind: r.GetKind(), NodeID: r.GetNodeId(), NodeEpoch: r.GetNodeEpoch(), Attempt: r.GetAttempt(),
			ExitCode: r.GetExitCode(), Error: r.GetError(), StartMs: r.GetStartTimeMs(), EndMs: r.GetEndTimeMs(),
		}, alive[r.GetNodeId()], nowMs, reportRNG.r)
		reportRNG.Unlock()
		if res.Rejected != "" {
			answers[i] = &apiaryv1.ReportTaskStatusResponse{Reason: res.Rejected}
			continue
		}
		token := tokens[keyAssign(r.GetNodeId(), r.GetJobId(), r.GetTaskIndex())]
		if res.Task.FencingToken == 0 && taskstate.Active(res.Task.State) {
			res.Task.FencingToken = token
		}
		if st.nodeID == "" {
			st.nodeID, st.nodeEpoch = r.GetNodeId(), r.GetNodeEpoch()
		}
		if res.Outcome != "" {
			st.results = append(st.results, &apiaryv1.AttemptResult{Attempt: r.GetAttempt(), NodeId: r.GetNodeId(),
				NodeEpoch: r.GetNodeEpoch(), FencingToken: token, Outcome: res.Outcome, ExitCode: r.GetExitCode(),
				Error: firstNonEmpty(r.GetError(), res.Task.Error), StdoutTail: r.GetStdoutTail(), StderrTail: r.GetStderrTail(),
				StartTimeMs: firstNonZero(r.GetStartTimeMs(), st.task.StartedMs), EndTimeMs: firstNonZero(r.GetEndTimeMs(), nowMs)})
		}
		st.task, st.changed = res.Task, true
		st.release = st.release || res.Released
		outcomes[i] = res.Outcome
		answers[i] = &apiaryv1.ReportTaskStatusResponse{Accepted: true}
	}
	var cmps []clientv3.Cmp
	var ops []clientv3.Op
	cmpNodes := map[string]bool{}
	for _, k := range order {
		st := states[k]
		if !st.changed {
			continue
		}
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", st.modRev))
		if !cmpNodes[st.nodeID] {
			cmpNodes[st.nodeID] = true
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(keyNodeAlive(st.nodeID)), "=", st.nodeEpoch))
		}
		ops = append(ops, clientv3.OpPut(k, mustJSON(&st.task)))
		for _, res := range st.results {
			ops = append(ops, clientv3.OpPut(keyResult(st.shard, st.task.JobID, st.task.Index, res.Attempt), mustJSON(res)))
		}
		if st.release {
			ops = append(ops, clientv3.OpDelete(keyAssign(st.nodeID, st.task.JobID, st.task.Index)))
		}
	}
	if len(ops) > 0 {
		wresp, err := c.txnRetry(ctx, func(actx context.Context) (*clientv3.TxnResponse, error) {
			return c.cli.Txn(actx).If(cmps...).Then(ops...).Commit()
		})
		if err != nil {
			return fail(err)
		}
		if !wresp.Succeeded {
			return false, nil
		}
	}
	for i, it := range batch {
		r := it.req
		c.observeReport(r, answers[i], states[keyTask(shards.Of(r.GetJobId(), c.meta.ShardCount), r.GetJobId(), r.GetTaskIndex())], outcomes[i], start)
		it.done <- answers[i]
	}
	return true, nil
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func firstNonZero(a, b int64) int64 {
	if a != 0 {
		return a
	}
	return b
}

// maxTailBytes caps each output tail a coordinator stores per attempt.
const maxTailBytes = 64 << 10

// maxReportBatchBytes caps the output carried by one report Txn.
const maxReportBatchBytes = 4 << 20

// capTail keeps the last maxTailBytes of s, starting at a rune boundary.
func capTail(s string) string {
	if len(s) <= maxTailBytes {
		return s
	}
	s = s[len(s)-maxTailBytes:]
	for i := 0; i < len(s) && i < 4; i++ {
		if utf8.RuneStart(s[i]) {
			return s[i:]
		}
	}
	return s
}

func reportBytes(it *reportItem) int {
	return len(it.req.GetStdoutTail()) + len(it.req.GetStderrTail()) + len(it.req.GetError()) + 256
}
