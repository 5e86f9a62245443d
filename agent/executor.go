package agent

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// Spec describes one attempt to execute.
type Spec struct {
	// Command is a program path, or a name looked up in the agent's PATH.
	Command string
	Args    []string
	// Env is the complete environment of the process ("K=V" entries).
	Env []string
	// Dir is the working directory; it is created (with parents) if missing.
	// stdout.log and stderr.log are written in it.
	Dir string
	// OutputDir, if set, is a directory created inside Dir for the
	// attempt's outputs (the task user's, with task users), given to the
	// task as APIARY_OUTPUT_DIR by the caller.
	OutputDir string
	// Timeout is the wall-clock limit; 0 means none.
	Timeout time.Duration
	// TailBytes is how many trailing bytes of stdout and of stderr each are
	// kept in memory for the result.
	TailBytes int
	// KillGrace is the time between SIGTERM and SIGKILL when the process
	// group is killed; 0 means SIGKILL at once.
	KillGrace time.Duration
	// Record, if set, is the path of the attempt's record on disk (see
	// killOrphans): written before the process is started, completed with
	// its process group id and start time once it is, removed after the
	// group was killed at the end of the attempt. Its directory must exist.
	Record string
	// Limits are the attempt's resource limits (the job's
	// resources.limits), written into its cgroup before the process starts
	// (cgroup_limits.go); ignored without a cgroup or without the cgroup
	// controller a limit needs (the agent says so once at start). An
	// attempt ended by its memory limit has Result.Err say so
	// (memoryLimitError).
	Limits Limits

	// contain, if set, starts the process on one of its launcher threads,
	// at a lower priority than the agent, in a cgroup of its own named
	// cgroup (when the agent has cgroups), which is killed as a whole when
	// the attempt ends and then removed, and as a user of its own when the
	// agent has task users (see containment, taskusers.go). nil: the
	// process group only, at the agent's priority, as the agent's user.
	contain *containment
	cgroup  string
}

// Outcome says why an attempt's process ended.
type Outcome int

const (
	// OutcomeExited: the process exited on its own.
	OutcomeExited Outcome = iota
	// OutcomeTimedOut: killed because it ran past Spec.Timeout.
	OutcomeTimedOut
	// OutcomeCancelled: killed by Execution.Cancel.
	OutcomeCancelled
	// OutcomeAbandoned: killed by Execution.Abandon (stale epoch, shutdown).
	OutcomeAbandoned
)

func (o Outcome) String() string {
	switch o {
	case OutcomeExited:
		return "exited"
	case OutcomeTimedOut:
		return "timed out"
	case OutcomeCancelled:
		return "cancelled"
	case OutcomeAbandoned:
		return "abandoned"
	}
	return fmt.Sprintf("outcome(%d)", int(o))
}

// Result is what an ended attempt left behind.
type Result struct {
	Outcome Outcome
	// ExitCode is the process's exit status, or -1 if a signal ended it.
	ExitCode int
	// StdoutTail and StderrTail are the last TailBytes of each stream, as
	// valid UTF-8.
	StdoutTail, StderrTail string
	// Started and Ended bracket the process's life as seen by the agent.
	Started, Ended time.Time
	// Err says that the attempt's memory limit ended it or some of its
	// processes (memoryLimitError), and holds an unexpected wait or
	// log-file error, if any; the exit code is still meaningful.
	Err error
	// Usage is what the attempt's processes used, from its cgroup (read
	// once every process of it is gone); Measured is false without one.
	Usage Usage
}

// Execution is one running attempt: a process that leads its own process
// group. Its methods are safe for concurrent use.
type Execution struct {
	spec    Spec
	cmd     *exec.Cmd
	pgid    int
	cg      *attemptCgroup // nil without a cgroup
	user    *taskUser      // nil without task users
	started time.Time
	done    chan struct{}
	result  Result

	mu       sync.Mutex
	exited   bool    // the leader was reaped; never signal the group again
	stopping Outcome // reason of the first stop; valid if stopped
	stopped  bool
	timer    *time.Timer
}

// Start starts the attempt described by spec. An error means no process was
// started; it is the START_FAILED case, and is a *StartError saying whose
// fault it is: the job's (empty command, command not found or not
// executable) or the node's (work dir or log files not creatable, no free
// task user, fork limits, ...; see classifyExec).
func Start(spec Spec) (*Execution, error) {
	if spec.Command == "" {
		return nil, jobFault(errors.New("empty command"))
	}
	var user *taskUser
	if spec.contain != nil && spec.contain.users != nil {
		var err error
		if user, err = spec.contain.users.acquire(); err != nil {
			return nil, nodeFault(err)
		}
	}
	e, err := start(spec, user)
	if err != nil && user != nil {
		user.release() // no process ran as it
	}
	return e, err
}

// start is Start once the attempt's task user (nil: none) is held.
func start(spec Spec, user *taskUser) (*Execution, error) {
	if user != nil {
		if err := user.makeAttemptDir(spec.Dir); err != nil {
			return nil, nodeFault(fmt.Errorf("work dir: %w", err))
		}
		// A HOME inherited from the agent is not the task user's to write.
		spec.Env = homeEnv(spec.Env, spec.Dir)
	} else if err := os.Mkdir(spec.Dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		// The common case is a new attempt dir under an existing task dir:
		// one mkdir, not MkdirAll's stat of every level (file system calls
		// are most of an agent's own cost per attempt).
		if err := os.MkdirAll(spec.Dir, 0o755); err != nil {
			return nil, nodeFault(fmt.Errorf("work dir: %w", err))
		}
	}
	if spec.OutputDir != "" {
		if err := os.Mkdir(spec.OutputDir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, nodeFault(fmt.Errorf("output dir: %w", err))
		}
		if user != nil {
			if err := os.Lchown(spec.OutputDir, int(user.id), int(user.id)); err != nil {
				return nil, nodeFault(fmt.Errorf("output dir: %w", err))
			}
		}
	}
	cmd := exec.Command(spec.Command, spec.Args...)
	if cmd.Err != nil {
		return nil, classifyExec(cmd.Err, spec.Dir)
	}
	cmd.Dir = spec.Dir
	cmd.Env = spec.Env
	// Own process group; and if the agent dies, the kernel kills the task's
	// main process (a restarted agent also sweeps every leftover process: see
	// killOrphans). Go sets the parent-death signal after the credential
	// change, which would clear it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if user != nil {
		cmd.SysProcAttr.Credential = user.credential()
	}

	// The process writes straight into its log files (no pipes, no copier
	// goroutines: less work per attempt, and a background child that keeps
	// the files open cannot hold the result back); the tails are read back
	// from the files once the process has exited.
	// With a task user they are its files (0600, in its 0700 dir), opened
	// without following a symlink.
	var files [2]*os.File
	for i, name := range []string{"stdout.log", "stderr.log"} {
		flags, mode := os.O_CREATE|os.O_TRUNC|os.O_RDWR, os.FileMode(0o644)
		if user != nil {
			flags, mode = flags|syscall.O_NOFOLLOW, 0o600
		}
		f, err := os.OpenFile(filepath.Join(spec.Dir, name), flags, mode)
		if err == nil && user != nil {
			if err = f.Chown(int(user.id), int(user.id)); err != nil {
				f.Close()
			}
		}
		if err != nil {
			if i == 1 {
				files[0].Close()
			}
			return nil, nodeFault(fmt.Errorf("log file: %w", err))
		}
		files[i] = f
	}
	cmd.Stdout, cmd.Stderr = files[0], files[1]
	var cg *attemptCgroup
	if spec.contain != nil {
		var err error
		if cg, err = spec.contain.create(spec.cgroup); err != nil {
			files[0].Close()
			files[1].Close()
			return nil, nodeFault(err)
		}
		// Limits before the process exists: it never runs unlimited.
		if cg != nil {
			if err = spec.contain.limit(cg, spec.Limits, spec.contain.log); err != nil {
				files[0].Close()
				files[1].Close()
				_, _ = spec.contain.finish(cg)
				return nil, err
			}
		}
	}
	var rec *os.File
	if spec.Record != "" {
		var err error
		r := attemptRecord{Dir: spec.Dir}
		if cg != nil {
			r.Cgroups = cg.dirs
		}
		if rec, err = createRecord(spec.Record, r); err != nil {
			files[0].Close()
			files[1].Close()
			if cg != nil {
				_, _ = spec.contain.finish(cg)
			}
			return nil, nodeFault(err)
		}
	}
	var err error
	if spec.contain != nil {
		err = spec.contain.start(cmd, cg)
	} else {
		err = cmd.Start()
	}
	if err != nil {
		files[0].Close()
		files[1].Close()
		if cg != nil {
			_, _ = spec.contain.finish(cg)
		}
		if rec != nil {
			rec.Close()
			_ = os.Remove(spec.Record)
		}
		var se *StartError
		if errors.As(err, &se) {
			return nil, err
		}
		return nil, classifyExec(err, spec.Dir)
	}
	if rec != nil {
		// The leader is not reaped before our Wait, so its pid cannot be
		// reused yet and its stat is its own. A failure here leaves the
		// pgid-less record: the work dir and marker scans still apply.
		pid := cmd.Process.Pid
		if st, err := readProcStat("/proc", pid); err == nil {
			_ = appendRecord(rec, attemptRecord{Pgid: pid, StartTicks: st.startTicks})
		}
		rec.Close()
	}
	e := &Execution{
		spec:    spec,
		cmd:     cmd,
		pgid:    cmd.Process.Pid,
		cg:      cg,
		user:    user,
		started: time.Now(),
		done:    make(chan struct{}),
	}
	if spec.Timeout > 0 {
		e.mu.Lock()
		e.timer = time.AfterFunc(spec.Timeout, func() { e.stop(OutcomeTimedOut) })
		e.mu.Unlock()
	}
	go func() {
		waitErr := cmd.Wait()
		ended := time.Now()
		e.mu.Lock()
		// Leftovers of the group (daemons, background jobs) do not outlive
		// the attempt; nor, with a cgroup, those that left the group.
		_ = syscall.Kill(-e.pgid, syscall.SIGKILL)
		e.exited = true
		if e.timer != nil {
			e.timer.Stop()
		}
		outcome := OutcomeExited
		if e.stopped {
			outcome = e.stopping
		}
		e.mu.Unlock()
		var usage Usage
		gone := false
		if cg != nil {
			usage, gone = spec.contain.finish(cg)
		}
		if user != nil {
			// Free for another attempt once none of this one's processes
			// is left (escapees of the group too, without a cgroup: the
			// reaper kills them).
			user.end(gone)
		}
		if spec.Record != "" {
			_ = os.Remove(spec.Record)
		}

		var tails [2]string
		var tailErr [2]error
		for i, f := range files {
			tails[i], tailErr[i] = readTail(f, spec.TailBytes)
			f.Close()
		}
		res := Result{
			Outcome:    outcome,
			ExitCode:   cmd.ProcessState.ExitCode(),
			StdoutTail: tails[0],
			StderrTail: tails[1],
			Started:    e.started,
			Ended:      ended,
			Usage:      usage,
		}
		var exitErr *exec.ExitError
		if waitErr != nil && !errors.As(waitErr, &exitErr) {
			res.Err = waitErr
		}
		// First: the one line a user reads first in the attempt's result.
		res.Err = errors.Join(memoryLimitError(usage, outcome, exitSignal(cmd.ProcessState)), res.Err, tailErr[0], tailErr[1])
		e.result = res
		close(e.done)
	}()
	return e, nil
}

// readTail returns the last n bytes of f (cut to valid UTF-8 by TailBuffer).
func readTail(f *os.File, n int) (string, error) {
	st, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("log file %s: %w", f.Name(), err)
	}
	off := max(st.Size()-int64(n), 0)
	buf := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("log file %s: %w", f.Name(), err)
	}
	t := NewTailBuffer(n)
	_, _ = t.Write(buf)
	return t.String(), nil
}

// Pid returns the process id, which is also its process group id.
func (e *Execution) Pid() int { return e.pgid }

// StartTime returns when the process was started.
func (e *Execution) StartTime() time.Time { return e.started }

// Done is closed when the process has ended and its result is ready.
func (e *Execution) Done() <-chan struct{} { return e.done }

// Wait blocks until the process has ended and returns its result.
func (e *Execution) Wait() Result {
	<-e.done
	return e.result
}

// Cancel kills the process group, and every process of the attempt's
// cgroup when it has one (SIGTERM, then SIGKILL after KillGrace);
// the result's outcome is OutcomeCancelled unless the process had already
// ended or was already being stopped. It does not wait.
func (e *Execution) Cancel() { e.stop(OutcomeCancelled) }

// Abandon kills the process group like Cancel, with OutcomeAbandoned.
func (e *Execution) Abandon() { e.stop(OutcomeAbandoned) }

func (e *Execution) stop(reason Outcome) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.exited || e.stopped {
		return
	}
	e.stopped, e.stopping = true, reason
	if e.timer != nil {
		e.timer.Stop()
	}
	if e.spec.KillGrace <= 0 {
		e.signal(syscall.SIGKILL)
		return
	}
	e.signal(syscall.SIGTERM)
	go func() {
		t := time.NewTimer(e.spec.KillGrace)
		defer t.Stop()
		select {
		case <-e.done:
		case <-t.C:
			e.mu.Lock()
			if !e.exited {
				e.signal(syscall.SIGKILL)
			}
			e.mu.Unlock()
		}
	}()
}

// signal sends sig to the process group and, with a cgroup, to every
// process in it (those that left the group too). Called with e.mu held,
// before the leader was reaped.
func (e *Execution) signal(sig syscall.Signal) {
	_ = syscall.Kill(-e.pgid, sig)
	if e.cg != nil {
		e.cg.signal(sig)
	}
}
