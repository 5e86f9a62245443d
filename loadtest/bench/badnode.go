package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/regional/nodehealth"
)

// The bad-node benchmark (issue 11, "Measure"): one agent of four fails
// every task it gets, in one of three realistic ways, while three jobs of
// sleep tasks run; per trial, how many tasks and jobs failed, whether and
// how soon the bad node was quarantined automatically, how many attempts it
// absorbed before, and the jobs' wall time against a healthy control run
// in the same process, interleaved with it.

// Setups of the bad-node benchmark: how the bad agent misbehaves.
const (
	// BadNodeControl: every agent is healthy.
	BadNodeControl = "control"
	// BadNodeExit75: a `sleep` first in the bad agent's PATH exits 75, which
	// the jobs declare retryable.
	BadNodeExit75 = "exit75"
	// BadNodeExit1: a `sleep` first in the bad agent's PATH exits 1 (not
	// retryable).
	BadNodeExit1 = "exit1"
	// BadNodeWorkDir: the bad agent's work dir is replaced by a file once it
	// registered (devcluster.BreakWorkDir): every attempt fails to start.
	BadNodeWorkDir = "workdir"
)

// BadNodeSetups is every setup, control first.
var BadNodeSetups = []string{BadNodeControl, BadNodeExit75, BadNodeExit1, BadNodeWorkDir}

// BadNodeSetupText describes a setup in words (for the summary).
func BadNodeSetupText(setup string) string {
	switch setup {
	case BadNodeControl:
		return "healthy (control)"
	case BadNodeExit75:
		return "every task exits 75 (retryable)"
	case BadNodeExit1:
		return "every task exits 1"
	case BadNodeWorkDir:
		return "its work dir is broken (start failure)"
	}
	return setup
}

// BadNodeOptions configures the bad-node benchmark.
type BadNodeOptions struct {
	// Trials per setup; the setups are interleaved within each round, each
	// trial on a fresh region (fresh health windows).
	Trials int
	Setups []string
	// Agents of CPUMillis / MemoryMiB each (no --max-tasks limit).
	Agents               int
	CPUMillis, MemoryMiB int64
	// Jobs of TasksPerJob tasks of `sleep Sleep`, TaskCPUMillis and
	// TaskMemoryMiB each, MaxAttempts per task, retryable exit code 75,
	// submitted at once.
	Jobs                        int
	TasksPerJob                 int32
	Sleep                       string
	TaskCPUMillis, TaskMemoryMB int64
	MaxAttempts                 int32
	// ExtraArgs are added to `apiary region` (none: the region's defaults,
	// --quarantine-probe-after 1m among them).
	ExtraArgs []string
	// Timeout bounds one trial from the submission until every task is
	// terminal.
	Timeout time.Duration
}

// DefaultBadNode is issue 11's configuration: 4 agents x 1000 m, 3 jobs x 20
// tasks of `sleep 1` (100 m each, so 10 fit on an agent), max_attempts 3,
// retryable_exit_codes [75], one coordinator with the default quarantine
// policy.
var DefaultBadNode = BadNodeOptions{Trials: 5, Setups: BadNodeSetups, Agents: 4, CPUMillis: 1000, MemoryMiB: 1024,
	Jobs: 3, TasksPerJob: 20, Sleep: "1", TaskCPUMillis: 100, TaskMemoryMB: 16, MaxAttempts: 3,
	Timeout: 120 * time.Second}

// BadNodeTrial is one trial. Times are ms from the moment the harness began
// submitting the jobs (t0), taken by the harness from an etcd watch on the
// region's keyspace (read only).
type BadNodeTrial struct {
	Setup string
	Trial int
	// BadNode is the misbehaving agent ("" in the control); it rotates over
	// the agents by trial, so that no result depends on a tie-break by name.
	BadNode string
	// Jobs and Tasks submitted.
	Jobs, Tasks int
	// WallMs: until the last task record became terminal (the 3 jobs
	// terminal).
	WallMs float64
	// FailedTasks and FailedJobs as GetJob reports them afterwards.
	FailedTasks, FailedJobs int
	// Quarantined: the bad node's health record was written with an
	// automatic quarantine during the trial. QuarantineRev is that write's
	// etcd revision, TimeToQuarantineMs when the watch saw it.
	Quarantined        bool
	QuarantineRev      int64
	TimeToQuarantineMs float64
	// APITimeToQuarantineMs is ListNodes' quarantined_time_ms (the
	// coordinator's clock, the same machine's) minus t0 (0 when not
	// quarantined), a cross-check of TimeToQuarantineMs.
	APITimeToQuarantineMs float64
	QuarantineReason      string
	// QuarantinedNodes are every node quarantined automatically during the
	// trial (the bad one, or a false positive).
	QuarantinedNodes []string
	// AttemptsOnBadBefore counts the attempts assigned to the bad node at
	// an etcd revision before its quarantine (all of them when it was not
	// quarantined); AttemptsOnBadTotal all of its attempts; AttemptsTotal
	// every attempt of the trial (GetJobLogs).
	AttemptsOnBadBefore, AttemptsOnBadTotal, AttemptsTotal int
	// Attempts are every attempt of the trial.
	Attempts []BadNodeAttempt
	// Evidence is text for a reader: the bad node as ListNodes shows it,
	// the coordinator's log lines about quarantine, the logs of failed
	// tasks, and cross-check mismatches.
	Evidence string
	// Err is set when the trial did not finish (its numbers do not count).
	Err string
}

// BadNodeAttempt is one attempt of a trial: what GetJobLogs reports, and
// when the harness's watch first saw it assigned (AssignedRev 0: not seen).
type BadNodeAttempt struct {
	Job      string
	Task     int32
	Attempt  int32
	Node     string
	Outcome  string
	Fault    string
	ExitCode int32
	Error    string
	// AssignedMs is ms from t0; AssignedRev the etcd revision of the task
	// record write that first showed the attempt on its node.
	AssignedMs  float64
	AssignedRev int64
}

// countBadAttempts counts the attempts on bad: before (assigned at a
// revision below quarantineRev; every one of them when quarantineRev is 0,
// and an attempt the watch did not see counts as before) and total, and
// every attempt (all).
func countBadAttempts(attempts []BadNodeAttempt, bad string, quarantineRev int64) (before, total, all int) {
	for _, a := range attempts {
		all++
		if bad == "" || a.Node != bad {
			continue
		}
		total++
		if quarantineRev == 0 || a.AssignedRev == 0 || a.AssignedRev < quarantineRev {
			before++
		}
	}
	return before, total, all
}

// attemptKey names one attempt of one task.
type attemptKey struct {
	job          string
	task, number int32
}

// assignSeen is when the watch first saw an attempt on its node.
type assignSeen struct {
	node string
	rev  int64
	at   float64
}

// healthNode is the node id of a /apiary/nodes/<id>/health key ("" for
// other keys).
func healthNode(key string) string {
	rest, ok := strings.CutPrefix(key, prefNodes)
	if !ok {
		return ""
	}
	id, ok := strings.CutSuffix(rest, "/health")
	if !ok || id == "" || strings.Contains(id, "/") {
		return ""
	}
	return id
}

// fakeSleepDir writes <dir>/sleep, a script that exits code, and returns
// dir: put first in an agent's PATH, every `sleep` task it runs exits code
// at once, as on a host with a corrupt binary or cache.
func fakeSleepDir(dir string, code int) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	script := fmt.Sprintf("#!/bin/sh\n# apiary-bench badnode: a broken host's sleep\necho \"sleep: broken on this host (exit %d)\" >&2\nexit %d\n", code, code)
	if err := os.WriteFile(filepath.Join(dir, "sleep"), []byte(script), 0o755); err != nil {
		return "", err
	}
	return dir, nil
}

// BadNode runs one trial of setup on a fresh one-coordinator region.
func BadNode(ctx context.Context, cfg Config, o BadNodeOptions, setup string, trial int) (BadNodeTrial, error) {
	res := BadNodeTrial{Setup: setup, Trial: trial, Jobs: o.Jobs, Tasks: o.Jobs * int(o.TasksPerJob)}
	var agents []devcluster.AgentSpec
	for i := 0; i < o.Agents; i++ {
		agents = append(agents, devcluster.AgentSpec{ID: fmt.Sprintf("agent-%d", i+1), CPUMillis: o.CPUMillis, MemoryMiB: o.MemoryMiB})
	}
	bad := -1
	if setup != BadNodeControl {
		bad = (trial - 1) % o.Agents
		res.BadNode = agents[bad].ID
	}
	switch setup {
	case BadNodeControl, BadNodeWorkDir:
	case BadNodeExit75, BadNodeExit1:
		code := map[string]int{BadNodeExit75: 75, BadNodeExit1: 1}[setup]
		bin, err := fakeSleepDir(filepath.Join(cfg.WorkDir, fmt.Sprintf("badnode-bin-exit%d", code)), code)
		if err != nil {
			return res, err
		}
		agents[bad].Env = []string{"PATH=" + bin + string(os.PathListSeparator) + os.Getenv("PATH")}
	default:
		return res, fmt.Errorf("badnode: unknown setup %q (want one of %v)", setup, BadNodeSetups)
	}
	dir := filepath.Join(cfg.WorkDir, fmt.Sprintf("badnode-%s-%d", setup, trial))
	cl, r, err := startRegionSpec(ctx, cfg, dir, devcluster.RegionSpec{Coordinators: 1, Agents: agents, ExtraArgs: o.ExtraArgs}, nil)
	if err != nil {
		return res, err
	}
	defer cl.Stop()
	if err := r.WaitNodes(ctx, o.Agents); err != nil {
		return res, err
	}
	if setup == BadNodeWorkDir {
		if err := cl.BreakWorkDir(res.BadNode); err != nil {
			return res, err
		}
	}
	conn, err := r.Dial()
	if err != nil {
		return res, err
	}
	defer conn.Close()
	js := apiaryv1.NewJobServiceClient(conn)
	admin := apiaryv1.NewAdminServiceClient(conn)
	cli, err := etcdClient(r.EtcdEndpoints)
	if err != nil {
		return res, err
	}
	defer cli.Close()
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	w, err := watchRegion(wctx, cli)
	if err != nil {
		return res, err
	}

	// Submit every job at once.
	t0 := time.Now()
	ids, err := submitAll(ctx, js, o.Jobs, "bench-badnode", func(j int) (*apiaryv1.JobSpec, string) {
		return badNodeJob(o, fmt.Sprintf("badnode-%d", j+1)), fmt.Sprintf("%s-%d-j%d-%d", setup, trial, j, t0.UnixNano())
	})
	if err != nil {
		return res, err
	}

	assigned := map[attemptKey]assignSeen{}
	terminal := map[string]bool{} // task key -> terminal
	type quarantineSeen struct {
		rev    int64
		at     float64
		reason string
	}
	quarantined := map[string]quarantineSeen{}
	done := 0
	timeout := time.NewTimer(o.Timeout)
	defer timeout.Stop()
	for done < res.Tasks {
		select {
		case <-timeout.C:
			return res, fmt.Errorf("%d of %d tasks terminal after %s", done, res.Tasks, o.Timeout)
		case wr, ok := <-w:
			if !ok || wr.Err() != nil {
				return res, fmt.Errorf("watch ended: %v", wr.Err())
			}
			at := ms(time.Since(t0))
			for _, ev := range wr.Events {
				if ev.Type != clientv3.EventTypePut {
					continue
				}
				k := string(ev.Kv.Key)
				if node := healthNode(k); node != "" {
					var rec nodehealth.Record
					if json.Unmarshal(ev.Kv.Value, &rec) == nil && rec.Quarantine != nil {
						if _, seen := quarantined[node]; !seen {
							quarantined[node] = quarantineSeen{rev: ev.Kv.ModRevision, at: at, reason: rec.Quarantine.Reason}
						}
					}
					continue
				}
				if !strings.HasPrefix(k, prefTasks) {
					continue
				}
				t, ok := decodeTask(ev.Kv.Value)
				if !ok {
					continue
				}
				if t.NodeID != "" && t.Attempt > 0 && (t.State == apiaryv1.TaskState_TASK_STATE_ASSIGNED || t.State == apiaryv1.TaskState_TASK_STATE_RUNNING) {
					key := attemptKey{t.JobID, t.Index, t.Attempt}
					if _, seen := assigned[key]; !seen {
						assigned[key] = assignSeen{node: t.NodeID, rev: ev.Kv.ModRevision, at: at}
					}
				}
				switch t.State {
				case apiaryv1.TaskState_TASK_STATE_COMPLETE, apiaryv1.TaskState_TASK_STATE_FAILED, apiaryv1.TaskState_TASK_STATE_CANCELLED:
					if !terminal[k] {
						terminal[k] = true
						done++
						res.WallMs = at
					}
				}
			}
		}
	}
	wcancel()

	// Through the API: job and task states, every attempt, the nodes.
	var ev strings.Builder
	for _, id := range ids {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		j, err := js.GetJob(cctx, &apiaryv1.GetJobRequest{JobId: id})
		cancel()
		if err != nil {
			return res, fmt.Errorf("get job %s: %w", id, err)
		}
		switch j.GetJob().GetState() {
		case apiaryv1.JobState_JOB_STATE_FAILED:
			res.FailedJobs++
		case apiaryv1.JobState_JOB_STATE_COMPLETE:
		default:
			fmt.Fprintf(&ev, "- job %s is %s after every task record was terminal\n", id, j.GetJob().GetState())
		}
		cctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		lg, err := js.GetJobLogs(cctx, &apiaryv1.GetJobLogsRequest{JobId: id, TaskIndex: -1})
		cancel()
		if err != nil {
			return res, fmt.Errorf("job logs %s: %w", id, err)
		}
		for _, tk := range lg.GetTasks() {
			if tk.GetState() == apiaryv1.TaskState_TASK_STATE_FAILED {
				res.FailedTasks++
				fmt.Fprintf(&ev, "- FAILED task %s/%d (attempt %d): %s\n", id, tk.GetIndex(), tk.GetAttempt(), tk.GetError())
				for _, a := range tk.GetAttempts() {
					fmt.Fprintf(&ev, "  - attempt %d on %s: outcome %s, fault %s, exit %d, error %q, stderr %q\n", a.GetAttempt(), a.GetNodeId(), a.GetOutcome(),
						strings.TrimPrefix(a.GetFault().String(), "FAILURE_FAULT_"), a.GetExitCode(), a.GetError(), strings.TrimSpace(a.GetStderrTail()))
				}
			}
			for _, a := range tk.GetAttempts() {
				ba := BadNodeAttempt{Job: id, Task: tk.GetIndex(), Attempt: a.GetAttempt(), Node: a.GetNodeId(), Outcome: a.GetOutcome(),
					Fault: strings.TrimPrefix(a.GetFault().String(), "FAILURE_FAULT_"), ExitCode: a.GetExitCode(), Error: a.GetError()}
				key := attemptKey{id, tk.GetIndex(), a.GetAttempt()}
				if s, ok := assigned[key]; ok {
					ba.AssignedMs, ba.AssignedRev = s.at, s.rev
					if s.node != ba.Node {
						fmt.Fprintf(&ev, "- attempt %s/%d#%d: watch saw it on %s, logs say %s\n", id, tk.GetIndex(), a.GetAttempt(), s.node, ba.Node)
					}
					delete(assigned, key)
				} else {
					fmt.Fprintf(&ev, "- attempt %s/%d#%d on %s (%s): not seen assigned by the watch\n", id, tk.GetIndex(), a.GetAttempt(), ba.Node, ba.Outcome)
				}
				res.Attempts = append(res.Attempts, ba)
			}
		}
	}
	for k, s := range assigned {
		fmt.Fprintf(&ev, "- attempt %s/%d#%d seen assigned on %s by the watch, missing from the job logs\n", k.job, k.task, k.number, s.node)
	}
	for node := range quarantined {
		res.QuarantinedNodes = append(res.QuarantinedNodes, node)
	}
	slices.Sort(res.QuarantinedNodes)
	if q, ok := quarantined[res.BadNode]; ok && res.BadNode != "" {
		res.Quarantined, res.QuarantineRev, res.TimeToQuarantineMs, res.QuarantineReason = true, q.rev, q.at, q.reason
	}
	res.AttemptsOnBadBefore, res.AttemptsOnBadTotal, res.AttemptsTotal = countBadAttempts(res.Attempts, res.BadNode, res.QuarantineRev)

	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	nodes, err := admin.ListNodes(cctx, &apiaryv1.ListNodesRequest{})
	cancel()
	if err != nil {
		return res, fmt.Errorf("list nodes: %w", err)
	}
	for _, n := range nodes.GetNodes() {
		if n.GetId() != res.BadNode && !n.GetQuarantined() {
			continue
		}
		fmt.Fprintf(&ev, "- node list: %s %s quarantined=%v automatic=%v by=%q since=%d strikes=%d probe_at=%d recent %d failures of %d attempts; reason %q\n",
			n.GetId(), strings.TrimPrefix(n.GetStatus().String(), "NODE_STATUS_"), n.GetQuarantined(), n.GetQuarantineAutomatic(), n.GetQuarantinedBy(),
			n.GetQuarantinedTimeMs(), n.GetQuarantineStrikes(), n.GetQuarantineProbeTimeMs(), n.GetRecentFailures(), n.GetRecentAttempts(), n.GetQuarantineReason())
		if n.GetId() == res.BadNode && n.GetQuarantined() && n.GetQuarantinedTimeMs() > 0 {
			res.APITimeToQuarantineMs = float64(n.GetQuarantinedTimeMs()) - float64(t0.UnixNano())/1e6
			if !res.Quarantined {
				fmt.Fprintf(&ev, "- node list shows %s quarantined, the watch saw no quarantine in its health record\n", n.GetId())
			}
		}
	}
	for _, p := range r.Coords {
		for _, l := range grepFile(p.LogPath, "quarantin", 20) {
			fmt.Fprintf(&ev, "- %s log: %s\n", p.Name, l)
		}
	}
	res.Evidence = ev.String()
	return res, nil
}

// badNodeJob is one job of the benchmark.
func badNodeJob(o BadNodeOptions, name string) *apiaryv1.JobSpec {
	return &apiaryv1.JobSpec{Name: name, MaxAttempts: o.MaxAttempts, Tasks: []*apiaryv1.TaskGroup{{Name: "t", Count: o.TasksPerJob,
		Command: "sleep", Args: []string{o.Sleep}, RetryableExitCodes: []int32{75},
		Resources: &apiaryv1.Resources{CpuMillis: o.TaskCPUMillis, MemoryMb: o.TaskMemoryMB}}}}
}

// grepFile returns up to limit lines of path that contain substr (case
// insensitive); nil if it cannot be read.
func grepFile(path, substr string, limit int) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	substr = strings.ToLower(substr)
	for sc.Scan() && len(out) < limit {
		if strings.Contains(strings.ToLower(sc.Text()), substr) {
			out = append(out, sc.Text())
		}
	}
	return out
}

// SpawnFloor runs tasks processes of `sleep secs` from the harness itself,
// at most concurrency at once, and returns the wall time in ms: what the
// jobs would take with no scheduler at all (process spawn and the sleeps).
func SpawnFloor(ctx context.Context, tasks, concurrency int, secs string) (float64, error) {
	sem := make(chan struct{}, max(concurrency, 1))
	errs := make(chan error, tasks)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := 0; i < tasks; i++ {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := exec.CommandContext(ctx, "sleep", secs).Run(); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	d := ms(time.Since(t0))
	close(errs)
	if err, ok := <-errs; ok {
		return 0, fmt.Errorf("sleep: %w", err)
	}
	return d, nil
}

// Slots is how many tasks of the benchmark fit on the agents at once.
func (o BadNodeOptions) Slots(agents int) int {
	if o.TaskCPUMillis <= 0 || o.TaskMemoryMB <= 0 {
		return agents
	}
	return agents * int(min(o.CPUMillis/o.TaskCPUMillis, o.MemoryMiB/o.TaskMemoryMB))
}

// BadNodeSummary aggregates the finished trials of one setup.
type BadNodeSummary struct {
	Setup string
	// N trials finished; Errors did not.
	N, Errors int
	// Sums over the trials, and their denominators.
	FailedTasks, Tasks, FailedJobs, Jobs int
	// Quarantined: trials whose bad node was quarantined; FalsePositives:
	// trials in which another node was.
	Quarantined, FalsePositives int
	// Before: attempts absorbed by the bad node before its quarantine
	// (quarantined trials only); OnBad: all its attempts; Attempts: every
	// attempt of a trial.
	Before, OnBad, Attempts Summary
	// TimeToQuarantine over quarantined trials; Wall over all.
	TimeToQuarantine, Wall Summary
	// Ratio is Wall.P50 over the control's Wall.P50 (0 without a control).
	Ratio float64
}

// MaxWallRatio is the target's bound on a setup's wall time p50 over the
// control's (issue 11: no more than 20% slower).
const MaxWallRatio = 1.2

// Misses lists what the summary misses of issue 11's target (nil: met): a
// failed task or job, a bad node not quarantined in every trial, another
// node quarantined, a wall time p50 above MaxWallRatio times the control's.
func (s BadNodeSummary) Misses() []string {
	var out []string
	if s.N == 0 {
		return []string{"no finished trial"}
	}
	if s.Errors > 0 {
		out = append(out, fmt.Sprintf("%d trial(s) did not finish", s.Errors))
	}
	if s.FailedTasks > 0 || s.FailedJobs > 0 {
		out = append(out, fmt.Sprintf("%d task(s) and %d job(s) failed", s.FailedTasks, s.FailedJobs))
	}
	if s.Setup != BadNodeControl && s.Quarantined < s.N {
		out = append(out, fmt.Sprintf("bad node quarantined in %d of %d trials", s.Quarantined, s.N))
	}
	if s.FalsePositives > 0 {
		out = append(out, fmt.Sprintf("a healthy node was quarantined in %d trial(s)", s.FalsePositives))
	}
	if s.Setup != BadNodeControl && s.Ratio > MaxWallRatio {
		out = append(out, fmt.Sprintf("wall p50 %.2f x the control's (target <= %.2f)", s.Ratio, MaxWallRatio))
	}
	return out
}

// SummarizeBadNode aggregates trials per setup, in the order of setups
// (setups without trials are left out).
func SummarizeBadNode(trials []BadNodeTrial, setups []string) []BadNodeSummary {
	var out []BadNodeSummary
	var controlP50 float64
	for _, setup := range setups {
		s := BadNodeSummary{Setup: setup}
		var before, onBad, attempts, ttq, wall []float64
		for _, t := range trials {
			if t.Setup != setup {
				continue
			}
			if t.Err != "" {
				s.Errors++
				continue
			}
			s.N++
			s.FailedTasks += t.FailedTasks
			s.Tasks += t.Tasks
			s.FailedJobs += t.FailedJobs
			s.Jobs += t.Jobs
			if t.Quarantined {
				s.Quarantined++
				before = append(before, float64(t.AttemptsOnBadBefore))
				ttq = append(ttq, t.TimeToQuarantineMs)
			}
			for _, n := range t.QuarantinedNodes {
				if n != t.BadNode {
					s.FalsePositives++
					break
				}
			}
			if t.BadNode != "" {
				onBad = append(onBad, float64(t.AttemptsOnBadTotal))
			}
			attempts = append(attempts, float64(t.AttemptsTotal))
			wall = append(wall, t.WallMs)
		}
		if s.N == 0 && s.Errors == 0 {
			continue
		}
		s.Before, s.OnBad, s.Attempts = Summarize(before), Summarize(onBad), Summarize(attempts)
		s.TimeToQuarantine, s.Wall = Summarize(ttq), Summarize(wall)
		if setup == BadNodeControl {
			controlP50 = s.Wall.P50
		}
		out = append(out, s)
	}
	if controlP50 > 0 {
		for i := range out {
			out[i].Ratio = out[i].Wall.P50 / controlP50
		}
	}
	return out
}

// BadNodeRows is the per-trial CSV (header, rows).
func BadNodeRows(trials []BadNodeTrial) ([]string, [][]string) {
	header := []string{"setup", "trial", "wall_ms", "failed_tasks", "failed_jobs", "quarantined", "time_to_quarantine_ms",
		"attempts_on_bad_before_quarantine", "attempts_on_bad_total", "attempts_total",
		"bad_node", "tasks", "api_time_to_quarantine_ms", "quarantined_nodes", "quarantine_reason", "error"}
	var rows [][]string
	for _, t := range trials {
		opt := func(ok bool, s string) string {
			if ok {
				return s
			}
			return ""
		}
		bad := t.BadNode != ""
		rows = append(rows, []string{t.Setup, strconv.Itoa(t.Trial), f1(t.WallMs), strconv.Itoa(t.FailedTasks), strconv.Itoa(t.FailedJobs),
			opt(bad, strconv.FormatBool(t.Quarantined)), opt(t.Quarantined, f1(t.TimeToQuarantineMs)),
			opt(bad, strconv.Itoa(t.AttemptsOnBadBefore)), opt(bad, strconv.Itoa(t.AttemptsOnBadTotal)), strconv.Itoa(t.AttemptsTotal),
			t.BadNode, strconv.Itoa(t.Tasks), opt(t.APITimeToQuarantineMs != 0, f1(t.APITimeToQuarantineMs)),
			strings.Join(t.QuarantinedNodes, " "), t.QuarantineReason, t.Err})
	}
	return header, rows
}

// BadNodeAttemptRows is the per-attempt CSV (header, rows).
func BadNodeAttemptRows(trials []BadNodeTrial) ([]string, [][]string) {
	header := []string{"setup", "trial", "job", "task", "attempt", "node", "on_bad_node", "before_quarantine", "assigned_ms", "assigned_rev",
		"outcome", "fault", "exit_code", "error"}
	var rows [][]string
	for _, t := range trials {
		for _, a := range t.Attempts {
			onBad := t.BadNode != "" && a.Node == t.BadNode
			before := onBad && (t.QuarantineRev == 0 || a.AssignedRev == 0 || a.AssignedRev < t.QuarantineRev)
			rows = append(rows, []string{t.Setup, strconv.Itoa(t.Trial), a.Job, strconv.Itoa(int(a.Task)), strconv.Itoa(int(a.Attempt)), a.Node,
				strconv.FormatBool(onBad), strconv.FormatBool(before), f1(a.AssignedMs), strconv.FormatInt(a.AssignedRev, 10),
				a.Outcome, a.Fault, strconv.Itoa(int(a.ExitCode)), a.Error})
		}
	}
	return header, rows
}

// BadNodeMarkdown is the summary section: the table per setup, the floors
// and what misses the target.
func BadNodeMarkdown(o BadNodeOptions, sums []BadNodeSummary, floor Summary) string {
	var b strings.Builder
	fmt.Fprintf(&b, "## badnode\n\n%d agents x %d m / %d MiB (one coordinator, the region's default quarantine policy%s); %d jobs x %d tasks of `sleep %s` (%d m, %d MiB each: %d fit at once on %d agents, %d on %d), max_attempts %d, retryable_exit_codes [75], submitted at once. "+
		"One agent misbehaves (it rotates by trial): a `sleep` script first in its PATH that exits 75 or 1, or its work dir replaced by a file after it registered (devcluster.BreakWorkDir). A fresh region per trial; setups interleaved within each round. "+
		"Observed by the harness: an etcd watch (read only) for assignments, task completion and the bad node's health record (its quarantine); GetJob, GetJobLogs and ListNodes afterwards. "+
		"Wall: submission until every task is terminal (the 3 jobs terminal). Attempts absorbed before quarantine: attempts assigned to the bad node at an etcd revision below the write that quarantined it.\n\n",
		o.Agents, o.CPUMillis, o.MemoryMiB, extraArgsText(o.ExtraArgs), o.Jobs, o.TasksPerJob, o.Sleep, o.TaskCPUMillis, o.TaskMemoryMB, o.Slots(o.Agents), o.Agents, o.Slots(o.Agents-1), o.Agents-1, o.MaxAttempts)
	b.WriteString("| setup | n | failed tasks | failed jobs | quarantined | attempts on bad before quarantine p50 / max | on bad in total p50 / max | attempts p50 | time to quarantine ms p50 / p95 / max | wall ms p50 / p95 / max | wall p50 / control p50 |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range sums {
		q, before, onBad, ttq := "-", "-", "-", "-"
		if s.Setup != BadNodeControl {
			q = fmt.Sprintf("%d/%d", s.Quarantined, s.N)
			onBad = fmt.Sprintf("%.0f / %.0f", s.OnBad.P50, s.OnBad.Max)
		}
		if s.Quarantined > 0 {
			before = fmt.Sprintf("%.0f / %.0f", s.Before.P50, s.Before.Max)
			ttq = fmt.Sprintf("%.0f / %.0f / %.0f", s.TimeToQuarantine.P50, s.TimeToQuarantine.P95, s.TimeToQuarantine.Max)
		}
		if s.FalsePositives > 0 {
			q += fmt.Sprintf(" (+%d false)", s.FalsePositives)
		}
		n := strconv.Itoa(s.N)
		if s.Errors > 0 {
			n += fmt.Sprintf(" (+%d unfinished)", s.Errors)
		}
		fmt.Fprintf(&b, "| %s | %s | %d/%d | %d/%d | %s | %s | %s | %.0f | %s | %.0f / %.0f / %.0f | %.2f |\n",
			BadNodeSetupText(s.Setup), n, s.FailedTasks, s.Tasks, s.FailedJobs, s.Jobs, q, before, onBad, s.Attempts.P50, ttq,
			s.Wall.P50, s.Wall.P95, s.Wall.Max, s.Ratio)
	}
	fmt.Fprintf(&b, "\nFloors, in the same run: the control's wall time (the ratio's denominator), and the harness spawning the %d `sleep %s` processes itself, %d at once (no scheduler): %s ms.\n\n",
		o.Jobs*int(o.TasksPerJob), o.Sleep, o.Slots(o.Agents), floor)
	var misses []string
	for _, s := range sums {
		for _, m := range s.Misses() {
			misses = append(misses, BadNodeSetupText(s.Setup)+": "+m)
		}
	}
	if len(misses) == 0 {
		b.WriteString("Target (0 failed tasks and jobs, the bad node quarantined, wall p50 <= 1.2 x the control's): met by every setup.\n\n")
	} else {
		b.WriteString("Target (0 failed tasks and jobs, the bad node quarantined, wall p50 <= 1.2 x the control's) missed:\n\n")
		for _, m := range misses {
			b.WriteString("- " + m + "\n")
		}
		b.WriteString("\n(per-trial evidence: badnode-evidence.md)\n\n")
	}
	return b.String()
}

func extraArgsText(args []string) string {
	if len(args) == 0 {
		return ""
	}
	return ", " + strings.Join(args, " ")
}

// BadNodeEvidence is the text of every trial's evidence (badnode-evidence.md).
func BadNodeEvidence(trials []BadNodeTrial) string {
	var b strings.Builder
	b.WriteString("# badnode: evidence per trial\n\n")
	for _, t := range trials {
		fmt.Fprintf(&b, "## %s, trial %d (bad node %q)\n\n", t.Setup, t.Trial, t.BadNode)
		if t.Err != "" {
			fmt.Fprintf(&b, "- did not finish: %s\n", t.Err)
		}
		fmt.Fprintf(&b, "- wall %.0f ms; failed tasks %d, jobs %d; quarantined %v at %.0f ms (revision %d); attempts on the bad node %d before, %d in total, of %d\n",
			t.WallMs, t.FailedTasks, t.FailedJobs, t.Quarantined, t.TimeToQuarantineMs, t.QuarantineRev, t.AttemptsOnBadBefore, t.AttemptsOnBadTotal, t.AttemptsTotal)
		b.WriteString(t.Evidence)
		b.WriteString("\n")
	}
	return b.String()
}

// RunBadNode runs o.Trials rounds (a spawn-floor run, then one trial of each
// setup), writes badnode.csv, badnode-attempts.csv, badnode-floor.csv and
// badnode-evidence.md to out, and returns the summary section. A trial that
// fails is recorded (its error in the CSV) and the run goes on; the error
// returned joins them.
func RunBadNode(ctx context.Context, cfg Config, o BadNodeOptions, out string) (string, error) {
	var trials []BadNodeTrial
	var floors []float64
	var floorRows [][]string
	var failures []string
	for i := 1; i <= o.Trials && ctx.Err() == nil; i++ {
		if f, err := SpawnFloor(ctx, o.Jobs*int(o.TasksPerJob), o.Slots(o.Agents), o.Sleep); err != nil {
			cfg.logf("badnode floor %d: %v", i, err)
		} else {
			floors = append(floors, f)
			floorRows = append(floorRows, []string{strconv.Itoa(i), strconv.Itoa(o.Jobs * int(o.TasksPerJob)), strconv.Itoa(o.Slots(o.Agents)), f1(f)})
			cfg.logf("badnode floor %d: %d x sleep %s, %d at once, by the harness: %.0f ms", i, o.Jobs*int(o.TasksPerJob), o.Sleep, o.Slots(o.Agents), f)
		}
		for _, setup := range o.Setups {
			if ctx.Err() != nil {
				break
			}
			t, err := BadNode(ctx, cfg, o, setup, i)
			if err != nil {
				t.Err = err.Error()
				failures = append(failures, fmt.Sprintf("%s trial %d: %v", setup, i, err))
				cfg.logf("badnode %s trial %d: %v", setup, i, err)
			} else {
				cfg.logf("badnode %s trial %d (bad %q): wall %.0f ms, failed %d tasks %d jobs, quarantined %v at %.0f ms (api %.0f ms), attempts on bad %d before / %d total of %d, quarantined nodes %v",
					setup, i, t.BadNode, t.WallMs, t.FailedTasks, t.FailedJobs, t.Quarantined, t.TimeToQuarantineMs, t.APITimeToQuarantineMs,
					t.AttemptsOnBadBefore, t.AttemptsOnBadTotal, t.AttemptsTotal, t.QuarantinedNodes)
			}
			trials = append(trials, t)
		}
	}
	h, rows := BadNodeRows(trials)
	if err := WriteCSV(filepath.Join(out, "badnode.csv"), h, rows); err != nil {
		return "", err
	}
	h, rows = BadNodeAttemptRows(trials)
	if err := WriteCSV(filepath.Join(out, "badnode-attempts.csv"), h, rows); err != nil {
		return "", err
	}
	if err := WriteCSV(filepath.Join(out, "badnode-floor.csv"), []string{"round", "tasks", "concurrency", "wall_ms"}, floorRows); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(out, "badnode-evidence.md"), []byte(BadNodeEvidence(trials)), 0o644); err != nil {
		return "", err
	}
	md := BadNodeMarkdown(o, SummarizeBadNode(trials, o.Setups), Summarize(floors))
	if len(failures) > 0 {
		return md, fmt.Errorf("badnode: %s", strings.Join(failures, "; "))
	}
	return md, ctx.Err()
}
