package loadtest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
)

// Issue 20's liveness scenarios.
//
// partition-agent: under load, the agent running the most tasks is cut off
// from its coordinators for Options.Partition (default 3 s), longer than
// its lease (1 s), then healed. The cut is the agent's in-process fault
// hook (`apiary agent --fault-file`, internal/faulthook): while the harness
// keeps the file, every gRPC call of the agent fails with UNAVAILABLE and
// its assignment stream is cut. Its serf LAN member is not cut, so the
// region learns of the cut from the lease, not from serf. Not SIGSTOP: the
// agent and its tasks keep running, as in a real partition. Expected: the
// lease lapses, the region replaces the tasks elsewhere (jobs without
// disconnect.replace: false), and when the agent is back it registers a new
// epoch, its adoption is refused, it kills the stale attempts, and their
// reports are rejected: no committed duplicate.
//
// outage-region: under load, every coordinator of the region (3 by
// default) is SIGKILLed for Options.Outage (default 20 s) while the agents
// keep running, then all are restarted at once. Expected: no task killed,
// no attempt charged, and the reports held by the agents during the outage
// committed soon after the region is back.
//
// Tasks of both last longer than the fault (TaskSleep: partition + 5 s,
// outage x 1.5), and the first outage comes TaskSleep + 2 s after the load
// starts: then the tasks running at the fault started at every point of a
// task's life, so some end during the fault (their reports are held) and
// some run through it. With shorter tasks the figures would prove nothing.

// TrialLiveness is what one liveness trial cost.
type TrialLiveness struct {
	// outage-region: DownMs from the kill to the restart, RestartToReadyMs
	// from the restart until every coordinator is ready (the floor: the
	// region cannot take a report before), ActiveJobs not terminal just
	// before the kill.
	DownMs           float64 `json:"down_ms,omitempty"`
	RestartToReadyMs float64 `json:"restart_to_ready_ms,omitempty"`
	ActiveJobs       int     `json:"active_jobs,omitempty"`
	// SpanningTasks ran from before the kill until after the region was
	// back; HeldReports are tasks whose process ended while the region was
	// down (their final reports waited); FlushMs is from the region being
	// back (every coordinator ready) until the last job of a held report
	// was seen terminal (WatchJob).
	SpanningTasks int     `json:"spanning_tasks"`
	HeldReports   int     `json:"held_reports"`
	FlushMs       float64 `json:"flush_ms"`
	// SlowestHeld is the job whose held report was committed last.
	SlowestHeld string `json:"slowest_held,omitempty"`
	// TasksKilled: tasks with an attempt that ended without completing
	// (lost, failed, retry, timeout) from the kill until the next trial's
	// kill (or for ever): the outage and its aftermath, tasks placed after
	// the region was back included; KilledRunning: those of them whose
	// attempt was already running at the kill. AttemptsCharged: tasks
	// dispatched again after such an attempt (the attempt counter is the
	// max_attempts budget). All have target 0.
	TasksKilled     int `json:"tasks_killed"`
	KilledRunning   int `json:"killed_running"`
	AttemptsCharged int `json:"attempts_charged"`

	// partition-agent: EpochEndedMs from the cut until the region no
	// longer showed the node READY on its old epoch; HealToNewEpochMs from
	// the heal until it was READY on a new one.
	OldEpoch         int64   `json:"old_epoch,omitempty"`
	NewEpoch         int64   `json:"new_epoch,omitempty"`
	EpochEndedMs     float64 `json:"epoch_ended_ms,omitempty"`
	HealToNewEpochMs float64 `json:"heal_to_new_epoch_ms,omitempty"`
	// Replaced: attempts of the old epoch lost and run again; Adopted:
	// attempts started before the cut that completed on a later epoch of
	// the same node; ReexecutedEffects: replaced attempts that finished
	// their work anyway (while cut off); StaleSurvivors: replaced attempts
	// that finished their work more than staleKillBound after the heal,
	// when their agent should have killed them (a violation).
	Replaced          int      `json:"replaced"`
	Adopted           int      `json:"adopted"`
	ReexecutedEffects int      `json:"reexecuted_effects"`
	StaleSurvivors    []string `json:"stale_survivors,omitempty"`

	// Both: the agents' apiary_agent_stale_attempt_kills_total over the
	// trial, by reason (scraped at the trial's start and at the next one's,
	// or after the last job finished).
	StaleKills         int            `json:"stale_kills"`
	StaleKillsByReason map[string]int `json:"stale_kills_by_reason,omitempty"`
	MetricsError       string         `json:"metrics_error,omitempty"`
}

// LivenessSummary adds the trials of a liveness scenario up.
type LivenessSummary struct {
	// outage-region (target 0 for killed and charged).
	TasksKilled      int       `json:"tasks_killed"`
	KilledRunning    int       `json:"killed_running"`
	AttemptsCharged  int       `json:"attempts_charged"`
	SpanningTasks    int       `json:"spanning_tasks"`
	HeldReports      int       `json:"held_reports"`
	FlushMs          Quantiles `json:"flush_ms"`
	RestartToReadyMs Quantiles `json:"restart_to_ready_ms"`
	// partition-agent (replacement time: Result.FaultToDispatchMs).
	Replaced          int       `json:"replaced"`
	Adopted           int       `json:"adopted"`
	ReexecutedEffects int       `json:"reexecuted_effects"`
	StaleSurvivors    int       `json:"stale_survivors"`
	EpochEndedMs      Quantiles `json:"epoch_ended_ms"`
	HealToNewEpochMs  Quantiles `json:"heal_to_new_epoch_ms"`
	// Both.
	StaleKills int `json:"stale_kills"`
}

// staleKillBound is how soon after the heal a partitioned agent must have
// killed its replaced attempts (a registration and an adoption round trip,
// with room for a loaded host).
const staleKillBound = 3 * time.Second

// trialWatch is a liveness trial's raw observations, read by the measures.
type trialWatch struct {
	heal       time.Time            // partition-agent: the file removed
	back       time.Time            // outage-region: every coordinator ready
	active     []string             // outage-region: jobs not terminal before the kill
	terminalAt map[string]time.Time // outage-region: when each active job was seen terminal
	killsAt    float64              // stale kills summed at the trial's start
}

// livenessDefaults fills and checks the options of the liveness scenarios.
func (o *Options) livenessDefaults() error {
	if !o.Scenario.Liveness() {
		return nil
	}
	if o.NodeLeaseTTL == 0 {
		o.NodeLeaseTTL = time.Second
	}
	switch o.Scenario {
	case PartitionAgent:
		if o.Partition == 0 {
			o.Partition = 3 * time.Second
		}
		if o.Partition <= o.NodeLeaseTTL || o.Partition > 5*time.Minute {
			return fmt.Errorf("partition: must be longer than the node lease (%s), so that the agent's epoch ends, and at most 5m, got %s", o.NodeLeaseTTL, o.Partition)
		}
		if o.TaskSleep == 0 {
			o.TaskSleep = o.Partition + 5*time.Second
		}
		if o.TaskSleep <= o.Partition {
			return fmt.Errorf("task-sleep: must be longer than the partition (%s), so that the tasks cut off still run when it heals, got %s", o.Partition, o.TaskSleep)
		}
		if o.TrialEvery == 0 {
			o.TrialEvery = o.Partition + 9*time.Second
		}
		if o.TrialEvery < o.Partition+5*time.Second {
			return fmt.Errorf("trial-every: must be at least the partition + 5s (%s): the agent registers again between trials, got %s", o.Partition+5*time.Second, o.TrialEvery)
		}
		if o.FirstFault == 0 {
			o.FirstFault = max(o.TrialEvery/3, regionFailoverGrace+time.Second)
		}
		if o.Rate == 0 {
			o.Rate = 4
		}
	case OutageRegion:
		if o.Outage == 0 {
			o.Outage = 20 * time.Second
		}
		if o.Outage < time.Second || o.Outage > 10*time.Minute {
			return fmt.Errorf("outage: must be in 1s..10m, got %s", o.Outage)
		}
		if o.TaskSleep == 0 {
			o.TaskSleep = o.Outage * 3 / 2
		}
		if o.TaskSleep <= o.Outage {
			return fmt.Errorf("task-sleep: must be longer than the outage (%s), so that tasks run through it, got %s", o.Outage, o.TaskSleep)
		}
		if o.TrialEvery == 0 {
			o.TrialEvery = o.Outage + o.TaskSleep + 10*time.Second
		}
		if o.TrialEvery < o.Outage+o.TaskSleep {
			return fmt.Errorf("trial-every: must be at least outage + task-sleep (%s), so that the tasks of one outage have ended before the next, got %s", o.Outage+o.TaskSleep, o.TrialEvery)
		}
		if o.FirstFault == 0 {
			o.FirstFault = o.TaskSleep + 2*time.Second
		}
		if o.Rate == 0 {
			o.Rate = 3
		}
		if o.Coordinators == 0 {
			o.Coordinators = 3
		}
		if o.Slots == 0 {
			o.Slots = 64
		}
		if o.SubmitTimeout == 0 {
			o.SubmitTimeout = o.Outage + 30*time.Second
		}
	}
	return nil
}

// checkLivenessLoad refuses a rate whose tasks cannot all run at once
// (tasks left PENDING at the fault would prove nothing), and for
// partition-agent one whose tasks would not fit on the agents left when
// one is cut off (the time to replacement would measure a queue).
func (o *Options) checkLivenessLoad() error {
	running := o.Rate * o.TaskSleep.Seconds()
	switch o.Scenario {
	case OutageRegion:
		if running > float64(o.Agents*o.Slots) {
			return fmt.Errorf("rate: rate x task-sleep (%.0f tasks at once) must fit the agents' slots (%d x %d)", running, o.Agents, o.Slots)
		}
	case PartitionAgent:
		if o.Agents < 2 {
			return fmt.Errorf("agents: partition-agent needs at least 2 (the cut agent's tasks run elsewhere), got %d", o.Agents)
		}
		if running > float64((o.Agents-1)*o.Slots) {
			return fmt.Errorf("rate: rate x task-sleep (%.0f tasks at once) must fit the slots of the agents left when one is cut off (%d x %d)", running, o.Agents-1, o.Slots)
		}
	}
	return nil
}

// agentProbe holds, per agent of a liveness scenario, its fault file
// (partition-agent) and metrics URL, and sums the agents' stale-kill
// counters.
type agentProbe struct {
	faults  map[string]string // node id -> fault file
	metrics map[string]string // node id -> http://addr/metrics
	last    map[string]float64
}

// add returns the extra agent arguments of node id: a metrics address on
// loopback and, with fault, a fault file under dir (absent: no cut).
func (p *agentProbe) add(id, dir string, fault bool) ([]string, error) {
	port, err := devcluster.FreePort()
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	p.metrics[id] = "http://" + addr + "/metrics"
	args := []string{"--metrics-addr", addr}
	if fault {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		path := filepath.Join(dir, id+".cut")
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		p.faults[id] = path
		args = append(args, "--fault-file", path)
	}
	return args, nil
}

// staleKills sums apiary_agent_stale_attempt_kills_total over every agent,
// by reason.
func (p *agentProbe) staleKills(ctx context.Context) (map[string]float64, error) {
	out := map[string]float64{}
	var errs []string
	for id, url := range p.metrics {
		fams, err := scrape(ctx, url)
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", id, err))
			continue
		}
		for _, m := range fams["apiary_agent_stale_attempt_kills_total"].GetMetric() {
			reason := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" {
					reason = l.GetValue()
				}
			}
			out[reason] += m.GetCounter().GetValue()
		}
	}
	sort.Strings(errs)
	if len(errs) > 0 {
		return out, errors.New("agent metrics: " + strings.Join(errs, "; "))
	}
	return out, nil
}

// mark scrapes the counters and charges what they grew by since the last
// mark to the last trial of trials (if any).
func (p *agentProbe) mark(ctx context.Context, trials []Trial) {
	now, err := p.staleKills(ctx)
	if len(trials) > 0 {
		tl := trials[len(trials)-1].Liveness
		if tl != nil {
			if tl.StaleKillsByReason == nil {
				tl.StaleKillsByReason = map[string]int{}
			}
			for reason, v := range now {
				if d := int(v - p.last[reason]); d > 0 {
					tl.StaleKillsByReason[reason] += d
					tl.StaleKills += d
				}
			}
			if err != nil {
				tl.MetricsError = err.Error()
			}
		}
	}
	p.last = now
}

// closeTrial charges the last trial with the kills since its start.
func (p *agentProbe) closeTrial(trials *[]Trial) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p.mark(ctx, *trials)
}

// scrape reads a Prometheus text endpoint.
func scrape(ctx context.Context, url string) (map[string]*dto.MetricFamily, error) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(resp.Body)
}

// busiestAgent returns the READY agent with the most running tasks, with
// its node id and epoch.
func busiestAgent(ctx context.Context, r *devcluster.Region, admin apiaryv1.AdminServiceClient) (*devcluster.Proc, string, int64, error) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := admin.ListNodes(cctx, &apiaryv1.ListNodesRequest{})
	if err != nil {
		return nil, "", 0, err
	}
	nodes := resp.GetNodes()
	sort.Slice(nodes, func(a, b int) bool { return nodes[a].GetRunningTasks() > nodes[b].GetRunningTasks() })
	for _, nd := range nodes {
		if nd.GetStatus() != apiaryv1.NodeStatus_NODE_STATUS_READY || nd.GetRunningTasks() == 0 {
			continue
		}
		if p := r.Agent(nd.GetId()); p != nil {
			return p, nd.GetId(), nd.GetEpoch(), nil
		}
	}
	return nil, "", 0, fmt.Errorf("no agent with running tasks")
}

// nodeState returns node's status and epoch (ok false when the region did
// not answer).
func nodeState(ctx context.Context, admin apiaryv1.AdminServiceClient, node string) (apiaryv1.NodeStatus, int64, bool) {
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	resp, err := admin.ListNodes(cctx, &apiaryv1.ListNodesRequest{})
	if err != nil {
		return 0, 0, false
	}
	for _, n := range resp.GetNodes() {
		if n.GetId() == node {
			return n.GetStatus(), n.GetEpoch(), true
		}
	}
	return apiaryv1.NodeStatus_NODE_STATUS_UNSPECIFIED, 0, true
}

// partitionAgent cuts the busiest agent off for o.Partition through its
// fault file, heals it, and waits until it is READY on a new epoch.
func partitionAgent(ctx context.Context, o Options, r *devcluster.Region, admin apiaryv1.AdminServiceClient, probe *agentProbe, n int) (Trial, error) {
	tr := Trial{N: n, Fault: string(PartitionAgent), Liveness: &TrialLiveness{}, live: &trialWatch{}}
	_, node, epoch, err := busiestAgent(ctx, r, admin)
	if err != nil {
		return tr, err
	}
	path := probe.faults[node]
	if path == "" {
		return tr, fmt.Errorf("agent %s has no fault file", node)
	}
	tr.Target, tr.node, tr.epoch, tr.Liveness.OldEpoch = node, node, epoch, epoch
	defer os.Remove(path) // healed on every path
	tr.At = time.Now()
	if err := os.WriteFile(path, []byte("partitioned by apiary loadtest partition-agent\n"), 0o644); err != nil {
		return tr, fmt.Errorf("fault file: %w", err)
	}
	for time.Since(tr.At) < o.Partition && ctx.Err() == nil {
		if tr.Liveness.EpochEndedMs == 0 {
			if st, ep, ok := nodeState(ctx, admin, node); ok && (st != apiaryv1.NodeStatus_NODE_STATUS_READY || ep != epoch) {
				tr.Liveness.EpochEndedMs = float64(time.Since(tr.At).Microseconds()) / 1000
			}
		}
		time.Sleep(min(20*time.Millisecond, max(0, o.Partition-time.Since(tr.At))))
	}
	if err := os.Remove(path); err != nil {
		return tr, fmt.Errorf("heal: %w", err)
	}
	tr.live.heal = time.Now()
	deadline := tr.live.heal.Add(30 * time.Second)
	for {
		if st, ep, ok := nodeState(ctx, admin, node); ok && st == apiaryv1.NodeStatus_NODE_STATUS_READY && ep != epoch {
			tr.Liveness.NewEpoch = ep
			tr.Liveness.HealToNewEpochMs = float64(time.Since(tr.live.heal).Microseconds()) / 1000
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return tr, fmt.Errorf("%s not READY on a new epoch within 30 s of the heal (did its epoch end?)", node)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return tr, r.WaitNodes(ctx, o.Agents)
}

// outageRegion SIGKILLs every coordinator of r, restarts them all after
// o.Outage, and watches every job that was not terminal before the kill
// until it is (or until watchUntil, or TaskSleep + 30 s after the region
// is back).
func outageRegion(ctx context.Context, o Options, r *devcluster.Region, js apiaryv1.JobServiceClient, n int, watchUntil time.Time) (Trial, error) {
	tr := Trial{N: n, Fault: string(OutageRegion), Target: r.Spec.Name, Liveness: &TrialLiveness{}, live: &trialWatch{}}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	list, err := js.ListJobs(cctx, &apiaryv1.ListJobsRequest{Limit: 10000}, grpc.MaxCallRecvMsgSize(256<<20))
	cancel()
	if err != nil {
		return tr, fmt.Errorf("list jobs before the outage: %w", err)
	}
	for _, j := range list.GetJobs() {
		if !terminalState(j.GetState()) {
			tr.live.active = append(tr.live.active, j.GetId())
		}
	}
	tr.Liveness.ActiveJobs = len(tr.live.active)
	tr.At = time.Now()
	for _, p := range r.Coords {
		if err := p.Kill(); err != nil {
			return tr, err
		}
	}
	select {
	case <-ctx.Done():
		return tr, ctx.Err()
	case <-time.After(time.Until(tr.At.Add(o.Outage))):
	}
	restart := time.Now()
	if err := r.RestartCoordinators(ctx); err != nil {
		return tr, fmt.Errorf("restart the region: %w", err)
	}
	tr.live.back = time.Now()
	tr.Liveness.DownMs = float64(restart.Sub(tr.At).Microseconds()) / 1000
	tr.Liveness.RestartToReadyMs = float64(tr.live.back.Sub(restart).Microseconds()) / 1000
	// A fresh connection: the load's own may sit in gRPC's reconnect
	// backoff after the refusals of the outage.
	conn, err := r.Dial()
	if err != nil {
		return tr, err
	}
	defer conn.Close()
	until := tr.live.back.Add(o.TaskSleep + 30*time.Second)
	if !watchUntil.IsZero() && watchUntil.Before(until) {
		until = watchUntil
	}
	tr.live.terminalAt = watchTerminal(ctx, apiaryv1.NewJobServiceClient(conn), tr.live.active, until)
	return tr, r.WaitNodes(ctx, o.Agents)
}

func terminalState(s apiaryv1.JobState) bool {
	return s == apiaryv1.JobState_JOB_STATE_COMPLETE || s == apiaryv1.JobState_JOB_STATE_FAILED || s == apiaryv1.JobState_JOB_STATE_CANCELLED
}

// watchTerminal follows each job with WatchJob (reopened after errors)
// until it is terminal or until deadline, and returns when each was first
// seen terminal.
func watchTerminal(ctx context.Context, js apiaryv1.JobServiceClient, jobs []string, deadline time.Time) map[string]time.Time {
	out := map[string]time.Time{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	wctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	for _, id := range jobs {
		wg.Add(1)
		go func(id string) {
			defer wg.Done()
			for wctx.Err() == nil {
				st, err := js.WatchJob(wctx, &apiaryv1.WatchJobRequest{JobId: id})
				for err == nil {
					var m *apiaryv1.WatchJobResponse
					if m, err = st.Recv(); err == nil && terminalState(m.GetJob().GetState()) {
						mu.Lock()
						out[id] = time.Now()
						mu.Unlock()
						return
					}
				}
				select {
				case <-wctx.Done():
				case <-time.After(50 * time.Millisecond):
				}
			}
		}(id)
	}
	wg.Wait()
	return out
}

// ledgerIndex counts start and done lines per attempt ("job/task@attempt")
// and start lines per task ("job/task").
type ledgerIndex struct {
	starts, done map[string]int
	taskStarts   map[string]int
}

func indexLedger(ledger []Effect) ledgerIndex {
	ix := ledgerIndex{starts: map[string]int{}, done: map[string]int{}, taskStarts: map[string]int{}}
	for _, e := range ledger {
		k := fmt.Sprintf("%s/%d@%d", e.JobID, e.Task, e.Attempt)
		if e.Done {
			ix.done[k]++
		} else {
			ix.starts[k]++
			ix.taskStarts[fmt.Sprintf("%s/%d", e.JobID, e.Task)]++
		}
	}
	return ix
}

// killedOutcome reports whether an attempt with this outcome ran and was
// ended without completing (not refused, cancelled or drained).
func killedOutcome(outcome string) bool {
	switch outcome {
	case "lost", "failed", "retry", "timeout":
		return true
	}
	return false
}

// outageFigures measures one outage trial from the jobs read back after the
// run: killMs and backMs bound the outage (kill, every coordinator ready),
// endMs ends the trial's window (the next trial's kill; 0: none), active
// are the jobs not terminal before the kill and terminalAt when each was
// seen terminal after the region was back. It fills tl and returns a note
// when the trial proves nothing (no held report, no spanning task) or
// could not be measured.
func outageFigures(tl *TrialLiveness, jobs map[string]*apiaryv1.Job, active []string,
	terminalAt map[string]time.Time, killMs, backMs, endMs int64) string {
	var notes []string
	inWindow := func(ms int64) bool { return ms >= killMs && (endMs == 0 || ms < endMs) }
	for _, j := range jobs {
		for _, t := range j.GetTasks() {
			as := t.GetAttempts()
			killed, running, charged := false, false, false
			for k, a := range as {
				if !killedOutcome(a.GetOutcome()) || !inWindow(a.GetEndTimeMs()) {
					continue
				}
				killed = true
				running = running || (a.GetStartTimeMs() > 0 && a.GetStartTimeMs() < killMs)
				charged = charged || k+1 < len(as)
			}
			if killed {
				tl.TasksKilled++
			}
			if running {
				tl.KilledRunning++
			}
			if charged {
				tl.AttemptsCharged++
			}
		}
	}
	flush := int64(-1)
	for _, id := range active {
		j := jobs[id]
		if j == nil {
			continue
		}
		held := len(j.GetTasks()) > 0
		for _, t := range j.GetTasks() {
			as := t.GetAttempts()
			if len(as) == 0 {
				held = false
				continue
			}
			last := as[len(as)-1]
			start, end := last.GetStartTimeMs(), last.GetEndTimeMs()
			if start > 0 && start < killMs && end > backMs {
				tl.SpanningTasks++
			}
			if end >= killMs && end < backMs && start > 0 && start < killMs {
				tl.HeldReports++
			} else {
				held = false
			}
		}
		if !held {
			continue
		}
		at, ok := terminalAt[id]
		if !ok {
			notes = append(notes, "held job "+id+" not seen terminal")
			continue
		}
		if d := at.UnixMilli() - backMs; d > flush {
			flush, tl.SlowestHeld = d, id
		}
	}
	if flush >= 0 {
		tl.FlushMs = float64(flush)
	}
	if tl.HeldReports == 0 {
		notes = append(notes, "no report was held over the outage")
	}
	if tl.SpanningTasks == 0 {
		notes = append(notes, "no task ran through the outage")
	}
	return strings.Join(notes, "; ")
}

// partitionFigures measures one partition trial: node and epoch are the
// agent cut off and its epoch then, atMs the cut and healMs the heal. It
// fills tl (replaced, adopted, re-executed effects, stale survivors).
func partitionFigures(tl *TrialLiveness, jobs map[string]*apiaryv1.Job, ix ledgerIndex, node string, epoch, atMs, healMs int64, taskSleep time.Duration) {
	for id, j := range jobs {
		for _, t := range j.GetTasks() {
			as := t.GetAttempts()
			for k, a := range as {
				if a.GetNodeId() != node {
					continue
				}
				key := fmt.Sprintf("%s/%d@%d", id, t.GetIndex(), a.GetAttempt())
				switch {
				case a.GetNodeEpoch() == epoch && a.GetOutcome() == "lost" && k+1 < len(as):
					tl.Replaced++
					if ix.done[key] > 0 {
						tl.ReexecutedEffects++
						if s := a.GetStartTimeMs(); s > 0 && s+taskSleep.Milliseconds() > healMs+staleKillBound.Milliseconds() {
							tl.StaleSurvivors = append(tl.StaleSurvivors, key)
						}
					}
				case a.GetNodeEpoch() > epoch && a.GetOutcome() == "complete" && a.GetStartTimeMs() > 0 && a.GetStartTimeMs() < atMs:
					tl.Adopted++
				}
			}
		}
	}
	sort.Strings(tl.StaleSurvivors)
}

// measureOutage fills each outage trial's figures and the summary.
func measureOutage(res *Result, jobs map[string]*apiaryv1.Job) {
	sum := &LivenessSummary{}
	var flush, ready []float64
	res.ValidTrials = 0
	for i := range res.TrialDetails {
		tr := &res.TrialDetails[i]
		if tr.live == nil || tr.Liveness == nil || tr.live.back.IsZero() {
			tr.Valid = false
			continue
		}
		var endMs int64
		if i+1 < len(res.TrialDetails) && !res.TrialDetails[i+1].At.IsZero() {
			endMs = res.TrialDetails[i+1].At.UnixMilli()
		}
		note := outageFigures(tr.Liveness, jobs, tr.live.active, tr.live.terminalAt, tr.At.UnixMilli(), tr.live.back.UnixMilli(), endMs)
		tl := tr.Liveness
		sum.TasksKilled += tl.TasksKilled
		sum.KilledRunning += tl.KilledRunning
		sum.AttemptsCharged += tl.AttemptsCharged
		sum.SpanningTasks += tl.SpanningTasks
		sum.HeldReports += tl.HeldReports
		sum.StaleKills += tl.StaleKills
		ready = append(ready, tl.RestartToReadyMs)
		if tr.Note == "" {
			tr.Note = note
		}
		tr.Valid = tr.Note == ""
		if tr.Valid {
			flush = append(flush, tl.FlushMs)
			res.ValidTrials++
		}
	}
	sum.FlushMs, sum.RestartToReadyMs = quantiles(flush), quantiles(ready)
	res.Liveness = sum
}

// measurePartition fills each partition trial's figures (the replacement
// time is measure's fault-to-dispatch), the summary, and the verdict's
// stale survivors.
func measurePartition(res *Result, jobs map[string]*apiaryv1.Job, ledger []Effect, taskSleep time.Duration) {
	ix := indexLedger(ledger)
	sum := &LivenessSummary{}
	var ended, heal []float64
	res.ValidTrials = 0
	for i := range res.TrialDetails {
		tr := &res.TrialDetails[i]
		if tr.live == nil || tr.Liveness == nil || tr.live.heal.IsZero() || tr.node == "" {
			tr.Valid = false
			continue
		}
		tl := tr.Liveness
		partitionFigures(tl, jobs, ix, tr.node, tr.epoch, tr.At.UnixMilli(), tr.live.heal.UnixMilli(), taskSleep)
		sum.Replaced += tl.Replaced
		sum.Adopted += tl.Adopted
		sum.ReexecutedEffects += tl.ReexecutedEffects
		sum.StaleSurvivors += len(tl.StaleSurvivors)
		sum.StaleKills += tl.StaleKills
		res.Verdict.StaleSurvivors = append(res.Verdict.StaleSurvivors, tl.StaleSurvivors...)
		if tl.EpochEndedMs > 0 {
			ended = append(ended, tl.EpochEndedMs)
		}
		if tl.NewEpoch != 0 {
			heal = append(heal, tl.HealToNewEpochMs)
		}
		// An epoch that ended with only adopted attempts is a valid trial
		// without a replacement time.
		if tr.Note == "no redispatch observed" && tl.Adopted > 0 {
			tr.Note = ""
		}
		tr.Valid = tr.Note == "" && tl.NewEpoch != 0 && tl.Replaced+tl.Adopted > 0
		if tr.Valid {
			res.ValidTrials++
		}
	}
	sort.Strings(res.Verdict.StaleSurvivors)
	sum.EpochEndedMs, sum.HealToNewEpochMs = quantiles(ended), quantiles(heal)
	res.Liveness = sum
}
