package bench

// Million (issue 16): how a region's control plane holds up as its state
// grows. A 3-member region with job retention off is filled through the
// public SubmitJob API with jobs of many tiny tasks, run to completion by
// a simulated fleet in this process (loadtest.RunFleet, noop executor), so
// that every task record stays in etcd; at each checkpoint (10k, 100k, 1M
// task records by default) the fill pauses and the harness measures
// submit latency, the coordinators' etcd Txn latency, their memory and
// idle CPU, the etcd DB size and, at the top size, a shard owner's
// failover; the floor of every checkpoint is etcd's own single-put latency.

import (
	"context"
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	clientv3 "go.etcd.io/etcd/client/v3"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/jobspec"
	"apiary.dev/apiary/loadtest"
	"apiary.dev/apiary/shards"
)

// prefResults holds the attempt results (regional/keys.go), one or more
// per finished task.
const prefResults = "/apiary/results/"

// The coordinators' metrics the benchmark reads (internal/telemetry).
const (
	// metricTxn is every etcd Txn attempt of a coordinator's txnRetry
	// (submission group commits, the scheduler's fenced plan Txns, report
	// Txns), by result; the only commit-latency histogram the coordinator
	// exports.
	metricTxn = "apiary_etcd_txn_duration_seconds"
	// metricToDispatch is submission to first dispatch of each task.
	metricToDispatch = "apiary_task_submit_to_dispatch_seconds"
)

// The published mark and issue 16's goal for plan commit latency, in ms: an
// etcd/raft coordinator of this design committing at 220 ms with 150,000
// tasks in state; the goal is a p99 under 50 ms, flat as the state grows.
const (
	millionPublishedMs    = 220.0
	millionPublishedTasks = 150_000
	millionGoalP99Ms      = 50.0
)

// millionSuspectAfter is the region's default --suspect-after (the
// benchmark does not change it): the detection part of the failover floor.
const millionSuspectAfter = 300 * time.Millisecond

// MillionOptions configures Million.
type MillionOptions struct {
	// Coordinators is the region's members (3).
	Coordinators int
	// Sizes are the checkpoints, in task records, ascending (MillionSizes).
	Sizes []int
	// TasksPerJob is the fill jobs' task count (at most jobspec.MaxTasks,
	// 10,000, the API's limit); the last job of a checkpoint may be smaller.
	TasksPerJob int32
	// Concurrency bounds the fill submissions in flight; MaxBacklog the
	// fill tasks submitted but not yet finished (fleet attempts ended).
	Concurrency, MaxBacklog int
	// Agents simulated agents (in this process, noop executor) x Slots
	// (--max-tasks) each, with Slots x 100 m and Slots x 16 MiB.
	Agents, Slots int
	// ProbeClients closed-loop clients submit single-task jobs for
	// ProbeDuration at each checkpoint.
	ProbeClients  int
	ProbeDuration time.Duration
	// FloorPuts serial etcd puts time the floor at each checkpoint.
	FloorPuts int
	// Idle is the window, after the probe, in which nothing is submitted:
	// the coordinators' CPU is read over it and, with Profile, each one's
	// CPU profile taken (and another during each checkpoint's fill).
	Idle    time.Duration
	Profile bool
	// StallTimeout fails the run when no fill task finishes for this long.
	StallTimeout time.Duration
	// FailoverTimeout bounds the wait, after the SIGKILL at the top size,
	// for the first dispatch in the victim's shards.
	FailoverTimeout time.Duration
	// NodeLease is the region's --node-lease-ttl (0: its default, 2 s): the
	// simulated agents share the harness's process and its 2 shared cores,
	// where 2 s leases lapse under load (as for Throughput: 10 s).
	NodeLease time.Duration
	// ExtraArgs go to every coordinator (--job-retention=-1s: keep every
	// finished job).
	ExtraArgs []string
}

// regionArgs is every coordinator's added arguments.
func (o MillionOptions) regionArgs() []string {
	args := slices.Clone(o.ExtraArgs)
	if o.NodeLease > 0 {
		args = append(args, "--node-lease-ttl", o.NodeLease.String())
	}
	return args
}

// DefaultMillion is issue 16's configuration.
var DefaultMillion = MillionOptions{Coordinators: 3, Sizes: MillionSizes(1_000_000), TasksPerJob: 1000,
	Concurrency: 4, MaxBacklog: 40_000, Agents: 200, Slots: 64, ProbeClients: 4, ProbeDuration: 10 * time.Second,
	FloorPuts: 200, Idle: 10 * time.Second, Profile: true, StallTimeout: 2 * time.Minute, FailoverTimeout: time.Minute,
	NodeLease: 10 * time.Second, ExtraArgs: []string{"--job-retention=-1s"}}

// MillionSizes is the checkpoints up to top: 10,000, 100,000 and
// 1,000,000 task records below top, then top.
func MillionSizes(top int) []int {
	var out []int
	for _, s := range []int{10_000, 100_000, 1_000_000} {
		if s < top {
			out = append(out, s)
		}
	}
	return append(out, top)
}

func (o MillionOptions) check() error {
	switch {
	case o.Coordinators < 1 || len(o.Sizes) == 0 || !slices.IsSorted(o.Sizes) || o.Sizes[0] < 1:
		return fmt.Errorf("million: coordinators %d, sizes %v: want >= 1 and ascending sizes", o.Coordinators, o.Sizes)
	case o.TasksPerJob < 1 || o.TasksPerJob > jobspec.MaxTasks:
		return fmt.Errorf("million: tasks per job %d: the API accepts 1..%d", o.TasksPerJob, jobspec.MaxTasks)
	case o.Concurrency < 1 || o.MaxBacklog < int(o.TasksPerJob) || o.Agents < 1 || o.Slots < 1 || o.ProbeClients < 1:
		return fmt.Errorf("million: concurrency %d, backlog %d (>= tasks per job %d), agents %d, slots %d, probe clients %d: want >= 1",
			o.Concurrency, o.MaxBacklog, o.TasksPerJob, o.Agents, o.Slots, o.ProbeClients)
	}
	return nil
}

// MillionCheckpoint is what was measured when the region held (about)
// Target task records, the fill paused and every task finished. Latencies
// are ms; memory and sizes MiB.
type MillionCheckpoint struct {
	Target int
	// Records, Results: task records and attempt results in etcd when the
	// fill had finished (count-only reads), before the probe.
	Records, Results int64
	// Jobs is the fill jobs submitted so far; FillTasks this checkpoint's.
	Jobs, FillTasks int
	// FillS: from the first fill submission of this checkpoint until all
	// of its tasks had finished; FillCoordCPU the coordinators' CPU
	// seconds over it (their etcd members included).
	FillS, FillCoordCPU float64
	// Submit probe: answers in the window, its latency (ms) and each
	// answer (SubmitSamples).
	SubmitOK, SubmitErrors          int64
	SubmitCodes                     string
	SubmitP50, SubmitP90, SubmitP99 float64
	SubmitMax                       float64
	SubmitSamples                   []MillionSample
	// Txn: the delta of every coordinator's etcd Txn histogram
	// (result="ok") over the probe window, summed: count and p50 / p99 by
	// linear interpolation inside the buckets; TxnBuckets the delta
	// (upper bound ms, cumulative count). Dispatch: the same of
	// submission to first dispatch.
	TxnN, TxnP50, TxnP99                float64
	TxnBuckets                          [][2]float64
	DispatchN, DispatchP50, DispatchP99 float64
	// Floor: FloorPuts serial etcd puts (ms each) just before the probe.
	FloorSamples       []float64
	FloorP50, FloorP99 float64
	// Mem is each coordinator's memory (VmRSS, RssAnon, RssFile from
	// /proc/<pid>/status; its etcd member included) before the probe.
	Mem []CoordMem
	// DBSize, DBInUse: the largest etcd backend size and in-use size over
	// the members (maintenance Status).
	DBSize, DBInUse float64
	// Info: GetRegionInfo's state_size_bytes / state_in_use_bytes, the
	// call's latency (it answers from the coordinator's job index, waiting for it to reach etcd's revision) and its error.
	InfoSize, InfoInUse, InfoMs float64
	InfoErr                     string
	// IdleCPU is the coordinators' CPU over the idle window, in % of one
	// core, all of them together.
	IdleCPU float64
	// Registrations is the fleet's node registrations so far (more than
	// Agents: leases lapsed and agents registered again).
	Registrations int64
	// ForeignCPU is other processes' share of the CPUs over the
	// checkpoint's measurements (0 when quiet).
	ForeignCPU float64
	// Failover is the SIGKILL at the top size (nil elsewhere).
	Failover *MillionFailover
	FailErr  string
}

// CoordMem is one coordinator's memory in MiB: the process's resident
// set (VmRSS = RssAnon + RssFile + shared), and its Go heap in use
// (go_memstats_heap_inuse_bytes from its /metrics: the live cache plus
// what the collector has not yet freed).
type CoordMem struct {
	ID                      string
	VmRSS, RssAnon, RssFile float64
	HeapInuse               float64
}

// MillionSample is one probe submission: sent (ms from the probe's start),
// its latency (ms) and its gRPC code ("OK").
type MillionSample struct {
	SentMs, Ms float64
	Code       string
}

// MillionFailover is the SIGKILL of one shard owner at the top size (a
// follower's host: the etcd leader stays up), under a trickle of
// single-task jobs every 20 ms; times are ms from the SIGKILL as the
// harness's watch through the survivors' members saw the events.
type MillionFailover struct {
	Victim       string
	VictimShards int
	// OwnerGoneMs: the victim's owner keys deleted; DispatchMs: the first
	// task of one of its shards written ASSIGNED after that (a survivor's
	// plan).
	OwnerGoneMs, DispatchMs float64
	// FloorEtcdMs: a revoke, a put and a put through a survivor's member
	// (measureFloor); FloorMs adds the default --suspect-after.
	FloorEtcdMs, FloorMs float64
	SubmitErrors         int64
}

// MillionRun is one Million run.
type MillionRun struct {
	Opts        MillionOptions
	Shards      int
	Checkpoints []MillionCheckpoint
	// Fleet is the fleet's final sample; TotalS the run's wall time.
	Fleet  loadtest.FleetSample
	TotalS float64
}

// millionRegion is a running Million: the region, its clients and the
// fleet's latest sample.
type millionRegion struct {
	cfg     Config
	o       MillionOptions
	out     string
	r       *devcluster.Region
	cli     *clientv3.Client
	conns   []*grpc.ClientConn
	ids     []string
	metrics []string // each coordinator's --metrics-addr
	pids    []int
	fleet   atomic.Pointer[loadtest.FleetSample]
	jobs    int
	profWG  sync.WaitGroup
}

// Million runs the benchmark (see MillionOptions) on a fresh region and
// returns what it measured; with o.Profile the coordinators' CPU profiles
// go to out as million-cpu-{fill,idle}-<size>-<id>.pprof. A failure
// returns the checkpoints measured before it.
func Million(ctx context.Context, cfg Config, o MillionOptions, out string) (run MillionRun, err error) {
	run.Opts = o
	if err := o.check(); err != nil {
		return run, err
	}
	start := time.Now()
	defer func() { run.TotalS = time.Since(start).Seconds() }()
	dir := filepath.Join(cfg.WorkDir, "million")
	cl, r, err := startRegionSpec(ctx, cfg, dir, devcluster.RegionSpec{Coordinators: o.Coordinators, ExtraArgs: o.regionArgs()}, nil)
	if err != nil {
		return run, err
	}
	defer cl.Stop()
	// The region is thrown away: SIGKILL rather than graceful stops (the
	// last members wait for a quorum that has gone). Deferred first, so it
	// runs after the fleet has stopped.
	defer func() {
		for _, p := range r.Coords {
			_ = p.Kill()
		}
	}()
	m := &millionRegion{cfg: cfg, o: o, out: out, r: r}
	extra := make([][]string, len(r.Coords))
	for i, p := range r.Coords {
		port, err := devcluster.FreePort()
		if err != nil {
			return run, err
		}
		m.ids = append(m.ids, p.Name)
		m.metrics = append(m.metrics, fmt.Sprintf("127.0.0.1:%d", port))
		extra[i] = []string{"--metrics-addr", m.metrics[i]}
	}
	if err := restartWith(ctx, r, extra); err != nil {
		return run, err
	}
	for _, p := range r.Coords {
		m.pids = append(m.pids, p.Pid())
	}
	if m.cli, err = etcdClient(r.EtcdEndpoints); err != nil {
		return run, err
	}
	defer m.cli.Close()
	conn, err := r.Dial()
	if err != nil {
		return run, err
	}
	defer conn.Close()
	if run.Shards, err = shardCount(ctx, apiaryv1.NewAdminServiceClient(conn)); err != nil {
		return run, err
	}
	if _, err := waitSettled(ctx, m.cli, run.Shards, o.Coordinators, 60*time.Second); err != nil {
		return run, err
	}
	for _, a := range m.metrics {
		if err := metricsUp(a); err != nil {
			return run, err
		}
	}

	// The fleet runs until the end; its agents stop (drain, deregister)
	// before the region is killed.
	fctx, fcancel := context.WithCancel(ctx)
	fleetDone := make(chan error, 1)
	lastLog := time.Now()
	go func() {
		s, err := loadtest.RunFleet(fctx, loadtest.FleetOptions{Agents: o.Agents, Addrs: r.APIAddrs, NodePrefix: "sim",
			CPUMillis: int64(o.Slots) * 100, MemoryMB: int64(o.Slots) * 16, MaxTasks: o.Slots,
			DataDir: filepath.Join(dir, "fleet"), Every: 250 * time.Millisecond,
			Progress: func(s loadtest.FleetSample) {
				m.fleet.Store(&s)
				if time.Since(lastLog) > 30*time.Second || s.Final {
					lastLog = time.Now()
					cfg.logf("million fleet: %s", s)
				}
			}})
		run.Fleet = s
		fleetDone <- err
	}()
	defer func() {
		fcancel()
		if err := <-fleetDone; err != nil && ctx.Err() == nil {
			cfg.logf("million fleet: %v", err)
		}
		m.profWG.Wait()
	}()
	if err := waitFor(ctx, 2*time.Minute, fmt.Sprintf("%d simulated agents registered", o.Agents), func() (bool, error) {
		s := m.fleet.Load()
		if s == nil {
			return false, errors.New("no sample yet")
		}
		return s.Registered == o.Agents, fmt.Errorf("%d registered", s.Registered)
	}); err != nil {
		return run, err
	}
	if m.conns, err = dialProbed(ctx, o.ProbeClients, r.Dial); err != nil {
		return run, err
	}
	defer closeAll(m.conns)

	for i, size := range o.Sizes {
		cp, err := m.checkpoint(ctx, size, run.Shards, i == len(o.Sizes)-1)
		if err == nil || cp.FailErr != "" { // measured (a failed failover is noted in it)
			run.Checkpoints = append(run.Checkpoints, cp)
		}
		if err != nil {
			return run, fmt.Errorf("checkpoint %d: %w", size, err)
		}
	}
	return run, nil
}

// ended is the fleet's attempts ended so far.
func (m *millionRegion) ended() int64 {
	if s := m.fleet.Load(); s != nil {
		return s.AttemptsEnded
	}
	return 0
}

// checkpoint fills the region to size task records, waits until every task
// has finished, and measures (MillionCheckpoint); top adds the failover.
func (m *millionRegion) checkpoint(ctx context.Context, size, shardCount int, top bool) (MillionCheckpoint, error) {
	cp := MillionCheckpoint{Target: size}
	o := m.o
	if err := m.fill(ctx, &cp); err != nil {
		return cp, err
	}
	var err error
	if cp.Records, err = millionCount(ctx, m.cli, prefTasks); err != nil {
		return cp, err
	}
	if cp.Results, err = millionCount(ctx, m.cli, prefResults); err != nil {
		return cp, err
	}
	host0 := readHostCPU()
	if s := m.fleet.Load(); s != nil {
		cp.Registrations = s.Registrations
	}
	for i, pid := range m.pids {
		mem, err := millionMem(pid)
		if err != nil {
			return cp, err
		}
		mem.ID = m.ids[i]
		fams, err := millionScrape(m.metrics[i])
		if err != nil {
			return cp, err
		}
		for _, mt := range fams["go_memstats_heap_inuse_bytes"].GetMetric() {
			mem.HeapInuse = float64(mt.GetGauge().GetValue()) / (1 << 20)
		}
		cp.Mem = append(cp.Mem, mem)
	}
	for _, ep := range m.r.EtcdEndpoints {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		st, err := m.cli.Status(sctx, ep)
		cancel()
		if err != nil {
			return cp, fmt.Errorf("etcd status %s: %w", ep, err)
		}
		cp.DBSize, cp.DBInUse = max(cp.DBSize, toMiB(st.DbSize)), max(cp.DBInUse, toMiB(st.DbSizeInUse))
	}

	// Floor: serial single puts under prefFloor, deleted after.
	if cp.FloorSamples, err = millionFloorPuts(ctx, m.cli, fmt.Sprintf("million-%d", size), o.FloorPuts); err != nil {
		return cp, err
	}
	fs := Summarize(cp.FloorSamples)
	cp.FloorP50, cp.FloorP99 = fs.P50, fs.P99

	// Probe: closed-loop single-task submissions; the coordinators'
	// histograms read before and after.
	before, err := m.scrapeHists()
	if err != nil {
		return cp, err
	}
	var mu sync.Mutex
	t0 := time.Now()
	end := t0.Add(o.ProbeDuration)
	lat, ok, bad, codes := closedLoop(ctx, m.conns, o.ProbeClients, trueJob("probe", 1), "bench-million-probe",
		func(c, n int) string { return fmt.Sprintf("s%d-c%d-%d", size, c, n) }, t0, end,
		func(_ *apiaryv1.SubmitJobResponse, err error, sent, done time.Time) {
			if done.After(end) {
				return
			}
			code := "OK"
			if err != nil {
				code = grpcCode(err)
			}
			mu.Lock()
			cp.SubmitSamples = append(cp.SubmitSamples, MillionSample{SentMs: ms(sent.Sub(t0)), Ms: ms(done.Sub(sent)), Code: code})
			mu.Unlock()
		})
	after, err := m.scrapeHists()
	if err != nil {
		return cp, err
	}
	cp.SubmitOK, cp.SubmitErrors, cp.SubmitCodes = ok, bad, FormatCounts(codes)
	q := func(p float64) float64 { return float64(lat.ValueAtQuantile(p)) / 1000 }
	cp.SubmitP50, cp.SubmitP90, cp.SubmitP99, cp.SubmitMax = q(50), q(90), q(99), q(100)
	txn := after[0].minus(before[0])
	disp := after[1].minus(before[1])
	cp.TxnN, cp.TxnP50, cp.TxnP99 = txn.Count, 1000*txn.quantile(0.5), 1000*txn.quantile(0.99)
	cp.DispatchN, cp.DispatchP50, cp.DispatchP99 = disp.Count, 1000*disp.quantile(0.5), 1000*disp.quantile(0.99)
	for i, u := range txn.Upper {
		cp.TxnBuckets = append(cp.TxnBuckets, [2]float64{1000 * u, txn.Cum[i]})
	}
	cp.TxnBuckets = append(cp.TxnBuckets, [2]float64{math.Inf(1), txn.Count})

	// The probe's tasks finish; then the idle window.
	if err := m.quiesce(ctx); err != nil {
		return cp, err
	}
	if o.Profile {
		m.profile(fmt.Sprintf("idle-%d", size), o.Idle)
	}
	cpu0 := cpuSeconds(m.pids...)
	idle0 := time.Now()
	select {
	case <-ctx.Done():
		return cp, ctx.Err()
	case <-time.After(o.Idle): // a measurement window, not a wait for a condition
	}
	cp.IdleCPU = 100 * (cpuSeconds(m.pids...) - cpu0) / time.Since(idle0).Seconds()
	cp.ForeignCPU = foreignShare(host0, readHostCPU())

	// GetRegionInfo last: it waits for the job index to reach etcd's revision.
	ictx, cancel := context.WithTimeout(ctx, time.Minute)
	it := time.Now()
	info, err := apiaryv1.NewAdminServiceClient(m.conns[0]).GetRegionInfo(ictx, &apiaryv1.GetRegionInfoRequest{})
	cp.InfoMs = ms(time.Since(it))
	cancel()
	if err != nil {
		cp.InfoErr = grpcCode(err)
	} else {
		cp.InfoSize, cp.InfoInUse = toMiB(info.GetStateSizeBytes()), toMiB(info.GetStateInUseBytes())
	}
	m.cfg.logf("million %d: %d task records, %d results; fill %d tasks in %.1f s (%.0f tasks/s, coordinator cpu %.0f µs/task); submit n=%d errors %d p50 %.1f p99 %.1f ms; "+
		"etcd Txn n=%.0f p50 %.1f p99 %.1f ms; submit->dispatch p50 %.0f p99 %.0f ms; floor put p50 %.2f p99 %.2f ms; rss %s; db %.0f MiB (in use %.0f); idle coordinator cpu %.0f%%; "+
		"GetRegionInfo %.0f ms %s; registrations %d; other processes' CPU share %.2f",
		size, cp.Records, cp.Results, cp.FillTasks, cp.FillS, ratio(float64(cp.FillTasks), cp.FillS), 1e6*ratio(cp.FillCoordCPU, float64(cp.FillTasks)),
		cp.SubmitOK, cp.SubmitErrors, cp.SubmitP50, cp.SubmitP99, cp.TxnN, cp.TxnP50, cp.TxnP99, cp.DispatchP50, cp.DispatchP99, cp.FloorP50, cp.FloorP99,
		millionMemString(cp.Mem), cp.DBSize, cp.DBInUse, cp.IdleCPU, cp.InfoMs, cp.InfoErr, cp.Registrations, cp.ForeignCPU)

	if top {
		var f MillionFailover
		for try := 0; try < 3; try++ {
			f, err = m.failover(ctx, shardCount)
			if !errors.Is(err, errUnsettled) {
				break
			}
			m.cfg.logf("million failover: %v; again", err)
		}
		if err != nil {
			cp.FailErr = err.Error()
			return cp, fmt.Errorf("failover: %w", err)
		}
		cp.Failover = &f
		m.cfg.logf("million failover at %d records: killed %s (%d shards): owner keys gone @%.0f ms, first dispatch in its shards @%.0f ms; floor %.0f ms (etcd %.0f); submit errors %d",
			cp.Records, f.Victim, f.VictimShards, f.OwnerGoneMs, f.DispatchMs, f.FloorMs, f.FloorEtcdMs, f.SubmitErrors)
	}
	return cp, nil
}

// fill submits jobs of o.TasksPerJob tasks until the region holds
// cp.Target task records, at most o.Concurrency submissions in flight and
// o.MaxBacklog tasks unfinished, then waits until every task has finished.
func (m *millionRegion) fill(ctx context.Context, cp *MillionCheckpoint) error {
	o := m.o
	have, err := millionCount(ctx, m.cli, prefTasks)
	if err != nil {
		return err
	}
	need := cp.Target - int(have)
	if need <= 0 {
		return nil
	}
	cp.FillTasks = need
	start, cpu0, ended0 := time.Now(), cpuSeconds(m.pids...), m.ended()
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var firstErr error
	var mu sync.Mutex
	sem := make(chan struct{}, o.Concurrency)
	submitted, profiled := 0, false
	lastEnded, lastProgress := ended0, time.Now()
	for submitted < need && fctx.Err() == nil {
		n := min(need-submitted, int(o.TasksPerJob))
		// Bounded backlog: wait until the fleet has finished enough.
		for fctx.Err() == nil {
			e := m.ended()
			if int64(submitted)-(e-ended0) <= int64(o.MaxBacklog-n) {
				break
			}
			if e != lastEnded {
				lastEnded, lastProgress = e, time.Now()
			} else if time.Since(lastProgress) > o.StallTimeout {
				cancel()
				return fmt.Errorf("fill to %d: no task finished for %s (%d of %d submitted, %d attempts ended)", cp.Target, o.StallTimeout, submitted, need, e-ended0)
			}
			select {
			case <-fctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
		if o.Profile && !profiled && submitted >= need/2 {
			profiled = true
			m.profile(fmt.Sprintf("fill-%d", cp.Target), o.Idle)
		}
		select {
		case sem <- struct{}{}:
		case <-fctx.Done():
			continue
		}
		j := m.jobs
		m.jobs++
		submitted += n
		wg.Go(func() {
			defer func() { <-sem }()
			if err := m.submitFill(fctx, j, int32(n)); err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
				cancel()
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := m.quiesce(ctx); err != nil {
		return fmt.Errorf("fill to %d: %w", cp.Target, err)
	}
	cp.Jobs = m.jobs
	cp.FillS, cp.FillCoordCPU = time.Since(start).Seconds(), cpuSeconds(m.pids...)-cpu0
	return nil
}

// submitFill submits fill job j of n tasks, retrying an error (the same
// request id: a repeat is deduplicated) up to 10 times.
func (m *millionRegion) submitFill(ctx context.Context, j int, n int32) error {
	js := apiaryv1.NewJobServiceClient(m.conns[j%len(m.conns)])
	req := &apiaryv1.SubmitJobRequest{Spec: trueJob(fmt.Sprintf("fill-%d", j), n), ClientId: "bench-million", RequestId: fmt.Sprintf("fill-%d", j)}
	var err error
	for try := 0; try < 10; try++ {
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		_, err = js.SubmitJob(sctx, req)
		cancel()
		if err == nil || ctx.Err() != nil {
			return err
		}
		m.cfg.logf("million fill job %d (%d tasks): %v; again", j, n, err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	return fmt.Errorf("fill job %d: %w", j, err)
}

// quiesce waits until every job has finished: no job is PENDING or
// RUNNING in a coordinator's job index (ListJobs answers from it once it
// has caught up with etcd's current revision), so every task record is
// terminal. It fails when the fleet finishes no attempt for
// o.StallTimeout.
func (m *millionRegion) quiesce(ctx context.Context) error {
	js := apiaryv1.NewJobServiceClient(m.conns[0])
	lastEnded, lastMove := m.ended(), time.Now()
	for {
		busy := 0
		for _, st := range []apiaryv1.JobState{apiaryv1.JobState_JOB_STATE_PENDING, apiaryv1.JobState_JOB_STATE_RUNNING} {
			lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			resp, err := js.ListJobs(lctx, &apiaryv1.ListJobsRequest{State: st, Limit: 1})
			cancel()
			if status.Code(err) == codes.Unavailable && ctx.Err() == nil {
				m.cfg.logf("million quiesce: list %s jobs: %v; again", st, err)
				busy++
				continue
			}
			if err != nil {
				return fmt.Errorf("list %s jobs: %w", st, err)
			}
			// A page may end early with no job and a token (a lagging
			// index's etcd read): more jobs are to be looked at.
			if len(resp.GetJobs()) > 0 || resp.GetNextPageToken() != "" {
				busy++
			}
		}
		if busy == 0 {
			return nil
		}
		if e := m.ended(); e != lastEnded {
			lastEnded, lastMove = e, time.Now()
		} else if time.Since(lastMove) > m.o.StallTimeout {
			return fmt.Errorf("jobs unfinished and no attempt ended for %s", m.o.StallTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// scrapeHists reads, summed over the coordinators, the etcd Txn histogram
// (result="ok") and the submission-to-dispatch histogram.
func (m *millionRegion) scrapeHists() ([2]promHist, error) {
	var out [2]promHist
	for _, a := range m.metrics {
		fams, err := millionScrape(a)
		if err != nil {
			return out, err
		}
		out[0] = out[0].plus(millionHist(fams, metricTxn, map[string]string{"result": "ok"}))
		out[1] = out[1].plus(millionHist(fams, metricToDispatch, nil))
	}
	return out, nil
}

// profile fetches every coordinator's CPU profile over d in the
// background, into m.out/million-cpu-<tag>-<id>.pprof.
func (m *millionRegion) profile(tag string, d time.Duration) {
	for i, a := range m.metrics {
		path := filepath.Join(m.out, fmt.Sprintf("million-cpu-%s-%s.pprof", tag, m.ids[i]))
		m.profWG.Go(func() {
			c := http.Client{Timeout: d + 30*time.Second}
			resp, err := c.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", a, max(1, int(d.Seconds()))))
			if err != nil {
				m.cfg.logf("million profile %s: %v", path, err)
				return
			}
			defer resp.Body.Close()
			f, err := os.Create(path)
			if err == nil {
				_, err = io.Copy(f, resp.Body)
				if cerr := f.Close(); err == nil {
					err = cerr
				}
			}
			if err != nil {
				m.cfg.logf("million profile %s: %v", path, err)
			}
		})
	}
}

// failover SIGKILLs a follower's host among the shard owners of the settled
// region under a trickle of single-task jobs and times, through the
// survivors' members, its owner keys' deletion and the first dispatch in
// its shards (the machinery of failoverTrial, without its GetRegionInfo
// calls, which range-read every task record).
func (m *millionRegion) failover(ctx context.Context, count int) (MillionFailover, error) {
	var res MillionFailover
	r := m.r
	view, err := waitSettled(ctx, m.cli, count, len(r.Coords), 60*time.Second)
	if err != nil {
		return res, err
	}
	leader, err := etcdLeaderName(ctx, r.EtcdEndpoints)
	if err != nil {
		return res, err
	}
	if res.Victim, err = pickVictim(view.Members, leader, 2); err != nil {
		return res, err
	}
	idx := coordIndex(r, res.Victim)
	if idx < 0 {
		return res, fmt.Errorf("member %q is not a coordinator of the region", res.Victim)
	}
	victimShards := map[int]bool{}
	for _, s := range view.PerMember[res.Victim] {
		victimShards[s] = true
	}
	res.VictimShards = len(victimShards)
	cli, err := etcdClient(without(r.EtcdEndpoints, idx))
	if err != nil {
		return res, err
	}
	defer cli.Close()
	if res.FloorEtcdMs, err = measureFloor(ctx, cli, 0); err != nil {
		return res, err
	}
	res.FloorMs = ms(millionSuspectAfter) + res.FloorEtcdMs
	again, err := waitSettled(ctx, cli, count, len(r.Coords), 5*time.Second)
	if err != nil {
		return res, err
	}
	if !slices.Equal(again.PerMember[res.Victim], view.PerMember[res.Victim]) {
		return res, fmt.Errorf("%w: %s's shards changed during the floor's timing", errUnsettled, res.Victim)
	}
	tr := &trickle{js: apiaryv1.NewJobServiceClient(m.conns[0]), every: 20 * time.Millisecond}
	tctx, tcancel := context.WithCancel(ctx)
	defer tcancel()
	go tr.run(tctx)
	layout := ownerLayout(count)
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	w := cli.Watch(wctx, shards.DefaultPrefix+"/", clientv3.WithRange(prefTasks[:len(prefTasks)-1]+"0"), clientv3.WithRev(again.Owners.Rev+1))
	killTimer := time.NewTimer(time.Second) // the trickle flows first
	defer killTimer.Stop()
	var tKill time.Time
	var timeoutC <-chan time.Time
	var goneRev, errs0 int64
	for res.DispatchMs == 0 {
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-killTimer.C:
			errs0 = tr.errors.Load()
			tKill = time.Now()
			if err := r.Coords[idx].Kill(); err != nil {
				return res, err
			}
			timeoutC = time.After(m.o.FailoverTimeout)
		case <-timeoutC:
			return res, fmt.Errorf("no dispatch in %s's shards within %s of the kill (owner keys gone at rev %d)", res.Victim, m.o.FailoverTimeout, goneRev)
		case wr, ok := <-w:
			if !ok || wr.Err() != nil {
				return res, fmt.Errorf("watch: %v", wr.Err())
			}
			now := time.Now()
			for _, ev := range wr.Events {
				k := string(ev.Kv.Key)
				if s, ok := layout.ShardOf(k); ok {
					if tKill.IsZero() {
						return res, fmt.Errorf("%w: shard %d's owner key %s at rev %d", errUnsettled, s, ev.Type, ev.Kv.ModRevision)
					}
					if victimShards[s] && ev.Type == clientv3.EventTypeDelete && goneRev == 0 {
						goneRev, res.OwnerGoneMs = ev.Kv.ModRevision, ms(now.Sub(tKill))
					}
					continue
				}
				s, ok := taskShard(k)
				if !ok || !victimShards[s] || ev.Type != clientv3.EventTypePut || goneRev == 0 || ev.Kv.ModRevision <= goneRev {
					continue
				}
				// After the owner keys' delete the victim's fenced writes
				// cannot commit: an ASSIGNED write is a survivor's.
				if t, ok := decodeTask(ev.Kv.Value); ok && t.State == apiaryv1.TaskState_TASK_STATE_ASSIGNED {
					res.DispatchMs = ms(now.Sub(tKill))
					break
				}
			}
		}
	}
	res.SubmitErrors = tr.errors.Load() - errs0
	return res, nil
}

// millionCount counts the keys under prefix (a count-only range read).
func millionCount(ctx context.Context, cli *clientv3.Client, prefix string) (int64, error) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := cli.Get(cctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, fmt.Errorf("count %s: %w", prefix, err)
	}
	return resp.Count, nil
}

// millionFloorPuts times n serial puts under prefFloor/<tag>/ (ms each) and
// deletes them.
func millionFloorPuts(ctx context.Context, cli *clientv3.Client, tag string, n int) ([]float64, error) {
	prefix := prefFloor + tag + "/"
	var xs []float64
	var err error
	for i := 0; i < n && err == nil; i++ {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		t0 := time.Now()
		_, err = cli.Put(cctx, prefix+strconv.Itoa(i), "x")
		xs = append(xs, ms(time.Since(t0)))
		cancel()
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, derr := cli.Delete(cctx, prefix, clientv3.WithPrefix())
	cancel()
	if err == nil {
		err = derr
	}
	if err != nil {
		return nil, fmt.Errorf("floor puts: %w", err)
	}
	return xs, nil
}

// millionMem reads VmRSS, RssAnon and RssFile (MiB) from
// /proc/<pid>/status.
func millionMem(pid int) (CoordMem, error) {
	var m CoordMem
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return m, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		kb, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "VmRSS:":
			m.VmRSS = kb / 1024
		case "RssAnon:":
			m.RssAnon = kb / 1024
		case "RssFile:":
			m.RssFile = kb / 1024
		}
	}
	return m, nil
}

func millionMemString(ms []CoordMem) string {
	var parts []string
	for _, m := range ms {
		parts = append(parts, fmt.Sprintf("%s:%.0f/%.0f/%.0f/%.0f", m.ID, m.VmRSS, m.RssAnon, m.RssFile, m.HeapInuse))
	}
	return strings.Join(parts, " ")
}

func toMiB(b int64) float64 { return float64(b) / (1 << 20) }

// millionScrape reads a /metrics page.
func millionScrape(addr string) (map[string]*dto.MetricFamily, error) {
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, fmt.Errorf("metrics %s: %w", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("metrics %s: %s", addr, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("metrics %s: %w", addr, err)
	}
	return fams, nil
}

// promHist is a Prometheus histogram: bucket upper bounds (seconds,
// ascending, +Inf left out), cumulative counts, total count and sum.
type promHist struct {
	Upper, Cum []float64
	Count, Sum float64
}

// millionHist sums the series of histogram name whose labels include labels.
func millionHist(fams map[string]*dto.MetricFamily, name string, labels map[string]string) promHist {
	var h promHist
	for _, mt := range fams[name].GetMetric() {
		match := 0
		for _, l := range mt.GetLabel() {
			if v, ok := labels[l.GetName()]; ok && v == l.GetValue() {
				match++
			}
		}
		if match != len(labels) || mt.GetHistogram() == nil {
			continue
		}
		var one promHist
		for _, b := range mt.GetHistogram().GetBucket() {
			if math.IsInf(b.GetUpperBound(), 1) {
				continue
			}
			one.Upper = append(one.Upper, b.GetUpperBound())
			one.Cum = append(one.Cum, float64(b.GetCumulativeCount()))
		}
		one.Count, one.Sum = float64(mt.GetHistogram().GetSampleCount()), mt.GetHistogram().GetSampleSum()
		h = h.plus(one)
	}
	return h
}

// plus adds two histograms of the same buckets (an empty one takes the
// other's).
func (h promHist) plus(o promHist) promHist {
	if len(h.Upper) == 0 && h.Count == 0 {
		return promHist{Upper: slices.Clone(o.Upper), Cum: slices.Clone(o.Cum), Count: o.Count, Sum: o.Sum}
	}
	out := promHist{Upper: slices.Clone(h.Upper), Cum: slices.Clone(h.Cum), Count: h.Count + o.Count, Sum: h.Sum + o.Sum}
	for i := range out.Cum {
		if i < len(o.Cum) {
			out.Cum[i] += o.Cum[i]
		}
	}
	return out
}

// minus is h - o: the observations between two scrapes.
func (h promHist) minus(o promHist) promHist {
	out := promHist{Upper: slices.Clone(h.Upper), Cum: slices.Clone(h.Cum), Count: h.Count - o.Count, Sum: h.Sum - o.Sum}
	for i := range out.Cum {
		if i < len(o.Cum) {
			out.Cum[i] -= o.Cum[i]
		}
	}
	return out
}

// quantile is the q-quantile (0..1) by linear interpolation inside the
// bucket that holds it, as Prometheus's histogram_quantile does (the first
// bucket's lower bound is 0; a rank in the +Inf bucket returns the largest
// finite bound); NaN with no observations.
func (h promHist) quantile(q float64) float64 {
	if h.Count <= 0 || len(h.Upper) == 0 {
		return math.NaN()
	}
	rank := q * h.Count
	for i, c := range h.Cum {
		if c >= rank {
			lower, prev := 0.0, 0.0
			if i > 0 {
				lower, prev = h.Upper[i-1], h.Cum[i-1]
			}
			if c == prev {
				return h.Upper[i]
			}
			return lower + (h.Upper[i]-lower)*(rank-prev)/(c-prev)
		}
	}
	return h.Upper[len(h.Upper)-1]
}

// RunMillion runs Million and writes its results (WriteMillion); the run's
// error is returned after what was measured has been written.
func RunMillion(ctx context.Context, cfg Config, o MillionOptions, out string) (string, error) {
	run, err := Million(ctx, cfg, o, out)
	if err != nil {
		cfg.logf("million: %v", err)
	}
	md, werr := WriteMillion(out, run, err)
	if err == nil {
		err = werr
	}
	return md, err
}

// WriteMillion writes million.csv (a row per checkpoint),
// million-submit.csv (every probe submission), million-floor.csv (every
// floor put), million-txn-buckets.csv (the Txn histogram deltas),
// million-mem.csv (each coordinator's memory) and million-failover.csv,
// the PNGs million-submit.png, million-commit.png, million-rss.png,
// million-db.png and million-idle-cpu.png to out, and returns the
// summary's markdown section; runErr, if set, is noted in it.
func WriteMillion(out string, run MillionRun, runErr error) (string, error) {
	o := run.Opts
	var rows, subs, floors, buckets, mems, fos [][]string
	g := func(x float64) string { return strconv.FormatFloat(x, 'g', 6, 64) }
	for _, c := range run.Checkpoints {
		t := strconv.Itoa(c.Target)
		var rssMax float64
		for _, m := range c.Mem {
			rssMax = max(rssMax, m.VmRSS)
			mems = append(mems, []string{t, strconv.FormatInt(c.Records, 10), m.ID, f1(m.VmRSS), f1(m.RssAnon), f1(m.RssFile), f1(m.HeapInuse)})
		}
		rows = append(rows, []string{t, strconv.FormatInt(c.Records, 10), strconv.FormatInt(c.Results, 10), strconv.Itoa(c.Jobs), strconv.Itoa(c.FillTasks),
			f1(c.FillS), f1(ratio(float64(c.FillTasks), c.FillS)), f1(c.FillCoordCPU), f1(1e6 * ratio(c.FillCoordCPU, float64(c.FillTasks))),
			strconv.FormatInt(c.SubmitOK, 10), strconv.FormatInt(c.SubmitErrors, 10), c.SubmitCodes,
			g(c.SubmitP50), g(c.SubmitP90), g(c.SubmitP99), g(c.SubmitMax),
			g(c.TxnN), g(c.TxnP50), g(c.TxnP99), g(c.DispatchN), g(c.DispatchP50), g(c.DispatchP99),
			g(c.FloorP50), g(c.FloorP99), g(ratio(c.SubmitP50, c.FloorP50)), g(ratio(c.SubmitP99, c.FloorP99)), g(ratio(c.TxnP99, c.FloorP99)),
			millionMemString(c.Mem), f1(rssMax), f1(c.DBSize), f1(c.DBInUse), f1(c.InfoSize), f1(c.InfoInUse), f1(c.InfoMs), c.InfoErr,
			f1(c.IdleCPU), strconv.FormatInt(c.Registrations, 10), strconv.FormatFloat(c.ForeignCPU, 'f', 3, 64)})
		for _, s := range c.SubmitSamples {
			subs = append(subs, []string{t, g(s.SentMs), g(s.Ms), s.Code})
		}
		for i, x := range c.FloorSamples {
			floors = append(floors, []string{t, strconv.Itoa(i), g(x)})
		}
		for _, b := range c.TxnBuckets {
			buckets = append(buckets, []string{t, g(b[0]), g(b[1])})
		}
		if f := c.Failover; f != nil {
			fos = append(fos, []string{t, strconv.FormatInt(c.Records, 10), f.Victim, strconv.Itoa(f.VictimShards), f1(f.OwnerGoneMs), f1(f.DispatchMs),
				f1(f.FloorEtcdMs), f1(f.FloorMs), strconv.FormatInt(f.SubmitErrors, 10)})
		}
	}
	for _, w := range []struct {
		name   string
		header []string
		rows   [][]string
	}{
		{"million.csv", []string{"target_records", "task_records", "result_records", "fill_jobs_total", "fill_tasks", "fill_s", "fill_tasks_per_s", "fill_coord_cpu_s", "fill_coord_cpu_us_per_task",
			"submit_ok", "submit_errors", "submit_error_codes", "submit_p50_ms", "submit_p90_ms", "submit_p99_ms", "submit_max_ms",
			"txn_n", "txn_p50_ms", "txn_p99_ms", "dispatch_n", "dispatch_p50_ms", "dispatch_p99_ms",
			"floor_put_p50_ms", "floor_put_p99_ms", "submit_p50_over_floor_p50", "submit_p99_over_floor_p99", "txn_p99_over_floor_p99",
			"coord_mem_vmrss_anon_file_heap_mib", "coord_vmrss_max_mib", "db_size_mib", "db_in_use_mib", "regioninfo_state_size_mib", "regioninfo_state_in_use_mib", "regioninfo_ms", "regioninfo_error",
			"idle_coord_cpu_pct_of_core", "fleet_registrations", "foreign_cpu_share"}, rows},
		{"million-submit.csv", []string{"target_records", "sent_ms_from_probe_start", "latency_ms", "code"}, subs},
		{"million-floor.csv", []string{"target_records", "put", "ms"}, floors},
		{"million-txn-buckets.csv", []string{"target_records", "le_ms", "cumulative_count"}, buckets},
		{"million-mem.csv", []string{"target_records", "task_records", "coordinator", "vmrss_mib", "rss_anon_mib", "rss_file_mib", "go_heap_inuse_mib"}, mems},
		{"million-failover.csv", []string{"target_records", "task_records", "victim", "victim_shards", "owner_gone_ms", "first_dispatch_ms", "floor_etcd_ms", "floor_ms", "submit_errors"}, fos},
	} {
		if err := WriteCSV(filepath.Join(out, w.name), w.header, w.rows); err != nil {
			return "", err
		}
	}

	cps := run.Checkpoints
	recs := func(c MillionCheckpoint) float64 { return float64(max(c.Records, 1)) }
	series := func(name string, f func(MillionCheckpoint) float64) plotSeries {
		s := plotSeries{Name: name}
		for _, c := range cps {
			if y := f(c); !math.IsNaN(y) {
				s.XY = append(s.XY, plotter.XY{X: recs(c), Y: y})
			}
		}
		return s
	}
	if len(cps) > 0 {
		plots := []struct {
			file, title, y string
			s              []plotSeries
			lines          []refLine
		}{
			{"million-submit.png", "SubmitJob latency (single-task jobs, closed loop) vs task records", "ms",
				[]plotSeries{series("submit p50", func(c MillionCheckpoint) float64 { return c.SubmitP50 }), series("submit p99", func(c MillionCheckpoint) float64 { return c.SubmitP99 }),
					series("floor: etcd put p50", func(c MillionCheckpoint) float64 { return c.FloorP50 }), series("floor: etcd put p99", func(c MillionCheckpoint) float64 { return c.FloorP99 })}, nil},
			{"million-commit.png", "coordinators' etcd Txn latency (apiary_etcd_txn_duration_seconds, ok) vs task records", "ms (bucket interpolation)",
				[]plotSeries{series("Txn p50", func(c MillionCheckpoint) float64 { return c.TxnP50 }), series("Txn p99", func(c MillionCheckpoint) float64 { return c.TxnP99 }),
					series("floor: etcd put p99", func(c MillionCheckpoint) float64 { return c.FloorP99 })},
				[]refLine{{"published: 220 ms at 150,000 tasks", millionPublishedMs}, {"goal: p99 < 50 ms", millionGoalP99Ms}}},
			{"million-rss.png", "coordinator memory (its etcd member included) vs task records", "MiB", millionMemSeries(cps), nil},
			{"million-db.png", "etcd backend size vs task records", "MiB",
				[]plotSeries{series("db size (largest member)", func(c MillionCheckpoint) float64 { return c.DBSize }), series("db in use", func(c MillionCheckpoint) float64 { return c.DBInUse })}, nil},
			{"million-idle-cpu.png", "coordinators' CPU with nothing submitted vs task records", "% of one core, all coordinators",
				[]plotSeries{series("idle CPU", func(c MillionCheckpoint) float64 { return c.IdleCPU })}, nil},
		}
		for _, p := range plots {
			if err := savePlotLogX(filepath.Join(out, p.file), p.title, "task records in etcd (log)", p.y, p.s, p.lines); err != nil {
				return "", err
			}
		}
	}

	var b strings.Builder
	top := 0
	if len(o.Sizes) > 0 {
		top = o.Sizes[len(o.Sizes)-1]
	}
	fmt.Fprintf(&b, "## million: control-plane latency, memory and state size as the task records grow\n\n")
	if runErr != nil {
		fmt.Fprintf(&b, "**The run failed: %v.** The checkpoints measured before the failure follow.\n\n", runErr)
	}
	fmt.Fprintf(&b, "A %d-member region (%d shards; coordinators with `%s` and each its own --metrics-addr; otherwise the defaults: etcd election 500 ms, heartbeat 50 ms, --suspect-after 300 ms, etcd quota 4 GiB and compaction retention 1h, node lease 2 s unless set) "+
		"filled through SubmitJob with jobs of %d tasks of /bin/true (the API accepts at most %d per job), at most %d submissions in flight and %d tasks unfinished, "+
		"run by %d simulated agents x %d slots in the harness's process (loadtest.RunFleet, noop executor: every attempt exits 0 at once), so that each task is dispatched, started, completed and its record kept. "+
		"Checkpoints at %s task records (top %s); at each, the fill paused and every task finished: each coordinator's memory (/proc/<pid>/status), the etcd backend size (maintenance Status, largest member), "+
		"the floor (%d serial etcd puts under %s, through a client on every member, deleted after), then %d closed-loop clients submitting single-task jobs for %s "+
		"(submit latency from the harness's clock; plan commit latency from the coordinators' /metrics: the delta over the probe window of apiary_etcd_txn_duration_seconds{result=\"ok\"}, summed over the coordinators, p50/p99 by linear interpolation inside its power-of-two buckets), "+
		"then %s with nothing submitted (the coordinators' CPU), then GetRegionInfo; at the top size a SIGKILL of a follower's host among the shard owners. One run (n = 1 per checkpoint; the probes' n below). "+
		"Run time %s.\n\n",
		o.Coordinators, run.Shards, strings.Join(o.regionArgs(), " "), o.TasksPerJob, jobspec.MaxTasks, o.Concurrency, o.MaxBacklog, o.Agents, o.Slots,
		millionSizesString(o.Sizes), thousands(float64(top)), o.FloorPuts, prefFloor, o.ProbeClients, o.ProbeDuration, o.Idle, time.Duration(run.TotalS*float64(time.Second)).Round(time.Second))
	b.WriteString("| task records | fill: tasks/s, coord CPU µs/task | submit n, p50 / p99 ms | etcd Txn n, p50 / p99 ms | submit→dispatch p50 / p99 ms | floor: etcd put p50 / p99 ms | submit p99 ÷ floor p99 | Txn p99 ÷ floor p99 | coordinator RSS MiB (anon, Go heap) | etcd DB MiB (in use) | idle coord CPU % of a core | GetRegionInfo ms |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range cps {
		var mem []string
		for _, m := range c.Mem {
			mem = append(mem, fmt.Sprintf("%.0f (%.0f, %.0f)", m.VmRSS, m.RssAnon, m.HeapInuse))
		}
		info := f1(c.InfoMs)
		if c.InfoErr != "" {
			info += " (" + c.InfoErr + ")"
		}
		fmt.Fprintf(&b, "| %s | %.0f, %.0f | %d, %.1f / %.1f | %.0f, %.1f / %.1f | %.0f / %.0f | %.2f / %.2f | %.1f | %.1f | %s | %.0f (%.0f) | %.0f | %s |\n",
			thousands(float64(c.Records)), ratio(float64(c.FillTasks), c.FillS), 1e6*ratio(c.FillCoordCPU, float64(c.FillTasks)),
			c.SubmitOK, c.SubmitP50, c.SubmitP99, c.TxnN, c.TxnP50, c.TxnP99, c.DispatchP50, c.DispatchP99, c.FloorP50, c.FloorP99,
			ratio(c.SubmitP99, c.FloorP99), ratio(c.TxnP99, c.FloorP99), strings.Join(mem, ", "), c.DBSize, c.DBInUse, c.IdleCPU, info)
	}
	if len(cps) > 0 {
		first, last := cps[0], cps[len(cps)-1]
		verdict := "met"
		for _, c := range cps {
			if !(c.TxnP99 < millionGoalP99Ms) {
				verdict = "not met"
			}
		}
		fmt.Fprintf(&b, "\nPlan commit latency (etcd Txn p99) against the goal p99 < %.0f ms at every size: %s; from %s to %s records it went %.1f -> %.1f ms (%.2fx; the floor's p99 %.2fx). "+
			"The published mark: %.0f ms at %s tasks in state; here, at %s records, Txn p50 %.1f ms / p99 %.1f ms (%.2fx / %.2fx of it). "+
			"Submit p99 went %.1f -> %.1f ms (%.2fx).\n",
			millionGoalP99Ms, verdict, thousands(float64(first.Records)), thousands(float64(last.Records)), first.TxnP99, last.TxnP99, ratio(last.TxnP99, first.TxnP99), ratio(last.FloorP99, first.FloorP99),
			millionPublishedMs, thousands(millionPublishedTasks), thousands(float64(last.Records)), last.TxnP50, last.TxnP99, ratio(last.TxnP50, millionPublishedMs), ratio(last.TxnP99, millionPublishedMs),
			first.SubmitP99, last.SubmitP99, ratio(last.SubmitP99, first.SubmitP99))
		if d := float64(last.Records - first.Records); d > 0 {
			heap := func(c MillionCheckpoint) float64 {
				return Summarize(millionCol(c.Mem, func(m CoordMem) float64 { return m.HeapInuse })).Mean
			}
			fmt.Fprintf(&b, "\nGrowth from %s to %s records, per added task record: etcd backend %+.2f KiB (it holds every revision written within the compaction retention); the coordinators' Go heap in use %+.2f KiB each (mean of the coordinators); GetRegionInfo %+.2f ms per 10,000 records.\n",
				thousands(float64(first.Records)), thousands(float64(last.Records)), 1024*(last.DBSize-first.DBSize)/d, 1024*(heap(last)-heap(first))/d, 1e4*(last.InfoMs-first.InfoMs)/d)
		}
		for _, c := range cps {
			if f := c.Failover; f != nil {
				fmt.Fprintf(&b, "\nFailover at %s records: SIGKILL of %s (a follower's host, %d shards), a single-task job every 20 ms: its owner keys deleted after %.0f ms, first dispatch (ASSIGNED) in its shards by a survivor after %.0f ms = %.2fx the floor (%.0f ms: --suspect-after 300 ms + a revoke and two puts through a survivor's member, %.0f ms); %d trickle submissions failed (retried). n = 1.\n",
					thousands(float64(c.Records)), f.Victim, f.VictimShards, f.OwnerGoneMs, f.DispatchMs, ratio(f.DispatchMs, f.FloorMs), f.FloorMs, f.FloorEtcdMs, f.SubmitErrors)
			} else if c.FailErr != "" {
				fmt.Fprintf(&b, "\nFailover at %s records failed: %s.\n", thousands(float64(c.Records)), c.FailErr)
			}
		}
		fmt.Fprintf(&b, "\nThe fleet: %d registrations for %d agents (more: node leases lapsed and agents registered again), %d attempts ended, %d refused. ", run.Fleet.Registrations, o.Agents, run.Fleet.AttemptsEnded, run.Fleet.Refused)
		fs := Summarize(millionCol(cps, func(c MillionCheckpoint) float64 { return 100 * c.ForeignCPU }))
		fmt.Fprintf(&b, "Processes outside the harness's tree used p50 %.1f%% / max %.1f%% of the CPUs during the checkpoints' measurements (foreign_cpu_share in million.csv).\n", fs.P50, fs.Max)
	}
	b.WriteString("\nFiles: million.csv (a row per checkpoint), million-submit.csv (every probe submission), million-floor.csv (every floor put), million-txn-buckets.csv (the summed Txn histogram delta of each probe window), million-mem.csv, million-failover.csv; " +
		"PNGs (log x): million-submit.png, million-commit.png (with the published mark and the goal), million-rss.png, million-db.png, million-idle-cpu.png")
	if o.Profile {
		b.WriteString("; each coordinator's CPU profile during each checkpoint's fill (from half of it, for the idle window's length) and its idle window: million-cpu-{fill,idle}-<size>-<id>.pprof (`go tool pprof -top FILE`)")
	}
	b.WriteString(".\n\n")
	b.WriteString("Caveats: the coordinators export no plan-only commit histogram: apiary_etcd_txn_duration_seconds times every attempt of the coordinator's txnRetry, so in the probe window it mixes the probes' submission group commits, the scheduler's fenced plan Txns and the agents' report Txns (all on the same etcd path); its buckets double (0.5 ms x 2^k), so an interpolated p99 can be off by up to the bucket's width. " +
		"2 shared vCPUs run the harness (with the 200 simulated agents and the load), 3 coordinators and their etcd members. Task records are /apiary/tasks/ keys; each finished task also has an attempt result (result_records). " +
		"Memory is the coordinator process with its embedded etcd member: RssFile is mostly etcd's mmap'd backend pages. GetRegionInfo counts PENDING tasks from the answering coordinator's job index (its watch cache), not from the task records; its latency is reported, and the backend size is read from etcd's Status directly. " +
		"The floor goes through a client on every member (a put sent to a follower is forwarded to the leader), as the coordinators' own Txns do.\n\n")
	return b.String(), nil
}

func millionCol[T any](xs []T, f func(T) float64) []float64 {
	var out []float64
	for _, x := range xs {
		out = append(out, f(x))
	}
	return out
}

func millionSizesString(xs []int) string {
	var s []string
	for _, x := range xs {
		s = append(s, thousands(float64(x)))
	}
	return strings.Join(s, ", ")
}

// millionMemSeries is each coordinator's VmRSS and Go heap in use against
// the records.
func millionMemSeries(cps []MillionCheckpoint) []plotSeries {
	var ids []string
	for _, c := range cps {
		for _, m := range c.Mem {
			if !slices.Contains(ids, m.ID) {
				ids = append(ids, m.ID)
			}
		}
	}
	var out []plotSeries
	for _, kind := range []string{"VmRSS", "Go heap in use"} {
		for _, id := range ids {
			s := plotSeries{Name: id + " " + kind}
			for _, c := range cps {
				for _, m := range c.Mem {
					if m.ID == id {
						y := m.VmRSS
						if kind != "VmRSS" {
							y = m.HeapInuse
						}
						s.XY = append(s.XY, plotter.XY{X: float64(max(c.Records, 1)), Y: y})
					}
				}
			}
			out = append(out, s)
		}
	}
	return out
}

// millionColors tell up to 8 series apart (plotColors has 4).
var millionColors = []color.RGBA{{B: 200, A: 255}, {R: 230, G: 120, A: 255}, {G: 150, A: 255}, {R: 140, B: 140, A: 255},
	{R: 200, A: 255}, {G: 140, B: 140, A: 255}, {R: 140, G: 90, B: 40, A: 255}, {R: 110, G: 110, B: 110, A: 255}}

// savePlotLogX draws each series as points joined by lines against a
// logarithmic x axis, each reference line dashed, and writes the PNG.
func savePlotLogX(path, title, xLabel, yLabel string, series []plotSeries, lines []refLine) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xLabel
	p.Y.Label.Text = yLabel
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	xMin, xMax, yMax := math.Inf(1), 0.0, 1.0
	for _, s := range series {
		for _, pt := range s.XY {
			xMin, xMax, yMax = min(xMin, pt.X), max(xMax, pt.X), max(yMax, pt.Y)
		}
	}
	if xMax == 0 {
		xMin, xMax = 1, 10
	}
	for _, l := range lines {
		yMax = max(yMax, l.Y)
	}
	p.X.Min, p.X.Max = xMin/2, xMax*2
	p.Y.Min, p.Y.Max = 0, yMax*(1.25+0.07*float64(len(series)+len(lines)))
	for i, s := range series {
		if len(s.XY) == 0 {
			continue
		}
		lp, sc, err := plotter.NewLinePoints(s.XY)
		if err != nil {
			return err
		}
		c := millionColors[i%len(millionColors)]
		lp.Color = c
		sc.GlyphStyle.Radius = vg.Points(3)
		sc.GlyphStyle.Color = c
		sc.GlyphStyle.Shape = []draw.GlyphDrawer{draw.CircleGlyph{}, draw.TriangleGlyph{}, draw.SquareGlyph{}, draw.CrossGlyph{}}[i%4]
		p.Add(lp, sc)
		p.Legend.Add(s.Name, lp, sc)
	}
	for i, l := range lines {
		ln, err := plotter.NewLine(plotter.XYs{{X: p.X.Min, Y: l.Y}, {X: p.X.Max, Y: l.Y}})
		if err != nil {
			return err
		}
		ln.Color = []color.RGBA{{R: 200, A: 255}, {R: 120, G: 120, B: 120, A: 255}, {G: 120, B: 200, A: 255}}[i%3]
		ln.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(ln)
		p.Legend.Add(l.Name, ln)
	}
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	return p.Save(8*vg.Inch, 4.5*vg.Inch, path)
}
