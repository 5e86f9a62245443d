package bench

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
)

// DrainOptions configures the drain benchmark.
type DrainOptions struct {
	Coordinators int   // 3
	Jobs         int   // 20
	TasksPerJob  int32 // 100
	Agents       int   // 8
	Slots        int   // 32 (--max-tasks)
	// Agent capacity; 32 tasks x 100 m / 16 MiB fit in 3200 m / 512 MiB.
	CPUMillis, MemoryMiB int64
	Timeout              time.Duration
	// Owners is how many coordinators own shards (0: all of them); the
	// others run with --schedule=false (they serve the API and their etcd
	// member and own no shard). Fewer than Coordinators restarts the
	// region's coordinators before the submissions, as Metrics does.
	Owners int
	// Metrics restarts the region's coordinators, before the submissions,
	// each with a --metrics-addr of its own (devcluster gives every
	// coordinator the same ExtraArgs), and reads their plan counters before
	// the agents start and after the drain.
	Metrics bool
	// ExtraArgs go to every coordinator (none: the region's defaults).
	ExtraArgs []string
	// Executor is the agents' --executor ("": the agent's default, exec:
	// a process per attempt; "noop" times the control plane alone).
	Executor string
}

// DefaultDrain is issue 2's configuration.
var DefaultDrain = DrainOptions{Coordinators: 3, Jobs: 20, TasksPerJob: 100, Agents: 8, Slots: 32,
	CPUMillis: 3200, MemoryMiB: 512, Timeout: 120 * time.Second}

// DrainResult is one drain trial. Times are ms from the moment the harness
// started the first agent process (t0).
type DrainResult struct {
	Trial int
	Tasks int
	// FirstReady/LastReady: an agent's node alive key appeared (registered,
	// READY) as seen by the watch.
	FirstReadyMs, LastReadyMs float64
	// FirstAssign: first task ASSIGNED; FirstComplete: first COMPLETE.
	FirstAssignMs, FirstCompleteMs float64
	// Done: the last of the tasks reached COMPLETE.
	DoneMs float64
	// Extra dispatches beyond one per task (refusals, retries, losses).
	ExtraAttempts int
	Failed        int
	// PendingTasks as seen by GetRegionInfo before the agents started.
	PendingBefore int32
	// Timeline counts state transitions per 100 ms bin from t0:
	// [assigned, running, complete].
	Timeline [][3]int
	// CPU seconds (user+sys, children included) from t0 to done, read from
	// /proc: all coordinators together, all agents (and their tasks).
	CoordCPU, AgentCPU float64
	// PendingRewrites counts writes of task records that stay PENDING
	// (the scheduler recording a new unplaced reason); Reasons samples them.
	PendingRewrites int
	Reasons         []string
	// Events are every task state change seen: ms from t0, etcd revision,
	// state, node.
	Events []DrainEvent
	// Owners is the number of coordinators that owned shards.
	Owners int
	// With Metrics: the growth during the drain, summed over the
	// coordinators, of apiary_plan_conflicts_total (plan Txns whose
	// compares failed), apiary_plan_requeues_total and
	// apiary_placements_total; PerCoord the same per coordinator id.
	Conflicts, Requeues, Placements float64
	PerCoord                        map[string][3]float64
	// PlanTxns is the plan Txns that committed: the distinct revisions at
	// which the watch saw a task written ASSIGNED.
	PlanTxns int
	// ForeignCPU is the share of the machine's CPUs used by processes
	// outside the harness's tree from t0 to done (0 when quiet).
	ForeignCPU float64
}

// planCounters are the plan counters read from each coordinator's /metrics:
// conflicts, requeues, placements (DrainResult.PerCoord's order).
var planCounters = []string{"apiary_plan_conflicts_total", "apiary_plan_requeues_total", "apiary_placements_total"}

// ConflictsPerPlan is the share of plan Txns that failed their compares:
// conflicts / (committed + conflicts).
func (r DrainResult) ConflictsPerPlan() float64 {
	return ratio(r.Conflicts, float64(r.PlanTxns)+r.Conflicts)
}

// ConflictsPerPlacement is conflicts per committed placement.
func (r DrainResult) ConflictsPerPlacement() float64 { return ratio(r.Conflicts, r.Placements) }

// restartWith SIGKILLs every coordinator of r, appends extra[i] to
// coordinator i's arguments and starts them all again from their data dirs
// (Region.RestartCoordinators). A kill, not SIGTERM: the last members to
// stop gracefully wait for a quorum that has gone (7 s measured); the
// killed sessions' owner keys expire with their leases instead (about 2.5 s
// after the restart; the caller waits for the region to settle).
func restartWith(ctx context.Context, r *devcluster.Region, extra [][]string) error {
	for _, p := range r.Coords {
		if err := p.Kill(); err != nil {
			return err
		}
	}
	for i, p := range r.Coords {
		p.Args = append(slices.Clone(p.Args), extra[i]...)
	}
	return r.RestartCoordinators(ctx)
}

// scrapePlan reads planCounters from every coordinator's metrics address.
func scrapePlan(ids, addrs []string) (map[string][3]float64, error) {
	out := map[string][3]float64{}
	for i, a := range addrs {
		if err := metricsUp(a); err != nil {
			return nil, err
		}
		var v [3]float64
		for j, name := range planCounters {
			v[j] = metricSum(a, name)
		}
		out[ids[i]] = v
	}
	return out, nil
}

// DrainEvent is one task state change.
type DrainEvent struct {
	AtMs  float64
	Rev   int64
	State apiaryv1.TaskState
	Node  string
}

// FromFirstReadyMs is the drain time measured from the first READY agent.
func (r DrainResult) FromFirstReadyMs() float64 { return r.DoneMs - r.FirstReadyMs }

// Drain runs one drain trial on a fresh region.
func Drain(ctx context.Context, cfg Config, o DrainOptions, trial int) (DrainResult, error) {
	owners := o.Owners
	if owners == 0 {
		owners = o.Coordinators
	}
	res := DrainResult{Trial: trial, Tasks: o.Jobs * int(o.TasksPerJob), Owners: owners}
	dir := filepath.Join(cfg.WorkDir, fmt.Sprintf("drain-%downers-%d", owners, trial))
	cl, r, err := startRegion(ctx, cfg, dir, o.Coordinators, nil, o.ExtraArgs)
	if err != nil {
		return res, err
	}
	defer cl.Stop()
	// After the agents have stopped, the region is thrown away: SIGKILL
	// its coordinators rather than wait for their graceful stops (the last
	// ones wait for a quorum that has gone).
	defer func() {
		for _, p := range r.Coords {
			_ = p.Kill()
		}
	}()
	var ids, metricAddrs []string
	for _, p := range r.Coords {
		ids = append(ids, p.Name)
	}
	if o.Metrics || owners < o.Coordinators {
		extra := make([][]string, len(r.Coords))
		for i := range r.Coords {
			if o.Metrics {
				port, err := devcluster.FreePort()
				if err != nil {
					return res, err
				}
				metricAddrs = append(metricAddrs, fmt.Sprintf("127.0.0.1:%d", port))
				extra[i] = append(extra[i], "--metrics-addr", metricAddrs[i])
			}
			if i >= owners {
				extra[i] = append(extra[i], "--schedule=false")
			}
		}
		if err := restartWith(ctx, r, extra); err != nil {
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
	count, err := shardCount(ctx, admin)
	if err != nil {
		return res, err
	}
	if _, err := waitSettled(ctx, cli, count, owners, 60*time.Second); err != nil {
		return res, err
	}

	// Submit every job before any agent exists.
	var wg sync.WaitGroup
	errs := make(chan error, o.Jobs)
	for j := 0; j < o.Jobs; j++ {
		wg.Add(1)
		go func(j int) {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			_, err := js.SubmitJob(sctx, &apiaryv1.SubmitJobRequest{Spec: trueJob(fmt.Sprintf("drain-%d", j), o.TasksPerJob),
				ClientId: "bench-drain", RequestId: fmt.Sprintf("t%d-j%d", trial, j)})
			errs <- err
		}(j)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return res, fmt.Errorf("submit: %w", err)
		}
	}
	// Quiesce: every task is stored PENDING. With no ready node the
	// scheduler writes nothing (GetJob explains "no ready nodes"), so the
	// region is idle once the submissions are in.
	var startRev int64
	if err := waitFor(ctx, 60*time.Second, "tasks stored pending", func() (bool, error) {
		gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		resp, err := cli.Get(gctx, prefTasks, clientv3.WithPrefix())
		if err != nil {
			return false, err
		}
		n := 0
		for _, kv := range resp.Kvs {
			if t, ok := decodeTask(kv.Value); ok && t.State == apiaryv1.TaskState_TASK_STATE_PENDING {
				n++
			}
		}
		startRev = resp.Header.Revision
		return n == res.Tasks, fmt.Errorf("%d of %d", n, res.Tasks)
	}); err != nil {
		return res, err
	}
	if info, err := admin.GetRegionInfo(ctx, &apiaryv1.GetRegionInfoRequest{}); err == nil {
		res.PendingBefore = info.GetPendingTasks()
	}

	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	tasksW := cli.Watch(wctx, prefTasks, clientv3.WithPrefix(), clientv3.WithRev(startRev+1))
	nodesW := cli.Watch(wctx, prefNodes, clientv3.WithPrefix(), clientv3.WithRev(startRev+1))

	var coordPids []int
	for _, p := range r.Coords {
		coordPids = append(coordPids, p.Pid())
	}
	var before map[string][3]float64
	if o.Metrics {
		if before, err = scrapePlan(ids, metricAddrs); err != nil {
			return res, err
		}
	}
	coordCPU0 := cpuSeconds(coordPids...)
	host0 := readHostCPU()
	t0 := time.Now()
	var agents []*agentProc
	defer func() {
		var wg sync.WaitGroup
		for _, a := range agents {
			wg.Add(1)
			go func(a *agentProc) { defer wg.Done(); a.stop() }(a)
		}
		wg.Wait()
	}()
	for i := 0; i < o.Agents; i++ {
		var extra []string
		if o.Executor != "" {
			extra = []string{"--executor", o.Executor}
		}
		a, err := startAgent(cfg, dir, r.Addr(), fmt.Sprintf("agent-%d", i+1), o.CPUMillis, o.MemoryMiB, o.Slots, extra...)
		if err != nil {
			return res, err
		}
		agents = append(agents, a)
	}
	state := map[string]apiaryv1.TaskState{}
	complete, failed := 0, 0
	ready := 0
	timeout := time.NewTimer(o.Timeout)
	defer timeout.Stop()
	for complete+failed < res.Tasks {
		select {
		case <-timeout.C:
			return res, fmt.Errorf("drain: %d of %d tasks complete after %s", complete, res.Tasks, o.Timeout)
		case wr, ok := <-nodesW:
			if !ok || wr.Err() != nil {
				return res, fmt.Errorf("nodes watch ended: %v", wr.Err())
			}
			at := ms(time.Since(t0))
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypePut && strings.HasSuffix(string(ev.Kv.Key), "/alive") && ev.IsCreate() {
					ready++
					if ready == 1 {
						res.FirstReadyMs = at
					}
					if ready == o.Agents {
						res.LastReadyMs = at
					}
				}
			}
		case wr, ok := <-tasksW:
			if !ok || wr.Err() != nil {
				return res, fmt.Errorf("tasks watch ended: %v", wr.Err())
			}
			at := ms(time.Since(t0))
			bin := int(at / 100)
			for len(res.Timeline) <= bin {
				res.Timeline = append(res.Timeline, [3]int{})
			}
			for _, ev := range wr.Events {
				if ev.Type != clientv3.EventTypePut {
					continue
				}
				t, ok := decodeTask(ev.Kv.Value)
				if !ok {
					continue
				}
				k := string(ev.Kv.Key)
				prev := state[k]
				if prev == t.State {
					if t.State == apiaryv1.TaskState_TASK_STATE_PENDING {
						res.PendingRewrites++
						if len(res.Reasons) < 5 && !slices.Contains(res.Reasons, t.UnplacedReason) {
							res.Reasons = append(res.Reasons, t.UnplacedReason)
						}
					}
					continue
				}
				state[k] = t.State
				res.Events = append(res.Events, DrainEvent{AtMs: at, Rev: ev.Kv.ModRevision, State: t.State, Node: t.NodeID})
				switch t.State {
				case apiaryv1.TaskState_TASK_STATE_ASSIGNED:
					if res.FirstAssignMs == 0 {
						res.FirstAssignMs = at
					}
					res.Timeline[bin][0]++
				case apiaryv1.TaskState_TASK_STATE_RUNNING:
					res.Timeline[bin][1]++
				case apiaryv1.TaskState_TASK_STATE_COMPLETE:
					complete++
					res.Timeline[bin][2]++
					if complete == 1 {
						res.FirstCompleteMs = at
					}
				case apiaryv1.TaskState_TASK_STATE_FAILED, apiaryv1.TaskState_TASK_STATE_CANCELLED:
					failed++
				}
			}
			res.DoneMs = at
		}
	}
	res.Failed = failed
	res.ForeignCPU = foreignShare(host0, readHostCPU())
	res.CoordCPU = cpuSeconds(coordPids...) - coordCPU0
	var agentPids []int
	for _, a := range agents {
		agentPids = append(agentPids, a.cmd.Process.Pid)
	}
	res.AgentCPU = cpuSeconds(agentPids...) // agents started at t0
	if o.Metrics {
		after, err := scrapePlan(ids, metricAddrs)
		if err != nil {
			return res, err
		}
		res.PerCoord = map[string][3]float64{}
		for _, id := range ids {
			var d [3]float64
			for j := range d {
				d[j] = after[id][j] - before[id][j]
			}
			res.PerCoord[id] = d
			res.Conflicts += d[0]
			res.Requeues += d[1]
			res.Placements += d[2]
		}
	}
	revs := map[int64]bool{}
	for _, e := range res.Events {
		if e.State == apiaryv1.TaskState_TASK_STATE_ASSIGNED {
			revs[e.Rev] = true
		}
	}
	res.PlanTxns = len(revs)
	// Cross-check through the API: every job COMPLETE; count dispatches.
	lresp, err := js.ListJobs(ctx, &apiaryv1.ListJobsRequest{Limit: 1000})
	if err != nil {
		return res, err
	}
	for _, j := range lresp.GetJobs() {
		g, err := js.GetJob(ctx, &apiaryv1.GetJobRequest{JobId: j.GetId()})
		if err != nil {
			return res, err
		}
		if g.GetJob().GetState() != apiaryv1.JobState_JOB_STATE_COMPLETE {
			return res, fmt.Errorf("job %s is %s after drain", j.GetId(), g.GetJob().GetState())
		}
		for _, t := range g.GetJob().GetTasks() {
			res.ExtraAttempts += int(t.GetAttempt()) - 1
		}
	}
	return res, nil
}

// DrainOwnersRun is the drain trials of one round: a spawn floor, then one
// trial per owner count.
type DrainOwnersRun struct {
	Round int
	// FloorMs: the harness spawning the drain's tasks itself (`sleep 0`,
	// as many at once as the agents have slots): the drain with no
	// scheduler at all.
	FloorMs float64
	Trials  []DrainResult
}

// DrainOwners runs trials rounds; each measures the spawn floor, then
// drains with 3 owners and with 1 (the order alternating from round to
// round, so machine drift hits both), every trial with Metrics. Without
// schedFlag (the binary has no `region --schedule`) it drains with
// o.Coordinators owners only. A failed trial is logged and left out; the
// first error is returned after the others ran.
func DrainOwners(ctx context.Context, cfg Config, o DrainOptions, trials int, schedFlag bool) ([]DrainOwnersRun, error) {
	configs := []int{o.Coordinators}
	if schedFlag {
		configs = []int{o.Coordinators, 1}
	}
	var runs []DrainOwnersRun
	var firstErr error
	n := 0
	for round := 1; round <= trials && ctx.Err() == nil; round++ {
		run := DrainOwnersRun{Round: round}
		floor, err := SpawnFloor(ctx, o.Jobs*int(o.TasksPerJob), o.Agents*o.Slots, "0")
		if err != nil {
			return runs, fmt.Errorf("spawn floor: %w", err)
		}
		run.FloorMs = floor
		cfg.logf("drain round %d: floor %d x sleep 0, %d at once, by the harness: %.0f ms", round, o.Jobs*int(o.TasksPerJob), o.Agents*o.Slots, floor)
		order := slices.Clone(configs)
		if round%2 == 0 {
			slices.Reverse(order)
		}
		for _, owners := range order {
			if ctx.Err() != nil {
				break
			}
			n++
			oo := o
			oo.Owners, oo.Metrics = owners, true
			r, err := Drain(ctx, cfg, oo, n)
			if err != nil {
				cfg.logf("drain %d owners, trial %d: %v", owners, n, err)
				if firstErr == nil {
					firstErr = fmt.Errorf("drain %d owners, trial %d: %w", owners, n, err)
				}
				continue
			}
			cfg.logf("drain %d owners, trial %d: %d tasks done %.0f ms after agent start (%.0f after first READY); plan Txns %d, conflicts %.0f (%.3f per plan Txn, %.4f per placement), requeues %.0f, placements %.0f, extra dispatches %d; coordinator cpu %.1f s",
				owners, n, r.Tasks, r.DoneMs, r.FromFirstReadyMs(), r.PlanTxns, r.Conflicts, r.ConflictsPerPlan(), r.ConflictsPerPlacement(), r.Requeues, r.Placements, r.ExtraAttempts, r.CoordCPU)
			cfg.logf("drain %d owners, trial %d: other processes' CPU share %.2f", owners, n, r.ForeignCPU)
			run.Trials = append(run.Trials, r)
		}
		runs = append(runs, run)
	}
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	return runs, firstErr
}

// WriteDrainOwners writes drain-owners.csv and the PNGs drain-time.png and
// drain-conflicts.png to out and returns the summary's markdown section.
func WriteDrainOwners(out string, o DrainOptions, runs []DrainOwnersRun, schedFlag bool) (string, error) {
	var rows [][]string
	var all []DrainResult
	var floors []float64
	for _, run := range runs {
		floors = append(floors, run.FloorMs)
		for _, r := range run.Trials {
			all = append(all, r)
			var per []string
			for _, id := range slices.Sorted(maps.Keys(r.PerCoord)) {
				v := r.PerCoord[id]
				per = append(per, fmt.Sprintf("%s:%.0f/%.0f/%.0f", id, v[0], v[1], v[2]))
			}
			rows = append(rows, []string{strconv.Itoa(run.Round), strconv.Itoa(r.Trial), strconv.Itoa(r.Owners), strconv.Itoa(r.Tasks),
				f1(r.FirstReadyMs), f1(r.LastReadyMs), f1(r.FirstAssignMs), f1(r.DoneMs), f1(r.FromFirstReadyMs()), f1(run.FloorMs),
				strconv.Itoa(r.PlanTxns), f1(r.Conflicts), f1(r.Requeues), f1(r.Placements),
				strconv.FormatFloat(r.ConflictsPerPlan(), 'f', 4, 64), strconv.FormatFloat(r.ConflictsPerPlacement(), 'f', 5, 64),
				strconv.Itoa(r.ExtraAttempts), strconv.Itoa(r.Failed), strconv.Itoa(r.PendingRewrites), f1(r.CoordCPU), f1(r.AgentCPU),
				strconv.FormatFloat(r.ForeignCPU, 'f', 3, 64), strings.Join(per, " ")})
		}
	}
	if err := WriteCSV(filepath.Join(out, "drain-owners.csv"), []string{"round", "trial", "owners", "tasks",
		"first_ready_ms", "last_ready_ms", "first_assign_ms", "done_ms", "done_from_first_ready_ms", "spawn_floor_ms",
		"plan_txns", "plan_conflicts", "plan_requeues", "placements", "conflicts_per_plan_txn", "conflicts_per_placement",
		"extra_dispatches", "failed", "pending_rewrites", "coord_cpu_s", "agent_cpu_s", "foreign_cpu_share", "per_coordinator_conflicts_requeues_placements"}, rows); err != nil {
		return "", err
	}
	configs := []int{o.Coordinators}
	if schedFlag {
		configs = []int{o.Coordinators, 1}
	}
	by := func(owners int) []DrainResult {
		return slices.DeleteFunc(slices.Clone(all), func(r DrainResult) bool { return r.Owners != owners })
	}
	col := func(rs []DrainResult, f func(DrainResult) float64) []float64 {
		var xs []float64
		for _, r := range rs {
			xs = append(xs, f(r))
		}
		return xs
	}
	trial := func(r DrainResult) int { return r.Trial }
	done := func(r DrainResult) float64 { return r.DoneMs }
	fromReady := func(r DrainResult) float64 { return r.FromFirstReadyMs() }
	perPlan := func(r DrainResult) float64 { return r.ConflictsPerPlan() }
	perPlacement := func(r DrainResult) float64 { return r.ConflictsPerPlacement() }
	if len(all) > 0 {
		var ts, cs []plotSeries
		for _, c := range configs {
			rs := by(c)
			ts = append(ts, plotSeries{fmt.Sprintf("%d owner(s): from agent start", c), pointsOf(rs, trial, done, nil)},
				plotSeries{fmt.Sprintf("%d owner(s): from first READY", c), pointsOf(rs, trial, fromReady, nil)})
			cs = append(cs, plotSeries{fmt.Sprintf("%d owner(s): per plan Txn", c), pointsOf(rs, trial, perPlan, nil)},
				plotSeries{fmt.Sprintf("%d owner(s): per placement", c), pointsOf(rs, trial, perPlacement, nil)})
		}
		if err := savePlot(filepath.Join(out, "drain-time.png"), fmt.Sprintf("drain of %d tasks: 1 vs %d shard owners", o.Jobs*int(o.TasksPerJob), o.Coordinators),
			"trial", "ms until every task COMPLETE", ts, []refLine{{"spawn floor p50 (harness, no scheduler)", Summarize(floors).P50}}); err != nil {
			return "", err
		}
		if err := savePlot(filepath.Join(out, "drain-conflicts.png"), "plan conflicts during the drain (apiary_plan_conflicts_total)",
			"trial", "conflicts per committed+conflicting plan Txn / per placement", cs, nil); err != nil {
			return "", err
		}
	}

	var b strings.Builder
	fmt.Fprintf(&b, "## drain: 1 against %d shard owners\n\n", o.Coordinators)
	if !schedFlag {
		b.WriteString("**The binary has no `apiary region --schedule` flag yet: only the 3-owner drain was measured.**\n\n")
	}
	fmt.Fprintf(&b, "%d jobs x %d tasks of /bin/true (100 m, 16 MiB each) submitted to a fresh %d-member region (defaults: election 500 ms, heartbeat 50 ms) before any agent; "+
		"then %d agents x %d slots start together (t0); done = every task COMPLETE (harness etcd watch). Before the submissions every coordinator is restarted with a --metrics-addr of its own "+
		"(and, for 1 owner, all but the first with --schedule=false: they serve the API and their etcd member and own no shard), and the harness waits until every shard is on its rendezvous owner. "+
		"Plan counters (apiary_plan_conflicts_total, apiary_plan_requeues_total, apiary_placements_total) are read from every coordinator's /metrics before t0 and after the drain; "+
		"committed plan Txns are the distinct revisions at which the watch saw tasks written ASSIGNED, so conflicts per plan Txn = conflicts / (committed + conflicts). "+
		"%d round(s), each: the spawn floor, then one trial per owner count, the order alternating from round to round. Cells: n: p50 / p95 / max, or median [min-max].\n\n",
		o.Jobs, o.TasksPerJob, o.Coordinators, o.Agents, o.Slots, len(runs))
	if len(o.ExtraArgs) > 0 {
		fmt.Fprintf(&b, "Coordinators ran with `%s`.\n\n", strings.Join(o.ExtraArgs, " "))
	}
	b.WriteString("| owners | drain ms from agent start | from first READY | plan Txns committed | conflicts | conflicts per plan Txn | conflicts per 1,000 placements | requeues | placements | extra dispatches | coordinator CPU s |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	med := func(xs []float64, prec int) string {
		if len(xs) == 0 {
			return "-"
		}
		s := Summarize(xs)
		return fmt.Sprintf("%s [%s-%s]", strconv.FormatFloat(s.P50, 'f', prec, 64), strconv.FormatFloat(s.Min, 'f', prec, 64), strconv.FormatFloat(s.Max, 'f', prec, 64))
	}
	for _, c := range configs {
		rs := by(c)
		fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", c, dist(col(rs, done)), dist(col(rs, fromReady)),
			med(col(rs, func(r DrainResult) float64 { return float64(r.PlanTxns) }), 0), med(col(rs, func(r DrainResult) float64 { return r.Conflicts }), 0),
			med(col(rs, perPlan), 3), med(col(rs, func(r DrainResult) float64 { return 1000 * r.ConflictsPerPlacement() }), 1),
			med(col(rs, func(r DrainResult) float64 { return r.Requeues }), 0), med(col(rs, func(r DrainResult) float64 { return r.Placements }), 0),
			med(col(rs, func(r DrainResult) float64 { return float64(r.ExtraAttempts) }), 0), med(col(rs, func(r DrainResult) float64 { return r.CoordCPU }), 1))
	}
	floor := Summarize(floors)
	fmt.Fprintf(&b, "\nFloor, same run: the harness spawning the %d tasks itself (`sleep 0`, %d at once, no scheduler), once per round: %s ms.\n",
		o.Jobs*int(o.TasksPerJob), o.Agents*o.Slots, dist(floors))
	for _, c := range configs {
		d := Summarize(col(by(c), done))
		fmt.Fprintf(&b, "- %d owner(s): drain p50 %s ms = %.2fx the spawn floor's p50.\n", c, thousands(d.P50), ratio(d.P50, floor.P50))
	}
	if len(configs) == 2 {
		d3, d1 := Summarize(col(by(configs[0]), done)), Summarize(col(by(1), done))
		fmt.Fprintf(&b, "- 1 owner / %d owners, drain p50: %.2fx.\n", configs[0], ratio(d1.P50, d3.P50))
	}
	foreign := Summarize(col(all, func(r DrainResult) float64 { return 100 * r.ForeignCPU }))
	fmt.Fprintf(&b, "\nProcesses outside the harness's tree (other work on this shared machine) used p50 %.1f%% / max %.1f%% of the CPUs during the drains (foreign_cpu_share in drain-owners.csv).\n", foreign.P50, foreign.Max)
	b.WriteString("\nPNGs: drain-time.png (per trial, with the spawn floor), drain-conflicts.png (conflicts per plan Txn and per placement). Per-coordinator counter growth (conflicts/requeues/placements) is the last column of drain-owners.csv.\n\n")
	b.WriteString("Caveats: 2 shared vCPUs run the harness, 3 coordinators with their etcd members, 8 agents and 2,000 task processes: the drain is CPU-bound, so it measures the machine as much as the scheduler; " +
		"n is small (see the table); no counter of scheduling rounds exists, so conflicts are given per plan Txn (one etcd Txn of at most a few nodes' placements) and per placement; " +
		"the restart before the submissions (for --metrics-addr) makes every trial's coordinators fresh processes with an empty cache rebuilt from etcd.\n\n")
	return b.String(), nil
}
