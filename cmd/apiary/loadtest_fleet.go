package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"apiary.dev/apiary/agent"
	"apiary.dev/apiary/internal/telemetry"
	"apiary.dev/apiary/loadtest"
)

// newLoadtestFleetCmd is `apiary loadtest fleet`: N simulated agents in
// this process (loadtest.RunFleet) against an existing region.
func newLoadtestFleetCmd() *cobra.Command {
	var (
		o                   loadtest.FleetOptions
		region, executor    string
		labels              []string
		output, logLevel    string
		joinTokenFile       string
		duration            time.Duration
		cpuMillis, memoryMB int64
	)
	cmd := &cobra.Command{
		Use:   "fleet",
		Short: "Run N simulated node agents (noop executor) in this process against a region",
		Long: `Run --agents node agents in this one process against an existing region
(--region: its coordinators' gRPC addresses, plaintext, i.e. a region run
with --insecure-dev). Each is the real agent (agent.Agent): its own node id
<node-prefix>-<i>, labels, capacity, node epoch, lease, heartbeats,
assignment stream, local admission and reports. Attempts run on the noop
executor (--executor noop[:DURATION]): no process, each a timer that exits
0, so 10,000 agents fit on one machine and what is measured is the control
plane only, not how fast a host spawns tasks. The agents share a few gRPC
connections per coordinator; they run without cgroups, task users or serf
LAN members; their data dirs go under --data-dir (default: a temp dir,
removed at the end).

Agents start at --start-rate per second. Every --every, and once at the end,
a line says how many agents were started and hold a node epoch, when the
last one first registered, heartbeats and attempts per second, and this
process's own CPU (getrusage: user+system, % of one core) and resident
memory, so that the harness's cost is not mistaken for the coordinators'.
SIGINT or SIGTERM (or --duration) stops every agent as SIGTERM stops
'apiary agent': drained, final reports sent, leases released
(deregistered). Exit 1 if any agent stopped with an error.`,
		Example: `  apiary loadtest fleet --agents 1000 --region 127.0.0.1:7071 --max-tasks 32
  apiary loadtest fleet --agents 10000 --region 127.0.0.1:7071,127.0.0.1:7072,127.0.0.1:7073 --start-rate 500 --executor noop:2s -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "text" && output != "json" {
				return withCode(exitInvalid, fmt.Errorf("--output: must be text or json, got %q", output))
			}
			if executor != "noop" && !strings.HasPrefix(executor, "noop:") {
				return withCode(exitInvalid, fmt.Errorf("--executor %q: the fleet runs no processes; give noop or noop:DURATION", executor))
			}
			exe, err := agent.ParseExecutor(executor)
			if err != nil {
				return withCode(exitInvalid, fmt.Errorf("--%w", err))
			}
			if o.Labels, err = parseAgentLabels(labels); err != nil {
				return withCode(exitInvalid, err)
			}
			if duration < 0 {
				return withCode(exitInvalid, fmt.Errorf("--duration: must be >= 0 (0: until SIGINT/SIGTERM), got %s", duration))
			}
			level := new(slog.LevelVar)
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return withCode(exitInvalid, fmt.Errorf("--log-level: must be debug, info, warn or error, got %q", logLevel))
			}
			o.Logger = slog.New(telemetry.NewLogHandler(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level})))
			if o.JoinToken, err = resolveJoinToken(joinTokenFile); err != nil {
				return err
			}
			o.Addrs, o.Executor = strings.Split(region, ","), exe
			o.CPUMillis, o.MemoryMB = cpuMillis, memoryMB
			if o.DataDir == "" {
				o.DataDir = "-" // made below, once the rest is valid
			}
			if err := o.Defaults(); err != nil {
				return withCode(exitInvalid, err)
			}
			if o.DataDir == "-" {
				if o.DataDir, err = os.MkdirTemp("", "apiary-fleet-"); err != nil {
					return err
				}
				defer os.RemoveAll(o.DataDir)
			}
			w := cmd.OutOrStdout()
			enc := json.NewEncoder(w)
			o.Progress = func(s loadtest.FleetSample) {
				if output == "json" {
					_ = enc.Encode(s)
					return
				}
				fmt.Fprintf(w, "%s %s\n", time.Now().Format("15:04:05"), s)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if duration > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, duration)
				defer cancel()
			}
			if _, err := loadtest.RunFleet(ctx, o); err != nil {
				return withCode(exitJobFailed, err)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.Agents, "agents", 100, "simulated agents to run")
	f.StringVar(&region, "region", "", "comma-separated gRPC addresses of the region's coordinators (required)")
	_ = cmd.MarkFlagRequired("region")
	f.StringVar(&o.NodePrefix, "node-prefix", loadtest.DefaultFleetPrefix, "node ids are <node-prefix>-<i>, i from 0")
	f.StringArrayVar(&labels, "label", nil, "node label k=v of every agent (repeatable)")
	f.Int64Var(&cpuMillis, "cpu-millis", 32000, "CPU capacity of each agent, in millicores")
	f.Int64Var(&memoryMB, "memory-mb", 65536, "memory capacity of each agent, in MiB")
	f.IntVar(&o.MaxTasks, "max-tasks", 32, "max concurrent tasks of each agent (0: resources only)")
	f.StringVar(&executor, "executor", "noop", "noop or noop:DURATION: each attempt exits 0 after DURATION (default at once), no process")
	f.Float64Var(&o.StartRate, "start-rate", loadtest.DefaultFleetStartRate, "agents started per second")
	f.IntVar(&o.ConnsPerAddr, "conns-per-addr", 0, "gRPC connections to each coordinator shared by the agents (0: one per 250 agents, at most 64)")
	f.StringVar(&o.DataDir, "data-dir", "", "parent of the agents' data dirs (default: a temp dir, removed at the end)")
	f.StringVar(&joinTokenFile, "join-token-file", "", "join token secret for every agent (a region with --acl; the token must not be bound to a node id); default $"+EnvJoinToken)
	f.DurationVar(&o.Every, "every", loadtest.DefaultFleetEvery, "interval of the progress lines")
	f.DurationVar(&duration, "duration", 0, "stop after this long (0: at SIGINT/SIGTERM)")
	f.StringVarP(&output, "output", "o", "text", "text, or json (one object per progress line)")
	f.StringVar(&logLevel, "log-level", "error", "the agents' log level on stderr: debug, info, warn or error")
	return cmd
}
