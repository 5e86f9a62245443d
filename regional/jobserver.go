package regional

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/acl"
	"apiary.dev/apiary/internal/ids"
	"apiary.dev/apiary/internal/jobspec"
	"apiary.dev/apiary/placement"
	"apiary.dev/apiary/regional/aclstore"
	"apiary.dev/apiary/regional/scheduler"
	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/regional/taskstate"
	"apiary.dev/apiary/shards"
)

// jobServer serves JobService on every coordinator (owner or not): reads are
// linearizable etcd reads, writes are submissions and cancel flags.
type jobServer struct {
	apiaryv1.UnimplementedJobServiceServer
	c *Coordinator
}

func (s *jobServer) SubmitJob(ctx context.Context, req *apiaryv1.SubmitJobRequest) (*apiaryv1.SubmitJobResponse, error) {
	return s.c.submit(ctx, req)
}

// jobView is a job read back with its tasks and attempt results.
type jobView struct {
	rec     store.JobRecord
	modRev  int64
	tasks   []taskstate.Task
	results map[int32][]*apiaryv1.AttemptResult
	rev     int64
}

func (c *Coordinator) checkJobID(id string) (int, error) {
	if id == "" {
		return 0, status.Error(codes.InvalidArgument, "job_id: is required")
	}
	if !ids.IsJobID(id) {
		return 0, status.Errorf(codes.NotFound, "job %s not found in region %s", id, c.meta.Region)
	}
	// A job of another region's id is found here when it failed over to
	// this region (it keeps its id); otherwise it is NotFound below.
	return shards.Of(id, c.meta.ShardCount), nil
}

// readJob reads a job, its tasks and (if withResults) its attempt results at
// one revision.
func (c *Coordinator) readJob(ctx context.Context, id string, withResults bool) (*jobView, error) {
	shard, err := c.checkJobID(id)
	if err != nil {
		return nil, err
	}
	ops := []clientv3.Op{clientv3.OpGet(store.KeyJob(shard, id)), clientv3.OpGet(store.PrefJobTasks(shard, id), clientv3.WithPrefix())}
	if withResults {
		ops = append(ops, clientv3.OpGet(store.PrefJobResults(shard, id), clientv3.WithPrefix()))
	}
	cctx, cancel := store.EtcdCtx(ctx)
	defer cancel()
	resp, err := c.cli.Txn(cctx).Then(ops...).Commit()
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "read job: %v", err)
	}
	jk := resp.Responses[0].GetResponseRange().Kvs
	if len(jk) == 0 {
		return nil, status.Errorf(codes.NotFound, "job %s not found", id)
	}
	v := &jobView{modRev: jk[0].ModRevision, rev: resp.Header.Revision, results: map[int32][]*apiaryv1.AttemptResult{}}
	if err := json.Unmarshal(jk[0].Value, &v.rec); err != nil {
		return nil, status.Errorf(codes.Internal, "decode job: %v", err)
	}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		var t taskstate.Task
		if err := json.Unmarshal(kv.Value, &t); err != nil {
			return nil, status.Errorf(codes.Internal, "decode task: %v", err)
		}
		v.tasks = append(v.tasks, t)
	}
	if withResults {
		for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
			var r apiaryv1.AttemptResult
			if err := json.Unmarshal(kv.Value, &r); err != nil {
				return nil, status.Errorf(codes.Internal, "decode result: %v", err)
			}
			idx := resultIndex(string(kv.Key))
			v.results[idx] = append(v.results[idx], &r)
		}
	}
	return v, nil
}

func resultIndex(key string) int32 {
	parts := strings.Split(key, "/")
	if len(parts) < 2 {
		return -1
	}
	var n int32
	for _, ch := range parts[len(parts)-2] {
		n = n*10 + int32(ch-'0')
	}
	return n
}

// toProto renders a job; tasks and results are included per flags.
// defaultPolicy is the region's policy for a spec without scheduler.
func (v *jobView) toProto(withTasks, withTails bool, defaultPolicy placement.Policy) *apiaryv1.Job {
	j := jobHeader(&v.rec, defaultPolicy)
	j.Counts = &apiaryv1.TaskCounts{}
	var finish int64
	for i := range v.tasks {
		t := &v.tasks[i]
		taskstate.Count(j.Counts, t.State)
		if t.FinishedMs > finish {
			finish = t.FinishedMs
		}
		if withTasks {
			j.Tasks = append(j.Tasks, taskProto(t, v.rec.Spec, v.results[t.Index], withTails))
		}
	}
	j.State = taskstate.JobState(v.rec.CancelRequested, j.Counts)
	if v.rec.Moved() {
		j.State = apiaryv1.JobState_JOB_STATE_MOVED
	}
	if terminalJob(j.State) {
		j.FinishTimeMs = finish
	}
	return j
}

// jobHeader is a job's answer without counts, state and tasks: its record's
// fields, the spec redacted (secret values never leave the region in an
// answer, secrets.go) and the scheduler policy defaulted.
func jobHeader(rec *store.JobRecord, defaultPolicy placement.Policy) *apiaryv1.Job {
	return &apiaryv1.Job{Id: rec.ID, Region: rec.Region, Spec: jobspec.Redact(rec.Spec), SubmitTimeMs: rec.SubmitMs,
		CancelRequested: rec.CancelRequested, ClientId: rec.ClientID, RequestId: rec.RequestID,
		Shard: int32(rec.Shard), Scheduler: cmp.Or(rec.Spec.GetScheduler(), string(defaultPolicy)), Failover: failoverStatus(rec)}
}

// failoverStatus is a job's failover state as the API shows it (nil for a
// job without failover).
func failoverStatus(rec *store.JobRecord) *apiaryv1.FailoverStatus {
	f := rec.Failover
	if f == nil {
		return nil
	}
	home := cmp.Or(f.Home, ids.RegionOf(rec.ID))
	fs := &apiaryv1.FailoverStatus{HomeRegion: home, ActiveRegion: cmp.Or(f.MovedTo, rec.Region), Epoch: f.Epoch,
		Standbys: f.Standbys, NotEligible: f.NotEligible, AfterMs: f.AfterMs, MovedTimeMs: f.MovedMs}
	if f.MovedTo != "" {
		fs.Epoch = f.MovedEpoch
	}
	return fs
}

func terminalJob(s apiaryv1.JobState) bool {
	return s == apiaryv1.JobState_JOB_STATE_COMPLETE || s == apiaryv1.JobState_JOB_STATE_FAILED || s == apiaryv1.JobState_JOB_STATE_CANCELLED ||
		s == apiaryv1.JobState_JOB_STATE_MOVED
}

func taskProto(t *taskstate.Task, spec *apiaryv1.JobSpec, results []*apiaryv1.AttemptResult, withTails bool) *apiaryv1.Task {
	p := &apiaryv1.Task{JobId: t.JobID, Index: t.Index, State: t.State, Attempt: t.Attempt, NodeId: t.NodeID,
		NodeEpoch: t.NodeEpoch, FencingToken: t.FencingToken, UnplacedReason: t.UnplacedReason,
		NotBeforeMs: t.NotBeforeMs, Error: t.Error, NodeFailures: t.NodeFailures, FetchBytes: t.FetchBytes}
	if g := spec.GetTasks(); int(t.Group) < len(g) {
		p.Group = g[t.Group].GetName()
	}
	for _, r := range results {
		if !withTails {
			r = proto.Clone(r).(*apiaryv1.AttemptResult)
			r.StdoutTail, r.StderrTail = "", ""
		}
		p.Attempts = append(p.Attempts, r)
	}
	return p
}

func (s *jobServer) GetJob(ctx context.Context, req *apiaryv1.GetJobRequest) (*apiaryv1.GetJobResponse, error) {
	v, err := s.c.readJob(ctx, req.GetJobId(), true)
	if err != nil {
		return nil, err
	}
	if err := s.c.aclCheck(ctx, apiaryv1.JobService_GetJob_FullMethodName, v.rec.Spec.GetNamespace(), acl.CapRead); err != nil {
		return nil, err
	}
	j := v.toProto(true, false, s.c.cfg.SchedulerPolicy)
	s.c.explainNoNodes(j)
	s.c.explainHeld(j, &v.rec)
	return &apiaryv1.GetJobResponse{Job: j}, nil
}

// explainNoNodes fills the unplaced reason of pending tasks when the region
// has no ready node at all (the scheduler does not write that reason to
// every task of the backlog). It reads the coordinator's capacity summary
// (refreshed every CapacityRefresh and on each registration), not etcd.
func (c *Coordinator) explainNoNodes(j *apiaryv1.Job) {
	st := &c.capState
	st.mu.Lock()
	none := st.readOK && st.cap.NodesReady == 0
	st.mu.Unlock()
	if !none {
		return
	}
	for _, t := range j.GetTasks() {
		if t.GetState() == apiaryv1.TaskState_TASK_STATE_PENDING && t.GetUnplacedReason() == "" {
			t.UnplacedReason = "no ready nodes in region " + c.meta.Region
		}
	}
}

func (s *jobServer) GetJobLogs(ctx context.Context, req *apiaryv1.GetJobLogsRequest) (*apiaryv1.GetJobLogsResponse, error) {
	v, err := s.c.readJob(ctx, req.GetJobId(), true)
	if err != nil {
		return nil, err
	}
	if err := s.c.aclCheck(ctx, apiaryv1.JobService_GetJobLogs_FullMethodName, v.rec.Spec.GetNamespace(), acl.CapRead); err != nil {
		return nil, err
	}
	if req.GetTaskIndex() < -1 || (req.GetTaskIndex() >= 0 && int(req.GetTaskIndex()) >= len(v.tasks)) {
		return nil, status.Errorf(codes.InvalidArgument, "task_index: must be -1 or 0..%d", len(v.tasks)-1)
	}
	out := &apiaryv1.GetJobLogsResponse{}
	for i := range v.tasks {
		t := &v.tasks[i]
		if req.GetTaskIndex() >= 0 && t.Index != req.GetTaskIndex() {
			continue
		}
		out.Tasks = append(out.Tasks, taskProto(t, v.rec.Spec, v.results[t.Index], true))
	}
	return out, nil
}

func (s *jobServer) ListJobs(ctx context.Context, req *apiaryv1.ListJobsRequest) (*apiaryv1.ListJobsResponse, error) {
	limit := int(req.GetLimit())
	if limit < 0 || limit > 10000 {
		return nil, status.Errorf(codes.InvalidArgument, "limit: must be in 0..10000, got %d", limit)
	}
	if limit == 0 {
		limit = 100
	}
	if _, ok := apiaryv1.JobState_name[int32(req.GetState())]; !ok {
		return nil, status.Errorf(codes.InvalidArgument, "state: unknown job state %d", req.GetState())
	}
	ns := req.GetNamespace()
	if ns != "" {
		if err := acl.ValidateNamespace(ns); err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		if err := s.c.aclCheck(ctx, apiaryv1.JobService_ListJobs_FullMethodName, ns, acl.CapRead); err != nil {
			return nil, err
		}
	}
	// Without a namespace: every namespace the caller may read (a token
	// that may read none gets an empty list).
	readable := map[string]bool{}
	mayRead := func(jobNS string) bool {
		jobNS = acl.OrDefault(jobNS)
		if ns != "" {
			return jobNS == ns
		}
		ok, seen := readable[jobNS]
		if !seen {
			ok = s.c.aclAllowed(ctx, jobNS, acl.CapRead)
			readable[jobNS] = ok
		}
		return ok
	}
	if err := ids.CheckPageToken(req.GetPageToken()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	state := req.GetState()
	current, err := s.c.jobsCurrent(ctx, "list jobs")
	if err != nil {
		return nil, err
	}
	if !current {
		// The index lags (a reloading cache, a stalled loop): read etcd.
		return listJobsFromEtcd(ctx, s.c.cli, s.c.meta.ShardCount, etcdJobList{region: s.c.meta.Region, before: req.GetPageToken(), limit: limit,
			state: state, mayRead: mayRead, policy: s.c.cfg.SchedulerPolicy, scanTasks: listScanTasks})
	}
	page, more := s.c.jobs.Page(req.GetPageToken(), limit, state, func(j *scheduler.IndexedJob) bool {
		return mayRead(j.Rec.Spec.GetNamespace())
	})
	out := &apiaryv1.ListJobsResponse{}
	for _, ij := range page {
		j := jobHeader(ij.Rec, s.c.cfg.SchedulerPolicy)
		j.Counts, j.State, j.FinishTimeMs = ij.Counts, ij.State, ij.FinishTimeMs
		out.Jobs = append(out.Jobs, j)
	}
	if more && len(out.Jobs) > 0 {
		out.NextPageToken = out.Jobs[len(out.Jobs)-1].GetId()
	}
	return out, nil
}

// jobsIndexWait bounds how long ListJobs waits for the job index to catch
// up with etcd before it reads etcd instead.
const jobsIndexWait = 2 * time.Second

// jobsCurrent waits until the job index (the scheduling loop's watch cache)
// has applied every write etcd committed before the call: it reads etcd's
// current revision (one key, keys only) and, while the index is behind,
// asks the watch stream for a progress notification (etcd's
// RequestProgress, as Kubernetes' consistent reads from its watch cache
// do), so that an idle region's index learns the revision without an
// event. current is false when the index did not catch up within
// jobsIndexWait (its cache is reloading, or its loop is stalled);
// UNAVAILABLE when etcd does not answer.
func (c *Coordinator) jobsCurrent(ctx context.Context, what string) (current bool, err error) {
	cctx, cancel := store.EtcdCtx(ctx)
	defer cancel()
	resp, err := c.cli.Get(cctx, store.PrefJobs, clientv3.WithLimit(1), clientv3.WithKeysOnly())
	if err != nil {
		return false, status.Errorf(codes.Unavailable, "%s: %v", what, err)
	}
	rev := resp.Header.Revision
	wctx, wcancel := context.WithTimeout(ctx, jobsIndexWait)
	defer wcancel()
	for c.jobs.Revision() < rev {
		// The loop's watch stream: same outgoing metadata as its context.
		_ = c.cli.RequestProgress(clientv3.WithRequireLeader(wctx))
		pctx, pcancel := context.WithTimeout(wctx, 100*time.Millisecond)
		err := c.jobs.WaitFor(pctx, rev)
		pcancel()
		if err == nil {
			return true, nil
		}
		if ctx.Err() != nil {
			return false, status.FromContextError(ctx.Err()).Err()
		}
		if wctx.Err() != nil {
			c.log.Warn(what+": the job index lags etcd; reading etcd", "index_revision", c.jobs.Revision(), "etcd_revision", rev)
			return false, nil
		}
	}
	return true, nil
}

// CancelJob sets the job's cancel flag (one compared write); the shard owner
// then cancels its pending tasks and tells agents to kill running attempts.
func (s *jobServer) CancelJob(ctx context.Context, req *apiaryv1.CancelJobRequest) (*apiaryv1.CancelJobResponse, error) {
	for attempt := 0; attempt < 10; attempt++ {
		v, err := s.c.readJob(ctx, req.GetJobId(), false)
		if err != nil {
			return nil, err
		}
		if err := s.c.aclCheck(ctx, apiaryv1.JobService_CancelJob_FullMethodName, v.rec.Spec.GetNamespace(), acl.CapCancel); err != nil {
			return nil, err
		}
		j := v.toProto(false, false, s.c.cfg.SchedulerPolicy)
		if v.rec.CancelRequested || terminalJob(j.State) {
			return &apiaryv1.CancelJobResponse{Job: j}, nil
		}
		v.rec.CancelRequested = true
		k := store.KeyJob(v.rec.Shard, v.rec.ID)
		cctx, cancel := store.EtcdCtx(ctx)
		resp, err := s.c.cli.Txn(cctx).If(clientv3.Compare(clientv3.ModRevision(k), "=", v.modRev)).
			Then(clientv3.OpPut(k, store.MustJSON(v.rec))).Commit()
		cancel()
		if err != nil {
			return nil, status.Errorf(codes.Unavailable, "cancel job: %v", err)
		}
		if resp.Succeeded {
			j.CancelRequested = true
			return &apiaryv1.CancelJobResponse{Job: j}, nil
		}
	}
	return nil, status.Error(codes.Aborted, "cancel job: too many concurrent updates")
}

// WatchJob sends the job now and after every change of its record or tasks,
// until it is terminal or the client goes away. With ACLs on, the caller's
// token is judged again before every message (watchACL): a stream ends
// with UNAUTHENTICATED once its token is revoked or expired, and with
// PERMISSION_DENIED once the token's policies no longer grant read on the
// job's namespace; each read of the job (every change, and every 5 s)
// checks, so a stream without changes ends within 5 s too.
func (s *jobServer) WatchJob(req *apiaryv1.WatchJobRequest, stream apiaryv1.JobService_WatchJobServer) error {
	ctx := stream.Context()
	shard, err := s.c.checkJobID(req.GetJobId())
	if err != nil {
		return err
	}
	var last *apiaryv1.Job
	var rev int64
	send := func() (bool, error) {
		v, err := s.c.readJob(ctx, req.GetJobId(), true)
		if err != nil {
			return false, err
		}
		actx, err := s.watchACL(ctx, last == nil)
		if err != nil {
			return false, err
		}
		if err := s.c.aclCheck(actx, apiaryv1.JobService_WatchJob_FullMethodName, v.rec.Spec.GetNamespace(), acl.CapRead); err != nil {
			return false, err
		}
		rev = v.rev
		j := v.toProto(true, false, s.c.cfg.SchedulerPolicy)
		s.c.explainNoNodes(j)
		s.c.explainHeld(j, &v.rec)
		if last == nil || !proto.Equal(j, last) {
			if err := stream.Send(&apiaryv1.WatchJobResponse{Job: j}); err != nil {
				return false, err
			}
			last = j
		}
		return terminalJob(j.State), nil
	}
	done, err := send()
	if err != nil || done {
		return err
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	tasksW := s.c.watchCli.Watch(wctx, store.PrefJobTasks(shard, req.GetJobId()), clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	jobW := s.c.watchCli.Watch(wctx, store.KeyJob(shard, req.GetJobId()), clientv3.WithRev(rev+1))
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case wr, ok := <-tasksW:
			if !ok || wr.Err() != nil {
				return status.Error(codes.Unavailable, "watch interrupted; retry")
			}
		case wr, ok := <-jobW:
			if !ok || wr.Err() != nil {
				return status.Error(codes.Unavailable, "watch interrupted; retry")
			}
		case <-tick.C:
		}
		// Coalesce bursts of task events into one read.
		time.Sleep(20 * time.Millisecond)
	drain:
		for {
			select {
			case _, ok := <-tasksW:
				if !ok {
					return status.Error(codes.Unavailable, "watch interrupted; retry")
				}
			case _, ok := <-jobW:
				if !ok {
					return status.Error(codes.Unavailable, "watch interrupted; retry")
				}
			default:
				break drain
			}
		}
		if done, err := send(); err != nil || done {
			return err
		}
	}
}

// watchACL returns ctx with the caller's ACL as it is now, for WatchJob's
// check before a message: on the open (first true) the one the interceptor
// resolved; afterwards the token resolved again (a cache lookup:
// aclstore.Store.Resolve), so a revocation, an expiry or a policy change
// reaches an open stream. A refusal (UNAUTHENTICATED) is logged and
// counted like the interceptor's; this region's own coordinators (region
// certificate) and ACLs off are not re-judged.
func (s *jobServer) watchACL(ctx context.Context, first bool) (context.Context, error) {
	if !s.c.cfg.ACL || first {
		return ctx, nil
	}
	if a, _ := acl.FromContext(ctx); a == peerACL {
		return ctx, nil
	}
	a, err := s.c.acls.Resolve(ctx, acl.FromIncoming(ctx))
	if err != nil {
		var d *aclstore.Denial
		if errors.As(err, &d) {
			return nil, s.c.aclDeny(ctx, apiaryv1.JobService_WatchJob_FullMethodName, d)
		}
		return nil, err
	}
	return acl.NewContext(ctx, a), nil
}
