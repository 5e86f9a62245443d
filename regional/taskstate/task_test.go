package taskstate

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

const (
	sPending   = apiaryv1.TaskState_TASK_STATE_PENDING
	sAssigned  = apiaryv1.TaskState_TASK_STATE_ASSIGNED
	sRunning   = apiaryv1.TaskState_TASK_STATE_RUNNING
	sComplete  = apiaryv1.TaskState_TASK_STATE_COMPLETE
	sFailed    = apiaryv1.TaskState_TASK_STATE_FAILED
	sCancelled = apiaryv1.TaskState_TASK_STATE_CANCELLED

	kStarted     = apiaryv1.ReportKind_REPORT_KIND_STARTED
	kExited      = apiaryv1.ReportKind_REPORT_KIND_EXITED
	kRefused     = apiaryv1.ReportKind_REPORT_KIND_REFUSED
	kTimedOut    = apiaryv1.ReportKind_REPORT_KIND_TIMED_OUT
	kStartFailed = apiaryv1.ReportKind_REPORT_KIND_START_FAILED
	kCancelled   = apiaryv1.ReportKind_REPORT_KIND_CANCELLED

	fNone        = apiaryv1.FailureFault_FAILURE_FAULT_UNSPECIFIED
	fNode        = apiaryv1.FailureFault_FAILURE_FAULT_NODE
	fJob         = apiaryv1.FailureFault_FAILURE_FAULT_JOB
	fUnconfirmed = apiaryv1.FailureFault_FAILURE_FAULT_UNCONFIRMED
)

const (
	now   int64 = 1_000_000
	node        = "n1"
	epoch int64 = 100
)

var alone = Loss{Alone: true}

var testPolicy = Policy{
	MaxAttempts:    3,
	RetryableCodes: []int32{75, 76},
	Backoff:        Backoff{Base: time.Second, Max: 10 * time.Second},
}

func newRNG(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)) }

// active returns a task in state s running attempt on (node, epoch) with used
// failed attempts behind it.
func active(s apiaryv1.TaskState, attempt, used int32) Task {
	t := Task{JobID: "j1", Index: 4, Group: 0, State: s, Attempt: attempt, Used: used,
		NodeID: node, NodeEpoch: epoch, FencingToken: 555, AssignedMs: now - 500}
	if s == sRunning {
		t.StartedMs = now - 400
	}
	return t
}

// report is a current (non-stale) report for t.
func report(t Task, k apiaryv1.ReportKind, code int32) Report {
	return Report{Kind: k, NodeID: t.NodeID, NodeEpoch: t.NodeEpoch, Attempt: t.Attempt, ExitCode: code}
}

func clone(t Task) Task {
	t.Excluded = maps.Clone(t.Excluded)
	t.FailedOn = maps.Clone(t.FailedOn)
	t.JobFaultOn = slices.Clone(t.JobFaultOn)
	return t
}

// ---- Assign ------------------------------------------------------------------

func TestAssign(t *testing.T) {
	in := Task{JobID: "j1", Index: 2, State: sPending, Attempt: 1, Used: 1, NotBeforeMs: now - 1,
		UnplacedReason: "no node fits", Excluded: map[string]int64{"n9": now + 10}}
	out, err := Assign(in, node, epoch, now)
	if err != nil {
		t.Fatalf("Assign from PENDING: %v", err)
	}
	if out.State != sAssigned || out.Attempt != 2 || out.NodeID != node || out.NodeEpoch != epoch {
		t.Fatalf("Assign: got state %s attempt %d node %s/%d", out.State, out.Attempt, out.NodeID, out.NodeEpoch)
	}
	if out.Used != 1 {
		t.Errorf("Assign changed Used: %d", out.Used)
	}
	if out.AssignedMs != now || out.StartedMs != 0 || out.FinishedMs != 0 || out.FencingToken != 0 {
		t.Errorf("Assign times/token: assigned %d started %d finished %d token %d", out.AssignedMs, out.StartedMs, out.FinishedMs, out.FencingToken)
	}
	if out.UnplacedReason != "" {
		t.Errorf("Assign kept UnplacedReason %q", out.UnplacedReason)
	}

	for _, s := range []apiaryv1.TaskState{sAssigned, sRunning, sComplete, sFailed, sCancelled, apiaryv1.TaskState_TASK_STATE_UNSPECIFIED} {
		in := active(s, 3, 0)
		out, err := Assign(in, "n2", 7, now)
		if err == nil {
			t.Errorf("Assign from %s: no error", s)
		}
		if !reflect.DeepEqual(out, in) {
			t.Errorf("Assign from %s changed the task: %+v", s, out)
		}
	}
}

// ---- ApplyReport: staleness ---------------------------------------------------

func TestApplyReportRejectsStale(t *testing.T) {
	kinds := []struct {
		kind apiaryv1.ReportKind
		code int32
	}{{kStarted, 0}, {kExited, 0}, {kExited, 1}, {kExited, 75}, {kRefused, 0}, {kTimedOut, 0}, {kStartFailed, 0}, {kCancelled, 0}}

	cases := []struct {
		name   string
		task   Task
		mutate func(*Report)
		alive  int64
		reason string
	}{
		{"terminal COMPLETE", active(sComplete, 2, 0), nil, epoch, "already TASK_STATE_COMPLETE"},
		{"terminal FAILED", active(sFailed, 2, 1), nil, epoch, "already TASK_STATE_FAILED"},
		{"terminal CANCELLED", active(sCancelled, 2, 0), nil, epoch, "already TASK_STATE_CANCELLED"},
		{"task is PENDING", Task{JobID: "j1", State: sPending, Attempt: 2, Used: 1}, func(r *Report) { r.NodeID, r.NodeEpoch = node, epoch }, epoch, "stale attempt"},
		{"older attempt", active(sRunning, 2, 1), func(r *Report) { r.Attempt = 1 }, epoch, "stale attempt 1: current attempt is 2"},
		{"newer attempt", active(sRunning, 2, 1), func(r *Report) { r.Attempt = 3 }, epoch, "stale attempt 3"},
		{"wrong node", active(sRunning, 2, 0), func(r *Report) { r.NodeID = "n2" }, epoch, "stale node epoch: report from n2"},
		{"wrong node epoch", active(sRunning, 2, 0), func(r *Report) { r.NodeEpoch = epoch - 1 }, epoch - 1, "stale node epoch"},
		{"node lease gone", active(sRunning, 2, 0), nil, 0, "node lease is gone"},
		{"node re-registered", active(sRunning, 2, 0), nil, epoch + 50, "node lease is gone"},
		{"ASSIGNED, lease gone", active(sAssigned, 1, 0), nil, 0, "node lease is gone"},
	}
	for _, c := range cases {
		for _, k := range kinds {
			t.Run(c.name+"/"+k.kind.String(), func(t *testing.T) {
				in := c.task
				in.FailedOn = map[string]int{node: 1}
				want := clone(in)
				r := report(in, k.kind, k.code)
				if c.mutate != nil {
					c.mutate(&r)
				}
				res := ApplyReport(in, testPolicy, r, c.alive, now, newRNG(1))
				if res.Rejected == "" {
					t.Fatalf("accepted: %+v", res)
				}
				if !strings.Contains(res.Rejected, c.reason) {
					t.Errorf("reason %q does not contain %q", res.Rejected, c.reason)
				}
				if !reflect.DeepEqual(res.Task, want) || !reflect.DeepEqual(in, want) {
					t.Errorf("task changed by a rejected report:\n got %+v\nwant %+v", res.Task, want)
				}
				if res.Outcome != "" || res.Released {
					t.Errorf("rejected report has outcome %q released %v", res.Outcome, res.Released)
				}
			})
		}
	}
}

func TestApplyReportDuplicateStartAndUnknownKind(t *testing.T) {
	in := active(sRunning, 1, 0)
	res := ApplyReport(in, testPolicy, report(in, kStarted, 0), epoch, now, newRNG(1))
	if res.Rejected != "" || !res.Duplicate || res.Outcome != "" || res.Released || !reflect.DeepEqual(res.Task, in) {
		t.Errorf("duplicate STARTED: %+v, want accepted as a duplicate, task unchanged", res)
	}
	res = ApplyReport(in, testPolicy, report(in, apiaryv1.ReportKind_REPORT_KIND_UNSPECIFIED, 0), epoch, now, newRNG(1))
	if !strings.Contains(res.Rejected, "unknown report kind") || !reflect.DeepEqual(res.Task, in) {
		t.Errorf("unknown kind: %+v", res)
	}
}

// ---- ApplyReport: transitions -------------------------------------------------

func TestApplyReportTransitions(t *testing.T) {
	type want struct {
		state    apiaryv1.TaskState
		outcome  string
		released bool
		used     int32
		err      []string // substrings of Task.Error
		backoff  bool     // NotBeforeMs in the backoff window of Used (of backoffN when set)
		backoffN int32
		finished int64
		fault    apiaryv1.FailureFault // Result.Fault
	}
	cancelReq := func(t Task) Task { t.CancelRequested = true; return t }
	cases := []struct {
		name string
		task Task
		pol  Policy
		r    func(Task) Report
		want want
	}{
		{"STARTED → RUNNING", active(sAssigned, 1, 0), testPolicy,
			func(t Task) Report { r := report(t, kStarted, 0); r.StartMs = now - 10; return r },
			want{state: sRunning}},
		{"EXITED 0 → COMPLETE", active(sRunning, 1, 0), testPolicy,
			func(t Task) Report { r := report(t, kExited, 0); r.EndMs = now - 5; return r },
			want{state: sComplete, outcome: OutcomeComplete, released: true, finished: now - 5}},
		{"EXITED 0 without STARTED → COMPLETE", active(sAssigned, 1, 0), testPolicy,
			func(t Task) Report { return report(t, kExited, 0) },
			want{state: sComplete, outcome: OutcomeComplete, released: true, finished: now}},
		{"EXITED 0 on the last attempt → COMPLETE", active(sRunning, 3, 2), testPolicy,
			func(t Task) Report { return report(t, kExited, 0) },
			want{state: sComplete, outcome: OutcomeComplete, released: true, used: 2, finished: now}},
		{"retryable exit → PENDING with backoff", active(sRunning, 1, 0), testPolicy,
			func(t Task) Report { return report(t, kExited, 75) },
			want{state: sPending, outcome: OutcomeRetry, released: true, used: 1, backoff: true, err: []string{"exit code 75", "retrying"}, fault: fJob}},
		{"second retryable exit → PENDING, longer backoff", active(sRunning, 2, 1), testPolicy,
			func(t Task) Report { return report(t, kExited, 76) },
			want{state: sPending, outcome: OutcomeRetry, released: true, used: 2, backoff: true, err: []string{"exit code 76"}, fault: fJob}},
		{"non-retryable exit → FAILED", active(sRunning, 1, 0), testPolicy,
			func(t Task) Report { return report(t, kExited, 1) },
			want{state: sFailed, outcome: OutcomeFailed, released: true, used: 1, finished: now, err: []string{"code 1", "not in retryable_exit_codes"}, fault: fJob}},
		{"non-retryable exit with no retryable codes → FAILED", active(sRunning, 1, 0), Policy{MaxAttempts: 5},
			func(t Task) Report { return report(t, kExited, 75) },
			want{state: sFailed, outcome: OutcomeFailed, released: true, used: 1, finished: now, err: []string{"not in retryable_exit_codes"}, fault: fJob}},
		{"retryable exit at max_attempts → FAILED", active(sRunning, 3, 2), testPolicy,
			func(t Task) Report { return report(t, kExited, 75) },
			want{state: sFailed, outcome: OutcomeFailed, released: true, used: 3, finished: now, err: []string{"max_attempts 3 reached"}, fault: fJob}},
		{"max_attempts 1: retryable exit → FAILED", active(sRunning, 1, 0), Policy{MaxAttempts: 1, RetryableCodes: []int32{75}},
			func(t Task) Report { return report(t, kExited, 75) },
			want{state: sFailed, outcome: OutcomeFailed, released: true, used: 1, finished: now, err: []string{"max_attempts 1 reached"}, fault: fJob}},
		{"TIMED_OUT within budget → PENDING", active(sRunning, 1, 0), testPolicy,
			func(t Task) Report { return report(t, kTimedOut, -1) },
			want{state: sPending, outcome: OutcomeTimeout, released: true, used: 1, backoff: true, err: []string{"timed out", "retrying"}, fault: fJob}},
		{"TIMED_OUT at max_attempts → FAILED", active(sRunning, 3, 2), testPolicy,
			func(t Task) Report { return report(t, kTimedOut, -1) },
			want{state: sFailed, outcome: OutcomeFailed, released: true, used: 3, finished: now, err: []string{"timed out", "max_attempts 3 reached"}, fault: fJob}},
		{"START_FAILED job fault on a first node → PENDING with backoff, not charged", active(sAssigned, 1, 0), testPolicy,
			func(t Task) Report {
				r := report(t, kStartFailed, 0)
				r.Error, r.Fault = "exec: no such file", apiaryv1.FailureFault_FAILURE_FAULT_JOB
				return r
			},
			want{state: sPending, outcome: OutcomeRetry, released: true, used: 0, backoff: true, backoffN: 1, fault: apiaryv1.FailureFault_FAILURE_FAULT_UNCONFIRMED,
				err: []string{"could not start on node n1", "job fault", "exec: no such file", "retrying on another node", "not charged to max_attempts"}}},
		{"START_FAILED unclassified (older agent) → treated as a job fault", active(sAssigned, 1, 0), testPolicy,
			func(t Task) Report { r := report(t, kStartFailed, 0); r.Error = "exec: no such file"; return r },
			want{state: sPending, outcome: OutcomeRetry, released: true, used: 0, backoff: true, backoffN: 1, fault: apiaryv1.FailureFault_FAILURE_FAULT_UNCONFIRMED, err: []string{"job fault", "not charged"}}},
		{"START_FAILED job fault with max_attempts 1 → PENDING, not charged", active(sAssigned, 1, 0), Policy{MaxAttempts: 1},
			func(t Task) Report {
				r := report(t, kStartFailed, 0)
				r.Fault = apiaryv1.FailureFault_FAILURE_FAULT_JOB
				return r
			},
			want{state: sPending, outcome: OutcomeRetry, released: true, used: 0, backoff: true, backoffN: 1, fault: apiaryv1.FailureFault_FAILURE_FAULT_UNCONFIRMED, err: []string{"job fault"}}},
		{"START_FAILED job fault on a second distinct node → FAILED", jobFaultOn(active(sAssigned, 2, 1), "n0"), testPolicy,
			func(t Task) Report {
				r := report(t, kStartFailed, 0)
				r.Error, r.Fault = "exec: no such file", apiaryv1.FailureFault_FAILURE_FAULT_JOB
				return r
			},
			want{state: sFailed, outcome: OutcomeFailed, released: true, used: 2, finished: now, fault: fJob, err: []string{"could not start", "exec: no such file", "2 distinct nodes (n0, n1)", "not retried"}}},
		{"START_FAILED job fault on a second node with max_attempts 1 → FAILED, charged", jobFaultOn(active(sAssigned, 2, 0), "n0"), Policy{MaxAttempts: 1},
			func(t Task) Report {
				r := report(t, kStartFailed, 0)
				r.Fault = apiaryv1.FailureFault_FAILURE_FAULT_JOB
				return r
			},
			want{state: sFailed, outcome: OutcomeFailed, released: true, used: 1, finished: now, fault: fJob, err: []string{"2 distinct nodes (n0, n1)"}}},
		{"START_FAILED job fault again on the same node → PENDING, charged", jobFaultOn(active(sAssigned, 2, 0), node), testPolicy,
			func(t Task) Report {
				r := report(t, kStartFailed, 0)
				r.Error, r.Fault = "exec: no such file", apiaryv1.FailureFault_FAILURE_FAULT_JOB
				return r
			},
			want{state: sPending, outcome: OutcomeRetry, released: true, used: 1, backoff: true, fault: fJob, err: []string{"on node n1 again", "job fault", "exec: no such file", "retrying"}}},
		{"START_FAILED job fault again on the same node at max_attempts → FAILED", jobFaultOn(active(sAssigned, 3, 2), node), testPolicy,
			func(t Task) Report {
				r := report(t, kStartFailed, 0)
				r.Fault = apiaryv1.FailureFault_FAILURE_FAULT_JOB
				return r
			},
			want{state: sFailed, outcome: OutcomeFailed, released: true, used: 3, finished: now, fault: fJob, err: []string{"again", "max_attempts 3 reached"}}},
		{"START_FAILED first job fault with one attempt left → PENDING, not charged", active(sAssigned, 3, 2), testPolicy,
			func(t Task) Report {
				r := report(t, kStartFailed, 0)
				r.Fault = apiaryv1.FailureFault_FAILURE_FAULT_JOB
				return r
			},
			want{state: sPending, outcome: OutcomeRetry, released: true, used: 2, backoff: true, backoffN: 1, fault: apiaryv1.FailureFault_FAILURE_FAULT_UNCONFIRMED, err: []string{"job fault", "not charged"}}},
		{"cancel requested, START_FAILED → CANCELLED", cancelReq(active(sAssigned, 1, 0)), testPolicy,
			func(t Task) Report {
				r := report(t, kStartFailed, 0)
				r.Fault = apiaryv1.FailureFault_FAILURE_FAULT_NODE
				return r
			},
			want{state: sCancelled, outcome: OutcomeCancelled, released: true, finished: now}},
		{"REFUSED → PENDING, not counted", active(sAssigned, 2, 1), testPolicy,
			func(t Task) Report { return report(t, kRefused, 0) },
			want{state: sPending, outcome: OutcomeRefused, released: true, used: 1}},
		{"CANCELLED report → CANCELLED", active(sRunning, 1, 0), testPolicy,
			func(t Task) Report { r := report(t, kCancelled, -1); r.EndMs = now - 3; return r },
			want{state: sCancelled, outcome: OutcomeCancelled, released: true, finished: now - 3}},
		{"cancel requested, exit non-zero → CANCELLED", cancelReq(active(sRunning, 1, 0)), testPolicy,
			func(t Task) Report { return report(t, kExited, 137) },
			want{state: sCancelled, outcome: OutcomeCancelled, released: true, finished: now}},
		{"cancel requested, retryable exit → CANCELLED, not retried", cancelReq(active(sRunning, 1, 0)), testPolicy,
			func(t Task) Report { return report(t, kExited, 75) },
			want{state: sCancelled, outcome: OutcomeCancelled, released: true, finished: now}},
		{"cancel requested, exit 0 → COMPLETE", cancelReq(active(sRunning, 1, 0)), testPolicy,
			func(t Task) Report { return report(t, kExited, 0) },
			want{state: sComplete, outcome: OutcomeComplete, released: true, finished: now}},
		{"cancel requested, TIMED_OUT → CANCELLED", cancelReq(active(sRunning, 1, 0)), testPolicy,
			func(t Task) Report { return report(t, kTimedOut, -1) },
			want{state: sCancelled, outcome: OutcomeCancelled, released: true, finished: now}},
		{"cancel requested, REFUSED → CANCELLED", cancelReq(active(sAssigned, 1, 0)), testPolicy,
			func(t Task) Report { return report(t, kRefused, 0) },
			want{state: sCancelled, outcome: OutcomeCancelled, released: true, finished: now}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for seed := uint64(0); seed < 20; seed++ {
				in := c.task
				res := ApplyReport(in, c.pol, c.r(in), epoch, now, newRNG(seed))
				if res.Rejected != "" {
					t.Fatalf("rejected: %s", res.Rejected)
				}
				got := res.Task
				if got.State != c.want.state || res.Outcome != c.want.outcome || res.Released != c.want.released || got.Used != c.want.used {
					t.Fatalf("got state %s outcome %q released %v used %d; want %s %q %v %d",
						got.State, res.Outcome, res.Released, got.Used, c.want.state, c.want.outcome, c.want.released, c.want.used)
				}
				if got.Attempt != in.Attempt {
					t.Errorf("attempt changed by a report: %d → %d", in.Attempt, got.Attempt)
				}
				for _, s := range c.want.err {
					if !strings.Contains(got.Error, s) {
						t.Errorf("error %q does not contain %q", got.Error, s)
					}
				}
				if Terminal(got.State) && got.FinishedMs != c.want.finished {
					t.Errorf("FinishedMs = %d, want %d", got.FinishedMs, c.want.finished)
				}
				if got.State == sPending {
					if got.NodeID != "" || got.NodeEpoch != 0 || got.FencingToken != 0 || got.AssignedMs != 0 || got.StartedMs != 0 {
						t.Errorf("PENDING task keeps its placement: %+v", got)
					}
				}
				if res.Fault != c.want.fault {
					t.Errorf("Fault = %s, want %s", res.Fault, c.want.fault)
				}
				if c.want.backoff {
					n := got.Used
					if c.want.backoffN != 0 {
						n = c.want.backoffN
					}
					d := boundOf(c.pol.Backoff, n)
					lo, hi := now+(d/2).Milliseconds(), now+d.Milliseconds()
					if got.NotBeforeMs < lo || got.NotBeforeMs > hi {
						t.Errorf("NotBeforeMs = now%+d, want in [now%+d, now%+d]", got.NotBeforeMs-now, lo-now, hi-now)
					}
				} else if got.State == sPending && got.NotBeforeMs != 0 {
					t.Errorf("NotBeforeMs = %d, want 0 (no backoff)", got.NotBeforeMs)
				}
			}
		})
	}
}

func jobFaultOn(t Task, nodes ...string) Task { t.JobFaultOn = nodes; return t }

func TestApplyReportStartFailedNodeFault(t *testing.T) {
	nodeFault := func(t Task) Report {
		r := report(t, kStartFailed, -1)
		r.Error, r.Fault = "work dir: mkdir /data/work/j1: not a directory", apiaryv1.FailureFault_FAILURE_FAULT_NODE
		return r
	}
	t.Run("retried without charging the budget, counted against the node", func(t *testing.T) {
		in := active(sAssigned, 2, 1)
		in.FailedOn = map[string]int{node: 1, "n0": 1}
		res := ApplyReport(in, testPolicy, nodeFault(in), epoch, now, newRNG(1))
		got := res.Task
		if got.State != sPending || res.Outcome != OutcomeRetry || !res.Released || res.Fault != fNode {
			t.Fatalf("got %s outcome %q released %v fault %s, want PENDING retry released NODE", got.State, res.Outcome, res.Released, res.Fault)
		}
		if got.Used != 1 || got.NodeFaults != 1 || got.FailedOn[node] != 2 || got.FailedOn["n0"] != 1 || len(got.JobFaultOn) != 0 {
			t.Fatalf("used %d nodeFaults %d failedOn %v jobFaultOn %v; want used 1 (not charged), nodeFaults 1, failedOn[n1] 2",
				got.Used, got.NodeFaults, got.FailedOn, got.JobFaultOn)
		}
		if got.NodeID != "" || got.NodeEpoch != 0 || got.FencingToken != 0 {
			t.Fatalf("PENDING task keeps its placement: %+v", got)
		}
		if d := boundOf(testPolicy.Backoff, 1); got.NotBeforeMs < now+(d/2).Milliseconds() || got.NotBeforeMs > now+d.Milliseconds() {
			t.Fatalf("NotBeforeMs now%+d, want the first backoff window", got.NotBeforeMs-now)
		}
		for _, s := range []string{"node fault", "n1", "not a directory", "not charged to max_attempts"} {
			if !strings.Contains(got.Error, s) {
				t.Errorf("error %q does not contain %q", got.Error, s)
			}
		}
	})
	t.Run("a spent budget does not fail a node fault", func(t *testing.T) {
		in := active(sAssigned, 5, 2)
		res := ApplyReport(in, testPolicy, nodeFault(in), epoch, now, newRNG(1))
		if res.Task.State != sPending || res.Task.Used != 2 {
			t.Fatalf("got %s used %d, want PENDING used 2", res.Task.State, res.Task.Used)
		}
	})
	for _, c := range []struct {
		max, limit int32
	}{{1, 10}, {3, 10}, {4, 12}, {10, 30}} {
		pol := Policy{MaxAttempts: c.max}
		if got := NodeFaultLimit(pol); got != c.limit {
			t.Fatalf("NodeFaultLimit(max_attempts %d) = %d, want %d", c.max, got, c.limit)
		}
		t.Run(fmt.Sprintf("bounded at %d retries for max_attempts %d", c.limit, c.max), func(t *testing.T) {
			task := Task{JobID: "j1", Index: 4, State: sPending}
			clock := now
			for i := int32(1); ; i++ {
				var err error
				if task, err = Assign(task, fmt.Sprintf("n%d", i%3), epoch, clock); err != nil {
					t.Fatal(err)
				}
				res := ApplyReport(task, pol, nodeFault(task), epoch, clock, newRNG(uint64(i)))
				task = res.Task
				if i <= c.limit {
					if task.State != sPending || task.Used != 0 {
						t.Fatalf("node fault %d of limit %d: %s used %d, want PENDING used 0", i, c.limit, task.State, task.Used)
					}
					clock = task.NotBeforeMs
					continue
				}
				if task.State != sFailed || res.Outcome != OutcomeFailed {
					t.Fatalf("node fault %d (limit %d): %s, want FAILED", i, c.limit, task.State)
				}
				want := fmt.Sprintf("%d node faults exceed the limit of %d", c.limit+1, c.limit)
				if !strings.Contains(task.Error, want) {
					t.Fatalf("error %q does not say %q", task.Error, want)
				}
				if task.Used != 0 || res.Fault != fNode || task.NodeFaults != c.limit+1 {
					t.Fatalf("past the limit: used %d fault %s nodeFaults %d; want used 0, NODE, %d", task.Used, res.Fault, task.NodeFaults, c.limit+1)
				}
				return
			}
		})
	}
}

// boundOf is the un-jittered backoff bound min(Max, Base*2^(n-1)).
func boundOf(b Backoff, n int32) time.Duration {
	if b.Base <= 0 {
		b = DefaultBackoff
	}
	d := b.Base
	for i := int32(1); i < n; i++ {
		d *= 2
		if d >= b.Max {
			return b.Max
		}
	}
	return min(d, b.Max)
}

// ---- ApplyReport: Blame (the region's verdict on the node) ----------------------

// blamed is a current report of kind/code on t with the region's blame b
// (and, for a start failure, the agent's fault f).
func blamed(t Task, kind apiaryv1.ReportKind, code int32, b Blame, f apiaryv1.FailureFault) Report {
	r := report(t, kind, code)
	r.Blame, r.Fault = b, f
	if kind == kStartFailed {
		r.Error = "exec: \"run.sh\": executable file not found in $PATH"
	}
	return r
}

// onNode assigns a PENDING task to nodeID (epoch) at now.
func onNode(t *testing.T, task Task, nodeID string) Task {
	t.Helper()
	out, err := Assign(task, nodeID, epoch, now)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A failure on a node the region blames (quarantined, or made an outlier by
// this failure) is the node's: retried elsewhere uncharged, counted against
// the node, bounded by NodeFaultLimit.
func TestApplyReportBlameNode(t *testing.T) {
	cases := []struct {
		name    string
		state   apiaryv1.TaskState
		kind    apiaryv1.ReportKind
		code    int32
		f       apiaryv1.FailureFault
		outcome string
		err     string
	}{
		{"non-retryable exit 1", sRunning, kExited, 1, fNone, OutcomeRetry, "exited with code 1 on a node quarantined as an outlier"},
		{"retryable exit 75", sRunning, kExited, 75, fNone, OutcomeRetry, "exited with code 75 on a node quarantined as an outlier"},
		{"timeout", sRunning, kTimedOut, -1, fNone, OutcomeTimeout, "timed out on a node quarantined as an outlier"},
		{"job-fault start failure", sAssigned, kStartFailed, 0, fJob, OutcomeRetry, "could not start (node fault): exec"},
		{"unclassified start failure", sAssigned, kStartFailed, 0, fNone, OutcomeRetry, "could not start (node fault)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, pol := range []Policy{testPolicy, {MaxAttempts: 1, RetryableCodes: []int32{75}, Backoff: testPolicy.Backoff}} {
				used := pol.MaxAttempts - 1 // one attempt left: a charge would fail it
				in := active(c.state, 2, used)
				in.FailedOn = map[string]int{node: 1, "n0": 1}
				in.JobFaultOn = []string{"n0"} // a second job fault would be final
				res := ApplyReport(in, pol, blamed(in, c.kind, c.code, BlameNode, c.f), epoch, now, newRNG(7))
				got := res.Task
				if res.Rejected != "" || got.State != sPending || res.Outcome != c.outcome || !res.Released || res.Fault != fNode {
					t.Fatalf("max_attempts %d: got %s outcome %q released %v fault %s rejected %q; want PENDING %q released NODE",
						pol.MaxAttempts, got.State, res.Outcome, res.Released, res.Fault, res.Rejected, c.outcome)
				}
				if got.Used != used || got.NodeFaults != 1 || got.FailedOn[node] != 2 || got.FailedOn["n0"] != 1 ||
					!slices.Equal(got.JobFaultOn, []string{"n0"}) || got.NodeFailures != 0 {
					t.Fatalf("used %d nodeFaults %d failedOn %v jobFaultOn %v nodeFailures %d; want used %d (uncharged), nodeFaults 1, failedOn[n1] 2, jobFaultOn [n0]",
						got.Used, got.NodeFaults, got.FailedOn, got.JobFaultOn, got.NodeFailures, used)
				}
				if got.NodeID != "" || got.NodeEpoch != 0 || got.Attempt != 2 {
					t.Fatalf("PENDING task keeps its placement or changed attempt: %+v", got)
				}
				if d := boundOf(pol.Backoff, 1); got.NotBeforeMs < now+(d/2).Milliseconds() || got.NotBeforeMs > now+d.Milliseconds() {
					t.Errorf("NotBeforeMs now%+d, want the first backoff window (%v)", got.NotBeforeMs-now, d)
				}
				for _, s := range []string{c.err, "attempt 2 on node n1", "retrying on another node", "not charged to max_attempts"} {
					if !strings.Contains(got.Error, s) {
						t.Errorf("error %q does not contain %q", got.Error, s)
					}
				}
			}
		})
		t.Run(c.name+", bounded by NodeFaultLimit", func(t *testing.T) {
			pol := Policy{MaxAttempts: 2, RetryableCodes: []int32{75}}
			limit := NodeFaultLimit(pol) // 10
			task := Task{JobID: "j1", Index: 4, State: sPending}
			for i := int32(1); i <= limit+1; i++ {
				task = onNode(t, task, fmt.Sprintf("n%d", i%4))
				if c.state == sRunning {
					task = ApplyReport(task, pol, report(task, kStarted, 0), epoch, now, newRNG(1)).Task
				}
				res := ApplyReport(task, pol, blamed(task, c.kind, c.code, BlameNode, c.f), epoch, now, newRNG(uint64(i)))
				task = res.Task
				if res.Fault != fNode || task.Used != 0 || task.NodeFaults != i {
					t.Fatalf("node fault %d: fault %s used %d nodeFaults %d; want NODE, 0, %d", i, res.Fault, task.Used, task.NodeFaults, i)
				}
				if i <= limit {
					if task.State != sPending {
						t.Fatalf("node fault %d of limit %d: %s, want PENDING", i, limit, task.State)
					}
					continue
				}
				want := fmt.Sprintf("%d node faults exceed the limit of %d", limit+1, limit)
				if task.State != sFailed || res.Outcome != OutcomeFailed || !strings.Contains(task.Error, want) {
					t.Fatalf("node fault %d (limit %d): %s outcome %q error %q; want FAILED saying %q", i, limit, task.State, res.Outcome, task.Error, want)
				}
			}
		})
	}
}

// A non-retryable exit on a node with no recent success (BlameUnproven) is
// confirmed on a second distinct node before it is final.
func TestApplyReportBlameUnproven(t *testing.T) {
	pol := Policy{MaxAttempts: 1, RetryableCodes: []int32{75}, Backoff: testPolicy.Backoff}
	exit1 := func(t *testing.T, task Task, nodeID string, b Blame) Result {
		t.Helper()
		task = onNode(t, task, nodeID)
		res := ApplyReport(task, pol, blamed(task, kExited, 1, b, fNone), epoch, now, newRNG(3))
		if res.Rejected != "" {
			t.Fatalf("rejected: %s", res.Rejected)
		}
		return res
	}
	fresh := Task{JobID: "j1", Index: 4, State: sPending}

	first := exit1(t, fresh, "n1", BlameUnproven)
	t.Run("first node: retried, not charged", func(t *testing.T) {
		got := first.Task
		if got.State != sPending || first.Outcome != OutcomeRetry || !first.Released || first.Fault != fUnconfirmed {
			t.Fatalf("got %s outcome %q released %v fault %s; want PENDING retry released UNCONFIRMED", got.State, first.Outcome, first.Released, first.Fault)
		}
		if got.Used != 0 || got.NodeFaults != 0 || got.FailedOn["n1"] != 1 || !slices.Equal(got.JobFaultOn, []string{"n1"}) {
			t.Fatalf("used %d nodeFaults %d failedOn %v jobFaultOn %v; want 0, 0, n1:1, [n1]", got.Used, got.NodeFaults, got.FailedOn, got.JobFaultOn)
		}
		if d := boundOf(pol.Backoff, 1); got.NotBeforeMs < now+(d/2).Milliseconds() || got.NotBeforeMs > now+d.Milliseconds() {
			t.Errorf("NotBeforeMs now%+d, want the first backoff window", got.NotBeforeMs-now)
		}
		for _, s := range []string{"attempt 1 on node n1", "exited with code 1", "not in retryable_exit_codes", "retrying once on another node to confirm", "not charged"} {
			if !strings.Contains(got.Error, s) {
				t.Errorf("error %q does not contain %q", got.Error, s)
			}
		}
	})
	t.Run("second distinct node: FAILED, charged, both nodes named", func(t *testing.T) {
		res := exit1(t, first.Task, "n2", BlameUnproven)
		got := res.Task
		if got.State != sFailed || res.Outcome != OutcomeFailed || res.Fault != fJob || got.Used != 1 || got.FinishedMs != now {
			t.Fatalf("got %s outcome %q fault %s used %d finished %d; want FAILED failed JOB used 1", got.State, res.Outcome, res.Fault, got.Used, got.FinishedMs)
		}
		if !slices.Equal(got.JobFaultOn, []string{"n1", "n2"}) || got.FailedOn["n1"] != 1 || got.FailedOn["n2"] != 1 {
			t.Fatalf("jobFaultOn %v failedOn %v", got.JobFaultOn, got.FailedOn)
		}
		for _, s := range []string{"attempt 2", "exited with code 1", "confirmed on 2 distinct nodes (n1, n2)", "not retried"} {
			if !strings.Contains(got.Error, s) {
				t.Errorf("error %q does not contain %q", got.Error, s)
			}
		}
	})
	t.Run("second node trusted: FAILED at once", func(t *testing.T) {
		res := exit1(t, first.Task, "n2", BlameNone)
		if res.Task.State != sFailed || res.Fault != fJob || res.Task.Used != 1 || !slices.Equal(res.Task.JobFaultOn, []string{"n1"}) {
			t.Fatalf("got %s fault %s used %d jobFaultOn %v; want FAILED JOB used 1 [n1]", res.Task.State, res.Fault, res.Task.Used, res.Task.JobFaultOn)
		}
	})
	t.Run("second node blamed: a node fault, still uncharged", func(t *testing.T) {
		res := exit1(t, first.Task, "n2", BlameNode)
		if res.Task.State != sPending || res.Fault != fNode || res.Task.Used != 0 || res.Task.NodeFaults != 1 {
			t.Fatalf("got %s fault %s used %d nodeFaults %d; want PENDING NODE used 0 nodeFaults 1", res.Task.State, res.Fault, res.Task.Used, res.Task.NodeFaults)
		}
	})
	t.Run("the same node again: final (no other node could confirm)", func(t *testing.T) {
		res := exit1(t, first.Task, "n1", BlameUnproven)
		got := res.Task
		if got.State != sFailed || res.Outcome != OutcomeFailed || res.Fault != fJob || got.Used != 1 {
			t.Fatalf("got %s outcome %q fault %s used %d; want FAILED failed JOB used 1", got.State, res.Outcome, res.Fault, got.Used)
		}
		if !slices.Equal(got.JobFaultOn, []string{"n1"}) || got.FailedOn["n1"] != 2 {
			t.Fatalf("jobFaultOn %v failedOn %v; want [n1], n1:2", got.JobFaultOn, got.FailedOn)
		}
		for _, s := range []string{"attempt 2 on node n1", "exited with code 1", "failed this way on that node before", "not retried"} {
			if !strings.Contains(got.Error, s) {
				t.Errorf("error %q does not contain %q", got.Error, s)
			}
		}
	})
	t.Run("after a job-fault start failure on another node: confirmed", func(t *testing.T) {
		task := onNode(t, fresh, "n1")
		sf := ApplyReport(task, pol, blamed(task, kStartFailed, 0, BlameNone, fJob), epoch, now, newRNG(1))
		if sf.Task.State != sPending || sf.Task.Used != 0 {
			t.Fatalf("first job-fault start failure: %s used %d", sf.Task.State, sf.Task.Used)
		}
		res := exit1(t, sf.Task, "n2", BlameUnproven)
		if res.Task.State != sFailed || res.Fault != fJob || !strings.Contains(res.Task.Error, "(n1, n2)") {
			t.Fatalf("got %s fault %s error %q; want FAILED JOB on (n1, n2)", res.Task.State, res.Fault, res.Task.Error)
		}
	})
	t.Run("retryable exit and timeout: charged unless it would spend the last attempt unconfirmed", func(t *testing.T) {
		for _, c := range []struct {
			kind apiaryv1.ReportKind
			code int32
		}{{kExited, 75}, {kTimedOut, -1}} {
			// The last attempt, no other node saw it fail: confirmed
			// elsewhere first, not charged.
			task := onNode(t, fresh, "n1")
			res := ApplyReport(task, pol, blamed(task, c.kind, c.code, BlameUnproven, fNone), epoch, now, newRNG(1))
			if res.Task.State != sPending || res.Task.Used != 0 || res.Fault != fUnconfirmed || !slices.Equal(res.Task.JobFaultOn, []string{"n1"}) ||
				!strings.Contains(res.Task.Error, "would spend the last of max_attempts") {
				t.Errorf("%s %d, max_attempts 1: got %s used %d fault %s jobFaultOn %v error %q; want PENDING used 0 UNCONFIRMED",
					c.kind, c.code, res.Task.State, res.Task.Used, res.Fault, res.Task.JobFaultOn, res.Task.Error)
			}
			// Confirmed on a second node: charged, so FAILED at max_attempts.
			second := onNode(t, res.Task, "n2")
			res = ApplyReport(second, pol, blamed(second, c.kind, c.code, BlameUnproven, fNone), epoch, now, newRNG(1))
			if res.Task.State != sFailed || res.Task.Used != 1 || res.Fault != fJob {
				t.Errorf("%s %d, max_attempts 1, second node: got %s used %d fault %s error %q; want FAILED used 1 JOB",
					c.kind, c.code, res.Task.State, res.Task.Used, res.Fault, res.Task.Error)
			}
			// Trusted (BlameNone, a region of one node): charged as usual.
			res = ApplyReport(task, pol, blamed(task, c.kind, c.code, BlameNone, fNone), epoch, now, newRNG(1))
			if res.Task.State != sFailed || res.Task.Used != 1 || res.Fault != fJob || !strings.Contains(res.Task.Error, "max_attempts 1 reached") {
				t.Errorf("%s %d, max_attempts 1, not blamed: got %s used %d fault %s; want FAILED used 1 JOB", c.kind, c.code, res.Task.State, res.Task.Used, res.Fault)
			}
			// Budget left: retried, charged.
			res = ApplyReport(task, testPolicy, blamed(task, c.kind, c.code, BlameUnproven, fNone), epoch, now, newRNG(1))
			if res.Task.State != sPending || res.Task.Used != 1 || res.Fault != fJob || len(res.Task.JobFaultOn) != 0 {
				t.Errorf("%s %d, max_attempts 3: got %s used %d fault %s jobFaultOn %v; want PENDING used 1 JOB",
					c.kind, c.code, res.Task.State, res.Task.Used, res.Fault, res.Task.JobFaultOn)
			}
		}
	})
	t.Run("job-fault start failure: as when trusted", func(t *testing.T) {
		task := onNode(t, fresh, "n1")
		for _, f := range []apiaryv1.FailureFault{fJob, fNone} {
			want := ApplyReport(task, pol, blamed(task, kStartFailed, 0, BlameNone, f), epoch, now, newRNG(1))
			got := ApplyReport(task, pol, blamed(task, kStartFailed, 0, BlameUnproven, f), epoch, now, newRNG(1))
			if !reflect.DeepEqual(got, want) {
				t.Errorf("agent fault %s: unproven %+v, trusted %+v", f, got, want)
			}
			if got.Task.State != sPending || got.Task.Used != 0 || got.Fault != apiaryv1.FailureFault_FAILURE_FAULT_UNCONFIRMED {
				t.Errorf("agent fault %s: %s used %d fault %s; want PENDING used 0 UNCONFIRMED", f, got.Task.State, got.Task.Used, got.Fault)
			}
		}
	})
}

// A task whose job was cancelled ends CANCELLED on any failure report,
// whatever the blame: nothing is charged or counted, and there is no Fault.
// Reports that are not failures ignore the blame.
func TestApplyReportBlameIgnored(t *testing.T) {
	failures := []struct {
		kind apiaryv1.ReportKind
		code int32
		f    apiaryv1.FailureFault
	}{{kExited, 1, fNone}, {kExited, 75, fNone}, {kExited, 137, fNone}, {kTimedOut, -1, fNone}, {kStartFailed, 0, fJob}, {kStartFailed, 0, fNode}, {kStartFailed, 0, fNone}}
	for _, b := range []Blame{BlameNone, BlameUnproven, BlameNode} {
		for _, c := range failures {
			in := active(sRunning, 2, 1)
			in.CancelRequested = true
			in.FailedOn = map[string]int{node: 1}
			in.JobFaultOn = []string{"n0"}
			res := ApplyReport(in, testPolicy, blamed(in, c.kind, c.code, b, c.f), epoch, now, newRNG(1))
			got := res.Task
			if got.State != sCancelled || res.Outcome != OutcomeCancelled || !res.Released || res.Fault != fNone {
				t.Errorf("blame %d, %s %d: got %s outcome %q fault %s; want CANCELLED cancelled, no fault", b, c.kind, c.code, got.State, res.Outcome, res.Fault)
			}
			if got.Used != 1 || got.NodeFaults != 0 || got.FailedOn[node] != 1 || !slices.Equal(got.JobFaultOn, []string{"n0"}) {
				t.Errorf("blame %d, %s %d: used %d nodeFaults %d failedOn %v jobFaultOn %v; want nothing counted",
					b, c.kind, c.code, got.Used, got.NodeFaults, got.FailedOn, got.JobFaultOn)
			}
		}
	}
	others := []struct {
		kind  apiaryv1.ReportKind
		state apiaryv1.TaskState
	}{
		{kStarted, sAssigned}, {kExited, sRunning}, {kRefused, sAssigned}, {kCancelled, sRunning},
		{apiaryv1.ReportKind_REPORT_KIND_DRAINED, sRunning}, {apiaryv1.ReportKind_REPORT_KIND_LOST, sRunning},
	}
	for _, b := range []Blame{BlameUnproven, BlameNode} {
		for _, c := range others {
			in := active(c.state, 2, 1)
			want := ApplyReport(in, testPolicy, blamed(in, c.kind, 0, BlameNone, fNone), epoch, now, newRNG(1))
			got := ApplyReport(in, testPolicy, blamed(in, c.kind, 0, b, fNone), epoch, now, newRNG(1))
			if !reflect.DeepEqual(got, want) || got.Fault != fNone || got.Rejected != "" {
				t.Errorf("blame %d, %s: %+v; want as unblamed %+v, no fault", b, c.kind, got, want)
			}
		}
	}
}

func TestApplyReportStarted(t *testing.T) {
	in := active(sAssigned, 1, 0)
	res := ApplyReport(in, testPolicy, report(in, kStarted, 0), epoch, now, newRNG(1))
	if res.Task.State != sRunning || res.Task.StartedMs != now || res.Outcome != "" || res.Released {
		t.Errorf("STARTED without StartMs: %+v", res)
	}
	r := report(in, kStarted, 0)
	r.StartMs = now - 77
	res = ApplyReport(in, testPolicy, r, epoch, now, newRNG(1))
	if res.Task.StartedMs != now-77 {
		t.Errorf("StartedMs = %d, want the agent's start time %d", res.Task.StartedMs, now-77)
	}
}

func TestApplyReportRefusedExcludesNode(t *testing.T) {
	in := active(sAssigned, 2, 1)
	in.Excluded = map[string]int64{"n7": now + 5}
	res := ApplyReport(in, testPolicy, report(in, kRefused, 0), epoch, now, newRNG(1))
	got := res.Task
	if got.Excluded[node] != now+RefusalExclusion.Milliseconds() {
		t.Errorf("Excluded[%s] = %d, want now+%d", node, got.Excluded[node], RefusalExclusion.Milliseconds())
	}
	if got.Excluded["n7"] != now+5 {
		t.Errorf("earlier exclusion lost: %v", got.Excluded)
	}
	if got.Used != 1 || got.Attempt != 2 || len(got.FailedOn) != 0 {
		t.Errorf("refusal counted as a failure: used %d attempt %d failedOn %v", got.Used, got.Attempt, got.FailedOn)
	}
	if got.NotBeforeMs != 0 {
		t.Errorf("refusal backed off: NotBeforeMs %d", got.NotBeforeMs)
	}
}

func TestApplyReportCountsFailurePerNode(t *testing.T) {
	in := active(sRunning, 1, 0)
	in.FailedOn = map[string]int{node: 2, "n2": 1}
	res := ApplyReport(in, testPolicy, report(in, kExited, 75), epoch, now, newRNG(1))
	if got := res.Task.FailedOn; got[node] != 3 || got["n2"] != 1 {
		t.Errorf("FailedOn = %v", got)
	}
}

// A non-retryable failure is never retried, whatever budget is left.
func TestNonRetryableNeverRetried(t *testing.T) {
	pol := Policy{MaxAttempts: 100, RetryableCodes: []int32{75}}
	for code := int32(-2); code < 260; code++ {
		if code == 0 || code == 75 {
			continue
		}
		in := active(sRunning, 1, 0)
		res := ApplyReport(in, pol, report(in, kExited, code), epoch, now, newRNG(uint64(code+10)))
		if res.Task.State != sFailed {
			t.Fatalf("exit %d: state %s, want FAILED", code, res.Task.State)
		}
	}
}

// The functions work on a copy: the caller's record, including its maps, is
// not modified (the coordinator keeps the input as its cache until the Txn
// commits).
func TestInputNotModified(t *testing.T) {
	base := active(sRunning, 1, 0)
	base.Excluded = map[string]int64{"n7": now + 5}
	base.FailedOn = map[string]int{node: 1}
	for _, k := range []struct {
		kind apiaryv1.ReportKind
		code int32
	}{{kExited, 75}, {kExited, 1}, {kTimedOut, 0}, {kStartFailed, 0}, {kRefused, 0}, {kExited, 0}} {
		in := clone(base)
		ApplyReport(in, testPolicy, report(in, k.kind, k.code), epoch, now, newRNG(1))
		if !reflect.DeepEqual(in, base) {
			t.Errorf("ApplyReport %s/%d modified its input: %+v", k.kind, k.code, in)
		}
	}
	// Appending to JobFaultOn must not write into the caller's array, spare
	// capacity included (a node-fault, unconfirmed and job-fault failure each
	// record the node).
	for _, b := range []Blame{BlameNone, BlameUnproven, BlameNode} {
		for _, k := range []apiaryv1.ReportKind{kExited, kStartFailed, kTimedOut} {
			backing := []string{"n0", "spare"}
			in := clone(base)
			in.JobFaultOn = backing[:1]
			r := report(in, k, 1)
			r.Blame = b
			res := ApplyReport(in, testPolicy, r, epoch, now, newRNG(1))
			if backing[1] != "spare" || len(in.JobFaultOn) != 1 || in.FailedOn[node] != 1 {
				t.Errorf("ApplyReport %s blame %d wrote into its input: backing %v, FailedOn %v (result jobFaultOn %v)", k, b, backing, in.FailedOn, res.Task.JobFaultOn)
			}
		}
	}
	in := clone(base)
	NodeLost(in, testPolicy, node, epoch, Loss{Alone: true}, now)
	if !reflect.DeepEqual(in, base) {
		t.Errorf("NodeLost modified its input: %+v", in)
	}
}

// ---- NodeLost -------------------------------------------------------------------

func TestNodeLost(t *testing.T) {
	cancelReq := func(t Task) Task { t.CancelRequested = true; return t }
	withNF := func(t Task, nf int32) Task { t.NodeFailures = nf; return t }
	cases := []struct {
		name     string
		task     Task
		pol      Policy
		loss     Loss
		state    apiaryv1.TaskState
		used, nf int32
		err      []string
		outcome  string
	}{
		{"RUNNING alone → PENDING, charged", active(sRunning, 1, 0), testPolicy, alone, sPending, 1, 1, nil, OutcomeLost},
		{"ASSIGNED alone → PENDING, charged", active(sAssigned, 1, 0), testPolicy, alone, sPending, 1, 1, nil, OutcomeLost},
		{"lost with others → PENDING, not charged", active(sRunning, 1, 0), testPolicy, Loss{}, sPending, 0, 1, nil, OutcomeLost},
		{"max_attempts 1 survives a shared loss", active(sRunning, 1, 0), Policy{MaxAttempts: 1}, Loss{}, sPending, 0, 1, nil, OutcomeLost},
		{"killed worker at KilledWorkerLimit", withNF(active(sRunning, 2, 1), 1), Policy{MaxAttempts: 5, KilledWorkerLimit: 2}, alone, sFailed, 2, 2,
			[]string{"killed worker", "lost 2 times", node}, OutcomeLost},
		{"killed worker limit defaults to max(3, max_attempts)", withNF(active(sRunning, 3, 0), 2), Policy{MaxAttempts: 1}, Loss{}, sFailed, 0, 3,
			[]string{"killed worker"}, OutcomeLost},
		{"killed worker limit max_attempts when larger", withNF(active(sRunning, 3, 0), 3), Policy{MaxAttempts: 5}, Loss{}, sPending, 0, 4, nil, OutcomeLost},
		{"below killed worker limit → PENDING", withNF(active(sRunning, 2, 1), 1), Policy{MaxAttempts: 5, KilledWorkerLimit: 3}, alone, sPending, 2, 2, nil, OutcomeLost},
		{"max_attempts reached alone → FAILED", active(sRunning, 3, 2), Policy{MaxAttempts: 3, KilledWorkerLimit: 10}, alone, sFailed, 3, 1,
			[]string{"max_attempts 3 reached", node}, OutcomeLost},
		{"drained → PENDING, nothing counted", withNF(active(sRunning, 3, 2), 2), Policy{MaxAttempts: 3}, Loss{Drained: true}, sPending, 2, 2, nil, OutcomeDrained},
		{"cancel requested → CANCELLED", cancelReq(active(sRunning, 1, 0)), testPolicy, alone, sCancelled, 0, 0, nil, OutcomeCancelled},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res, ok := NodeLost(c.task, c.pol, node, epoch, c.loss, now)
			if !ok {
				t.Fatal("ok = false")
			}
			got := res.Task
			if got.State != c.state || got.Used != c.used || got.NodeFailures != c.nf || res.Outcome != c.outcome || !res.Released {
				t.Fatalf("got state %s used %d nodeFailures %d outcome %q released %v; want %s %d %d %q",
					got.State, got.Used, got.NodeFailures, res.Outcome, res.Released, c.state, c.used, c.nf, c.outcome)
			}
			if got.Attempt != c.task.Attempt {
				t.Errorf("attempt changed: %d", got.Attempt)
			}
			for _, s := range c.err {
				if !strings.Contains(got.Error, s) {
					t.Errorf("error %q does not contain %q", got.Error, s)
				}
			}
			if got.State == sPending && (got.NotBeforeMs != 0 || got.NodeID != "" || got.NodeEpoch != 0) {
				t.Errorf("PENDING after node loss: NotBeforeMs %d node %s/%d", got.NotBeforeMs, got.NodeID, got.NodeEpoch)
			}
			if want := map[bool]int{true: 1, false: 0}[c.loss.Alone && c.state != sCancelled && !c.loss.Drained]; got.FailedOn[node] != want {
				t.Errorf("FailedOn = %v", got.FailedOn)
			}
			if Terminal(got.State) && got.FinishedMs != now {
				t.Errorf("FinishedMs = %d", got.FinishedMs)
			}
		})
	}
}

func TestNodeLostIgnoresOtherTasks(t *testing.T) {
	cases := []struct {
		name  string
		task  Task
		node  string
		epoch int64
	}{
		{"older epoch", active(sRunning, 1, 0), node, epoch - 1},
		{"newer epoch", active(sRunning, 1, 0), node, epoch + 1},
		{"other node", active(sRunning, 1, 0), "n2", epoch},
		{"PENDING", Task{JobID: "j1", State: sPending, Attempt: 1}, node, epoch},
		{"COMPLETE", active(sComplete, 1, 0), node, epoch},
		{"FAILED", active(sFailed, 1, 1), node, epoch},
		{"CANCELLED", active(sCancelled, 1, 0), node, epoch},
	}
	for _, c := range cases {
		res, ok := NodeLost(c.task, testPolicy, c.node, c.epoch, Loss{Alone: true}, now)
		if ok || !reflect.DeepEqual(res.Task, c.task) || res.Outcome != "" || res.Released {
			t.Errorf("%s: ok %v result %+v", c.name, ok, res)
		}
	}
}

func TestDrainedReport(t *testing.T) {
	in := active(sRunning, 2, 1)
	in.NodeFailures = 1
	res := ApplyReport(in, testPolicy, report(in, apiaryv1.ReportKind_REPORT_KIND_DRAINED, 0), epoch, now, newRNG(1))
	got := res.Task
	if res.Rejected != "" || got.State != sPending || got.Used != 1 || got.NodeFailures != 1 || got.FailedOn[node] != 0 ||
		res.Outcome != OutcomeDrained || !res.Released || got.NotBeforeMs != 0 || got.Attempt != 2 {
		t.Fatalf("DRAINED: %+v outcome %q rejected %q", got, res.Outcome, res.Rejected)
	}
	c := active(sRunning, 1, 0)
	c.CancelRequested = true
	if res := ApplyReport(c, testPolicy, report(c, apiaryv1.ReportKind_REPORT_KIND_DRAINED, 0), epoch, now, newRNG(1)); res.Task.State != sCancelled {
		t.Fatalf("DRAINED of a cancelled task: %s", res.Task.State)
	}
	stale := report(in, apiaryv1.ReportKind_REPORT_KIND_DRAINED, 0)
	stale.NodeEpoch++
	if res := ApplyReport(in, testPolicy, stale, epoch, now, newRNG(1)); res.Rejected == "" {
		t.Fatal("DRAINED from another epoch accepted")
	}
}

func TestLostReport(t *testing.T) {
	in := active(sRunning, 1, 0)
	res := ApplyReport(in, Policy{MaxAttempts: 1}, report(in, apiaryv1.ReportKind_REPORT_KIND_LOST, 0), epoch, now, newRNG(1))
	got := res.Task
	if res.Rejected != "" || got.State != sPending || got.Used != 0 || got.NodeFailures != 1 || got.FailedOn[node] != 0 || res.Outcome != OutcomeLost {
		t.Fatalf("LOST: %+v outcome %q rejected %q", got, res.Outcome, res.Rejected)
	}
}

func TestAdopt(t *testing.T) {
	in := active(sRunning, 2, 0)
	in.FencingToken = 77
	got, why := Adopt(in, node, epoch, 2, 77, epoch+10)
	if why != "" || got.NodeEpoch != epoch+10 || got.State != sRunning || got.Attempt != 2 || got.FencingToken != 77 {
		t.Fatalf("Adopt: %+v %q", got, why)
	}
	if in.NodeEpoch != epoch {
		t.Fatal("Adopt modified its input")
	}
	// A task no report has given its token yet (0) takes the agent's.
	fresh := in
	fresh.FencingToken = 0
	if got, why := Adopt(fresh, node, epoch, 2, 77, epoch+10); why != "" || got.FencingToken != 77 || got.NodeEpoch != epoch+10 {
		t.Fatalf("Adopt of a token-less task: %+v %q", got, why)
	}
	pending := in
	pending.State = sPending
	for name, c := range map[string]struct {
		t       Task
		node    string
		old     int64
		attempt int32
		token   int64
		want    string
	}{
		"reclaimed":     {pending, node, epoch, 2, 77, "reclaimed"},
		"newer attempt": {in, node, epoch, 1, 77, "superseded"},
		"other node":    {in, "n9", epoch, 2, 77, "not n9"},
		"other epoch":   {in, node, epoch - 1, 2, 77, "epoch"},
		"other token":   {in, node, epoch, 2, 78, "fencing token"},
		"finished":      {active(sComplete, 2, 0), node, epoch, 2, 0, "COMPLETE"},
	} {
		got, why := Adopt(c.t, c.node, c.old, c.attempt, c.token, epoch+10)
		if why == "" || !strings.Contains(why, c.want) || !reflect.DeepEqual(got, c.t) {
			t.Errorf("%s: adopted or wrong reason %q (want %q), task %+v", name, why, c.want, got)
		}
	}
}

// ---- Cancel -----------------------------------------------------------------------

func TestCancel(t *testing.T) {
	pending := Task{JobID: "j1", State: sPending, Attempt: 1, UnplacedReason: "no node fits"}
	out, changed, kill := Cancel(pending, now)
	if out.State != sCancelled || !changed || kill || out.FinishedMs != now || out.UnplacedReason != "" {
		t.Errorf("PENDING: %+v changed %v kill %v", out, changed, kill)
	}

	for _, s := range []apiaryv1.TaskState{sAssigned, sRunning} {
		in := active(s, 1, 0)
		out, changed, kill := Cancel(in, now)
		if out.State != s || !out.CancelRequested || !changed || !kill {
			t.Errorf("%s: state %s cancel %v changed %v kill %v", s, out.State, out.CancelRequested, changed, kill)
		}
		// A second cancel is a no-op.
		again, changed, kill := Cancel(out, now+1)
		if changed || kill || !reflect.DeepEqual(again, out) {
			t.Errorf("%s: second cancel changed %v kill %v", s, changed, kill)
		}
	}

	for _, s := range []apiaryv1.TaskState{sComplete, sFailed, sCancelled} {
		in := active(s, 1, 0)
		out, changed, kill := Cancel(in, now)
		if changed || kill || !reflect.DeepEqual(out, in) {
			t.Errorf("%s: changed %v kill %v out %+v", s, changed, kill, out)
		}
	}
}

// ---- Backoff ----------------------------------------------------------------------

func TestBackoffDelayBounds(t *testing.T) {
	b := Backoff{Base: 100 * time.Millisecond, Max: 5 * time.Second}
	rng := newRNG(42)
	for n := int32(1); n <= 12; n++ {
		d := boundOf(b, n)
		lo, hi := time.Duration(1<<62), time.Duration(0)
		for range 2000 {
			got := b.Delay(n, rng)
			if got < d/2 || got > d {
				t.Fatalf("Delay(%d) = %v, want in [%v, %v]", n, got, d/2, d)
			}
			lo, hi = min(lo, got), max(hi, got)
		}
		// The jitter spans the window, not one point of it.
		if lo > d/2+d/10 || hi < d-d/10 {
			t.Errorf("Delay(%d): observed [%v, %v], window [%v, %v]", n, lo, hi, d/2, d)
		}
	}
}

func TestBackoffDelayGrowsAndCaps(t *testing.T) {
	b := Backoff{Base: 100 * time.Millisecond, Max: 5 * time.Second}
	want := []time.Duration{100, 200, 400, 800, 1600, 3200, 5000, 5000}
	for i, w := range want {
		n := int32(i + 1)
		w *= time.Millisecond
		if got := boundOf(b, n); got != w {
			t.Fatalf("bound(%d) = %v, want %v", n, got, w)
		}
		// The largest delay drawn over many samples is the bound (within 1%).
		rng := newRNG(uint64(n))
		hi := time.Duration(0)
		for range 3000 {
			d := b.Delay(n, rng)
			if d > w {
				t.Fatalf("Delay(%d) = %v > %v", n, d, w)
			}
			hi = max(hi, d)
		}
		if hi < w*99/100 {
			t.Errorf("Delay(%d): max over samples %v, want about %v", n, hi, w)
		}
	}
	// Far past the cap: still capped, no overflow.
	for _, n := range []int32{64, 1000, 1 << 30} {
		if d := b.Delay(n, newRNG(1)); d < b.Max/2 || d > b.Max {
			t.Errorf("Delay(%d) = %v, want in [%v, %v]", n, d, b.Max/2, b.Max)
		}
	}
	// Max below Base: Max wins.
	small := Backoff{Base: time.Second, Max: 300 * time.Millisecond}
	if d := small.Delay(1, newRNG(1)); d < 150*time.Millisecond || d > 300*time.Millisecond {
		t.Errorf("Max < Base: Delay(1) = %v", d)
	}
}

func TestBackoffDefault(t *testing.T) {
	var zero Backoff
	for n := int32(1); n <= 20; n++ {
		d := boundOf(DefaultBackoff, n)
		got := zero.Delay(n, newRNG(uint64(n)))
		if got < d/2 || got > d {
			t.Errorf("zero Backoff: Delay(%d) = %v, want DefaultBackoff window [%v, %v]", n, got, d/2, d)
		}
	}
}

// ---- JobState ---------------------------------------------------------------------

func TestJobState(t *testing.T) {
	type tc = apiaryv1.TaskCounts
	cases := []struct {
		name   string
		cancel bool
		c      *tc
		want   apiaryv1.JobState
	}{
		{"no tasks", false, &tc{}, apiaryv1.JobState_JOB_STATE_PENDING},
		{"no tasks, cancelled", true, &tc{}, apiaryv1.JobState_JOB_STATE_PENDING},
		{"all pending", false, &tc{Pending: 5}, apiaryv1.JobState_JOB_STATE_PENDING},
		{"one assigned", false, &tc{Pending: 4, Assigned: 1}, apiaryv1.JobState_JOB_STATE_RUNNING},
		{"one running", false, &tc{Running: 1}, apiaryv1.JobState_JOB_STATE_RUNNING},
		{"pending after a completion", false, &tc{Pending: 1, Complete: 1}, apiaryv1.JobState_JOB_STATE_RUNNING},
		{"pending after a failure", false, &tc{Pending: 1, Failed: 1}, apiaryv1.JobState_JOB_STATE_RUNNING},
		{"pending after a cancellation", false, &tc{Pending: 1, Cancelled: 1}, apiaryv1.JobState_JOB_STATE_RUNNING},
		{"running with a failure", false, &tc{Running: 1, Failed: 1}, apiaryv1.JobState_JOB_STATE_RUNNING},
		{"all complete", false, &tc{Complete: 3}, apiaryv1.JobState_JOB_STATE_COMPLETE},
		{"complete and failed", false, &tc{Complete: 2, Failed: 1}, apiaryv1.JobState_JOB_STATE_FAILED},
		{"all failed", false, &tc{Failed: 2}, apiaryv1.JobState_JOB_STATE_FAILED},
		{"failed and cancelled", false, &tc{Failed: 1, Cancelled: 1}, apiaryv1.JobState_JOB_STATE_FAILED},
		{"complete and cancelled", false, &tc{Complete: 1, Cancelled: 1}, apiaryv1.JobState_JOB_STATE_CANCELLED},
		{"all cancelled", false, &tc{Cancelled: 2}, apiaryv1.JobState_JOB_STATE_CANCELLED},
		{"cancel requested, tasks running", true, &tc{Running: 1, Cancelled: 1}, apiaryv1.JobState_JOB_STATE_RUNNING},
		{"cancel requested, tasks assigned", true, &tc{Assigned: 1}, apiaryv1.JobState_JOB_STATE_RUNNING},
		{"cancel requested, only pending left", true, &tc{Pending: 2}, apiaryv1.JobState_JOB_STATE_CANCELLED},
		{"cancel requested, all cancelled", true, &tc{Cancelled: 3}, apiaryv1.JobState_JOB_STATE_CANCELLED},
		{"cancel requested, some failed", true, &tc{Failed: 1, Cancelled: 2}, apiaryv1.JobState_JOB_STATE_CANCELLED},
		{"cancel requested, all complete", true, &tc{Complete: 2}, apiaryv1.JobState_JOB_STATE_CANCELLED},
	}
	for _, c := range cases {
		if got := JobState(c.cancel, c.c); got != c.want {
			t.Errorf("%s: JobState = %s, want %s", c.name, got, c.want)
		}
	}
}

func TestCount(t *testing.T) {
	var c apiaryv1.TaskCounts
	for _, s := range []apiaryv1.TaskState{sPending, sPending, sAssigned, sRunning, sComplete, sComplete, sComplete, sFailed, sCancelled, apiaryv1.TaskState_TASK_STATE_UNSPECIFIED} {
		Count(&c, s)
	}
	if c.Pending != 2 || c.Assigned != 1 || c.Running != 1 || c.Complete != 3 || c.Failed != 1 || c.Cancelled != 1 {
		t.Errorf("Count: %+v", &c)
	}
}

func TestTerminalActive(t *testing.T) {
	for s, want := range map[apiaryv1.TaskState][2]bool{
		sPending: {false, false}, sAssigned: {false, true}, sRunning: {false, true},
		sComplete: {true, false}, sFailed: {true, false}, sCancelled: {true, false},
	} {
		if Terminal(s) != want[0] || Active(s) != want[1] {
			t.Errorf("%s: Terminal %v Active %v, want %v", s, Terminal(s), Active(s), want)
		}
	}
}

// ---- property ---------------------------------------------------------------------

// TestPropertySequences drives one task through any sequence of plans,
// reports (current or stale), node losses and cancels, as the coordinator
// could see them, and checks the invariants after every step.
func TestPropertySequences(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		pol := Policy{
			MaxAttempts:       int32(rapid.IntRange(1, 5).Draw(rt, "max_attempts")),
			KilledWorkerLimit: int32(rapid.IntRange(0, 4).Draw(rt, "killed_worker_limit")),
			RetryableCodes:    rapid.SliceOfDistinct(rapid.Int32Range(1, 4), rapid.ID[int32]).Draw(rt, "retryable"),
			Backoff:           Backoff{Base: time.Duration(rapid.IntRange(0, 1000).Draw(rt, "base")) * time.Millisecond, Max: 5 * time.Second},
		}
		rng := newRNG(rapid.Uint64().Draw(rt, "seed"))
		nodes := []string{"a", "b", "c"}
		// alive epoch of each node; 0 = lease gone. Re-registration gives a
		// new, larger epoch.
		alive := map[string]int64{"a": 10, "b": 20, "c": 30}
		nextEpoch := int64(100)
		task := Task{JobID: "j", Index: 0, State: sPending}
		clock := now

		steps := rapid.IntRange(1, 60).Draw(rt, "steps")
		for i := 0; i < steps; i++ {
			clock += int64(rapid.IntRange(0, 2000).Draw(rt, "dt"))
			prev := clone(task)
			in := clone(task)
			var next Task
			rejected := false
			switch op := rapid.IntRange(0, 5).Draw(rt, "op"); op {
			case 0: // plan
				n := rapid.SampledFrom(nodes).Draw(rt, "plan_node")
				if alive[n] == 0 {
					continue
				}
				out, err := Assign(in, n, alive[n], clock)
				if err != nil {
					if task.State == sPending {
						rt.Fatalf("Assign from PENDING failed: %v", err)
					}
					rejected = true
				}
				next = out
			case 1, 2: // report
				r := Report{
					Kind:      rapid.SampledFrom([]apiaryv1.ReportKind{kStarted, kExited, kExited, kRefused, kTimedOut, kStartFailed, kCancelled}).Draw(rt, "kind"),
					NodeID:    task.NodeID,
					NodeEpoch: task.NodeEpoch,
					Attempt:   task.Attempt,
					ExitCode:  int32(rapid.IntRange(0, 5).Draw(rt, "code")),
					Fault:     rapid.SampledFrom([]apiaryv1.FailureFault{fNone, fNode, fNode, fJob}).Draw(rt, "fault"),
					Blame:     rapid.SampledFrom([]Blame{BlameNone, BlameUnproven, BlameNode}).Draw(rt, "blame"),
				}
				if rapid.Bool().Draw(rt, "stale") {
					switch rapid.IntRange(0, 2).Draw(rt, "stale_kind") {
					case 0:
						r.Attempt += int32(rapid.IntRange(-2, 2).Draw(rt, "attempt_delta"))
					case 1:
						r.NodeID = rapid.SampledFrom(nodes).Draw(rt, "report_node")
					case 2:
						r.NodeEpoch += int64(rapid.IntRange(-1, 1).Draw(rt, "epoch_delta"))
					}
				}
				res := ApplyReport(in, pol, r, alive[r.NodeID], clock, rng)
				next, rejected = res.Task, res.Rejected != ""
				current := r.Attempt == task.Attempt && r.NodeID == task.NodeID && r.NodeEpoch == task.NodeEpoch &&
					alive[r.NodeID] == r.NodeEpoch && Active(task.State)
				if !current && !rejected {
					rt.Fatalf("stale report %+v accepted on %+v", r, task)
				}
				if rejected && res.Rejected == "" {
					rt.Fatalf("rejected without a reason")
				}
				if !rejected {
					checkFailure(rt, pol, task, r, res)
				}
			case 3: // node loss: lease gone, reclaim its tasks of that epoch
				n := rapid.SampledFrom(nodes).Draw(rt, "lost_node")
				lostEpoch := alive[n]
				alive[n] = 0
				loss := Loss{Alone: rapid.Bool().Draw(rt, "alone"), Drained: rapid.Bool().Draw(rt, "drained")}
				res, ok := NodeLost(in, pol, n, lostEpoch, loss, clock)
				next, rejected = res.Task, !ok
				if res.Fault != fNone {
					rt.Fatalf("node loss has Fault %s", res.Fault)
				}
				if ok != (Active(task.State) && task.NodeID == n && task.NodeEpoch == lostEpoch && lostEpoch != 0) {
					rt.Fatalf("NodeLost(%s, %d) ok=%v on %+v", n, lostEpoch, ok, task)
				}
			case 4: // node re-registers with a new epoch
				n := rapid.SampledFrom(nodes).Draw(rt, "reg_node")
				if alive[n] == 0 {
					nextEpoch++
					alive[n] = nextEpoch
				}
				continue
			case 5:
				out, changed, _ := Cancel(in, clock)
				next, rejected = out, !changed
			}

			if !reflect.DeepEqual(in, prev) {
				rt.Fatalf("input modified:\n was %+v\n now %+v", prev, in)
			}
			if rejected && !reflect.DeepEqual(next, prev) {
				rt.Fatalf("rejected step changed the task:\n was %+v\n now %+v", prev, next)
			}
			if Terminal(prev.State) && !reflect.DeepEqual(next, prev) {
				rt.Fatalf("terminal task changed:\n was %+v\n now %+v", prev, next)
			}
			if next.Attempt < prev.Attempt {
				rt.Fatalf("attempt decreased %d → %d", prev.Attempt, next.Attempt)
			}
			if next.Used < prev.Used {
				rt.Fatalf("used decreased %d → %d", prev.Used, next.Used)
			}
			if next.Used > pol.MaxAttempts {
				rt.Fatalf("used %d > max_attempts %d: %+v", next.Used, pol.MaxAttempts, next)
			}
			if next.Used > next.Attempt {
				rt.Fatalf("used %d > attempt %d", next.Used, next.Attempt)
			}
			if Active(next.State) && (next.NodeID == "" || next.NodeEpoch == 0) {
				rt.Fatalf("active task without node: %+v", next)
			}
			if next.State == sPending && next.NodeID != "" {
				rt.Fatalf("pending task keeps node: %+v", next)
			}
			if next.State == sPending && next.Used >= pol.MaxAttempts {
				rt.Fatalf("pending task with spent budget: %+v", next)
			}
			if next.NodeFaults > NodeFaultLimit(pol)+1 || (!Terminal(next.State) && next.NodeFaults > NodeFaultLimit(pol)) {
				rt.Fatalf("node faults %d past the limit %d: %+v", next.NodeFaults, NodeFaultLimit(pol), next)
			}
			if len(next.JobFaultOn) > JobFaultNodes || (!Terminal(next.State) && len(next.JobFaultOn) >= JobFaultNodes) {
				rt.Fatalf("job faults on %v and not failed: %+v", next.JobFaultOn, next)
			}
			if len(slices.Compact(slices.Sorted(slices.Values(next.JobFaultOn)))) != len(next.JobFaultOn) {
				rt.Fatalf("JobFaultOn has duplicates: %v", next.JobFaultOn)
			}
			task = next
		}
	})
}

// onlyFailedOn reports whether every failure of task so far (FailedOn,
// JobFaultOn) happened on node.
func onlyFailedOn(task Task, node string) bool {
	for n := range task.FailedOn {
		if n != node {
			return false
		}
	}
	for _, n := range task.JobFaultOn {
		if n != node {
			return false
		}
	}
	return true
}

// checkFailure checks an accepted report r's result res on task (the
// property's step): who is charged for a failed attempt, and Result.Fault.
func checkFailure(rt *rapid.T, pol Policy, task Task, r Report, res Result) {
	next, node := res.Task, task.NodeID
	failure := !task.CancelRequested &&
		(r.Kind == kExited && r.ExitCode != 0 || r.Kind == kTimedOut || r.Kind == kStartFailed)
	if failure != (res.Fault != fNone) {
		rt.Fatalf("%s (exit %d, cancel %v): Fault %s, outcome %q; want a fault iff the attempt failed",
			r.Kind, r.ExitCode, task.CancelRequested, res.Fault, res.Outcome)
	}
	if !failure {
		if next.NodeFaults != task.NodeFaults || !slices.Equal(next.JobFaultOn, task.JobFaultOn) {
			rt.Fatalf("%s that is not a failure counted a fault: nodeFaults %d → %d, jobFaultOn %v → %v",
				r.Kind, task.NodeFaults, next.NodeFaults, task.JobFaultOn, next.JobFaultOn)
		}
		return
	}
	if next.FailedOn[node] != task.FailedOn[node]+1 {
		rt.Fatalf("%s not counted against %s: %v → %v", r.Kind, node, task.FailedOn, next.FailedOn)
	}
	retryable := r.Kind == kExited && slices.Contains(pol.RetryableCodes, r.ExitCode)
	wantUsed := task.Used + 1
	want := fJob
	switch {
	case r.Blame == BlameNode || r.Kind == kStartFailed && r.Fault == fNode:
		wantUsed, want = task.Used, fNode
		if next.NodeFaults != task.NodeFaults+1 {
			rt.Fatalf("node fault: nodeFaults %d → %d", task.NodeFaults, next.NodeFaults)
		}
	case r.Kind == kStartFailed:
		// A job fault: uncharged on a first node, final on a second
		// distinct one, charged as usual again on the same node.
		if !slices.Contains(task.JobFaultOn, node) {
			if !slices.Contains(next.JobFaultOn, node) {
				rt.Fatalf("job-fault start failure on %s not recorded: %v", node, next.JobFaultOn)
			}
			if len(next.JobFaultOn) < JobFaultNodes {
				wantUsed, want = task.Used, fUnconfirmed
				if next.State != sPending {
					rt.Fatalf("first job-fault start failure: %s, want PENDING", next.State)
				}
			} else if next.State != sFailed {
				rt.Fatalf("job-fault start failure on %v: %s, want FAILED", next.JobFaultOn, next.State)
			}
		}
	case r.Kind == kExited && r.Blame == BlameUnproven && !retryable:
		if !slices.Contains(task.JobFaultOn, node) && len(task.JobFaultOn)+1 < JobFaultNodes {
			wantUsed, want = task.Used, fUnconfirmed
			if next.State != sPending {
				rt.Fatalf("unconfirmed exit %d: %s, want PENDING", r.ExitCode, next.State)
			}
		} else if next.State != sFailed {
			rt.Fatalf("exit %d confirmed (jobFaultOn %v, on %s): %s, want FAILED", r.ExitCode, task.JobFaultOn, node, next.State)
		}
	case (r.Kind == kExited || r.Kind == kTimedOut) && r.Blame == BlameUnproven && task.Used+1 >= pol.MaxAttempts && onlyFailedOn(task, node):
		// A retryable failure that would spend the last attempt, seen on
		// no other node: confirmed elsewhere first.
		if !slices.Contains(task.JobFaultOn, node) {
			wantUsed, want = task.Used, fUnconfirmed
			if next.State != sPending {
				rt.Fatalf("last-attempt %s unconfirmed: %s, want PENDING", r.Kind, next.State)
			}
		} else if next.State != sFailed {
			rt.Fatalf("last-attempt %s again on %s: %s, want FAILED", r.Kind, node, next.State)
		}
	}
	if r.Blame == BlameNode && next.Used != task.Used {
		rt.Fatalf("%s blamed on the node charged the task: used %d → %d", r.Kind, task.Used, next.Used)
	}
	if next.Used != wantUsed || res.Fault != want {
		rt.Fatalf("%s (exit %d, blame %d, agent fault %s, jobFaultOn %v): used %d → %d, Fault %s; want used %d, Fault %s",
			r.Kind, r.ExitCode, r.Blame, r.Fault, task.JobFaultOn, task.Used, next.Used, res.Fault, wantUsed, want)
	}
	if want != fNode && next.NodeFaults != task.NodeFaults {
		rt.Fatalf("%s not blamed on the node counted a node fault: %d → %d", r.Kind, task.NodeFaults, next.NodeFaults)
	}
}

// TestPreemptTransitions: a preempted attempt's end, whatever it is (a
// cancel report, a kill's non-zero exit, a timeout, a node loss), requeues
// its task at once without charge and says by whom; a success still
// completes; a task reserves at most MaxReservations times per placement
// and never while it holds one.
func TestPreemptTransitions(t *testing.T) {
	running := Task{JobID: "j", State: apiaryv1.TaskState_TASK_STATE_RUNNING, Attempt: 2, Used: 1, NodeID: "n", NodeEpoch: 5}
	p := Policy{MaxAttempts: 2}
	v, err := Preempt(running, "job u task 0 (priority 90, urgent)")
	if err != nil || v.PreemptedBy == "" {
		t.Fatalf("Preempt: %v %+v", err, v)
	}
	if _, err := Preempt(v, "again"); err == nil {
		t.Error("a task being preempted was preempted twice")
	}
	if _, err := Preempt(Task{State: apiaryv1.TaskState_TASK_STATE_PENDING}, "x"); err == nil {
		t.Error("a PENDING task was preempted")
	}
	if c, _, _ := Cancel(running, 1); c.CancelRequested {
		if _, err := Preempt(c, "x"); err == nil {
			t.Error("a task being cancelled was preempted")
		}
	}
	for _, r := range []Report{
		{Kind: apiaryv1.ReportKind_REPORT_KIND_CANCELLED},
		{Kind: apiaryv1.ReportKind_REPORT_KIND_EXITED, ExitCode: 143},
		{Kind: apiaryv1.ReportKind_REPORT_KIND_TIMED_OUT},
		{Kind: apiaryv1.ReportKind_REPORT_KIND_LOST},
	} {
		r.NodeID, r.NodeEpoch, r.Attempt = "n", 5, 2
		res := ApplyReport(v, p, r, 5, 100, rand.New(rand.NewPCG(1, 2)))
		if res.Outcome != OutcomePreempted || res.Task.State != apiaryv1.TaskState_TASK_STATE_PENDING || res.Task.Used != 1 ||
			res.Task.NotBeforeMs != 0 || res.Task.PreemptedBy != "" || !strings.Contains(res.Task.Error, "attempt 2 preempted by job u task 0") {
			t.Errorf("%s: outcome %q task %+v; want preempted, PENDING at once, Used 1, naming the preemptor", r.Kind, res.Outcome, res.Task)
		}
	}
	done := ApplyReport(v, p, Report{Kind: apiaryv1.ReportKind_REPORT_KIND_EXITED, NodeID: "n", NodeEpoch: 5, Attempt: 2}, 5, 100, rand.New(rand.NewPCG(1, 2)))
	if done.Task.State != apiaryv1.TaskState_TASK_STATE_COMPLETE {
		t.Errorf("a preempted attempt that exited 0 first: %+v, want COMPLETE", done.Task)
	}
	lost, ok := NodeLost(v, p, "n", 5, Loss{Alone: true}, 100)
	if !ok || lost.Outcome != OutcomePreempted || lost.Task.Used != 1 || lost.Task.NodeFailures != 0 {
		t.Errorf("node lost under a preempted attempt: %+v, want preempted, not charged, no node failure", lost)
	}

	pre := Task{JobID: "u", State: apiaryv1.TaskState_TASK_STATE_PENDING, Attempt: 0}
	r, err := Reserve(pre, Reservation{NodeID: "n", NodeEpoch: 5}, "preempting")
	if err != nil || r.PreemptedFor != 1 || r.Reservation == nil {
		t.Fatalf("Reserve: %v %+v", err, r)
	}
	ended, changed := EndReservation(r, "gone")
	if !changed || ended.Reservation != nil || ended.UnplacedReason != "gone" {
		t.Fatalf("EndReservation: %+v", ended)
	}
	// A reservation that ended without the placement lets it preempt
	// again, up to MaxReservations times for the placement.
	again := ended
	for k := 2; k <= MaxReservations; k++ {
		r2, err := Reserve(again, Reservation{NodeID: "n"}, "again")
		if err != nil || r2.Reservations != int32(k) || r2.PreemptedFor != 1 {
			t.Fatalf("reservation %d for one placement: %v %+v", k, err, r2)
		}
		if _, err := Reserve(r2, Reservation{NodeID: "m"}, "while holding one"); err == nil {
			t.Fatal("a task holding a reservation reserved again")
		}
		again, _ = EndReservation(r2, "gone")
	}
	if MayPreempt(again) {
		t.Error("MayPreempt after MaxReservations for one placement")
	}
	if _, err := Reserve(again, Reservation{NodeID: "n"}, "again"); err == nil {
		t.Errorf("reservation %d for one placement accepted", MaxReservations+1)
	}
	a, err := Assign(r, "n", 5, 10)
	if err != nil || a.Reservation != nil {
		t.Fatalf("Assign of a reserved task: %v %+v", err, a)
	}
	if _, err := Reserve(toPending(a, 0), Reservation{NodeID: "n"}, "next placement"); err != nil {
		t.Errorf("the next placement may preempt again: %v", err)
	}
}
