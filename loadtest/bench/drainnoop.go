package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"gonum.org/v1/plot/plotter"
)

// DrainNoop (issue 16): the drain of issue 2 with real agents running
// /bin/true against the same drain on agents started with `--executor
// noop` (no process: the control plane alone), rounds alternating, and the
// harness's bare-spawn floor measured in every round.

// DrainNoopOptions configures DrainNoop.
type DrainNoopOptions struct {
	// Drain is the workload (DefaultDrain: 20 jobs x 100 tasks, 8 agents x
	// 32 slots, 3 coordinators); its Executor is set per trial.
	Drain DrainOptions
	// Runs is the rounds; each runs the floor, then one drain per
	// executor, the order alternating from round to round.
	Runs int
	// FloorTasks processes spawned by the harness, FloorConcurrency at
	// once (SpawnFloor of `sleep 0`).
	FloorTasks, FloorConcurrency int
}

// DefaultDrainNoop is issue 16's configuration: 3 rounds; the floor is
// 2,000 spawns, 32 at once.
var DefaultDrainNoop = DrainNoopOptions{Drain: DefaultDrain, Runs: 3, FloorTasks: 2000, FloorConcurrency: 32}

// DrainNoopRound is one round: the floor (ms), and the drain with each
// executor (nil when that trial failed).
type DrainNoopRound struct {
	Round      int
	FloorMs    float64
	Exec, Noop *DrainResult
	// NoopFirst: the noop drain ran first in this round.
	NoopFirst bool
}

// DrainNoop runs o.Runs rounds (see DrainNoopRound). A failed trial is
// logged and left out; the first error is returned after the others ran.
func DrainNoop(ctx context.Context, cfg Config, o DrainNoopOptions) ([]DrainNoopRound, error) {
	var rounds []DrainNoopRound
	var firstErr error
	n := 0
	for round := 1; round <= o.Runs && ctx.Err() == nil; round++ {
		rd := DrainNoopRound{Round: round, NoopFirst: round%2 == 0}
		floor, err := SpawnFloor(ctx, o.FloorTasks, o.FloorConcurrency, "0")
		if err != nil {
			return rounds, fmt.Errorf("spawn floor: %w", err)
		}
		rd.FloorMs = floor
		cfg.logf("drain-noop round %d: floor %d x sleep 0, %d at once, by the harness: %.0f ms", round, o.FloorTasks, o.FloorConcurrency, floor)
		order := []string{"exec", "noop"}
		if rd.NoopFirst {
			order = []string{"noop", "exec"}
		}
		for _, ex := range order {
			if ctx.Err() != nil {
				break
			}
			n++
			do := o.Drain
			do.Executor = ""
			if ex == "noop" {
				do.Executor = "noop"
			}
			r, err := Drain(ctx, cfg, do, n)
			if err != nil {
				cfg.logf("drain-noop %s, trial %d: %v", ex, n, err)
				if firstErr == nil {
					firstErr = fmt.Errorf("drain-noop %s, trial %d: %w", ex, n, err)
				}
				continue
			}
			cfg.logf("drain-noop %s, trial %d: %d tasks done %.0f ms after agent start (%.0f after first READY) = %.2fx the floor; extra dispatches %d; coordinator cpu %.1f s, agents %.1f s; other processes' CPU share %.2f",
				ex, n, r.Tasks, r.DoneMs, r.FromFirstReadyMs(), ratio(r.DoneMs, floor), r.ExtraAttempts, r.CoordCPU, r.AgentCPU, r.ForeignCPU)
			if ex == "noop" {
				rd.Noop = &r
			} else {
				rd.Exec = &r
			}
		}
		rounds = append(rounds, rd)
	}
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	return rounds, firstErr
}

// drainGoal is issue 16's target for the real-executor drain: under 1.3x
// the bare-spawn floor.
const drainGoal = 1.3

// WriteDrainNoop writes drain-noop.csv and drain-noop.png to out and
// returns the summary's markdown section.
func WriteDrainNoop(out string, o DrainNoopOptions, rounds []DrainNoopRound) (string, error) {
	var rows [][]string
	var floors, execDone, execReady, noopDone, noopReady, execRatio, execReadyRatio, noopRatio, foreign []float64
	var pe, pn, pf plotter.XYs // (round, ms)
	for _, rd := range rounds {
		floors = append(floors, rd.FloorMs)
		pf = append(pf, plotter.XY{X: float64(rd.Round), Y: rd.FloorMs})
		for _, c := range []struct {
			name string
			r    *DrainResult
		}{{"exec", rd.Exec}, {"noop", rd.Noop}} {
			if c.r == nil {
				continue
			}
			r := c.r
			rows = append(rows, []string{strconv.Itoa(rd.Round), strconv.Itoa(r.Trial), c.name, strconv.FormatBool(rd.NoopFirst), strconv.Itoa(r.Tasks),
				f1(r.FirstReadyMs), f1(r.LastReadyMs), f1(r.FirstAssignMs), f1(r.FirstCompleteMs), f1(r.DoneMs), f1(r.FromFirstReadyMs()),
				f1(rd.FloorMs), strconv.FormatFloat(ratio(r.DoneMs, rd.FloorMs), 'f', 3, 64), strconv.FormatFloat(ratio(r.FromFirstReadyMs(), rd.FloorMs), 'f', 3, 64),
				strconv.Itoa(r.ExtraAttempts), strconv.Itoa(r.Failed), strconv.Itoa(r.PendingRewrites), f1(r.CoordCPU), f1(r.AgentCPU),
				strconv.FormatFloat(r.ForeignCPU, 'f', 3, 64)})
			foreign = append(foreign, 100*r.ForeignCPU)
			if c.name == "exec" {
				execDone, execReady = append(execDone, r.DoneMs), append(execReady, r.FromFirstReadyMs())
				execRatio, execReadyRatio = append(execRatio, ratio(r.DoneMs, rd.FloorMs)), append(execReadyRatio, ratio(r.FromFirstReadyMs(), rd.FloorMs))
				pe = append(pe, plotter.XY{X: float64(rd.Round), Y: r.DoneMs})
			} else {
				noopDone, noopReady = append(noopDone, r.DoneMs), append(noopReady, r.FromFirstReadyMs())
				noopRatio = append(noopRatio, ratio(r.DoneMs, rd.FloorMs))
				pn = append(pn, plotter.XY{X: float64(rd.Round), Y: r.DoneMs})
			}
		}
	}
	if err := WriteCSV(filepath.Join(out, "drain-noop.csv"), []string{"round", "trial", "executor", "noop_first", "tasks",
		"first_ready_ms", "last_ready_ms", "first_assign_ms", "first_complete_ms", "done_ms", "done_from_first_ready_ms",
		"spawn_floor_ms", "done_over_floor", "done_from_first_ready_over_floor",
		"extra_dispatches", "failed", "pending_rewrites", "coord_cpu_s", "agent_cpu_s", "foreign_cpu_share"}, rows); err != nil {
		return "", err
	}
	if len(rounds) > 0 {
		if err := savePlot(filepath.Join(out, "drain-noop.png"),
			fmt.Sprintf("drain of %d tasks: exec vs noop executor, and the spawn floor", o.Drain.Jobs*int(o.Drain.TasksPerJob)),
			"round", "ms from agent start until every task COMPLETE",
			[]plotSeries{{"drain, exec agents (/bin/true)", pe}, {"drain, noop agents (control plane alone)", pn}, {"bare-spawn floor (harness)", pf}},
			[]refLine{{fmt.Sprintf("goal: %.1fx the floor's p50", drainGoal), drainGoal * Summarize(floors).P50}}); err != nil {
			return "", err
		}
	}

	var b strings.Builder
	d := o.Drain
	fmt.Fprintf(&b, "## drain-noop: the drain with real and noop agents, against the bare-spawn floor\n\n")
	fmt.Fprintf(&b, "%d jobs x %d tasks of /bin/true (100 m, 16 MiB each) submitted to a fresh %d-member region (the region's defaults) before any agent; then %d agents x %d slots (%d m, %d MiB) start together (t0); "+
		"done = every task COMPLETE (harness etcd watch). Two agent kinds, the same region and workload: `exec` (the default: a process per attempt) and `--executor noop` (each attempt a timer that exits 0 at once: no process, work dir or cgroup; the control plane alone). "+
		"Floor, same run: the harness spawning %s processes (`sleep 0`, SpawnFloor, the floor DrainOwners uses) %d at once, once per round. "+
		"%d round(s), each: the floor, then one drain per executor, the order alternating from round to round. Cells: n: p50 / p95 / max (ms), or median [min-max].\n\n",
		d.Jobs, d.TasksPerJob, d.Coordinators, d.Agents, d.Slots, d.CPUMillis, d.MemoryMiB, thousands(float64(o.FloorTasks)), o.FloorConcurrency, o.Runs)
	med := func(xs []float64) string {
		if len(xs) == 0 {
			return "-"
		}
		s := Summarize(xs)
		return fmt.Sprintf("%.2f [%.2f-%.2f]", s.P50, s.Min, s.Max)
	}
	b.WriteString("| | drain ms from agent start | from first READY | ÷ floor (same round) | from first READY ÷ floor |\n|---|---|---|---|---|\n")
	fmt.Fprintf(&b, "| exec agents (/bin/true) | %s | %s | %s | %s |\n", dist(execDone), dist(execReady), med(execRatio), med(execReadyRatio))
	var noopReadyRatio []float64
	for _, rd := range rounds {
		if rd.Noop != nil {
			noopReadyRatio = append(noopReadyRatio, ratio(rd.Noop.FromFirstReadyMs(), rd.FloorMs))
		}
	}
	fmt.Fprintf(&b, "| noop agents (control plane alone) | %s | %s | %s | %s |\n", dist(noopDone), dist(noopReady), med(noopRatio), med(noopReadyRatio))
	fmt.Fprintf(&b, "| bare-spawn floor (harness, %s x sleep 0, %d at once) | %s | | 1 | |\n\n", thousands(float64(o.FloorTasks)), o.FloorConcurrency, dist(floors))
	e, f, nn := Summarize(execDone), Summarize(floors), Summarize(noopDone)
	verdict := "not met"
	if len(execRatio) > 0 && Summarize(execRatio).P50 < drainGoal {
		verdict = "met"
	}
	fmt.Fprintf(&b, "- exec drain ÷ floor, median of the rounds' own ratios: %s against the goal < %.1f (%s; p50 / p50: %.2f).\n", med(execRatio), drainGoal, verdict, ratio(e.P50, f.P50))
	fmt.Fprintf(&b, "- noop drain (the control plane alone): p50 %s ms = %.2fx the floor's p50 and %.2fx the exec drain's p50; the spawning adds %s ms (exec p50 - noop p50).\n",
		thousands(nn.P50), ratio(nn.P50, f.P50), ratio(nn.P50, e.P50), thousands(e.P50-nn.P50))
	fs := Summarize(foreign)
	fmt.Fprintf(&b, "\nProcesses outside the harness's tree used p50 %.1f%% / max %.1f%% of the CPUs during the drains (foreign_cpu_share in drain-noop.csv). PNG: drain-noop.png (per round, with the goal line at %.1fx the floor's p50).\n\n", fs.P50, fs.Max, drainGoal)
	b.WriteString("Caveats: 2 shared vCPUs run the harness, 3 coordinators with their etcd members, 8 agents and (exec) 2,000 task processes, so the exec drain is CPU-bound and the floor, spawned by a quiet harness, has both cores; " +
		"the floor spawns `sleep 0` (the existing SpawnFloor), not /bin/true (both a small dynamically linked coreutils binary); " +
		"drain times include the agents' start and registration (from first READY leaves the start out); n is small (see the table).\n\n")
	return b.String(), nil
}

// RunDrainNoop runs DrainNoop and writes its results (WriteDrainNoop); a
// failed trial's error is returned after the rest was written.
func RunDrainNoop(ctx context.Context, cfg Config, o DrainNoopOptions, out string) (string, error) {
	rounds, err := DrainNoop(ctx, cfg, o)
	md, werr := WriteDrainNoop(out, o, rounds)
	if err == nil {
		err = werr
	}
	return md, err
}
