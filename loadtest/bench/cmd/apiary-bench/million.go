package main

// State-size benchmarks (issue 16): million (a 3-member region filled to
// 10k, 100k and 1M task records by simulated agents; submit and plan
// commit latency, memory, DB size at each; a failover at the top) and
// drain-noop (the drain with real agents against noop agents, against the
// bare-spawn floor). Not in the default -only set:
//
//	go run ./loadtest/bench/cmd/apiary-bench -bin bin/apiary -only million,drain-noop \
//	    -out loadtest/results/million-$(date +%F)
//
// -million-top 20000 is a quick run (a few minutes); the default top,
// 1,000,000, takes far longer (see the summary's run time).

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strings"
	"time"

	"apiary.dev/apiary/loadtest/bench"
)

var (
	millionTop         = flag.Int("million-top", 1_000_000, "million: the top checkpoint in task records (checkpoints: 10,000, 100,000 and 1,000,000 below it, then it)")
	millionTasksPerJob = flag.Int("million-tasks-per-job", int(bench.DefaultMillion.TasksPerJob), "million: tasks per fill job (the API accepts at most 10,000)")
	millionConcurrency = flag.Int("million-concurrency", bench.DefaultMillion.Concurrency, "million: fill submissions in flight")
	millionBacklog     = flag.Int("million-backlog", bench.DefaultMillion.MaxBacklog, "million: most fill tasks submitted but not finished")
	millionAgents      = flag.Int("million-agents", bench.DefaultMillion.Agents, "million: simulated agents (noop executor, in the harness's process)")
	millionSlots       = flag.Int("million-slots", bench.DefaultMillion.Slots, "million: slots (--max-tasks) per simulated agent")
	millionProbe       = flag.Duration("million-probe", bench.DefaultMillion.ProbeDuration, "million: submit probe window at each checkpoint")
	millionClients     = flag.Int("million-probe-clients", bench.DefaultMillion.ProbeClients, "million: closed-loop clients of the submit probe")
	millionIdle        = flag.Duration("million-idle", bench.DefaultMillion.Idle, "million: idle window at each checkpoint (coordinators' CPU; profiles)")
	millionProfile     = flag.Bool("million-profile", bench.DefaultMillion.Profile, "million: save each coordinator's CPU profile of each checkpoint's fill and idle window")
	millionNodeLease   = flag.Duration("million-node-lease", bench.DefaultMillion.NodeLease, "million: the region's --node-lease-ttl (0: the region's default, 2s, which the in-process fleet's agents miss under load)")
	millionRegionArgs  = flag.String("million-region-args", "", "million: more arguments for every coordinator, space-separated (e.g. \"--etcd-quota-mib 8192\")")
	drainNoopRuns      = flag.Int("drain-noop-runs", bench.DefaultDrainNoop.Runs, "drain-noop: rounds (each: the spawn floor, one drain with exec agents and one with noop agents, alternating order)")
)

// runMillion runs the state-size benchmarks selected in run, writes their
// CSVs and PNGs to out and appends to sum; it reports whether one failed.
func runMillion(ctx context.Context, cfg bench.Config, run map[string]bool, out string, sum *strings.Builder) (failed bool) {
	logf := func(format string, args ...any) { fmt.Fprintf(cfg.Log, format+"\n", args...) }
	if run["million"] && ctx.Err() == nil {
		o := bench.DefaultMillion
		o.Sizes = bench.MillionSizes(*millionTop)
		o.TasksPerJob = int32(*millionTasksPerJob)
		o.Concurrency, o.MaxBacklog = *millionConcurrency, *millionBacklog
		o.Agents, o.Slots = *millionAgents, *millionSlots
		o.ProbeDuration, o.ProbeClients, o.Idle, o.Profile = *millionProbe, *millionClients, *millionIdle, *millionProfile
		o.NodeLease = *millionNodeLease
		o.ExtraArgs = append(slices.Clone(o.ExtraArgs), strings.Fields(*millionRegionArgs)...)
		t0 := time.Now()
		md, err := bench.RunMillion(ctx, cfg, o, out)
		if err != nil {
			logf("million: %v", err)
			failed = true
		}
		logf("million: %s", time.Since(t0).Round(time.Second))
		sum.WriteString(md)
	}
	if run["drain-noop"] && ctx.Err() == nil {
		o := bench.DefaultDrainNoop
		o.Runs = *drainNoopRuns
		md, err := bench.RunDrainNoop(ctx, cfg, o, out)
		if err != nil {
			logf("drain-noop: %v", err)
			failed = true
		}
		sum.WriteString(md)
	}
	return failed
}
