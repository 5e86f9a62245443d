package agent

import (
	"fmt"
	"strings"
	"time"
)

// Executor starts the agent's attempts (Config.Executor). Two exist:
// ProcessExecutor, the default, runs each attempt as a subprocess (Start);
// NoopExecutor runs none and ends each attempt on a timer, for measuring
// the control plane (noop.go). Everything else about an attempt (local
// admission in the ledger, reports and their retries, fencing by epoch,
// cancel, drain, lost_after, adoption) is the agent's and the same for
// both. ParseExecutor reads `apiary agent --executor`.
type Executor interface {
	// Start starts the attempt spec describes. An error means nothing was
	// started: a *StartError saying whose fault it is (Start's contract).
	Start(spec Spec) (Running, error)
	// String names the executor as --executor does: "exec", "noop" or
	// "noop:250ms".
	String() string
	// spawns reports whether attempts are processes: only then does the
	// agent set up their containment (cgroups, task users) and sweep a
	// previous run's leftover processes at start.
	spawns() bool
}

// Running is one started attempt, as the agent sees it: an *Execution (a
// process group) or a noop timer. Its methods are safe for concurrent use.
type Running interface {
	// Pid is the process (and process group) id; 0 without a process.
	Pid() int
	// StartTime is when the attempt started.
	StartTime() time.Time
	// Done is closed when the attempt has ended and its result is ready.
	Done() <-chan struct{}
	// Wait blocks until the attempt has ended and returns its result.
	Wait() Result
	// Cancel stops the attempt (OutcomeCancelled unless it had already
	// ended or was being stopped); it does not wait.
	Cancel()
	// Abandon stops the attempt like Cancel, with OutcomeAbandoned (stale
	// epoch, shutdown).
	Abandon()
}

// ProcessExecutor is the default Executor (`--executor exec`): every
// attempt is a subprocess in its own process group and working directory,
// contained in a cgroup where the host allows it (Start).
func ProcessExecutor() Executor { return processExecutor{} }

type processExecutor struct{}

func (processExecutor) Start(spec Spec) (Running, error) {
	e, err := Start(spec)
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return e, nil
}

func (processExecutor) String() string { return "exec" }
func (processExecutor) spawns() bool   { return true }

// ParseExecutor parses the value of `apiary agent --executor`: "exec" (or
// empty) is ProcessExecutor; "noop" is NoopExecutor(0), whose attempts
// exit 0 at once; "noop:DURATION" (a Go duration >= 0, e.g. noop:250ms) is
// NoopExecutor(DURATION). Errors name the flag and the accepted forms.
func ParseExecutor(s string) (Executor, error) {
	switch s = strings.TrimSpace(s); {
	case s == "" || s == "exec":
		return ProcessExecutor(), nil
	case s == "noop":
		return NoopExecutor(0), nil
	case strings.HasPrefix(s, "noop:"):
		d, err := time.ParseDuration(strings.TrimPrefix(s, "noop:"))
		if err != nil || d < 0 {
			return nil, fmt.Errorf("executor %q: the noop duration must be a Go duration >= 0 (e.g. noop:250ms)", s)
		}
		return NoopExecutor(d), nil
	}
	return nil, fmt.Errorf("executor %q: must be exec, noop or noop:DURATION (e.g. noop:250ms)", s)
}
