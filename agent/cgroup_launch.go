package agent

// Launcher threads: how an attempt's process starts at a lower priority
// and inside its cgroup, with no window in which it runs outside.
//
// Linux keeps the nice value and (under cgroup v1) the cgroups per thread,
// and a forked child starts with those of the thread that forked it. So a
// few OS threads of the agent are set aside (runtime.LockOSThread, never
// unlocked) and raised to nice +taskNice once; every attempt is started on
// one of them, which under v1 first writes its own thread id into the
// attempt's cgroups' tasks files, forks and execs the command (Go's
// os/exec forks on the calling thread), and writes itself back into the
// agent's cgroups. Under v2 a thread cannot sit in another cgroup than its
// process, and clone3's CLONE_INTO_CGROUP (SysProcAttr.UseCgroupFD) puts the
// child into its cgroup instead; the launcher still gives the nice value.
//
// The other ways, and why not:
//   - setpriority and a cgroup.procs write by the agent right after the
//     start leave a window in which the task runs, and may fork or setsid,
//     outside its cgroup and at the agent's priority;
//   - a re-exec shim (the agent's own binary started first, joining the
//     cgroup and setting the nice value before it execs the command, as
//     runc does) costs a start of the 54 MB apiary binary per attempt:
//     62-73 ms of CPU measured here against 4-6 ms for /bin/true, which
//     would be most of a host's work under a burst of short tasks;
//   - freezing the cgroup first does not help the first write: the child
//     is not in the cgroup yet.
//
// The threads live as long as the process. A locked thread is never given
// back, so its nice value cannot leak into the agent's own goroutines (a
// thread cannot lower its nice value again without CAP_SYS_NICE), and it
// never exits, which matters: Pdeathsig fires when the thread that forked
// the child exits, not only the process.

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
)

// taskNice is how much lower than the agent's the scheduling priority of
// attempts' processes is (a nice increment, capped at 19): a nice-10 thread
// weighs 110 against a nice-0 thread's 1024 in the kernel's fair scheduler.
const taskNice = 10

// launcherThreads is the number of launcher threads: starts run in
// parallel up to this (MEASURED.md: spawn throughput levels off at ~2,000/s
// with 8-32 in parallel on 2 cores; 4 keep the agent's own threads free).
const launcherThreads = 4

type launchReq struct {
	cmd        *exec.Cmd
	join, home []string
	done       chan launchResult
}

type launchResult struct{ err, stuck error }

var launchers struct {
	once    sync.Once
	reqs    chan *launchReq
	niceErr error
}

// startLaunchers starts the launcher threads once per process; the error
// says why they could not lower their priority (tasks then run at the
// agent's).
func startLaunchers() error {
	launchers.once.Do(func() {
		launchers.reqs = make(chan *launchReq)
		errc := make(chan error, launcherThreads)
		for range launcherThreads {
			go launcher(launchers.reqs, errc)
		}
		for range launcherThreads {
			if err := <-errc; err != nil {
				launchers.niceErr = err
			}
		}
	})
	return launchers.niceErr
}

// launch starts cmd on a launcher thread, which joins the cgroup
// directories join (their tasks files) for the fork and goes back to home
// after it. err is cmd.Start's (or the join's, as a node fault); stuck
// reports a launcher thread that could not go back, which is then retired
// (and replaced).
func launch(cmd *exec.Cmd, join, home []string) (err, stuck error) {
	_ = startLaunchers()
	r := &launchReq{cmd: cmd, join: join, home: home, done: make(chan launchResult, 1)}
	launchers.reqs <- r
	res := <-r.done
	return res.err, res.stuck
}

// launcher serves launch requests on a locked thread whose nice value is
// raised by taskNice; its first send on ready says whether that worked.
func launcher(reqs chan *launchReq, ready chan<- error) {
	runtime.LockOSThread() // for good: see the file comment
	tid := syscall.Gettid()
	if tid == os.Getpid() {
		// The main thread, whose nice value ps shows for the whole agent:
		// hand over to a launcher on another thread (this one stays locked
		// until that one runs, so it cannot be this one) and give it back.
		next := make(chan error, 1)
		go launcher(reqs, next)
		err := <-next
		runtime.UnlockOSThread()
		if ready != nil {
			ready <- err
		}
		return
	}
	var niceErr error
	if prio, err := syscall.Getpriority(syscall.PRIO_PROCESS, tid); err != nil {
		niceErr = fmt.Errorf("getpriority: %w", err)
	} else if err := syscall.Setpriority(syscall.PRIO_PROCESS, tid, min(20-prio+taskNice, 19)); err != nil {
		// The raw syscall returns 20 - nice.
		niceErr = fmt.Errorf("setpriority: %w", err)
	}
	if ready != nil {
		ready <- niceErr
	}
	self := strconv.Itoa(tid)
	for r := range reqs {
		var res launchResult
		if err := joinAll(r.join, self); err != nil {
			res.err = nodeFault(fmt.Errorf("cgroup: %w", err))
		} else {
			res.err = r.cmd.Start()
		}
		if len(r.join) > 0 {
			if err := joinAll(r.home, self); err != nil {
				res.stuck = fmt.Errorf("thread %s back to %v: %w", self, r.home, err)
			}
		}
		r.done <- res
		if res.stuck != nil {
			// This thread stays in the attempt's cgroups: never use it
			// again, never let it exit (its children's Pdeathsig).
			go launcher(reqs, nil)
			select {}
		}
	}
}

// joinAll writes tid into the tasks file of each directory (a v1 cgroup:
// moves that one thread).
func joinAll(dirs []string, tid string) error {
	var errs []error
	for _, d := range dirs {
		if err := os.WriteFile(filepath.Join(d, "tasks"), []byte(tid), 0); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
