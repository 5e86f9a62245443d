package main

// serf LAN pool benchmarks (issue 20): agentfail (kill-agent → task running
// elsewhere, with and without the pool), serfcpu (gossip cost per agent at
// 50 agents) and ownerdetect (owner killed or paused → deposed, per
// detector). In the default -only set; alone:
//
//	go run ./loadtest/bench/cmd/apiary-bench -bin bin/apiary -only agentfail,serfcpu,ownerdetect \
//	    -out loadtest/results/lan-$(date +%F)

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"apiary.dev/apiary/loadtest/bench"
)

var (
	agentFailTrials = flag.Int("agentfail-trials", bench.DefaultAgentFail.Trials, "agentfail: kills per mode (with and without the LAN pool)")
	serfCPUAgents   = flag.Int("serfcpu-agents", bench.DefaultSerfCPU.Agents, "serfcpu: in-process agent members in the pool")
	serfCPUWindow   = flag.Duration("serfcpu-window", bench.DefaultSerfCPU.Window, "serfcpu: length of each measured phase (idle, tag updates)")
	ownerTrials     = flag.Int("ownerdetect-trials", bench.DefaultOwnerDetect.Trials, "ownerdetect: kills and pauses per detector")
)

// runLAN runs the LAN benchmarks selected in run, writes their CSVs to out
// and appends to sum; it reports whether one failed.
func runLAN(ctx context.Context, cfg bench.Config, run map[string]bool, out string, sum *strings.Builder) (failed bool) {
	logf := func(format string, args ...any) { fmt.Fprintf(cfg.Log, format+"\n", args...) }
	if run["agentfail"] && ctx.Err() == nil {
		var rows [][]string
		byMode := map[bool][]bench.AgentFailTrial{}
		for _, withLAN := range []bool{true, false} {
			o := bench.DefaultAgentFail
			o.Trials, o.LAN = *agentFailTrials, withLAN
			trials, err := bench.AgentFail(ctx, cfg, o)
			if err != nil {
				logf("agentfail (lan %v): %v", withLAN, err)
				failed = true
			}
			byMode[withLAN] = trials
			for _, t := range trials {
				rows = append(rows, []string{strconv.FormatBool(t.LAN), itoa(t.Trial), t.Victim, strconv.FormatInt(t.Epoch, 10),
					f1(t.DetectMs), f1(t.AliveGoneMs), f1(t.DispatchMs), f1(t.RunningMs), strconv.FormatBool(t.FastPath)})
			}
		}
		check(writeCSV(filepath.Join(out, "agentfail.csv"), []string{"lan", "trial", "victim", "epoch",
			"serf_detect_ms", "alive_key_gone_ms", "attempt2_dispatch_ms", "attempt2_running_ms", "fast_path"}, rows))
		o := bench.DefaultAgentFail
		fmt.Fprintf(sum, "## agentfail\n\nOne coordinator (%s, --node-lease-ttl %s: the default), %d agents, one single-task job (`sleep 3600`) at a time. Each trial: wait until the task is RUNNING, SIGKILL its agent, time (harness clock, etcd watch) until attempt 2 is written ASSIGNED on another node and until it is RUNNING there (the agent's STARTED report, sent 100 ms after the process starts); then cancel the job and restart the agent. "+
			"With the LAN pool (devcluster's default) and without (`NoLAN`: leases only), %d trials each, in the same run. Floor of the fast path: the harness's own serf member in the pool (an observer) receiving EventMemberFailed for the agent. Trials start after the first owner term's failover grace.\n\n",
			strings.Join(o.ExtraArgs, " "), o.LeaseTTL, o.Agents, *agentFailTrials)
		sum.WriteString("| ms from SIGKILL | with LAN pool | leases only |\n|---|---|---|\n")
		col := func(lanOn bool, f func(bench.AgentFailTrial) float64) string {
			var xs []float64
			for _, t := range byMode[lanOn] {
				if v := f(t); v > 0 {
					xs = append(xs, v)
				}
			}
			return bench.Summarize(xs).String()
		}
		detect := func(t bench.AgentFailTrial) float64 { return t.DetectMs }
		gone := func(t bench.AgentFailTrial) float64 { return t.AliveGoneMs }
		disp := func(t bench.AgentFailTrial) float64 { return t.DispatchMs }
		running := func(t bench.AgentFailTrial) float64 { return t.RunningMs }
		fmt.Fprintf(sum, "| serf detection (observer; floor) | %s | - |\n| node's alive key deleted | %s | %s |\n| attempt 2 dispatched elsewhere | %s | %s |\n| **attempt 2 RUNNING elsewhere** | %s | %s |\n\n",
			col(true, detect), col(true, gone), col(false, gone), col(true, disp), col(false, disp), col(true, running), col(false, running))
		fast := 0
		for _, t := range byMode[true] {
			if t.FastPath {
				fast++
			}
		}
		lanRun, leaseRun := bench.Summarize(collect(byMode[true], running)), bench.Summarize(collect(byMode[false], running))
		floor := bench.Summarize(collect(byMode[true], detect))
		fmt.Fprintf(sum, "With the pool, %d of %d trials were reclaimed by the fast path (apiary_lan_fast_reclaims_total grew). Running elsewhere, p50: %.0f ms with the pool (%.2f x the serf detection floor's p50 of %.0f ms; +%.0f ms over it), %.0f ms on leases only (%.2f x the floor). Target: p50 < 1200 ms, p95 < 1800 ms.\n\n",
			fast, len(byMode[true]), lanRun.P50, ratio(lanRun.P50, floor.P50), floor.P50, lanRun.P50-floor.P50, leaseRun.P50, ratio(leaseRun.P50, floor.P50))
	}

	if run["serfcpu"] && ctx.Err() == nil {
		o := bench.DefaultSerfCPU
		o.Agents, o.Window = *serfCPUAgents, *serfCPUWindow
		r, err := bench.SerfCPU(ctx, cfg, o)
		if err != nil {
			logf("serfcpu: %v", err)
			failed = true
		} else {
			var dets []string
			for _, d := range r.DetectMs {
				dets = append(dets, f1(d))
			}
			check(writeCSV(filepath.Join(out, "serfcpu.csv"), []string{"agents", "members", "window_s", "idle_cpu_s", "tags_cpu_s", "tag_updates",
				"idle_cpu_s_per_agent_min", "tags_cpu_s_per_agent_min", "detect_ms"},
				[][]string{{itoa(r.Agents), itoa(r.Members), f1(r.Window.Seconds()), strconv.FormatFloat(r.IdleCPUSeconds, 'f', 3, 64), strconv.FormatFloat(r.TagsCPUSeconds, 'f', 3, 64),
					strconv.FormatInt(r.TagUpdates, 10), strconv.FormatFloat(r.IdlePerAgentMin, 'f', 4, 64), strconv.FormatFloat(r.TagsPerAgentMin, 'f', 4, 64), strings.Join(dets, " ")}}))
			fmt.Fprintf(sum, "## serfcpu\n\n%d agent members and 1 coordinator member of one LAN pool (internal/lan's tuned configuration: probe 200 ms, timeout 100 ms, suspicion x2, gossip 50 ms), all in the harness process on loopback (port 0). CPU: getrusage(RUSAGE_SELF) user+system over each %s window (serf, memberlist and the Go runtime of %d members, nothing else in the process). Then %d agents shut down without leaving, one at a time, timed to the coordinator member's EventMemberFailed.\n\n",
				r.Agents, r.Window, r.Members, len(r.DetectMs))
			fmt.Fprintf(sum, "| phase | CPU s | CPU s per agent per minute |\n|---|---|---|\n| idle (membership only) | %.2f | %.4f |\n| every agent changes its free-capacity tag every %s (%d updates) | %.2f | %.4f |\n\ncrash detection with %d members: %s ms\n\n",
				r.IdleCPUSeconds, r.IdlePerAgentMin, o.TagEvery, r.TagUpdates, r.TagsCPUSeconds, r.TagsPerAgentMin, r.Members, bench.Summarize(r.DetectMs))
		}
	}

	if run["ownerdetect"] && ctx.Err() == nil {
		o := bench.DefaultOwnerDetect
		o.Trials = *ownerTrials
		trials, err := bench.OwnerDetect(ctx, cfg, o)
		if err != nil {
			logf("ownerdetect: %v", err)
			failed = true
		}
		var rows [][]string
		cells := map[string][]float64{}
		for _, t := range trials {
			rows = append(rows, []string{t.Detector, t.Fault, itoa(t.Trial), t.Owner, strconv.FormatBool(t.KilledLeader), f1(t.DeposedMs)})
			cells[t.Detector+"/"+t.Fault] = append(cells[t.Detector+"/"+t.Fault], t.DeposedMs)
		}
		check(writeCSV(filepath.Join(out, "ownerdetect.csv"), []string{"detector", "fault", "trial", "owner", "owner_was_etcd_leader", "deposed_ms"}, rows))
		fmt.Fprintf(sum, "## ownerdetect\n\n3-coordinator region (%s, owner lease 2 s, suspect-after 300 ms: defaults), no agents. Each trial: SIGKILL the shard owner (then restart it), or SIGSTOP it until it is deposed (then SIGCONT); time from the fault to the deletion of its election key (revoked on suspicion, or expired), watched on a surviving member. Detectors: tcp = the API-port probe alone (no LAN pool); lan = the LAN pool alone (--suspect-after -1s); both = a pool and the probe (what a region with --lan-addr runs). %d trials per cell.\n\n| ms from fault to owner deposed | kill | pause |\n|---|---|---|\n",
			strings.Join(o.ExtraArgs, " "), o.Trials)
		for _, d := range bench.OwnerDetectors {
			fmt.Fprintf(sum, "| %s | %s | %s |\n", d.Name, bench.Summarize(cells[d.Name+"/kill"]), bench.Summarize(cells[d.Name+"/pause"]))
		}
		sum.WriteString("\n(a paused owner is never refused by its port: with tcp alone it is deposed only when its lease expires)\n\n")
	}
	return failed
}

func collect(ts []bench.AgentFailTrial, f func(bench.AgentFailTrial) float64) []float64 {
	var xs []float64
	for _, t := range ts {
		if v := f(t); v > 0 {
			xs = append(xs, v)
		}
	}
	slices.Sort(xs)
	return xs
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}
