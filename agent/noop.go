package agent

import (
	"sync"
	"time"
)

// NoopExecutor is an Executor for measuring the control plane (`apiary
// agent --executor noop[:DURATION]`, `apiary loadtest fleet`), after
// Nomad's mock driver: it runs no process, creates no working directory,
// log file, record or cgroup, and ignores the command (one that does not
// exist completes too). Each attempt starts at once and exits 0 after d (0:
// at once), so the agent reports it STARTED (if d passes
// startedReportDelay) and EXITED through the same admission, ledger,
// report and fencing paths as a process. The job's timeout applies: an
// attempt whose timeout is at most d ends TIMED_OUT at the timeout. Cancel
// and Abandon (a CANCEL, a drain, lost_after without contact, a stale
// epoch, shutdown) stop the timer and end the attempt at once with exit
// code -1, as a signal ends a process. Its measurements are the control
// plane's only: nothing of a task's own cost (fork, exec, output) is in
// them.
func NoopExecutor(d time.Duration) Executor { return noopExecutor{d: max(d, 0)} }

type noopExecutor struct{ d time.Duration }

func (n noopExecutor) String() string {
	if n.d == 0 {
		return "noop"
	}
	return "noop:" + n.d.String()
}

func (noopExecutor) spawns() bool { return false }

// Start starts the attempt's timer; it never fails.
func (n noopExecutor) Start(spec Spec) (Running, error) {
	r := &noopRun{started: time.Now(), done: make(chan struct{})}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case spec.Timeout > 0 && spec.Timeout <= n.d:
		r.timer = time.AfterFunc(spec.Timeout, func() { r.end(OutcomeTimedOut, -1) })
	case n.d == 0:
		r.endLocked(OutcomeExited, 0)
	default:
		r.timer = time.AfterFunc(n.d, func() { r.end(OutcomeExited, 0) })
	}
	return r, nil
}

// noopRun is one attempt of the noop executor: a timer.
type noopRun struct {
	started time.Time
	done    chan struct{}

	mu     sync.Mutex
	timer  *time.Timer // nil once ended, or when it ended at Start
	ended  bool
	result Result
}

func (r *noopRun) Pid() int                { return 0 }
func (r *noopRun) StartTime() time.Time    { return r.started }
func (r *noopRun) Done() <-chan struct{}   { return r.done }
func (r *noopRun) Wait() Result            { <-r.done; return r.result }
func (r *noopRun) Cancel()                 { r.end(OutcomeCancelled, -1) }
func (r *noopRun) Abandon()                { r.end(OutcomeAbandoned, -1) }
func (r *noopRun) end(o Outcome, code int) { r.mu.Lock(); defer r.mu.Unlock(); r.endLocked(o, code) }

// endLocked ends the attempt with outcome o, unless it has ended already.
func (r *noopRun) endLocked(o Outcome, code int) {
	if r.ended {
		return
	}
	r.ended = true
	if r.timer != nil {
		r.timer.Stop()
		r.timer = nil
	}
	r.result = Result{Outcome: o, ExitCode: code, Started: r.started, Ended: time.Now()}
	close(r.done)
}
