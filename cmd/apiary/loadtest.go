package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"apiary.dev/apiary/internal/cliconn"
	"apiary.dev/apiary/loadtest"
)

func init() { register(newLoadtestCmd) }

func newLoadtestCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "loadtest",
		Short: "Open-loop load and fault scenarios on real processes, with verification",
		Long: `Run open-loop load against a region this command starts as real processes
(or, for "run", an existing one with --addr), inject faults, then read every
job back and verify: nothing accepted lost, no task completed twice, stale
attempts' effects fenced, no task outside its jurisdiction. Any violation
makes the command exit 1 and lists the offending ids. "fleet" runs thousands
of simulated agents (noop executor) in this process against an existing
region, to measure its control plane.`,
	}
	cmd.AddCommand(newLoadtestRunCmd(), newLoadtestFailoverCmd(), newLoadtestFleetCmd(), newLoadtestTaskCmd())
	return cmd
}

// newLoadtestTaskCmd is what a load-test task runs where there is no shell
// (the scratch image): loadtest.LedgerTask.
func newLoadtestTaskCmd() *cobra.Command {
	var ledger string
	var sleep time.Duration
	var done bool
	cmd := &cobra.Command{
		Use:   "task --ledger FILE [--sleep D] [--done]",
		Short: "Run as a load-test task: append this attempt's identity to the ledger, sleep, append a done line",
		Long: `Run as a load-test task (the command of a job's task, not by hand): append
the attempt's identity from the agent's environment (APIARY_JOB_ID,
APIARY_TASK_INDEX, APIARY_ATTEMPT, APIARY_FENCING_TOKEN, APIARY_NODE_ID,
APIARY_REGION) to --ledger, sleep --sleep, and with --done append the same
line with ",done". The verifier reads the ledger to find work done twice
or by a fenced attempt. The shell-free form of what "loadtest run" tasks do
with printf, for images that hold only the apiary binary.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if ledger == "" {
				return withCode(exitInvalid, fmt.Errorf("--ledger: is required"))
			}
			if sleep < 0 {
				return withCode(exitInvalid, fmt.Errorf("--sleep: must be >= 0 (got %s)", sleep))
			}
			if os.Getenv("APIARY_JOB_ID") == "" {
				return withCode(exitInvalid, fmt.Errorf("APIARY_JOB_ID is not set: this command runs as a task, started by an agent"))
			}
			return loadtest.LedgerTask(ledger, sleep, done, os.Getenv)
		},
	}
	cmd.Flags().StringVar(&ledger, "ledger", "", "ledger file to append to (made, mode 0666, if missing)")
	cmd.Flags().DurationVar(&sleep, "sleep", 0, "how long the task's work takes")
	cmd.Flags().BoolVar(&done, "done", false, "append a done line after the work")
	return cmd
}

type loadtestFlags struct {
	rate        float64
	duration    time.Duration
	tasksPerJob int
	taskSleep   time.Duration
	agents      int
	slots       int
	coords      int
	output      string
	resultsDir  string
	workDir     string
	drain       time.Duration
}

func (f *loadtestFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.Float64Var(&f.rate, "rate", 50, "submissions per second (open loop)")
	fl.IntVar(&f.tasksPerJob, "tasks-per-job", 1, "tasks per job")
	fl.DurationVar(&f.taskSleep, "task-sleep", 300*time.Millisecond, "how long each task runs")
	fl.IntVar(&f.agents, "agents", 3, "agents in the region the harness starts")
	fl.IntVar(&f.slots, "slots", 32, "task slots per agent")
	fl.IntVar(&f.coords, "coordinators", 0, "coordinators (default 3 for scheduler faults, else 1)")
	fl.StringVarP(&f.output, "output", "o", "text", "text or json")
	fl.StringVar(&f.resultsDir, "results-dir", "loadtest/results", "write <timestamp>-<scenario>/ here (empty: do not write)")
	fl.DurationVar(&f.drain, "drain-timeout", 60*time.Second, "how long to wait after the load for every accepted job to finish (an unfinished job counts as lost; partition-agent and outage-region wait at least task-sleep + 30s)")
	fl.StringVar(&f.workDir, "work-dir", "", "scratch dir for data, logs and the ledger (default: a temp dir, removed)")
}

func newLoadtestRunCmd() *cobra.Command {
	var f loadtestFlags
	var addr, trace string
	var traceLimit int
	var sizeScale float64
	var maxSleep time.Duration
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Steady open-loop load, then verification",
		Example: `  apiary loadtest run --rate 200 --duration 20s
  apiary loadtest run --addr 127.0.0.1:7070 --rate 50 --duration 10s --work-dir /tmp/lt
  apiary loadtest run --trace ../shared/traces/alibaba-gpu-v2023/openb_pod_list_default.csv --trace-limit 500 --duration 30s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cmd.Flags().Changed("addr") || os.Getenv(cliconn.EnvAddr) != "" && !cmd.Flags().Changed("dev") {
				addr = cliconn.ResolveAddr(addr, cmd.Flags().Changed("addr"))
			}
			if dev, _ := cmd.Flags().GetBool("dev"); dev {
				addr = ""
			}
			return runLoadtest(cmd, f, loadtest.Options{Scenario: loadtest.Steady, Duration: f.duration, Addr: addr,
				Trace: trace, TraceLimit: traceLimit, SizeScale: sizeScale, MaxTaskSleep: maxSleep})
		},
	}
	f.register(cmd)
	cmd.Flags().DurationVar(&f.duration, "duration", 10*time.Second, "how long to submit")
	cmd.Flags().StringVar(&addr, "addr", "", "target an existing region (env APIARY_ADDR) instead of starting one")
	cmd.Flags().Bool("dev", false, "start a region even if APIARY_ADDR is set")
	cmd.Flags().StringVar(&trace, "trace", "", "replay a cluster-trace-gpu-v2023 pod list (e.g. ../shared/traces/alibaba-gpu-v2023/openb_pod_list_default.csv) instead of --rate: creation times scaled to --duration")
	cmd.Flags().IntVar(&traceLimit, "trace-limit", 1000, "pods of the trace to replay")
	cmd.Flags().Float64Var(&sizeScale, "size-scale", 0.01, "scale the trace's cpu and memory requests by this factor")
	cmd.Flags().DurationVar(&maxSleep, "max-task-sleep", 5*time.Second, "cap on a replayed task's scaled lifetime")
	return cmd
}

func newLoadtestFailoverCmd() *cobra.Command {
	var f loadtestFlags
	var scenario string
	var trials int
	var every, partition, outage, failoverAfter time.Duration
	var killAgents bool
	cmd := &cobra.Command{
		Use:   "failover",
		Short: "Inject a fault per trial under load and time what users wait on",
		Long: `Scenarios: kill-scheduler (SIGKILL the scheduling coordinator of a
3-coordinator region), pause-scheduler (SIGSTOP it longer than its lease, then
SIGCONT), kill-agent (SIGKILL an agent running tasks), pause-agent (SIGSTOP an
agent longer than its lease, then SIGCONT), kill-region (SIGKILL every
coordinator of one region of a federation behind a global router; measures
how soon new submissions are accepted by another region), partition-agent
(cut the gRPC traffic of the agent running the most tasks to its
coordinators for --partition, longer than its 1 s lease, through the agent's
fault file, then heal: replaced attempts, time to replacement, duplicates)
and outage-region (SIGKILL every coordinator of a 3-coordinator region for
--outage with the agents up, then restart them all at once: tasks killed,
attempts charged, time from the region back to the held reports committed).

partition-agent and outage-region run tasks longer than the fault (by
default: partition + 5s, outage x 1.5), so that some tasks end during the
fault and others run through it, and they require every job to COMPLETE;
outage-region also fails when any task's work completed twice. Their
defaults for --rate, --task-sleep, --trial-every and --slots (and 3
coordinators for outage-region) apply unless those flags are given.`,
		Example: `  apiary loadtest failover --scenario kill-scheduler --trials 20 --output json
  apiary loadtest failover --scenario partition-agent --trials 5 --partition 3s
  apiary loadtest failover --scenario outage-region --trials 5 --outage 20s
  apiary loadtest failover --scenario kill-region --failover-after 5s --trials 10 --rate 10`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o := loadtest.Options{Scenario: loadtest.Scenario(scenario), Trials: trials, TrialEvery: every,
				Partition: partition, Outage: outage, FailoverAfter: failoverAfter, KillAgents: killAgents}
			if failoverAfter > 0 && !cmd.Flags().Changed("task-sleep") {
				f.taskSleep = 0 // the failover default (6s): tasks in flight at the kill
			}
			if failoverAfter > 0 && !cmd.Flags().Changed("tasks-per-job") {
				f.tasksPerJob = 0 // the failover default (4, of staggered lengths)
			}
			if o.Scenario.Liveness() && !cmd.Flags().Changed("trial-every") {
				o.TrialEvery = 0 // the scenario's default
			}
			return runLoadtest(cmd, f, o)
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&scenario, "scenario", "kill-scheduler", "kill-scheduler, pause-scheduler, kill-agent, pause-agent, kill-region, partition-agent or outage-region")
	cmd.Flags().IntVar(&trials, "trials", 5, "faults to inject (1..200)")
	cmd.Flags().DurationVar(&every, "trial-every", 6*time.Second, "load time per trial (partition-agent: partition + 9s; outage-region: outage + task-sleep + 10s)")
	cmd.Flags().DurationVar(&partition, "partition", 3*time.Second, "partition-agent: how long the agent is cut off (longer than its 1s lease)")
	cmd.Flags().DurationVar(&outage, "outage", 20*time.Second, "outage-region: how long every coordinator stays down")
	cmd.Flags().DurationVar(&failoverAfter, "failover-after", 0, "kill-region: jobs carry failover: {after} (every fifth failover: off) and the region stays down past it, so its in-flight jobs move to a standby; the verifier checks the move (0: off)")
	cmd.Flags().BoolVar(&killAgents, "kill-agents", false, "kill-region with --failover-after: SIGKILL the region's agents too (restarted with it)")
	return cmd
}

func runLoadtest(cmd *cobra.Command, f loadtestFlags, o loadtest.Options) error {
	if f.output != "text" && f.output != "json" {
		return withCode(exitInvalid, fmt.Errorf("--output: must be text or json, got %q", f.output))
	}
	if o.Scenario != loadtest.Steady && o.Scenario != "" {
		ok := false
		for _, s := range loadtest.Scenarios {
			ok = ok || (s == o.Scenario && s != loadtest.Steady)
		}
		if !ok {
			return withCode(exitInvalid, fmt.Errorf("--scenario: must be kill-scheduler, pause-scheduler, kill-agent, pause-agent, kill-region, partition-agent or outage-region, got %q", o.Scenario))
		}
	}
	bin, err := os.Executable()
	if err != nil {
		return err
	}
	work := f.workDir
	if work == "" {
		if work, err = os.MkdirTemp("", "apiary-loadtest-"); err != nil {
			return err
		}
		defer os.RemoveAll(work)
	}
	o.Binary, o.WorkDir = bin, work
	o.Rate, o.TasksPerJob, o.TaskSleep = f.rate, f.tasksPerJob, f.taskSleep
	o.Agents, o.Slots, o.Coordinators = f.agents, f.slots, f.coords
	o.DrainTimeout = f.drain
	if o.Scenario.Liveness() {
		// Flags left at their defaults take the scenario's (liveness.go).
		for name, v := range map[string]func(){"rate": func() { o.Rate = 0 }, "task-sleep": func() { o.TaskSleep = 0 }, "slots": func() { o.Slots = 0 }} {
			if !cmd.Flags().Changed(name) {
				v()
			}
		}
	}
	stderr := cmd.ErrOrStderr()
	o.Logf = func(format string, args ...any) {
		fmt.Fprintf(stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
	}
	if err := o.Defaults(); err != nil {
		return withCode(exitInvalid, err)
	}
	expected := int64(o.Rate * o.Duration.Seconds())
	if o.Trace != "" {
		expected = int64(o.TraceLimit)
	}
	var done, failed atomic.Int64
	if term.IsTerminal(int(os.Stderr.Fd())) {
		bar := progressbar.NewOptions64(expected, progressbar.OptionSetWriter(os.Stderr),
			progressbar.OptionSetDescription("submitting"), progressbar.OptionShowCount(), progressbar.OptionThrottle(100*time.Millisecond))
		o.OnSample = func(s loadtest.Sample) { _ = bar.Add(1) }
	} else {
		var last atomic.Int64
		o.OnSample = func(s loadtest.Sample) {
			n := done.Add(1)
			if s.Err != "" {
				failed.Add(1)
			}
			if now := time.Now().Unix(); last.Swap(now) != now {
				fmt.Fprintf(stderr, "submitted %d/%d (%d errors)\n", n, expected, failed.Load())
			}
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := loadtest.Run(ctx, o)
	if err != nil {
		return withCode(exitInvalid, err)
	}
	if f.resultsDir != "" {
		dir := filepath.Join(f.resultsDir, time.Now().UTC().Format("20060102T150405Z")+"-"+string(o.Scenario))
		if err := loadtest.WriteResults(dir, res, "apiary "+strings.Join(os.Args[1:], " ")); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "results in %s\n", dir)
	}
	if f.output == "json" {
		b, _ := json.MarshalIndent(res, "", "  ")
		fmt.Fprintln(cmd.OutOrStdout(), string(b))
	} else {
		w := cmd.OutOrStdout()
		fmt.Fprintf(w, "scenario %s: %d trials (%d valid)\n", res.Scenario, res.Trials, res.ValidTrials)
		fmt.Fprintf(w, "submitted %d, accepted %d, refused %d, completed %d, failed %d, lost %d, duplicates %d, sovereignty violations %d\n",
			res.Submitted, res.Accepted, res.Refused, res.Completed, res.Failed, res.Lost, res.Duplicates, res.SovereigntyViolations)
		fmt.Fprintf(w, "throughput %.1f tasks/s\n", res.ThroughputTasksPerS)
		for _, l := range []struct {
			name string
			q    loadtest.Quantiles
		}{{"submit latency", res.SubmitLatencyMs}, {"schedule latency", res.ScheduleLatencyMs}, {"fault to dispatch", res.FaultToDispatchMs}, {"generator lag", res.GeneratorLagMs}} {
			fmt.Fprintf(w, "%-18s n=%d p50 %.1f ms  p95 %.1f ms  p99 %.1f ms  max %.1f ms\n", l.name, l.q.N, l.q.P50, l.q.P95, l.q.P99, l.q.Max)
		}
		if lv := res.Liveness; lv != nil {
			for _, l := range loadtest.LivenessLines(res) {
				fmt.Fprintln(w, l)
			}
		}
		if fs := res.Failover; fs != nil {
			for _, l := range loadtest.FailoverLines(fs) {
				fmt.Fprintln(w, l)
			}
		}
	}
	if !res.Verdict.OK() {
		return withCode(exitJobFailed, fmt.Errorf("verification failed: %s", res.Verdict.Error()))
	}
	if fs := res.Failover; fs != nil && !fs.OK() {
		return withCode(exitJobFailed, fmt.Errorf("failover verification failed: token violations %v, home completions after the move %v", fs.TokenViolations, fs.HomeLateComplete))
	}
	return nil
}
