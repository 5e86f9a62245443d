package taskstate

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

// Task is the durable record of one task (/apiary/tasks/<s>/<job>/<index>).
// Times are Unix milliseconds.
type Task struct {
	JobID string `json:"job"`
	Index int32  `json:"idx"`
	// Group is the index of the task group in the job spec.
	Group int32              `json:"grp"`
	State apiaryv1.TaskState `json:"state"`
	// Attempt is the dispatch counter: incremented only by a committed plan.
	Attempt int32 `json:"attempt"`
	// Used counts attempts that ran and ended without success (failed, timed
	// out, or lost with their node); it is compared with max_attempts.
	// Refusals do not count.
	Used      int32  `json:"used,omitempty"`
	NodeID    string `json:"node,omitempty"`
	NodeEpoch int64  `json:"node_epoch,omitempty"`
	// GPUDevices are the node's GPU devices the current attempt was given
	// (whole GPUs, or the one GPU of a share); set with the plan.
	GPUDevices   []int32 `json:"gpus,omitempty"`
	FencingToken int64   `json:"token,omitempty"`
	NotBeforeMs  int64   `json:"not_before,omitempty"`
	// Excluded maps node id -> Unix ms until which the node is excluded for
	// this task (it refused the task).
	Excluded map[string]int64 `json:"excluded,omitempty"`
	// FailedOn counts failures of this task per node (placement penalty),
	// node-fault start failures included.
	FailedOn map[string]int `json:"failed_on,omitempty"`
	// NodeFaults counts start failures that were the node's fault; they are
	// not charged to Used but are bounded by NodeFaultLimit.
	NodeFaults int32 `json:"node_faults,omitempty"`
	// JobFaultOn lists the distinct nodes on which the task failed by what
	// looks like its own fault before that was confirmed (a command that
	// could not start, a non-retryable exit on a node with no recent
	// success), in order; the failure is final on JobFaultNodes of them.
	JobFaultOn []string `json:"job_fault_on,omitempty"`
	// NodeFailures counts attempts lost with their node (KilledWorker rule).
	NodeFailures   int32  `json:"node_failures,omitempty"`
	UnplacedReason string `json:"unplaced,omitempty"`
	Error          string `json:"error,omitempty"`
	// FetchBytes is the bytes of the task's input datasets its current
	// node did not hold when the task was placed there (apiaryv1.Task
	// fetch_bytes).
	FetchBytes int64 `json:"fetch_bytes,omitempty"`
	// CancelRequested is set on an assigned or running task of a cancelled job.
	CancelRequested bool  `json:"cancel,omitempty"`
	AssignedMs      int64 `json:"assigned_ms,omitempty"`
	StartedMs       int64 `json:"started_ms,omitempty"`
	FinishedMs      int64 `json:"finished_ms,omitempty"`
	// PreemptedBy is set on an active attempt that a task of higher
	// priority preempts (Preempt): who, e.g. "job 7f3a task 0 (priority
	// 90)". The attempt's end (the agent kills it on the CANCEL that the
	// same Txn wrote) requeues the task at once without charge.
	PreemptedBy string `json:"preempted_by,omitempty"`
	// Reservation is the room a PENDING preemptor holds on a node while
	// its victims stop (Reserve); cleared by Assign.
	Reservation *Reservation `json:"reservation,omitempty"`
	// PreemptedFor is the attempt (Attempt+1 at the time) for whose
	// placement this task preempted others, and Reservations how many
	// reservations it made for it: a reservation that ended without the
	// placement (its node lost, its victims not stopped in time, its room
	// gone) lets it preempt again, up to MaxReservations per placement.
	PreemptedFor int32 `json:"preempted_for,omitempty"`
	Reservations int32 `json:"reservations,omitempty"`
}

// MaxReservations bounds the preemptions one placement of a task may make
// (Reserve): a placement that keeps failing after its victims stopped
// does not go on stopping others.
const MaxReservations = 3

// MayPreempt reports whether a PENDING task may preempt for its next
// placement: it holds no reservation and has made fewer than
// MaxReservations for that placement.
func MayPreempt(t Task) bool {
	return t.Reservation == nil && (t.PreemptedFor <= t.Attempt || t.Reservations < MaxReservations)
}

// Reservation is the room a preemptor holds on one node epoch: its
// victims (task key and attempt) are stopping there, and every owner
// counts the preemptor's request as used on that node until it is placed
// or the reservation ends (UntilMs, Unix ms).
type Reservation struct {
	NodeID    string   `json:"node"`
	NodeEpoch int64    `json:"epoch"`
	Victims   []Victim `json:"victims"`
	UntilMs   int64    `json:"until"`
}

// Victim is one attempt a preemption stops.
type Victim struct {
	Key     string `json:"key"`
	Attempt int32  `json:"attempt"`
}

// Terminal reports whether s is COMPLETE, FAILED or CANCELLED.
func Terminal(s apiaryv1.TaskState) bool {
	return s == apiaryv1.TaskState_TASK_STATE_COMPLETE || s == apiaryv1.TaskState_TASK_STATE_FAILED ||
		s == apiaryv1.TaskState_TASK_STATE_CANCELLED
}

// Active reports whether s holds resources on a node (ASSIGNED or RUNNING).
func Active(s apiaryv1.TaskState) bool {
	return s == apiaryv1.TaskState_TASK_STATE_ASSIGNED || s == apiaryv1.TaskState_TASK_STATE_RUNNING
}

// Policy is the retry policy of a task, from its job spec.
type Policy struct {
	MaxAttempts    int32
	RetryableCodes []int32
	// KilledWorkerLimit: a task whose nodes were lost this many times fails
	// terminally (Dask's KilledWorker). 0 means
	// max(DefaultKilledWorkerLimit, MaxAttempts).
	KilledWorkerLimit int32
	Backoff           Backoff
	// Replace is false when the job asked (disconnect.replace: false) that
	// the attempts of a node whose lease lapsed are not replaced before
	// LostAfter has passed since the node was seen lost.
	Replace   bool
	LostAfter time.Duration
}

// DefaultKilledWorkerLimit is how many node losses a task survives by
// default (Dask's distributed.scheduler.allowed-failures is 3).
const DefaultKilledWorkerLimit = 3

// killedWorkerLimit is p's KilledWorker bound with its default applied.
func killedWorkerLimit(p Policy) int32 {
	if p.KilledWorkerLimit > 0 {
		return p.KilledWorkerLimit
	}
	return max(DefaultKilledWorkerLimit, p.MaxAttempts)
}

// Backoff is exponential backoff with full jitter on the upper half:
// delay(n) = min(Max, Base * 2^(n-1)) * (0.5 + rand/2).
type Backoff struct {
	Base time.Duration
	Max  time.Duration
}

// DefaultBackoff is used when a policy leaves Backoff zero.
var DefaultBackoff = Backoff{Base: 200 * time.Millisecond, Max: 30 * time.Second}

// Delay returns the backoff before retry n (n >= 1), jittered by rng.
func (b Backoff) Delay(n int32, rng *rand.Rand) time.Duration {
	if b.Base <= 0 {
		b = DefaultBackoff
	}
	d := b.Base
	for i := int32(1); i < n && d < b.Max; i++ {
		d *= 2
	}
	if d > b.Max {
		d = b.Max
	}
	return d/2 + time.Duration(rng.Int64N(int64(d/2)+1))
}

// Plan-side transitions ------------------------------------------------------

// Assign moves a PENDING task to ASSIGNED for a committed plan. The caller
// commits the result only together with the plan (one Txn).
func Assign(t Task, nodeID string, nodeEpoch int64, nowMs int64) (Task, error) {
	if t.State != apiaryv1.TaskState_TASK_STATE_PENDING {
		return t, fmt.Errorf("task %s/%d: assign from %s", t.JobID, t.Index, t.State)
	}
	t.State = apiaryv1.TaskState_TASK_STATE_ASSIGNED
	t.Attempt++
	t.NodeID, t.NodeEpoch = nodeID, nodeEpoch
	t.GPUDevices = nil // the caller sets the new attempt's devices
	t.FencingToken = 0 // set from the assignment key's CreateRevision once known
	t.UnplacedReason = ""
	t.Reservation = nil
	t.AssignedMs, t.StartedMs, t.FinishedMs = nowMs, 0, 0
	return t, nil
}

// Preempt marks an ASSIGNED or RUNNING attempt as preempted by the task
// described in by (docs/architecture.md, "Preemption"): the caller rewrites
// its assignment as a CANCEL in the same Txn, and the attempt's end then
// requeues it at once without charge (preempted). It is refused for a task
// that is not active, whose cancellation was asked for, or that is being
// preempted already.
func Preempt(t Task, by string) (Task, error) {
	switch {
	case !Active(t.State):
		return t, fmt.Errorf("task %s/%d: preempt from %s", t.JobID, t.Index, t.State)
	case t.CancelRequested:
		return t, fmt.Errorf("task %s/%d: being cancelled", t.JobID, t.Index)
	case t.PreemptedBy != "":
		return t, fmt.Errorf("task %s/%d: being preempted by %s already", t.JobID, t.Index, t.PreemptedBy)
	}
	t.PreemptedBy = by
	return t, nil
}

// Reserve records a PENDING task's reservation r for the placement of its
// next attempt (the preemption of r's victims). It is refused for a task
// that is not PENDING or may not preempt (MayPreempt: it holds a
// reservation, or made MaxReservations for this placement).
func Reserve(t Task, r Reservation, reason string) (Task, error) {
	switch {
	case t.State != apiaryv1.TaskState_TASK_STATE_PENDING:
		return t, fmt.Errorf("task %s/%d: reserve from %s", t.JobID, t.Index, t.State)
	case !MayPreempt(t):
		return t, fmt.Errorf("task %s/%d: made %d reservations for attempt %d already", t.JobID, t.Index, t.Reservations, t.PreemptedFor)
	}
	if t.PreemptedFor > t.Attempt {
		t.Reservations++
	} else {
		t.PreemptedFor, t.Reservations = t.Attempt+1, 1
	}
	t.Reservation = &r
	t.UnplacedReason = reason
	return t, nil
}

// EndReservation drops a PENDING task's reservation (it expired, its node
// epoch ended, or the room went to another task), recording why as the
// unplaced reason. changed is false when there was none.
func EndReservation(t Task, reason string) (out Task, changed bool) {
	if t.Reservation == nil || t.State != apiaryv1.TaskState_TASK_STATE_PENDING {
		return t, false
	}
	t.Reservation = nil
	t.UnplacedReason = reason
	return t, true
}

// preempted requeues a preempted attempt's task at once, not charged.
func preempted(t Task, endMs int64) Result {
	if t.CancelRequested {
		t.State, t.FinishedMs = apiaryv1.TaskState_TASK_STATE_CANCELLED, endMs
		return Result{Task: t, Outcome: OutcomeCancelled, Released: true}
	}
	attempt, by := t.Attempt, t.PreemptedBy
	t = toPending(t, 0)
	t.Error = fmt.Sprintf("attempt %d preempted by %s; requeued at once, not charged to max_attempts", attempt, by)
	return Result{Task: t, Outcome: OutcomePreempted, Released: true}
}

// Report is an agent's report on one attempt.
type Report struct {
	Kind      apiaryv1.ReportKind
	NodeID    string
	NodeEpoch int64
	Attempt   int32
	ExitCode  int32
	Error     string
	StartMs   int64
	EndMs     int64
	// Fault is whose fault a START_FAILED was; UNSPECIFIED (older agents)
	// is treated as JOB.
	Fault apiaryv1.FailureFault
	// Blame is what the region holds against the reporting node (package
	// nodehealth's verdict), for a report of a failure.
	Blame Blame
}

// Blame is what the region holds against a node when one of its attempts
// fails (docs/architecture.md, "Bad nodes").
type Blame int

const (
	// BlameNone: the node is trusted (a recent success vouches for it); a
	// failure is the task's by the job's rules.
	BlameNone Blame = iota
	// BlameUnproven: the node has no recent success. A failure that would
	// be final (an exit code outside retryable_exit_codes) is confirmed on
	// another node first: retried once, not charged.
	BlameUnproven
	// BlameNode: the node is quarantined, or this failure makes it an
	// outlier: any failure is the node's, retried elsewhere without charge
	// (bounded by NodeFaultLimit, as a node-fault start failure).
	BlameNode
)

// Outcome values recorded for an attempt.
const (
	OutcomeComplete  = "complete"
	OutcomeFailed    = "failed"
	OutcomeRetry     = "retry"
	OutcomeLost      = "lost"
	OutcomeRefused   = "refused"
	OutcomeTimeout   = "timeout"
	OutcomeCancelled = "cancelled"
	// OutcomeDrained: the attempt was stopped by a drain (or its node left
	// cleanly); requeued without charge.
	OutcomeDrained = "drained"
	// OutcomePreempted: the attempt was stopped to make room for a task of
	// higher priority (Preempt); requeued at once without charge.
	OutcomePreempted = "preempted"
)

// Result is what ApplyReport decided.
type Result struct {
	Task Task
	// Outcome is set when the attempt ended ("" for STARTED).
	Outcome string
	// Rejected is the reason the report was refused; Task is unchanged then.
	Rejected string
	// Duplicate: the report repeats one already applied (a STARTED for
	// the attempt that runs, from its node epoch: a retry whose first
	// answer was lost, or a Txn retried after it committed). It is
	// accepted and changes nothing; Task is unchanged.
	Duplicate bool
	// Released is true when the attempt stopped holding node resources.
	Released bool
	// Fault is who was at fault for a failed attempt (a non-zero exit, a
	// timeout, a start failure): NODE, UNCONFIRMED or JOB; UNSPECIFIED for
	// any other outcome.
	Fault apiaryv1.FailureFault
}

// RefusalExclusion is how long a node that refused a task stays excluded.
// It outlasts the usual reason for a refusal ("no room"): the region's view
// of a node lagging its agent's ledger, which lasts from an agent's
// re-registration on a new epoch until AdoptAttempts commits (the region
// places on the empty-looking epoch meanwhile) or until a killed stale
// attempt's processes are gone, a few hundred ms under load. It was 30 s:
// in a region of two nodes, a task refused by both (each re-registering
// after a scheduler kill, `apiary loadtest failover --scenario
// kill-scheduler`) then could not be placed for 30 s, and under load the
// load-test harness's 45 s drain ran out (one job "lost", 1 in 7 CI runs;
// 1 in 8 runs lost 23 jobs with 30 s against 0 in 8 with 3 s, on a 2-core
// machine at load 9-15, alternating).
const RefusalExclusion = 3 * time.Second

// JobFaultNodes is on how many distinct nodes a task must fail to start by
// its own fault (command missing or not executable), or fail with a
// non-retryable exit on nodes that no recent success vouches for, before
// that is terminal: one broken PATH or bad host must not fail a job.
const JobFaultNodes = 2

// NodeFaultLimit is how many start failures that were the node's fault a
// task retries (without charging its attempt budget) before it fails:
// max(10, 3 × max_attempts). The bound keeps a task from looping forever
// when every node it can run on is broken.
func NodeFaultLimit(p Policy) int32 {
	return max(10, 3*p.MaxAttempts)
}

// ApplyReport applies a report to a task. aliveEpoch is the node's current
// epoch (0 if its lease is gone). A report for any other attempt, node or
// epoch than the task's current one is rejected, as is any report on a
// terminal task (a no-op).
func ApplyReport(t Task, p Policy, r Report, aliveEpoch int64, nowMs int64, rng *rand.Rand) Result {
	switch {
	case Terminal(t.State):
		return Result{Task: t, Rejected: "task is already " + t.State.String()}
	case !Active(t.State):
		return Result{Task: t, Rejected: fmt.Sprintf("stale attempt %d: task is %s", r.Attempt, t.State)}
	case r.Attempt != t.Attempt:
		return Result{Task: t, Rejected: fmt.Sprintf("stale attempt %d: current attempt is %d", r.Attempt, t.Attempt)}
	case r.NodeID != t.NodeID || r.NodeEpoch != t.NodeEpoch:
		return Result{Task: t, Rejected: fmt.Sprintf("stale node epoch: report from %s epoch %d, attempt runs on %s epoch %d", r.NodeID, r.NodeEpoch, t.NodeID, t.NodeEpoch)}
	case aliveEpoch != r.NodeEpoch:
		return Result{Task: t, Rejected: fmt.Sprintf("stale node epoch %d: node lease is gone", r.NodeEpoch)}
	}
	end := r.EndMs
	if end == 0 {
		end = nowMs
	}
	if t.PreemptedBy != "" {
		// A preempted attempt's end, whatever it was, is the preemption's
		// doing, unless it completed first or the node was drained.
		switch r.Kind {
		case apiaryv1.ReportKind_REPORT_KIND_STARTED, apiaryv1.ReportKind_REPORT_KIND_DRAINED:
		case apiaryv1.ReportKind_REPORT_KIND_EXITED:
			if r.ExitCode != 0 {
				return preempted(t, end)
			}
		default:
			return preempted(t, end)
		}
	}
	switch r.Kind {
	case apiaryv1.ReportKind_REPORT_KIND_STARTED:
		if t.State == apiaryv1.TaskState_TASK_STATE_RUNNING {
			// Refusing it would tell the agent its attempt is stale: it
			// would kill it, or never report its end (issue 12's breaker:
			// tasks stuck RUNNING after an etcd stall).
			return Result{Task: t, Duplicate: true}
		}
		t.State = apiaryv1.TaskState_TASK_STATE_RUNNING
		t.StartedMs = firstNonZero(r.StartMs, nowMs)
		return Result{Task: t}
	case apiaryv1.ReportKind_REPORT_KIND_EXITED:
		if t.StartedMs == 0 {
			t.StartedMs = firstNonZero(r.StartMs, nowMs)
		}
		if r.ExitCode == 0 {
			t.State, t.FinishedMs, t.Error = apiaryv1.TaskState_TASK_STATE_COMPLETE, end, ""
			return Result{Task: t, Outcome: OutcomeComplete, Released: true}
		}
		if t.CancelRequested {
			t.State, t.FinishedMs = apiaryv1.TaskState_TASK_STATE_CANCELLED, end
			return Result{Task: t, Outcome: OutcomeCancelled, Released: true}
		}
		what := fmt.Sprintf("exited with code %d", r.ExitCode)
		if r.Error != "" {
			// The agent's account of the end (e.g. "killed by its memory
			// limit (32 MiB): ..."), kept in the task's error too.
			what += " (" + r.Error + ")"
		}
		if r.Blame == BlameNode {
			return nodeFault(t, p, end, nowMs, rng, what+" on a node quarantined as an outlier")
		}
		if !slices.Contains(p.RetryableCodes, r.ExitCode) {
			what += ", which is not in retryable_exit_codes"
			if r.Blame == BlameUnproven {
				return unconfirmed(t, p, end, nowMs, rng, what)
			}
			t = countFailure(t)
			return withFault(failed(t, end, fmt.Sprintf("attempt %d %s", t.Attempt, what)), apiaryv1.FailureFault_FAILURE_FAULT_JOB)
		}
		if lastUnconfirmed(t, p, r) {
			return unconfirmed(t, p, end, nowMs, rng, what+", which would spend the last of max_attempts")
		}
		t = countFailure(t)
		return withFault(retryOrFail(t, p, end, nowMs, rng, fmt.Sprintf("exit code %d", r.ExitCode)), apiaryv1.FailureFault_FAILURE_FAULT_JOB)
	case apiaryv1.ReportKind_REPORT_KIND_TIMED_OUT:
		if t.CancelRequested {
			t.State, t.FinishedMs = apiaryv1.TaskState_TASK_STATE_CANCELLED, end
			return Result{Task: t, Outcome: OutcomeCancelled, Released: true}
		}
		var res Result
		if r.Blame == BlameNode {
			res = nodeFault(t, p, end, nowMs, rng, "timed out on a node quarantined as an outlier")
		} else if lastUnconfirmed(t, p, r) {
			res = unconfirmed(t, p, end, nowMs, rng, "timed out, which would spend the last of max_attempts")
		} else {
			res = withFault(retryOrFail(countFailure(t), p, end, nowMs, rng, "timed out"), apiaryv1.FailureFault_FAILURE_FAULT_JOB)
		}
		if res.Outcome == OutcomeRetry {
			res.Outcome = OutcomeTimeout
		}
		return res
	case apiaryv1.ReportKind_REPORT_KIND_START_FAILED:
		if t.CancelRequested {
			t.State, t.FinishedMs = apiaryv1.TaskState_TASK_STATE_CANCELLED, end
			return Result{Task: t, Outcome: OutcomeCancelled, Released: true}
		}
		return startFailed(t, p, r, end, nowMs, rng)
	case apiaryv1.ReportKind_REPORT_KIND_REFUSED:
		if t.CancelRequested {
			t.State, t.FinishedMs = apiaryv1.TaskState_TASK_STATE_CANCELLED, end
			return Result{Task: t, Outcome: OutcomeCancelled, Released: true}
		}
		// Copy before writing: t shares its maps with the caller's record.
		t.Excluded = maps.Clone(t.Excluded)
		if t.Excluded == nil {
			t.Excluded = map[string]int64{}
		}
		t.Excluded[t.NodeID] = nowMs + RefusalExclusion.Milliseconds()
		t = toPending(t, 0)
		return Result{Task: t, Outcome: OutcomeRefused, Released: true}
	case apiaryv1.ReportKind_REPORT_KIND_CANCELLED:
		t.State, t.FinishedMs = apiaryv1.TaskState_TASK_STATE_CANCELLED, end
		return Result{Task: t, Outcome: OutcomeCancelled, Released: true}
	case apiaryv1.ReportKind_REPORT_KIND_DRAINED:
		return drained(t, end)
	case apiaryv1.ReportKind_REPORT_KIND_LOST:
		// The agent killed it after lost_after without contact: a loss of
		// the node's contact, not the task's doing (never charged).
		if t.CancelRequested {
			t.State, t.FinishedMs = apiaryv1.TaskState_TASK_STATE_CANCELLED, end
			return Result{Task: t, Outcome: OutcomeCancelled, Released: true}
		}
		return nodeLoss(t, p, t.NodeID, false, end)
	}
	return Result{Task: t, Rejected: fmt.Sprintf("unknown report kind %s", r.Kind)}
}

// Loss says how a node epoch ended, for NodeLost.
type Loss struct {
	// Drained: the node left cleanly (an operator's drain, or its agent
	// shut down and deregistered): the task is requeued without charge.
	Drained bool
	// Alone: the task was the only active task of the lost epoch. Only then
	// is the loss charged to the task's attempt budget (Used): a node lost
	// under several tasks was most likely not lost by this one (Dask's
	// KilledWorker reasoning). Every undrained loss counts toward
	// KilledWorkerLimit.
	Alone bool
}

// NodeLost applies the loss of the node (its lease lapsed or was revoked) to
// an ASSIGNED or RUNNING task on it: back to PENDING without backoff, or
// FAILED when the task's nodes were lost KilledWorkerLimit times or a
// charged loss spent its budget. ok is false if the task was not on that
// epoch.
func NodeLost(t Task, p Policy, nodeID string, epoch int64, loss Loss, nowMs int64) (Result, bool) {
	if !Active(t.State) || t.NodeID != nodeID || t.NodeEpoch != epoch {
		return Result{Task: t}, false
	}
	if t.CancelRequested {
		t.State, t.FinishedMs = apiaryv1.TaskState_TASK_STATE_CANCELLED, nowMs
		return Result{Task: t, Outcome: OutcomeCancelled, Released: true}, true
	}
	if loss.Drained {
		return drained(t, nowMs), true
	}
	if t.PreemptedBy != "" {
		return preempted(t, nowMs), true // being stopped anyway: not the task's loss
	}
	return nodeLoss(t, p, nodeID, loss.Alone, nowMs), true
}

// nodeLoss applies the loss of the task's node (its lease, or its agent's
// contact with the region): NodeFailures counts it; only a charged loss
// (the task ran alone there) counts in Used and FailedOn, so that an
// uncharged loss neither spends the budget nor bars the node.
func nodeLoss(t Task, p Policy, nodeID string, charged bool, nowMs int64) Result {
	t.NodeFailures++
	if charged {
		t = countFailure(t)
	}
	if limit := killedWorkerLimit(p); t.NodeFailures >= limit {
		res := failed(t, nowMs, fmt.Sprintf("killed worker: the node running this task was lost %d times (last: %s, attempt %d); not retried", t.NodeFailures, nodeID, t.Attempt))
		res.Outcome = OutcomeLost
		return res
	}
	if t.Used >= p.MaxAttempts {
		res := failed(t, nowMs, fmt.Sprintf("node %s lost during attempt %d, the only task on it; max_attempts %d reached", nodeID, t.Attempt, p.MaxAttempts))
		res.Outcome = OutcomeLost
		return res
	}
	t = toPending(t, 0)
	return Result{Task: t, Outcome: OutcomeLost, Released: true}
}

// drained requeues an active task at once without charging it (a drained
// attempt, or a node that left cleanly).
func drained(t Task, endMs int64) Result {
	if t.CancelRequested {
		t.State, t.FinishedMs = apiaryv1.TaskState_TASK_STATE_CANCELLED, endMs
		return Result{Task: t, Outcome: OutcomeCancelled, Released: true}
	}
	t = toPending(t, 0)
	return Result{Task: t, Outcome: OutcomeDrained, Released: true}
}

// Adopt moves an active task's attempt from a node's ended epoch to its new
// one: the agent was cut off, its lease lapsed, it registered again and
// still runs the attempt. It is refused (reason set, t unchanged) unless the
// task is still ASSIGNED or RUNNING on nodeID at oldEpoch with the same
// attempt and fencing token (a task whose token no report has recorded yet,
// 0, takes the caller's, which the caller compares with the assignment's
// CreateRevision), i.e. it was not reclaimed meanwhile.
func Adopt(t Task, nodeID string, oldEpoch int64, attempt int32, token, newEpoch int64) (Task, string) {
	switch {
	case !Active(t.State):
		return t, fmt.Sprintf("task is %s (reclaimed or finished)", t.State)
	case t.Attempt != attempt:
		return t, fmt.Sprintf("attempt %d superseded by attempt %d", attempt, t.Attempt)
	case t.NodeID != nodeID || t.NodeEpoch != oldEpoch:
		return t, fmt.Sprintf("attempt runs on %s epoch %d, not %s epoch %d", t.NodeID, t.NodeEpoch, nodeID, oldEpoch)
	case t.FencingToken != 0 && t.FencingToken != token:
		// 0: no report has recorded the token yet; the caller compares the
		// assignment's CreateRevision (the token) in the same Txn.
		return t, fmt.Sprintf("fencing token %d is not the attempt's %d", token, t.FencingToken)
	}
	t.NodeEpoch, t.FencingToken = newEpoch, token
	return t, ""
}

// Cancel applies a job cancellation to a task: a PENDING task is cancelled at
// once; an active one is marked so the agent kills it (cancel=true).
func Cancel(t Task, nowMs int64) (out Task, changed, kill bool) {
	switch {
	case Terminal(t.State):
		return t, false, false
	case t.State == apiaryv1.TaskState_TASK_STATE_PENDING:
		t.State, t.FinishedMs, t.UnplacedReason = apiaryv1.TaskState_TASK_STATE_CANCELLED, nowMs, ""
		return t, true, false
	case t.CancelRequested:
		return t, false, false
	default:
		t.CancelRequested = true
		return t, true, true
	}
}

// DependencyFailed fails a PENDING task whose task group comes after a
// group that can no longer complete (one of its tasks FAILED or
// CANCELLED): it never runs. changed is false for a task in any other
// state.
func DependencyFailed(t Task, group string, nowMs int64) (out Task, changed bool) {
	if t.State != apiaryv1.TaskState_TASK_STATE_PENDING {
		return t, false
	}
	t.State, t.FinishedMs, t.UnplacedReason = apiaryv1.TaskState_TASK_STATE_FAILED, nowMs, ""
	t.Error = fmt.Sprintf("not run: task group %s, which this group comes after, did not complete", group)
	return t, true
}

// startFailed applies a START_FAILED report (see the Fault rules in
// docs/architecture.md): a node fault (the agent's classification, or any
// start failure on a node the region blames) is nodeFault; a job fault (or
// an unclassified one) is terminal once it happened on JobFaultNodes
// distinct nodes, and before that retried without charge (one broken PATH
// must not fail a job, whatever its max_attempts); again on a node where it
// happened before, it is charged like a retryable exit.
func startFailed(t Task, p Policy, r Report, endMs, nowMs int64, rng *rand.Rand) Result {
	nodeID := t.NodeID
	if r.Fault == apiaryv1.FailureFault_FAILURE_FAULT_NODE || r.Blame == BlameNode {
		return nodeFault(t, p, endMs, nowMs, rng, fmt.Sprintf("could not start (node fault): %s", r.Error))
	}
	if slices.Contains(t.JobFaultOn, nodeID) {
		// Again on a node it failed on this way: no news, so charged
		// (else a task that only that node can take would loop).
		return withFault(retryOrFail(countFailure(t), p, endMs, nowMs, rng, fmt.Sprintf("could not start on node %s again (job fault): %s", nodeID, r.Error)),
			apiaryv1.FailureFault_FAILURE_FAULT_JOB)
	}
	t = countNodeFailure(t)
	t.JobFaultOn = append(slices.Clip(t.JobFaultOn), nodeID)
	if len(t.JobFaultOn) >= JobFaultNodes {
		t.Used++
		return withFault(failed(t, endMs, fmt.Sprintf("attempt %d could not start (job fault): %s; the command failed to start on %d distinct nodes (%s); not retried",
			t.Attempt, r.Error, len(t.JobFaultOn), strings.Join(t.JobFaultOn, ", "))), apiaryv1.FailureFault_FAILURE_FAULT_JOB)
	}
	delay := p.Backoff.Delay(int32(len(t.JobFaultOn)), rng)
	attempt := t.Attempt
	t = toPending(t, nowMs+delay.Milliseconds())
	t.Error = fmt.Sprintf("attempt %d could not start on node %s (job fault): %s; retrying on another node to confirm, not charged to max_attempts", attempt, nodeID, r.Error)
	return Result{Task: t, Outcome: OutcomeRetry, Released: true, Fault: apiaryv1.FailureFault_FAILURE_FAULT_UNCONFIRMED}
}

// nodeFault applies a failure that is the node's (what it did, e.g.
// "exited with code 1 on a node quarantined as an outlier"): the task
// returns to PENDING without charging Used, after a backoff, up to
// NodeFaultLimit(p) times; FailedOn counts it so that the retry goes to
// another node.
func nodeFault(t Task, p Policy, endMs, nowMs int64, rng *rand.Rand, what string) Result {
	nodeID := t.NodeID
	t = countNodeFailure(t)
	t.NodeFaults++
	if limit := NodeFaultLimit(p); t.NodeFaults > limit {
		return withFault(failed(t, endMs, fmt.Sprintf("attempt %d on node %s %s; %d node faults exceed the limit of %d (max(10, 3 x max_attempts)); not retried",
			t.Attempt, nodeID, what, t.NodeFaults, limit)), apiaryv1.FailureFault_FAILURE_FAULT_NODE)
	}
	delay := p.Backoff.Delay(t.NodeFaults, rng)
	attempt := t.Attempt
	t = toPending(t, nowMs+delay.Milliseconds())
	t.Error = fmt.Sprintf("attempt %d on node %s %s; retrying on another node, not charged to max_attempts", attempt, nodeID, what)
	return Result{Task: t, Outcome: OutcomeRetry, Released: true, Fault: apiaryv1.FailureFault_FAILURE_FAULT_NODE}
}

// unconfirmed applies a failure that would be final (what: "exited with
// code 1, which is not in retryable_exit_codes") on a node with no recent
// success: the first time it is retried on another node without charge;
// once it happened on JobFaultNodes distinct nodes, or twice on one node
// (no other could take it), it is final.
func unconfirmed(t Task, p Policy, endMs, nowMs int64, rng *rand.Rand, what string) Result {
	nodeID := t.NodeID
	if slices.Contains(t.JobFaultOn, nodeID) {
		// Again on the same node (no other could take it): final.
		t = countFailure(t)
		return withFault(failed(t, endMs, fmt.Sprintf("attempt %d on node %s %s; it failed this way on that node before; not retried",
			t.Attempt, nodeID, what)), apiaryv1.FailureFault_FAILURE_FAULT_JOB)
	}
	t.JobFaultOn = append(slices.Clip(t.JobFaultOn), nodeID)
	if len(t.JobFaultOn) >= JobFaultNodes {
		t = countFailure(t)
		return withFault(failed(t, endMs, fmt.Sprintf("attempt %d %s; confirmed on %d distinct nodes (%s); not retried",
			t.Attempt, what, len(t.JobFaultOn), strings.Join(t.JobFaultOn, ", "))), apiaryv1.FailureFault_FAILURE_FAULT_JOB)
	}
	t = countNodeFailure(t)
	delay := p.Backoff.Delay(int32(len(t.JobFaultOn)), rng)
	attempt := t.Attempt
	t = toPending(t, nowMs+delay.Milliseconds())
	t.Error = fmt.Sprintf("attempt %d on node %s %s; retrying once on another node to confirm (not charged)", attempt, nodeID, what)
	return Result{Task: t, Outcome: OutcomeRetry, Released: true, Fault: apiaryv1.FailureFault_FAILURE_FAULT_UNCONFIRMED}
}

// lastUnconfirmed reports whether a retryable failure (a retryable exit, a
// timeout) reported with BlameUnproven would spend the task's last attempt
// while no other node has seen the task fail: then it is confirmed on
// another node first (unconfirmed), as a non-retryable exit is, so that a
// host that just broke cannot spend a task's whole budget.
func lastUnconfirmed(t Task, p Policy, r Report) bool {
	if r.Blame != BlameUnproven || t.Used+1 < p.MaxAttempts {
		return false
	}
	for n := range t.FailedOn {
		if n != t.NodeID {
			return false
		}
	}
	for _, n := range t.JobFaultOn {
		if n != t.NodeID {
			return false
		}
	}
	return true
}

func withFault(res Result, f apiaryv1.FailureFault) Result {
	res.Fault = f
	return res
}

// countNodeFailure counts a failure of the task on its node (FailedOn)
// without charging its attempt budget.
func countNodeFailure(t Task) Task {
	// Copy before writing: t shares its maps with the caller's record.
	t.FailedOn = maps.Clone(t.FailedOn)
	if t.FailedOn == nil {
		t.FailedOn = map[string]int{}
	}
	t.FailedOn[t.NodeID]++
	return t
}

func countFailure(t Task) Task {
	t = countNodeFailure(t)
	t.Used++
	return t
}

func retryOrFail(t Task, p Policy, endMs, nowMs int64, rng *rand.Rand, what string) Result {
	if t.Used >= p.MaxAttempts {
		return failed(t, endMs, fmt.Sprintf("attempt %d: %s; max_attempts %d reached", t.Attempt, what, p.MaxAttempts))
	}
	delay := p.Backoff.Delay(t.Used, rng)
	t = toPending(t, nowMs+delay.Milliseconds())
	t.Error = fmt.Sprintf("attempt %d: %s; retrying", t.Attempt, what)
	return Result{Task: t, Outcome: OutcomeRetry, Released: true}
}

func failed(t Task, endMs int64, msg string) Result {
	t.State, t.FinishedMs, t.Error = apiaryv1.TaskState_TASK_STATE_FAILED, endMs, msg
	return Result{Task: t, Outcome: OutcomeFailed, Released: true}
}

func toPending(t Task, notBefore int64) Task {
	t.State = apiaryv1.TaskState_TASK_STATE_PENDING
	t.NotBeforeMs = notBefore
	t.NodeID, t.NodeEpoch, t.FencingToken = "", 0, 0
	t.AssignedMs, t.StartedMs, t.FinishedMs = 0, 0, 0
	t.FetchBytes = 0
	t.PreemptedBy = ""
	return t
}

func firstNonZero(a, b int64) int64 {
	if a != 0 {
		return a
	}
	return b
}

// JobState derives a job's state from its tasks' states: CANCELLED once a
// cancelled job has no active task; COMPLETE when every task is; FAILED when
// all are terminal and one failed; RUNNING when any task was dispatched or
// finished; else PENDING.
func JobState(cancelRequested bool, c *apiaryv1.TaskCounts) apiaryv1.JobState {
	total := c.Pending + c.Assigned + c.Running + c.Complete + c.Failed + c.Cancelled
	active := c.Pending + c.Assigned + c.Running
	switch {
	case total == 0:
		return apiaryv1.JobState_JOB_STATE_PENDING
	case cancelRequested && c.Assigned+c.Running == 0:
		return apiaryv1.JobState_JOB_STATE_CANCELLED
	case active == 0 && c.Complete == total:
		return apiaryv1.JobState_JOB_STATE_COMPLETE
	case active == 0 && c.Failed > 0:
		return apiaryv1.JobState_JOB_STATE_FAILED
	case active == 0:
		return apiaryv1.JobState_JOB_STATE_CANCELLED
	case c.Assigned+c.Running+c.Complete+c.Failed+c.Cancelled > 0:
		return apiaryv1.JobState_JOB_STATE_RUNNING
	}
	return apiaryv1.JobState_JOB_STATE_PENDING
}

// Count adds a task state to counts.
func Count(c *apiaryv1.TaskCounts, s apiaryv1.TaskState) {
	switch s {
	case apiaryv1.TaskState_TASK_STATE_PENDING:
		c.Pending++
	case apiaryv1.TaskState_TASK_STATE_ASSIGNED:
		c.Assigned++
	case apiaryv1.TaskState_TASK_STATE_RUNNING:
		c.Running++
	case apiaryv1.TaskState_TASK_STATE_COMPLETE:
		c.Complete++
	case apiaryv1.TaskState_TASK_STATE_FAILED:
		c.Failed++
	case apiaryv1.TaskState_TASK_STATE_CANCELLED:
		c.Cancelled++
	}
}
