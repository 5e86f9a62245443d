package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/grafana/dskit/backoff"
	"github.com/grafana/dskit/services"
	"go.opentelemetry.io/otel/trace"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/lifecycle"
	"apiary.dev/apiary/internal/telemetry"
)

// seenRetention is how long a finished attempt's key is remembered for
// deduplication. A coordinator stops re-sending an assignment once it has
// committed the attempt's final report; this covers a stream message that
// was in flight at that moment.
const seenRetention = 10 * time.Minute

// quickEpoch: an epoch that ends sooner than this after it began makes the
// next registration wait (backoff).
const quickEpoch = 5 * time.Second

// Agent is a node agent. Create it with New and start it with Run.
type Agent struct {
	cfg    Config
	log    *slog.Logger
	ledger *Ledger
	// datasets is the node's dataset cache (nil without Config.DatasetDir).
	datasets *datasetCache
	backoff  backoff.Config
	running  atomic.Bool
	tracer   trace.Tracer
	tracing  bool
	metrics  *telemetry.AgentMetrics
	marker   string // agentRunEnv's value for this agent's tasks
	// contain: cgroups and launcher threads (cgroup_attempt.go).
	contain *containment

	// runCtx outlives Run's ctx through the shutdown drain; the attempts'
	// reports run under it. wg counts the attempts' goroutines.
	runCtx context.Context
	wg     sync.WaitGroup

	mu      sync.Mutex
	epoch   int64         // current node epoch; 0 while unregistered
	changed chan struct{} // closed and replaced on epoch change, contact after a disconnect, adoption
	region  string
	// seen holds the attempts of every epoch (deduplication, and the
	// attempts carried over to a new epoch by adoption), pruned once
	// finished for seenRetention.
	seen      map[AttemptKey]*attemptState
	lastPrune time.Time
	// lastContact is when a coordinator last answered a heartbeat or a
	// registration; leaseTTL is the epoch's lease. No answer for a lease
	// TTL means "disconnected": attempts keep running up to their
	// lost_after.
	lastContact time.Time
	leaseTTL    time.Duration
	// drainAt is when attempts still running are stopped and handed back
	// as DRAINED (zero: not draining); from the heartbeat answer (an
	// operator's drain) or the agent's own shutdown.
	drainAt time.Time
	// stopping is set by the shutdown drain (a drain no heartbeat ends).
	stopping bool
}

// attemptState is the agent's view of one attempt. Guarded by Agent.mu.
type attemptState struct {
	key       AttemptKey
	exec      Running   // nil until started
	cancelled bool      // a CANCEL arrived
	finished  time.Time // zero while the attempt may still run
	// epoch is the node epoch the attempt belongs to: the one it was
	// dispatched to, or the one that adopted it. Reports carry it.
	epoch     int64
	token     int64         // fencing token
	lostAfter time.Duration // how long it runs while disconnected
	drained   bool          // stopped by a drain: reported DRAINED
	lost      bool          // killed after lost_after without contact: reported LOST
	stale     bool          // killed as stale: never reported
	why       string        // why it was killed as stale (metric reason)
	settled   bool          // its final report was answered (or given up)
	ctx       context.Context
	stop      context.CancelFunc // ends ctx: stops the attempt's reports
}

// New validates cfg, fills in its defaults (see Config) and returns an agent
// that has not connected yet. Errors name the invalid Config field.
func New(cfg Config) (*Agent, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	a := &Agent{
		cfg:     c,
		log:     c.Logger.With("node", c.NodeID),
		ledger:  NewLedger(c.Capacity, c.GPUModel, c.MaxTasks),
		backoff: backoff.Config{MinBackoff: c.MinBackoff, MaxBackoff: c.MaxBackoff},
		changed: make(chan struct{}),
		seen:    map[AttemptKey]*attemptState{},
		tracer:  telemetry.Tracer(c.TracerProvider),
		tracing: telemetry.IsEnabled(c.TracerProvider),
		marker:  agentMarker(c.DataDir),
	}
	a.metrics = newAgentMetrics(c, a.ledger)
	a.contain = newContainment(c, a.log, c.Registry)
	a.datasets = newDatasetCache(c.DatasetDir)
	if sameFS, err := sameFileSystem(c.DataDir, c.DatasetDir); err == nil && !sameFS {
		a.log.Warn("the dataset dir is on another file system than the data dir: task outputs cannot be moved there and are not kept",
			"dataset_dir", c.DatasetDir, "data_dir", c.DataDir)
	}
	return a, nil
}

// Config returns the agent's configuration with defaults filled in.
func (a *Agent) Config() Config { return a.cfg }

// NodeID returns the node's id.
func (a *Agent) NodeID() string { return a.cfg.NodeID }

// Epoch returns the current node epoch, or 0 while the agent is not
// registered.
func (a *Agent) Epoch() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.epoch
}

// WaitRegistered blocks until the agent holds a node epoch and returns it,
// or returns ctx's error.
func (a *Agent) WaitRegistered(ctx context.Context) (int64, error) {
	for {
		a.mu.Lock()
		epoch, ch := a.epoch, a.changed
		a.mu.Unlock()
		if epoch != 0 {
			return epoch, nil
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-ch:
		}
	}
}

// setEpochLocked records the current epoch and wakes WaitRegistered.
func (a *Agent) setEpochLocked(epoch int64) {
	a.epoch = epoch
	a.bumpLocked()
}

// bumpLocked wakes everyone waiting on a.changed.
func (a *Agent) bumpLocked() {
	close(a.changed)
	a.changed = make(chan struct{})
}

// Used returns the resources held by running attempts and their number.
func (a *Agent) Used() (Resources, int) { return a.ledger.Used() }

// Run registers the node and serves assignments until ctx is cancelled.
// While no coordinator answers, attempts keep running (up to their
// lost_after) and their reports are held; when a coordinator answers that
// the node epoch ended, the agent registers again and asks it to adopt the
// attempts it still runs, killing (without reporting) those it refuses. On
// cancellation it drains (Config.DrainDeadline): no new placements, attempts
// still running at the deadline stopped and reported DRAINED, the lease
// released; then it kills anything left and returns nil. Run returns an error only if
// DataDir/work cannot be created, the metrics address cannot be served, a
// coordinator address is unusable, a coordinator refuses the registration as
// invalid (INVALID_ARGUMENT: bad node id or capacity), or Run was already
// called. It runs Parts with internal/lifecycle.
func (a *Agent) Run(ctx context.Context) error {
	return lifecycle.Run(ctx, a.log, 0, a.Parts()...)
}

// Parts returns the agent's long-running parts in start order; they stop in
// reverse (internal/lifecycle):
//
//   - data-dir: creates DataDir/work and kills orphans of a previous run.
//   - metrics: /metrics over HTTP (with MetricsAddr).
//   - janitor: removes finished attempts' work dirs (WorkRetention).
//   - datasets: rescans the dataset dir every DatasetRescan (datasets.go).
//   - lan: the node's serf LAN member (lan.go), joined once registered,
//     left after the sessions stop.
//   - sessions: the coordinator connections, then register and serve one
//     node epoch after another (heartbeats and the assignment stream); on
//     stop it drains the node (liveness.go) and waits for the process
//     groups. A refused registration fails the part.
//
// An agent runs once: Parts fails to start if Run or Parts ran before.
func (a *Agent) Parts() []lifecycle.Part {
	parts := []lifecycle.Part{lifecycle.Idle("data-dir", func(context.Context) error {
		if !a.running.CompareAndSwap(false, true) {
			return errors.New("agent: Run called twice")
		}
		for _, d := range []string{"work", "attempts"} {
			if err := os.MkdirAll(filepath.Join(a.cfg.DataDir, d), 0o755); err != nil {
				return fmt.Errorf("data dir: %w", err)
			}
		}
		if !a.cfg.Executor.spawns() {
			// The noop executor: no process to contain, none left behind.
			a.log.Warn("attempts run no process: the executor is a timer, for measuring the control plane only",
				"executor", a.cfg.Executor.String())
			return nil
		}
		a.startContainment() // cgroups, and a previous run's attempt cgroups killed
		if n := killOrphans(a.cfg.DataDir, a.log); n > 0 {
			a.log.Warn("killed processes left by a previous run", "processes", n)
		}
		return nil
	}, func() error { a.contain.close(); return nil })}
	if a.cfg.MetricsAddr != "" {
		var srv *telemetry.Server
		parts = append(parts, lifecycle.Idle("metrics", func(context.Context) (err error) {
			if srv, err = telemetry.Serve(a.cfg.MetricsAddr, a.cfg.Registry, true); err == nil {
				a.log.Info("serving metrics", "addr", srv.Addr())
			}
			return err
		}, func() error { return srv.Close() }))
	}
	parts = append(parts, a.lanParts()...) // lan.go: the serf LAN member (joins after registering; leaves after the sessions)
	var coords *coordinators
	return append(parts,
		lifecycle.Loop("janitor", a.janitor),
		// datasets.go: rescans the dataset dir; the heartbeats send changes.
		lifecycle.New("datasets", services.NewTimerService(a.cfg.DatasetRescan, nil,
			func(context.Context) error { a.datasets.rescan(); return nil }, nil)),
		lifecycle.New("sessions", services.NewBasicService(func(context.Context) (err error) {
			if len(a.cfg.Conns) > 0 {
				coords = sharedCoordinators(a.cfg.CoordinatorAddrs, a.cfg.Conns).startAt(a.cfg.NodeID)
				return nil
			}
			coords, err = newCoordinators(a.cfg.CoordinatorAddrs, a.cfg.MinBackoff, a.cfg.MaxBackoff, a.cfg.DialOptions)
			if err == nil {
				coords.startAt(a.cfg.NodeID)
			}
			return err
		}, func(ctx context.Context) error {
			return a.sessions(ctx, coords)
		}, func(error) error {
			coords.close()
			return nil
		})))
}

// sessions registers the node and serves one epoch after another until ctx
// ends (nil, after the shutdown drain) or a coordinator refuses the
// registration (its error).
func (a *Agent) sessions(ctx context.Context, coords *coordinators) error {
	// The sessions and the attempts' reports outlive ctx through the drain.
	runCtx, stopRun := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRun()
	a.runCtx = runCtx
	sctx, stopSessions := context.WithCancel(runCtx)
	defer stopSessions()
	rep := &reporter{coords: coords, rpcTimeout: a.cfg.RPCTimeout, backoff: a.backoff, log: a.log}
	var watch sync.WaitGroup
	a.log.Info("agent starting", "coordinators", a.cfg.CoordinatorAddrs, "data_dir", a.cfg.DataDir,
		"cpu_millis", a.cfg.Capacity.CPUMillis, "memory_mb", a.cfg.Capacity.MemoryMB,
		"gpus", a.cfg.Capacity.GPUs, "max_tasks", a.cfg.MaxTasks, "disconnect_grace", a.cfg.DisconnectGrace,
		"executor", a.cfg.Executor.String())
	req := &apiaryv1.RegisterNodeRequest{
		NodeId: a.cfg.NodeID,
		Labels: a.cfg.Labels,
		Capacity: &apiaryv1.Resources{
			CpuMillis: a.cfg.Capacity.CPUMillis,
			MemoryMb:  a.cfg.Capacity.MemoryMB,
			Gpus:      a.cfg.Capacity.GPUs,
		},
		GpuModel:  a.cfg.GPUModel,
		MaxTasks:  int32(a.cfg.MaxTasks),
		JoinToken: a.cfg.JoinToken,
	}
	watch.Go(func() { a.watchdog(runCtx) })
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		select {
		case <-ctx.Done():
			a.shutdownDrain(coords, stopSessions)
		case <-sctx.Done():
		}
		stopSessions()
	}()
	var failed error
	// Epochs that end soon after they began (another agent registering the
	// same node id, a coordinator that keeps ending them) are registered
	// again with backoff, not in a tight loop.
	quick := backoff.New(sctx, a.backoff)
	quickEnds := 0
	for {
		// Each registration carries the datasets as of now; the heartbeats
		// send later changes.
		var dsVersion int64
		req.Datasets, dsVersion = a.datasets.snapshot()
		sess, err := register(sctx, coords, req, a.cfg.RPCTimeout, a.backoff, a.log, a.dropRefused)
		if sess != nil {
			sess.datasets, sess.datasetsSent = a.datasets, dsVersion
		}
		if sctx.Err() != nil {
			break
		}
		if err != nil {
			a.log.Error("registration refused; stopping", "err", err)
			failed = err
			break
		}
		a.metrics.Registrations.Inc()
		a.cfg.Counters.Registrations.Add(1)
		a.metrics.Epoch.Set(float64(sess.epoch))
		began := time.Now()
		err = a.serveEpoch(sctx, sess, rep)
		if sctx.Err() != nil {
			break
		}
		if time.Since(began) > quickEpoch {
			quick.Reset()
			quickEnds = 0
		} else if quickEnds++; quickEnds >= 3 {
			a.log.Warn("node epochs keep ending right after they begin; is another agent running with this node id?",
				"node", a.cfg.NodeID, "in_a_row", quickEnds)
		}
		a.log.Warn("re-registering", "old_epoch", sess.epoch, "reason", err)
		if quickEnds > 0 {
			quick.Wait()
		}
	}
	stopSessions()
	<-drained
	// Whatever still runs now is killed and never reported.
	a.mu.Lock()
	a.setEpochLocked(0)
	for _, st := range a.seen {
		if st.exec != nil && st.finished.IsZero() {
			st.exec.Abandon()
		}
	}
	a.mu.Unlock()
	stopRun()
	a.wg.Wait()
	watch.Wait()
	a.log.Info("agent stopped")
	return failed
}

// serveEpoch runs one node epoch until it is lost or ctx ends. Attempts of
// earlier epochs that still run (or still owe their final report) are
// offered to it for adoption first.
func (a *Agent) serveEpoch(ctx context.Context, sess *session, rep *reporter) error {
	ectx, cancel := context.WithCancel(ctx)
	defer cancel()
	a.mu.Lock()
	a.setEpochLocked(sess.epoch)
	a.region = sess.region
	a.leaseTTL = sess.leaseTTL
	a.lastContact = time.Now()
	a.mu.Unlock()
	a.adoptSurvivors(ectx, sess)

	errc := make(chan error, 2)
	go func() { errc <- sess.heartbeatLoop(ectx, a.contact) }()
	go func() {
		errc <- sess.streamLoop(ectx, func(asg *apiaryv1.Assignment) {
			a.handleAssignment(sess, rep, asg)
		})
	}()
	err := <-errc
	cancel()
	<-errc

	// No new attempt can start now (the stream loop has returned). The
	// epoch's attempts keep running: the next epoch offers them for
	// adoption, which keeps those whose tasks were not replaced meanwhile
	// and kills the others (adoptSurvivors).
	a.mu.Lock()
	defer a.mu.Unlock()
	a.setEpochLocked(0)
	if ctx.Err() == nil {
		a.log.Warn("epoch ended; its attempts run on until the next epoch adopts or refuses them, "+
			"or the region refuses the registration (then they are killed)",
			"epoch", sess.epoch, "since_heartbeat", time.Since(a.lastContact).Round(time.Millisecond))
	}
	return err
}

// handleAssignment applies one assignment of the stream; it is called in
// stream order from one goroutine.
func (a *Agent) handleAssignment(sess *session, rep *reporter, asg *apiaryv1.Assignment) {
	key := AttemptKey{JobID: asg.GetJobId(), TaskIndex: asg.GetTaskIndex(), Attempt: asg.GetAttempt()}
	log := a.log.With("job", key.JobID, "task", key.TaskIndex, "attempt", key.Attempt)
	now := time.Now()

	a.mu.Lock()
	defer a.mu.Unlock()
	a.pruneLocked(now)
	if asg.GetNodeEpoch() != sess.epoch || a.epoch != sess.epoch {
		log.Warn("ignoring assignment of another node epoch", "assignment_epoch", asg.GetNodeEpoch(), "epoch", sess.epoch)
		return
	}
	switch asg.GetKind() {
	case apiaryv1.Assignment_KIND_RUN:
		if _, ok := a.seen[key]; ok {
			log.Debug("duplicate assignment ignored")
			return
		}
		st := a.newAttemptLocked(key, sess.epoch)
		st.token = asg.GetFencingToken()
		st.lostAfter = time.Duration(asg.GetLostAfterMs()) * time.Millisecond
		err := a.ledger.Reserve(key, requestOf(asg))
		if err == nil && !a.drainAt.IsZero() {
			a.ledger.Release(key)
			err = errors.New("node is draining")
		}
		if err != nil {
			st.finished = now
			a.metrics.Attempts.WithLabelValues("refused").Inc()
			a.cfg.Counters.Refused.Add(1)
			log.Info("refusing assignment", "reason", err)
			a.wg.Go(func() {
				req := a.newReport(sess, key, apiaryv1.ReportKind_REPORT_KIND_REFUSED)
				req.Error = err.Error()
				a.report(rep, st, req, nil)
			})
			return
		}
		a.wg.Go(func() { a.runAttempt(sess, rep, st, asg, log) })
	case apiaryv1.Assignment_KIND_CANCEL:
		st, ok := a.seen[key]
		if !ok {
			// Cancelled before it reached us: never run it, and say so.
			st = a.newAttemptLocked(key, sess.epoch)
			st.cancelled, st.finished = true, now
			log.Info("attempt cancelled before it ran")
			a.wg.Go(func() {
				a.report(rep, st, a.newReport(sess, key, apiaryv1.ReportKind_REPORT_KIND_CANCELLED), nil)
			})
			return
		}
		if st.cancelled || !st.finished.IsZero() {
			return
		}
		st.cancelled = true
		log.Info("cancelling attempt")
		if st.exec != nil {
			st.exec.Cancel()
		}
	default:
		log.Warn("ignoring assignment of unknown kind", "kind", asg.GetKind().String())
	}
}

// newAttemptLocked records a new attempt of epoch, with its own report
// context under the agent's run context.
func (a *Agent) newAttemptLocked(key AttemptKey, epoch int64) *attemptState {
	st := &attemptState{key: key, epoch: epoch}
	st.ctx, st.stop = context.WithCancel(a.runCtx)
	a.seen[key] = st
	return st
}

// runAttempt executes one admitted attempt and reports on it. Its resources
// are held in the ledger until its process group is gone.
func (a *Agent) runAttempt(sess *session, rep *reporter, st *attemptState, asg *apiaryv1.Assignment, log *slog.Logger) {
	key := st.key
	ctx := st.ctx
	finish := func() {
		a.ledger.Release(key)
		a.mu.Lock()
		st.finished = time.Now()
		a.mu.Unlock()
	}
	region := asg.GetRegion()
	if region == "" {
		region = sess.region
	}
	sctx, span := a.startRun(ctx, sess, asg, region)
	dir, err := a.workDir(key)
	var exec Running
	if err != nil {
		err = jobFault(err) // the assignment's ids are not usable
	} else {
		var outDir string
		env := a.taskEnv(asg, key, region)
		if len(asg.GetOutputs()) > 0 {
			outDir = filepath.Join(dir, outputsDirName)
			env = append(env, "APIARY_OUTPUT_DIR="+outDir)
		}
		exec, err = a.cfg.Executor.Start(Spec{
			Command:   asg.GetCommand(),
			Args:      asg.GetArgs(),
			Env:       env,
			OutputDir: outDir,
			Dir:       dir,
			Timeout:   time.Duration(asg.GetTimeoutMs()) * time.Millisecond,
			TailBytes: a.cfg.TailBytes,
			KillGrace: a.cfg.KillGrace,
			Record:    a.recordPath(key),
			Limits:    limitsOf(asg.GetResources()),
			contain:   a.contain,
			cgroup:    attemptCgroupName(key),
		})
	}
	if err != nil {
		finish()
		a.cfg.Counters.StartFailed.Add(1)
		a.endRun(span, err, nil, nil, dir)
		log.WarnContext(sctx, "attempt failed to start", "err", err, "fault", StartFault(err).String())
		req := a.newReport(sess, key, apiaryv1.ReportKind_REPORT_KIND_START_FAILED)
		req.Error = err.Error()
		req.Fault = StartFault(err)
		req.ExitCode = -1
		req.StartTimeMs, req.EndTimeMs = time.Now().UnixMilli(), time.Now().UnixMilli()
		if r := a.report(rep, st, req, nil); r.delivered && !r.accepted {
			log.Info("report rejected", "kind", req.Kind.String(), "reason", r.reason)
		}
		return
	}
	a.cfg.Counters.Started.Add(1)
	a.mu.Lock()
	st.exec = exec
	switch {
	case st.stale || ctx.Err() != nil:
		exec.Abandon() // killed as stale while we were starting
	case st.cancelled, st.drained:
		exec.Cancel()
	}
	a.mu.Unlock()
	log.InfoContext(sctx, "attempt started", "pid", exec.Pid(), "dir", dir)

	// STARTED is best effort: once the process has ended, it is not retried
	// (the final report carries start_time_ms), but an RPC in flight is let
	// finish so that it cannot overtake the final report.
	startedc := make(chan reportResult, 1)
	go func() {
		// A process that ends within startedReportDelay needs no STARTED
		// report: the final report carries start_time_ms. This halves the
		// report writes of short tasks.
		t := time.NewTimer(startedReportDelay)
		defer t.Stop()
		select {
		case <-exec.Done():
			startedc <- reportResult{}
			return
		case <-t.C:
		}
		req := a.newReport(sess, key, apiaryv1.ReportKind_REPORT_KIND_STARTED)
		req.StartTimeMs = exec.StartTime().UnixMilli()
		startedc <- a.report(rep, st, req, exec.Done())
	}()
	var started reportResult
	select {
	case started = <-startedc:
		if started.delivered && !started.accepted {
			log.Info("STARTED rejected; killing stale attempt", "reason", started.reason)
			a.mu.Lock()
			a.killStaleLocked(st, "report_rejected")
			a.mu.Unlock()
		}
		<-exec.Done()
	case <-exec.Done():
		started = <-startedc
	}
	res := exec.Wait()
	finish()
	a.cfg.Counters.Ended.Add(1)
	outcome := res.Outcome.String()
	a.mu.Lock()
	switch {
	case st.stale:
		span.SetAttributes(telemetry.AttrReason.String("killed as stale: " + st.why))
		outcome += " (killed as stale: " + st.why + ")"
	case st.drained && !st.cancelled && res.Outcome == OutcomeCancelled:
		span.SetAttributes(telemetry.AttrReason.String("drained"))
		outcome = "drained"
	case st.lost && !st.cancelled && res.Outcome == OutcomeCancelled:
		span.SetAttributes(telemetry.AttrReason.String("lost_after passed without contact"))
		outcome = "lost (lost_after passed without contact)"
	}
	a.mu.Unlock()
	log.InfoContext(sctx, "attempt ended", "outcome", outcome, "exit_code", res.ExitCode,
		"duration", res.Ended.Sub(res.Started), "err", res.Err, usageAttr(res.Usage))
	a.endRun(span, nil, exec, &res, dir)

	a.mu.Lock()
	drained, stale, cancelled := st.drained, st.stale, st.cancelled
	a.mu.Unlock()
	if ctx.Err() != nil || stale || res.Outcome == OutcomeAbandoned || (started.delivered && !started.accepted) {
		a.settle(st)
		return // stale: nobody wants to hear about it
	}
	a.mu.Lock()
	lost := st.lost
	a.mu.Unlock()
	var kind apiaryv1.ReportKind
	switch {
	case res.Outcome == OutcomeCancelled && lost && !cancelled:
		kind = apiaryv1.ReportKind_REPORT_KIND_LOST
		res.Err = fmt.Errorf("killed by the agent: no coordinator answered for the attempt's lost_after")
	case res.Outcome == OutcomeTimedOut:
		kind = apiaryv1.ReportKind_REPORT_KIND_TIMED_OUT
	case res.Outcome == OutcomeCancelled && drained && !cancelled:
		kind = apiaryv1.ReportKind_REPORT_KIND_DRAINED
		a.metrics.Drained.Inc()
	case res.Outcome == OutcomeCancelled:
		kind = apiaryv1.ReportKind_REPORT_KIND_CANCELLED
	default:
		kind = apiaryv1.ReportKind_REPORT_KIND_EXITED
	}
	req := a.newReport(sess, key, kind)
	req.ExitCode = int32(res.ExitCode)
	req.StdoutTail, req.StderrTail = res.StdoutTail, res.StderrTail
	req.StartTimeMs, req.EndTimeMs = res.Started.UnixMilli(), res.Ended.UnixMilli()
	if res.Err != nil {
		req.Error = res.Err.Error()
	}
	if kind == apiaryv1.ReportKind_REPORT_KIND_EXITED && res.ExitCode == 0 && len(asg.GetOutputs()) > 0 {
		staging := filepath.Join(a.cfg.DataDir, "staging", filepath.Base(a.recordPath(key)))
		_ = os.MkdirAll(filepath.Dir(staging), 0o700)
		outs, err := a.datasets.publish(filepath.Join(dir, outputsDirName), staging, asg.GetOutputs())
		if err != nil {
			log.Warn("outputs not kept as datasets", "err", err)
		}
		req.Outputs = outs
	}
	if r := a.report(rep, st, req, nil); r.delivered && !r.accepted {
		log.Info("report rejected", "kind", kind.String(), "reason", r.reason)
	}
}

func (a *Agent) newReport(sess *session, key AttemptKey, kind apiaryv1.ReportKind) *apiaryv1.ReportTaskStatusRequest {
	return &apiaryv1.ReportTaskStatusRequest{
		NodeId:    a.cfg.NodeID,
		NodeEpoch: sess.epoch,
		JobId:     key.JobID,
		TaskIndex: key.TaskIndex,
		Attempt:   key.Attempt,
		Kind:      kind,
	}
}

// pruneLocked forgets attempts finished longer than seenRetention ago, at
// most once a minute.
func (a *Agent) pruneLocked(now time.Time) {
	if now.Sub(a.lastPrune) < time.Minute {
		return
	}
	a.lastPrune = now
	for k, st := range a.seen {
		if !st.finished.IsZero() && now.Sub(st.finished) > seenRetention {
			delete(a.seen, k)
		}
	}
}

// workDir returns <DataDir>/work/<jobID>/<index>/<attempt>, refusing job ids
// that would escape DataDir.
func (a *Agent) workDir(key AttemptKey) (string, error) {
	id := key.JobID
	if id == "" || id == "." || id == ".." || strings.ContainsAny(id, "/\\\x00") {
		return "", fmt.Errorf("job id %q is not usable as a directory name", id)
	}
	if key.TaskIndex < 0 || key.Attempt < 0 {
		return "", fmt.Errorf("negative task index or attempt in %s", key)
	}
	return filepath.Join(a.cfg.DataDir, "work", id,
		strconv.Itoa(int(key.TaskIndex)), strconv.Itoa(int(key.Attempt))), nil
}

// taskEnv is attemptEnv plus this agent's marker (agentRunEnv), which the
// task's processes inherit and a restarted agent sweeps by.
func (a *Agent) taskEnv(asg *apiaryv1.Assignment, key AttemptKey, region string) []string {
	env := attemptEnv(a.cfg.BaseEnv, asg, a.cfg.NodeID, region, a.ledger.Devices(key))
	for _, name := range asg.GetDatasets() {
		if p, ok := a.datasets.path(name); ok {
			env = append(env, datasetEnvName(name)+"="+p)
		}
	}
	return append(env, agentRunEnv+"="+a.marker)
}

// recordPath returns <DataDir>/attempts/<jobID>.<index>.<attempt>, the
// attempt's record (see killOrphans); key's job id was checked by workDir.
func (a *Agent) recordPath(key AttemptKey) string {
	return filepath.Join(a.cfg.DataDir, "attempts",
		fmt.Sprintf("%s.%d.%d", key.JobID, key.TaskIndex, key.Attempt))
}

// attemptEnv is base, then the assignment's env (sorted by name), then the
// APIARY_* variables, which win over both.
// An attempt holding GPUs also gets APIARY_GPU_DEVICES and
// CUDA_VISIBLE_DEVICES (the device indices, comma-separated), and for a
// share APIARY_GPU_MILLI; they win over the job's env like the others.
func attemptEnv(base []string, asg *apiaryv1.Assignment, nodeID, region string, gpus []int) []string {
	env := slices.Clone(base)
	for _, k := range slices.Sorted(maps.Keys(asg.GetEnv())) {
		env = append(env, k+"="+asg.GetEnv()[k])
	}
	env = append(env,
		"APIARY_JOB_ID="+asg.GetJobId(),
		"APIARY_TASK_INDEX="+strconv.Itoa(int(asg.GetTaskIndex())),
		"APIARY_ATTEMPT="+strconv.Itoa(int(asg.GetAttempt())),
		"APIARY_REGION="+region,
		"APIARY_NODE_ID="+nodeID,
		"APIARY_FENCING_TOKEN="+strconv.FormatInt(asg.GetFencingToken(), 10),
	)
	if len(gpus) > 0 {
		ids := make([]string, len(gpus))
		for i, g := range gpus {
			ids[i] = strconv.Itoa(g)
		}
		list := strings.Join(ids, ",")
		env = append(env, "APIARY_GPU_DEVICES="+list, "CUDA_VISIBLE_DEVICES="+list)
		if m := asg.GetResources().GetGpuMilli(); m > 0 {
			env = append(env, "APIARY_GPU_MILLI="+strconv.Itoa(int(m)))
		}
	}
	return env
}

func requestOf(asg *apiaryv1.Assignment) Request {
	r := asg.GetResources()
	req := Request{
		CPUMillis: r.GetCpuMillis(),
		MemoryMB:  r.GetMemoryMb(),
		GPUs:      r.GetGpus(),
		GPUMilli:  r.GetGpuMilli(),
		GPUModels: r.GetGpuModels(),
	}
	for _, d := range asg.GetGpuIndices() {
		req.Devices = append(req.Devices, int(d))
	}
	return req
}

// startedReportDelay is how long an attempt must run before its STARTED
// report is sent.
const startedReportDelay = 100 * time.Millisecond
