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

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"pgregory.net/rapid"
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
	if !strings.Contains(res.Rejected, "duplicate start") || !reflect.DeepEqual(res.Task, in) {
		t.Errorf("duplicate STARTED: %+v", res)
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
		backoff  bool     // NotBeforeMs in the backoff window of Used
		finished int64
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
			want{state: sPending, outcome: OutcomeRetry, released: true, used: 1, backoff: true, err: []string{"exit code 75", "retrying"}}},
		{"second retryable exit → PENDING, longer backoff", active(sRunning, 2, 1), testPolicy,
			func(t Task) Report { return report(t, kExited, 76) },
			want{state: sPending, outcome: OutcomeRetry, released: true, used: 2, backoff: true, err: []string{"exit code 76"}}},
		{"non-retryable exit → FAILED", active(sRunning, 1, 0), testPolicy,
			func(t Task) Report { return report(t, kExited, 1) },
			want{state: sFailed, outcome: OutcomeFailed, released: true, used: 1, finished: now, err: []string{"code 1", "not in retryable_exit_codes"}}},
		{"non-retryable exit with no retryable codes → FAILED", active(sRunning, 1, 0), Policy{MaxAttempts: 5},
			func(t Task) Report { return report(t, kExited, 75) },
			want{state: sFailed, outcome: OutcomeFailed, released: true, used: 1, finished: now, err: []string{"not in retryable_exit_codes"}}},
		{"retryable exit at max_attempts → FAILED", active(sRunning, 3, 2), testPolicy,
			func(t Task) Report { return report(t, kExited, 75) },
			want{state: sFailed, outcome: OutcomeFailed, released: true, used: 3, finished: now, err: []string{"max_attempts 3 reached"}}},
		{"max_attempts 1: retryable exit → FAILED", active(sRunning, 1, 0), Policy{MaxAttempts: 1, RetryableCodes: []int32{75}},
			func(t Task) Report { return report(t, kExited, 75) },
			want{state: sFailed, outcome: OutcomeFailed, released: true, used: 1, finished: now, err: []string{"max_attempts 1 reached"}}},
		{"TIMED_OUT within budget → PENDING", active(sRunning, 1, 0), testPolicy,
			func(t Task) Report { return report(t, kTimedOut, -1) },
			want{state: sPending, outcome: OutcomeTimeout, released: true, used: 1, backoff: true, err: []string{"timed out", "retrying"}}},
		{"TIMED_OUT at max_attempts → FAILED", active(sRunning, 3, 2), testPolicy,
			func(t Task) Report { return report(t, kTimedOut, -1) },
			want{state: sFailed, outcome: OutcomeFailed, released: true, used: 3, finished: now, err: []string{"timed out", "max_attempts 3 reached"}}},
		{"START_FAILED job fault on a first node → PENDING with backoff", active(sAssigned, 1, 0), testPolicy,
			func(t Task) Report {
				r := report(t, kStartFailed, 0)
				r.Error, r.Fault = "exec: no such file", apiaryv1.FailureFault_FAILURE_FAULT_JOB
				return r
			},
			want{state: sPending, outcome: OutcomeRetry, released: true, used: 1, backoff: true, err: []string{"could not start", "job fault", "exec: no such file", "retrying"}}},
		{"START_FAILED unclassified (older agent) → treated as a job fault", active(sAssigned, 1, 0), testPolicy,
			func(t Task) Report { r := report(t, kStartFailed, 0); r.Error = "exec: no such file"; return r },
			want{state: sPending, outcome: OutcomeRetry, released: true, used: 1, backoff: true, err: []string{"job fault", "retrying"}}},
		{"START_FAILED job fault on a second distinct node → FAILED", jobFaultOn(active(sAssigned, 2, 1), "n0"), testPolicy,
			func(t Task) Report {
				r := report(t, kStartFailed, 0)
				r.Error, r.Fault = "exec: no such file", apiaryv1.FailureFault_FAILURE_FAULT_JOB
				return r
			},
			want{state: sFailed, outcome: OutcomeFailed, released: true, used: 2, finished: now, err: []string{"could not start", "exec: no such file", "2 distinct nodes (n0, n1)", "not retried"}}},
		{"START_FAILED job fault again on the same node → PENDING", jobFaultOn(active(sAssigned, 2, 1), node), testPolicy,
			func(t Task) Report {
				r := report(t, kStartFailed, 0)
				r.Fault = apiaryv1.FailureFault_FAILURE_FAULT_JOB
				return r
			},
			want{state: sPending, outcome: OutcomeRetry, released: true, used: 2, backoff: true, err: []string{"job fault", "retrying"}}},
		{"START_FAILED job fault at max_attempts → FAILED", active(sAssigned, 3, 2), testPolicy,
			func(t Task) Report {
				r := report(t, kStartFailed, 0)
				r.Fault = apiaryv1.FailureFault_FAILURE_FAULT_JOB
				return r
			},
			want{state: sFailed, outcome: OutcomeFailed, released: true, used: 3, finished: now, err: []string{"job fault", "max_attempts 3 reached"}}},
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
				if c.want.backoff {
					d := boundOf(c.pol.Backoff, got.Used)
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
		if got.State != sPending || res.Outcome != OutcomeRetry || !res.Released {
			t.Fatalf("got %s outcome %q released %v, want PENDING retry released", got.State, res.Outcome, res.Released)
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
				want := fmt.Sprintf("%d node-fault start failures exceed the limit of %d", c.limit+1, c.limit)
				if !strings.Contains(task.Error, want) {
					t.Fatalf("error %q does not say %q", task.Error, want)
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
					Fault:     rapid.SampledFrom([]apiaryv1.FailureFault{apiaryv1.FailureFault_FAILURE_FAULT_UNSPECIFIED, apiaryv1.FailureFault_FAILURE_FAULT_NODE, apiaryv1.FailureFault_FAILURE_FAULT_NODE, apiaryv1.FailureFault_FAILURE_FAULT_JOB}).Draw(rt, "fault"),
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
				if !rejected && r.Kind == kStartFailed && !task.CancelRequested {
					if r.Fault == apiaryv1.FailureFault_FAILURE_FAULT_NODE {
						if next.Used != task.Used || next.NodeFaults != task.NodeFaults+1 {
							rt.Fatalf("node-fault start failure: used %d → %d, nodeFaults %d → %d", task.Used, next.Used, task.NodeFaults, next.NodeFaults)
						}
					} else if next.Used != task.Used+1 || !slices.Contains(next.JobFaultOn, task.NodeID) {
						rt.Fatalf("job-fault start failure: used %d → %d, jobFaultOn %v on %s", task.Used, next.Used, next.JobFaultOn, task.NodeID)
					}
					if next.FailedOn[task.NodeID] != task.FailedOn[task.NodeID]+1 {
						rt.Fatalf("start failure not counted against %s: %v → %v", task.NodeID, task.FailedOn, next.FailedOn)
					}
				}
			case 3: // node loss: lease gone, reclaim its tasks of that epoch
				n := rapid.SampledFrom(nodes).Draw(rt, "lost_node")
				lostEpoch := alive[n]
				alive[n] = 0
				loss := Loss{Alone: rapid.Bool().Draw(rt, "alone"), Drained: rapid.Bool().Draw(rt, "drained")}
				res, ok := NodeLost(in, pol, n, lostEpoch, loss, clock)
				next, rejected = res.Task, !ok
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
