package bench

// End-to-end control-plane throughput (issue 16): a 3-member region, a
// simulated fleet in this process (loadtest.RunFleet, noop executor),
// closed-loop SubmitJob clients that keep a bounded backlog, and tasks
// counted COMPLETE from the outside by an etcd watch; then, on the same
// region once idle, etcd's batched-write ceiling, so that the result is a
// ratio to what the region's etcd can commit at all.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	clientv3 "go.etcd.io/etcd/client/v3"
	"gonum.org/v1/plot/plotter"

	"apiary.dev/apiary/agent"
	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/loadtest"
)

// prefCeiling is the scratch prefix of the write ceiling's keys: outside
// the region's keyspace (no coordinator reads it), deleted after each run.
const prefCeiling = "/apiary-bench/ceiling/"

// ThroughputOptions configures the throughput benchmark.
type ThroughputOptions struct {
	// Coordinators is the region's size (each with an embedded etcd
	// member).
	Coordinators int
	// Agents simulated agents (loadtest.RunFleet in this process), each
	// with Slots slots (--max-tasks) and room for Slots tasks of 100 m /
	// 16 MiB (Slots x 100 millicores, Slots x 16 MiB).
	Agents, Slots int
	// AgentStartRate is how many agents start per second (RunFleet's
	// StartRate).
	AgentStartRate float64
	// TaskDuration is each attempt's length on the noop executor (0: it
	// exits 0 at once).
	TaskDuration time.Duration
	// TasksPerJob is the tasks of each submitted job (one group of
	// 100 m / 16 MiB tasks).
	TasksPerJob int32
	// Submitters closed-loop SubmitJob goroutines share Conns gRPC
	// connections (each round-robins over the coordinators).
	Submitters, Conns int
	// MaxBacklog bounds the tasks submitted and not yet seen finished by
	// the watch: a submitter waits while one more job would pass it, so
	// the region holds a backlog without growing without bound.
	MaxBacklog int
	// Warmup (load on, not measured), then Duration measured, in Interval
	// steps (the time series).
	Warmup, Duration, Interval time.Duration
	// The write ceiling: CeilingWorkers goroutines each committing Txns of
	// CeilingBatch puts of CeilingValueBytes bytes for CeilingDuration.
	CeilingWorkers, CeilingBatch, CeilingValueBytes int
	CeilingDuration                                 time.Duration
	// LAN keeps devcluster's serf LAN pool of the coordinators (the
	// simulated agents never join it); false starts the region with NoLAN.
	LAN bool
	// RegisterTimeout bounds the wait for every agent's alive key.
	RegisterTimeout time.Duration
	// ExtraArgs go to every coordinator.
	ExtraArgs []string
	// Runs, each on a fresh region.
	Runs int
}

// DefaultThroughput is issue 16's configuration. The 10 s node lease
// (default 2 s) keeps 1,000 agents sharing 2 cores with the region from
// losing their leases under load; lost leases are reported (AliveDeleted).
var DefaultThroughput = ThroughputOptions{Coordinators: 3, Agents: 1000, Slots: 32, AgentStartRate: loadtest.DefaultFleetStartRate,
	TaskDuration: 0, LAN: true, TasksPerJob: 100, Submitters: 16, Conns: 4, MaxBacklog: 20000,
	Warmup: 10 * time.Second, Duration: 60 * time.Second, Interval: 5 * time.Second,
	CeilingWorkers: 16, CeilingBatch: 100, CeilingValueBytes: 300, CeilingDuration: 10 * time.Second,
	RegisterTimeout: 180 * time.Second, ExtraArgs: []string{"--node-lease-ttl", "10s"}, Runs: 3}

// Goals of issue 16, and Nomad's C1M figure for scale.
const (
	ThroughputGoalTasksPerS = 5000
	ThroughputGoalRatio     = 0.60
	NomadC1MPlacementsPerS  = 3750
)

// throughputParts are the keyspace parts whose writes are counted apart
// (the first segment after /apiary/); "other" is every other one.
var throughputParts = []string{"tasks", "assign", "results", "nodes", "jobs", "dedup", "shards", "other"}

// partShards is the index of "shards" (owner keys: a write is a shard
// changing owner) in throughputParts.
const partShards = 6

// ThroughputResult is every run of one configuration.
type ThroughputResult struct {
	Options ThroughputOptions
	Runs    []ThroughputRun
}

// ThroughputRun is one run. Window quantities are over the etcd revisions
// (StartRev, EndRev], read at the window's ends by the harness (a Get), so
// the watch's own delay does not move events between intervals.
type ThroughputRun struct {
	Run int
	// Err is why the run failed ("" when it did not).
	Err string
	// WindowS is the window's length (s, harness clock between the Gets).
	WindowS          float64
	StartRev, EndRev int64
	// Completed tasks went from a non-terminal state, whose creation the
	// watch saw, to COMPLETE in the window; Failed to FAILED or CANCELLED;
	// Retried completed with attempt > 1.
	Completed, Failed, Retried int
	// Events are the watch events (puts and deletes) under /apiary/ in the
	// window; EventsBy the same per throughputParts entry.
	Events   int64
	EventsBy map[string]int64
	// TasksPerS is Completed / WindowS; WritesPerTask is Events / Completed.
	TasksPerS, WritesPerTask float64
	Intervals                []ThroughputInterval
	// Submissions sent in the window and answered by its end.
	SubmitOK, SubmitErrors int64
	SubmitCodes            map[string]int64
	// SubmitP50Ms, SubmitP99Ms, SubmitMaxMs: their latency.
	SubmitP50Ms, SubmitP99Ms, SubmitMaxMs float64
	// SubmittedTasks were accepted by answers received in the window.
	SubmittedTasks int64
	// BlockedShare is the share of the submitters' time in the window spent
	// waiting at MaxBacklog (0: never at the bound).
	BlockedShare float64
	// PendingMin is the fewest PENDING tasks after any revision of the
	// window, PendingMedian the median of the intervals' end values: the
	// backlog the scheduler had (watch view).
	PendingMin, PendingMedian int
	// InFlightMedian is the median over the intervals' ends of the tasks
	// placed and not yet finished (ASSIGNED or RUNNING).
	InFlightMedian int
	// LiveStart and LiveEnd are the tasks submitted and not yet finished
	// (pending and in flight) at the window's ends: writes per task assume
	// a steady backlog, so a large change biases them (tasks created in the
	// window and not finished in it).
	LiveStart, LiveEnd int
	// AliveDeleted counts node alive keys deleted in the window (a lease
	// lost or a node deregistered); Registrations the fleet's node epochs
	// over the whole run (Agents when no agent registered twice).
	AliveDeleted  int
	Registrations int64
	// CeilingKeysPerS is the write ceiling measured after the load, with
	// CeilingTxns committed and CeilingErrors failed; CeilingQuiet says the
	// region wrote nothing for a second before it.
	CeilingKeysPerS float64
	CeilingTxns     int64
	CeilingErrors   int64
	CeilingQuiet    bool
	// Ratio is TasksPerS x WritesPerTask / CeilingKeysPerS.
	Ratio float64
	// Coords are each coordinator's CPU seconds over the window and its
	// resident memory at the window's end (process with its etcd member).
	Coords []ProcUsage
	// HarnessCPU is this process's CPU seconds over the window (fleet,
	// submitters and watch: getrusage), HarnessRSSMiB its resident memory
	// at the end and HarnessPeakMiB its peak.
	HarnessCPU                    float64
	HarnessRSSMiB, HarnessPeakMiB int64
	// ForeignCPU is the share of the machine's CPUs used over the window by
	// processes outside the harness's tree.
	ForeignCPU float64
}

// ProcUsage is one process's CPU seconds over a window and its resident
// memory (MiB) at the end, with its peak (VmHWM).
type ProcUsage struct {
	ID              string
	CPU             float64
	RSSMiB, PeakMiB int64
}

// ThroughputInterval is one interval of the window, revisions (FromRev,
// ToRev].
type ThroughputInterval struct {
	Index int
	// FromS, ToS: seconds from the window's start (harness clock).
	FromS, ToS     float64
	FromRev, ToRev int64
	Completed      int
	Events         int64
	// TasksPerS is Completed / (ToS - FromS).
	TasksPerS float64
	// PendingMin over the interval's revisions and PendingEnd after its
	// last one (the previous value when it had none); InFlightEnd the tasks
	// then placed and not yet finished (ASSIGNED or RUNNING).
	PendingMin, PendingEnd, InFlightEnd int
	// ShardWrites are writes of shard owner keys (ownership moving).
	ShardWrites int64
	// SubmittedTasks were accepted by answers received in the interval
	// (nominal bounds: window start + Index x Interval).
	SubmittedTasks int64
}

// revRow is what the watch saw at one revision.
type revRow struct {
	rev                       int64
	by                        [8]int32 // events per throughputParts entry
	complete, failed, retried int32
	aliveDel                  int32
	pending                   int32 // PENDING tasks after this revision
	live                      int32 // tasks not yet terminal after it
}

func (r revRow) events() int64 {
	var n int64
	for _, c := range r.by {
		n += int64(c)
	}
	return n
}

// revBound is a window or interval bound: a revision read at a moment.
type revBound struct {
	at  time.Duration // from the window's start
	rev int64
}

// bucketRows folds rows (in revision order) into the intervals between
// consecutive bounds: rows with bounds[i].rev < rev <= bounds[i+1].rev go
// to interval i; an interval without rows keeps the pending and live
// counts of the last row before it (0 before the first). Rows outside
// every interval are ignored.
func bucketRows(rows []revRow, bounds []revBound) []ThroughputInterval {
	var out []ThroughputInterval
	pending, live := 0, 0
	j := 0
	for j < len(rows) && len(bounds) > 0 && rows[j].rev <= bounds[0].rev {
		pending, live = int(rows[j].pending), int(rows[j].live)
		j++
	}
	for i := 0; i+1 < len(bounds); i++ {
		iv := ThroughputInterval{Index: i, FromS: bounds[i].at.Seconds(), ToS: bounds[i+1].at.Seconds(),
			FromRev: bounds[i].rev, ToRev: bounds[i+1].rev, PendingMin: pending}
		for ; j < len(rows) && rows[j].rev <= bounds[i+1].rev; j++ {
			r := rows[j]
			iv.Completed += int(r.complete)
			iv.Events += r.events()
			iv.ShardWrites += int64(r.by[partShards])
			pending, live = int(r.pending), int(r.live)
			iv.PendingMin = min(iv.PendingMin, pending)
		}
		iv.PendingEnd, iv.InFlightEnd = pending, live-pending
		if d := iv.ToS - iv.FromS; d > 0 {
			iv.TasksPerS = float64(iv.Completed) / d
		}
		out = append(out, iv)
	}
	return out
}

// throughputRatio is tasks/s x writes per task over the ceiling (keys/s):
// the share of etcd's batched-write ceiling the workload used (0 without a
// ceiling).
func throughputRatio(tasksPerS, writesPerTask, ceiling float64) float64 {
	if ceiling <= 0 {
		return 0
	}
	return tasksPerS * writesPerTask / ceiling
}

// CeilingTasksPerS is the tasks/s the run's write ceiling would carry at
// its writes per task (0 when either is unknown).
func (r ThroughputRun) CeilingTasksPerS() float64 { return ratio(r.CeilingKeysPerS, r.WritesPerTask) }

// Throughput runs o.Runs runs, each on a fresh region. A failed run is
// logged and kept with Err set; the first error is returned after the
// others ran.
func Throughput(ctx context.Context, cfg Config, o ThroughputOptions) (ThroughputResult, error) {
	res := ThroughputResult{Options: o}
	var firstErr error
	for i := 1; i <= o.Runs && ctx.Err() == nil; i++ {
		r, err := throughputRun(ctx, cfg, o, i)
		r.Run = i
		if err != nil {
			r.Err = err.Error()
			cfg.logf("throughput run %d: %v", i, err)
			if firstErr == nil {
				firstErr = fmt.Errorf("run %d: %w", i, err)
			}
		} else {
			cfg.logf("throughput run %d: %d tasks COMPLETE in %.1f s = %.0f tasks/s; %.2f writes/task; ceiling %.0f keys/s; ratio %.3f; submit p50 %.1f p99 %.1f ms; pending min %d; blocked %.2f",
				i, r.Completed, r.WindowS, r.TasksPerS, r.WritesPerTask, r.CeilingKeysPerS, r.Ratio, r.SubmitP50Ms, r.SubmitP99Ms, r.PendingMin, r.BlockedShare)
		}
		res.Runs = append(res.Runs, r)
	}
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	return res, firstErr
}

// throughputWatch follows the region's keyspace: task states, the backlog
// and every write, one revRow per revision.
type throughputWatch struct {
	finished atomic.Int64 // tasks seen COMPLETE, FAILED or CANCELLED
	lastRev  atomic.Int64 // the highest revision the watch has passed
	lastAt   atomic.Int64 // UnixNano of the last event

	mu   sync.Mutex
	rows []revRow
	err  error

	// Owned by run.
	state   map[string]apiaryv1.TaskState // tasks not yet terminal
	pending int32
}

// tpPartOf is the index in throughputParts of a key's keyspace part.
func tpPartOf(key string) int {
	rest, ok := strings.CutPrefix(key, "/apiary/")
	if !ok {
		return len(throughputParts) - 1
	}
	seg, _, _ := strings.Cut(rest, "/")
	if i := slices.Index(throughputParts[:len(throughputParts)-1], seg); i >= 0 {
		return i
	}
	return len(throughputParts) - 1
}

// tpTerminal says a task state is final.
func tpTerminal(s apiaryv1.TaskState) bool {
	return s == apiaryv1.TaskState_TASK_STATE_COMPLETE || s == apiaryv1.TaskState_TASK_STATE_FAILED || s == apiaryv1.TaskState_TASK_STATE_CANCELLED
}

// run consumes wc until it ends or fails.
func (w *throughputWatch) run(wc clientv3.WatchChan) {
	w.state = map[string]apiaryv1.TaskState{}
	for wr := range wc {
		if err := wr.Err(); err != nil {
			w.mu.Lock()
			w.err = err
			w.mu.Unlock()
			return
		}
		if wr.IsProgressNotify() {
			w.lastRev.Store(max(w.lastRev.Load(), wr.Header.Revision))
			continue
		}
		var batch []revRow
		for _, ev := range wr.Events {
			rev := ev.Kv.ModRevision
			if len(batch) == 0 || batch[len(batch)-1].rev != rev {
				batch = append(batch, revRow{rev: rev})
			}
			row := &batch[len(batch)-1]
			key := string(ev.Kv.Key)
			p := tpPartOf(key)
			row.by[p]++
			switch {
			case p == 0: // a task record
				w.task(row, key, ev)
			case p == 3 && ev.Type == clientv3.EventTypeDelete && strings.HasSuffix(key, "/alive"):
				row.aliveDel++
			}
			row.pending, row.live = w.pending, int32(len(w.state))
		}
		w.mu.Lock()
		w.rows = append(w.rows, batch...)
		w.mu.Unlock()
		if len(wr.Events) > 0 {
			w.lastAt.Store(time.Now().UnixNano())
			w.lastRev.Store(wr.Events[len(wr.Events)-1].Kv.ModRevision)
		}
	}
	w.mu.Lock()
	if w.err == nil {
		w.err = errors.New("watch closed")
	}
	w.mu.Unlock()
}

// task applies one task record event.
func (w *throughputWatch) task(row *revRow, key string, ev *clientv3.Event) {
	prev, known := w.state[key]
	if ev.Type == clientv3.EventTypeDelete {
		if known {
			if prev == apiaryv1.TaskState_TASK_STATE_PENDING {
				w.pending--
			}
			delete(w.state, key)
		}
		return
	}
	t, ok := decodeTask(ev.Kv.Value)
	if !ok || (!known && !ev.IsCreate()) {
		return // a task created before the watch, or rewritten once terminal
	}
	if known && prev == apiaryv1.TaskState_TASK_STATE_PENDING {
		w.pending--
	}
	if tpTerminal(t.State) {
		delete(w.state, key)
		w.finished.Add(1)
		switch t.State {
		case apiaryv1.TaskState_TASK_STATE_COMPLETE:
			row.complete++
			if t.Attempt > 1 {
				row.retried++
			}
		default:
			row.failed++
		}
		return
	}
	w.state[key] = t.State
	if t.State == apiaryv1.TaskState_TASK_STATE_PENDING {
		w.pending++
	}
}

func (w *throughputWatch) snapshot() ([]revRow, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.rows), w.err
}

// throughputRun is one run on a fresh region.
func throughputRun(ctx context.Context, cfg Config, o ThroughputOptions, run int) (ThroughputRun, error) {
	res := ThroughputRun{Run: run}
	dir := filepath.Join(cfg.WorkDir, fmt.Sprintf("throughput-%d", run))
	cl, r, err := startRegionSpec(ctx, cfg, dir, devcluster.RegionSpec{Coordinators: o.Coordinators, ExtraArgs: o.ExtraArgs, NoLAN: !o.LAN}, nil)
	if err != nil {
		return res, err
	}
	defer cl.Stop()
	// The region is thrown away: SIGKILL rather than wait for graceful
	// stops (the last members wait for a quorum that has gone).
	defer func() {
		for _, p := range r.Coords {
			_ = p.Kill()
		}
	}()
	conn, err := r.Dial()
	if err != nil {
		return res, err
	}
	defer conn.Close()
	cli, err := etcdClient(r.EtcdEndpoints)
	if err != nil {
		return res, err
	}
	defer cli.Close()
	count, err := shardCount(ctx, apiaryv1.NewAdminServiceClient(conn))
	if err != nil {
		return res, err
	}
	if _, err := waitSettled(ctx, cli, count, o.Coordinators, 60*time.Second); err != nil {
		return res, err
	}

	// The fleet, until fleetStop. Each agent starts at the coordinator its
	// node id hashes to (agent.Config.CoordinatorAddrs), so every
	// coordinator holds the streams of about 1/Coordinators of them.
	fleetCtx, fleetStop := context.WithCancel(ctx)
	defer fleetStop()
	var final loadtest.FleetSample
	var ferr error
	fleetDone := make(chan struct{})
	fleetExited := make(chan struct{})
	fo := loadtest.FleetOptions{Agents: o.Agents, Addrs: r.APIAddrs, NodePrefix: "tp",
		CPUMillis: int64(o.Slots) * 100, MemoryMB: int64(o.Slots) * 16, MaxTasks: o.Slots, Executor: agent.NoopExecutor(o.TaskDuration),
		StartRate: o.AgentStartRate, DataDir: filepath.Join(dir, "fleet"),
		Progress: func(s loadtest.FleetSample) {
			cfg.logf("throughput run %d fleet: %s", run, s)
		}}
	go func() {
		defer close(fleetDone)
		final, ferr = loadtest.RunFleet(fleetCtx, fo)
		close(fleetExited)
	}()
	fleetStopped := false
	stopFleet := func() (regs int64, err error) {
		if fleetStopped {
			return 0, nil
		}
		fleetStopped = true
		fleetStop()
		<-fleetDone
		return final.Registrations, ferr
	}
	defer func() { _, _ = stopFleet() }()
	t0 := time.Now()
	if err := tpWaitAlive(ctx, cli, o.Agents, o.RegisterTimeout, fleetExited); err != nil {
		return res, err
	}
	cfg.logf("throughput run %d: %d agents alive after %.1f s", run, o.Agents, time.Since(t0).Seconds())

	conns, err := dialProbed(ctx, o.Conns, r.Dial)
	if err != nil {
		return res, err
	}
	defer closeAll(conns)

	// The watch, from now on.
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	wc, err := watchRegion(clientv3.WithRequireLeader(wctx), cli)
	if err != nil {
		return res, err
	}
	w := &throughputWatch{}
	watchDone := make(chan struct{})
	go func() { defer close(watchDone); w.run(wc) }()
	defer func() { wcancel(); <-watchDone }()

	// Bounds: a Get at the window's start and every Interval to its end,
	// with the CPU readings at the two ends.
	n := int(math.Ceil(o.Duration.Seconds() / o.Interval.Seconds()))
	start := time.Now()
	from, end := start.Add(o.Warmup), start.Add(o.Warmup+o.Duration)
	var coordPids []int
	for _, p := range r.Coords {
		coordPids = append(coordPids, p.Pid())
	}
	type cpuAt struct {
		coords []float64
		self   float64
		host   hostCPU
	}
	readCPU := func() cpuAt {
		c := cpuAt{self: selfCPU().Seconds(), host: readHostCPU()}
		for _, pid := range coordPids {
			c.coords = append(c.coords, cpuSeconds(pid))
		}
		return c
	}
	var bounds []revBound
	var cpu0, cpu1 cpuAt
	boundsDone := make(chan error, 1)
	go func() {
		for i := 0; i <= n; i++ {
			at := from.Add(time.Duration(i) * o.Interval)
			if i == n {
				at = end
			}
			select {
			case <-ctx.Done():
				boundsDone <- ctx.Err()
				return
			case <-time.After(time.Until(at)):
			}
			if i == 0 {
				cpu0 = readCPU()
			}
			gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			g, err := cli.Get(gctx, "/apiary/meta")
			cancel()
			if err != nil {
				boundsDone <- fmt.Errorf("bound %d: %w", i, err)
				return
			}
			if i == n {
				cpu1 = readCPU()
			}
			bounds = append(bounds, revBound{at: time.Since(from), rev: g.Header.Revision})
		}
		boundsDone <- nil
	}()

	// The submitters.
	spec := trueJob("throughput", o.TasksPerJob)
	per := int64(o.TasksPerJob)
	var reserved atomic.Int64
	submitted := make([]atomic.Int64, n)
	lat := hdrhistogram.New(1, 60_000_000, 3)
	codes := map[string]int64{}
	var ok, bad int64
	var blocked time.Duration
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range o.Submitters {
		wg.Go(func() {
			js := apiaryv1.NewJobServiceClient(conns[i%len(conns)])
			h := hdrhistogram.New(1, 60_000_000, 3)
			var myOK, myBad int64
			var myBlocked time.Duration
			myCodes := map[string]int64{}
			for k := 0; ; k++ {
				now := time.Now()
				if !now.Before(end) || ctx.Err() != nil {
					break
				}
				if reserved.Load()-w.finished.Load()+per > int64(o.MaxBacklog) {
					time.Sleep(5 * time.Millisecond)
					myBlocked += tpOverlap(now, time.Now(), from, end)
					continue
				}
				reserved.Add(per)
				t := time.Now()
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				resp, err := js.SubmitJob(cctx, &apiaryv1.SubmitJobRequest{Spec: spec, ClientId: "bench-throughput",
					RequestId: fmt.Sprintf("r%d-s%d-%d", run, i, k)})
				cancel()
				done := time.Now()
				if err != nil || resp.GetJobId() == "" {
					reserved.Add(-per)
				} else if idx := int(done.Sub(from) / o.Interval); !done.Before(from) && done.Before(end) && idx < n {
					submitted[idx].Add(per)
				}
				if done.After(end) || t.Before(from) {
					continue
				}
				if err != nil {
					myBad++
					myCodes[grpcCode(err)]++
					continue
				}
				myOK++
				_ = h.RecordValue(done.Sub(t).Microseconds())
			}
			mu.Lock()
			defer mu.Unlock()
			lat.Merge(h)
			ok, bad, blocked = ok+myOK, bad+myBad, blocked+myBlocked
			for c, v := range myCodes {
				codes[c] += v
			}
		})
	}
	wg.Wait()
	if err := <-boundsDone; err != nil {
		return res, err
	}
	res.SubmitOK, res.SubmitErrors, res.SubmitCodes = ok, bad, codes
	res.SubmitP50Ms, res.SubmitP99Ms = float64(lat.ValueAtQuantile(50))/1000, float64(lat.ValueAtQuantile(99))/1000
	res.SubmitMaxMs = float64(lat.Max()) / 1000
	res.BlockedShare = blocked.Seconds() / (float64(o.Submitters) * o.Duration.Seconds())
	for i, p := range r.Coords {
		u := ProcUsage{ID: p.Name, CPU: cpu1.coords[i] - cpu0.coords[i]}
		u.RSSMiB, u.PeakMiB = tpProcMemMiB(p.Pid())
		res.Coords = append(res.Coords, u)
	}
	res.HarnessCPU = cpu1.self - cpu0.self
	res.HarnessRSSMiB, res.HarnessPeakMiB = tpProcMemMiB(os.Getpid())
	res.ForeignCPU = foreignShare(cpu0.host, cpu1.host)

	// Wait until the watch has passed the window's end.
	startRev, endRev := bounds[0].rev, bounds[len(bounds)-1].rev
	if err := waitFor(ctx, 60*time.Second, "the watch to pass the window's end", func() (bool, error) {
		if _, err := w.snapshot(); err != nil {
			return false, err
		}
		if w.lastRev.Load() >= endRev {
			return true, nil
		}
		_ = cli.RequestProgress(clientv3.WithRequireLeader(wctx))
		return false, fmt.Errorf("at revision %d of %d", w.lastRev.Load(), endRev)
	}); err != nil {
		return res, err
	}
	rows, _ := w.snapshot()
	res.StartRev, res.EndRev = startRev, endRev
	res.WindowS = (bounds[len(bounds)-1].at - bounds[0].at).Seconds()
	res.Intervals = bucketRows(rows, bounds)
	res.EventsBy = map[string]int64{}
	res.PendingMin = math.MaxInt
	var ends, flying []float64
	for _, iv := range res.Intervals {
		res.PendingMin = min(res.PendingMin, iv.PendingMin)
		ends, flying = append(ends, float64(iv.PendingEnd)), append(flying, float64(iv.InFlightEnd))
		if iv.Index < n {
			res.Intervals[iv.Index].SubmittedTasks = submitted[iv.Index].Load()
			res.SubmittedTasks += submitted[iv.Index].Load()
		}
	}
	res.PendingMedian, res.InFlightMedian = int(Summarize(ends).P50), int(Summarize(flying).P50)
	for _, row := range rows {
		if row.rev <= startRev {
			res.LiveStart = int(row.live)
		}
		if row.rev <= endRev {
			res.LiveEnd = int(row.live)
		}
		if row.rev <= startRev || row.rev > endRev {
			continue
		}
		res.Completed += int(row.complete)
		res.Failed += int(row.failed)
		res.Retried += int(row.retried)
		res.AliveDeleted += int(row.aliveDel)
		for p, c := range row.by {
			res.EventsBy[throughputParts[p]] += int64(c)
			res.Events += int64(c)
		}
	}
	res.TasksPerS = ratio(float64(res.Completed), res.WindowS)
	res.WritesPerTask = ratio(float64(res.Events), float64(res.Completed))

	// After the load: stop the fleet, wait for the region to go quiet, and
	// measure the write ceiling on the same members.
	regs, ferr := stopFleet()
	res.Registrations = regs
	cfg.logf("throughput run %d: window done; fleet stopped (%v); waiting for the region to go quiet", run, ferr)
	quietErr := waitFor(ctx, 30*time.Second, "a second without writes", func() (bool, error) {
		return time.Since(time.Unix(0, w.lastAt.Load())) >= time.Second, nil
	})
	res.CeilingQuiet = quietErr == nil
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	keys, txns, errs, err := measureCeiling(ctx, cli, o.CeilingWorkers, o.CeilingBatch, o.CeilingValueBytes, o.CeilingDuration)
	res.CeilingKeysPerS, res.CeilingTxns, res.CeilingErrors = keys, txns, errs
	if err != nil {
		return res, fmt.Errorf("ceiling: %w", err)
	}
	res.Ratio = throughputRatio(res.TasksPerS, res.WritesPerTask, res.CeilingKeysPerS)
	if ferr != nil {
		return res, fmt.Errorf("fleet: %w", ferr)
	}
	return res, nil
}

// tpOverlap is the part of [a, b) inside [from, to).
func tpOverlap(a, b, from, to time.Time) time.Duration {
	if a.Before(from) {
		a = from
	}
	if b.After(to) {
		b = to
	}
	return max(b.Sub(a), 0)
}

// tpWaitAlive polls (every 250 ms, for at most limit) until n node alive keys
// exist; a fleet that ended early (done) is an error.
func tpWaitAlive(ctx context.Context, cli *clientv3.Client, n int, limit time.Duration, done <-chan struct{}) error {
	deadline := time.Now().Add(limit)
	for {
		gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := cli.Get(gctx, prefNodes, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		cancel()
		alive := 0
		if err == nil {
			for _, kv := range resp.Kvs {
				if strings.HasSuffix(string(kv.Key), "/alive") {
					alive++
				}
			}
			if alive >= n {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d agents alive after %s (last error: %v)", alive, n, limit, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-done:
			return errors.New("the fleet stopped before every agent was alive")
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// measureCeiling commits, from workers goroutines for d, Txns of batch
// puts of valueBytes bytes each under prefCeiling (each worker cycling over
// 10 batches of keys of its own), then deletes the prefix. keysPerS counts
// the puts of the Txns committed before d passed; errs the Txns that
// failed.
func measureCeiling(ctx context.Context, cli *clientv3.Client, workers, batch, valueBytes int, d time.Duration) (keysPerS float64, txns, errs int64, err error) {
	value := strings.Repeat("x", valueBytes)
	var nTxn, nErr atomic.Int64
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for g := range workers {
		var sets [10][]clientv3.Op
		for b := range sets {
			for k := range batch {
				sets[b] = append(sets[b], clientv3.OpPut(fmt.Sprintf("%s%02d/%06d", prefCeiling, g, b*batch+k), value))
			}
		}
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline) && ctx.Err() == nil; i++ {
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := cli.Txn(cctx).Then(sets[i%len(sets)]...).Commit()
				cancel()
				switch {
				case err != nil:
					nErr.Add(1)
				case time.Now().Before(deadline):
					nTxn.Add(1)
				}
			}
		})
	}
	wg.Wait()
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	_, derr := cli.Delete(dctx, prefCeiling, clientv3.WithPrefix())
	txns, errs = nTxn.Load(), nErr.Load()
	if ctx.Err() != nil {
		return 0, txns, errs, ctx.Err()
	}
	return float64(txns) * float64(batch) / d.Seconds(), txns, errs, derr
}

// tpProcMemMiB is a process's resident memory and its peak (VmRSS, VmHWM
// of /proc/<pid>/status), MiB; 0 when unreadable.
func tpProcMemMiB(pid int) (rss, peak int64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		kb, _ := strconv.ParseInt(f[0], 10, 64)
		if k == "VmRSS" {
			rss = kb >> 10
		} else {
			peak = kb >> 10
		}
	}
	return rss, peak
}

// ThroughputRows are the per-run CSV rows (header first).
func ThroughputRows(res ThroughputResult) ([]string, [][]string) {
	h := []string{"run", "error", "agents", "slots", "tasks_per_job", "submitters", "max_backlog", "window_s", "start_rev", "end_rev",
		"completed", "failed", "retried", "tasks_per_s", "events", "writes_per_task"}
	for _, p := range throughputParts {
		h = append(h, "events_"+p)
	}
	h = append(h, "submit_ok", "submit_errors", "submit_error_codes", "submit_p50_ms", "submit_p99_ms", "submit_max_ms", "submitted_tasks",
		"blocked_share", "pending_min", "pending_median", "in_flight_median", "live_start", "live_end", "alive_deleted", "registrations",
		"ceiling_keys_per_s", "ceiling_txns", "ceiling_errors", "ceiling_quiet", "ceiling_tasks_per_s", "ratio",
		"coord_ids", "coord_cpu_s", "coord_rss_mib", "coord_peak_rss_mib", "harness_cpu_s", "harness_rss_mib", "harness_peak_rss_mib", "foreign_cpu_share")
	o := res.Options
	var rows [][]string
	for _, r := range res.Runs {
		row := []string{tpItoa(r.Run), r.Err, tpItoa(o.Agents), tpItoa(o.Slots), tpItoa(int(o.TasksPerJob)), tpItoa(o.Submitters), tpItoa(o.MaxBacklog),
			f2(r.WindowS), tpI64(r.StartRev), tpI64(r.EndRev), tpItoa(r.Completed), tpItoa(r.Failed), tpItoa(r.Retried), f1(r.TasksPerS), tpI64(r.Events), f2(r.WritesPerTask)}
		for _, p := range throughputParts {
			row = append(row, tpI64(r.EventsBy[p]))
		}
		var ids, cpu, rss, peak []string
		for _, c := range r.Coords {
			ids, cpu, rss, peak = append(ids, c.ID), append(cpu, f1(c.CPU)), append(rss, tpI64(c.RSSMiB)), append(peak, tpI64(c.PeakMiB))
		}
		row = append(row, tpI64(r.SubmitOK), tpI64(r.SubmitErrors), FormatCounts(r.SubmitCodes), f1(r.SubmitP50Ms), f1(r.SubmitP99Ms), f1(r.SubmitMaxMs), tpI64(r.SubmittedTasks),
			tpF3(r.BlockedShare), tpItoa(r.PendingMin), tpItoa(r.PendingMedian), tpItoa(r.InFlightMedian), tpItoa(r.LiveStart), tpItoa(r.LiveEnd), tpItoa(r.AliveDeleted), tpI64(r.Registrations),
			f1(r.CeilingKeysPerS), tpI64(r.CeilingTxns), tpI64(r.CeilingErrors), strconv.FormatBool(r.CeilingQuiet), f1(r.CeilingTasksPerS()), tpF3(r.Ratio),
			strings.Join(ids, " "), strings.Join(cpu, " "), strings.Join(rss, " "), strings.Join(peak, " "), f1(r.HarnessCPU), tpI64(r.HarnessRSSMiB), tpI64(r.HarnessPeakMiB), tpF3(r.ForeignCPU))
		rows = append(rows, row)
	}
	return h, rows
}

// ThroughputIntervalRows are the per-interval CSV rows (header first).
func ThroughputIntervalRows(res ThroughputResult) ([]string, [][]string) {
	h := []string{"run", "interval", "from_s", "to_s", "from_rev", "to_rev", "completed", "tasks_per_s", "events", "writes_per_task",
		"pending_min", "pending_end", "in_flight_end", "shard_owner_writes", "submitted_tasks"}
	var rows [][]string
	for _, r := range res.Runs {
		for _, iv := range r.Intervals {
			rows = append(rows, []string{tpItoa(r.Run), tpItoa(iv.Index), f2(iv.FromS), f2(iv.ToS), tpI64(iv.FromRev), tpI64(iv.ToRev), tpItoa(iv.Completed),
				f1(iv.TasksPerS), tpI64(iv.Events), f2(ratio(float64(iv.Events), float64(iv.Completed))), tpItoa(iv.PendingMin), tpItoa(iv.PendingEnd), tpItoa(iv.InFlightEnd), tpI64(iv.ShardWrites), tpI64(iv.SubmittedTasks)})
		}
	}
	return h, rows
}

// WriteThroughput writes throughput.csv (per run), throughput-intervals.csv
// (per run and interval) and throughput.png (tasks/s per interval, each run
// a series, with the ceiling-equivalent and the goal) to out, and returns
// the summary's markdown section.
func WriteThroughput(out string, res ThroughputResult) (string, error) {
	h, rows := ThroughputRows(res)
	if err := WriteCSV(filepath.Join(out, "throughput.csv"), h, rows); err != nil {
		return "", err
	}
	h, rows = ThroughputIntervalRows(res)
	if err := WriteCSV(filepath.Join(out, "throughput-intervals.csv"), h, rows); err != nil {
		return "", err
	}
	good := slices.DeleteFunc(slices.Clone(res.Runs), func(r ThroughputRun) bool { return r.Err != "" })
	col := func(f func(ThroughputRun) float64) []float64 {
		var xs []float64
		for _, r := range good {
			xs = append(xs, f(r))
		}
		return xs
	}
	ceilTasks := Summarize(col(ThroughputRun.CeilingTasksPerS)).P50
	var series []plotSeries
	for _, r := range good {
		var xy plotter.XYs
		for _, iv := range r.Intervals {
			xy = append(xy, plotter.XY{X: iv.ToS, Y: iv.TasksPerS})
		}
		series = append(series, plotSeries{Name: fmt.Sprintf("run %d", r.Run), XY: xy})
	}
	lines := []refLine{{Name: fmt.Sprintf("goal %d tasks/s", ThroughputGoalTasksPerS), Y: ThroughputGoalTasksPerS}}
	if ceilTasks > 0 {
		lines = append(lines, refLine{Name: fmt.Sprintf("etcd write ceiling / writes per task (%.0f tasks/s)", ceilTasks), Y: ceilTasks},
			refLine{Name: "60% of that", Y: ThroughputGoalRatio * ceilTasks})
	}
	if err := savePlot(filepath.Join(out, "throughput.png"), "tasks COMPLETE per second, per interval of the measured window",
		"s from the window's start (interval end)", "tasks/s", series, lines); err != nil {
		return "", err
	}
	return throughputMarkdown(res, good), nil
}

// throughputMarkdown is the summary section.
func throughputMarkdown(res ThroughputResult, good []ThroughputRun) string {
	o := res.Options
	spread := fmt.Sprintf("given every coordinator's address; each agent starts at the one its node id hashes to, so each coordinator holds the streams of about 1/%d of the agents", o.Coordinators)
	lan := "the coordinators in devcluster's serf LAN pool"
	if !o.LAN {
		lan = "no serf LAN pool (devcluster NoLAN)"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "## throughput: end-to-end control plane\n\n")
	fmt.Fprintf(&b, "A fresh %d-member region per run (coordinators with their embedded etcd members, plaintext, `%s`), %d simulated agents in the harness process (loadtest.RunFleet: the real agent, noop executor %s, %d slots and %d m / %d MiB each, started at %.0f/s, no serf LAN member; %s; %s). "+
		"Once every agent's alive key exists, %d closed-loop clients over %d gRPC connections submit jobs of %d tasks (100 m / 16 MiB, client_id + unique request_id) and wait while the tasks submitted and not yet seen finished would pass %s (a bounded backlog); "+
		"%s warm-up, then %s measured in %s intervals. A task counts when the harness's etcd watch of /apiary/ (read only) sees its record, created PENDING after the watch began, written COMPLETE; the window and its intervals are etcd revision ranges read by a Get at their ends (harness clock), so the watch's delay does not shift counts. "+
		"Writes per task = watch events (puts and deletes) under /apiary/ in the window ÷ tasks COMPLETE in it. After the window the fleet stops, the harness waits until the region has written nothing for 1 s, then measures etcd's batched-write ceiling on the same members: %d goroutines each committing Txns of %d puts of %d B under /apiary-bench/ceiling/ (one client over the three members' endpoints) for %s, deleted afterwards; ratio = tasks/s × writes per task ÷ ceiling. n = %d run(s) (%d failed).\n\n",
		o.Coordinators, strings.Join(o.ExtraArgs, " "), o.Agents, tpNoopName(o.TaskDuration), o.Slots, o.Slots*100, o.Slots*16, o.AgentStartRate, spread, lan,
		o.Submitters, o.Conns, o.TasksPerJob, thousands(float64(o.MaxBacklog)), o.Warmup, o.Duration, o.Interval,
		o.CeilingWorkers, o.CeilingBatch, o.CeilingValueBytes, o.CeilingDuration, len(res.Runs), len(res.Runs)-len(good))
	b.WriteString("| run | tasks COMPLETE | tasks/s | writes/task | submit p50 / p99 ms | pending min / median | in flight (median) | submitters at the bound | ceiling keys/s | ceiling ÷ writes/task (tasks/s) | **ratio** | coordinator CPU s (each) | coordinator RSS MiB (each) | harness CPU s | harness RSS MiB | leases lost | foreign CPU |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range res.Runs {
		if r.Err != "" {
			fmt.Fprintf(&b, "| %d | failed: %s ||||||||||||||||\n", r.Run, strings.ReplaceAll(r.Err, "|", "/"))
			continue
		}
		var cpu, rss []string
		for _, c := range r.Coords {
			cpu, rss = append(cpu, f1(c.CPU)), append(rss, tpI64(c.RSSMiB))
		}
		fmt.Fprintf(&b, "| %d | %s | %s | %.2f | %.1f / %.1f | %s / %s | %s | %.0f%% | %s | %s | **%.3f** | %s | %s | %.1f | %d | %d | %.0f%% |\n",
			r.Run, thousands(float64(r.Completed)), thousands(r.TasksPerS), r.WritesPerTask, r.SubmitP50Ms, r.SubmitP99Ms,
			thousands(float64(r.PendingMin)), thousands(float64(r.PendingMedian)), thousands(float64(r.InFlightMedian)), 100*r.BlockedShare, thousands(r.CeilingKeysPerS), thousands(r.CeilingTasksPerS()),
			r.Ratio, strings.Join(cpu, " / "), strings.Join(rss, " / "), r.HarnessCPU, r.HarnessRSSMiB, r.AliveDeleted, 100*r.ForeignCPU)
	}
	if len(good) == 0 {
		b.WriteString("\nNo run completed.\n\n")
		return b.String()
	}
	col := func(f func(ThroughputRun) float64) Summary {
		var xs []float64
		for _, r := range good {
			xs = append(xs, f(r))
		}
		return Summarize(xs)
	}
	mm := func(s Summary, format string) string {
		return fmt.Sprintf(format+" ["+format+"–"+format+"]", s.P50, s.Min, s.Max)
	}
	tps, ratioS := col(func(r ThroughputRun) float64 { return r.TasksPerS }), col(func(r ThroughputRun) float64 { return r.Ratio })
	wpt, ceil := col(func(r ThroughputRun) float64 { return r.WritesPerTask }), col(func(r ThroughputRun) float64 { return r.CeilingKeysPerS })
	coordCPU := col(func(r ThroughputRun) float64 {
		var s float64
		for _, c := range r.Coords {
			s += c.CPU
		}
		return s / max(r.WindowS, 1e-9)
	})
	harness := col(func(r ThroughputRun) float64 { return r.HarnessCPU / max(r.WindowS, 1e-9) })
	fmt.Fprintf(&b, "\nMedian over runs [min–max], n = %d: **%s tasks/s**, %s writes per task, ceiling %s keys/s, **ratio %s**; CPU over the window in cores: coordinators together %s, harness (fleet, submitters, watch) %s.\n\n",
		len(good), mm(tps, "%.0f"), mm(wpt, "%.2f"), mm(ceil, "%.0f"), mm(ratioS, "%.3f"), mm(coordCPU, "%.2f"), mm(harness, "%.2f"))
	verdict := func(met bool) string {
		if met {
			return "met"
		}
		return "not met"
	}
	fmt.Fprintf(&b, "- Goal (issue 16) ≥ %s tasks/s: median %s tasks/s, %s (%.2fx of it).\n", thousands(ThroughputGoalTasksPerS), thousands(tps.P50), verdict(tps.P50 >= ThroughputGoalTasksPerS), tps.P50/ThroughputGoalTasksPerS)
	fmt.Fprintf(&b, "- Goal ≥ %.0f%% of the same run's etcd write ceiling: median %.1f%%, %s.\n", 100*ThroughputGoalRatio, 100*ratioS.P50, verdict(ratioS.P50 >= ThroughputGoalRatio))
	fmt.Fprintf(&b, "- For scale only (other hardware, 5 servers, placements not completions): Nomad C1M ≈ %s placements/s; median here %.2fx of it.\n",
		thousands(NomadC1MPlacementsPerS), tps.P50/NomadC1MPlacementsPerS)
	b.WriteString("\nWrites per COMPLETE task by keyspace part (median over runs):")
	for _, p := range throughputParts {
		s := col(func(r ThroughputRun) float64 { return ratio(float64(r.EventsBy[p]), float64(r.Completed)) })
		fmt.Fprintf(&b, " %s %.2f;", p, s.P50)
	}
	b.WriteString(" (other: members, meta, quarantine, placement, upkeep).\n\n")
	var failed, retried, lost, notQuiet, ceilErrs int
	var moves int64
	var drift []string
	for _, r := range good {
		moves += r.EventsBy["shards"]
		if d := r.LiveEnd - r.LiveStart; math.Abs(float64(d)) > 0.1*float64(r.Completed) {
			drift = append(drift, fmt.Sprintf("run %d %+d against %d COMPLETE", r.Run, d, r.Completed))
		}
		failed += r.Failed
		retried += r.Retried
		lost += r.AliveDeleted
		ceilErrs += int(r.CeilingErrors)
		if !r.CeilingQuiet {
			notQuiet++
		}
	}
	pendMin := col(func(r ThroughputRun) float64 { return float64(r.PendingMin) }).Min
	blockedS := col(func(r ThroughputRun) float64 { return r.BlockedShare })
	pace := "so the scheduler always had tasks to place: the submitters were not the bottleneck"
	if pendMin <= 0 {
		pace = "so in some interval the backlog ran dry: the submitters, not the region, set the pace then (see throughput-intervals.csv)"
	}
	fmt.Fprintf(&b, "Checks: pending tasks never fell below %s in any run (min after every revision of the windows; the submitters waited at the backlog bound %.0f%% of their time, median), %s. "+
		"%d task(s) FAILED or CANCELLED and %d completed on a second attempt or later (refusals, lost leases); %d node alive key(s) deleted in the windows (leases lost); %d write(s) of shard owner keys in the windows (0: no shard changed owner; more: coordinators deposed each other under load, per interval in throughput-intervals.csv); ceiling Txn errors: %d; run(s) where the region was not quiet before the ceiling: %d.\n\n",
		thousands(pendMin), 100*blockedS.P50, pace, failed, retried, lost, moves, ceilErrs, notQuiet)
	if len(drift) > 0 {
		fmt.Fprintf(&b, "**Backlog not steady** (tasks submitted and not finished, window end minus start, by more than 10%% of the tasks COMPLETE): %s. Writes per task count the creation and queue writes of tasks that did not finish in the window, so they (and the ratio) are overstated there.\n\n", strings.Join(drift, "; "))
	}
	b.WriteString("PNG: throughput.png (tasks/s per interval, each run a series; the goal, the median ceiling-equivalent and 60% of it dashed). Raw rows: throughput.csv (per run, with the writes per keyspace part, CPU and memory), throughput-intervals.csv (per interval: tasks, writes, pending, tasks accepted).\n\n")
	fmt.Fprintf(&b, "Caveats: 2 shared vCPUs run the harness (%d agents with their heartbeats and assignment streams, the submitters, the watch decoding every task record) and the %d coordinators with their etcd members; the harness's CPU is in the table, apart from the coordinators'. "+
		"Every agent heartbeats every 500 ms whatever the lease (min(TTL/4, 500 ms)), so the longer lease only gives slack, not less load. The noop executor runs nothing, so this is the control plane's rate, not a host's (MEASURED.md: ~2,000 spawns/s). The watch counts etcd events, so several puts of one key in one Txn would count once (none are expected). "+
		"The ceiling is measured after the load, on a region whose etcd now holds the window's history (no compaction within 1 h), with etcd's default client; it is the etcd that region has on this machine, not an etcd alone. "+
		"n is small; foreign CPU is other work on this shared machine during the window.\n\n", o.Agents, o.Coordinators)
	return b.String()
}

func tpB2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func tpNoopName(d time.Duration) string {
	if d == 0 {
		return "`noop` (exits 0 at once)"
	}
	return "`noop:" + d.String() + "`"
}

func tpItoa(i int) string   { return strconv.Itoa(i) }
func tpI64(i int64) string  { return strconv.FormatInt(i, 10) }
func tpF3(x float64) string { return strconv.FormatFloat(x, 'f', 3, 64) }
