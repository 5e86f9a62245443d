package loadtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"google.golang.org/grpc"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/cliconn"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/ids"
)

// Scenario names a fault to inject under load.
type Scenario string

// The scenarios. Steady injects nothing.
const (
	Steady         Scenario = "steady"
	KillScheduler  Scenario = "kill-scheduler"
	PauseScheduler Scenario = "pause-scheduler"
	KillAgent      Scenario = "kill-agent"
	PauseAgent     Scenario = "pause-agent"
	// KillRegion SIGKILLs every coordinator of one region of a federation
	// (global router + regions lt-a and lt-b in jurisdiction eu, lt-us in
	// us) and times how soon new submissions are accepted elsewhere.
	KillRegion Scenario = "kill-region"
	// PartitionAgent cuts the gRPC traffic of the agent running the most
	// tasks to its coordinators for Options.Partition, longer than its
	// lease, then heals it (the agent's --fault-file, internal/faulthook;
	// its serf LAN member is not cut). See liveness.go.
	PartitionAgent Scenario = "partition-agent"
	// OutageRegion SIGKILLs every coordinator of the region for
	// Options.Outage while the agents keep running their tasks, then
	// restarts them all at once. See liveness.go.
	OutageRegion Scenario = "outage-region"
)

// Scenarios lists the scenarios this harness runs.
var Scenarios = []Scenario{Steady, KillScheduler, PauseScheduler, KillAgent, PauseAgent, KillRegion, PartitionAgent, OutageRegion}

// Liveness reports whether s is one of issue 20's liveness scenarios
// (partition-agent, outage-region): tasks that span the fault, a done line
// in the ledger after each task's work, every agent's metrics scraped, and
// the stricter checks (every job COMPLETE; for outage-region no work done
// twice).
func (s Scenario) Liveness() bool { return s == PartitionAgent || s == OutageRegion }

// Options configure a run.
type Options struct {
	Scenario Scenario
	// Trials is the number of faults (one per TrialEvery of load).
	Trials     int
	TrialEvery time.Duration
	// Rate is submissions per second; for Steady, Duration is the load time.
	Rate     float64
	Duration time.Duration
	// Trace, if set, replays a cluster-trace-gpu-v2023 pod list instead of a
	// fixed rate (steady only): pod i is submitted at its creation time
	// scaled to fit Duration, as a one-task job whose CPU and memory are
	// scaled by SizeScale and which sleeps for its scaled lifetime (at most
	// MaxTaskSleep). TraceLimit bounds the pods replayed (default 1000).
	Trace        string
	TraceLimit   int
	SizeScale    float64
	MaxTaskSleep time.Duration
	// TasksPerJob and TaskSleep shape each job (each task appends to the
	// ledger, then sleeps).
	TasksPerJob int
	TaskSleep   time.Duration
	// Binary and WorkDir: the cluster is started as real processes there.
	Binary  string
	WorkDir string
	// Addr, if set, targets an existing region instead (steady load only;
	// its agents must run on this host so that tasks can append to the
	// ledger under WorkDir).
	Addr string
	// Coordinators (default 3 for scheduler faults, else 1), Agents
	// (default 3) and Slots per agent (default 32).
	Coordinators int
	Agents       int
	Slots        int
	// NodeLeaseTTL of the region (default 1 s); Pause is how long a paused
	// process stays stopped (default 2.5 s, longer than both leases).
	NodeLeaseTTL time.Duration
	Pause        time.Duration
	// Partition is how long partition-agent cuts the agent off (default
	// 3 s; must be longer than NodeLeaseTTL, so that its epoch ends).
	Partition time.Duration
	// Outage is how long outage-region keeps every coordinator down
	// (default 20 s, at most 10 min).
	Outage time.Duration
	// SubmitTimeout bounds one submission with its retries (default 10 s;
	// outage-region: Outage + 30 s, so that submissions sent during the
	// outage are accepted, with their request ids, once the region is back).
	SubmitTimeout time.Duration
	// FirstFault is when the first fault is injected, after the load
	// starts (default TrialEvery/3; kill-agent, pause-agent and
	// partition-agent: at least the region's failover grace of 10 s plus
	// 1 s, during which a coordinator that just started replaces nothing;
	// outage-region: TaskSleep + 2 s, so that the tasks running at the fault
	// started at every point of a task's life).
	FirstFault time.Duration
	// DrainTimeout bounds the wait for every accepted job to finish.
	DrainTimeout time.Duration
	// FailoverAfter (kill-region only) gives the jobs failover: {after}
	// and keeps the region down past it, so its in-flight jobs move
	// (failover.go); KillAgents kills the region's agents too.
	FailoverAfter time.Duration
	KillAgents    bool
	Logf          func(format string, args ...any)
	OnSample      func(Sample)
}

// regionFailoverGrace is `apiary region --failover-grace`'s default (the
// harness's regions keep it): for this long after a coordinator starts it
// replaces no task of a lost node epoch.
const regionFailoverGrace = 10 * time.Second

// Defaults fills the options' defaults (per scenario) and checks them, as
// Run does; an error names the option and the rule.
func (o *Options) Defaults() error { return o.defaults() }

func (o *Options) defaults() error {
	switch o.Scenario {
	case Steady, KillScheduler, PauseScheduler, KillAgent, PauseAgent, KillRegion, PartitionAgent, OutageRegion:
	default:
		return fmt.Errorf("scenario: must be one of %v, got %q", Scenarios, o.Scenario)
	}
	if err := o.livenessDefaults(); err != nil {
		return err
	}
	if err := o.failoverDefaults(); err != nil {
		return err
	}
	if o.Rate <= 0 && o.Trace == "" {
		return fmt.Errorf("rate: must be > 0, got %v", o.Rate)
	}
	if o.Trace != "" && o.Scenario != Steady {
		return fmt.Errorf("trace: replay runs as steady load, not with scenario %q", o.Scenario)
	}
	if o.Trace != "" {
		if o.TraceLimit == 0 {
			o.TraceLimit = 1000
		}
		if o.SizeScale == 0 {
			o.SizeScale = 0.01
		}
		if o.SizeScale < 0 || o.SizeScale > 1 {
			return fmt.Errorf("size-scale: must be in (0, 1], got %v", o.SizeScale)
		}
		if o.MaxTaskSleep == 0 {
			o.MaxTaskSleep = 5 * time.Second
		}
		if o.Rate == 0 {
			o.Rate = 1 // unused with a trace schedule
		}
	}
	if o.Addr != "" && o.Scenario != Steady {
		return fmt.Errorf("scenario: faults need a cluster the harness starts itself; with an address only %q runs", Steady)
	}
	if o.Scenario == Steady {
		if o.Duration <= 0 {
			return fmt.Errorf("duration: must be > 0 for steady load")
		}
		o.Trials = 0
	} else {
		if o.Trials < 1 || o.Trials > 200 {
			return fmt.Errorf("trials: must be in 1..200, got %d", o.Trials)
		}
		if o.TrialEvery == 0 {
			o.TrialEvery = 6 * time.Second
		}
		if o.TrialEvery < 0 {
			return fmt.Errorf("trial-every: must be > 0, got %s", o.TrialEvery)
		}
		if o.FirstFault == 0 {
			o.FirstFault = o.TrialEvery / 3
			if o.Scenario == KillAgent || o.Scenario == PauseAgent {
				// A coordinator replaces no task of a lost epoch during its
				// failover grace after it started.
				o.FirstFault = max(o.FirstFault, regionFailoverGrace+time.Second)
			}
		}
		// Load goes on for 2/3 of a trial after the last fault (TrialEvery
		// per trial when the first fault comes after a third of one), for
		// outage-region through the last outage and 10 s after it.
		o.Duration = o.FirstFault + time.Duration(o.Trials)*o.TrialEvery - o.TrialEvery/3
		if o.Scenario == OutageRegion {
			o.Duration = o.FirstFault + time.Duration(o.Trials-1)*o.TrialEvery + o.Outage + 10*time.Second
		}
	}
	if o.SubmitTimeout == 0 {
		o.SubmitTimeout = 10 * time.Second
	}
	if o.TasksPerJob == 0 {
		o.TasksPerJob = 1
	}
	if o.TaskSleep == 0 {
		o.TaskSleep = 300 * time.Millisecond
	}
	if o.Coordinators == 0 {
		o.Coordinators = 1
		if o.Scenario == KillScheduler || o.Scenario == PauseScheduler {
			o.Coordinators = 3
		}
	}
	if o.Agents == 0 {
		o.Agents = 3
	}
	if o.Slots == 0 {
		o.Slots = 32
	}
	if err := o.checkLivenessLoad(); err != nil {
		return err
	}
	if o.NodeLeaseTTL == 0 {
		o.NodeLeaseTTL = time.Second
	}
	if o.Pause == 0 {
		o.Pause = 2500 * time.Millisecond
	}
	if o.DrainTimeout == 0 {
		o.DrainTimeout = 60 * time.Second
	}
	if o.Scenario.Liveness() {
		// The last tasks run TaskSleep after the load ends.
		o.DrainTimeout = max(o.DrainTimeout, o.TaskSleep+30*time.Second)
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	return nil
}

// Quantiles are latency quantiles in milliseconds.
type Quantiles struct {
	N   int64   `json:"n"`
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

func quantiles(ms []float64) Quantiles {
	h := hdrhistogram.New(1, 3_600_000_000, 3) // µs, up to 1 h
	for _, v := range ms {
		_ = h.RecordValue(max(int64(v*1000), 1))
	}
	q := func(p float64) float64 { return float64(h.ValueAtQuantile(p)) / 1000 }
	return Quantiles{N: h.TotalCount(), P50: q(50), P95: q(95), P99: q(99), Max: float64(h.Max()) / 1000}
}

// Trial is one injected fault and what it cost.
type Trial struct {
	N      int       `json:"trial"`
	Fault  string    `json:"fault"`
	Target string    `json:"target"`
	At     time.Time `json:"at"`
	// FaultToDispatchMs: for scheduler faults, from the fault to the first
	// task started under the successor's epoch; for agent faults, from the
	// fault until every task the node held had started again elsewhere.
	FaultToDispatchMs float64 `json:"fault_to_dispatch_ms"`
	Valid             bool    `json:"valid"`
	Note              string  `json:"note,omitempty"`
	// Liveness holds the figures of partition-agent and outage-region.
	Liveness *TrialLiveness `json:"liveness,omitempty"`
	// internal: the revision just before a scheduler fault
	newEpoch int64
	node     string
	epoch    int64
	live     *trialWatch
}

// Result is a run's outcome, with stable JSON field names.
type Result struct {
	Scenario    string `json:"scenario"`
	Trials      int    `json:"trials"`
	ValidTrials int    `json:"valid_trials"`
	Submitted   int    `json:"submitted"`
	Accepted    int    `json:"accepted"`
	// Refused counts submissions the system rejected on purpose (invalid,
	// or no region could ever run them); they are not lost.
	Refused               int       `json:"refused"`
	Completed             int       `json:"completed"`
	Failed                int       `json:"failed"`
	Lost                  int       `json:"lost"`
	Duplicates            int       `json:"duplicates"`
	SovereigntyViolations int       `json:"sovereignty_violations"`
	ThroughputTasksPerS   float64   `json:"throughput_tasks_per_s"`
	SubmitLatencyMs       Quantiles `json:"submit_latency_ms"`
	ScheduleLatencyMs     Quantiles `json:"schedule_latency_ms"`
	FaultToDispatchMs     Quantiles `json:"fault_to_dispatch_ms"`
	GeneratorLagMs        Quantiles `json:"generator_lag_ms"`
	Verdict               Verdict   `json:"verdict"`
	// Liveness sums up partition-agent and outage-region (nil otherwise).
	Liveness *LivenessSummary `json:"liveness,omitempty"`
	// Failover sums up a kill-region run with failover (nil otherwise).
	Failover     *FailoverSummary `json:"failover,omitempty"`
	TrialDetails []Trial          `json:"trial_details"`
	Config       Options          `json:"-"`
	Samples      []Sample         `json:"-"`
}

const region = "lt-eu"

// Run starts a region as real processes, runs open-loop load with the
// scenario's faults, waits for every accepted job to finish, verifies the
// promises and returns the figures. It stops by itself: load and faults are
// bounded by Trials x TrialEvery (or Duration) plus DrainTimeout.
func Run(ctx context.Context, o Options) (*Result, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.WorkDir, 0o755); err != nil {
		return nil, err
	}
	ledgerPath := filepath.Join(o.WorkDir, "ledger.csv")
	if err := newLedger(ledgerPath); err != nil {
		return nil, err
	}
	var agents []devcluster.AgentSpec
	probe := &agentProbe{faults: map[string]string{}, metrics: map[string]string{}}
	for i := 0; i < o.Agents; i++ {
		as := devcluster.AgentSpec{ID: fmt.Sprintf("lt-n%d", i+1), Labels: map[string]string{"zone": fmt.Sprintf("z%d", i%3)},
			CPUMillis: int64(o.Slots) * 100, MemoryMiB: int64(o.Slots) * 64, MaxTasks: o.Slots}
		if o.Scenario.Liveness() {
			extra, err := probe.add(as.ID, filepath.Join(o.WorkDir, "faults"), o.Scenario == PartitionAgent)
			if err != nil {
				return nil, err
			}
			as.ExtraArgs = extra
		}
		agents = append(agents, as)
	}
	var r *devcluster.Region
	var fed *devcluster.Cluster
	var conn *grpc.ClientConn
	jurisdictionOf := map[string]string{region: "eu"}
	if o.Scenario == KillRegion {
		// Three regions behind a router: jobs prefer lt-a (the victim);
		// every fourth is pinned to eu, which lt-us must never run.
		var specs []devcluster.RegionSpec
		jurisdictionOf = map[string]string{"lt-a": "eu", "lt-b": "eu", "lt-us": "us"}
		for _, name := range []string{"lt-a", "lt-b", "lt-us"} {
			var ags []devcluster.AgentSpec
			for i := 0; i < o.Agents; i++ {
				ags = append(ags, devcluster.AgentSpec{ID: fmt.Sprintf("%s-n%d", name, i+1),
					CPUMillis: int64(o.Slots) * 100, MemoryMiB: int64(o.Slots) * 64, MaxTasks: o.Slots})
			}
			specs = append(specs, devcluster.RegionSpec{Name: name, Jurisdiction: jurisdictionOf[name], Coordinators: o.Coordinators,
				Agents: ags, ExtraArgs: []string{"--node-lease-ttl", o.NodeLeaseTTL.String()}})
		}
		o.Logf("starting a federation: router + regions lt-a, lt-b (eu), lt-us (us), %d agent(s) x %d slots each", o.Agents, o.Slots)
		cl, err := devcluster.Start(ctx, devcluster.Options{Binary: o.Binary, Dir: filepath.Join(o.WorkDir, "cluster"),
			Regions: specs, Global: &devcluster.GlobalSpec{}})
		if err != nil {
			return nil, err
		}
		defer cl.Stop()
		fed, r = cl, cl.Regions[0]
		if conn, err = cliconn.Dial(cl.GlobalAddr); err != nil {
			return nil, err
		}
	} else if o.Addr == "" {
		o.Logf("starting region %s: %d coordinator(s), %d agent(s) x %d slots", region, o.Coordinators, o.Agents, o.Slots)
		cl, err := devcluster.Start(ctx, devcluster.Options{Binary: o.Binary, Dir: filepath.Join(o.WorkDir, "cluster"),
			Regions: []devcluster.RegionSpec{{Name: region, Jurisdiction: "eu", Coordinators: o.Coordinators, Agents: agents,
				ExtraArgs: []string{"--node-lease-ttl", o.NodeLeaseTTL.String()}}}})
		if err != nil {
			return nil, err
		}
		defer cl.Stop()
		r = cl.Regions[0]
		if conn, err = r.Dial(); err != nil {
			return nil, err
		}
	} else {
		var err error
		if conn, err = cliconn.Dial(o.Addr); err != nil {
			return nil, err
		}
	}
	defer conn.Close()
	js := apiaryv1.NewJobServiceClient(conn)
	admin := apiaryv1.NewAdminServiceClient(conn)
	jurisdiction := "eu"
	if o.Addr != "" {
		info, err := regionInfo(ctx, admin)
		if err != nil {
			return nil, fmt.Errorf("region at %s: %w", o.Addr, err)
		}
		jurisdiction = info.GetJurisdiction()
		jurisdictionOf = map[string]string{info.GetRegion(): jurisdiction}
	}
	sleep := strconv.FormatFloat(o.TaskSleep.Seconds(), 'f', 3, 64)
	var pods []Pod
	var offsets, sleeps []time.Duration
	if o.Trace != "" {
		f, err := os.Open(o.Trace)
		if err != nil {
			return nil, fmt.Errorf("trace: %w", err)
		}
		pods, err = ReadPods(f, o.TraceLimit)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("trace %s: %w", o.Trace, err)
		}
		if len(pods) == 0 {
			return nil, fmt.Errorf("trace %s: no pods", o.Trace)
		}
		sort.SliceStable(pods, func(a, b int) bool { return pods[a].Create < pods[b].Create })
		span := pods[len(pods)-1].Create - pods[0].Create
		scale := 0.0
		if span > 0 {
			scale = o.Duration.Seconds() / float64(span)
		}
		for _, p := range pods {
			offsets = append(offsets, time.Duration(float64(p.Create-pods[0].Create)*scale*float64(time.Second)))
		}
		o.Logf("replaying %d pods of %s over %s (time x %.3g, size x %.3g)", len(pods), o.Trace, o.Duration, scale, o.SizeScale)
		for _, p := range pods {
			life := time.Duration(float64(p.Lifetime()) * scale * float64(time.Second))
			sleeps = append(sleeps, min(life, o.MaxTaskSleep))
		}
	}
	spec := func(i int) *apiaryv1.JobSpec {
		if pods != nil {
			p := pods[i]
			return &apiaryv1.JobSpec{Name: "replay-" + p.Name, Jurisdiction: jurisdiction, MaxAttempts: 10, Tasks: []*apiaryv1.TaskGroup{{
				Name: "pod", Count: 1, Command: "sh",
				Args: []string{"-c", LedgerCommand(ledgerPath) + "; sleep " + strconv.FormatFloat(sleeps[i].Seconds(), 'f', 3, 64)},
				Resources: &apiaryv1.Resources{CpuMillis: max(int64(float64(p.CPUMilli)*o.SizeScale), 1),
					MemoryMb: max(int64(float64(p.MemoryMiB)*o.SizeScale), 1)}}}}
		}
		jur := jurisdiction
		var rs *apiaryv1.RegionSpec
		if o.Scenario == KillRegion {
			jur = ""
			if i%4 == 0 {
				jur = "eu"
			}
			rs = &apiaryv1.RegionSpec{Prefer: []string{"lt-a"}}
		}
		script := LedgerCommand(ledgerPath) + "; sleep " + sleep
		if o.FailoverAfter > 0 {
			// Task k of n sleeps (k+1)/n of task-sleep: some tasks of a
			// job end before the kill (their completion is replicated and
			// not rerun), others run through it.
			script = LedgerCommand(ledgerPath) + fmt.Sprintf(`; sleep "$(awk "BEGIN{print %s*($APIARY_TASK_INDEX+1)/%d}")"`, sleep, o.TasksPerJob)
		}
		if o.Scenario.Liveness() || o.FailoverAfter > 0 {
			script += " && " + LedgerDoneCommand(ledgerPath)
		}
		s := &apiaryv1.JobSpec{Name: "loadtest", Jurisdiction: jur, Region: rs, MaxAttempts: 10, Tasks: []*apiaryv1.TaskGroup{{
			Name: "t", Count: int32(o.TasksPerJob), Command: "sh",
			Args:      []string{"-c", script},
			Resources: &apiaryv1.Resources{CpuMillis: 100, MemoryMb: 16}}}}
		if o.FailoverAfter > 0 {
			o.failoverSpec(i, s)
		}
		return s
	}
	var lw *lagWatch
	if o.FailoverAfter > 0 {
		var err error
		if lw, err = startLagWatch(ctx, fed.Regions[1:]); err != nil {
			return nil, err
		}
		defer lw.close()
	}
	res := &Result{Scenario: string(o.Scenario), Trials: o.Trials, Config: o}
	var samples []Sample
	var genErr error
	genDone := make(chan struct{})
	runID := fmt.Sprintf("%s-%d", o.Scenario, time.Now().UnixNano())
	go func() {
		defer close(genDone)
		samples, genErr = Generate(ctx, js, LoadOptions{Rate: o.Rate, Duration: o.Duration, Offsets: offsets, Spec: spec, RunID: runID,
			SubmitTimeout: o.SubmitTimeout, OnSample: o.OnSample})
	}()
	start := time.Now()
	for k := 0; k < o.Trials; k++ {
		at := start.Add(o.FirstFault + time.Duration(k)*o.TrialEvery)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Until(at)):
		}
		if o.Scenario.Liveness() {
			// The agents' stale kills since the last mark belong to the
			// previous trial.
			probe.mark(ctx, res.TrialDetails)
		}
		var tr Trial
		var err error
		switch o.Scenario {
		case KillRegion:
			tr, err = killRegion(ctx, o, fed, k+1)
		case PartitionAgent:
			tr, err = partitionAgent(ctx, o, r, admin, probe, k+1)
		case OutageRegion:
			tr, err = outageRegion(ctx, o, r, js, k+1, at.Add(o.TrialEvery-time.Second))
		default:
			tr, err = inject(ctx, o, r, admin, k+1)
		}
		if err != nil {
			tr.Note = err.Error()
			o.Logf("trial %d: %v", k+1, err)
		}
		res.TrialDetails = append(res.TrialDetails, tr)
	}
	<-genDone
	if genErr != nil {
		return nil, genErr
	}
	res.Samples = samples
	var accepted []string
	var lat, lag []float64
	for _, s := range samples {
		lat = append(lat, s.LatencyMs())
		lag = append(lag, s.LagMs())
		if s.JobID != "" {
			accepted = append(accepted, s.JobID)
		} else if strings.Contains(s.Err, "code = FailedPrecondition") || strings.Contains(s.Err, "code = InvalidArgument") {
			res.Refused++
		}
	}
	res.Submitted, res.Accepted = len(samples), len(accepted)
	res.SubmitLatencyMs, res.GeneratorLagMs = quantiles(lat), quantiles(lag)
	o.Logf("load done: %d submitted, %d accepted; waiting for them to finish", res.Submitted, res.Accepted)
	jobs := drain(ctx, js, accepted, o.DrainTimeout, o.Logf)
	f, err := os.Open(ledgerPath)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	var ledger []Effect
	if f != nil {
		ledger, err = ReadLedger(f)
		f.Close()
		if err != nil {
			return nil, err
		}
	}
	res.Verdict = VerifyWith(accepted, jobs, ledger, jurisdictionOf,
		Checks{AllComplete: o.Scenario.Liveness() || o.FailoverAfter > 0, EffectOnce: o.Scenario == OutageRegion})
	if o.Scenario.Liveness() {
		// The last trial's agent counters: after every job has finished.
		probe.closeTrial(&res.TrialDetails)
	}
	res.Completed, res.Failed = res.Verdict.Completed, res.Verdict.Failed
	res.Lost, res.Duplicates = len(res.Verdict.Lost), len(res.Verdict.Duplicates)
	res.SovereigntyViolations = len(res.Verdict.SovereigntyViolations)
	measure(res, jobs)
	switch o.Scenario {
	case KillRegion:
		measureReroute(res)
		if o.FailoverAfter > 0 {
			if err := measureFailover(ctx, res, o, fed, jobs, ledger, lw); err != nil {
				return nil, err
			}
		}
	case PartitionAgent:
		measurePartition(res, jobs, ledger, o.TaskSleep)
	case OutageRegion:
		measureOutage(res, jobs)
	}
	return res, nil
}

// measureReroute times each region kill: from the fault to the first
// submission sent after it that a region other than the victim accepted.
func measureReroute(res *Result) {
	var f2d []float64
	res.ValidTrials = 0
	for i := range res.TrialDetails {
		tr := &res.TrialDetails[i]
		if tr.At.IsZero() || (tr.Note != "" && tr.Note != "no redispatch observed") {
			continue
		}
		tr.Note = ""
		var best time.Duration = -1
		for _, s := range res.Samples {
			if s.JobID == "" || s.Sent.Before(tr.At) || ids.RegionOf(s.JobID) == tr.Target {
				continue
			}
			if d := s.Done.Sub(tr.At); best < 0 || d < best {
				best = d
			}
		}
		if best < 0 {
			tr.Note, tr.Valid = "no submission rerouted", false
			continue
		}
		tr.FaultToDispatchMs, tr.Valid = float64(best.Microseconds())/1000, true
		f2d = append(f2d, tr.FaultToDispatchMs)
		res.ValidTrials++
	}
	res.FaultToDispatchMs = quantiles(f2d)
}

// killRegion SIGKILLs every coordinator of lt-a, waits (bounded) for the
// router to route elsewhere, then restarts the region from its data dirs.
// The fault's cost is read from the samples afterwards (measureReroute).
func killRegion(ctx context.Context, o Options, fed *devcluster.Cluster, n int) (Trial, error) {
	victim := fed.Regions[0]
	tr := Trial{N: n, Fault: string(KillRegion), Target: victim.Spec.Name, At: time.Now()}
	procs := victim.Coords
	if o.KillAgents {
		procs = append(append([]*devcluster.Proc{}, victim.Coords...), victim.Agents...)
	}
	for _, p := range procs {
		if err := p.Kill(); err != nil {
			return tr, err
		}
	}
	// Stay down long enough for the pool to see the region fail (with
	// failover: past after, so that its jobs move).
	time.Sleep(o.Pause)
	if err := victim.RestartCoordinators(ctx); err != nil {
		return tr, fmt.Errorf("restart %s: %w", victim.Spec.Name, err)
	}
	if o.KillAgents {
		for _, a := range victim.Agents {
			if err := a.Start(); err != nil {
				return tr, fmt.Errorf("restart %s: %w", a.Name, err)
			}
		}
	}
	return tr, victim.WaitNodes(ctx, o.Agents)
}

// inject applies one fault and restores the process afterwards.
func inject(ctx context.Context, o Options, r *devcluster.Region, admin apiaryv1.AdminServiceClient, n int) (Trial, error) {
	tr := Trial{N: n, Fault: string(o.Scenario)}
	switch o.Scenario {
	case KillScheduler, PauseScheduler:
		info, err := regionInfo(ctx, admin)
		if err != nil {
			return tr, err
		}
		idx := -1
		for _, c := range info.GetCoordinators() {
			if c.GetScheduler() {
				for i, p := range r.Coords {
					if p.Name == c.GetId() {
						idx, tr.Target = i, c.GetId()
					}
				}
			}
		}
		if idx < 0 {
			return tr, fmt.Errorf("no scheduler to fault")
		}
		// Plans committed after this revision carry higher fencing tokens;
		// with the owner killed or paused right after it, they are the
		// successor's.
		tr.newEpoch = info.GetRevision()
		tr.At = time.Now()
		if o.Scenario == KillScheduler {
			err = r.Coords[idx].Kill()
		} else {
			err = r.Coords[idx].Pause()
		}
		if err != nil {
			return tr, err
		}
		// Wait for a successor's epoch (the fencing token of everything it
		// dispatches is above it).
		deadline := time.Now().Add(20 * time.Second)
		succeeded := false
		for time.Now().Before(deadline) && !succeeded {
			if in, err := regionInfo(ctx, admin); err == nil && in.GetSchedulerEpoch() != info.GetSchedulerEpoch() && in.GetSchedulerEpoch() != 0 {
				succeeded = true
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if o.Scenario == PauseScheduler {
			time.Sleep(max(0, o.Pause-time.Since(tr.At)))
			_ = r.Coords[idx].Resume()
		} else {
			if err := r.RestartCoordinator(ctx, idx); err != nil {
				return tr, fmt.Errorf("restart %s: %w", tr.Target, err)
			}
		}
		if !succeeded {
			return tr, fmt.Errorf("no successor within 20 s")
		}
	case KillAgent, PauseAgent:
		resp, err := admin.ListNodes(ctx, &apiaryv1.ListNodesRequest{})
		if err != nil {
			return tr, err
		}
		nodes := resp.GetNodes()
		sort.Slice(nodes, func(a, b int) bool { return nodes[a].GetRunningTasks() > nodes[b].GetRunningTasks() })
		var p *devcluster.Proc
		for _, nd := range nodes {
			if nd.GetStatus() != apiaryv1.NodeStatus_NODE_STATUS_READY || nd.GetRunningTasks() == 0 {
				continue
			}
			for _, a := range r.Agents {
				if a.Name == nd.GetId() {
					p, tr.Target, tr.node, tr.epoch = a, nd.GetId(), nd.GetId(), nd.GetEpoch()
				}
			}
			if p != nil {
				break
			}
		}
		if p == nil {
			return tr, fmt.Errorf("no agent with running tasks")
		}
		tr.At = time.Now()
		if o.Scenario == KillAgent {
			if err := p.Kill(); err != nil {
				return tr, err
			}
			// A crashed host does not come back at once: restart the agent
			// only after its lease has lapsed (node DOWN), so the reclaim
			// measured is the lease's, not a re-registration's.
			deadline := time.Now().Add(o.NodeLeaseTTL*5 + 5*time.Second)
			for time.Now().Before(deadline) && nodeReady(ctx, admin, tr.node, tr.epoch) {
				time.Sleep(20 * time.Millisecond)
			}
			time.Sleep(o.NodeLeaseTTL)
			if err := p.Start(); err != nil {
				return tr, err
			}
		} else {
			if err := p.Pause(); err != nil {
				return tr, err
			}
			time.Sleep(o.Pause)
			_ = p.Resume()
		}
		if err := r.WaitNodes(ctx, o.Agents); err != nil {
			return tr, err
		}
	}
	return tr, nil
}

func regionInfo(ctx context.Context, admin apiaryv1.AdminServiceClient) (*apiaryv1.GetRegionInfoResponse, error) {
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return admin.GetRegionInfo(cctx, &apiaryv1.GetRegionInfoRequest{})
}

// drain waits until every accepted job is terminal (or the timeout), then
// reads each back with its attempt results.
func drain(ctx context.Context, js apiaryv1.JobServiceClient, ids []string, timeout time.Duration, logf func(string, ...any)) map[string]*apiaryv1.Job {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := js.ListJobs(cctx, &apiaryv1.ListJobsRequest{Limit: 10000}, grpc.MaxCallRecvMsgSize(256<<20))
		cancel()
		if err == nil {
			open := 0
			for _, j := range resp.GetJobs() {
				switch j.GetState() {
				case apiaryv1.JobState_JOB_STATE_PENDING, apiaryv1.JobState_JOB_STATE_RUNNING:
					open++
				}
			}
			if open == 0 && len(resp.GetJobs()) >= min(len(ids), 10000) {
				break
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	out := map[string]*apiaryv1.Job{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	var failed atomic.Int64
	for _, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func(id string) {
			defer wg.Done()
			defer func() { <-sem }()
			for try := 0; try < 5; try++ {
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				g, err := js.GetJob(cctx, &apiaryv1.GetJobRequest{JobId: id})
				cancel()
				if err == nil {
					mu.Lock()
					out[id] = g.GetJob()
					mu.Unlock()
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
			failed.Add(1)
		}(id)
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		logf("%d jobs could not be read back", n)
	}
	return out
}

// measure fills throughput, schedule latency and per-trial fault costs from
// the jobs' attempt results (agent start times and fencing tokens).
func measure(res *Result, jobs map[string]*apiaryv1.Job) {
	var sched []float64
	var first, last int64
	tasks := 0
	for _, j := range jobs {
		if first == 0 || j.GetSubmitTimeMs() < first {
			first = j.GetSubmitTimeMs()
		}
		firstStart := int64(0)
		for _, t := range j.GetTasks() {
			for _, a := range t.GetAttempts() {
				if a.GetStartTimeMs() > 0 && (firstStart == 0 || a.GetStartTimeMs() < firstStart) {
					firstStart = a.GetStartTimeMs()
				}
				if a.GetOutcome() == "complete" {
					tasks++
					last = max(last, a.GetEndTimeMs())
				}
			}
		}
		if firstStart > 0 {
			sched = append(sched, float64(firstStart-j.GetSubmitTimeMs()))
		}
	}
	res.ScheduleLatencyMs = quantiles(sched)
	if last > first {
		res.ThroughputTasksPerS = float64(tasks) / (float64(last-first) / 1000)
	}
	var f2d []float64
	for i := range res.TrialDetails {
		tr := &res.TrialDetails[i]
		if tr.At.IsZero() || tr.Note != "" || res.Scenario == string(OutageRegion) {
			continue
		}
		atMs := tr.At.UnixMilli()
		var v int64 = -1
		switch res.Scenario {
		case string(KillScheduler), string(PauseScheduler):
			for _, j := range jobs {
				for _, t := range j.GetTasks() {
					for _, a := range t.GetAttempts() {
						if a.GetFencingToken() > tr.newEpoch && a.GetStartTimeMs() >= atMs && (v < 0 || a.GetStartTimeMs()-atMs < v) {
							v = a.GetStartTimeMs() - atMs
						}
					}
				}
			}
		case string(KillAgent), string(PauseAgent), string(PartitionAgent):
			for _, j := range jobs {
				for _, t := range j.GetTasks() {
					as := t.GetAttempts()
					for k, a := range as {
						if a.GetNodeId() == tr.node && a.GetNodeEpoch() == tr.epoch && a.GetOutcome() == "lost" && k+1 < len(as) {
							if d := as[k+1].GetStartTimeMs() - atMs; d > v {
								v = d
							}
						}
					}
				}
			}
		}
		if v >= 0 {
			tr.FaultToDispatchMs, tr.Valid = float64(v), true
			f2d = append(f2d, float64(v))
			res.ValidTrials++
		} else {
			tr.Note = "no redispatch observed"
		}
	}
	res.FaultToDispatchMs = quantiles(f2d)
}

// nodeReady reports whether node is READY with the given epoch.
func nodeReady(ctx context.Context, admin apiaryv1.AdminServiceClient, node string, epoch int64) bool {
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	resp, err := admin.ListNodes(cctx, &apiaryv1.ListNodesRequest{})
	if err != nil {
		return true
	}
	for _, n := range resp.GetNodes() {
		if n.GetId() == node {
			return n.GetStatus() == apiaryv1.NodeStatus_NODE_STATUS_READY && n.GetEpoch() == epoch
		}
	}
	return false
}
