package loadtest

// A simulated fleet (`apiary loadtest fleet`): N node agents in this one
// process against an existing region, each the real agent.Agent (its own
// node id, labels, capacity, node epoch, lease, heartbeats, assignment
// stream, ledger and reports) with the noop executor, so that thousands
// of nodes fit on one machine and what is measured is the control plane.
// The agents share a few gRPC connections per coordinator address; they
// run without cgroups, task users or a serf LAN member.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"

	"apiary.dev/apiary/agent"
)

// Fleet defaults (FleetOptions).
const (
	DefaultFleetStartRate = 200
	DefaultFleetEvery     = 5 * time.Second
	DefaultFleetPrefix    = "sim"
	// fleetAgentsPerConn is how many agents share one gRPC connection to a
	// coordinator by default (at most fleetMaxConns per address).
	fleetAgentsPerConn = 250
	fleetMaxConns      = 64
)

// FleetOptions configures RunFleet.
type FleetOptions struct {
	// Agents is how many agents to run (>= 1).
	Agents int
	// Addrs are the gRPC addresses of the region's coordinators (plaintext:
	// a region run with --insecure-dev), tried in order by every agent.
	Addrs []string
	// NodePrefix names the nodes <NodePrefix>-<i>, i from 0 (default
	// "sim").
	NodePrefix string
	// Labels are every agent's node labels.
	Labels map[string]string
	// CPUMillis (millicores), MemoryMB (MiB) and MaxTasks are every
	// agent's capacity (required: > 0, > 0, >= 0; 0 tasks: resources only).
	CPUMillis, MemoryMB int64
	MaxTasks            int
	// Executor runs the attempts (default agent.NoopExecutor(0)); `apiary
	// loadtest fleet` accepts only noop executors.
	Executor agent.Executor
	// StartRate is how many agents start per second (default 200), so that
	// the region sees a ramp, not a storm, unless asked for.
	StartRate float64
	// ConnsPerAddr is how many gRPC connections to each coordinator the
	// agents share, agent i using connection i mod ConnsPerAddr (default:
	// one per 250 agents, at most 64).
	ConnsPerAddr int
	// DataDir holds each agent's data dir, <DataDir>/<node id> (required).
	DataDir string
	// JoinToken is every agent's join token (a region with ACLs needs one
	// not bound to a node id); "" for none.
	JoinToken string
	// Every is the interval of progress samples (default 5 s).
	Every time.Duration
	// Logger receives every agent's log lines (default: discarded).
	Logger *slog.Logger
	// Progress, if set, receives a sample every Every and the final one
	// (Final set) after every agent stopped.
	Progress func(FleetSample)
}

// FleetSample is the fleet's state at one moment. Counts are cumulative
// since the start; rates are over the interval since the previous sample,
// and in the final sample over the whole run.
type FleetSample struct {
	Final   bool          `json:"final,omitempty"`
	Elapsed time.Duration `json:"elapsed_ns"`
	// Agents is the fleet's size, Started how many were started so far,
	// Registered how many hold a node epoch now, and EverRegistered how
	// many held one at least once.
	Agents         int `json:"agents"`
	Started        int `json:"started"`
	Registered     int `json:"registered"`
	EverRegistered int `json:"ever_registered"`
	// AllRegisteredAfter is when the last agent first registered, from
	// the start (0 until every agent has).
	AllRegisteredAfter time.Duration `json:"all_registered_after_ns,omitempty"`
	// Registrations counts node epochs begun (re-registrations included),
	// Heartbeats answered heartbeats, AttemptsStarted/Ended the attempts
	// run, Refused the assignments refused by local admission.
	Registrations   int64   `json:"registrations"`
	Heartbeats      int64   `json:"heartbeats"`
	HeartbeatsPerS  float64 `json:"heartbeats_per_s"`
	AttemptsStarted int64   `json:"attempts_started"`
	AttemptsEnded   int64   `json:"attempts_ended"`
	AttemptsPerS    float64 `json:"attempts_ended_per_s"`
	Refused         int64   `json:"refused"`
	StartFailed     int64   `json:"start_failed"`
	// HarnessCPUSeconds is this process's user+system CPU time since the
	// fleet started (getrusage); HarnessCPUPercent the interval's, in % of
	// one core; HarnessRSSMiB its resident memory now. They are the
	// harness's own, not the coordinators'.
	HarnessCPUSeconds float64 `json:"harness_cpu_s"`
	HarnessCPUPercent float64 `json:"harness_cpu_percent"`
	HarnessRSSMiB     int64   `json:"harness_rss_mib"`
	// Failed is how many agents' Run returned an error (their region
	// refused them as invalid, say).
	Failed int `json:"failed"`
}

// String is the sample as one line of text.
func (s FleetSample) String() string {
	var b strings.Builder
	if s.Final {
		b.WriteString("final ")
	}
	fmt.Fprintf(&b, "t=%.1fs agents %d/%d started, %d registered", s.Elapsed.Seconds(), s.Started, s.Agents, s.Registered)
	if s.AllRegisteredAfter > 0 {
		fmt.Fprintf(&b, " (all first registered after %.2fs)", s.AllRegisteredAfter.Seconds())
	} else if s.EverRegistered != s.Registered {
		fmt.Fprintf(&b, " (%d ever)", s.EverRegistered)
	}
	fmt.Fprintf(&b, ", %d registrations | heartbeats %.0f/s (%d) | attempts %d started, %d ended (%.0f/s), %d refused",
		s.Registrations, s.HeartbeatsPerS, s.Heartbeats, s.AttemptsStarted, s.AttemptsEnded, s.AttemptsPerS, s.Refused)
	if s.StartFailed > 0 {
		fmt.Fprintf(&b, ", %d start failed", s.StartFailed)
	}
	if s.Failed > 0 {
		fmt.Fprintf(&b, " | %d agents failed", s.Failed)
	}
	fmt.Fprintf(&b, " | harness cpu %.0f%% of a core (%.1fs total), rss %d MiB", s.HarnessCPUPercent, s.HarnessCPUSeconds, s.HarnessRSSMiB)
	return b.String()
}

// Defaults fills in o's defaults (see FleetOptions) and checks it; the
// error names the invalid option and the rule. RunFleet calls it.
func (o *FleetOptions) Defaults() error {
	if o.Agents < 1 {
		return fmt.Errorf("agents: must be >= 1, got %d", o.Agents)
	}
	var addrs []string
	for _, a := range o.Addrs {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		return errors.New("region: at least one coordinator address is required")
	}
	o.Addrs = addrs
	if o.NodePrefix == "" {
		o.NodePrefix = DefaultFleetPrefix
	}
	if o.CPUMillis <= 0 || o.MemoryMB <= 0 || o.MaxTasks < 0 {
		return fmt.Errorf("cpu-millis, memory-mb, max-tasks: must be > 0, > 0 and >= 0, got %d, %d and %d", o.CPUMillis, o.MemoryMB, o.MaxTasks)
	}
	if o.Executor == nil {
		o.Executor = agent.NoopExecutor(0)
	}
	if o.StartRate == 0 {
		o.StartRate = DefaultFleetStartRate
	}
	if o.StartRate < 0 {
		return fmt.Errorf("start-rate: must be > 0 agents/s, got %g", o.StartRate)
	}
	if o.ConnsPerAddr < 0 {
		return fmt.Errorf("conns-per-addr: must be >= 0 (0: one per %d agents), got %d", fleetAgentsPerConn, o.ConnsPerAddr)
	}
	if o.ConnsPerAddr == 0 {
		o.ConnsPerAddr = min(max((o.Agents+fleetAgentsPerConn-1)/fleetAgentsPerConn, 1), fleetMaxConns)
	}
	if o.DataDir == "" {
		return errors.New("data-dir: required (each agent's data dir goes under it)")
	}
	if o.Every <= 0 {
		o.Every = DefaultFleetEvery
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return nil
}

// RunFleet runs the fleet until ctx ends: it starts o.Agents agents at
// o.StartRate per second, samples progress every o.Every, and when ctx ends
// stops every agent the way SIGTERM stops `apiary agent` (drain, final
// reports, deregistration), waits for all, and returns the final sample.
// The error is an invalid option (naming it), a connection that cannot be
// made, or agents whose Run failed (how many, and the first error); the
// sample is valid with the last.
func RunFleet(ctx context.Context, o FleetOptions) (FleetSample, error) {
	if err := o.Defaults(); err != nil {
		return FleetSample{}, err
	}
	// One set of connections per coordinator address, shared round robin.
	conns := make([][]*grpc.ClientConn, o.ConnsPerAddr)
	defer func() {
		for _, cs := range conns {
			for _, cc := range cs {
				if cc != nil {
					cc.Close()
				}
			}
		}
	}()
	for k := range conns {
		for _, addr := range o.Addrs {
			cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithConnectParams(grpc.ConnectParams{
					// As the agent's own (agent/coordinators.go): reconnect within a second.
					Backoff:           grpcbackoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
					MinConnectTimeout: 2 * time.Second,
				}))
			if err != nil {
				return FleetSample{}, fmt.Errorf("region: address %q: %w", addr, err)
			}
			conns[k] = append(conns[k], cc)
		}
	}

	f := &fleet{o: o, start: time.Now(), counters: &agent.Counters{}}
	f.cpu0, f.lastCPU, f.lastAt = harnessCPU(), harnessCPU(), f.start
	runCtx, stopAgents := context.WithCancel(context.WithoutCancel(ctx))
	defer stopAgents()

	var wg sync.WaitGroup
	progressDone := make(chan struct{})
	stopProgress := make(chan struct{})
	go func() {
		defer close(progressDone)
		t := time.NewTicker(o.Every)
		defer t.Stop()
		for {
			select {
			case <-stopProgress:
				return
			case <-t.C:
				if o.Progress != nil {
					o.Progress(f.sample(false))
				}
			}
		}
	}()

	interval := time.Duration(float64(time.Second) / o.StartRate)
	next := time.Now()
	var startErr error
starting:
	for i := range o.Agents {
		if d := time.Until(next); d > 0 {
			select {
			case <-ctx.Done():
				break starting
			case <-time.After(d):
			}
		} else if ctx.Err() != nil {
			break
		}
		next = next.Add(interval)
		id := o.NodePrefix + "-" + strconv.Itoa(i)
		cs := conns[i%len(conns)]
		a, err := agent.New(agent.Config{
			NodeID:           id,
			Labels:           o.Labels,
			Capacity:         agent.Resources{CPUMillis: o.CPUMillis, MemoryMB: o.MemoryMB},
			MaxTasks:         o.MaxTasks,
			DataDir:          filepath.Join(o.DataDir, id),
			CoordinatorAddrs: o.Addrs,
			Conns:            cs,
			LANAddr:          agent.LANOff,
			Cgroups:          agent.CgroupsOff,
			TaskUsers:        agent.TaskUsersOff,
			Executor:         o.Executor,
			Counters:         f.counters,
			Registry:         prometheus.NewRegistry(), // no Go and process collectors per agent
			Logger:           o.Logger,
			BaseEnv:          []string{},
			WorkRetention:    -1, // the noop executor makes no work dirs
			JoinToken:        o.JoinToken,
		})
		if err != nil {
			startErr = fmt.Errorf("agent %s: %w", id, err)
			break
		}
		f.mu.Lock()
		f.agents = append(f.agents, a)
		f.mu.Unlock()
		wg.Add(2)
		go func() {
			defer wg.Done()
			if err := a.Run(runCtx); err != nil {
				f.fail(fmt.Errorf("agent %s: %w", id, err))
			}
		}()
		go func() {
			defer wg.Done()
			if _, err := a.WaitRegistered(runCtx); err == nil {
				if n := f.everRegistered.Add(1); int(n) == o.Agents {
					f.allRegistered.Store(int64(time.Since(f.start)))
				}
			}
		}()
	}
	if startErr == nil {
		<-ctx.Done()
	}
	stopAgents()
	wg.Wait()
	close(stopProgress)
	<-progressDone
	s := f.sample(true)
	if o.Progress != nil {
		o.Progress(s)
	}
	if startErr != nil {
		return s, startErr
	}
	if err := f.err(); err != nil {
		return s, err
	}
	return s, nil
}

// fleet is RunFleet's running state.
type fleet struct {
	o              FleetOptions
	start          time.Time
	counters       *agent.Counters
	everRegistered atomic.Int64
	allRegistered  atomic.Int64 // ns since start; 0 until all

	mu       sync.Mutex
	agents   []*agent.Agent
	failed   int
	firstErr error
	// The previous sample, for rates.
	lastAt         time.Time
	cpu0, lastCPU  float64
	lastHeartbeats int64
	lastEnded      int64
}

func (f *fleet) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failed++
	if f.firstErr == nil {
		f.firstErr = err
	}
}

func (f *fleet) err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failed == 0 {
		return nil
	}
	return fmt.Errorf("%d of %d agents stopped with an error; the first: %w", f.failed, f.o.Agents, f.firstErr)
}

// sample reads the fleet's state now (and advances the rates' interval).
func (f *fleet) sample(final bool) FleetSample {
	f.mu.Lock()
	agents := f.agents
	failed := f.failed
	f.mu.Unlock()
	registered := 0
	for _, a := range agents {
		if a.Epoch() != 0 {
			registered++
		}
	}
	now, cpu := time.Now(), harnessCPU()
	c := f.counters
	s := FleetSample{
		Final: final, Elapsed: now.Sub(f.start), Agents: f.o.Agents, Started: len(agents), Registered: registered,
		EverRegistered: int(f.everRegistered.Load()), AllRegisteredAfter: time.Duration(f.allRegistered.Load()),
		Registrations: c.Registrations.Load(), Heartbeats: c.Heartbeats.Load(),
		AttemptsStarted: c.Started.Load(), AttemptsEnded: c.Ended.Load(), Refused: c.Refused.Load(), StartFailed: c.StartFailed.Load(),
		HarnessCPUSeconds: cpu - f.cpu0, HarnessRSSMiB: harnessRSSMiB(), Failed: failed,
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	since, cpu0, hb0, ended0 := f.lastAt, f.lastCPU, f.lastHeartbeats, f.lastEnded
	if final {
		since, cpu0, hb0, ended0 = f.start, f.cpu0, 0, 0
	}
	if dt := now.Sub(since).Seconds(); dt > 0 {
		s.HeartbeatsPerS = float64(s.Heartbeats-hb0) / dt
		s.AttemptsPerS = float64(s.AttemptsEnded-ended0) / dt
		s.HarnessCPUPercent = 100 * (cpu - cpu0) / dt
	}
	f.lastAt, f.lastCPU, f.lastHeartbeats, f.lastEnded = now, cpu, s.Heartbeats, s.AttemptsEnded
	return s
}

// harnessCPU is this process's user+system CPU time in seconds
// (getrusage(RUSAGE_SELF): every thread).
func harnessCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// harnessRSSMiB is this process's resident memory now, in MiB, from
// /proc/self/statm (0 if unreadable).
func harnessRSSMiB() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	fields := strings.Fields(string(b))
	if len(fields) < 2 {
		return 0
	}
	pages, err := strconv.ParseInt(fields[1], 10, 64)
	if err != nil {
		return 0
	}
	return pages * int64(os.Getpagesize()) >> 20
}
