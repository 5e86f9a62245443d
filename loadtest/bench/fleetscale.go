package bench

// Fleet scale (issue 16): thousands of simulated agents on one 3-member
// region. The fleet is `apiary loadtest fleet` (loadtest.RunFleet: real
// agent.Agent values with the noop executor) in one subprocess of its own,
// so that its CPU and memory are read from /proc apart from the
// coordinators' and from this process's, and so that the harness can
// SIGSTOP it: every agent then falls silent at once, as in a partition of
// the whole fleet, which is how the re-registration storm ends every node
// epoch (see FleetScale).

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image/color"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/loadtest"
	"apiary.dev/apiary/regional"
	"apiary.dev/apiary/regional/store"
)

// FleetScaleOptions configures FleetScale.
type FleetScaleOptions struct {
	// Agents is the fleet's size: simulated agents, one node each.
	Agents int
	// Coordinators is the region's size (1, 3 or 5 members).
	Coordinators int
	// StartRate is how many agents the fleet starts per second (its ramp;
	// loadtest.FleetOptions.StartRate).
	StartRate float64
	// Settle is how long the fleet runs after the last agent registered
	// before the steady-state window opens.
	Settle time.Duration
	// Window is the steady-state window.
	Window time.Duration
	// Storms is the number of storm rounds; each round is one restart storm
	// and one re-registration storm (FleetStorm.Kind).
	Storms int
	// LeaseTTL is the region's --node-lease-ttl (whole seconds).
	LeaseTTL time.Duration
	// Down is how long every coordinator stays down in a restart storm
	// (0: LeaseTTL + 1 s, past the node lease).
	Down time.Duration
	// ExtraArgs are added to every coordinator's command line (after
	// --node-lease-ttl).
	ExtraArgs []string
	// CPUMillis (millicores), MemoryMiB and MaxTasks are every agent's
	// capacity.
	CPUMillis, MemoryMiB int64
	MaxTasks             int
	// FloorNodes is how many registrations the harness times for the floor
	// at each concurrency of FloorWorkers (goroutines spread over one etcd
	// client per member), after fsFloorSerial one at a time;
	// FloorHeartbeats how long it then times heartbeats of those nodes at
	// the same concurrency. The best level is the floor.
	FloorNodes      int
	FloorWorkers    []int
	FloorHeartbeats time.Duration
	// StormTimeout bounds each storm's recovery (and the ramp's, beyond
	// Agents / StartRate).
	StormTimeout time.Duration
	// Profile is how long each coordinator's CPU profile runs, after the
	// steady-state window (0: no profiles, and no --debug-addr).
	Profile time.Duration
}

// DefaultFleetScale is issue 16's configuration: 10,000 agents, a 3-member
// region, a 60 s window, 3 storm rounds. The 30 s node lease keeps a 2-core
// machine, where 10,000 agents ask for 20,000 heartbeats/s, from ending
// epochs in steady state (the region's default is 2 s).
var DefaultFleetScale = FleetScaleOptions{Agents: 10000, Coordinators: 3, StartRate: 200, Settle: 10 * time.Second,
	Window: 60 * time.Second, Storms: 3, LeaseTTL: 30 * time.Second,
	ExtraArgs: []string{"--etcd-election-ms", "3000", "--etcd-heartbeat-ms", "300", "--owner-lease-ttl", "6s"},
	CPUMillis: 32000, MemoryMiB: 65536, MaxTasks: 32,
	FloorNodes: 4000, FloorWorkers: []int{128, 1024}, FloorHeartbeats: 3 * time.Second,
	StormTimeout: 5 * time.Minute, Profile: 10 * time.Second}

// Storm kinds (FleetStorm.Kind).
const (
	// FleetStormRestart: SIGKILL of every coordinator, down for
	// FleetScaleOptions.Down, restarted; the fleet runs on throughout.
	FleetStormRestart = "restart"
	// FleetStormReregister: the fleet SIGSTOPped, every coordinator
	// SIGKILLed and restarted, the fleet kept stopped until every node
	// lease has expired (every epoch ended), then SIGCONT.
	FleetStormReregister = "reregister"
)

// errFSNotSettled: the region was not settled before a storm (not every
// node READY within StormTimeout); the storms stop there.
var errFSNotSettled = errors.New("the region did not settle before the storm")

// fsFloorSerial is how many of the floor's registrations run one at a
// time (FleetFloor.SerialMs).
const fsFloorSerial = 50

// FleetScaleResult is one FleetScale run. Times are ms, taken by the
// harness, unless the name says otherwise.
type FleetScaleResult struct {
	Options FleetScaleOptions
	// CoordArgs are the flags FleetScale added to every coordinator
	// (--debug-addr, one port each, is left out).
	CoordArgs []string
	// FleetArgs is the fleet's command line (after the binary).
	FleetArgs []string
	Ramp      FleetRamp
	Steady    FleetSteady
	Queries   []FleetQuery
	Floors    []FleetFloor
	Storms    []FleetStorm
	Seconds   []FleetSecond
	// Profiles are the coordinators' CPU and heap profiles (files in the
	// work dir; WriteFleetScale copies them to out).
	Profiles []string
	// Coordinators are the coordinators' ids, in the order of every
	// per-coordinator slice.
	Coordinators []string
	// EtcdLeader is the etcd leader's member (= coordinator id) after the
	// steady-state window (GetRegionInfo): a heartbeat through a
	// follower's member forwards its lease renewal to the leader.
	EtcdLeader string
	// Err is the error that ended the run early ("" if none).
	Err string
}

// FleetRamp is the initial ramp: the fleet started at StartRate until
// every agent registered.
type FleetRamp struct {
	// AllRegisteredMs is when the last agent first held an epoch, from the
	// fleet's start, by the fleet's clock (FleetSample.AllRegisteredAfter).
	AllRegisteredMs float64
	// FloorMs is Agents / StartRate: the ramp's own schedule.
	FloorMs float64
	// APIReadyMs is when GetRegionInfo (polled every second) first said
	// nodes_ready >= Agents, from the fleet's start.
	APIReadyMs float64
	// Registrations is how many epochs the fleet began by then (> Agents:
	// epochs that ended and were registered again).
	Registrations int64
}

// FleetProc is one process's CPU (% of one core) and resident memory
// (MiB) over the steady-state window.
type FleetProc struct {
	Name string
	// CPUPercent is the window's mean (from /proc/<pid>/stat, or getrusage
	// for this process), CPUP95 the 95th percentile of its per-second
	// values.
	CPUPercent, CPUP95 float64
	// RSSEnd is VmRSS at the window's end, RSSMax the largest per-second
	// reading in it.
	RSSEnd, RSSMax float64
}

// FleetSteady is the steady-state window.
type FleetSteady struct {
	WindowS float64
	// HeartbeatsPerS is the heartbeats answered per second over the window
	// (the fleet's counter), PerAgentMs the mean interval between one
	// agent's heartbeats that it implies.
	HeartbeatsPerS float64
	PerAgentMs     float64
	// Registrations is how many epochs began in the window (each one an
	// epoch that ended: 0 in a steady state).
	Registrations int64
	// Procs: every coordinator, the fleet process, and the harness itself
	// ("bench").
	Procs []FleetProc
	// FleetSelfCPUPercent is the fleet's own getrusage figure for the
	// window (FleetSample.HarnessCPUSeconds), beside the /proc one.
	FleetSelfCPUPercent float64
	// CoordCPUPerHeartbeatUs is the coordinators' CPU (all of them, their
	// etcd members included) per answered heartbeat, in µs.
	CoordCPUPerHeartbeatUs float64
	// ForeignCPU is the share of the machine's CPUs used by processes
	// outside the harness's tree during the window (another session's
	// tests): 0 on a quiet machine.
	ForeignCPU float64
	// FleetFailed is how many agents had stopped with an error by the
	// window's end.
	FleetFailed int
}

// FleetQuery is the cost of one public read of the region at Agents
// nodes: N calls one after another.
type FleetQuery struct {
	Call  string
	Ms    []float64
	Bytes int
	Ready int
}

// FleetFloor is the floor measured in the run: what the region's etcd
// does for one node's registration and heartbeats, timed by the harness
// itself through one etcd client per member's client URL (under
// /apiary-bench/floor/, deleted after), with the region idle.
type FleetFloor struct {
	// When names the moment: "before-fleet", or "storm N" (the fleet
	// stopped and every lease expired, just before SIGCONT).
	When string
	// Nodes is the registrations timed per level.
	Nodes int
	// SerialMs is the p50 of one registration's etcd operations done one
	// registration at a time (RegisterNode's reads and writes for a node
	// with no epoch: get alive, grant, the alive Txn, get record, the
	// record Txn).
	SerialMs float64
	// Levels are the concurrent measurements; RegPerS and HeartbeatsPerS
	// the best of them (the floor), Workers the level of the best RegPerS.
	Levels         []FleetFloorLevel
	Workers        int
	RegPerS        float64
	HeartbeatsPerS float64
	// ForeignCPU is the share of the machine's CPUs used outside the
	// harness's tree while the floor ran (foreignShare).
	ForeignCPU float64
	Err        string
}

// FleetFloorLevel is one concurrency of the floor: registrations per
// second of Nodes registrations' etcd operations from Workers goroutines,
// and heartbeats per second (one Txn of two gets and a KeepAliveOnce
// each, as Heartbeat does) from Workers goroutines over those nodes.
type FleetFloorLevel struct {
	Workers                 int
	RegPerS, HeartbeatsPerS float64
}

// FleetStorm is one storm. Times are ms from T0: the restart of the
// coordinators (restart), or the SIGCONT of the fleet (reregister).
type FleetStorm struct {
	Round int
	Kind  string
	// Ran is whether the storm reached T0 (a storm whose region was not
	// settled before it, every node READY, does not).
	Ran bool
	// DownMs is from the SIGKILL of the coordinators to their restart;
	// ServingMs from the restart to every coordinator serving (ready
	// file), counted from the restart for both kinds.
	DownMs, ServingMs float64
	// LeasesGoneMs (reregister) is from every coordinator serving to the
	// deletion of the last node's alive key (every epoch ended).
	LeasesGoneMs float64
	// AllReadyMs is when every agent's node was READY (alive key of the
	// record's epoch) with a new epoch (reregister), or READY at all
	// (restart), by the harness's watch of the node keys: the headline of
	// a reregister storm. 0 if never (see Missing).
	AllReadyMs float64
	// APIReadyMs is when GetRegionInfo (polled every second) first said
	// nodes_ready >= Agents after T0 (0: never within the storm).
	APIReadyMs float64
	// AgentsMs (reregister) is when a fleet sample (one a second) first
	// showed every agent holding an epoch and at least Agents epochs begun
	// since the storm began: the agents' side of AllReadyMs (a
	// registration is answered after its etcd writes).
	AgentsMs float64
	// HeartbeatsBackMs (restart) is when a fleet sample (one a second)
	// first showed at least half the steady heartbeat rate after T0, and
	// HeartbeatsAfterPerS the fleet's heartbeats/s over the storm's last
	// 10 s (from LeaseTTL - 8 s after the restart on).
	HeartbeatsBackMs    float64
	HeartbeatsAfterPerS float64
	// ReadyMin is the fewest READY nodes the watch saw after T0; Peak the
	// most READY nodes on a new epoch (reregister) or READY (restart) it
	// saw after T0, first at PeakMs.
	ReadyMin int
	Peak     int
	PeakMs   float64
	// NewEpochs is how many nodes held an epoch newer than before the
	// storm at its end; Missing how many agents did not hold a READY new
	// epoch (reregister) or were not READY (restart) at its end, and
	// MissingIDs the first of them.
	NewEpochs  int
	Missing    int
	MissingIDs []string
	// Registrations is how many epochs the fleet began during the storm
	// (FleetSample.Registrations); FleetFailed how many agents had stopped
	// with an error at its end.
	Registrations int64
	FleetFailed   int
	// LogErrors and LogWarnings count the fleet's ERROR and WARN log lines
	// during the storm; LogTop are its most frequent messages ("n x msg").
	LogErrors, LogWarnings int
	LogTop                 []string
	// ListNodes is the check through the public API at the storm's end:
	// READY nodes, those with a new epoch, the call's ms.
	ListReady, ListNew int
	ListMs             float64
	// Floor is the floor measured in this storm (reregister only).
	Floor *FleetFloor
	// EtcdLeader is the etcd leader at the storm's end.
	EtcdLeader string
	// ForeignCPU is as in FleetSteady, over the storm.
	ForeignCPU float64
	Err        string
}

// FleetSecond is one per-second sample of the run. Per-coordinator values
// are -1 while the coordinator is down, others -1 when unknown.
type FleetSecond struct {
	Phase string
	Round int
	// T is seconds since the phase began, Abs since the fleet started.
	T, Abs   float64
	CoordCPU []float64
	CoordRSS []float64
	// FleetCPU and FleetRSS are the fleet process's, from /proc; the
	// others are from its latest sample (its own getrusage, the agents
	// holding an epoch, heartbeats/s over its last second, epochs begun),
	// -1 when it is older than 2.5 s (the fleet stopped).
	FleetCPU, FleetRSS  float64
	FleetSelfCPU        float64
	FleetRegistered     int
	FleetHeartbeatsPerS float64
	FleetRegistrations  int64
	// BenchCPU and BenchRSS are this process's.
	BenchCPU, BenchRSS float64
	// APIReady is nodes_ready from the GetRegionInfo answered during the
	// second and APIMs its latency (-1: none).
	APIReady int
	APIMs    float64
	// Ready and Fresh are the watch's READY nodes and READY nodes with a
	// new epoch (-1: no watch).
	Ready, Fresh int
}

// FleetScale starts a region of o.Coordinators members (no serf LAN pool:
// the simulated agents have no LAN members; --node-lease-ttl o.LeaseTTL)
// and o.Agents simulated agents in one `apiary loadtest fleet` subprocess,
// and measures: the ramp until all registered; the steady state over
// o.Window (heartbeats answered, each process's CPU and RSS); the cost of
// ListNodes and GetRegionInfo at that size; then o.Storms rounds of a
// restart storm and a re-registration storm (FleetStorm). The floor
// (FleetFloor) is measured before the fleet starts and in every
// re-registration storm. Why two kinds of storm: etcd stops every lease's
// clock while its members are down and a new leader gives every lease a
// full TTL again, so killing the coordinators, however long, ends no node
// epoch by itself; the restart storm shows that, and the re-registration
// storm ends every epoch by keeping the fleet silent (SIGSTOP) past the
// lease while the region is up.
//
// The result holds what was measured even when err is not nil (the error
// that ended the run; a storm that did not recover is recorded in its
// FleetStorm.Err and the run goes on).
func FleetScale(ctx context.Context, cfg Config, o FleetScaleOptions) (FleetScaleResult, error) {
	res := FleetScaleResult{Options: o}
	if o.Agents < 1 || o.Coordinators < 1 || o.StartRate <= 0 || o.Window <= 0 || o.Storms < 0 || o.LeaseTTL < time.Second ||
		o.FloorNodes < 1 || len(o.FloorWorkers) == 0 || slices.Min(o.FloorWorkers) < 1 || o.StormTimeout <= 0 {
		return res, fmt.Errorf("fleetscale: invalid options %+v", o)
	}
	if o.Down == 0 {
		o.Down = o.LeaseTTL + time.Second
		res.Options.Down = o.Down
	}
	x := &fsRun{cfg: cfg, o: o, res: &res}
	err := x.run(ctx)
	if err != nil {
		res.Err = err.Error()
	}
	return res, err
}

// fsRun is one FleetScale run's state.
type fsRun struct {
	cfg   Config
	o     FleetScaleOptions
	res   *FleetScaleResult
	dir   string
	cl    *devcluster.Cluster
	r     *devcluster.Region
	fleet *fsFleet
	// debug[i] is coordinator i's --debug-addr ("" without profiles).
	debug []string

	mu sync.Mutex
	// cli (etcd, read only) and conn (the public API) are dialed again
	// after every restart of the coordinators: gRPC's reconnect backoff
	// grows to two minutes while they are down.
	cli     *clientv3.Client
	conn    *grpc.ClientConn
	phase   string
	round   int
	phaseAt time.Time
	obs     *fsObserver
	apiOn   bool
	api     []fsAPIPoll
	seconds []FleetSecond
}

// fsAPIPoll is one GetRegionInfo of the poller.
type fsAPIPoll struct {
	at           time.Time
	ready, nodes int
	ms           float64
	err          bool
}

func (x *fsRun) run(ctx context.Context) error {
	o := x.o
	x.dir = filepath.Join(x.cfg.WorkDir, "fleetscale")
	args := append([]string{"--node-lease-ttl", o.LeaseTTL.String()}, o.ExtraArgs...)
	x.res.CoordArgs = args
	cl, r, err := startRegionSpec(ctx, x.cfg, filepath.Join(x.dir, "region"),
		devcluster.RegionSpec{Coordinators: o.Coordinators, ExtraArgs: args, NoLAN: true}, nil)
	if err != nil {
		return err
	}
	x.cl, x.r = cl, r
	defer func() {
		if x.fleet != nil {
			x.fleet.kill()
		}
		cl.Stop()
	}()
	for _, p := range r.Coords {
		x.res.Coordinators = append(x.res.Coordinators, p.Name)
	}
	if o.Profile > 0 {
		if err := x.addDebugAddrs(ctx); err != nil {
			return err
		}
	}
	if err := x.dial(); err != nil {
		return err
	}
	defer func() {
		x.mu.Lock()
		defer x.mu.Unlock()
		x.cli.Close()
		x.conn.Close()
	}()

	floor, err := x.measureFloor(ctx, "before-fleet")
	x.res.Floors = append(x.res.Floors, floor)
	if err != nil {
		return err
	}
	if err := x.startObserver(ctx, nil); err != nil {
		return err
	}
	bg, stopBG := context.WithCancel(ctx)
	var bgWG sync.WaitGroup
	defer func() {
		stopBG()
		bgWG.Wait()
		x.mu.Lock()
		x.res.Seconds = x.seconds
		if x.obs != nil {
			x.obs.stop()
		}
		x.mu.Unlock()
	}()

	// Ramp.
	x.setPhase("ramp", 0, true)
	if x.fleet, err = x.startFleet(); err != nil {
		return err
	}
	bgWG.Go(func() { x.sampler(bg) })
	bgWG.Go(func() { x.apiPoller(bg) })
	rampLimit := time.Duration(float64(o.Agents)/o.StartRate*float64(time.Second)) + o.StormTimeout
	s, _, err := x.fleet.waitSample(ctx, x.fleet.started, rampLimit, "every agent registered", func(s loadtest.FleetSample) bool { return s.AllRegisteredAfter > 0 })
	if err != nil {
		if o.Profile > 0 && ctx.Err() == nil {
			x.profiles(ctx) // what the coordinators do instead
		}
		return fmt.Errorf("ramp: %w", err)
	}
	x.res.Ramp = FleetRamp{AllRegisteredMs: ms(s.AllRegisteredAfter), FloorMs: float64(o.Agents) / o.StartRate * 1000, Registrations: s.Registrations}
	if err := waitFor(ctx, o.StormTimeout, "GetRegionInfo nodes_ready = agents", func() (bool, error) {
		at, ok := x.apiReadyAfter(x.fleet.started)
		if ok {
			x.res.Ramp.APIReadyMs = ms(at.Sub(x.fleet.started))
		}
		return ok, nil
	}); err != nil {
		return fmt.Errorf("ramp: %w", err)
	}
	x.cfg.logf("fleetscale: ramp: %d agents registered after %.1f s (schedule %.1f s), %d registrations; region READY per GetRegionInfo after %.1f s",
		o.Agents, x.res.Ramp.AllRegisteredMs/1000, x.res.Ramp.FloorMs/1000, s.Registrations, x.res.Ramp.APIReadyMs/1000)

	// Steady state.
	x.setPhase("settle", 0, true)
	if err := fsSleep(ctx, o.Settle); err != nil {
		return err
	}
	if err := x.steady(ctx); err != nil {
		return fmt.Errorf("steady state: %w", err)
	}
	x.setPhase("queries", 0, false)
	x.queries(ctx)
	if o.Profile > 0 {
		x.setPhase("profile", 0, false)
		x.profiles(ctx)
	}

	// Storms.
	for round := 1; round <= o.Storms && ctx.Err() == nil; round++ {
		for _, kind := range []string{FleetStormRestart, FleetStormReregister} {
			if ctx.Err() != nil {
				break
			}
			st, err := x.storm(ctx, round, kind)
			if err != nil {
				st.Err = err.Error()
				x.cfg.logf("fleetscale: storm %d (%s): %v", round, kind, err)
			}
			x.res.Storms = append(x.res.Storms, st)
			if st.Floor != nil {
				x.res.Floors = append(x.res.Floors, *st.Floor)
			}
			if err != nil && (!x.allCoordinatorsRunning() || errors.Is(err, errFSNotSettled)) {
				return fmt.Errorf("storm %d (%s): %w", round, kind, err)
			}
		}
	}
	x.setPhase("end", 0, false)
	return ctx.Err()
}

// addDebugAddrs restarts every coordinator (before any agent exists) with
// a --debug-addr of its own, for the profiles.
func (x *fsRun) addDebugAddrs(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, p := range x.r.Coords {
		wg.Go(func() { p.Stop(10 * time.Second) })
	}
	wg.Wait()
	for _, p := range x.r.Coords {
		port, err := devcluster.FreePort()
		if err != nil {
			return err
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		p.Args = append(p.Args, "--debug-addr", addr)
		x.debug = append(x.debug, addr)
	}
	return x.r.RestartCoordinators(ctx)
}

// dial (re)opens the harness's etcd client and API connection.
func (x *fsRun) dial() error {
	cli, err := etcdClient(x.r.EtcdEndpoints)
	if err != nil {
		return err
	}
	conn, err := x.r.Dial()
	if err != nil {
		cli.Close()
		return err
	}
	x.mu.Lock()
	oldCli, oldConn := x.cli, x.conn
	x.cli, x.conn = cli, conn
	x.mu.Unlock()
	if oldCli != nil {
		oldCli.Close()
		oldConn.Close()
	}
	return nil
}

// admin is the public API's AdminService.
func (x *fsRun) admin() apiaryv1.AdminServiceClient {
	x.mu.Lock()
	defer x.mu.Unlock()
	return apiaryv1.NewAdminServiceClient(x.conn)
}

func (x *fsRun) etcd() *clientv3.Client {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.cli
}

func (x *fsRun) setPhase(phase string, round int, api bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.phase, x.round, x.phaseAt, x.apiOn = phase, round, time.Now(), api
}

func (x *fsRun) allCoordinatorsRunning() bool {
	for _, p := range x.r.Coords {
		if !p.Running() {
			return false
		}
	}
	return true
}

// startFleet starts `apiary loadtest fleet` against every coordinator.
func (x *fsRun) startFleet() (*fsFleet, error) {
	o := x.o
	args := []string{"loadtest", "fleet", "--agents", strconv.Itoa(o.Agents), "--region", x.r.Addr(),
		"--node-prefix", "fs", "--start-rate", strconv.FormatFloat(o.StartRate, 'f', -1, 64), "--every", "1s",
		"--cpu-millis", strconv.FormatInt(o.CPUMillis, 10), "--memory-mb", strconv.FormatInt(o.MemoryMiB, 10),
		"--max-tasks", strconv.Itoa(o.MaxTasks), "--executor", "noop", "-o", "json", "--log-level", "warn",
		"--data-dir", filepath.Join(x.dir, "fleet")}
	x.res.FleetArgs = args
	return startFleetProc(x.cfg.Binary, args, filepath.Join(x.dir, "fleet.log"))
}

// steady measures the steady-state window.
func (x *fsRun) steady(ctx context.Context) error {
	o := x.o
	x.setPhase("steady", 0, false)
	s0, t0, err := x.fleet.waitSample(ctx, time.Now(), 10*time.Second, "a fleet sample", nil)
	if err != nil {
		return err
	}
	host0, bench0 := readHostCPU(), fsSelfCPU()
	c0, f0 := x.coordCPU(), cpuSeconds(x.fleet.pid)
	if err := fsSleep(ctx, o.Window-time.Since(t0)); err != nil {
		return err
	}
	s1, t1, err := x.fleet.waitSample(ctx, time.Now(), 10*time.Second, "a fleet sample", nil)
	if err != nil {
		return err
	}
	host1, bench1 := readHostCPU(), fsSelfCPU()
	c1, f1v := x.coordCPU(), cpuSeconds(x.fleet.pid)
	secs := (s1.Elapsed - s0.Elapsed).Seconds()
	wall := t1.Sub(t0).Seconds()
	st := FleetSteady{WindowS: secs, Registrations: s1.Registrations - s0.Registrations, FleetFailed: s1.Failed,
		ForeignCPU: foreignShare(host0, host1)}
	if secs > 0 {
		st.HeartbeatsPerS = float64(s1.Heartbeats-s0.Heartbeats) / secs
		st.FleetSelfCPUPercent = 100 * (s1.HarnessCPUSeconds - s0.HarnessCPUSeconds) / secs
	}
	if st.HeartbeatsPerS > 0 {
		st.PerAgentMs = float64(o.Agents) / st.HeartbeatsPerS * 1000
	}
	rows := x.phaseRows("steady", 0)
	// p95 of a per-second column, and the last and largest reading of
	// another (values < 0: the process was not running).
	p95 := func(f func(FleetSecond) float64) float64 {
		var xs []float64
		for _, r := range rows {
			if v := f(r); v >= 0 {
				xs = append(xs, v)
			}
		}
		return Summarize(xs).P95
	}
	rss := func(f func(FleetSecond) float64) (end, mx float64) {
		for _, r := range rows {
			if v := f(r); v >= 0 {
				end, mx = v, max(mx, v)
			}
		}
		return end, mx
	}
	proc := func(name string, cpuSecs float64, cpu, mem func(FleetSecond) float64) {
		end, mx := rss(mem)
		st.Procs = append(st.Procs, FleetProc{Name: name, CPUPercent: 100 * cpuSecs / wall, CPUP95: p95(cpu), RSSEnd: end, RSSMax: mx})
	}
	var coordTotal float64
	for i, name := range x.res.Coordinators {
		coordTotal += c1[i] - c0[i]
		proc(name, c1[i]-c0[i], func(r FleetSecond) float64 { return r.CoordCPU[i] }, func(r FleetSecond) float64 { return r.CoordRSS[i] })
	}
	proc("fleet", f1v-f0, func(r FleetSecond) float64 { return r.FleetCPU }, func(r FleetSecond) float64 { return r.FleetRSS })
	proc("bench", bench1-bench0, func(r FleetSecond) float64 { return r.BenchCPU }, func(r FleetSecond) float64 { return r.BenchRSS })
	if hb := st.HeartbeatsPerS * wall; hb > 0 {
		st.CoordCPUPerHeartbeatUs = coordTotal / hb * 1e6
	}
	x.res.Steady = st
	x.cfg.logf("fleetscale: steady %.0f s: %.0f heartbeats/s answered (one per agent every %.0f ms), %d registrations; cpu %%: %s; foreign cpu %.2f",
		secs, st.HeartbeatsPerS, st.PerAgentMs, st.Registrations, fsProcsLine(st.Procs), st.ForeignCPU)
	return nil
}

func fsProcsLine(ps []FleetProc) string {
	var parts []string
	for _, p := range ps {
		parts = append(parts, fmt.Sprintf("%s %.0f (rss %.0f MiB)", p.Name, p.CPUPercent, p.RSSEnd))
	}
	return strings.Join(parts, ", ")
}

// coordCPU is every coordinator's CPU seconds now (0 for one that is down).
func (x *fsRun) coordCPU() []float64 {
	out := make([]float64, len(x.r.Coords))
	for i, p := range x.r.Coords {
		if pid := p.Pid(); pid != 0 && p.Running() {
			out[i] = cpuSeconds(pid)
		}
	}
	return out
}

func (x *fsRun) phaseRows(phase string, round int) []FleetSecond {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []FleetSecond
	for _, r := range x.seconds {
		if r.Phase == phase && r.Round == round {
			out = append(out, r)
		}
	}
	return out
}

// queries times ListNodes and GetRegionInfo, 3 each, one after another.
func (x *fsRun) queries(ctx context.Context) {
	for _, call := range []string{"ListNodes", "GetRegionInfo"} {
		q := FleetQuery{Call: call}
		for range 3 {
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			t := time.Now()
			var m proto.Message
			var err error
			var ready int
			if call == "ListNodes" {
				var resp *apiaryv1.ListNodesResponse
				resp, err = x.admin().ListNodes(cctx, &apiaryv1.ListNodesRequest{})
				for _, n := range resp.GetNodes() {
					if n.GetStatus() == apiaryv1.NodeStatus_NODE_STATUS_READY {
						ready++
					}
				}
				m = resp
			} else {
				var resp *apiaryv1.GetRegionInfoResponse
				resp, err = x.admin().GetRegionInfo(cctx, &apiaryv1.GetRegionInfoRequest{})
				ready, m = int(resp.GetNodesReady()), resp
				if l := resp.GetEtcdLeader(); l != "" {
					x.res.EtcdLeader = l
				}
			}
			d := time.Since(t)
			cancel()
			if err != nil {
				x.cfg.logf("fleetscale: %s: %v", call, err)
				continue
			}
			q.Ms, q.Bytes, q.Ready = append(q.Ms, ms(d)), proto.Size(m), ready
		}
		x.res.Queries = append(x.res.Queries, q)
		x.cfg.logf("fleetscale: %s at %d nodes: %v ms, %d bytes, %d ready", call, x.o.Agents, q.Ms, q.Bytes, q.Ready)
	}
}

// profiles takes every coordinator's CPU profile (o.Profile long, all at
// once) and a heap profile, into the work dir.
func (x *fsRun) profiles(ctx context.Context) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i, addr := range x.debug {
		name := x.res.Coordinators[i]
		wg.Go(func() {
			for _, p := range []struct{ kind, query string }{{"cpu", fmt.Sprintf("profile?seconds=%d", int(x.o.Profile.Seconds()))}, {"heap", "heap"}} {
				path := filepath.Join(x.dir, fmt.Sprintf("fleetscale-%s-%s.pprof", name, p.kind))
				if err := fsFetch(ctx, "http://"+addr+"/debug/pprof/"+p.query, path, x.o.Profile+30*time.Second); err != nil {
					x.cfg.logf("fleetscale: %s profile of %s: %v", p.kind, name, err)
					continue
				}
				mu.Lock()
				x.res.Profiles = append(x.res.Profiles, path)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	slices.Sort(x.res.Profiles)
}

func fsFetch(ctx context.Context, url, path string, limit time.Duration) error {
	cctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// storm runs one storm of the given kind.
func (x *fsRun) storm(ctx context.Context, round int, kind string) (st FleetStorm, _ error) {
	o := x.o
	st = FleetStorm{Round: round, Kind: kind}
	x.setPhase(kind+"-before", round, true)
	if x.observer() == nil {
		if err := x.startObserver(ctx, nil); err != nil {
			return st, err
		}
	}
	// Start from a settled region: every node READY.
	if err := waitFor(ctx, o.StormTimeout, "every node READY before the storm", func() (bool, error) {
		c := x.observer().counts()
		return c.ready == o.Agents, fmt.Errorf("%d of %d READY", c.ready, o.Agents)
	}); err != nil {
		return st, fmt.Errorf("%w: %w", errFSNotSettled, err)
	}
	base := x.observer().epochs()
	s0, _ := x.fleet.latest()
	logOff := x.fleet.logSize()
	host0 := readHostCPU()
	defer func() {
		st.ForeignCPU = foreignShare(host0, readHostCPU())
		s1, _, _ := x.fleet.waitSample(ctx, time.Now(), 5*time.Second, "a fleet sample", nil)
		st.Registrations, st.FleetFailed = s1.Registrations-s0.Registrations, s1.Failed
		st.LogErrors, st.LogWarnings, st.LogTop = x.fleet.logCounts(logOff)
	}()

	x.setPhase(kind+"-down", round, false)
	if kind == FleetStormReregister {
		if err := x.fleet.signal(syscall.SIGSTOP); err != nil {
			return st, err
		}
		defer x.fleet.signal(syscall.SIGCONT) // after an error, too
	}
	x.stopObserver()
	tKill := time.Now()
	var wg sync.WaitGroup
	for _, p := range x.r.Coords {
		wg.Go(func() { _ = p.Kill() })
	}
	wg.Wait()
	if kind == FleetStormRestart {
		if err := fsSleep(ctx, o.Down-time.Since(tKill)); err != nil {
			return st, err
		}
	}
	restart := time.Now()
	st.DownMs = ms(restart.Sub(tKill))
	t0 := restart
	if kind == FleetStormRestart {
		x.setPhase(kind, round, true)
		st.Ran = true
	} else {
		x.setPhase(kind+"-expire", round, true)
	}
	if err := x.r.RestartCoordinators(ctx); err != nil {
		return st, fmt.Errorf("restart: %w", err)
	}
	serving := time.Now()
	st.ServingMs = ms(serving.Sub(restart))
	if err := x.dial(); err != nil {
		return st, err
	}
	if err := x.startObserver(ctx, base); err != nil {
		return st, err
	}
	obs := x.observer()
	x.cfg.logf("fleetscale: storm %d (%s): coordinators down %.1f s, serving %.1f s after the restart", round, kind, st.DownMs/1000, st.ServingMs/1000)

	if kind == FleetStormReregister {
		if err := waitFor(ctx, 2*o.LeaseTTL+o.StormTimeout, "every node lease expired", func() (bool, error) {
			c := obs.counts()
			return c.alive == 0, fmt.Errorf("%d alive keys left", c.alive)
		}); err != nil {
			return st, err
		}
		st.LeasesGoneMs = ms(time.Since(serving))
		floor, err := x.measureFloor(ctx, fmt.Sprintf("storm %d", round))
		st.Floor = &floor
		if err != nil {
			return st, err
		}
		x.setPhase(kind, round, true)
		obs.resetMin()
		t0 = time.Now()
		if err := x.fleet.signal(syscall.SIGCONT); err != nil {
			return st, err
		}
		st.Ran = true
	}

	// Recovery.
	steadyHB := x.res.Steady.HeartbeatsPerS
	var recErr error
	err := waitFor(ctx, o.StormTimeout, "recovery", func() (bool, error) {
		c := obs.counts()
		if kind == FleetStormReregister {
			if c.fresh != o.Agents {
				return false, fmt.Errorf("%d of %d READY on a new epoch", c.fresh, o.Agents)
			}
			at, ok := x.fleet.sampleAfter(t0, func(s loadtest.FleetSample) bool {
				return s.Registered == o.Agents && s.Registrations-s0.Registrations >= int64(o.Agents)
			})
			if !ok {
				return false, errors.New("every node READY on a new epoch, but not every agent holds one yet (the fleet's samples)")
			}
			st.AgentsMs = ms(at.Sub(t0))
			return true, nil
		}
		if time.Since(serving) < o.LeaseTTL+2*time.Second {
			return false, errors.New("waiting one lease past the restart")
		}
		if c.ready != o.Agents {
			return false, fmt.Errorf("%d of %d READY", c.ready, o.Agents)
		}
		if steadyHB > 0 && st.HeartbeatsBackMs == 0 {
			if at, ok := x.fleet.sampleAfter(t0, func(s loadtest.FleetSample) bool { return s.HeartbeatsPerS >= 0.5*steadyHB }); ok {
				st.HeartbeatsBackMs = ms(at.Sub(t0))
			} else {
				return false, errors.New("heartbeats below half the steady rate")
			}
		}
		return true, nil
	})
	if err != nil {
		recErr = err
	}
	if kind == FleetStormRestart {
		st.HeartbeatsAfterPerS = x.fleet.heartbeatRate(time.Now().Add(-10*time.Second), time.Now())
	}
	c := obs.counts()
	st.ReadyMin, st.NewEpochs = c.minReady, c.newEpochs
	if kind == FleetStormReregister {
		st.Peak, st.PeakMs = c.maxFresh, ms(max(c.maxFreshAt.Sub(t0), 0))
	} else {
		st.Peak = c.ready
	}
	if kind == FleetStormReregister {
		st.Missing = o.Agents - c.fresh
		if !c.allFreshAt.IsZero() {
			st.AllReadyMs = ms(c.allFreshAt.Sub(t0))
		}
	} else {
		st.Missing = o.Agents - c.ready
		if !c.allReadyAt.IsZero() {
			st.AllReadyMs = ms(max(c.allReadyAt.Sub(t0), 0))
		}
	}
	st.MissingIDs = obs.missing(kind == FleetStormReregister, 10)
	// The public API's view: the poller's first nodes_ready = Agents after
	// T0 (given a few seconds to catch up with the watch), then ListNodes.
	_ = waitFor(ctx, 5*time.Second, "GetRegionInfo", func() (bool, error) {
		_, ok := x.apiReadyAfter(t0)
		return ok || recErr != nil, nil
	})
	if at, ok := x.apiReadyAfter(t0); ok {
		st.APIReadyMs = ms(at.Sub(t0))
	}
	st.ListReady, st.ListNew, st.ListMs = x.listCheck(ctx, base)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	if info, err := x.admin().GetRegionInfo(cctx, &apiaryv1.GetRegionInfoRequest{}); err == nil {
		st.EtcdLeader = info.GetEtcdLeader()
	}
	cancel()
	x.cfg.logf("fleetscale: storm %d (%s): all READY%s after %.1f s (API %.1f s; agents %.1f s), heartbeats back %.1f s (then %.0f/s), READY min %d, new epochs %d, missing %d, ListNodes %d READY / %d new (%.0f ms)",
		round, kind, map[bool]string{true: " on a new epoch"}[kind == FleetStormReregister], st.AllReadyMs/1000, st.APIReadyMs/1000, st.AgentsMs/1000,
		st.HeartbeatsBackMs/1000, st.HeartbeatsAfterPerS, st.ReadyMin, st.NewEpochs, st.Missing, st.ListReady, st.ListNew, st.ListMs)
	if s1, _ := x.fleet.latest(); s1.Registrations > 0 {
		x.cfg.logf("fleetscale: storm %d (%s): epochs begun by the fleet so far: %d in the storm", round, kind, s1.Registrations-s0.Registrations)
	}
	return st, recErr
}

// listCheck counts, through ListNodes, the READY nodes and those with an
// epoch newer than base.
func (x *fsRun) listCheck(ctx context.Context, base map[string]int64) (ready, fresh int, took float64) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	t := time.Now()
	resp, err := x.admin().ListNodes(cctx, &apiaryv1.ListNodesRequest{})
	took = ms(time.Since(t))
	if err != nil {
		x.cfg.logf("fleetscale: ListNodes: %v", err)
		return -1, -1, took
	}
	for _, n := range resp.GetNodes() {
		if n.GetStatus() != apiaryv1.NodeStatus_NODE_STATUS_READY {
			continue
		}
		ready++
		if n.GetEpoch() > base[n.GetId()] {
			fresh++
		}
	}
	return ready, fresh, took
}

// apiReadyAfter is the first poll answered after t that said nodes_ready
// >= Agents.
func (x *fsRun) apiReadyAfter(t time.Time) (time.Time, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, p := range x.api {
		if p.at.After(t) && !p.err && p.ready >= x.o.Agents {
			return p.at, true
		}
	}
	return time.Time{}, false
}

// apiPoller calls GetRegionInfo every second while the phase allows it
// (not in the steady-state window, whose coordinator CPU it would add to).
func (x *fsRun) apiPoller(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		x.mu.Lock()
		on := x.apiOn
		x.mu.Unlock()
		if !on {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		start := time.Now()
		resp, err := x.admin().GetRegionInfo(cctx, &apiaryv1.GetRegionInfoRequest{})
		cancel()
		p := fsAPIPoll{at: time.Now(), ms: ms(time.Since(start)), err: err != nil}
		if err == nil {
			p.ready, p.nodes = int(resp.GetNodesReady()), int(resp.GetNodesRegistered())
		}
		x.mu.Lock()
		x.api = append(x.api, p)
		x.mu.Unlock()
	}
}

// sampler appends one FleetSecond a second.
func (x *fsRun) sampler(ctx context.Context) {
	type prev struct {
		pid int
		cpu float64
		at  time.Time
	}
	rate := func(p *prev, pid int, cpu float64, now time.Time) float64 {
		defer func() { *p = prev{pid, cpu, now} }()
		if pid == 0 || p.pid != pid {
			return -1
		}
		return 100 * (cpu - p.cpu) / now.Sub(p.at).Seconds()
	}
	coords := make([]prev, len(x.r.Coords))
	var fleetPrev, benchPrev prev
	self := os.Getpid()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	apiSeen := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		row := FleetSecond{APIReady: -1, APIMs: -1, Ready: -1, Fresh: -1, FleetSelfCPU: -1}
		for i, p := range x.r.Coords {
			pid := p.Pid()
			if !p.Running() {
				pid = 0
			}
			cpu, rss := -1.0, -1.0
			if pid != 0 {
				c := cpuSeconds(pid)
				cpu, rss = rate(&coords[i], pid, c, now), fsRSSMiB(pid)
			} else {
				coords[i] = prev{}
			}
			row.CoordCPU, row.CoordRSS = append(row.CoordCPU, cpu), append(row.CoordRSS, rss)
		}
		fpid := x.fleet.pid
		row.FleetCPU, row.FleetRSS = rate(&fleetPrev, fpid, cpuSeconds(fpid), now), fsRSSMiB(fpid)
		row.BenchCPU, row.BenchRSS = rate(&benchPrev, self, fsSelfCPU(), now), fsRSSMiB(self)
		row.FleetRegistered, row.FleetHeartbeatsPerS, row.FleetRegistrations = -1, -1, -1
		if s, at := x.fleet.latest(); !at.IsZero() && now.Sub(at) < 2500*time.Millisecond {
			row.FleetRegistered, row.FleetHeartbeatsPerS, row.FleetRegistrations = s.Registered, s.HeartbeatsPerS, s.Registrations
			row.FleetSelfCPU = s.HarnessCPUPercent
		}
		x.mu.Lock()
		row.Phase, row.Round, row.T = x.phase, x.round, now.Sub(x.phaseAt).Seconds()
		row.Abs = now.Sub(x.fleet.started).Seconds()
		for ; apiSeen < len(x.api); apiSeen++ {
			if p := x.api[apiSeen]; !p.err {
				row.APIReady, row.APIMs = p.ready, p.ms
			}
		}
		if x.obs != nil {
			c := x.obs.counts()
			row.Ready, row.Fresh = c.ready, c.fresh
		}
		x.seconds = append(x.seconds, row)
		x.mu.Unlock()
	}
}

// observer returns the current node watch.
func (x *fsRun) observer() *fsObserver {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.obs
}

func (x *fsRun) startObserver(ctx context.Context, base map[string]int64) error {
	obs, err := newFSObserver(ctx, x.etcd(), base, x.o.Agents)
	if err != nil {
		return err
	}
	x.mu.Lock()
	x.obs = obs
	x.mu.Unlock()
	return nil
}

func (x *fsRun) stopObserver() {
	x.mu.Lock()
	obs := x.obs
	x.obs = nil
	x.mu.Unlock()
	if obs != nil {
		obs.stop()
	}
}

// fsObserver follows every node's record epoch and alive key through an
// etcd watch of /apiary/nodes/ (read only): READY is store.NodeView's
// (the alive key of the record's epoch), fresh a READY node whose epoch is
// newer than base's (every READY node without a base).
type fsObserver struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	nodes map[string]*fsNode
	base  map[string]int64
	want  int
	c     fsCounts
}

type fsNode struct{ epoch, alive int64 }

// fsCounts are an observer's counts: READY nodes, fresh ones, alive keys,
// nodes whose record epoch is newer than the base; the fewest READY and
// the most fresh (and when first) since the watch began (or resetMin);
// when the counts last reached want.
type fsCounts struct {
	ready, fresh, alive, newEpochs int
	minReady, maxFresh             int
	maxFreshAt                     time.Time
	allReadyAt, allFreshAt         time.Time
}

func newFSObserver(ctx context.Context, cli *clientv3.Client, base map[string]int64, want int) (*fsObserver, error) {
	gctx, gcancel := context.WithTimeout(ctx, 30*time.Second)
	resp, err := cli.Get(gctx, prefNodes, clientv3.WithPrefix())
	gcancel()
	if err != nil {
		return nil, fmt.Errorf("read nodes: %w", err)
	}
	wctx, cancel := context.WithCancel(ctx)
	o := &fsObserver{cancel: cancel, done: make(chan struct{}), nodes: map[string]*fsNode{}, base: base, want: want}
	now := time.Now()
	o.mu.Lock()
	for _, kv := range resp.Kvs {
		o.apply(kv, false, now)
	}
	o.c.minReady = o.c.ready
	o.mu.Unlock()
	w := cli.Watch(wctx, prefNodes, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	go func() {
		defer close(o.done)
		for wr := range w {
			if wr.Err() != nil {
				return
			}
			now := time.Now()
			o.mu.Lock()
			for _, ev := range wr.Events {
				o.apply(ev.Kv, ev.Type == clientv3.EventTypeDelete, now)
			}
			o.c.minReady = min(o.c.minReady, o.c.ready)
			o.mu.Unlock()
		}
	}()
	return o, nil
}

func (o *fsObserver) stop() {
	o.cancel()
	<-o.done
}

// apply folds one node key in (o.mu held).
func (o *fsObserver) apply(kv *mvccpb.KeyValue, deleted bool, now time.Time) {
	id, kind, ok := store.NodeKeyKind(string(kv.Key))
	if !ok || (kind != store.NodeRecordKey && kind != store.NodeAliveKey) {
		return
	}
	n := o.nodes[id]
	if n == nil {
		n = &fsNode{}
		o.nodes[id] = n
	}
	r0, f0, a0, e0 := o.state(id, n)
	switch {
	case kind == store.NodeAliveKey && deleted:
		n.alive = 0
	case kind == store.NodeAliveKey:
		n.alive = kv.CreateRevision
	case deleted:
		n.epoch = 0
	default:
		var rec struct {
			Epoch int64 `json:"epoch"`
		}
		if json.Unmarshal(kv.Value, &rec) == nil {
			n.epoch = rec.Epoch
		}
	}
	r1, f1, a1, e1 := o.state(id, n)
	o.c.ready += r1 - r0
	o.c.fresh += f1 - f0
	o.c.alive += a1 - a0
	o.c.newEpochs += e1 - e0
	if o.c.ready >= o.want && r1 > r0 {
		o.c.allReadyAt = now
	}
	if o.c.fresh >= o.want && f1 > f0 {
		o.c.allFreshAt = now
	}
	if o.c.fresh > o.c.maxFresh {
		o.c.maxFresh, o.c.maxFreshAt = o.c.fresh, now
	}
}

// state is n's contribution to each count (0 or 1): READY, fresh, alive,
// new epoch.
func (o *fsObserver) state(id string, n *fsNode) (ready, fresh, alive, newEpoch int) {
	b := func(v bool) int {
		if v {
			return 1
		}
		return 0
	}
	r := n.epoch != 0 && n.alive == n.epoch
	newer := o.base != nil && n.epoch > o.base[id]
	return b(r), b(r && (o.base == nil || newer)), b(n.alive != 0), b(newer)
}

func (o *fsObserver) counts() fsCounts {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.c
}

func (o *fsObserver) resetMin() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.c.minReady, o.c.maxFresh, o.c.maxFreshAt = o.c.ready, o.c.fresh, time.Now()
}

// epochs is every node's record epoch.
func (o *fsObserver) epochs() map[string]int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make(map[string]int64, len(o.nodes))
	for id, n := range o.nodes {
		out[id] = n.epoch
	}
	return out
}

// missing lists, sorted, up to limit nodes of the base that are not READY
// (or, fresh, not READY on a new epoch).
func (o *fsObserver) missing(fresh bool, limit int) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []string
	for id := range o.base {
		n := o.nodes[id]
		if n == nil {
			out = append(out, id)
			continue
		}
		r, f, _, _ := o.state(id, n)
		if r == 0 || (fresh && f == 0) {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out[:min(len(out), limit)]
}

// fsFleet is the `apiary loadtest fleet` subprocess and its samples (one
// JSON line each on its stdout).
type fsFleet struct {
	cmd     *exec.Cmd
	pid     int
	logPath string
	started time.Time
	done    chan struct{}

	mu      sync.Mutex
	samples []fsSample
}

type fsSample struct {
	at time.Time
	s  loadtest.FleetSample
}

func startFleetProc(bin string, args []string, logPath string) (*fsFleet, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start fleet: %w", err)
	}
	f := &fsFleet{cmd: cmd, pid: cmd.Process.Pid, logPath: logPath, started: time.Now(), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var s loadtest.FleetSample
			if json.Unmarshal(sc.Bytes(), &s) != nil {
				continue
			}
			f.mu.Lock()
			f.samples = append(f.samples, fsSample{time.Now(), s})
			f.mu.Unlock()
		}
		_ = cmd.Wait()
		logf.Close()
		close(f.done)
	}()
	return f, nil
}

func (f *fsFleet) latest() (loadtest.FleetSample, time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.samples) == 0 {
		return loadtest.FleetSample{}, time.Time{}
	}
	s := f.samples[len(f.samples)-1]
	return s.s, s.at
}

// sampleAfter is the arrival time of the first sample after t with ok.
func (f *fsFleet) sampleAfter(t time.Time, ok func(loadtest.FleetSample) bool) (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range f.samples {
		if s.at.After(t) && ok(s.s) {
			return s.at, true
		}
	}
	return time.Time{}, false
}

// heartbeatRate is the heartbeats per second between the first and the
// last sample that arrived in [from, to] (0 without two).
func (f *fsFleet) heartbeatRate(from, to time.Time) float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	var first, last *fsSample
	for i := range f.samples {
		if s := &f.samples[i]; !s.at.Before(from) && !s.at.After(to) {
			if first == nil {
				first = s
			}
			last = s
		}
	}
	if first == nil || last == first || last.s.Elapsed <= first.s.Elapsed {
		return 0
	}
	return float64(last.s.Heartbeats-first.s.Heartbeats) / (last.s.Elapsed - first.s.Elapsed).Seconds()
}

// waitSample waits up to limit for a sample that arrived after t and
// satisfies ok (nil: any).
func (f *fsFleet) waitSample(ctx context.Context, t time.Time, limit time.Duration, what string, ok func(loadtest.FleetSample) bool) (loadtest.FleetSample, time.Time, error) {
	var got fsSample
	err := waitFor(ctx, limit, what, func() (bool, error) {
		select {
		case <-f.done:
			return false, fmt.Errorf("the fleet exited; see %s", f.logPath)
		default:
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, s := range f.samples {
			if s.at.After(t) && (ok == nil || ok(s.s)) {
				got = s
				return true, nil
			}
		}
		if n := len(f.samples); n > 0 {
			return false, fmt.Errorf("last sample: %s", f.samples[n-1].s)
		}
		return false, errors.New("no sample yet")
	})
	return got.s, got.at, err
}

func (f *fsFleet) signal(sig syscall.Signal) error {
	select {
	case <-f.done:
		return fmt.Errorf("the fleet exited; see %s", f.logPath)
	default:
	}
	return f.cmd.Process.Signal(sig)
}

// kill ends the fleet at once (SIGKILL: no drain, no deregistration).
func (f *fsFleet) kill() {
	_ = f.cmd.Process.Signal(syscall.SIGCONT)
	_ = f.cmd.Process.Kill()
	<-f.done
}

func (f *fsFleet) logSize() int64 {
	st, err := os.Stat(f.logPath)
	if err != nil {
		return 0
	}
	return st.Size()
}

// logCounts counts the fleet's ERROR and WARN lines written since offset
// from, and returns its three most frequent messages ("n x level msg").
func (f *fsFleet) logCounts(from int64) (errs, warns int, top []string) {
	fh, err := os.Open(f.logPath)
	if err != nil {
		return 0, 0, nil
	}
	defer fh.Close()
	if _, err := fh.Seek(from, io.SeekStart); err != nil {
		return 0, 0, nil
	}
	byMsg := map[string]int{}
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var level string
		switch {
		case bytes.Contains(line, []byte("level=ERROR")):
			errs++
			level = "ERROR"
		case bytes.Contains(line, []byte("level=WARN")):
			warns++
			level = "WARN"
		default:
			continue
		}
		byMsg[level+" "+fsLogMsg(line)]++
	}
	keys := make([]string, 0, len(byMsg))
	for k := range byMsg {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(a, b int) bool {
		if byMsg[keys[a]] != byMsg[keys[b]] {
			return byMsg[keys[a]] > byMsg[keys[b]]
		}
		return keys[a] < keys[b]
	})
	for _, k := range keys[:min(3, len(keys))] {
		top = append(top, fmt.Sprintf("%d x %s", byMsg[k], k))
	}
	return errs, warns, top
}

// fsLogMsg is the msg= value of a slog text line.
func fsLogMsg(line []byte) string {
	i := bytes.Index(line, []byte("msg="))
	if i < 0 {
		return "?"
	}
	rest := line[i+4:]
	if len(rest) > 0 && rest[0] == '"' {
		if s, err := strconv.QuotedPrefix(string(rest)); err == nil {
			if u, err := strconv.Unquote(s); err == nil {
				return u
			}
		}
	}
	if j := bytes.IndexByte(rest, ' '); j >= 0 {
		rest = rest[:j]
	}
	return string(rest)
}

// measureFloor times, through the harness's own etcd clients (one per
// member's client URL), fsFloorSerial registrations' etcd operations one
// at a time, then for each level of o.FloorWorkers o.FloorNodes
// registrations from that many goroutines and heartbeats of those nodes
// for o.FloorHeartbeats; its keys and leases (under
// /apiary-bench/floor/fleet/) are deleted after.
func (x *fsRun) measureFloor(ctx context.Context, when string) (f FleetFloor, _ error) {
	o := x.o
	f = FleetFloor{When: when, Nodes: o.FloorNodes}
	host0 := readHostCPU()
	defer func() { f.ForeignCPU = foreignShare(host0, readHostCPU()) }()
	prefix := fmt.Sprintf("%sfleet/%d/", prefFloor, time.Now().UnixNano())
	// Long enough that no lease of the floor expires before its heartbeats
	// (they are revoked at the end).
	ttl := int64(max(o.LeaseTTL, 5*time.Minute).Seconds())
	var clis []*clientv3.Client
	for _, ep := range x.r.EtcdEndpoints {
		c, err := etcdClient([]string{ep})
		if err != nil {
			return f, err
		}
		defer c.Close()
		clis = append(clis, c)
	}
	var mu sync.Mutex
	var leases []clientv3.LeaseID
	defer func() {
		// Revoke every lease (their alive keys go with them), then the rest.
		var wg sync.WaitGroup
		next := make(chan clientv3.LeaseID)
		for w := range 64 {
			wg.Go(func() {
				for id := range next {
					cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
					_, _ = clis[w%len(clis)].Revoke(cctx, id)
					cancel()
				}
			})
		}
		for _, id := range leases {
			next <- id
		}
		close(next)
		wg.Wait()
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		_, _ = clis[0].Delete(cctx, prefix, clientv3.WithPrefix())
		cancel()
	}()
	fail := func(err error) (FleetFloor, error) {
		f.Err = err.Error()
		return f, fmt.Errorf("floor (%s): %w", when, err)
	}
	var serial []float64
	for i := range fsFloorSerial {
		t := time.Now()
		n, err := fsFloorRegister(ctx, clis[i%len(clis)], prefix, "s-"+strconv.Itoa(i), ttl)
		if n.lease != 0 {
			leases = append(leases, n.lease)
		}
		if err != nil {
			return fail(err)
		}
		serial = append(serial, ms(time.Since(t)))
	}
	f.SerialMs = Summarize(serial).P50
	for _, workers := range o.FloorWorkers {
		lv := FleetFloorLevel{Workers: workers}
		nodes := make([]fsFloorNode, o.FloorNodes)
		var firstErr error
		var wg sync.WaitGroup
		idx := make(chan int)
		t := time.Now()
		for w := range workers {
			wg.Go(func() {
				for i := range idx {
					n, err := fsFloorRegister(ctx, clis[w%len(clis)], prefix, fmt.Sprintf("w%d-%d", workers, i), ttl)
					mu.Lock()
					if err != nil && firstErr == nil {
						firstErr = err
					}
					if n.lease != 0 {
						leases = append(leases, n.lease)
					}
					nodes[i] = n
					mu.Unlock()
				}
			})
		}
		for i := range o.FloorNodes {
			idx <- i
		}
		close(idx)
		wg.Wait()
		if firstErr != nil {
			return fail(firstErr)
		}
		lv.RegPerS = float64(o.FloorNodes) / time.Since(t).Seconds()
		var beats int64
		end := time.Now().Add(o.FloorHeartbeats)
		t = time.Now()
		for w := range workers {
			wg.Go(func() {
				var mine int64
				for i := w % len(nodes); time.Now().Before(end); i = (i + workers) % len(nodes) {
					if err := fsFloorHeartbeat(ctx, clis[w%len(clis)], nodes[i]); err != nil {
						mu.Lock()
						if firstErr == nil {
							firstErr = err
						}
						mu.Unlock()
						return
					}
					mine++
				}
				mu.Lock()
				beats += mine
				mu.Unlock()
			})
		}
		wg.Wait()
		if firstErr != nil {
			return fail(firstErr)
		}
		lv.HeartbeatsPerS = float64(beats) / time.Since(t).Seconds()
		f.Levels = append(f.Levels, lv)
		if lv.RegPerS > f.RegPerS {
			f.RegPerS, f.Workers = lv.RegPerS, workers
		}
		f.HeartbeatsPerS = max(f.HeartbeatsPerS, lv.HeartbeatsPerS)
		x.cfg.logf("fleetscale: floor (%s): %d goroutines: %.0f registrations/s, %.0f heartbeats/s", when, workers, lv.RegPerS, lv.HeartbeatsPerS)
	}
	x.cfg.logf("fleetscale: floor (%s): one registration %.2f ms serial; best %.0f registrations/s (%d goroutines), %.0f heartbeats/s",
		when, f.SerialMs, f.RegPerS, f.Workers, f.HeartbeatsPerS)
	return f, nil
}

// fsFloorNode is one of the floor's fake nodes.
type fsFloorNode struct {
	alive, rec string
	lease      clientv3.LeaseID
}

// fsFloorRegister does the etcd operations RegisterNode does for a node
// with no current epoch (regional/agentserver.go), on keys under prefix:
// read the alive key, grant a lease, create the alive key on it (a
// compared Txn: its CreateRevision is the epoch), read the record, and
// write the record with the usage key if absent, compared on the epoch
// and the record's ModRevision.
func fsFloorRegister(ctx context.Context, cli *clientv3.Client, prefix, id string, ttl int64) (fsFloorNode, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n := fsFloorNode{alive: prefix + id + "/alive", rec: prefix + id}
	usage := prefix + id + "/usage"
	if _, err := cli.Get(cctx, n.alive); err != nil {
		return n, err
	}
	lease, err := cli.Grant(cctx, ttl)
	if err != nil {
		return n, err
	}
	n.lease = lease.ID
	resp, err := cli.Txn(cctx).If(clientv3.Compare(clientv3.CreateRevision(n.alive), "=", 0)).
		Then(clientv3.OpPut(n.alive, id, clientv3.WithLease(lease.ID))).Else(clientv3.OpGet(n.alive)).Commit()
	if err != nil {
		return n, err
	}
	if !resp.Succeeded {
		return n, fmt.Errorf("floor key %s exists", n.alive)
	}
	epoch := resp.Header.Revision
	prev, err := cli.Get(cctx, n.rec)
	if err != nil {
		return n, err
	}
	var prevRev int64
	if len(prev.Kvs) == 1 {
		prevRev = prev.Kvs[0].ModRevision
	}
	rec := store.NodeRecord{ID: id, Capacity: &apiaryv1.Resources{CpuMillis: 32000, MemoryMb: 65536}, MaxTasks: 32,
		Epoch: epoch, LeaseID: int64(lease.ID), RegisteredMs: time.Now().UnixMilli()}
	_, err = cli.Txn(cctx).If(clientv3.Compare(clientv3.CreateRevision(n.alive), "=", epoch),
		clientv3.Compare(clientv3.ModRevision(n.rec), "=", prevRev)).
		Then(clientv3.OpPut(n.rec, store.MustJSON(rec)),
			clientv3.OpDelete(prefix+id+"/outputs/", clientv3.WithPrefix()),
			clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(usage), "=", 0)},
				[]clientv3.Op{clientv3.OpPut(usage, store.MustJSON(store.UsageRecord{}))}, nil)).
		Else(clientv3.OpGet(n.alive)).Commit()
	return n, err
}

// fsFloorHeartbeat does the etcd operations Heartbeat does: one Txn of two
// gets (alive key, record) and a KeepAliveOnce of the lease.
func fsFloorHeartbeat(ctx context.Context, cli *clientv3.Client, n fsFloorNode) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := cli.Txn(cctx).Then(clientv3.OpGet(n.alive), clientv3.OpGet(n.rec)).Commit(); err != nil {
		return err
	}
	_, err := cli.KeepAliveOnce(cctx, n.lease)
	return err
}

// fsSelfCPU is this process's user+system CPU seconds (getrusage).
func fsSelfCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// fsRSSMiB is a process's VmRSS (/proc/<pid>/status) in MiB, -1 if
// unreadable.
func fsRSSMiB(pid int) float64 {
	if pid == 0 {
		return -1
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				kb, _ := strconv.ParseFloat(f[0], 64)
				return kb / 1024
			}
		}
	}
	return -1
}

// fsSleep sleeps d (nothing if d <= 0) unless ctx ends first.
func fsSleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// WriteFleetScale writes the run's raw rows (fleetscale-seconds.csv: one
// row a second; fleetscale-storms.csv: one row per storm;
// fleetscale-steady.csv: one row per process; fleetscale-floors.csv;
// fleetscale-queries.csv; the whole result as fleetscale-result.json), its PNGs (fleetscale-steady-cpu.png,
// fleetscale-steady-rss.png, fleetscale-steady-heartbeats.png,
// fleetscale-storm-reregister.png, fleetscale-storm-restart.png) and the
// coordinators' profiles to out, and returns the summary's markdown
// section.
func WriteFleetScale(out string, res FleetScaleResult) (string, error) {
	o := res.Options
	var firstErr error
	note := func(err error) {
		if err != nil && firstErr == nil {
			firstErr = err
		}
	}
	opt := func(v float64) string {
		if v < 0 {
			return ""
		}
		return f1(v)
	}
	header := []string{"phase", "round", "t_s", "abs_s"}
	for _, c := range res.Coordinators {
		header = append(header, c+"_cpu_pct", c+"_rss_mib")
	}
	header = append(header, "fleet_cpu_pct", "fleet_rss_mib", "fleet_self_cpu_pct", "fleet_registered", "fleet_heartbeats_per_s", "fleet_registrations",
		"bench_cpu_pct", "bench_rss_mib", "api_nodes_ready", "api_ms", "watch_ready", "watch_ready_new_epoch")
	var rows [][]string
	for _, s := range res.Seconds {
		row := []string{s.Phase, strconv.Itoa(s.Round), f1(s.T), f1(s.Abs)}
		for i := range s.CoordCPU {
			row = append(row, opt(s.CoordCPU[i]), opt(s.CoordRSS[i]))
		}
		row = append(row, opt(s.FleetCPU), opt(s.FleetRSS), opt(s.FleetSelfCPU), fsOptInt(s.FleetRegistered), opt(s.FleetHeartbeatsPerS),
			fsOptInt(int(s.FleetRegistrations)), opt(s.BenchCPU), opt(s.BenchRSS), fsOptInt(s.APIReady), opt(s.APIMs), fsOptInt(s.Ready), fsOptInt(s.Fresh))
		rows = append(rows, row)
	}
	note(WriteCSV(filepath.Join(out, "fleetscale-seconds.csv"), header, rows))

	stormHeader := []string{"round", "kind", "ran", "down_ms", "serving_ms", "leases_gone_ms", "all_ready_ms", "api_ready_ms", "agents_new_epoch_ms",
		"heartbeats_back_ms", "heartbeats_after_per_s", "ready_min", "peak", "peak_ms", "new_epochs", "missing", "missing_ids", "registrations", "fleet_failed", "fleet_log_errors", "fleet_log_warnings", "fleet_log_top",
		"listnodes_ready", "listnodes_new_epoch", "listnodes_ms", "floor_serial_ms", "floor_reg_per_s", "floor_ms", "all_ready_over_floor", "foreign_cpu_share", "etcd_leader", "error"}
	rows = nil
	for _, s := range res.Storms {
		if !s.Ran {
			row := make([]string, len(stormHeader))
			row[0], row[1], row[2], row[len(row)-1] = strconv.Itoa(s.Round), s.Kind, "false", s.Err
			rows = append(rows, row)
			continue
		}
		var fl FleetFloor
		if s.Floor != nil {
			fl = *s.Floor
		}
		rows = append(rows, []string{strconv.Itoa(s.Round), s.Kind, "true", f1(s.DownMs), f1(s.ServingMs), f1(s.LeasesGoneMs), f1(s.AllReadyMs), f1(s.APIReadyMs), f1(s.AgentsMs),
			f1(s.HeartbeatsBackMs), f1(s.HeartbeatsAfterPerS), strconv.Itoa(s.ReadyMin), strconv.Itoa(s.Peak), f1(s.PeakMs), strconv.Itoa(s.NewEpochs), strconv.Itoa(s.Missing), strings.Join(s.MissingIDs, " "),
			strconv.FormatInt(s.Registrations, 10), strconv.Itoa(s.FleetFailed), strconv.Itoa(s.LogErrors), strconv.Itoa(s.LogWarnings), strings.Join(s.LogTop, "; "),
			strconv.Itoa(s.ListReady), strconv.Itoa(s.ListNew), f1(s.ListMs),
			f1(fl.SerialMs), f1(fl.RegPerS), f1(fsFloorMs(o.Agents, fl)), fsRatio(s.AllReadyMs, fsFloorMs(o.Agents, fl)),
			strconv.FormatFloat(s.ForeignCPU, 'f', 3, 64), s.EtcdLeader, s.Err})
	}
	note(WriteCSV(filepath.Join(out, "fleetscale-storms.csv"), stormHeader, rows))

	st := res.Steady
	rows = nil
	for _, p := range st.Procs {
		rows = append(rows, []string{p.Name, f1(p.CPUPercent), f1(p.CPUP95), f1(p.RSSEnd), f1(p.RSSMax)})
	}
	note(WriteCSV(filepath.Join(out, "fleetscale-steady.csv"), []string{"process", "cpu_pct_mean", "cpu_pct_p95", "rss_mib_end", "rss_mib_max"}, rows))
	rows = nil
	for _, f := range res.Floors {
		fc := strconv.FormatFloat(f.ForeignCPU, 'f', 3, 64)
		rows = append(rows, []string{f.When, "1", strconv.Itoa(fsFloorSerial), strconv.FormatFloat(f.SerialMs, 'f', 3, 64), "", "", fc, f.Err})
		for _, l := range f.Levels {
			rows = append(rows, []string{f.When, strconv.Itoa(l.Workers), strconv.Itoa(f.Nodes), "", f1(l.RegPerS), f1(l.HeartbeatsPerS), fc, ""})
		}
	}
	note(WriteCSV(filepath.Join(out, "fleetscale-floors.csv"), []string{"when", "workers", "registrations", "serial_registration_ms_p50", "registrations_per_s", "heartbeats_per_s", "foreign_cpu_share", "error"}, rows))
	rows = nil
	for _, q := range res.Queries {
		for i, v := range q.Ms {
			rows = append(rows, []string{q.Call, strconv.Itoa(i + 1), f1(v), strconv.Itoa(q.Bytes), strconv.Itoa(q.Ready)})
		}
	}
	note(WriteCSV(filepath.Join(out, "fleetscale-queries.csv"), []string{"call", "n", "ms", "response_bytes", "nodes_ready"}, rows))
	for _, p := range res.Profiles {
		if b, err := os.ReadFile(p); err == nil {
			note(os.WriteFile(filepath.Join(out, filepath.Base(p)), b, 0o644))
		}
	}
	note(fsPlots(out, res))
	if b, err := json.MarshalIndent(res, "", " "); err == nil {
		note(os.WriteFile(filepath.Join(out, "fleetscale-result.json"), b, 0o644))
	}
	return fleetScaleMarkdown(res), firstErr
}

func fsOptInt(v int) string {
	if v < 0 {
		return ""
	}
	return strconv.Itoa(v)
}

// fsFloorMs is the floor of n registrations: n at the floor's concurrent
// rate (0 without one).
func fsFloorMs(n int, f FleetFloor) float64 {
	if f.RegPerS <= 0 {
		return 0
	}
	return float64(n) / f.RegPerS * 1000
}

func fsRatio(a, b float64) string {
	if a <= 0 || b <= 0 {
		return ""
	}
	return strconv.FormatFloat(a/b, 'f', 2, 64)
}

var fsColors = []color.RGBA{{B: 200, A: 255}, {R: 220, G: 100, A: 255}, {G: 150, A: 255}, {R: 140, B: 140, A: 255},
	{R: 200, A: 255}, {R: 100, G: 100, B: 100, A: 255}, {G: 160, B: 200, A: 255}}

// fsSaveLines draws each series as a line and each reference line dashed,
// and writes the PNG to path.
func fsSaveLines(path, title, xLabel, yLabel string, series []plotSeries, lines []refLine) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xLabel
	p.Y.Label.Text = yLabel
	p.Y.Min = 0
	xMin, xMax, yMax := 0.0, 1.0, 1.0
	for _, s := range series {
		for _, pt := range s.XY {
			xMin, xMax, yMax = min(xMin, pt.X), max(xMax, pt.X), max(yMax, pt.Y)
		}
	}
	for _, l := range lines {
		yMax = max(yMax, l.Y)
	}
	p.Y.Max = yMax * (1.2 + 0.06*float64(len(series)+len(lines)))
	p.X.Min, p.X.Max = xMin, xMax
	for i, s := range series {
		if len(s.XY) == 0 {
			continue
		}
		l, err := plotter.NewLine(s.XY)
		if err != nil {
			return err
		}
		l.Color = fsColors[i%len(fsColors)]
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(s.Name, l)
	}
	for i, r := range lines {
		l, err := plotter.NewLine(plotter.XYs{{X: xMin, Y: r.Y}, {X: xMax, Y: r.Y}})
		if err != nil {
			return err
		}
		l.Color = []color.RGBA{{R: 200, A: 255}, {R: 120, G: 120, B: 120, A: 255}, {G: 120, B: 200, A: 255}}[i%3]
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(l)
		p.Legend.Add(r.Name, l)
	}
	p.Legend.Top, p.Legend.Left = true, true
	p.Add(plotter.NewGrid())
	return p.Save(9*vg.Inch, 4.5*vg.Inch, path)
}

func fsPlots(out string, res FleetScaleResult) error {
	o := res.Options
	var steady []FleetSecond
	for _, s := range res.Seconds {
		if s.Phase == "steady" {
			steady = append(steady, s)
		}
	}
	pts := func(rows []FleetSecond, f func(FleetSecond) float64) plotter.XYs {
		var xy plotter.XYs
		for _, r := range rows {
			if v := f(r); v >= 0 {
				xy = append(xy, plotter.XY{X: r.T, Y: v})
			}
		}
		return xy
	}
	var cpu, rss []plotSeries
	for i, c := range res.Coordinators {
		cpu = append(cpu, plotSeries{Name: c, XY: pts(steady, func(r FleetSecond) float64 { return r.CoordCPU[i] })})
		rss = append(rss, plotSeries{Name: c, XY: pts(steady, func(r FleetSecond) float64 { return r.CoordRSS[i] })})
	}
	cpu = append(cpu, plotSeries{Name: "fleet (all agents)", XY: pts(steady, func(r FleetSecond) float64 { return r.FleetCPU })},
		plotSeries{Name: "bench harness", XY: pts(steady, func(r FleetSecond) float64 { return r.BenchCPU })})
	rss = append(rss, plotSeries{Name: "fleet (all agents)", XY: pts(steady, func(r FleetSecond) float64 { return r.FleetRSS })},
		plotSeries{Name: "bench harness", XY: pts(steady, func(r FleetSecond) float64 { return r.BenchRSS })})
	what := fmt.Sprintf("%d agents, %d coordinators", o.Agents, o.Coordinators)
	if err := fsSaveLines(filepath.Join(out, "fleetscale-steady-cpu.png"), "steady state, "+what+": CPU per process", "s into the window", "% of one core", cpu, nil); err != nil {
		return err
	}
	if err := fsSaveLines(filepath.Join(out, "fleetscale-steady-rss.png"), "steady state, "+what+": resident memory per process", "s into the window", "VmRSS (MiB)", rss, nil); err != nil {
		return err
	}
	var lines []refLine
	if hb := fsBestHeartbeats(res.Floors); hb > 0 {
		lines = append(lines, refLine{Name: "floor: the etcd operations of a heartbeat, best of the run (region idle)", Y: hb})
	}
	if err := fsSaveLines(filepath.Join(out, "fleetscale-steady-heartbeats.png"), "steady state, "+what+": heartbeats answered", "s into the window", "heartbeats/s (fleet's count, per second)",
		[]plotSeries{{Name: "answered", XY: pts(steady, func(r FleetSecond) float64 { return r.FleetHeartbeatsPerS })}}, lines); err != nil {
		return err
	}
	for _, kind := range []string{FleetStormReregister, FleetStormRestart} {
		var series []plotSeries
		for _, st := range res.Storms {
			if st.Kind != kind {
				continue
			}
			var rows []FleetSecond
			for _, s := range res.Seconds {
				if s.Phase == kind && s.Round == st.Round {
					rows = append(rows, s)
				}
			}
			if kind == FleetStormReregister {
				series = append(series, plotSeries{Name: fmt.Sprintf("storm %d: READY on a new epoch (watch)", st.Round), XY: pts(rows, func(r FleetSecond) float64 { return float64(r.Fresh) })})
				if st.Floor != nil && st.Floor.RegPerS > 0 {
					series = append(series, plotSeries{Name: fmt.Sprintf("storm %d: its floor (%.0f registrations/s)", st.Round, st.Floor.RegPerS),
						XY: plotter.XYs{{X: 0, Y: 0}, {X: float64(o.Agents) / st.Floor.RegPerS, Y: float64(o.Agents)}}})
				}
			} else {
				series = append(series, plotSeries{Name: fmt.Sprintf("storm %d: READY (watch)", st.Round), XY: pts(rows, func(r FleetSecond) float64 { return float64(r.Ready) })},
					plotSeries{Name: fmt.Sprintf("storm %d: heartbeats/s x 0.5 s (fleet; agents heartbeating at the asked rate)", st.Round), XY: pts(rows, func(r FleetSecond) float64 { return r.FleetHeartbeatsPerS / 2 })})
			}
		}
		if len(series) == 0 {
			continue
		}
		title := fmt.Sprintf("re-registration storm, %s: READY nodes on a new epoch from SIGCONT of the fleet", what)
		xl := "s from SIGCONT (every node lease had expired)"
		if kind == FleetStormRestart {
			title = fmt.Sprintf("restart storm, %s: READY nodes and heartbeats from the coordinators' restart", what)
			xl = "s from the restart of every coordinator"
		}
		if err := fsSaveLines(filepath.Join(out, "fleetscale-storm-"+kind+".png"), title, xl, "nodes", series, []refLine{{Name: "agents", Y: float64(o.Agents)}}); err != nil {
			return err
		}
	}
	return nil
}

// fleetScaleMarkdown is the summary's section.
func fleetScaleMarkdown(res FleetScaleResult) string {
	o := res.Options
	var b strings.Builder
	fleetCmd := "loadtest fleet"
	if len(res.FleetArgs) >= 2 {
		fleetCmd = strings.Join(res.FleetArgs[:2], " ")
	}
	fmt.Fprintf(&b, "## fleet10k\n\n%s simulated agents (`apiary %s`: one subprocess of real agent.Agent values on the noop executor, sharing %d gRPC connections per coordinator, no serf LAN members) on a %d-member region (devcluster, no LAN pool, coordinator flags `%s`). "+
		"All on this machine: the fleet, the coordinators and the harness share its CPUs. Coordinators ask each agent to heartbeat every 500 ms, or every agents ÷ --max-heartbeats-per-second seconds once the fleet passes that rate (default %s/s, Nomad's max_heartbeats_per_second; at most lease/4), so %s agents are asked for %s heartbeats/s.\n\n",
		thousands(float64(o.Agents)), fleetCmd, max(1, min((o.Agents+249)/250, 64)), o.Coordinators, strings.Join(res.CoordArgs, " "),
		thousands(float64(regional.DefaultMaxHeartbeatsPerSecond)), thousands(float64(o.Agents)), thousands(fsAskedHeartbeats(o.Agents)))
	if res.Err != "" {
		fmt.Fprintf(&b, "**The run ended early:** %s\n\n", res.Err)
	}
	fl0 := FleetFloor{}
	if len(res.Floors) > 0 {
		fl0 = res.Floors[0]
	}
	var levels []string
	for _, l := range fl0.Levels {
		levels = append(levels, fmt.Sprintf("%d goroutines: %.0f registrations/s, %.0f heartbeats/s", l.Workers, l.RegPerS, l.HeartbeatsPerS))
	}
	fmt.Fprintf(&b, "**Floor** (measured in this run): the etcd operations of one RegisterNode of a node without an epoch (get alive, grant, alive Txn, get record, record Txn) and of one Heartbeat (Txn of 2 gets + KeepAliveOnce), done by the harness itself on fake nodes under /apiary-bench/floor/ through one etcd client per member, "+
		"with the region idle (a same-run reference for this machine's speed: the coordinators reach their own member in process and may beat it): before the fleet started, and in each re-registration storm once every lease had expired (the fleet stopped). %d registrations one at a time, then %s at each concurrency; the best concurrency is the floor. "+
		"Before the fleet (foreign CPU share %.2f): one registration %.2f ms serially; %s. The machine's load varies, so every re-registration storm is compared with its own floor, timed seconds before it, and the steady state with the best heartbeat floor of the run (all in fleetscale-floors.csv). The coordinators do at least this etcd work per call and more (gRPC, the assignment stream's Get and two watches, logs), so a ratio well above 1 is the region's own overhead.\n\n",
		fsFloorSerial, thousands(float64(fl0.Nodes)), fl0.ForeignCPU, fl0.SerialMs, strings.Join(levels, "; "))

	r := res.Ramp
	fmt.Fprintf(&b, "### Ramp\n\n| all %s registered (fleet clock) | schedule (agents / start rate %g/s) | ratio | GetRegionInfo says all READY | epochs begun |\n|---|---|---|---|---|\n| %.1f s | %.1f s | %s | %.1f s | %d |\n\n",
		thousands(float64(o.Agents)), o.StartRate, r.AllRegisteredMs/1000, r.FloorMs/1000, fsRatio(r.AllRegisteredMs, r.FloorMs), r.APIReadyMs/1000, r.Registrations)

	st := res.Steady
	if st.WindowS > 0 {
		fmt.Fprintf(&b, "### Steady state (%.0f s window, %s after the last registration)\n\n", st.WindowS, o.Settle)
		fmt.Fprintf(&b, "Heartbeats answered: **%.0f/s** (one per agent every %.0f ms; asked for: %s/s), %s the best heartbeat floor of the run (%.0f/s); coordinators' CPU per answered heartbeat %.0f µs (all coordinators, etcd members included). "+
			"Epochs begun in the window: %d (0 = no lease lapsed). Agents failed: %d. Foreign CPU share: %.2f. "+
			"Each agent starts at the coordinator its node id hashes to, so about 1/%d of them heartbeat through each; the etcd leader was %s (a heartbeat through a follower's member forwards its lease renewal to the leader over HTTP).\n\n",
			st.HeartbeatsPerS, st.PerAgentMs, thousands(fsAskedHeartbeats(o.Agents)), fsRatioX(st.HeartbeatsPerS, fsBestHeartbeats(res.Floors)), fsBestHeartbeats(res.Floors), st.CoordCPUPerHeartbeatUs,
			st.Registrations, st.FleetFailed, st.ForeignCPU, len(res.Coordinators), res.EtcdLeader)
		b.WriteString("| process | CPU % of one core (mean) | per-second p95 | RSS MiB at end | RSS MiB max |\n|---|---|---|---|---|\n")
		for _, p := range st.Procs {
			name := p.Name
			switch name {
			case "fleet":
				name = fmt.Sprintf("fleet (%s agents; its own getrusage: %.0f%%)", thousands(float64(o.Agents)), st.FleetSelfCPUPercent)
			case "bench":
				name = "bench harness (watch, sampler)"
			}
			fmt.Fprintf(&b, "| %s | %.0f | %.0f | %.0f | %.0f |\n", name, p.CPUPercent, p.CPUP95, p.RSSEnd, p.RSSMax)
		}
		b.WriteString("\n")
	}
	if len(res.Queries) > 0 {
		fmt.Fprintf(&b, "Reading the region at %s nodes through the public API (3 calls each, one after another, after the window):\n\n| call | ms (each) | response bytes | nodes READY |\n|---|---|---|---|\n", thousands(float64(o.Agents)))
		for _, q := range res.Queries {
			var xs []string
			for _, v := range q.Ms {
				xs = append(xs, f1(v))
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %d |\n", q.Call, strings.Join(xs, ", "), thousands(float64(q.Bytes)), q.Ready)
		}
		b.WriteString("\n")
	}

	var rereg, restart, notRun []FleetStorm
	for _, s := range res.Storms {
		switch {
		case !s.Ran:
			notRun = append(notRun, s)
		case s.Kind == FleetStormReregister:
			rereg = append(rereg, s)
		default:
			restart = append(restart, s)
		}
	}
	// dur is a storm's time, or that it did not recover.
	dur := func(s FleetStorm, v float64) string {
		if v <= 0 && s.Err != "" {
			return "not within " + o.StormTimeout.String()
		}
		return fmt.Sprintf("%.1f s", v/1000)
	}
	list := func(ready, fresh int, took float64) string {
		if ready < 0 {
			return fmt.Sprintf("failed (%.0f ms)", took)
		}
		return fmt.Sprintf("%d / %d (%.0f ms)", ready, fresh, took)
	}
	if len(rereg) > 0 {
		fmt.Fprintf(&b, "### Re-registration storm (n = %d)\n\nThe fleet SIGSTOPped, every coordinator SIGKILLed and restarted at once, the fleet kept stopped until every node's alive key was gone (every lease expired: every epoch ended), the floor measured, then SIGCONT (T0). "+
			"Every agent's next heartbeat is refused (epoch gone) and it registers again. Times from T0; READY = the alive key of the record's epoch, seen by the harness's etcd watch; GetRegionInfo polled every second; a storm is given %s to recover.\n\n", len(rereg), o.StormTimeout)
		b.WriteString("| storm | serving after restart | leases gone after serving | **all READY on a new epoch** (watch) | most READY on a new epoch (when) | GetRegionInfo all READY | every agent holds a new epoch (fleet, 1 s) | floor (agents / floor rate) | ratio | epochs begun | missing at the end | fleet log errors / warnings | ListNodes READY / new |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		var all, ratios []float64
		for _, s := range rereg {
			var fl FleetFloor
			if s.Floor != nil {
				fl = *s.Floor
			}
			floorMs := fsFloorMs(o.Agents, fl)
			fmt.Fprintf(&b, "| %d | %.1f s | %.1f s | %s | %d (%.1f s) | %s | %s | %.1f s (%.0f reg/s) | %s | %d | %d | %d / %d | %s |\n", s.Round, s.ServingMs/1000, s.LeasesGoneMs/1000,
				dur(s, s.AllReadyMs), s.Peak, s.PeakMs/1000, dur(s, s.APIReadyMs), dur(s, s.AgentsMs), floorMs/1000, fl.RegPerS, fsRatio(s.AllReadyMs, floorMs), s.Registrations, s.Missing,
				s.LogErrors, s.LogWarnings, list(s.ListReady, s.ListNew, s.ListMs))
			if s.AllReadyMs > 0 {
				all = append(all, s.AllReadyMs)
				if floorMs > 0 {
					ratios = append(ratios, s.AllReadyMs/floorMs)
				}
			}
		}
		if len(all) > 0 {
			sa, sr := Summarize(all), Summarize(ratios)
			fmt.Fprintf(&b, "\nAll %s READY on a new epoch: p50 %.1f s, max %.1f s (%d of %d storms recovered); ratio to the floor p50 %.2f, max %.2f. Against registering them one at a time (%s x the serial %.2f ms = %.1f s): p50 %s.\n\n",
				thousands(float64(o.Agents)), sa.P50/1000, sa.Max/1000, sa.N, len(rereg), sr.P50, sr.Max, thousands(float64(o.Agents)), fl0.SerialMs, float64(o.Agents)*fl0.SerialMs/1000,
				fsRatio(sa.P50, float64(o.Agents)*fl0.SerialMs))
		} else {
			fmt.Fprintf(&b, "\n**No storm recovered within %s**: not every agent was READY on a new epoch (see the peak, and fleetscale-storm-reregister.png).\n\n", o.StormTimeout)
		}
		for _, s := range rereg {
			if len(s.LogTop) > 0 || s.Err != "" || len(s.MissingIDs) > 0 {
				fmt.Fprintf(&b, "- storm %d:", s.Round)
				if s.Err != "" {
					fmt.Fprintf(&b, " error: %s;", s.Err)
				}
				if len(s.MissingIDs) > 0 {
					fmt.Fprintf(&b, " not back at the end (first %d): %s;", len(s.MissingIDs), strings.Join(s.MissingIDs, " "))
				}
				fmt.Fprintf(&b, " fleet log: %s\n", strings.Join(s.LogTop, "; "))
			}
		}
		b.WriteString("\n")
	}
	if len(restart) > 0 {
		fmt.Fprintf(&b, "### Restart storm (n = %d)\n\nEvery coordinator SIGKILLed, kept down %s (past the node lease), restarted (T0); the fleet runs on. etcd keeps the leases' clocks stopped while its members are down and a new leader renews every lease for a full TTL, so no epoch needs to end: the agents' heartbeats only have to get through within one lease.\n\n", len(restart), o.Down)
		b.WriteString("| storm | serving after restart | heartbeats back to half the steady rate | heartbeats/s in the storm's last 10 s | READY min | epochs ended (new epochs) | epochs begun | missing | fleet log errors / warnings |\n|---|---|---|---|---|---|---|---|---|\n")
		var back []float64
		for _, s := range restart {
			fmt.Fprintf(&b, "| %d | %.1f s | %s | %.0f | %d | %d | %d | %d | %d / %d |\n", s.Round, s.ServingMs/1000, dur(s, s.HeartbeatsBackMs), s.HeartbeatsAfterPerS, s.ReadyMin, s.NewEpochs, s.Registrations, s.Missing, s.LogErrors, s.LogWarnings)
			if s.HeartbeatsBackMs > 0 {
				back = append(back, s.HeartbeatsBackMs)
			}
		}
		sb := Summarize(back)
		fmt.Fprintf(&b, "\nHeartbeats back to half the steady rate: p50 %.1f s, max %.1f s (1 s resolution: the fleet's samples); steady state before the storms: %.0f/s. "+
			"Each agent starts at the coordinator its node id hashes to and moves round its list only when one fails.\n\n",
			sb.P50/1000, sb.Max/1000, res.Steady.HeartbeatsPerS)
		for _, s := range restart {
			if s.Err != "" || len(s.MissingIDs) > 0 {
				fmt.Fprintf(&b, "- storm %d: %s %s\n", s.Round, s.Err, strings.Join(s.MissingIDs, " "))
			}
		}
		b.WriteString("\n")
	}
	for _, s := range notRun {
		fmt.Fprintf(&b, "Storm %d (%s) did not run: %s\n\n", s.Round, s.Kind, s.Err)
	}
	b.WriteString("Caveats: one machine; the fleet process (all agents) takes CPU the coordinators would have on a real deployment, see its row; the floor's client is the harness's gRPC client (the coordinators reach their own member in process, about 2x faster), and it runs on an idle region, so it is a floor, not a prediction. " +
		"Raw rows: fleetscale-seconds.csv (one per second, every phase), fleetscale-storms.csv, fleetscale-steady.csv, fleetscale-floors.csv, fleetscale-queries.csv; coordinator profiles after the window: fleetscale-*-cpu.pprof, fleetscale-*-heap.pprof.\n\n")
	return b.String()
}

// fsBestHeartbeats is the highest heartbeat rate of the floors (the
// machine's load varies during a run; the best is the strictest floor).
func fsBestHeartbeats(fs []FleetFloor) float64 {
	var best float64
	for _, f := range fs {
		best = max(best, f.HeartbeatsPerS)
	}
	return best
}

// fsRatioX is a/b as "0.42x" ("-" without b).
func fsRatioX(a, b float64) string {
	if b <= 0 {
		return "-"
	}
	return strconv.FormatFloat(a/b, 'f', 2, 64) + "x"
}

// fsAskedHeartbeats is the heartbeat rate a region with the default
// --max-heartbeats-per-second asks of agents agents (2 per second each, up
// to the cap).
func fsAskedHeartbeats(agents int) float64 {
	return min(float64(agents)*2, regional.DefaultMaxHeartbeatsPerSecond)
}
