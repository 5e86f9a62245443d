package regional

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
	"unicode/utf8"

	clientv3 "go.etcd.io/etcd/client/v3"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/regional/taskstate"
	"apiary.dev/apiary/shards"
)

// Report commit (the write side of AgentService.ReportTaskStatus, as
// submit.go is for SubmitJob): reports are group-committed; a batch is read
// (readReports), decided by taskstate.ApplyReport (decideReports) and
// written (reportWrites) in one compared Txn. The errors here are plain;
// the handler turns them into gRPC statuses.

// errReportContended is a report that could not commit alone after
// several tries because its task or node kept changing.
var errReportContended = errors.New("report: too many concurrent changes; retry")

// errReportHeld is a report on a failover job this coordinator does not yet
// know the fate of (it came back and its standbys have not all said whether
// the job moved): the agent keeps it and sends it again.
var errReportHeld = errors.New("report: the job's standby regions have not yet said whether it failed over while this region was away; retry")

// reportItem is one report waiting for group commit.
type reportItem struct {
	req  *apiaryv1.ReportTaskStatusRequest
	done chan *apiaryv1.ReportTaskStatusResponse
	err  error
}

// reportState is one task's state inside a report batch.
type reportState struct {
	shard     int
	taskKey   string
	task      taskstate.Task
	modRev    int64
	job       *store.JobRecord
	alive     int64 // node's current epoch (0: gone)
	token     int64 // fencing token of the current assignment
	changed   bool
	results   []*apiaryv1.AttemptResult
	release   bool
	nodeID    string
	nodeEpoch int64
	// outputs are the completed attempt's outputs to record for the node
	// (declared by its task group; the report's sizes).
	outputs []*apiaryv1.LocalDataset
}

// reportRead is what a batch's read Txn found: each task's state (in the
// order first reported), each reporting node's epoch and each assignment's
// fencing token.
type reportRead struct {
	states map[string]*reportState // task key ->
	order  []string
	alive  map[string]int64 // node id -> current epoch
	tokens map[string]int64 // assignment key -> fencing token (store.AssignToken)
	health *healthState     // the reporting nodes' health (health.go)
}

// reportTaskKey is the key of the task a report is about.
func (c *Coordinator) reportTaskKey(r *apiaryv1.ReportTaskStatusRequest) string {
	return store.KeyTask(shards.Of(r.GetJobId(), c.meta.ShardCount), r.GetJobId(), r.GetTaskIndex())
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
	// A batch whose compares failed is read and decided again as a whole
	// (what changed is most often one task or node record, committed by
	// then); only then is each report redone alone.
	for try := 0; len(batch) > 1 && try < batchTries; try++ {
		ok, err := c.commitReports(batch, false)
		if ok && err == nil {
			return
		}
		if err != nil {
			break
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
				err = errReportContended
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
			it.err = fmt.Errorf("report: %w", err)
			it.done <- nil
		}
		return true, nil
	}
	rd, err := c.readReports(ctx, batch)
	if err != nil {
		return fail(err)
	}
	answers, outcomes := c.decideReports(batch, rd, time.Now().UnixMilli())
	if cmps, ops := rd.health.writes(rd.writes()); len(ops) > 0 {
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
	c.noteHealth(rd.health)
	c.announce(rd.health)
	for i, it := range batch {
		c.observeReport(it.req, answers[i], rd.states[c.reportTaskKey(it.req)], outcomes[i], start)
		it.done <- answers[i]
	}
	return true, nil
}

// readReports reads, in one Txn, every task a batch reports on, its job
// record (unless cached), its assignment on the reporting node, and each
// reporting node's alive key. A task or job record that does not decode
// fails the batch.
func (c *Coordinator) readReports(ctx context.Context, batch []*reportItem) (*reportRead, error) {
	rd := &reportRead{states: map[string]*reportState{}, alive: map[string]int64{}, tokens: map[string]int64{},
		health: newHealthState()}
	var reads []clientv3.Op
	nodes := map[string]bool{}
	var nodeIDs []string
	for _, it := range batch {
		shard := shards.Of(it.req.GetJobId(), c.meta.ShardCount)
		k := store.KeyTask(shard, it.req.GetJobId(), it.req.GetTaskIndex())
		if rd.states[k] == nil {
			rd.states[k] = &reportState{shard: shard, taskKey: k}
			rd.order = append(rd.order, k)
			reads = append(reads, clientv3.OpGet(k))
			if c.specs.Get(it.req.GetJobId()) == nil {
				reads = append(reads, clientv3.OpGet(store.KeyJob(shard, it.req.GetJobId())))
			}
			reads = append(reads, clientv3.OpGet(store.KeyAssign(it.req.GetNodeId(), it.req.GetJobId(), it.req.GetTaskIndex())))
		}
		if !nodes[it.req.GetNodeId()] {
			nodes[it.req.GetNodeId()] = true
			nodeIDs = append(nodeIDs, it.req.GetNodeId())
			reads = append(reads, clientv3.OpGet(store.KeyNodeAlive(it.req.GetNodeId())))
		}
	}
	rd.health.reporting = nodes
	reads = append(reads, healthReads(nodeIDs)...)
	resp, err := c.txnRetry(ctx, func(actx context.Context) (*clientv3.TxnResponse, error) {
		return c.cli.Txn(actx).Then(reads...).Commit()
	})
	if err != nil {
		return nil, err
	}
	for _, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().Kvs {
			key := string(kv.Key)
			switch {
			case store.IsTaskKey(key):
				st := rd.states[key]
				if err := json.Unmarshal(kv.Value, &st.task); err != nil {
					return nil, fmt.Errorf("decode task %s: %w", key, err)
				}
				st.modRev = kv.ModRevision
			case store.IsJobKey(key):
				var jr store.JobRecord
				if err := json.Unmarshal(kv.Value, &jr); err != nil {
					return nil, fmt.Errorf("decode job %s: %w", key, err)
				}
				c.specs.Put(&jr)
			case store.IsAssignKey(key):
				rd.tokens[key] = store.AssignToken(kv.Value, kv.CreateRevision)
			default:
				if ok, err := rd.health.fold(key, kv.Value, kv.ModRevision); ok {
					if err != nil {
						return nil, err
					}
					continue
				}
				if id, kind, ok := store.NodeKeyKind(key); ok && kind == store.NodeAliveKey {
					rd.alive[id] = kv.CreateRevision
				}
			}
		}
	}
	return rd, nil
}

// decideReports applies each report to its task's state (taskstate
// .ApplyReport), in batch order, and returns each report's answer and the
// outcome of the attempt it ended ("" if none).
func (c *Coordinator) decideReports(batch []*reportItem, rd *reportRead, nowMs int64) ([]*apiaryv1.ReportTaskStatusResponse, []string) {
	answers := make([]*apiaryv1.ReportTaskStatusResponse, len(batch))
	outcomes := make([]string, len(batch))
	for i, it := range batch {
		r := it.req
		it.err = nil // a batch decided again (its compares failed) is judged afresh
		st := rd.states[c.reportTaskKey(r)]
		if st.modRev == 0 {
			answers[i] = &apiaryv1.ReportTaskStatusResponse{Reason: fmt.Sprintf("task %s/%d not found", r.GetJobId(), r.GetTaskIndex())}
			continue
		}
		if st.job == nil {
			st.job = c.specs.Get(r.GetJobId())
		}
		if st.job == nil {
			answers[i] = &apiaryv1.ReportTaskStatusResponse{Reason: "job record not found"}
			continue
		}
		held := c.holdJob(st.job)
		if held && !st.job.CancelRequested {
			it.err = errReportHeld // answered UNAVAILABLE (reportStatus); nothing written
			continue
		}
		// The node's view of the region, computed once for this report
		// (its blame and its outcome are judged against the same one).
		var hv *healthView
		view := func() healthView {
			if hv == nil {
				v := c.viewOf(rd.health, r.GetNodeId(), nowMs)
				hv = &v
			}
			return *hv
		}
		blame := c.blame(rd.health, r, view, nowMs)
		reportRNG.Lock()
		res := taskstate.ApplyReport(st.task, store.PolicyOf(st.job.Spec, st.task.Group), taskstate.Report{
			Kind: r.GetKind(), NodeID: r.GetNodeId(), NodeEpoch: r.GetNodeEpoch(), Attempt: r.GetAttempt(),
			ExitCode: r.GetExitCode(), Error: r.GetError(), StartMs: r.GetStartTimeMs(), EndMs: r.GetEndTimeMs(),
			Fault: r.GetFault(), Blame: blame,
		}, rd.alive[r.GetNodeId()], nowMs, reportRNG.r)
		reportRNG.Unlock()
		if res.Rejected != "" {
			answers[i] = &apiaryv1.ReportTaskStatusResponse{Reason: res.Rejected, NodeEpochEnded: rd.alive[r.GetNodeId()] != r.GetNodeEpoch()}
			continue
		}
		if res.Duplicate {
			answers[i] = &apiaryv1.ReportTaskStatusResponse{Accepted: true} // already applied: nothing to write
			continue
		}
		if failed := res.Fault != apiaryv1.FailureFault_FAILURE_FAULT_UNSPECIFIED; failed || res.Outcome == taskstate.OutcomeComplete {
			c.observe(rd.health, r.GetNodeId(), r.GetJobId(), failed, st.task.AssignedMs, view(), nowMs)
		}
		token := rd.tokens[store.KeyAssign(r.GetNodeId(), r.GetJobId(), r.GetTaskIndex())]
		if res.Task.FencingToken == 0 && (taskstate.Active(res.Task.State) || res.Task.State == apiaryv1.TaskState_TASK_STATE_COMPLETE) {
			// Also on an attempt whose first report is its end: the
			// completion keeps its token (failover replicates it).
			res.Task.FencingToken = token
		}
		if st.nodeID == "" {
			st.nodeID, st.nodeEpoch = r.GetNodeId(), r.GetNodeEpoch()
		}
		if res.Outcome != "" {
			st.results = append(st.results, &apiaryv1.AttemptResult{Attempt: r.GetAttempt(), NodeId: r.GetNodeId(),
				NodeEpoch: r.GetNodeEpoch(), FencingToken: token, Outcome: res.Outcome, ExitCode: r.GetExitCode(),
				Error: firstNonEmpty(r.GetError(), res.Task.Error), StdoutTail: r.GetStdoutTail(), StderrTail: r.GetStderrTail(),
				StartTimeMs: firstNonZero(r.GetStartTimeMs(), st.task.StartedMs), EndTimeMs: firstNonZero(r.GetEndTimeMs(), nowMs),
				Fault: res.Fault})
		}
		if res.Outcome == taskstate.OutcomeComplete {
			// A completion that cannot count here is discarded (the task
			// ends CANCELLED), and the agent is told why: the job failed
			// over to another region, or it was cancelled while held (it
			// may have moved meanwhile; the standby's copy, if any, is the
			// one of record), its attempts ending here to free their nodes.
			discard := ""
			if to, epoch := c.movedTo(st.job); to != "" {
				discard = fmt.Sprintf("job moved to region %s (failover epoch %d): the completion of this attempt is discarded", to, epoch)
			} else if held {
				discard = "job cancelled while held (a standby may have taken it over): the completion of this attempt is discarded"
			}
			if discard != "" {
				res.Outcome = taskstate.OutcomeCancelled
				res.Task.State = apiaryv1.TaskState_TASK_STATE_CANCELLED
				res.Task.Error = discard
				if n := len(st.results); n > 0 {
					st.results[n-1].Outcome, st.results[n-1].Error = res.Outcome, res.Task.Error
				}
			}
		}
		if res.Outcome == taskstate.OutcomeComplete {
			st.outputs = declaredOutputs(st.job.Spec, st.task.Group, r.GetOutputs())
		}
		st.task, st.changed = res.Task, true
		st.release = st.release || res.Released
		outcomes[i] = res.Outcome
		answers[i] = &apiaryv1.ReportTaskStatusResponse{Accepted: true}
	}
	return answers, outcomes
}

// writes is the batch's write Txn: for each changed task, its new record,
// its attempt results and (when released) its assignment's deletion, under
// compares of the task's ModRevision and the reporting node's epoch.
func (rd *reportRead) writes() ([]clientv3.Cmp, []clientv3.Op) {
	var cmps []clientv3.Cmp
	var ops []clientv3.Op
	cmpNodes := map[string]bool{}
	outKeys := map[string]bool{}
	for _, k := range rd.order {
		st := rd.states[k]
		if !st.changed {
			continue
		}
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", st.modRev))
		if !cmpNodes[st.nodeID] {
			cmpNodes[st.nodeID] = true
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(store.KeyNodeAlive(st.nodeID)), "=", st.nodeEpoch))
		}
		ops = append(ops, clientv3.OpPut(k, store.MustJSON(&st.task)))
		for _, res := range st.results {
			ops = append(ops, clientv3.OpPut(store.KeyResult(st.shard, st.task.JobID, st.task.Index, res.Attempt), store.MustJSON(res)))
		}
		if st.release {
			ops = append(ops, clientv3.OpDelete(store.KeyAssign(st.nodeID, st.task.JobID, st.task.Index)))
		}
		for _, o := range st.outputs {
			k := store.KeyNodeOutput(st.nodeID, o.GetName())
			if outKeys[k] {
				continue // two completions of the batch wrote it: one put per key in a Txn
			}
			outKeys[k] = true
			ops = append(ops, clientv3.OpPut(k, store.MustJSON(store.OutputRecord{Epoch: st.nodeEpoch, Bytes: o.GetSizeBytes()})))
		}
	}
	return cmps, ops
}

// declaredOutputs keeps of a completion's reported outputs those its task
// group declares (TaskGroup.outputs), once each, with a size >= 0: an agent
// cannot record a dataset the job did not ask for.
func declaredOutputs(spec *apiaryv1.JobSpec, group int32, reported []*apiaryv1.LocalDataset) []*apiaryv1.LocalDataset {
	if len(reported) == 0 || int(group) >= len(spec.GetTasks()) {
		return nil
	}
	declared := spec.GetTasks()[group].GetOutputs()
	var out []*apiaryv1.LocalDataset
	for _, o := range reported {
		if o.GetSizeBytes() < 0 || o.GetSizeBytes() > maxDatasetBytes || !slices.Contains(declared, o.GetName()) ||
			slices.ContainsFunc(out, func(x *apiaryv1.LocalDataset) bool { return x.GetName() == o.GetName() }) {
			continue
		}
		out = append(out, o)
	}
	return out
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

// batchTries is how many times a report batch whose write compares failed
// is retried whole before its reports are committed one by one.
const batchTries = 3

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
