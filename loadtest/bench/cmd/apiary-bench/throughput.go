package main

// End-to-end control-plane throughput (issue 16): a 3-member region, 1,000
// simulated agents x 32 slots in this process (noop executor), closed-loop
// SubmitJob clients keeping a bounded backlog, tasks counted COMPLETE by an
// etcd watch, and the same region's etcd batched-write ceiling measured
// after the load. Not in the default -only set (about 2.5 minutes a run);
// run it alone, on an otherwise idle machine:
//
//	go run ./loadtest/bench/cmd/apiary-bench -bin bin/apiary -only throughput \
//	    -out loadtest/results/throughput-$(date +%F)

import (
	"context"
	"flag"
	"fmt"
	"strings"

	"apiary.dev/apiary/loadtest/bench"
)

var (
	tpAgents       = flag.Int("throughput-agents", bench.DefaultThroughput.Agents, "throughput: simulated agents (loadtest.RunFleet in this process, noop executor)")
	tpSlots        = flag.Int("throughput-slots", bench.DefaultThroughput.Slots, "throughput: slots per agent (--max-tasks; capacity for that many 100 m / 16 MiB tasks)")
	tpTaskDuration = flag.Duration("throughput-task-duration", bench.DefaultThroughput.TaskDuration, "throughput: each attempt's length on the noop executor (0: exits at once)")
	tpTasksPerJob  = flag.Int("throughput-tasks-per-job", int(bench.DefaultThroughput.TasksPerJob), "throughput: tasks per submitted job")
	tpSubmitters   = flag.Int("throughput-submitters", bench.DefaultThroughput.Submitters, "throughput: closed-loop SubmitJob clients")
	tpConns        = flag.Int("throughput-conns", bench.DefaultThroughput.Conns, "throughput: gRPC connections the submitters share")
	tpBacklog      = flag.Int("throughput-backlog", bench.DefaultThroughput.MaxBacklog, "throughput: submitters wait while this many tasks are submitted and not yet seen finished")
	tpWarmup       = flag.Duration("throughput-warmup", bench.DefaultThroughput.Warmup, "throughput: load before the measured window")
	tpDuration     = flag.Duration("throughput-duration", bench.DefaultThroughput.Duration, "throughput: measured window")
	tpInterval     = flag.Duration("throughput-interval", bench.DefaultThroughput.Interval, "throughput: interval of the time series")
	tpCeiling      = flag.Duration("throughput-ceiling-duration", bench.DefaultThroughput.CeilingDuration, "throughput: length of the etcd write-ceiling measurement after the load")
	tpNodeLease    = flag.Duration("throughput-node-lease", 0, "throughput: the region's --node-lease-ttl (0: the benchmark's default, "+strings.Join(bench.DefaultThroughput.ExtraArgs, " ")+")")
	tpLAN          = flag.Bool("throughput-lan", bench.DefaultThroughput.LAN, "throughput: the coordinators in devcluster's serf LAN pool (false: NoLAN; the simulated agents never join it)")
	tpRuns         = flag.Int("throughput-runs", bench.DefaultThroughput.Runs, "throughput: runs, a fresh region each")
)

// runThroughput runs the throughput benchmark when run["throughput"],
// writes its CSVs and PNG to out and appends its section to sum; it reports
// whether it failed.
func runThroughput(ctx context.Context, cfg bench.Config, run map[string]bool, out string, sum *strings.Builder) (failed bool) {
	if !run["throughput"] || ctx.Err() != nil {
		return false
	}
	o := bench.DefaultThroughput
	o.Agents, o.Slots, o.TaskDuration, o.TasksPerJob = *tpAgents, *tpSlots, *tpTaskDuration, int32(*tpTasksPerJob)
	o.Submitters, o.Conns, o.MaxBacklog = *tpSubmitters, *tpConns, *tpBacklog
	o.Warmup, o.Duration, o.Interval, o.CeilingDuration = *tpWarmup, *tpDuration, *tpInterval, *tpCeiling
	o.LAN, o.Runs = *tpLAN, *tpRuns
	if *tpNodeLease > 0 {
		o.ExtraArgs = []string{"--node-lease-ttl", tpNodeLease.String()}
	}
	if o.Agents < 1 || o.Slots < 1 || o.TasksPerJob < 1 || o.Submitters < 1 || o.Conns < 1 || o.MaxBacklog < int(o.TasksPerJob) ||
		o.Duration <= 0 || o.Interval <= 0 || o.CeilingDuration <= 0 || o.Runs < 1 {
		fatal(fmt.Errorf("-throughput-*: agents, slots, tasks-per-job, submitters, conns and runs must be >= 1, backlog >= tasks-per-job, durations > 0"))
	}
	res, err := bench.Throughput(ctx, cfg, o)
	if err != nil {
		fmt.Fprintf(cfg.Log, "throughput: %v\n", err)
		failed = true
	}
	md, err := bench.WriteThroughput(out, res)
	check(err)
	sum.WriteString(md)
	return failed
}
