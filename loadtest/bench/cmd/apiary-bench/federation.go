package main

// Federation benchmarks (issue 6): route-submit and region-kill. Not in the
// default -only set (about 2 and 3 minutes); run them with
//
//	go run ./loadtest/bench/cmd/apiary-bench -bin bin/apiary -only route-submit,region-kill \
//	    -out loadtest/results/federation-$(date +%F)
//
// route-submit uses -clients, -conns, -warmup and -duration like submit.

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"apiary.dev/apiary/loadtest/bench"
)

var (
	routeRuns   = flag.Int("route-runs", 3, "route-submit: runs per target (router, direct), interleaved, a fresh federation each")
	killTrials  = flag.Int("region-kill-trials", bench.DefaultRegionKill.Trials, "region-kill: trials")
	killEvery   = flag.Duration("region-kill-every", bench.DefaultRegionKill.Every, "region-kill: period of the submission trickle through the router")
	killAfter   = flag.Duration("region-kill-after", bench.DefaultRegionKill.After, "region-kill: how long the trickle runs after the SIGKILL")
	killTimeout = flag.Duration("region-kill-timeout", bench.DefaultRegionKill.Timeout, "region-kill: deadline of each submission")
)

func flagValue[T any](name string) T {
	return flag.Lookup(name).Value.(flag.Getter).Get().(T)
}

// runFederation runs the federation benchmarks selected in run, writes their
// CSVs to out and appends to sum; it reports whether one failed.
func runFederation(ctx context.Context, cfg bench.Config, run map[string]bool, out string, sum *strings.Builder) (failed bool) {
	logf := func(format string, args ...any) { fmt.Fprintf(cfg.Log, format+"\n", args...) }
	if run["route-submit"] && ctx.Err() == nil {
		clients, conns := flagValue[int]("clients"), flagValue[int]("conns")
		warmup, duration := flagValue[time.Duration]("warmup"), flagValue[time.Duration]("duration")
		fmt.Fprintf(sum, "## route-submit\n\nSubmitJob of single-task unpinned jobs (no selector, no prefer; client_id + unique request_id), %d closed-loop clients over %d gRPC connections, %s warm-up then %s measured, "+
			"either through the global router or directly to region %s's coordinator (where the router sends these jobs: no agents, so no free capacity anywhere, ties broken by name). "+
			"Federation: router + 2 regions (%s, %s) of 1 coordinator each, no agents, no policy, one WAN pool; a fresh federation per run, targets interleaved, %d run(s) each.\n\n",
			clients, conns, warmup, duration, bench.FedFirst, bench.FedFirst, bench.FedSecond, *routeRuns)
		sum.WriteString("| target | run | ok | errors | jobs/s | p50 ms | p95 ms | p99 ms | max ms | answered by | router CPU s | coord CPU s |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		var rows [][]string
		agg := map[string][][3]float64{}
		for r := 1; r <= *routeRuns && ctx.Err() == nil; r++ {
			for _, target := range []string{"router", "direct"} {
				if ctx.Err() != nil {
					break
				}
				res, err := bench.RouteSubmit(ctx, cfg, bench.RouteSubmitOptions{Target: target, Clients: clients, Conns: conns, Warmup: warmup, Duration: duration, Run: r})
				if err != nil {
					logf("route-submit %s run %d: %v", target, r, err)
					failed = true
					continue
				}
				h := res.Latency
				q := func(p float64) string { return f1(float64(h.ValueAtQuantile(p)) / 1000) }
				regions := bench.FormatCounts(res.Regions)
				logf("route-submit %s run %d: %d ok, %d errors %v, %.0f jobs/s, p50 %s p95 %s p99 %s max %s ms; answered by %s; cpu s: router %.1f coordinators %.1f",
					target, r, res.OK, res.Errors, res.ErrCodes, res.PerSec, q(50), q(95), q(99), q(100), regions, res.RouterCPU, res.CoordCPU)
				rows = append(rows, []string{target, itoa(r), itoa(clients), itoa(conns), duration.String(), strconv.FormatInt(res.OK, 10), strconv.FormatInt(res.Errors, 10),
					f1(res.PerSec), q(50), q(90), q(95), q(99), q(99.9), q(100), f1(h.Mean() / 1000), regions, bench.FormatCounts(res.ErrCodes), f1(res.RouterCPU), f1(res.CoordCPU)})
				fmt.Fprintf(sum, "| %s | %d | %d | %d | %.0f | %s | %s | %s | %s | %s | %.1f | %.1f |\n", target, r, res.OK, res.Errors, res.PerSec, q(50), q(95), q(99), q(100), regions, res.RouterCPU, res.CoordCPU)
				agg[target] = append(agg[target], [3]float64{res.PerSec, float64(h.ValueAtQuantile(50)) / 1000, float64(h.ValueAtQuantile(99)) / 1000})
			}
		}
		check(writeCSV(filepath.Join(out, "route-submit.csv"), []string{"target", "run", "clients", "conns", "duration", "ok", "errors", "jobs_per_s",
			"p50_ms", "p90_ms", "p95_ms", "p99_ms", "p999_ms", "max_ms", "mean_ms", "answered_by_region", "error_codes", "router_cpu_s", "coord_cpu_s"}, rows))
		sum.WriteString("\nMedian over runs [min–max]:\n\n| target | n | jobs/s | p50 ms | p99 ms |\n|---|---|---|---|---|\n")
		for _, target := range []string{"router", "direct"} {
			col := func(i int) string {
				var xs []float64
				for _, v := range agg[target] {
					xs = append(xs, v[i])
				}
				s := bench.Summarize(xs)
				return fmt.Sprintf("%s [%s–%s]", f1(s.P50), f1(s.Min), f1(s.Max))
			}
			fmt.Fprintf(sum, "| %s | %d | %s | %s | %s |\n", target, len(agg[target]), col(0), col(1), col(2))
		}
		sum.WriteString("\n(median = nearest-rank p50 of the runs; raw per run: route-submit.csv)\n\n")
	}

	if run["region-kill"] && ctx.Err() == nil {
		o := bench.DefaultRegionKill
		o.Trials, o.Every, o.After, o.Timeout = *killTrials, *killEvery, *killAfter, *killTimeout
		trials, err := bench.RegionKill(ctx, cfg, o)
		if err != nil {
			logf("region-kill: %v", err)
			failed = true
		}
		var rows, subs [][]string
		var down, serf, first, last, beforeMax, errs, up, routed []float64
		for _, t := range trials {
			rows = append(rows, []string{itoa(t.Trial), t.Victim, t.Other, strings.Join(t.Killed, " "), itoa(t.PreKillVictim), itoa(t.PreKillOther), f1(t.PreKillP50Ms),
				f1(t.RouterDownMs), t.RouterDownWhy, f1(t.SerfFailedMs), f1(t.FirstOtherMs), f1(t.FirstOtherSent), f1(t.LastVictimMs), f1(t.LastVictimSent),
				itoa(t.InFlight), itoa(t.PostKillSent), itoa(t.PostKillOK), itoa(t.PostKillVictim), itoa(t.BeforeDown), f1(t.BeforeDownMaxMs), f1(t.PostKillP50Ms), f1(t.PostKillMaxMs),
				itoa(t.Errors), t.ErrorCodes, f1(t.RestartUpMs), f1(t.RestartRoutedMs)})
			for _, s := range t.Submissions {
				subs = append(subs, []string{itoa(t.Trial), f1(s.SentMs), f1(s.DoneMs), f1(s.DoneMs - s.SentMs), s.Region, s.Code})
			}
			down = append(down, t.RouterDownMs)
			serf = append(serf, t.SerfFailedMs)
			first = append(first, t.FirstOtherMs)
			last = append(last, t.LastVictimMs)
			beforeMax = append(beforeMax, t.BeforeDownMaxMs)
			errs = append(errs, float64(t.Errors))
			up = append(up, t.RestartUpMs)
			routed = append(routed, t.RestartRoutedMs)
		}
		check(writeCSV(filepath.Join(out, "region-kill.csv"), []string{"trial", "victim", "other", "killed", "prekill_victim_ok", "prekill_other_ok", "prekill_p50_ms",
			"router_down_ms", "router_down_reason", "serf_failed_ms", "first_other_ok_ms", "first_other_sent_ms", "last_victim_ok_ms", "last_victim_sent_ms",
			"in_flight_at_kill", "postkill_sent", "postkill_ok", "postkill_victim_ok", "sent_before_down", "sent_before_down_max_latency_ms", "postkill_p50_ms", "postkill_max_ms",
			"errors", "error_codes", "restart_up_ms", "restart_routed_ms"}, rows))
		check(writeCSV(filepath.Join(out, "region-kill-submissions.csv"), []string{"trial", "sent_ms_from_kill", "done_ms_from_kill", "latency_ms", "region", "error_code"}, subs))
		fmt.Fprintf(sum, "## region-kill\n\nRouter + 2 regions (%s, %s) of 1 coordinator each, no agents, no policy. A single-task job with region.prefer [%s] submitted through the router every %s (open loop, %s deadline, no client retry), %s before and %s after the kill. "+
			"Each trial: SIGKILL every coordinator of %s; times from the SIGKILL of the last; the router's view is polled with ListRegions every %s; then the coordinator is restarted and the trial ends when a preferring submission lands in %s again. n = %d trials on one federation.\n\n",
			bench.FedFirst, bench.FedSecond, bench.FedSecond, o.Every, o.Timeout, o.Before, o.After, bench.FedSecond, o.PollEvery, bench.FedSecond, len(trials))
		fmt.Fprintf(sum, "| quantity (ms from SIGKILL) | distribution |\n|---|---|\n| router lists the victim down (no longer eligible) | %s |\n| victim's coordinator failed in the WAN pool (serf) | %s |\n| first accepted submission answered by %s | %s |\n| last accepted submission answered by %s | %s |\n| max latency of submissions sent between kill and router-down | %s |\n| client-visible errors per trial (count) | %s |\n| restart → router lists it up | %s |\n| restart → preferring submission lands there | %s |\n\n",
			bench.Summarize(down), bench.Summarize(serf), bench.FedFirst, bench.Summarize(first), bench.FedSecond, bench.Summarize(last), bench.Summarize(beforeMax), bench.Summarize(errs), bench.Summarize(up), bench.Summarize(routed))
		sum.WriteString("(per trial: region-kill.csv; every submission with its send/answer time, region and error: region-kill-submissions.csv)\n\n")
	}
	return failed
}
