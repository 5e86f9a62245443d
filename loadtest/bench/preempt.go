package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/regional/scheduler"
	"apiary.dev/apiary/regional/taskstate"
)

// The preemption benchmark (issue 13 (a), `make bench-placement`): how long
// an urgent task waits to run in a region that is full, now that the shard
// owner commits preemptions (regional/scheduler/preempt.go, `apiary region
// --max-preemptions`), against the same urgent submission in the same
// region with one slot free (no preemption needed), trials alternated.
//
// A trial: a batch job (BatchPriority, `sleep Sleep` tasks of
// TaskCPUMillis / TaskMemoryMiB) fills every slot of the agents (mode
// PreemptFull) or every slot but one (mode PreemptFree); once the harness's
// watch saw all its tasks RUNNING, one urgent job (UrgentPriority, one task
// of the same size) is submitted at t0; the trial's figure is t0 until the
// watch sees the urgent task RUNNING. Then both jobs are cancelled and the
// harness waits until every node is idle (the reset). The victims are the
// batch job's attempts whose outcome is "preempted" (GetJob, after the
// reset).

// Modes of a preemption trial.
const (
	// PreemptFull: the batch job holds every slot; the urgent task can run
	// only by preempting.
	PreemptFull = "full"
	// PreemptFree: the batch job leaves one slot free (the floor).
	PreemptFree = "free"
)

// PreemptOptions configures the preemption benchmark.
type PreemptOptions struct {
	// Coordinators: one region per entry, of that many coordinators (1, 3
	// or 5), run one after the other.
	Coordinators []int
	// Trials per mode and region; the modes alternate (preemptOrder).
	Trials int
	// Agents of CPUMillis / MemoryMiB each (no --max-tasks limit).
	Agents               int
	CPUMillis, MemoryMiB int64
	// TaskCPUMillis / TaskMemoryMiB: every batch task and the urgent one.
	TaskCPUMillis, TaskMemoryMiB int64
	// BatchPriority and UrgentPriority of the two jobs (the urgent one must
	// be at least priority.PreemptionDelta = 10 above).
	BatchPriority, UrgentPriority int32
	// Sleep is the tasks' `sleep` argument (s): longer than any trial, so
	// that only preemption and cancellation end them.
	Sleep string
	// ExtraArgs are added to `apiary region` (none: the region's defaults,
	// --max-preemptions 8 among them).
	ExtraArgs []string
	// Timeout bounds each wait of a trial (fill, urgent RUNNING, reset).
	Timeout time.Duration
}

// DefaultPreempt is issue 13's suggested configuration: a region of one
// coordinator, then one of three, each with 3 agents x 1000 m / 1024 MiB,
// tasks of 250 m / 64 MiB (4 per agent, 12 in all), batch priority 20,
// urgent 90, 20 trials per mode and region.
var DefaultPreempt = PreemptOptions{Coordinators: []int{1, 3}, Trials: 20, Agents: 3, CPUMillis: 1000, MemoryMiB: 1024,
	TaskCPUMillis: 250, TaskMemoryMiB: 64, BatchPriority: 20, UrgentPriority: 90, Sleep: "600", Timeout: 60 * time.Second}

// Slots is how many tasks of the benchmark fit on the agents at once.
func (o PreemptOptions) Slots() int {
	if o.TaskCPUMillis <= 0 || o.TaskMemoryMiB <= 0 {
		return o.Agents
	}
	return o.Agents * int(min(o.CPUMillis/o.TaskCPUMillis, o.MemoryMiB/o.TaskMemoryMiB))
}

// preemptOrder is the modes of trials rounds: each round one trial of each
// mode, the order swapped every round (full, free, free, full, ...), so
// that neither mode always follows the other.
func preemptOrder(trials int) []string {
	var out []string
	for i := 0; i < trials; i++ {
		if i%2 == 0 {
			out = append(out, PreemptFull, PreemptFree)
		} else {
			out = append(out, PreemptFree, PreemptFull)
		}
	}
	return out
}

// PreemptTrial is one trial. Times are ms from the urgent submission (t0),
// taken by the harness from an etcd watch on the region's keyspace (read
// only); 0 when not seen.
type PreemptTrial struct {
	Coordinators int
	Mode         string
	// Trial counts within the mode (1-based), Seq within the region.
	Trial, Seq int
	// BatchTasks of the batch job (Slots or Slots-1).
	BatchTasks int
	// FillMs: the batch submission until all its tasks were RUNNING.
	FillMs float64
	// SubmitMs: the urgent SubmitJob call's latency.
	SubmitMs float64
	// MarkedMs: a batch task record first seen marked preempted (the
	// preemption's commit); RequeuedMs: a marked batch task first seen
	// PENDING again (its agent killed it and reported).
	MarkedMs, RequeuedMs float64
	// AssignedMs and RunningMs: the urgent task first seen ASSIGNED and
	// RUNNING (RunningMs is the trial's figure).
	AssignedMs, RunningMs float64
	// Node ran the urgent task.
	Node string
	// Victims: the batch job's attempts with outcome "preempted" (GetJob
	// after the reset); Marked: batch tasks the watch saw marked.
	Victims, Marked int
	// BatchRunning: batch tasks RUNNING when the urgent one was.
	BatchRunning int
	// ResetMs: cancelling both jobs until every node was idle.
	ResetMs float64
	// Foreign is the share of the machine's CPUs used by processes outside
	// the harness's tree from t0 to the urgent task RUNNING
	// (foreignShare).
	Foreign float64
	// Err is set when the trial did not finish (its numbers do not count).
	Err string
}

// taskRef names one task of one job.
type taskRef struct {
	job   string
	index int32
}

// taskWatch follows the region's task records through an etcd watch (read
// only): each task's latest state, when the harness first saw it in each
// state, and when it was first seen marked preempted (PreemptedBy) and
// PENDING after that.
type taskWatch struct {
	mu       sync.Mutex
	cur      map[taskRef]apiaryv1.TaskState
	first    map[taskRef]map[apiaryv1.TaskState]time.Time
	marked   map[taskRef]time.Time
	requeued map[taskRef]time.Time
	err      error
}

func newTaskWatch() *taskWatch {
	return &taskWatch{cur: map[taskRef]apiaryv1.TaskState{}, first: map[taskRef]map[apiaryv1.TaskState]time.Time{},
		marked: map[taskRef]time.Time{}, requeued: map[taskRef]time.Time{}}
}

// startTaskWatch watches the region's keyspace from now on until ctx ends.
func startTaskWatch(ctx context.Context, cli *clientv3.Client) (*taskWatch, error) {
	w, err := watchRegion(ctx, cli)
	if err != nil {
		return nil, err
	}
	tw := newTaskWatch()
	go func() {
		for wr := range w {
			at := time.Now()
			if err := wr.Err(); err != nil {
				tw.mu.Lock()
				tw.err = err
				tw.mu.Unlock()
				return
			}
			for _, ev := range wr.Events {
				if ev.Type != clientv3.EventTypePut || !strings.HasPrefix(string(ev.Kv.Key), prefTasks) {
					continue
				}
				if t, ok := decodeTask(ev.Kv.Value); ok {
					tw.observe(t, at)
				}
			}
		}
		tw.mu.Lock()
		if tw.err == nil && ctx.Err() == nil {
			tw.err = fmt.Errorf("task watch closed")
		}
		tw.mu.Unlock()
	}()
	return tw, nil
}

// observe records one task record seen at at.
func (tw *taskWatch) observe(t taskstate.Task, at time.Time) {
	tw.mu.Lock()
	defer tw.mu.Unlock()
	r := taskRef{t.JobID, t.Index}
	tw.cur[r] = t.State
	if tw.first[r] == nil {
		tw.first[r] = map[apiaryv1.TaskState]time.Time{}
	}
	if _, ok := tw.first[r][t.State]; !ok {
		tw.first[r][t.State] = at
	}
	if _, ok := tw.marked[r]; !ok && t.PreemptedBy != "" {
		tw.marked[r] = at
	}
	if _, ok := tw.marked[r]; ok && t.State == apiaryv1.TaskState_TASK_STATE_PENDING {
		if _, ok := tw.requeued[r]; !ok {
			tw.requeued[r] = at
		}
	}
}

// count is the number of job's tasks whose latest state is one of states.
func (tw *taskWatch) count(job string, states ...apiaryv1.TaskState) int {
	tw.mu.Lock()
	defer tw.mu.Unlock()
	n := 0
	for r, s := range tw.cur {
		if r.job != job {
			continue
		}
		for _, want := range states {
			if s == want {
				n++
				break
			}
		}
	}
	return n
}

// firstIn is when task (job, index) was first seen in state s.
func (tw *taskWatch) firstIn(job string, index int32, s apiaryv1.TaskState) (time.Time, bool) {
	tw.mu.Lock()
	defer tw.mu.Unlock()
	at, ok := tw.first[taskRef{job, index}][s]
	return at, ok
}

// preemption is, over job's tasks, how many were seen marked preempted, the
// first mark and the first requeue after a mark (zero times: none).
func (tw *taskWatch) preemption(job string) (marked int, firstMark, firstRequeue time.Time) {
	tw.mu.Lock()
	defer tw.mu.Unlock()
	for r, at := range tw.marked {
		if r.job != job {
			continue
		}
		marked++
		if firstMark.IsZero() || at.Before(firstMark) {
			firstMark = at
		}
		if q, ok := tw.requeued[r]; ok && (firstRequeue.IsZero() || q.Before(firstRequeue)) {
			firstRequeue = q
		}
	}
	return marked, firstMark, firstRequeue
}

func (tw *taskWatch) failed() error {
	tw.mu.Lock()
	defer tw.mu.Unlock()
	return tw.err
}

// sinceMs is at - t0 in ms, 0 for a zero at.
func sinceMs(t0, at time.Time) float64 {
	if at.IsZero() {
		return 0
	}
	return ms(at.Sub(t0))
}

// countPreempted counts the attempts of tasks whose outcome is
// taskstate.OutcomePreempted.
func countPreempted(tasks []*apiaryv1.Task) int {
	n := 0
	for _, t := range tasks {
		for _, a := range t.GetAttempts() {
			if a.GetOutcome() == taskstate.OutcomePreempted {
				n++
			}
		}
	}
	return n
}

// regionClients are the harness's clients of one region.
type regionClients struct {
	js    apiaryv1.JobServiceClient
	admin apiaryv1.AdminServiceClient
	etcd  *clientv3.Client
}

// waitIdle waits until every job of ids is terminal (cancelled or done)
// and every one of nodes ready nodes holds no task (ListNodes: nothing
// allocated, nothing running).
func waitIdle(ctx context.Context, rc regionClients, ids []string, nodes int, limit time.Duration) error {
	return waitFor(ctx, limit, "jobs terminal and nodes idle", func() (bool, error) {
		for _, id := range ids {
			if id == "" {
				continue
			}
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			j, err := rc.js.GetJob(cctx, &apiaryv1.GetJobRequest{JobId: id})
			cancel()
			if err != nil {
				return false, err
			}
			if !terminalJobState(j.GetJob().GetState()) {
				return false, fmt.Errorf("job %s is %s", id, j.GetJob().GetState())
			}
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := rc.admin.ListNodes(cctx, &apiaryv1.ListNodesRequest{})
		cancel()
		if err != nil {
			return false, err
		}
		ready := 0
		for _, n := range resp.GetNodes() {
			if n.GetStatus() != apiaryv1.NodeStatus_NODE_STATUS_READY {
				continue
			}
			ready++
			if a := n.GetAllocated(); a.GetCpuMillis() != 0 || a.GetMemoryMb() != 0 || n.GetRunningTasks() != 0 {
				return false, fmt.Errorf("node %s: %d m, %d MiB allocated, %d running", n.GetId(), a.GetCpuMillis(), a.GetMemoryMb(), n.GetRunningTasks())
			}
		}
		if ready < nodes {
			return false, fmt.Errorf("%d of %d nodes ready", ready, nodes)
		}
		return true, nil
	})
}

func terminalJobState(s apiaryv1.JobState) bool {
	return s == apiaryv1.JobState_JOB_STATE_COMPLETE || s == apiaryv1.JobState_JOB_STATE_FAILED || s == apiaryv1.JobState_JOB_STATE_CANCELLED
}

// sleepJob is a job of n tasks of `sleep secs` at the given priority and
// size.
func sleepJob(name string, prio int32, n int32, secs string, cpu, mem int64) *apiaryv1.JobSpec {
	return &apiaryv1.JobSpec{Name: name, Priority: prio, Tasks: []*apiaryv1.TaskGroup{{Name: "t", Count: n,
		Command: "sleep", Args: []string{secs}, Resources: &apiaryv1.Resources{CpuMillis: cpu, MemoryMb: mem}}}}
}

// Preempt runs 2 x o.Trials trials (preemptOrder) on one region of coords
// coordinators, started for them under cfg.WorkDir. A trial that fails is
// returned with Err set, and the region's next trials go on after a reset;
// the error is the region's (it did not start) or ctx's.
func Preempt(ctx context.Context, cfg Config, o PreemptOptions, coords int) ([]PreemptTrial, error) {
	var agents []devcluster.AgentSpec
	for i := 0; i < o.Agents; i++ {
		agents = append(agents, devcluster.AgentSpec{ID: fmt.Sprintf("agent-%d", i+1), CPUMillis: o.CPUMillis, MemoryMiB: o.MemoryMiB})
	}
	dir := filepath.Join(cfg.WorkDir, fmt.Sprintf("preempt-%dc", coords))
	cl, r, err := startRegionSpec(ctx, cfg, dir, devcluster.RegionSpec{Coordinators: coords, Agents: agents, ExtraArgs: o.ExtraArgs}, nil)
	if err != nil {
		return nil, err
	}
	defer cl.Stop()
	if err := r.WaitNodes(ctx, o.Agents); err != nil {
		return nil, err
	}
	conn, err := r.Dial()
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	cli, err := etcdClient(r.EtcdEndpoints)
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	rc := regionClients{js: apiaryv1.NewJobServiceClient(conn), admin: apiaryv1.NewAdminServiceClient(conn), etcd: cli}
	var out []PreemptTrial
	perMode := map[string]int{}
	for seq, mode := range preemptOrder(o.Trials) {
		if ctx.Err() != nil {
			return out, ctx.Err()
		}
		perMode[mode]++
		t, err := preemptTrial(ctx, cfg, o, rc, coords, mode, perMode[mode], seq+1)
		if err != nil {
			t.Err = err.Error()
			cfg.logf("preempt %dc %s trial %d: %v", coords, mode, t.Trial, err)
		} else {
			cfg.logf("preempt %dc %s trial %d: urgent RUNNING %.0f ms after submit (assigned %.0f, marked %.0f, requeued %.0f) on %s; victims %d (marked %d); batch running %d of %d; fill %.0f ms, reset %.0f ms; foreign CPU %.0f%%",
				coords, mode, t.Trial, t.RunningMs, t.AssignedMs, t.MarkedMs, t.RequeuedMs, t.Node, t.Victims, t.Marked, t.BatchRunning, t.BatchTasks, t.FillMs, t.ResetMs, 100*t.Foreign)
		}
		out = append(out, t)
	}
	return out, nil
}

// preemptTrial runs one trial and resets the region after it (also after a
// failure, so that the next trial starts idle).
func preemptTrial(ctx context.Context, cfg Config, o PreemptOptions, rc regionClients, coords int, mode string, trial, seq int) (res PreemptTrial, err error) {
	res = PreemptTrial{Coordinators: coords, Mode: mode, Trial: trial, Seq: seq, BatchTasks: o.Slots()}
	if mode == PreemptFree {
		res.BatchTasks--
	}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	tw, err := startTaskWatch(wctx, rc.etcd)
	if err != nil {
		return res, err
	}
	var batchID, urgentID string
	defer func() {
		// The reset: cancel both jobs, wait until every node is idle, then
		// count the victims (their results are written by then).
		tr := time.Now()
		for _, id := range []string{batchID, urgentID} {
			if id == "" {
				continue
			}
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, cerr := rc.js.CancelJob(cctx, &apiaryv1.CancelJobRequest{JobId: id})
			cancel()
			if cerr != nil && err == nil {
				err = fmt.Errorf("cancel %s: %w", id, cerr)
			}
		}
		if ierr := waitIdle(ctx, rc, []string{batchID, urgentID}, o.Agents, o.Timeout); ierr != nil && err == nil {
			err = fmt.Errorf("reset: %w", ierr)
		}
		res.ResetMs = ms(time.Since(tr))
		if batchID != "" {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			j, gerr := rc.js.GetJob(cctx, &apiaryv1.GetJobRequest{JobId: batchID})
			cancel()
			if gerr != nil && err == nil {
				err = fmt.Errorf("get job %s: %w", batchID, gerr)
			}
			res.Victims = countPreempted(j.GetJob().GetTasks())
		}
	}()

	tb := time.Now()
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	resp, err := rc.js.SubmitJob(sctx, &apiaryv1.SubmitJobRequest{
		Spec:     sleepJob("batch", o.BatchPriority, int32(res.BatchTasks), o.Sleep, o.TaskCPUMillis, o.TaskMemoryMiB),
		ClientId: "bench-preempt", RequestId: fmt.Sprintf("batch-%dc-%d-%d", coords, seq, tb.UnixNano())})
	cancel()
	if err != nil {
		return res, fmt.Errorf("submit batch: %w", err)
	}
	batchID = resp.GetJobId()
	if err := waitFor(ctx, o.Timeout, "every batch task RUNNING", func() (bool, error) {
		if err := tw.failed(); err != nil {
			return false, err
		}
		n := tw.count(batchID, apiaryv1.TaskState_TASK_STATE_RUNNING)
		return n == res.BatchTasks, fmt.Errorf("%d of %d batch tasks RUNNING", n, res.BatchTasks)
	}); err != nil {
		return res, err
	}
	res.FillMs = ms(time.Since(tb))

	h0 := readHostCPU()
	t0 := time.Now()
	sctx, cancel = context.WithTimeout(ctx, 30*time.Second)
	resp, err = rc.js.SubmitJob(sctx, &apiaryv1.SubmitJobRequest{
		Spec:     sleepJob("urgent", o.UrgentPriority, 1, o.Sleep, o.TaskCPUMillis, o.TaskMemoryMiB),
		ClientId: "bench-preempt", RequestId: fmt.Sprintf("urgent-%dc-%d-%d", coords, seq, t0.UnixNano())})
	cancel()
	res.SubmitMs = ms(time.Since(t0))
	if err != nil {
		return res, fmt.Errorf("submit urgent: %w", err)
	}
	urgentID = resp.GetJobId()
	var running time.Time
	if err := waitFor(ctx, o.Timeout, "the urgent task RUNNING", func() (bool, error) {
		if err := tw.failed(); err != nil {
			return false, err
		}
		at, ok := tw.firstIn(urgentID, 0, apiaryv1.TaskState_TASK_STATE_RUNNING)
		running = at
		return ok, fmt.Errorf("urgent task not RUNNING (batch: %d RUNNING, %d marked preempted)",
			tw.count(batchID, apiaryv1.TaskState_TASK_STATE_RUNNING), func() int { n, _, _ := tw.preemption(batchID); return n }())
	}); err != nil {
		return res, err
	}
	res.Foreign = foreignShare(h0, readHostCPU())
	res.RunningMs = sinceMs(t0, running)
	if at, ok := tw.firstIn(urgentID, 0, apiaryv1.TaskState_TASK_STATE_ASSIGNED); ok {
		res.AssignedMs = sinceMs(t0, at)
	}
	res.BatchRunning = tw.count(batchID, apiaryv1.TaskState_TASK_STATE_RUNNING)
	marked, mark, requeue := tw.preemption(batchID)
	res.Marked, res.MarkedMs, res.RequeuedMs = marked, sinceMs(t0, mark), sinceMs(t0, requeue)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	j, err := rc.js.GetJob(cctx, &apiaryv1.GetJobRequest{JobId: urgentID})
	cancel()
	if err != nil {
		return res, fmt.Errorf("get job %s: %w", urgentID, err)
	}
	if ts := j.GetJob().GetTasks(); len(ts) > 0 {
		res.Node = ts[0].GetNodeId()
	}
	return res, nil
}

// PreemptSummary aggregates the finished trials of one region and mode.
type PreemptSummary struct {
	Coordinators int
	Mode         string
	// N trials finished; Errors did not.
	N, Errors int
	// Running: t0 until the urgent task RUNNING; Assigned, Marked and
	// Requeued the steps before it (Marked and Requeued over the trials
	// that preempted).
	Running, Assigned, Marked, Requeued Summary
	// Victims per trial; Preempting: trials with at least one victim.
	Victims    Summary
	Preempting int
	// Foreign: the other processes' CPU share, per trial.
	Foreign Summary
}

// SummarizePreempt aggregates trials per region (in the order of
// coordinators) and mode (full, then free).
func SummarizePreempt(trials []PreemptTrial, coordinators []int) []PreemptSummary {
	var out []PreemptSummary
	for _, c := range coordinators {
		for _, mode := range []string{PreemptFull, PreemptFree} {
			s := PreemptSummary{Coordinators: c, Mode: mode}
			var run, asg, mark, req, vic, foreign []float64
			for _, t := range trials {
				if t.Coordinators != c || t.Mode != mode {
					continue
				}
				if t.Err != "" {
					s.Errors++
					continue
				}
				s.N++
				run = append(run, t.RunningMs)
				asg = append(asg, t.AssignedMs)
				vic = append(vic, float64(t.Victims))
				foreign = append(foreign, 100*t.Foreign)
				if t.Victims > 0 || t.Marked > 0 {
					s.Preempting++
				}
				if t.MarkedMs > 0 {
					mark = append(mark, t.MarkedMs)
				}
				if t.RequeuedMs > 0 {
					req = append(req, t.RequeuedMs)
				}
			}
			if s.N == 0 && s.Errors == 0 {
				continue
			}
			s.Running, s.Assigned, s.Marked, s.Requeued = Summarize(run), Summarize(asg), Summarize(mark), Summarize(req)
			s.Victims, s.Foreign = Summarize(vic), Summarize(foreign)
			out = append(out, s)
		}
	}
	return out
}

// PreemptRows is the per-trial CSV (header, rows).
func PreemptRows(trials []PreemptTrial) ([]string, [][]string) {
	header := []string{"coordinators", "mode", "trial", "seq", "batch_tasks", "urgent_running_ms", "urgent_assigned_ms",
		"first_marked_ms", "first_requeued_ms", "submit_rpc_ms", "victims", "marked", "batch_running_after", "urgent_node",
		"fill_ms", "reset_ms", "foreign_cpu_pct", "error"}
	var rows [][]string
	for _, t := range trials {
		rows = append(rows, []string{strconv.Itoa(t.Coordinators), t.Mode, strconv.Itoa(t.Trial), strconv.Itoa(t.Seq), strconv.Itoa(t.BatchTasks),
			f1(t.RunningMs), f1(t.AssignedMs), f1(t.MarkedMs), f1(t.RequeuedMs), f1(t.SubmitMs), strconv.Itoa(t.Victims), strconv.Itoa(t.Marked),
			strconv.Itoa(t.BatchRunning), t.Node, f1(t.FillMs), f1(t.ResetMs), f1(100 * t.Foreign), t.Err})
	}
	return header, rows
}

// PreemptMarkdown is the summary section.
func PreemptMarkdown(o PreemptOptions, sums []PreemptSummary) string {
	var b strings.Builder
	fmt.Fprintf(&b, "## preempt\n\n%d agents x %d m / %d MiB (region defaults: --max-preemptions %d%s); a batch job (priority %d) of `sleep %s` tasks of %d m / %d MiB fills all %d slots (mode full) or %d of them (mode free, the floor); once the harness's etcd watch saw every batch task RUNNING, one urgent job (priority %d, 1 task of the same size) is submitted at t0. "+
		"Figure: t0 until the watch sees the urgent task RUNNING (harness clock). Then both jobs are cancelled and the harness waits until every node is idle (ListNodes) before the next trial. "+
		"Modes alternate within the region (full, free, free, full, ...), %d trials each; victims: the batch job's attempts with outcome `preempted` (GetJob after the reset). Marked: the first batch task record with preempted_by; requeued: a marked task back to PENDING (its agent killed it and reported).\n\n",
		o.Agents, o.CPUMillis, o.MemoryMiB, scheduler.DefaultMaxPreemptions, extraArgsText(o.ExtraArgs), o.BatchPriority, o.Sleep, o.TaskCPUMillis, o.TaskMemoryMiB, o.Slots(), o.Slots()-1, o.UrgentPriority, o.Trials)
	b.WriteString("| coordinators | mode | n | submit → RUNNING ms p50 / p95 / max | ratio to free (p50 / p95 / max) | → ASSIGNED p50 | → marked p50 | → requeued p50 | victims per trial p50 / max (trials preempting) | foreign CPU % p50 / max |\n|---|---|---|---|---|---|---|---|---|---|\n")
	floor := map[int]Summary{}
	for _, s := range sums {
		if s.Mode == PreemptFree {
			floor[s.Coordinators] = s.Running
		}
	}
	for _, s := range sums {
		n := strconv.Itoa(s.N)
		if s.Errors > 0 {
			n += fmt.Sprintf(" (+%d unfinished)", s.Errors)
		}
		f := floor[s.Coordinators]
		rat := fmt.Sprintf("%.2f / %.2f / %.2f", ratio(s.Running.P50, f.P50), ratio(s.Running.P95, f.P95), ratio(s.Running.Max, f.Max))
		opt := func(x Summary) string {
			if x.N == 0 {
				return "-"
			}
			return thousands(x.P50)
		}
		fmt.Fprintf(&b, "| %d | %s | %s | %s / %s / %s | %s | %s | %s | %s | %.0f / %.0f (%d/%d) | %.0f / %.0f |\n",
			s.Coordinators, s.Mode, n, thousands(s.Running.P50), thousands(s.Running.P95), thousands(s.Running.Max), rat,
			opt(s.Assigned), opt(s.Marked), opt(s.Requeued), s.Victims.P50, s.Victims.Max, s.Preempting, s.N, s.Foreign.P50, s.Foreign.Max)
	}
	b.WriteString("\n(per trial: preempt.csv; plot: preempt.png)\n\n")
	return b.String()
}

// RunPreempt runs the trials of every region of o.Coordinators, writes
// preempt.csv and preempt.png to out, and returns the summary section. A
// region that fails is logged and the next one runs; the error returned
// names the failures.
func RunPreempt(ctx context.Context, cfg Config, o PreemptOptions, out string) (string, error) {
	if ok, err := hasRegionFlag(cfg.Binary, "max-preemptions"); err != nil {
		return "", err
	} else if !ok {
		return "", fmt.Errorf("preempt: %s has no `region --max-preemptions` (build a binary with committed preemption)", cfg.Binary)
	}
	var trials []PreemptTrial
	var failures []string
	for _, c := range o.Coordinators {
		if ctx.Err() != nil {
			break
		}
		ts, err := Preempt(ctx, cfg, o, c)
		trials = append(trials, ts...)
		if err != nil {
			failures = append(failures, fmt.Sprintf("%d coordinators: %v", c, err))
			cfg.logf("preempt %d coordinators: %v", c, err)
		}
		for _, t := range ts {
			if t.Err != "" {
				failures = append(failures, fmt.Sprintf("%dc %s trial %d: %s", t.Coordinators, t.Mode, t.Trial, t.Err))
			}
		}
	}
	h, rows := PreemptRows(trials)
	if err := WriteCSV(filepath.Join(out, "preempt.csv"), h, rows); err != nil {
		return "", err
	}
	var series []plotSeries
	for _, c := range o.Coordinators {
		for _, mode := range []string{PreemptFull, PreemptFree} {
			series = append(series, plotSeries{Name: fmt.Sprintf("%d coordinator(s), %s", c, mode),
				XY: pointsOf(trials, func(t PreemptTrial) int { return t.Seq }, func(t PreemptTrial) float64 { return t.RunningMs },
					func(t PreemptTrial) bool { return t.Err == "" && t.Coordinators == c && t.Mode == mode })})
		}
	}
	if err := savePlot(filepath.Join(out, "preempt.png"), "urgent submission to RUNNING: region full (preemption) vs one slot free",
		"trial (order within the region)", "ms", series, nil); err != nil {
		return "", err
	}
	md := PreemptMarkdown(o, SummarizePreempt(trials, o.Coordinators))
	if len(failures) > 0 {
		return md, fmt.Errorf("preempt: %s", strings.Join(failures, "; "))
	}
	return md, ctx.Err()
}
