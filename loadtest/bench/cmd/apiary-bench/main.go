// Command apiary-bench runs the regional benchmarks of package bench
// (drain, submit, failover) against real subprocesses of the apiary binary
// and writes per-trial CSV rows and a summary to -out.
//
//	go run ./loadtest/bench/cmd/apiary-bench -bin bin/apiary -out loadtest/results/regional-$(date +%F)
//
// badnode (issue 11: one bad agent of four, quarantine and wall time
// against a healthy control; a few minutes) is not in the default -only
// set: `make bench-badnode`, or -only badnode.
//
// tlscost (issue 19: SubmitJob and RegisterNode with mutual TLS, and with ACLs, against
// plaintext, 1-member region, -tlscost-runs per mode; about 2.5 minutes) is
// not in the default set either: `make bench-tls`, or -only tlscost.
//
// shards (sharded ownership: the failover with one of three shard owners
// killed, and the drain with 1 against 3 owners; about 7 minutes) is not in
// the default set: `make bench-shards`, or -only shards.
//
// preempt and locality (issue 13: an urgent task's submission to RUNNING
// in a full region against one slot free, and stage-2 input bytes moved
// with data locality on against off; about 4 minutes) are not in the
// default set either: `make bench-placement`, or -only preempt,locality.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"apiary.dev/apiary/loadtest/bench"
)

// badnodeTrials is the badnode benchmark's trial count per setup.
var badnodeTrials = flag.Int("badnode-trials", bench.DefaultBadNode.Trials, "badnode: trials per setup (control, exit75, exit1, workdir), interleaved within each round")

// shards flags (make bench-shards).
var (
	shardsFailoverTrials = flag.Int("shards-failover-trials", bench.DefaultShards.Failover.Trials, "shards: failover trials (SIGKILL of one of three shard owners)")
	shardsDrainTrials    = flag.Int("shards-drain-trials", bench.DefaultShards.DrainTrials, "shards: drain rounds (each: a spawn floor, one drain with 3 owners and one with 1, alternating order)")
	shardsDrainTasks     = flag.Int("shards-drain-tasks", int(bench.DefaultShards.Drain.TasksPerJob), "shards: tasks per job of the drain (20 jobs; 100 = 2,000 tasks for 256 slots, a backlog; 10 = 200 tasks, within the slots)")
	shardsDrainLease     = flag.Duration("shards-drain-node-lease", 0, "shards: the drain region's --node-lease-ttl (0: the region's default); a longer lease keeps a machine too slow at spawning processes from losing nodes mid-drain")
)

// placement flags (make bench-placement: preempt, locality).
var (
	preemptTrials = flag.Int("preempt-trials", bench.DefaultPreempt.Trials, "preempt: trials per mode (full: the urgent task must preempt; free: one slot free, the floor), alternating")
	preemptCoords = flag.String("preempt-coordinators", joinInts(bench.DefaultPreempt.Coordinators), "preempt: coordinator counts, one region each, run one after the other (e.g. 1,3)")
	localityRuns  = flag.Int("locality-runs", bench.DefaultLocality.Runs, "locality: runs per mode (on, off), alternating, a fresh region each")
)

// tlscost flags (the submit flags -clients, -conns, -warmup, -duration apply too).
var (
	tlscostRuns  = flag.Int("tlscost-runs", bench.DefaultTLSCost.Runs, "tlscost: runs per mode (plain, mtls, acl), alternating")
	tlscostNodes = flag.Int("tlscost-nodes", bench.DefaultTLSCost.Nodes, "tlscost: fake nodes registered per run")
)

func main() {
	var (
		bin          = flag.String("bin", "bin/apiary", "apiary binary")
		out          = flag.String("out", "", "results directory (default loadtest/results/regional-<date>)")
		work         = flag.String("work", "", "scratch directory for data dirs and logs (default: a temp dir, removed on success)")
		only         = flag.String("only", "drain,submit,failover,agentfail,serfcpu,ownerdetect", "benchmarks to run, comma-separated")
		drainTrials  = flag.Int("drain-trials", 5, "drain trials")
		foTrials     = flag.Int("failover-trials", 20, "failover trials")
		clients      = flag.Int("clients", 64, "submit: concurrent clients")
		conns        = flag.Int("conns", 8, "submit: gRPC connections shared by the clients")
		warmup       = flag.Duration("warmup", 2*time.Second, "submit: warm-up (not measured)")
		duration     = flag.Duration("duration", 10*time.Second, "submit: measured duration")
		submitConfig = flag.String("submit-members", "1,3", "submit: region sizes")
		submitTrace  = flag.String("submit-tracing", "off", "submit: tracing modes of the region, comma-separated: off (no tracing variables), file (APIARY_TRACE_FILE), otlp-grpc (OTLP/gRPC to an in-process receiver)")
		submitRuns   = flag.Int("submit-runs", 1, "submit: runs per region size and tracing mode (modes interleaved within each round)")
	)
	flag.Parse()
	if *out == "" {
		*out = filepath.Join("loadtest", "results", "regional-"+time.Now().Format("2006-01-02"))
	}
	abs, err := filepath.Abs(*bin)
	if err == nil {
		*bin = abs
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fatal(err)
	}
	keep := *work != ""
	if *work == "" {
		*work, err = os.MkdirTemp("", "apiary-bench-")
		if err != nil {
			fatal(err)
		}
	}
	logf, err := os.Create(filepath.Join(*out, "run.log"))
	if err != nil {
		fatal(err)
	}
	defer logf.Close()
	cfg := bench.Config{Binary: *bin, WorkDir: *work, Log: io.MultiWriter(os.Stderr, logf)}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var sum strings.Builder
	fmt.Fprintf(&sum, "# apiary regional benchmarks, %s\n\n", time.Now().Format(time.RFC3339))
	fmt.Fprintf(&sum, "machine: %d CPUs (GOMAXPROCS %d), %s; load generator, coordinators and agents share them; loopback only.\n", runtime.NumCPU(), runtime.GOMAXPROCS(0), hostInfo())
	fmt.Fprintf(&sum, "binary: %s\n\n", *bin)
	failed := false
	run := map[string]bool{}
	for _, b := range strings.Split(*only, ",") {
		run[strings.TrimSpace(b)] = true
	}

	if run["drain"] {
		o := bench.DefaultDrain
		var rows [][]string
		var fromStart, fromFirst, fromLast []float64
		for i := 1; i <= *drainTrials && ctx.Err() == nil; i++ {
			r, err := bench.Drain(ctx, cfg, o, i)
			if err != nil {
				cfg.Log.Write([]byte(fmt.Sprintf("drain trial %d: %v\n", i, err)))
				failed = true
				continue
			}
			cfg.Log.Write([]byte(fmt.Sprintf("drain trial %d: %d tasks done %.0f ms after agent start (%.0f ms after first READY at %.0f ms; last READY %.0f ms; first assign %.0f ms); extra dispatches %d, failed %d\n",
				i, r.Tasks, r.DoneMs, r.FromFirstReadyMs(), r.FirstReadyMs, r.LastReadyMs, r.FirstAssignMs, r.ExtraAttempts, r.Failed)))
			cfg.Log.Write([]byte(fmt.Sprintf("drain trial %d: cpu seconds during the drain: coordinators %.1f, agents+tasks %.1f; %d rewrites of PENDING task records (unplaced reasons %q)\n", i, r.CoordCPU, r.AgentCPU, r.PendingRewrites, r.Reasons)))
			var tl [][]string
			for b, c := range r.Timeline {
				tl = append(tl, []string{itoa(b * 100), itoa(c[0]), itoa(c[1]), itoa(c[2])})
			}
			check(writeCSV(filepath.Join(*out, fmt.Sprintf("drain-timeline-%d.csv", i)), []string{"ms_from_t0", "assigned", "running", "complete"}, tl))
			var evs [][]string
			for _, e := range r.Events {
				evs = append(evs, []string{f1(e.AtMs), strconv.FormatInt(e.Rev, 10), strings.TrimPrefix(e.State.String(), "TASK_STATE_"), e.Node})
			}
			check(writeCSV(filepath.Join(*out, fmt.Sprintf("drain-events-%d.csv", i)), []string{"ms_from_t0", "revision", "state", "node"}, evs))
			fromStart = append(fromStart, r.DoneMs)
			fromFirst = append(fromFirst, r.FromFirstReadyMs())
			fromLast = append(fromLast, r.DoneMs-r.LastReadyMs)
			rows = append(rows, []string{itoa(i), itoa(r.Tasks), f1(r.FirstReadyMs), f1(r.LastReadyMs), f1(r.FirstAssignMs),
				f1(r.FirstCompleteMs), f1(r.DoneMs), f1(r.FromFirstReadyMs()), f1(r.DoneMs - r.LastReadyMs), itoa(r.ExtraAttempts), itoa(r.Failed), itoa(int(r.PendingBefore)), f1(r.CoordCPU), f1(r.AgentCPU)})
		}
		check(writeCSV(filepath.Join(*out, "drain.csv"), []string{"trial", "tasks", "first_ready_ms", "last_ready_ms", "first_assign_ms",
			"first_complete_ms", "done_ms", "done_from_first_ready_ms", "done_from_last_ready_ms", "extra_dispatches", "failed", "pending_before", "coord_cpu_s", "agent_cpu_s"}, rows))
		fmt.Fprintf(&sum, "## drain\n\n%d jobs x %d tasks of /bin/true (100 m, 16 MiB each), submitted before any agent; 3-member region (etcd election 500 ms, heartbeat 50 ms);\n%d agents x %d slots (--max-tasks %d, %d m, %d MiB) started together at t0. Completion seen by an etcd watch on the task records (harness clock).\n\n",
			o.Jobs, o.TasksPerJob, o.Agents, o.Slots, o.Slots, o.CPUMillis, o.MemoryMiB)
		fmt.Fprintf(&sum, "| measured from | ms |\n|---|---|\n| agent processes started (t0) | %s |\n| first agent READY | %s |\n| last agent READY | %s |\n\n",
			bench.Summarize(fromStart), bench.Summarize(fromFirst), bench.Summarize(fromLast))
	}

	if run["submit"] && ctx.Err() == nil {
		var modes []string
		for _, m := range strings.Split(*submitTrace, ",") {
			modes = append(modes, strings.TrimSpace(m))
		}
		var rows, series [][]string
		fmt.Fprintf(&sum, "## submit\n\nSubmitJob, single-task jobs (with client_id + unique request_id, as the CLI sends), %d closed-loop clients over %d gRPC connections (round robin over the coordinators), %s warm-up then %s measured; no agents (every job stays PENDING; the scheduler records an unplaced reason for each). A fresh region per run; tracing modes %s, %d run(s) each, interleaved. The clients send no traceparent: with tracing on, the region starts each job's trace at accept. Spans are counted after the region is stopped (SIGTERM flushes the exporters); accepted = every successful SubmitJob of the run (warm-up and probes included).\n\n",
			*clients, *conns, *warmup, *duration, strings.Join(modes, ", "), *submitRuns)
		fmt.Fprintf(&sum, "| members | tracing | run | ok | errors | jobs/s | p50 ms | p95 ms | p99 ms | max ms | accepted | spans | spans/job | coord CPU s | coord CPU µs/job | harness CPU s |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		type key struct {
			n    int
			mode string
		}
		agg := map[key][][4]float64{} // jobs/s, p50, p99, coordinator CPU µs per accepted job
		var order []key
		var notes strings.Builder
		for _, m := range strings.Split(*submitConfig, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(m))
			if err != nil {
				fatal(err)
			}
			for run := 1; run <= *submitRuns && ctx.Err() == nil; run++ {
				for _, mode := range modes {
					if ctx.Err() != nil {
						break
					}
					r, err := bench.Submit(ctx, cfg, bench.SubmitOptions{Coordinators: n, Clients: *clients, Conns: *conns, Warmup: *warmup, Duration: *duration, Tracing: mode, Run: run})
					if err != nil {
						cfg.Log.Write([]byte(fmt.Sprintf("submit %d members, tracing %s, run %d: %v\n", n, mode, run, err)))
						failed = true
						continue
					}
					h := r.Latency
					q := func(p float64) string { return f1(float64(h.ValueAtQuantile(p)) / 1000) }
					cpuPerJob := "-"
					if r.Accepted > 0 {
						cpuPerJob = strconv.FormatFloat(r.CoordCPU/float64(r.Accepted)*1e6, 'f', 0, 64)
					}
					perJob := "-"
					if mode != bench.TracingOff && r.Accepted > 0 {
						perJob = strconv.FormatFloat(float64(r.Spans)/float64(r.Accepted), 'f', 3, 64)
					}
					cfg.Log.Write([]byte(fmt.Sprintf("submit %d members, tracing %s, run %d: %d ok, %d errors %v, %.0f jobs/s, p50 %s p95 %s p99 %s max %s ms; accepted %d; spans %d (%s at window end; %s) per job %s, otlp requests %d, span file %d bytes; cpu s: coordinators %.1f harness %.1f\n",
						n, mode, run, r.OK, r.Errors, r.ErrCodes, r.PerSec, q(50), q(95), q(99), q(100), r.Accepted, r.Spans, strconv.FormatInt(r.SpansAtEnd, 10), bench.FormatCounts(r.SpansByName), perJob, r.OTLPRequests, r.SpanFileBytes, r.CoordCPU, r.HarnessCPU)))
					if len(r.SpanSample) > 0 && notes.Len() == 0 {
						notes.WriteString("First span-file lines (file mode, first run):\n\n```\n" + strings.Join(r.SpanSample, "\n") + "\n```\n\n")
					}
					rows = append(rows, []string{itoa(n), mode, itoa(run), itoa(*clients), itoa(*conns), duration.String(), strconv.FormatInt(r.OK, 10), strconv.FormatInt(r.Errors, 10),
						f1(r.PerSec), q(50), q(90), q(95), q(99), q(99.9), q(100), f1(h.Mean() / 1000),
						strconv.FormatInt(r.Accepted, 10), strconv.FormatInt(r.Spans, 10), strconv.FormatInt(r.SpansAtEnd, 10), perJob, bench.FormatCounts(r.SpansByName),
						strconv.FormatInt(r.OTLPRequests, 10), strconv.FormatInt(r.SpanFileBytes, 10), f1(r.CoordCPU), cpuPerJob, f1(r.HarnessCPU)})
					for s, c := range r.Series {
						series = append(series, []string{itoa(n), mode, itoa(run), itoa(s), strconv.FormatInt(c, 10)})
					}
					fmt.Fprintf(&sum, "| %d | %s | %d | %d | %d | %.0f | %s | %s | %s | %s | %d | %d | %s | %.1f | %s | %.1f |\n", n, mode, run, r.OK, r.Errors, r.PerSec, q(50), q(95), q(99), q(100), r.Accepted, r.Spans, perJob, r.CoordCPU, cpuPerJob, r.HarnessCPU)
					k := key{n, mode}
					if _, ok := agg[k]; !ok {
						order = append(order, k)
					}
					agg[k] = append(agg[k], [4]float64{r.PerSec, float64(h.ValueAtQuantile(50)) / 1000, float64(h.ValueAtQuantile(99)) / 1000, r.CoordCPU / float64(max(r.Accepted, 1)) * 1e6})
				}
			}
		}
		if *submitRuns > 1 || len(modes) > 1 {
			sum.WriteString("\nMedian over runs [min–max]:\n\n| members | tracing | n | jobs/s | p50 ms | p99 ms | coord CPU µs/job |\n|---|---|---|---|---|---|---|\n")
			for _, k := range order {
				col := func(i int) string {
					var xs []float64
					for _, v := range agg[k] {
						xs = append(xs, v[i])
					}
					sm := bench.Summarize(xs)
					return fmt.Sprintf("%s [%s–%s]", f1(sm.P50), f1(sm.Min), f1(sm.Max))
				}
				fmt.Fprintf(&sum, "| %d | %s | %d | %s | %s | %s | %s |\n", k.n, k.mode, len(agg[k]), col(0), col(1), col(2), col(3))
			}
			sum.WriteString("\n(median = nearest-rank p50 of the runs: the middle one for odd n; coordinator CPU (process incl. its etcd member, from /proc) from warm-up start to window end, divided by the jobs accepted in the run)\n")
		}
		check(writeCSV(filepath.Join(*out, "submit.csv"), []string{"members", "tracing", "run", "clients", "conns", "duration", "ok", "errors", "jobs_per_s",
			"p50_ms", "p90_ms", "p95_ms", "p99_ms", "p999_ms", "max_ms", "mean_ms",
			"accepted", "spans", "spans_at_window_end", "spans_per_job", "spans_by_name", "otlp_requests", "span_file_bytes", "coord_cpu_s", "coord_cpu_us_per_accepted_job", "harness_cpu_s"}, rows))
		check(writeCSV(filepath.Join(*out, "submit-per-second.csv"), []string{"members", "tracing", "run", "second", "ok"}, series))
		sum.WriteString("\n(per-second counts, warm-up included: submit-per-second.csv)\n\n")
		sum.WriteString(notes.String())
	}

	if run["failover"] && ctx.Err() == nil {
		o := bench.DefaultFailover
		o.Trials = *foTrials
		trials, err := bench.Failover(ctx, cfg, o)
		if err != nil {
			cfg.Log.Write([]byte(fmt.Sprintf("failover: %v\n", err)))
			failed = true
		}
		md, err := bench.WriteFailover(*out, o, trials)
		check(err)
		sum.WriteString(md)
	}
	if run["shards"] && ctx.Err() == nil {
		o := bench.DefaultShards
		o.Failover.Trials, o.DrainTrials = *shardsFailoverTrials, *shardsDrainTrials
		o.Drain.TasksPerJob = int32(*shardsDrainTasks)
		if *shardsDrainLease > 0 {
			o.Drain.ExtraArgs = []string{"--node-lease-ttl", shardsDrainLease.String()}
		}
		md, err := bench.RunShards(ctx, cfg, o, *out)
		if err != nil {
			cfg.Log.Write([]byte(fmt.Sprintf("shards: %v\n", err)))
			failed = true
		}
		sum.WriteString(md)
	}
	if run["badnode"] && ctx.Err() == nil {
		o := bench.DefaultBadNode
		o.Trials = *badnodeTrials
		md, err := bench.RunBadNode(ctx, cfg, o, *out)
		if err != nil {
			cfg.Log.Write([]byte(fmt.Sprintf("badnode: %v\n", err)))
			failed = true
		}
		sum.WriteString(md)
	}
	if run["preempt"] && ctx.Err() == nil {
		o := bench.DefaultPreempt
		o.Trials, o.Coordinators = *preemptTrials, nil
		for _, c := range strings.Split(*preemptCoords, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(c))
			if err != nil || n < 1 {
				fatal(fmt.Errorf("-preempt-coordinators: %q is not a coordinator count (1, 3 or 5)", c))
			}
			o.Coordinators = append(o.Coordinators, n)
		}
		md, err := bench.RunPreempt(ctx, cfg, o, *out)
		if err != nil {
			cfg.Log.Write([]byte(fmt.Sprintf("preempt: %v\n", err)))
			failed = true
		}
		sum.WriteString(md)
	}
	if run["locality"] && ctx.Err() == nil {
		o := bench.DefaultLocality
		o.Runs = *localityRuns
		md, err := bench.RunLocality(ctx, cfg, o, *out)
		if err != nil {
			cfg.Log.Write([]byte(fmt.Sprintf("locality: %v\n", err)))
			failed = true
		}
		sum.WriteString(md)
	}
	if run["tlscost"] && ctx.Err() == nil {
		o := bench.DefaultTLSCost
		o.Runs, o.Nodes = *tlscostRuns, *tlscostNodes
		o.Clients, o.Conns, o.Warmup, o.Duration = *clients, *conns, *warmup, *duration
		md, err := bench.RunTLSCost(ctx, cfg, o, *out)
		if err != nil {
			cfg.Log.Write([]byte(fmt.Sprintf("tlscost: %v\n", err)))
			failed = true
		}
		sum.WriteString(md)
	}
	failed = runFederation(ctx, cfg, run, *out, &sum) || failed // federation.go: route-submit, region-kill (not in the default -only)
	failed = runLAN(ctx, cfg, run, *out, &sum) || failed        // lan.go: agentfail, serfcpu, ownerdetect
	failed = runFleetScale(ctx, cfg, run, *out, &sum) || failed // fleetscale.go: fleet10k (not in the default -only)
	failed = runMillion(ctx, cfg, run, *out, &sum) || failed    // million.go: million, drain-noop (issue 16, not in the default -only)
	failed = runThroughput(ctx, cfg, run, *out, &sum) || failed // throughput.go: issue 16 (not in the default -only)
	check(os.WriteFile(filepath.Join(*out, "summary.md"), []byte(sum.String()), 0o644))
	fmt.Print(sum.String())
	if failed {
		fmt.Fprintf(os.Stderr, "some benchmarks failed; logs kept in %s\n", *work)
		os.Exit(1)
	}
	if !keep {
		_ = os.RemoveAll(*work)
	}
}

func hostInfo() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return runtime.GOOS + "/" + runtime.GOARCH
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "model name") {
			if _, v, ok := strings.Cut(l, ":"); ok {
				return strings.TrimSpace(v)
			}
		}
	}
	return runtime.GOOS + "/" + runtime.GOARCH
}

func itoa(i int) string { return strconv.Itoa(i) }
func joinInts(xs []int) string {
	var s []string
	for _, x := range xs {
		s = append(s, strconv.Itoa(x))
	}
	return strings.Join(s, ",")
}
func f1(x float64) string { return strconv.FormatFloat(x, 'f', 1, 64) }
func check(err error) {
	if err != nil {
		fatal(err)
	}
}
func fatal(err error) {
	fmt.Fprintln(os.Stderr, "apiary-bench:", err)
	os.Exit(2)
}
func writeCSV(path string, header []string, rows [][]string) error {
	return bench.WriteCSV(path, header, rows)
}
