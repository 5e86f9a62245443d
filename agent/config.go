package agent

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"apiary.dev/apiary/internal/telemetry"
)

// Resources is an amount of node resources.
type Resources struct {
	// CPUMillis is CPU in millicores (1000 = one core).
	CPUMillis int64
	// MemoryMB is memory in MiB.
	MemoryMB int64
	// GPUs is a number of whole GPUs.
	GPUs int32
}

// Defaults used by Config.withDefaults.
const (
	DefaultTailBytes  = 16384
	DefaultKillGrace  = 3 * time.Second
	DefaultRPCTimeout = 5 * time.Second
	DefaultAddr       = "127.0.0.1:7070"
	// DefaultDisconnectGrace is how long attempts keep running while the
	// agent reaches no coordinator, for jobs without disconnect.lost_after.
	DefaultDisconnectGrace = 5 * time.Minute
	// DefaultWorkRetention is how long a finished attempt's directory
	// (working dir and full logs) is kept.
	DefaultWorkRetention = 24 * time.Hour
)

// Config configures an Agent. The zero value of every field means "use the
// default" documented on it; only CoordinatorAddrs has no default in New.
type Config struct {
	// NodeID names the node in its region. Default: the host name.
	NodeID string
	// Labels are the node's labels, matched by task constraints.
	Labels map[string]string
	// Capacity is what the node offers. A zero CPUMillis defaults to
	// runtime.NumCPU()*1000; a zero MemoryMB to MemTotal from /proc/meminfo
	// (in MiB); GPUs defaults to 0 (see HostCapacity). Agents sharing a
	// host should each be given a share, or they overlap.
	Capacity Resources
	// ReservedCPUMillis is CPU kept for the agent and the host's own
	// daemons, in millicores (Kubernetes' system-reserved): subtracted from
	// the detected CPU capacity when Capacity.CPUMillis is 0. With
	// Capacity.CPUMillis given, it must be 0 (the given capacity is what is
	// offered). Default 0.
	ReservedCPUMillis int64
	// Cgroups says whether and which cgroups contain each attempt (one
	// cgroup per attempt under an agent-owned parent; see cgroup.go):
	// "auto" (default; v2 with memory and pids, else v1 with memory, pids
	// and freezer, else v2 without them, else none), "v1", "v2" or "off".
	// When the cgroups asked for are unusable the agent logs why once and
	// runs without them. The attempts' cgroups also enforce their
	// resources.limits (cgroup_limits.go): the memory limit needs the
	// memory controller, the CPU limit the cpu controller; without them
	// the limits are not enforced (logged once at start) and the tasks
	// still run.
	Cgroups string
	// GPUModel is the GPU model name, matched against Resources.gpu_models.
	GPUModel string
	// MaxTasks caps concurrently running attempts; 0 means only resources
	// limit them.
	MaxTasks int
	// DatasetDir is the node's dataset cache: each subdirectory is one
	// dataset named after it, reported to the region (datasets.go) and
	// given to tasks that list it as APIARY_DATASET_<NAME>; the outputs of
	// completed attempts are moved into it. Default: DataDir/datasets.
	DatasetDir string
	// DatasetRescan is how often DatasetDir is rescanned. Default
	// DefaultDatasetRescan (10 s).
	DatasetRescan time.Duration
	// DataDir holds the attempts' working directories and full logs, under
	// DataDir/work. Default: $TMPDIR/apiary-agent-<NodeID>.
	DataDir string
	// WorkRetention is how long an attempt's directory under DataDir/work is
	// kept once nothing in it has changed and the attempt is not running;
	// then it is removed (with task and job directories left empty).
	// Default 24 h; negative keeps every directory.
	WorkRetention time.Duration
	// CoordinatorAddrs are gRPC addresses (host:port) of the region's
	// coordinators. The agent begins at the address its NodeID hashes to
	// (so a fleet sharing one list spreads over every coordinator, as Nomad
	// clients shuffle their servers) and moves to the next one, round the
	// list, when one is unavailable. Required.
	CoordinatorAddrs []string
	// TailBytes is how many trailing bytes of stdout and of stderr each are
	// kept in memory and sent with the final report. Default 16384; negative
	// means 0 (no tail).
	TailBytes int
	// Logger receives structured logs. Default: slog.Default().
	Logger *slog.Logger

	// KillGrace is the time between SIGTERM and SIGKILL when a process group
	// is killed (timeout, cancel, abandon, shutdown). Default 3 s.
	KillGrace time.Duration
	// RPCTimeout bounds each unary RPC. Default 5 s.
	RPCTimeout time.Duration
	// DisconnectGrace is how long attempts keep running while no
	// coordinator answers (an outage of the region, a network partition),
	// for jobs that set no disconnect.lost_after; then they are killed.
	// Counted from the last answered heartbeat. Default 5 min.
	DisconnectGrace time.Duration
	// DrainDeadline is how long running attempts may go on finishing when
	// the agent is stopped (Run's ctx ends, e.g. SIGTERM): the node is
	// marked draining at once (no new placements), attempts still running
	// at the deadline are stopped and handed back as DRAINED (requeued, not
	// charged), then the agent deregisters, releasing its lease. Default 0:
	// stop and hand back at once.
	DrainDeadline time.Duration
	// MinBackoff and MaxBackoff bound the jittered exponential backoff of
	// registration, stream reconnects and report retries. Defaults 100 ms
	// and 5 s.
	MinBackoff, MaxBackoff time.Duration
	// BaseEnv is the environment every attempt starts from, before the
	// assignment's env and the APIARY_* variables are added. Default: the
	// agent's own environment (os.Environ()), as Nomad's raw_exec does.
	BaseEnv []string
	// JoinToken is the secret of an agent join token (`apiary acl token
	// create --type agent --region R`; Nomad's node introduction), sent as
	// RegisterNodeRequest.join_token with every registration. A region that
	// runs with ACLs refuses a node without a valid one (the agent logs why
	// once, at ERROR, and keeps trying with backoff). Default "": none.
	JoinToken string
	// DialOptions are extra gRPC dial options (credentials, interceptors),
	// used for every connection to the coordinators. `apiary agent` puts
	// its transport first: pki.DialOption(reloader,
	// pki.RegionServerName(region)) for mutual TLS as the node's agent
	// certificate, or insecure credentials with --insecure-dev. Default
	// (none given): insecure transport credentials.
	DialOptions []grpc.DialOption

	// Executor starts the attempts: ProcessExecutor (default; `--executor
	// exec`), a subprocess each, or NoopExecutor (`--executor
	// noop[:DURATION]`), a timer each, for measuring the control plane
	// only (no process, work dir or cgroup; the agent then sets up no
	// containment and sweeps no leftover processes at start).
	Executor Executor
	// Conns, if set, are the connections to the coordinators, one per
	// CoordinatorAddrs entry in the same order, used instead of dialing
	// (DialOptions are then unused). The caller made them, may share them
	// among agents (`apiary loadtest fleet` shares a few among thousands),
	// and closes them after Run returns. Needs LANAddr LANOff: the LAN
	// member learns the pool's addresses from its own connections.
	Conns []*grpc.ClientConn
	// Counters, if set, receives the agent's event counts (shared by
	// agents that run in one process); default: counters of its own.
	Counters *Counters

	// TracerProvider makes a task.run span per attempt, a child of the
	// assignment's traceparent. Default: tracing off.
	TracerProvider trace.TracerProvider
	// Registry receives the agent's metrics (default: a new one).
	Registry *prometheus.Registry
	// MetricsAddr, if set, serves /metrics (and /debug/pprof/) while Run runs.
	MetricsAddr string
	// LANAddr is the host:port (UDP and TCP) of the agent's member of its
	// region's serf LAN pool (lan.go), which it joins through the addresses
	// its coordinator returns at registration (lan_join) and where it
	// publishes its node epoch and free capacity; a coordinator ends the
	// epoch as soon as the member fails, instead of waiting out the lease.
	// Default "": the local address of the route to the first coordinator
	// (127.0.0.1 for a coordinator on loopback), port 0 (a free port,
	// picked again at every start; the pool learns it from the member).
	// LANOff runs no member: the lease alone tells the region the node died.
	LANAddr string
	// GossipKey, when set, encrypts the LAN member's gossip with a keyring
	// (16, 24 or 32 bytes, `apiary keygen`): it must be a key of the
	// region's pool, or the member cannot join it (the agent then runs on
	// its lease alone). Nil: plain text, unless the keyring file exists.
	GossipKey []byte
	// GossipKeyringFile is where serf keeps the LAN member's keyring,
	// rewritten after every rotation (`apiary keyring`) so that it survives
	// a restart; a file that exists at start is loaded instead of
	// GossipKey. Default <DataDir>/gossip.keyring.
	GossipKeyringFile string
	// GossipWarnPlain logs a WARN when the LAN member gossips in plain text
	// (`apiary agent` sets it when its gRPC hops use TLS).
	GossipWarnPlain bool

	// TaskUsers says whether each running attempt runs as a user of its
	// own (taskusers.go; systemd's DynamicUser): "auto" (default: on when
	// the agent runs as root on Linux and every directory above DataDir is
	// searchable by others, else off), "on" (New fails where it cannot
	// work) or "off". Off, tasks run as the agent's user and can read its
	// credentials and each other's environment (logged at WARN at start).
	// New resolves it to "on" or "off".
	TaskUsers string
	// TaskUIDs is the range of user and group ids task users are taken
	// from; no account may use them. Default DefaultTaskUIDs
	// (200000-265535).
	TaskUIDs UIDRange
	// SecretFiles are the agent's credential files besides its gossip
	// keyring (TLS key, join token file): with task users on, each one a
	// task user could read is logged at WARN at start.
	SecretFiles []string

	taskUsersWhy string // why TaskUsers resolved to off (logged at start)
}

// withDefaults returns a copy of c with defaults filled in, or an error that
// names the invalid field.
func (c Config) withDefaults() (Config, error) {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.NodeID == "" {
		h, err := os.Hostname()
		if err != nil || h == "" {
			return c, fmt.Errorf("node id: empty and host name unknown: %v", err)
		}
		c.NodeID = h
	}
	if c.ReservedCPUMillis < 0 {
		return c, fmt.Errorf("reserved cpu millis: must be >= 0, got %d", c.ReservedCPUMillis)
	}
	if c.ReservedCPUMillis > 0 && c.Capacity.CPUMillis != 0 {
		return c, errors.New("reserved cpu millis: applies to detected capacity only; with cpu millis given, give the share to offer")
	}
	if c.Capacity.CPUMillis == 0 || c.Capacity.MemoryMB == 0 {
		host, err := HostCapacity()
		if err != nil && c.Capacity.MemoryMB == 0 {
			return c, fmt.Errorf("capacity: memory not given and not detected: %w", err)
		}
		if c.Capacity.CPUMillis == 0 {
			if c.ReservedCPUMillis >= host.CPUMillis {
				return c, fmt.Errorf("reserved cpu millis: %d leaves nothing of the host's %d", c.ReservedCPUMillis, host.CPUMillis)
			}
			c.Capacity.CPUMillis = host.CPUMillis - c.ReservedCPUMillis
		}
		if c.Capacity.MemoryMB == 0 {
			c.Capacity.MemoryMB = host.MemoryMB
		}
	}
	if c.Capacity.CPUMillis < 0 || c.Capacity.MemoryMB < 0 || c.Capacity.GPUs < 0 {
		return c, errors.New("capacity: cpu, memory and gpus must be >= 0")
	}
	mode, err := parseCgroupsMode(c.Cgroups)
	if err != nil {
		return c, err
	}
	c.Cgroups = mode
	if c.MaxTasks < 0 {
		return c, errors.New("max tasks: must be >= 0")
	}
	if c.TailBytes == 0 {
		c.TailBytes = DefaultTailBytes
	} else if c.TailBytes < 0 {
		c.TailBytes = 0
	}
	if c.DataDir == "" {
		c.DataDir = filepath.Join(os.TempDir(), "apiary-agent-"+c.NodeID)
	}
	abs, err := filepath.Abs(c.DataDir)
	if err != nil {
		return c, fmt.Errorf("data dir: %w", err)
	}
	c.DataDir = abs
	if c.GossipKeyringFile == "" {
		c.GossipKeyringFile = filepath.Join(c.DataDir, "gossip.keyring")
	}
	if err := c.resolveTaskUsers(); err != nil {
		return c, err
	}
	if n := len(c.GossipKey); c.GossipKey != nil && n != 16 && n != 24 && n != 32 {
		return c, fmt.Errorf("gossip key: a key must be 16, 24 or 32 bytes, this one is %d (make one with `apiary keygen`)", n)
	}
	var addrs []string
	for _, a := range c.CoordinatorAddrs {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		return c, errors.New("coordinator addrs: at least one address is required")
	}
	c.CoordinatorAddrs = addrs
	c.Labels = maps.Clone(c.Labels)
	c.CoordinatorAddrs = slices.Clone(c.CoordinatorAddrs)
	for k := range c.Labels {
		if k == "" {
			return c, errors.New("labels: empty label name")
		}
	}
	if c.KillGrace <= 0 {
		c.KillGrace = DefaultKillGrace
	}
	if c.WorkRetention == 0 {
		c.WorkRetention = DefaultWorkRetention
	}
	if c.DatasetRescan <= 0 {
		c.DatasetRescan = DefaultDatasetRescan
	}
	if c.DatasetDir != "" {
		if fi, err := os.Stat(c.DatasetDir); err != nil || !fi.IsDir() {
			return c, fmt.Errorf("DatasetDir %q: must be an existing directory", c.DatasetDir)
		}
	} else {
		c.DatasetDir = filepath.Join(c.DataDir, "datasets") // made when an output is kept
	}
	if c.RPCTimeout <= 0 {
		c.RPCTimeout = DefaultRPCTimeout
	}
	if c.DisconnectGrace == 0 {
		c.DisconnectGrace = DefaultDisconnectGrace
	}
	if c.DisconnectGrace < 0 {
		return c, fmt.Errorf("disconnect-grace: must be > 0, got %s", c.DisconnectGrace)
	}
	if c.DrainDeadline < 0 {
		return c, fmt.Errorf("drain-deadline: must be >= 0, got %s", c.DrainDeadline)
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = 100 * time.Millisecond
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = 5 * time.Second
	}
	if c.MaxBackoff < c.MinBackoff {
		c.MaxBackoff = c.MinBackoff
	}
	if c.BaseEnv == nil {
		c.BaseEnv = os.Environ()
	}
	if c.Registry == nil {
		c.Registry = telemetry.NewRegistry()
	}
	if c.Executor == nil {
		c.Executor = ProcessExecutor()
	}
	if c.Counters == nil {
		c.Counters = &Counters{}
	}
	if len(c.Conns) > 0 {
		if len(c.Conns) != len(c.CoordinatorAddrs) {
			return c, fmt.Errorf("conns: %d connections for %d coordinator addrs; give one per address, in order", len(c.Conns), len(c.CoordinatorAddrs))
		}
		if c.LANAddr != LANOff {
			return c, fmt.Errorf("conns: shared connections need LANAddr %q (the LAN member learns its pool from the agent's own connections)", LANOff)
		}
		c.Conns = slices.Clone(c.Conns)
	}
	c.TracerProvider = telemetry.OrNoop(c.TracerProvider)
	return c, nil
}

// HostCapacity is the whole host, the capacity an agent offers by default:
// CPUMillis is runtime.NumCPU()*1000 and MemoryMB is MemTotal from
// /proc/meminfo in MiB (GPUs 0). Several agents on one host each offer the
// whole host unless they are given shares; `apiary dev` gives each of its
// agents an equal share of this. The error is from reading /proc/meminfo
// (CPUMillis is set even then).
func HostCapacity() (Resources, error) {
	r := Resources{CPUMillis: int64(runtime.NumCPU()) * 1000}
	mb, err := detectMemoryMiB()
	r.MemoryMB = mb
	return r, err
}

// detectMemoryMiB reads MemTotal from /proc/meminfo, in MiB.
func detectMemoryMiB() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return parseMemTotal(f)
}

// parseMemTotal parses a /proc/meminfo body and returns MemTotal in MiB.
func parseMemTotal(r io.Reader) (int64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("meminfo: MemTotal: %w", err)
			}
			return kb / 1024, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New("meminfo: no MemTotal line")
}
