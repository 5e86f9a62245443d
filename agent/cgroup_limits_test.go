package agent

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

// allocScript makes the shell itself hold n bytes: dash keeps a command
// substitution's output in memory (200 MB of it peaked at 392 MB RSS on
// this machine, /usr/bin/time -v), then prints its length.
func allocScript(n int) string {
	return `x=$(head -c ` + strconv.Itoa(n) + ` /dev/zero | tr "\0" a); echo ${#x}`
}

// limitContainment is a containment under auto; the test is skipped, with
// the reason, when it has no memory controller for the attempts (limits
// cannot be enforced there; TestLimitsWithoutCgroupsRun covers that case).
func limitContainment(t *testing.T) *containment {
	t.Helper()
	var logs bytes.Buffer
	data := t.TempDir()
	c := newContainment(Config{DataDir: data, Cgroups: CgroupsAuto}, slog.New(slog.NewTextHandler(&logs, nil)), nil)
	c.setup()
	t.Cleanup(c.close)
	if mem, _ := c.limitCapabilities(); !mem {
		t.Skipf("no cgroup memory controller for attempts on this host, so limits are not enforced; the agent said:\n%s", logs.String())
	}
	return c
}

// limitSpec is a spec of script contained by c with limits l.
func limitSpec(t *testing.T, c *containment, script string, l Limits) Spec {
	s := spec(t, script)
	s.contain, s.cgroup, s.Limits = c, "a-j.0.1", l
	return s
}

// TestMemoryLimitOOMKills: a task with a 32 MiB memory limit that
// allocates about 200 MB is killed by the cgroup's OOM killer, and its
// result says so; the same command with room to spare completes, its
// memory peak showing that it really allocates that much.
func TestMemoryLimitOOMKills(t *testing.T) {
	c := limitContainment(t)
	e, err := Start(limitSpec(t, c, allocScript(200_000_000), Limits{MemoryMB: 32}))
	if err != nil {
		t.Fatal(err)
	}
	res := e.Wait()
	t.Logf("result: exit %d, err %v, usage %+v", res.ExitCode, res.Err, res.Usage)
	want := "killed by its memory limit (32 MiB): the cgroup's OOM killer ended it"
	if res.Outcome != OutcomeExited || res.ExitCode != -1 || res.Err == nil || !strings.Contains(res.Err.Error(), want) {
		t.Fatalf("exit %d, outcome %v, err %v; want killed (-1) with %q", res.ExitCode, res.Outcome, res.Err, want)
	}
	if res.Usage.MemoryLimitBytes != 32<<20 || res.Usage.OOMKills == 0 || !res.Usage.MemoryLimitReached {
		t.Errorf("usage %+v: want the 32 MiB limit, OOM kills and the limit reached", res.Usage)
	}
	if strings.Contains(res.StdoutTail, "200000000") {
		t.Errorf("the task finished its allocation under the limit: %q", res.StdoutTail)
	}

	// Room to spare: the same command, 64 MB this time (twice the limit
	// above), completes under a 512 MiB limit, and its peak shows that it
	// really holds what it reads.
	e, err = Start(limitSpec(t, c, allocScript(64_000_000), Limits{MemoryMB: 512}))
	if err != nil {
		t.Fatal(err)
	}
	res = e.Wait()
	if res.ExitCode != 0 || res.Err != nil || res.StdoutTail != "64000000\n" {
		t.Fatalf("under its limit: exit %d, err %v, stdout %q", res.ExitCode, res.Err, res.StdoutTail)
	}
	if res.Usage.MemoryPeakBytes < 64_000_000 {
		t.Errorf("memory peak %d: the command does not allocate what the test assumes", res.Usage.MemoryPeakBytes)
	}
	if res.Usage.OOMKills > 0 {
		t.Errorf("usage %+v: OOM kills under the limit", res.Usage)
	}
}

// TestLimitFilesWritten: the limits are in the attempt's cgroup files
// while it runs: the memory limit (and memory+swap where accounted) and
// the CFS quota of 250 millicores, 25 ms per 100 ms period.
func TestLimitFilesWritten(t *testing.T) {
	c := limitContainment(t)
	e, err := Start(limitSpec(t, c, "sleep 30", Limits{MemoryMB: 48, CPUMillis: 250}))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Wait()
	defer e.Cancel()
	g := e.cg
	read := func(dir, file string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	mem := strconv.Itoa(48 << 20)
	_, cpu := c.limitCapabilities()
	switch {
	case g.memory != "": // v1
		if got := read(g.memory, "memory.limit_in_bytes"); got != mem {
			t.Errorf("memory.limit_in_bytes %s, want %s", got, mem)
		}
		if exists(g.memory, "memory.memsw.limit_in_bytes") {
			if got := read(g.memory, "memory.memsw.limit_in_bytes"); got != mem {
				t.Errorf("memory.memsw.limit_in_bytes %s, want %s", got, mem)
			}
		} else {
			t.Log("no memory.memsw.limit_in_bytes (swap not accounted)")
		}
		if !cpu {
			t.Log("no v1 cpu hierarchy: no CPU quota to check")
			break
		}
		if g.cpu == "" {
			t.Fatalf("cpu controller, but no cpu dir in %v", g.dirs)
		}
		if got := read(g.cpu, "cpu.cfs_period_us"); got != "100000" {
			t.Errorf("cpu.cfs_period_us %s, want 100000", got)
		}
		if got := read(g.cpu, "cpu.cfs_quota_us"); got != "25000" {
			t.Errorf("cpu.cfs_quota_us %s, want 25000", got)
		}
	case g.v2 != "":
		if got := read(g.v2, "memory.max"); got != mem {
			t.Errorf("memory.max %s, want %s", got, mem)
		}
		if exists(g.v2, "memory.swap.max") {
			if got := read(g.v2, "memory.swap.max"); got != "0" {
				t.Errorf("memory.swap.max %s, want 0", got)
			}
		}
		if cpu {
			if got := read(g.v2, "cpu.max"); got != "25000 100000" {
				t.Errorf("cpu.max %q, want \"25000 100000\"", got)
			}
		}
	default:
		t.Fatalf("no memory cgroup in %v", g.dirs)
	}
}

// TestCPULimitThrottles: a busy loop under a 100-millicore limit gets
// about a tenth of a CPU (CPU seconds per wall second), while the same
// loop without a limit, beside it, gets much more. On a host too busy to
// give the unlimited loop 0.4 CPU in a second the comparison says nothing
// and is skipped.
func TestCPULimitThrottles(t *testing.T) {
	c := limitContainment(t)
	if _, cpu := c.limitCapabilities(); !cpu {
		t.Skip("no cpu controller for the attempts here: CPU limits are not enforced")
	}
	run := func(name string, l Limits) *Execution {
		s := limitSpec(t, c, "while :; do :; done", l)
		s.cgroup, s.Timeout, s.KillGrace = name, time.Second, 0
		e, err := Start(s)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	limited, free := run("a-j.0.1", Limits{CPUMillis: 100}), run("a-j.1.1", Limits{})
	lu, fu := limited.Wait().Usage, free.Wait().Usage
	t.Logf("CPU seconds in 1 s: limited to 100 millicores %.3f, unlimited %.3f", lu.CPUSeconds, fu.CPUSeconds)
	if !lu.Measured || !fu.Measured {
		t.Fatalf("usage not measured: %+v %+v", lu, fu)
	}
	if lu.CPUSeconds > 0.25 {
		t.Errorf("the limited loop used %.3f CPU seconds in 1 s, want about 0.1", lu.CPUSeconds)
	}
	if fu.CPUSeconds < 0.4 {
		t.Skipf("the unlimited loop got only %.3f CPU seconds: host too busy to compare", fu.CPUSeconds)
	}
}

func TestCFSQuota(t *testing.T) {
	for millis, want := range map[int64]int64{1000: 100_000, 250: 25_000, 2500: 250_000, 10: 1000, 5: 1000, 1: 1000} {
		if got := cfsQuotaUs(millis); got != want {
			t.Errorf("cfsQuotaUs(%d) = %d, want %d", millis, got, want)
		}
	}
}

func TestMemoryLimitError(t *testing.T) {
	const mib = 1 << 20
	cases := []struct {
		name    string
		u       Usage
		outcome Outcome
		sig     syscall.Signal
		want    string // "" for no error
	}{
		{"v2 or v1 >= 4.13: main process killed", Usage{MemoryLimitBytes: 256 * mib, OOMKills: 1, MemoryLimitReached: true}, OutcomeExited, syscall.SIGKILL,
			"killed by its memory limit (256 MiB): the cgroup's OOM killer ended it"},
		{"v1 before 4.13: limit reached, SIGKILL", Usage{MemoryLimitBytes: 32 * mib, OOMKills: -1, MemoryLimitReached: true}, OutcomeExited, syscall.SIGKILL,
			"killed by its memory limit (32 MiB): the cgroup's OOM killer ended it"},
		{"v1 before 4.13: limit reached, clean exit", Usage{MemoryLimitBytes: 32 * mib, OOMKills: -1, MemoryLimitReached: true}, OutcomeExited, 0, ""},
		{"a child killed, main exited", Usage{MemoryLimitBytes: 64 * mib, OOMKills: 1, MemoryLimitReached: true}, OutcomeExited, 0,
			"1 of its processes was killed by its memory limit (64 MiB) by the cgroup's OOM killer"},
		{"children killed, then timed out", Usage{MemoryLimitBytes: 64 * mib, OOMKills: 2, MemoryLimitReached: true}, OutcomeTimedOut, syscall.SIGKILL,
			"2 of its processes were killed by its memory limit (64 MiB) by the cgroup's OOM killer"},
		{"cancelled (the agent's SIGKILL) after limit hits", Usage{MemoryLimitBytes: 64 * mib, OOMKills: -1, MemoryLimitReached: true}, OutcomeCancelled, syscall.SIGKILL, ""},
		{"host-wide OOM kill, the limit never reached", Usage{MemoryLimitBytes: 64 * mib, OOMKills: 1}, OutcomeExited, syscall.SIGKILL, ""},
		{"no limit", Usage{OOMKills: 1, MemoryLimitReached: true}, OutcomeExited, syscall.SIGKILL, ""},
	}
	for _, tc := range cases {
		err := memoryLimitError(tc.u, tc.outcome, tc.sig)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v, want none", tc.name, err)
		case tc.want != "" && (err == nil || err.Error() != tc.want):
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

// TestLimitsWithoutCgroupsRun: without cgroups a task with limits runs
// (it is not refused), unlimited, and the agent said once at setup that
// limits are not enforced.
func TestLimitsWithoutCgroupsRun(t *testing.T) {
	var logs bytes.Buffer
	c := newContainment(Config{DataDir: t.TempDir(), Cgroups: CgroupsOff}, slog.New(slog.NewTextHandler(&logs, nil)), nil)
	c.setup()
	t.Cleanup(c.close)
	for range 2 {
		e, err := Start(limitSpec(t, c, allocScript(1_000_000), Limits{MemoryMB: 1, CPUMillis: 10}))
		if err != nil {
			t.Fatal(err)
		}
		if res := e.Wait(); res.ExitCode != 0 || res.Err != nil || res.StdoutTail != "1000000\n" {
			t.Fatalf("exit %d, err %v, stdout %q", res.ExitCode, res.Err, res.StdoutTail)
		}
	}
	if n := strings.Count(logs.String(), "resource limits not enforced"); n != 1 || !strings.Contains(logs.String(), "memory=false cpu=false") {
		t.Fatalf("the log says %d times that limits are not enforced, want once with memory=false cpu=false:\n%s", n, logs.String())
	}
}

// TestAgentReportsOOMKill: through the agent, the EXITED report of an
// attempt its memory limit ended says so in its error (which the region
// keeps as the attempt result's error).
func TestAgentReportsOOMKill(t *testing.T) {
	f, ta, epoch := startConnected(t, nil)
	if mem, _ := ta.contain.limitCapabilities(); !mem {
		t.Skipf("no cgroup memory controller for attempts on this host (cgroup version %d): limits are not enforced", ta.contain.version())
	}
	key := AttemptKey{JobID: "r1-oom", TaskIndex: 0, Attempt: 1}
	a := runAsg(epoch, key, allocScript(200_000_000))
	// A CPU limit of 2 cores: at 100 millicores the allocation takes 10 s.
	a.Resources = &apiaryv1.Resources{CpuMillis: 2000, MemoryMb: 32, Limits: &apiaryv1.ResourceLimits{CpuMillis: 2000, MemoryMb: 32}}
	f.push(a)
	r := f.waitReport(t, key, apiaryv1.ReportKind_REPORT_KIND_EXITED)
	if want := "killed by its memory limit (32 MiB): the cgroup's OOM killer ended it"; r.GetExitCode() != -1 || !strings.Contains(r.GetError(), want) {
		t.Fatalf("EXITED report: exit %d, error %q; want -1 and %q", r.GetExitCode(), r.GetError(), want)
	}
}

// TestAgentRunsBestEffortOnFullNode: a BestEffort assignment (no requests)
// is admitted by the ledger while the node's CPU and memory are all held,
// as long as a task slot is free; at --max-tasks it is refused.
func TestAgentRunsBestEffortOnFullNode(t *testing.T) {
	f, _, epoch := startConnected(t, func(c *Config) {
		c.Capacity = Resources{CPUMillis: 1000, MemoryMB: 1024}
		c.MaxTasks = 2
	})
	hold := AttemptKey{JobID: "r1-hold", TaskIndex: 0, Attempt: 1}
	a := runAsg(epoch, hold, "sleep 100")
	a.Resources = &apiaryv1.Resources{CpuMillis: 1000, MemoryMb: 1024}
	f.push(a)
	f.waitReport(t, hold, apiaryv1.ReportKind_REPORT_KIND_STARTED)
	be := AttemptKey{JobID: "r1-be", TaskIndex: 0, Attempt: 1}
	a = runAsg(epoch, be, "sleep 100")
	a.Resources = &apiaryv1.Resources{BestEffort: true}
	f.push(a)
	f.waitReport(t, be, apiaryv1.ReportKind_REPORT_KIND_STARTED)
	// Both slots taken: the next BestEffort task is refused for the slot.
	third := AttemptKey{JobID: "r1-be", TaskIndex: 1, Attempt: 1}
	a = runAsg(epoch, third, "exit 0")
	a.Resources = &apiaryv1.Resources{BestEffort: true}
	f.push(a)
	if r := f.waitReport(t, third, apiaryv1.ReportKind_REPORT_KIND_REFUSED); !strings.Contains(r.GetError(), "max tasks") {
		t.Fatalf("REFUSED error %q, want max tasks", r.GetError())
	}
	f.push(cancelAsg(epoch, be))
	f.waitReport(t, be, apiaryv1.ReportKind_REPORT_KIND_CANCELLED)
}

func TestLedgerAdmitsZeroRequests(t *testing.T) {
	l := NewLedger(Resources{CPUMillis: 1000, MemoryMB: 512}, "", 2)
	k := func(i int32) AttemptKey { return AttemptKey{JobID: "j", TaskIndex: i, Attempt: 1} }
	if err := l.Reserve(k(0), Request{CPUMillis: 1000, MemoryMB: 512}); err != nil {
		t.Fatal(err)
	}
	if err := l.Reserve(k(1), Request{}); err != nil {
		t.Fatalf("BestEffort on a full node: %v", err)
	}
	if err := l.Reserve(k(2), Request{}); err == nil || !strings.Contains(err.Error(), "max tasks") {
		t.Fatalf("third task past max tasks 2: %v", err)
	}
	if used, n := l.Used(); used.CPUMillis != 1000 || used.MemoryMB != 512 || n != 2 {
		t.Fatalf("used %+v by %d", used, n)
	}
	if !l.Release(k(1)) {
		t.Fatal("release")
	}
	if used, n := l.Used(); used.CPUMillis != 1000 || used.MemoryMB != 512 || n != 1 {
		t.Fatalf("used %+v by %d after the release", used, n)
	}
}

// TestLimitWriteFailures: a memory limit that cannot be written is a node
// fault (the attempt does not start unlimited); a CPU quota that cannot be
// is logged and the attempt goes on. Here the control files are missing
// (plain directories stand for the cgroups).
func TestLimitWriteFailures(t *testing.T) {
	var logs bytes.Buffer
	c := &containment{log: slog.New(slog.NewTextHandler(&logs, nil))}
	mem := &attemptCgroup{memory: t.TempDir()}
	err := c.limit(mem, Limits{MemoryMB: 64}, c.log)
	if err == nil || StartFault(err) != apiaryv1.FailureFault_FAILURE_FAULT_NODE || !strings.Contains(err.Error(), "cgroup memory limit 64 MiB") {
		t.Fatalf("memory limit not written: %v (fault %v), want a node fault", err, StartFault(err))
	}
	if mem.memLimit != 0 {
		t.Fatalf("limit %d recorded although not written", mem.memLimit)
	}
	cpu := &attemptCgroup{cpu: t.TempDir()}
	if err := c.limit(cpu, Limits{CPUMillis: 500}, c.log); err != nil {
		t.Fatalf("CPU quota not written: %v, want the attempt to go on", err)
	}
	if !strings.Contains(logs.String(), "CPU limit not set") {
		t.Fatalf("no warning for the CPU quota:\n%s", logs.String())
	}
}
