package main

import (
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"apiary.dev/apiary/agent"
	"apiary.dev/apiary/internal/faulthook"
	"apiary.dev/apiary/internal/lifecycle"
	"apiary.dev/apiary/internal/pki"
	"apiary.dev/apiary/internal/telemetry"
)

func init() { register(newAgentCmd) }

// newAgentCmd is `apiary agent`: the node agent, run until SIGINT/SIGTERM.
func newAgentCmd() *cobra.Command {
	var (
		addr                           string
		nodeID                         string
		labels                         []string
		cpuMillis                      int64
		memoryMB                       int64
		gpus                           int32
		gpuModel                       string
		maxTasks                       int
		datasetDir                     string
		datasetRescan                  time.Duration
		dataDir                        string
		tailBytes                      int
		retention                      time.Duration
		disconnectGrace, drainDeadline time.Duration
		logFormat                      string
		lanAddr                        string
		cgroups                        string
		reservedCPU                    int64
		faultFile                      string
		joinTokenFile                  string
		taskUsers                      bool
		taskUIDRange                   string
		executor                       string
		tel                            telemetryFlags
		tlsf                           serverTLSFlags
		gossipf                        gossipFlags
	)
	defaultAddr := os.Getenv("APIARY_ADDR")
	if defaultAddr == "" {
		defaultAddr = agent.DefaultAddr
	}
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run a node agent: register with the region, run assigned tasks as subprocesses",
		Long: `Run a node agent. It registers this host with a coordinator of its region
(labels, capacity), keeps its lease alive, receives assignments, and runs each
attempt as a subprocess in its own working directory and process group under
--data-dir/work/<job>/<task>/<attempt>/, where full stdout/stderr logs stay
for --work-retention after the attempt ends (0 keeps them). Capacity is
detected unless given. While no coordinator answers, running tasks go on for
--disconnect-grace (or their job's disconnect.lost_after). SIGINT or SIGTERM
drains it: no new tasks, running ones stopped after --drain-deadline (default
at once) and handed back to run elsewhere without using up their
max_attempts, then the node's lease is released.

Run as root, the agent runs each attempt as a user of its own, taken from
--task-uid-range (uid and gid, no supplementary groups; systemd's
DynamicUser): its working dir is its own (mode 0700), and it can read neither
another attempt's environment (/proc/<pid>/environ, secret_env values
included) nor the agent's data dir, keyring, join token or TLS key. Without
root, or with --task-user-isolation=false, tasks run as the agent's user and
can read all of these; the agent says so at start. Run agents as root, or one
agent per trust domain.

A task's resources.limits (QoS classes: limits equal to the requests make it
Guaranteed) are enforced in its attempt's cgroup (--cgroups), written before
the process starts: the memory limit (v1 memory.limit_in_bytes and
memory.memsw.limit_in_bytes, v2 memory.max with memory.swap.max 0), whose
OOM kill is reported in the attempt's error ("killed by its memory limit
(256 MiB): the cgroup's OOM killer ended it"), and the CPU limit as a CFS
quota per 100 ms period (v1 cpu.cfs_quota_us, v2 cpu.max). Without cgroups,
or without the memory or cpu controller, those limits cannot be enforced:
the agent says so once at start ("resource limits not enforced") and runs
such tasks without them; it never refuses a task for its limits.

A region that runs with ACLs (--acl) takes a node only with an agent join
token of that region (apiary acl token create --type agent --region R
[--node-id ID]): give its secret as --join-token-file or $` + EnvJoinToken + `.
A registration refused for its token (or certificate) is logged at ERROR with
what to do, once per distinct answer and again every 5 minutes, and retried
with backoff; the attempts the node still ran from its ended epoch are killed
at once and not reported, as the region has given their tasks to other nodes
(after 'apiary acl token revoke', say). A coordinator that is only
unreachable is not a refusal: tasks then run on for --disconnect-grace.

With --gossip-key (or $` + EnvGossipKey + `) the agent's member of the region's
serf LAN pool is encrypted; it must hold a key of the region's pool. An agent
that cannot join the pool (no key, another key) says so at ERROR and runs on
its lease alone: the region then sees it fail only when the lease lapses.

--executor noop[:DURATION] is for measuring the control plane only: no
process, work dir or cgroup; each attempt is a timer that exits 0 after
DURATION (default at once), reported through the same admission, reports
and fencing as a process. The default, --executor exec, runs processes.

With --tls-ca, --tls-cert and --tls-key (an agent certificate: apiary tls
cert create --role agent --region R --id NODE), the agent reaches its
coordinators with mutual TLS, verifying that they hold a region certificate
of the certificate's region; the node id is the certificate's id (--node-id
may only repeat it), and a coordinator accepts this node's calls over this
certificate only. Without TLS it refuses to start unless --insecure-dev says
so.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := agentLogger(logFormat)
			if err != nil {
				return withCode(exitInvalid, err)
			}
			lbls, err := parseAgentLabels(labels)
			if err != nil {
				return withCode(exitInvalid, err)
			}
			if err := checkAgentAddrs(addr, lanAddr, tel.metricsAddr); err != nil {
				return err
			}
			exe, err := agent.ParseExecutor(executor)
			if err != nil {
				return withCode(exitInvalid, fmt.Errorf("--%w", err))
			}
			if cpuMillis < 0 || memoryMB < 0 || gpus < 0 || maxTasks < 0 {
				return withCode(exitInvalid, fmt.Errorf("--cpu-millis, --memory-mb, --gpus and --max-tasks must be >= 0"))
			}
			if tailBytes < 0 {
				return withCode(exitInvalid, fmt.Errorf("--tail-bytes must be >= 0"))
			}
			if disconnectGrace <= 0 {
				return withCode(exitInvalid, fmt.Errorf("--disconnect-grace must be > 0"))
			}
			if drainDeadline < 0 {
				return withCode(exitInvalid, fmt.Errorf("--drain-deadline must be >= 0"))
			}
			if retention < 0 {
				return withCode(exitInvalid, fmt.Errorf("--work-retention must be >= 0 (0 keeps every attempt's directory)"))
			}
			if retention == 0 {
				retention = -1 // keep everything; 0 means the default in agent.Config
			}
			if cmd.Flags().Changed("tail-bytes") && tailBytes == 0 {
				tailBytes = -1 // explicitly no tail; 0 means the default in agent.Config
			}
			tlsR, err := tlsf.load("agent", pki.RoleAgent, "", logger, fmt.Sprintf("any process that can reach its coordinators (%s) "+
				"can act as this node, and whatever answers at that address is trusted to send it commands to run", addr))
			if err != nil {
				return err
			}
			// The transport: mutual TLS verifying the coordinators of the
			// certificate's region, or plain gRPC (--insecure-dev). Named
			// explicitly, as extra options replace the agent's default.
			creds := grpc.WithTransportCredentials(insecure.NewCredentials())
			serverName := ""
			if tlsR != nil {
				id := tlsR.Identity()
				if nodeID == "" {
					nodeID = id.ID
				} else if nodeID != id.ID {
					return withCode(exitInvalid, fmt.Errorf("--node-id %s: the agent certificate (--tls-cert %s) is of node %s (%s); "+
						"a node acts only as its certificate's node: drop --node-id or give %s", nodeID, tlsf.files.Cert, id.ID, id, id.ID))
				}
				serverName = pki.RegionServerName(id.Region)
				creds = pki.DialOption(tlsR, serverName)
			}
			gossipKey, err := gossipf.resolve(cmd)
			if err != nil {
				return err
			}
			joinToken, err := resolveJoinToken(joinTokenFile)
			if err != nil {
				return err
			}
			if joinToken != "" && tlsR == nil {
				logger.Warn("the join token goes to the coordinators in plaintext (--insecure-dev): anyone on the way can read it and register a node with it")
			}
			// Task users: default on as root (agent.TaskUsersAuto), on
			// when asked for (New then refuses where it cannot work).
			taskUsersMode := agent.TaskUsersAuto
			if cmd.Flags().Changed("task-user-isolation") {
				taskUsersMode = map[bool]string{true: agent.TaskUsersOn, false: agent.TaskUsersOff}[taskUsers]
			}
			uidRange, err := agent.ParseUIDRange(taskUIDRange)
			if err != nil {
				return withCode(exitInvalid, fmt.Errorf("--task-uid-range: %w", err))
			}
			var secretFiles []string
			if tlsR != nil {
				secretFiles = append(secretFiles, tlsf.files.Key)
			}
			if joinTokenFile != "" {
				secretFiles = append(secretFiles, joinTokenFile)
			}
			dialOpts := []grpc.DialOption{creds}
			if faultFile != "" {
				hook, err := faulthook.New(faultFile, 0)
				if err != nil {
					return withCode(exitInvalid, err)
				}
				dialOpts = append(dialOpts, hook.DialOptions()...)
				logger.Warn("fault hook installed: every gRPC call to the coordinators fails while the file exists (serf LAN traffic is not cut)",
					"fault_file", faultFile)
			}
			tel.shipTo = addr // task.run spans go to the coordinators' span buffers (apiary trace)
			tel.shipTLS, tel.shipServerName = tlsR, serverName
			tp, stopTracing, err := tel.setup("apiary-agent", nodeID)
			if err != nil {
				return withCode(exitInvalid, err)
			}
			defer stopTracing()
			a, err := agent.New(agent.Config{
				TracerProvider:   tp,
				MetricsAddr:      tel.metricsAddr,
				NodeID:           nodeID,
				Labels:           lbls,
				Capacity:         agent.Resources{CPUMillis: cpuMillis, MemoryMB: memoryMB, GPUs: gpus},
				GPUModel:         gpuModel,
				MaxTasks:         maxTasks,
				DatasetDir:       datasetDir,
				DatasetRescan:    datasetRescan,
				DataDir:          dataDir,
				CoordinatorAddrs: strings.Split(addr, ","),
				TailBytes:        tailBytes,
				WorkRetention:    retention,
				DisconnectGrace:  disconnectGrace,
				DrainDeadline:    drainDeadline,
				Logger:           logger,
				LANAddr:          lanAddr,
				DialOptions:      dialOpts,
				JoinToken:        joinToken,

				// Gossip encryption of the LAN member (keyring.go).
				GossipKey:         gossipKey,
				GossipKeyringFile: gossipf.file,
				GossipWarnPlain:   tlsR != nil,

				// Containment of the tasks (agent/cgroup.go), the host's reserve.
				Executor:          exe,
				Cgroups:           cgroups,
				ReservedCPUMillis: reservedCPU,
				TaskUsers:         taskUsersMode,
				TaskUIDs:          uidRange,
				SecretFiles:       secretFiles,
			})
			if err != nil {
				return withCode(exitInvalid, err)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			// The agent's parts (agent.Agent.Parts: data-dir, metrics,
			// janitor, sessions), started in order, stopped in reverse.
			var parts []lifecycle.Part
			if tlsR != nil {
				// Follows the certificate files: new connections to the
				// coordinators use what it loaded.
				parts = append(parts, lifecycle.Loop("tls", tlsR.Run))
			}
			if err := lifecycle.Run(ctx, logger, 0, append(parts, a.Parts()...)...); err != nil {
				// A part failed (as for region and global): exit 3.
				return withCode(exitUnavailable, err)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "addr", defaultAddr, "comma-separated coordinator gRPC addresses (env APIARY_ADDR); the agent starts at the one its node id hashes to, so a fleet given one list spreads over all of them, and moves round the list when one fails")
	f.StringVar(&nodeID, "node-id", "", "node id (default: the TLS certificate's id with --tls-cert, else the host name)")
	f.StringArrayVar(&labels, "label", nil, "node label k=v (repeatable)")
	f.Int64Var(&cpuMillis, "cpu-millis", 0, "CPU capacity in millicores (default: number of CPUs x 1000, the whole host; give agents that share a host a share each)")
	f.Int64Var(&memoryMB, "memory-mb", 0, "memory capacity in MiB (default: MemTotal from /proc/meminfo, the whole host; give agents that share a host a share each)")
	f.Int32Var(&gpus, "gpus", 0, "number of GPUs")
	f.StringVar(&gpuModel, "gpu-model", "", "GPU model name")
	f.IntVar(&maxTasks, "max-tasks", 0, "max concurrent tasks (0: limited by resources only)")
	f.StringVar(&dataDir, "data-dir", "", "directory for task working dirs and full logs (default: $TMPDIR/apiary-agent-<node-id>)")
	f.StringVar(&datasetDir, "dataset-dir", "", "the node's dataset cache: each subdirectory is a dataset (its name; its size the bytes of its files), rescanned every --dataset-rescan, reported to the region for data-locality placement and given to tasks that list it as APIARY_DATASET_<NAME>; completed tasks' outputs are moved into it (default: <data-dir>/datasets)")
	f.DurationVar(&datasetRescan, "dataset-rescan", agent.DefaultDatasetRescan, "how often --dataset-dir is rescanned for added, removed or resized datasets")
	f.IntVar(&tailBytes, "tail-bytes", agent.DefaultTailBytes, "bytes of stdout and of stderr tail sent with each result")
	f.DurationVar(&retention, "work-retention", agent.DefaultWorkRetention, "remove a finished attempt's directory (working dir, full logs) this long after its last change (0: keep)")
	f.StringVar(&logFormat, "log-format", "text", "log format: text or json")
	f.StringVar(&cgroups, "cgroups", agent.CgroupsAuto, "contain each attempt in a cgroup of its own, killed as a whole when the attempt ends (setsid escapees included) and measured: auto (v2 with memory and pids, else v1 with memory, pids and freezer, else v2 without them), v1, v2 or off; when unusable the agent logs why and runs without (and without enforcing tasks' resources.limits)")
	f.Int64Var(&reservedCPU, "reserved-cpu-millis", 0, "CPU kept for the agent and the host's daemons (Kubernetes' system-reserved), subtracted from the detected CPU capacity; not with --cpu-millis")
	f.StringVar(&lanAddr, "lan-addr", "", `host:port (UDP and TCP) of this agent's member of the region's serf LAN pool, joined through the addresses the coordinator returns at registration; a crash is then seen in about 1 s instead of a lease TTL (default: the local address of the route to the first --addr, port 0; "off": no member, the lease alone)`)
	f.DurationVar(&disconnectGrace, "disconnect-grace", agent.DefaultDisconnectGrace, "keep attempts running this long while no coordinator answers (jobs' disconnect.lost_after overrides it), then kill them")
	f.DurationVar(&drainDeadline, "drain-deadline", 0, "on SIGTERM/SIGINT: let running attempts finish this long, then stop the rest and hand them back (DRAINED, not charged) and release the lease (0: at once)")
	f.BoolVar(&taskUsers, "task-user-isolation", true, "run each attempt as a user of its own from --task-uid-range (its work dir 0700 and owned by it), so that tasks cannot read each other's environment (secret_env values) or the agent's credentials; "+
		"needs root and a --data-dir every directory above which others may search (default: on when both hold, else off with a warning; true: refuse to start without them; false: tasks run as the agent's user, with a warning)")
	f.StringVar(&taskUIDRange, "task-uid-range", agent.DefaultTaskUIDs.String(), "user and group ids for --task-user-isolation, FIRST-LAST; no account on the host may use them (ids of /etc/passwd and /etc/group are skipped)")
	f.StringVar(&joinTokenFile, "join-token-file", "", "file holding the secret of this node's join token (apiary acl token create --type agent --region R), sent with every registration; needed by a region that runs with --acl (default $"+EnvJoinToken+", which the agent removes from its environment so that tasks never see it)")
	f.StringVar(&executor, "executor", "exec", "how attempts run: exec (a subprocess each) or, to measure the control plane only, noop[:DURATION] (no process, work dir or cgroup: each attempt is a timer that exits 0 after DURATION, default at once; the command is ignored)")
	f.StringVar(&faultFile, "fault-file", "", "fault tests only (internal/faulthook): while this file exists, every gRPC call to the coordinators fails with UNAVAILABLE and open streams are cut, as in a network partition (the serf LAN member is not cut); 'apiary loadtest failover --scenario partition-agent' creates and removes it")
	_ = f.MarkHidden("fault-file")
	tel.add(cmd)
	tlsf.add(cmd)
	gossipf.add(cmd, "where serf keeps the LAN member's gossip keyring, rewritten by every 'apiary keyring' change so that it survives restarts; loaded instead of --gossip-key when it exists (default <data-dir>/gossip.keyring)")
	return cmd
}

// EnvJoinToken is --join-token-file's fallback: the join token's secret
// itself. `apiary agent` removes it from its environment before anything
// starts, so that no task inherits it (as it does $APIARY_GOSSIP_KEY).
const EnvJoinToken = "APIARY_JOIN_TOKEN"

// resolveJoinToken returns the join token of --join-token-file (the file's
// content, surrounding white space trimmed), else of $APIARY_JOIN_TOKEN,
// else "". It removes $APIARY_JOIN_TOKEN from the environment in every
// case. An unreadable or empty file, or an empty variable, exits 2.
func resolveJoinToken(file string) (string, error) {
	env, inEnv := os.LookupEnv(EnvJoinToken)
	_ = os.Unsetenv(EnvJoinToken)
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", withCode(exitInvalid, fmt.Errorf("--join-token-file: %w", err))
		}
		tok := strings.TrimSpace(string(b))
		if tok == "" {
			return "", withCode(exitInvalid, fmt.Errorf("--join-token-file %s: empty (it must hold the join token's secret)", file))
		}
		return tok, nil
	}
	if inEnv {
		tok := strings.TrimSpace(env)
		if tok == "" {
			return "", withCode(exitInvalid, fmt.Errorf("$%s: empty (set it to the join token's secret, or unset it)", EnvJoinToken))
		}
		return tok, nil
	}
	return "", nil
}

// agentLogger returns a slog logger on stderr in the given format.
// (trace and span ids on the lines of an attempt).
func agentLogger(format string) (*slog.Logger, error) {
	return telemetry.NewLogger(format, os.Stderr)
}

// parseAgentLabels parses repeated k=v flags into a map.
func parseAgentLabels(kvs []string) (map[string]string, error) {
	out := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("--label %q: want key=value", kv)
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("--label %q: label %q given twice", kv, k)
		}
		out[k] = v
	}
	return out, nil
}
