package main

// Fleet-scale benchmark (issue 16): 10,000 simulated agents on a 3-member
// region: ramp, steady state (heartbeats, each process's CPU and RSS),
// restart and re-registration storms against an etcd floor measured in the
// same run. Not in the default -only set (about 15 minutes at 10,000
// agents); run it alone on a quiet machine:
//
//	go run ./loadtest/bench/cmd/apiary-bench -bin bin/apiary -only fleet10k \
//	    -out loadtest/results/fleet10k-$(date +%F)
//
// Small, for development: -fleet-agents 300 -fleet-window 10s -fleet-storms 1.

import (
	"context"
	"flag"
	"fmt"
	"strings"

	"apiary.dev/apiary/loadtest/bench"
)

var (
	fleetAgents    = flag.Int("fleet-agents", bench.DefaultFleetScale.Agents, "fleet10k: simulated agents (one `apiary loadtest fleet` subprocess)")
	fleetWindow    = flag.Duration("fleet-window", bench.DefaultFleetScale.Window, "fleet10k: steady-state window, after every agent registered")
	fleetStorms    = flag.Int("fleet-storms", bench.DefaultFleetScale.Storms, "fleet10k: storm rounds (each: a restart storm and a re-registration storm)")
	fleetStartRate = flag.Float64("fleet-start-rate", bench.DefaultFleetScale.StartRate, "fleet10k: agents the fleet starts per second (the ramp)")
	fleetLease     = flag.Duration("fleet-node-lease", bench.DefaultFleetScale.LeaseTTL, "fleet10k: the region's --node-lease-ttl")
	fleetProfile   = flag.Duration("fleet-profile", bench.DefaultFleetScale.Profile, "fleet10k: each coordinator's CPU profile after the window (0: none)")
)

// runFleetScale runs the fleet10k benchmark when run["fleet10k"], writes
// its CSVs, PNGs and profiles to out and appends to sum; it reports whether
// it failed.
func runFleetScale(ctx context.Context, cfg bench.Config, run map[string]bool, out string, sum *strings.Builder) (failed bool) {
	if !run["fleet10k"] || ctx.Err() != nil {
		return false
	}
	o := bench.DefaultFleetScale
	o.Agents, o.Window, o.Storms = *fleetAgents, *fleetWindow, *fleetStorms
	o.StartRate, o.LeaseTTL, o.Profile = *fleetStartRate, *fleetLease, *fleetProfile
	res, err := bench.FleetScale(ctx, cfg, o)
	if err != nil {
		fmt.Fprintf(cfg.Log, "fleet10k: %v\n", err)
		failed = true
	}
	for _, s := range res.Storms {
		if s.Err != "" {
			failed = true
		}
	}
	md, err := bench.WriteFleetScale(out, res)
	check(err)
	sum.WriteString(md)
	return failed
}
