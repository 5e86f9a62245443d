package loadtest

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// WriteResults writes a run's raw rows (samples.csv, trials.csv), the JSON
// result, a README (command, configuration, host, caveats) and a PNG of
// submit latency over time with each fault marked, into dir.
func WriteResults(dir string, res *Result, command string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	start := time.Time{}
	if len(res.Samples) > 0 {
		start = res.Samples[0].Intended
	}
	if err := writeCSV(filepath.Join(dir, "samples.csv"), []string{"seq", "intended_ms", "latency_ms", "lag_ms", "job_id", "error"}, func(w func([]string)) {
		for _, s := range res.Samples {
			w([]string{strconv.Itoa(s.Seq), ms(s.Intended.Sub(start)), fmt.Sprintf("%.3f", s.LatencyMs()), fmt.Sprintf("%.3f", s.LagMs()), s.JobID, s.Err})
		}
	}); err != nil {
		return err
	}
	if err := writeCSV(filepath.Join(dir, "trials.csv"), []string{"trial", "fault", "target", "at_ms", "fault_to_dispatch_ms", "valid", "note"}, func(w func([]string)) {
		for _, t := range res.TrialDetails {
			w([]string{strconv.Itoa(t.N), t.Fault, t.Target, ms(t.At.Sub(start)), fmt.Sprintf("%.0f", t.FaultToDispatchMs), strconv.FormatBool(t.Valid), t.Note})
		}
	}); err != nil {
		return err
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "result.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	if err := plotLatency(filepath.Join(dir, "submit-latency.png"), res, start); err != nil {
		return err
	}
	if res.Liveness != nil {
		if err := writeCSV(filepath.Join(dir, "liveness.csv"), []string{"trial", "target", "at_ms", "valid", "note",
			"active_jobs", "spanning_tasks", "held_reports", "flush_ms", "restart_to_ready_ms", "down_ms", "tasks_killed", "killed_running", "attempts_charged",
			"old_epoch", "new_epoch", "epoch_ended_ms", "heal_to_new_epoch_ms", "replaced", "adopted", "reexecuted_effects", "stale_survivors",
			"replace_ms", "stale_kills"}, func(w func([]string)) {
			for _, t := range res.TrialDetails {
				l := t.Liveness
				if l == nil {
					continue
				}
				f := func(v float64) string { return fmt.Sprintf("%.0f", v) }
				i := strconv.Itoa
				w([]string{i(t.N), t.Target, ms(t.At.Sub(start)), strconv.FormatBool(t.Valid), t.Note,
					i(l.ActiveJobs), i(l.SpanningTasks), i(l.HeldReports), f(l.FlushMs), f(l.RestartToReadyMs), f(l.DownMs), i(l.TasksKilled), i(l.KilledRunning), i(l.AttemptsCharged),
					strconv.FormatInt(l.OldEpoch, 10), strconv.FormatInt(l.NewEpoch, 10), f(l.EpochEndedMs), f(l.HealToNewEpochMs), i(l.Replaced), i(l.Adopted),
					i(l.ReexecutedEffects), strings.Join(l.StaleSurvivors, " "), f(t.FaultToDispatchMs), i(l.StaleKills)})
			}
		}); err != nil {
			return err
		}
	}
	o := res.Config
	host, _ := os.Hostname()
	readme := fmt.Sprintf(`# loadtest %s

Command: %s

Configuration: scenario %s, %d trial(s) every %s, open-loop rate %.0f jobs/s for %s, %d task(s) per job
(each appends one ledger line, then sleeps %s), one region of %d coordinator(s) (embedded etcd, election
500 ms / heartbeat 50 ms) and %d agent(s) x %d slots, node lease %s, pause %s; all real processes on loopback.

Host: %s, %d CPUs (GOMAXPROCS %d), %s/%s. The load generator, coordinators, agents and tasks share the
same cores, so the figures are lower bounds on what separate machines would do.

| figure | value |
|---|---|
| submitted / accepted | %d / %d |
| completed / failed | %d / %d |
| lost / duplicates / sovereignty violations | %d / %d / %d |
| throughput | %.1f tasks/s |
| submit latency (from intended send time) | %s |
| schedule latency (submit to first task start) | %s |
| fault to dispatch (valid trials %d of %d) | %s |
| generator lag | %s |

Verdict: %s

Caveats: fault-to-dispatch uses agent process start times (dispatch plus process spawn); for scheduler
faults it is the first task started under the successor's epoch, for agent faults the time until every
task the node held had started again elsewhere. Files: samples.csv (one row per submission),
trials.csv, result.json, submit-latency.png.
`, o.Scenario, command, o.Scenario, o.Trials, o.TrialEvery, o.Rate, o.Duration, o.TasksPerJob, o.TaskSleep,
		o.Coordinators, o.Agents, o.Slots, o.NodeLeaseTTL, o.Pause, host, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.GOOS, runtime.GOARCH,
		res.Submitted, res.Accepted, res.Completed, res.Failed, res.Lost, res.Duplicates, res.SovereigntyViolations,
		res.ThroughputTasksPerS, q(res.SubmitLatencyMs), q(res.ScheduleLatencyMs), res.ValidTrials, res.Trials, q(res.FaultToDispatchMs), q(res.GeneratorLagMs),
		verdictLine(res.Verdict))
	if res.Liveness != nil {
		readme += livenessReadme(res)
	}
	if fs := res.Failover; fs != nil {
		if err := writeCSV(filepath.Join(dir, "failover.csv"), []string{"job_id", "home", "active", "state", "submit_ms", "moved_ms", "finish_ms"}, func(w func([]string)) {
			rel := func(v int64) string {
				if v == 0 {
					return ""
				}
				return strconv.FormatInt(v-start.UnixMilli(), 10)
			}
			for _, j := range fs.Jobs {
				w([]string{j.ID, j.Home, j.Active, j.State, rel(j.SubmitMs), rel(j.MovedMs), rel(j.FinishMs)})
			}
		}); err != nil {
			return err
		}
		if err := plotTimeline(filepath.Join(dir, "timeline.png"), res, start); err != nil {
			return err
		}
		readme += "\n## Failover of accepted jobs\n\n" + strings.Join(FailoverLines(fs), "\n\n") + `

Regions lt-a (victim) and lt-b are eu, lt-us is us; jobs alternate between preferring lt-a and lt-b, every
fourth is EU data (may fail over only to lt-b), every fifth has failover: off (the submit-latency baseline).
Each trial SIGKILLs lt-a's coordinators` + map[bool]string{true: " and agents", false: ""}[o.KillAgents] + ` for the pause, then restarts it.
First dispatch uses agent process start times (dispatch plus spawn); activation and dispatch are taken
against the harness's clock at the kill plus after (a few ms of skew between processes on one host).
Progress lag is measured by a watch on each standby's etcd. Files: failover.csv (one row per job:
home, active region, times relative to the load's start), timeline.png (jobs active per region, the
faults dashed, the moves as points).
`
	}
	return os.WriteFile(filepath.Join(dir, "README.md"), []byte(readme), 0o644)
}

// livenessReadme is the README section of a liveness scenario: its figures
// and what they rest on.
func livenessReadme(res *Result) string {
	var b strings.Builder
	b.WriteString("\n## Liveness figures\n\n")
	for _, l := range LivenessLines(res) {
		b.WriteString("- " + l + "\n")
	}
	o := res.Config
	switch Scenario(res.Scenario) {
	case OutageRegion:
		fmt.Fprintf(&b, `
How: every coordinator of the region SIGKILLed for %s while the agents run their tasks, then all restarted
at once (internal/devcluster Region.RestartCoordinators); the region is "back" when every coordinator has
written its ready file. The first outage comes %s after the load starts and the tasks sleep %s, longer than
the outage, so the tasks running at the kill started at every point of a task's life: some end during the
outage (their final reports are held by the agents: "held reports") and some run through it ("ran through
an outage"). A trial with neither proves nothing and is marked invalid. Killed: tasks with an attempt that
ended without completing (lost, failed, retry, timeout) from the kill until the next trial's kill, also
those placed after the region was back (the aftermath counts), and of them those already running at the
kill; charged: such tasks dispatched again (the attempt counter is the max_attempts budget); the agents'
stale kills are apiary_agent_stale_attempt_kills_total scraped from every agent. Flush: from the region
back until the last job of a held report was seen terminal through WatchJob on a fresh connection
(resolution: one etcd watch event plus the server's 20 ms coalescing).
The floor is the coordinators' restart-to-ready time in the same trials. The verifier also requires every
job COMPLETE and no task's work done twice (two done lines in the ledger). liveness.csv has one row per
trial.
`, o.Outage, o.FirstFault, o.TaskSleep)
	case PartitionAgent:
		fmt.Fprintf(&b, `
How: the agent running the most tasks has its gRPC traffic to the coordinators cut for %s (its
--fault-file exists: every call fails UNAVAILABLE, its assignment stream is cut; internal/faulthook), then
healed. Its serf LAN member is not cut, so the region ends its epoch when the %s lease lapses, not through
serf's suspicion (a real partition would also fail the member, in about 1 s). The agent and its tasks keep
running, unlike SIGSTOP. Tasks sleep %s, longer than the cut, so every task cut off still runs at the heal
unless it ended during the cut. Replaced: attempts of the old epoch recorded lost and run again; adopted:
attempts started before the cut that completed on the node's new epoch. A replaced attempt that ended
during the cut did its work once more than needed (re-executed effect; its fencing token is lower than the
committed one's, so a consumer can reject it); one that still finished its work more than %s after the heal
is a stale survivor, a violation (its agent should have killed it). The verifier requires every job
COMPLETE, no committed duplicate and no stale effect with a token as high as the committed one's.
liveness.csv has one row per trial.
`, o.Partition, o.NodeLeaseTTL, o.TaskSleep, staleKillBound)
	}
	return b.String()
}

// LivenessLines are the text lines of a liveness scenario's figures
// (none for other scenarios).
func LivenessLines(res *Result) []string {
	lv := res.Liveness
	if lv == nil {
		return nil
	}
	o := res.Config
	switch Scenario(res.Scenario) {
	case OutageRegion:
		return []string{
			fmt.Sprintf("outage %s x %d trials (%d valid), %d coordinator(s), tasks of %s: %d ran through an outage, %d ended during one (reports held)",
				o.Outage, res.Trials, res.ValidTrials, o.Coordinators, o.TaskSleep, lv.SpanningTasks, lv.HeldReports),
			fmt.Sprintf("tasks killed %d (target 0; %d of them running at the kill, the others placed after), attempts charged %d (target 0), agents' stale kills %d",
				lv.TasksKilled, lv.KilledRunning, lv.AttemptsCharged, lv.StaleKills),
			fmt.Sprintf("region back -> held reports committed: %s", q(lv.FlushMs)),
			fmt.Sprintf("floor: coordinator restart -> all ready: %s", q(lv.RestartToReadyMs)),
		}
	case PartitionAgent:
		return []string{
			fmt.Sprintf("partition %s (lease %s) x %d trials (%d valid), tasks of %s; gRPC cut by the agent's fault file, serf LAN not cut",
				o.Partition, o.NodeLeaseTTL, res.Trials, res.ValidTrials, o.TaskSleep),
			fmt.Sprintf("replaced attempts %d, adopted %d, committed duplicates %d, re-executed effects (finished while cut off, lower token) %d, stale survivors %d, agents' stale kills %d",
				lv.Replaced, lv.Adopted, res.Duplicates, lv.ReexecutedEffects, lv.StaleSurvivors, lv.StaleKills),
			fmt.Sprintf("cut -> epoch ended (seen by the region): %s", q(lv.EpochEndedMs)),
			fmt.Sprintf("cut -> every replaced task running elsewhere: %s", q(res.FaultToDispatchMs)),
			fmt.Sprintf("heal -> agent READY on a new epoch: %s", q(lv.HealToNewEpochMs)),
		}
	}
	return nil
}

func verdictLine(v Verdict) string {
	if v.OK() {
		return "every accepted job finished; no duplicate, no stale effect with a newer token, no sovereignty violation"
	}
	return "VIOLATIONS: " + v.Error()
}

func q(x Quantiles) string {
	if x.N == 0 {
		return "n=0"
	}
	return fmt.Sprintf("n=%d p50 %.1f ms, p95 %.1f ms, p99 %.1f ms, max %.1f ms", x.N, x.P50, x.P95, x.P99, x.Max)
}

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

func writeCSV(path string, header []string, rows func(func([]string))) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	_ = w.Write(header)
	rows(func(r []string) { _ = w.Write(r) })
	w.Flush()
	if err := w.Error(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// plotLatency draws submit latency against the intended send time, with a
// vertical line at each fault.
func plotLatency(path string, res *Result, start time.Time) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("apiary loadtest %s: submit latency (open loop, %.0f jobs/s)", res.Scenario, res.Config.Rate)
	p.X.Label.Text = "intended send time (s)"
	p.Y.Label.Text = "latency (ms)"
	pts := make(plotter.XYs, 0, len(res.Samples))
	var top float64
	for _, s := range res.Samples {
		x := s.Intended.Sub(start).Seconds()
		y := s.LatencyMs()
		pts = append(pts, plotter.XY{X: x, Y: y})
		top = max(top, y)
	}
	sc, err := plotter.NewScatter(pts)
	if err != nil {
		return err
	}
	sc.GlyphStyle.Radius = vg.Points(1.2)
	sc.GlyphStyle.Color = color.RGBA{B: 200, A: 255}
	p.Add(sc)
	for _, t := range res.TrialDetails {
		if t.At.IsZero() {
			continue
		}
		x := t.At.Sub(start).Seconds()
		l, err := plotter.NewLine(plotter.XYs{{X: x, Y: 0}, {X: x, Y: max(top, 1)}})
		if err != nil {
			return err
		}
		l.Color = color.RGBA{R: 220, A: 255}
		l.Dashes = []vg.Length{vg.Points(3), vg.Points(3)}
		p.Add(l)
	}
	p.Legend.Add("submission", sc)
	if len(res.TrialDetails) > 0 {
		p.Legend.Add(strings.ReplaceAll("fault ("+res.Scenario+")", "-", " "))
	}
	return p.Save(8*vg.Inch, 4*vg.Inch, path)
}
