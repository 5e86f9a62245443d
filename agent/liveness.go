package agent

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/grafana/dskit/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

// Liveness on the node side: what the agent does with its attempts when it
// loses its coordinators, when its epoch ends, and when it is drained.
//
//   - Cut off (no coordinator answers): attempts keep running, each up to
//     its lost_after (the job's disconnect.lost_after_ms, else
//     Config.DisconnectGrace) counted from the last answered heartbeat, then
//     they are killed (watchdog) and reported LOST once a coordinator
//     answers (requeued, not charged). Reports are held and retried.
//   - A coordinator answers that the epoch ended (its lease lapsed while the
//     agent was cut off, or a coordinator ended it: serf suspicion, a
//     revoke): the agent registers again at once and asks the new epoch to
//     adopt the attempts it still runs (AdoptAttempts). Adoption keeps
//     exactly those whose tasks were not replaced meanwhile (one compared
//     Txn each); the others are killed, never reported. So a replaced
//     attempt dies within a registration round trip, and one that was not
//     replaced (disconnect.replace: false, a false suspicion the owner had
//     not acted on yet) is not lost.
//   - The region refuses the new registration for good (refusedForGood:
//     its join token revoked, unknown or bound elsewhere, its certificate
//     refused): no epoch will ever adopt the attempts, and the region
//     reclaimed their tasks when the epoch ended, so the agent kills every
//     attempt it still holds at once and drops their reports (dropRefused),
//     instead of running the work twice. It keeps registering with backoff
//     (an operator may give it a new token). An outage (UNAVAILABLE,
//     DEADLINE_EXCEEDED) is not a refusal: attempts run on as above.
//   - Drain (an operator's, from the heartbeat answer, or the agent's own on
//     stop): no new attempts are accepted; at the deadline those still
//     running are stopped and reported DRAINED.

// report delivers one report on st: with the attempt's current epoch on
// every try, until accepted or rejected, or until st is killed as stale,
// the agent stops, or giveUp closes. A rejection is final only when the
// attempt belongs to the agent's current epoch and a coordinator answered a
// heartbeat within the last lease TTL; otherwise it may only mean that the
// attempt's epoch ended meanwhile, so the report waits until the session
// settles (a heartbeat answered, a new epoch, adoption decided) and tries
// again: adopted, it goes with the new epoch; refused, st is stale and the
// report is dropped.
func (a *Agent) report(rep *reporter, st *attemptState, req *apiaryv1.ReportTaskStatusRequest, giveUp <-chan struct{}) reportResult {
	final := req.GetKind() != apiaryv1.ReportKind_REPORT_KIND_STARTED
	if final {
		defer a.settle(st)
	}
	for {
		a.mu.Lock()
		changed := a.changed
		a.mu.Unlock()
		res := rep.send(st.ctx, req, giveUp, func() int64 {
			a.mu.Lock()
			defer a.mu.Unlock()
			return st.epoch
		}, changed)
		if !res.delivered || res.accepted {
			return res
		}
		a.mu.Lock()
		// The region saying the epoch ended puts it in doubt too, even
		// before a heartbeat tells this agent so: a report dropped then
		// would leave its task to the reclaim.
		current := st.epoch == a.epoch && a.epoch != 0 && req.GetNodeEpoch() == st.epoch && !res.epochEnded &&
			!(a.leaseTTL > 0 && time.Since(a.lastContact) >= a.leaseTTL)
		a.mu.Unlock()
		if current {
			return res
		}
		a.log.Info("report rejected while the attempt's epoch is in doubt; waiting for the session to settle",
			"job", st.key.JobID, "task", st.key.TaskIndex, "attempt", st.key.Attempt, "epoch", req.GetNodeEpoch(), "reason", res.reason)
		select {
		case <-changed:
		case <-st.ctx.Done():
			return reportResult{}
		case <-giveUp:
			return reportResult{}
		}
	}
}

// settle marks st's final report as answered or given up: it is no longer
// offered for adoption, and its report context is released.
func (a *Agent) settle(st *attemptState) {
	a.mu.Lock()
	st.settled = true
	a.mu.Unlock()
	st.stop()
}

// killStaleLocked kills st's processes and drops its reports: its task
// belongs to someone else now. reason is the metric label.
func (a *Agent) killStaleLocked(st *attemptState, reason string) {
	if st.stale {
		return
	}
	st.stale, st.why = true, reason
	if st.exec != nil && st.finished.IsZero() {
		st.exec.Abandon()
	}
	st.stop()
	a.metrics.StaleKills.WithLabelValues(reason).Inc()
	a.log.Warn("killing stale attempt", "job", st.key.JobID, "task", st.key.TaskIndex, "attempt", st.key.Attempt,
		"epoch", st.epoch, "reason", reason)
}

// dropRefused is the agent's answer to a registration the region refused
// for good (refusedForGood; answer is the region's message): it kills at
// once every attempt still held from an ended epoch (running, or owing its
// final report) and drops their reports. None can be adopted (the region
// refuses this node), and the region reclaimed their tasks when the epoch
// ended (a revoked join token ends it at once), so each would otherwise run
// its work a second time. One ERROR says how many and why; the attempts'
// StaleKills reason is "registration_refused".
func (a *Agent) dropRefused(answer string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	running, reports := 0, 0
	epochs := map[int64]bool{}
	for _, st := range a.seen {
		if st.stale || st.settled || st.epoch == a.epoch {
			continue
		}
		if st.finished.IsZero() {
			running++
		} else {
			reports++
		}
		epochs[st.epoch] = true
		a.killStaleLocked(st, "registration_refused")
	}
	if running+reports == 0 {
		return
	}
	a.log.Error("the region refuses this node, so no epoch can adopt the attempts of the ended one: killed them at once, unreported "+
		"(the region has given their tasks to other nodes)",
		"running_killed", running, "reports_dropped", reports, "epochs", slices.Sorted(maps.Keys(epochs)), "refusal", answer)
}

// inContact reports whether the agent holds an epoch and a coordinator
// answered it within the lease TTL.
func (a *Agent) inContact() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.epoch != 0 && a.leaseTTL > 0 && time.Since(a.lastContact) < a.leaseTTL
}

// contact applies an answered heartbeat: the coordinators are reachable
// again, and the node's drain (if any) is as the answer says.
func (a *Agent) contact(resp *apiaryv1.HeartbeatResponse) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.cfg.Counters.Heartbeats.Add(1)
	wasCut := a.leaseTTL > 0 && time.Since(a.lastContact) >= a.leaseTTL
	a.lastContact = time.Now()
	if wasCut {
		a.bumpLocked() // reports held while cut off try again
	}
	if d := resp.GetDrainDeadlineMs(); d > 0 {
		at := time.UnixMilli(d)
		if a.drainAt.IsZero() || at.Before(a.drainAt) {
			if a.drainAt.IsZero() {
				a.log.Warn("node is draining: no new attempts; running ones stop at the deadline", "deadline", at)
			}
			a.drainAt = at
		}
	} else if !a.drainAt.IsZero() && !a.stopping {
		a.log.Info("drain ended")
		a.drainAt = time.Time{}
	}
}

// watchdogEvery is how often the watchdog looks at the attempts.
const watchdogEvery = 100 * time.Millisecond

// watchdog enforces lost_after while cut off and the drain deadline, until
// ctx ends.
func (a *Agent) watchdog(ctx context.Context) {
	t := time.NewTicker(watchdogEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a.mu.Lock()
		now := time.Now()
		cut := now.Sub(a.lastContact)
		disconnected := a.leaseTTL > 0 && !a.lastContact.IsZero() && cut >= a.leaseTTL
		a.metrics.Disconnected.Set(map[bool]float64{true: 1}[disconnected])
		for _, st := range a.seen {
			if st.stale || !st.finished.IsZero() || st.exec == nil {
				continue
			}
			lost := st.lostAfter
			if lost <= 0 {
				lost = a.cfg.DisconnectGrace
			}
			if disconnected && cut >= lost && !st.lost {
				// Not stale: its task is still this node's. Killed now, it is
				// reported LOST (requeued, not charged) once a coordinator
				// answers, with the epoch that then holds it.
				st.lost = true
				st.exec.Cancel()
				a.metrics.StaleKills.WithLabelValues("disconnect_grace").Inc()
				a.log.Warn("no coordinator answered for the attempt's lost_after; killing it (reported LOST once one answers)",
					"job", st.key.JobID, "task", st.key.TaskIndex, "attempt", st.key.Attempt, "lost_after", lost, "disconnected_for", cut.Round(time.Millisecond))
				continue
			}
			if !a.drainAt.IsZero() && !now.Before(a.drainAt) && !st.drained && !st.cancelled {
				st.drained = true
				st.exec.Cancel()
				a.log.Info("draining: stopping attempt at the deadline", "job", st.key.JobID, "task", st.key.TaskIndex, "attempt", st.key.Attempt)
			}
		}
		a.mu.Unlock()
	}
}

// adoptSurvivors offers the new epoch the attempts of earlier epochs whose
// final report is still owed (running, or ended while cut off), and kills
// those it refuses. It retries transient errors until the attempts are
// decided, ctx ends, or their lost_after kills them.
func (a *Agent) adoptSurvivors(ctx context.Context, sess *session) {
	a.mu.Lock()
	var sts []*attemptState
	req := &apiaryv1.AdoptAttemptsRequest{NodeId: a.cfg.NodeID, NodeEpoch: sess.epoch}
	for _, st := range a.seen {
		if st.epoch != 0 && st.epoch != sess.epoch && !st.settled && !st.stale {
			sts = append(sts, st)
			req.Attempts = append(req.Attempts, &apiaryv1.AttemptRef{JobId: st.key.JobID, TaskIndex: st.key.TaskIndex,
				Attempt: st.key.Attempt, FencingToken: st.token, NodeEpoch: st.epoch})
		}
	}
	a.mu.Unlock()
	if len(sts) == 0 {
		return
	}
	b := backoff.New(ctx, a.backoff)
	var resp *apiaryv1.AdoptAttemptsResponse
	var err error
	for b.Ongoing() {
		idx, cl := sess.coords.client()
		cctx, cancel := context.WithTimeout(ctx, a.cfg.RPCTimeout)
		resp, err = cl.AdoptAttempts(cctx, req)
		cancel()
		if err == nil || ctx.Err() != nil || !transient(err) {
			break
		}
		if status.Code(err) == codes.Unavailable {
			sess.coords.failover(idx)
		}
		b.Wait()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	defer a.bumpLocked() // held reports go again (or give up)
	if err != nil || len(resp.GetDecisions()) != len(sts) {
		if ctx.Err() != nil {
			return
		}
		a.log.Warn("adoption failed; killing the attempts of the ended epoch", "attempts", len(sts), "err", err)
		for _, st := range sts {
			a.killStaleLocked(st, "not_adopted")
		}
		return
	}
	adopted := 0
	for i, d := range resp.GetDecisions() {
		st := sts[i]
		if d.GetAdopted() && !st.stale {
			st.epoch = sess.epoch
			adopted++
			continue
		}
		a.log.Info("attempt not adopted", "job", st.key.JobID, "task", st.key.TaskIndex, "attempt", st.key.Attempt, "reason", d.GetReason())
		a.killStaleLocked(st, "not_adopted")
	}
	a.log.Info("adoption decided", "epoch", sess.epoch, "attempts", len(sts), "adopted", adopted)
}

// shutdownDrain is the agent's stop (Run's ctx ended): mark the node
// draining until now+DrainDeadline, let attempts finish until then, stop
// the rest (reported DRAINED by their goroutines), end the sessions (so
// that the ended epoch is not registered again), then deregister. Each step
// is bounded; a region that cannot be reached only makes it shorter. Every
// wait is logged with what it waits for and until when; attempts the agent
// killed as stale (a registration refused for good among them) owe no
// report, so a refused agent stops at once.
func (a *Agent) shutdownDrain(coords *coordinators, stopSessions func()) {
	deadline := time.Now().Add(a.cfg.DrainDeadline)
	a.mu.Lock()
	a.stopping = true
	epoch := a.epoch
	if a.drainAt.IsZero() || deadline.Before(a.drainAt) {
		a.drainAt = deadline
	}
	a.mu.Unlock()
	_, running := a.ledger.Used()
	switch {
	case epoch == 0 && running == 0:
		a.log.Info("stopping: the node holds no epoch (not registered) and runs no attempt")
	case epoch == 0:
		a.log.Info("stopping: the node holds no epoch (not registered); running attempts stop at the deadline",
			"deadline", deadline, "running", running)
	default:
		a.log.Info("stopping: draining the node", "epoch", epoch, "deadline", deadline, "running", running)
	}
	call := func(what string, epoch int64, f func(context.Context, apiaryv1.AgentServiceClient) error) bool {
		if epoch == 0 {
			return false
		}
		_, cl := coords.client()
		ctx, cancel := context.WithTimeout(context.Background(), a.cfg.RPCTimeout)
		defer cancel()
		if err := f(ctx, cl); err != nil {
			a.log.Warn(what+" failed", "epoch", epoch, "err", err)
			return false
		}
		return true
	}
	call("drain", epoch, func(ctx context.Context, cl apiaryv1.AgentServiceClient) error {
		_, err := cl.DrainSelf(ctx, &apiaryv1.DrainSelfRequest{NodeId: a.cfg.NodeID, NodeEpoch: epoch, DeadlineMs: deadline.UnixMilli()})
		return err
	})
	// Wait for every final report to be answered: attempts that finish by
	// themselves, and those the watchdog stops at the deadline.
	bound := time.Now().Add(a.cfg.DrainDeadline + a.cfg.KillGrace + 2*a.cfg.RPCTimeout)
	var owed []string
	for said := false; ; said = true {
		a.mu.Lock()
		ch := a.changed
		owed = owed[:0]
		for _, st := range a.seen {
			if !st.settled && !st.stale && st.exec != nil {
				owed = append(owed, st.key.String())
			}
		}
		registered := a.epoch != 0
		a.mu.Unlock()
		if len(owed) == 0 || !time.Now().Before(bound) {
			break
		}
		if !said {
			slices.Sort(owed)
			a.log.Info("stopping: waiting for the attempts to end and their final reports to be answered",
				"attempts", len(owed), "first", owed[0], "until", bound.Round(time.Millisecond), "registered", registered)
		}
		select {
		case <-ch:
		case <-time.After(watchdogEvery):
		}
	}
	if len(owed) > 0 {
		a.log.Warn("stopping: gave up waiting for final reports (their tasks are requeued when the node's lease lapses)",
			"attempts", len(owed))
	}
	// The sessions may have registered a new epoch meanwhile (an outage
	// that ended during the drain): that is the one to release.
	a.mu.Lock()
	if a.epoch != 0 {
		epoch = a.epoch
	}
	a.mu.Unlock()
	stopSessions()
	released := call("deregister", epoch, func(ctx context.Context, cl apiaryv1.AgentServiceClient) error {
		_, err := cl.Deregister(ctx, &apiaryv1.DeregisterRequest{NodeId: a.cfg.NodeID, NodeEpoch: epoch})
		return err
	})
	switch {
	case released:
		a.log.Info("drained; lease released", "epoch", epoch)
	case epoch != 0:
		a.log.Warn("stopping without releasing the lease (no coordinator took the deregistration); the region requeues this node's tasks when the lease lapses",
			"epoch", epoch)
	default:
		a.log.Info("stopping: no epoch to release")
	}
}
