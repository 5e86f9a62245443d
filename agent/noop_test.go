package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

func TestParseExecutor(t *testing.T) {
	for in, want := range map[string]string{"": "exec", "exec": "exec", "noop": "noop", "noop:0s": "noop",
		"noop:250ms": "noop:250ms", " noop:1m ": "noop:1m0s"} {
		e, err := ParseExecutor(in)
		if err != nil || e.String() != want {
			t.Errorf("ParseExecutor(%q) = %v, %v; want %s", in, e, err, want)
		}
	}
	for in, want := range map[string]string{"docker": "must be exec, noop or noop:DURATION", "noop:-1s": ">= 0",
		"noop:soon": "Go duration", "noop:": "Go duration", "Noop": "must be exec"} {
		if _, err := ParseExecutor(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseExecutor(%q) = %v; want an error with %q", in, err, want)
		}
	}
	if ProcessExecutor().String() != "exec" || !ProcessExecutor().spawns() || NoopExecutor(time.Second).spawns() {
		t.Fatal("only the process executor spawns")
	}
}

// The noop executor's attempt is a timer: no process, no files; it exits
// 0 after its duration, times out at a shorter timeout, and a cancel or
// abandon stops the timer and ends it at once with exit code -1.
func TestNoopExecutorTimer(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "work", "j", "0", "1")
	rec := filepath.Join(t.TempDir(), "record")
	spec := Spec{Command: "/does/not/exist", Dir: dir, OutputDir: filepath.Join(dir, "outputs"), Record: rec}

	r, err := NoopExecutor(0).Start(spec)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.Done():
	default:
		t.Fatal("noop (0) did not end at once")
	}
	if res := r.Wait(); res.Outcome != OutcomeExited || res.ExitCode != 0 || r.Pid() != 0 || res.Ended.Before(res.Started) {
		t.Fatalf("noop (0): %+v pid %d", res, r.Pid())
	}

	r, _ = NoopExecutor(150 * time.Millisecond).Start(spec)
	select {
	case <-r.Done():
		t.Fatal("noop:150ms ended at once")
	case <-time.After(50 * time.Millisecond):
	}
	if res := r.Wait(); res.Outcome != OutcomeExited || res.ExitCode != 0 || res.Ended.Sub(res.Started) < 150*time.Millisecond {
		t.Fatalf("noop:150ms: %+v", res)
	}

	spec.Timeout = 100 * time.Millisecond
	r, _ = NoopExecutor(time.Hour).Start(spec)
	if res := r.Wait(); res.Outcome != OutcomeTimedOut || res.ExitCode != -1 || res.Ended.Sub(res.Started) < 100*time.Millisecond {
		t.Fatalf("noop:1h with a 100ms timeout: %+v", res)
	}
	spec.Timeout = 0

	for _, c := range []struct {
		stop func(Running)
		want Outcome
	}{{Running.Cancel, OutcomeCancelled}, {Running.Abandon, OutcomeAbandoned}} {
		r, _ = NoopExecutor(time.Hour).Start(spec)
		c.stop(r)
		res := r.Wait()
		if res.Outcome != c.want || res.ExitCode != -1 {
			t.Fatalf("stopped: %+v, want %s", res, c.want)
		}
		r.Cancel() // a second stop changes nothing
		r.Abandon()
		if r.Wait().Outcome != c.want {
			t.Fatalf("a second stop changed the outcome to %s", r.Wait().Outcome)
		}
		if r.(*noopRun).timer != nil {
			t.Fatal("the timer was not stopped")
		}
	}
	for _, p := range []string{dir, rec, filepath.Dir(dir)} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Fatalf("%s exists after noop attempts (%v)", p, err)
		}
	}
}

// An agent with the noop executor goes through the whole protocol: local
// admission, STARTED and EXITED reports, CANCEL, timeout, a stale STARTED
// rejection and the shutdown drain, each with the report kind a process
// would get, and never creates a work dir.
func TestAgentNoopExecutorReports(t *testing.T) {
	f := startFake(t)
	f.reject = func(r *apiaryv1.ReportTaskStatusRequest) string {
		if r.GetJobId() == "r1-stale" {
			return "stale attempt"
		}
		return ""
	}
	var c Counters
	ta := startAgent(t, []string{f.addr}, func(c2 *Config) {
		c2.Executor = NoopExecutor(300 * time.Millisecond)
		c2.Capacity = Resources{CPUMillis: 1000, MemoryMB: 1024}
		c2.Counters = &c
	})
	epoch := ta.waitEpoch(t, 1)
	f.waitStream(t, epoch)

	// A command that does not exist completes: nothing is executed.
	done := AttemptKey{JobID: "r1-noop", TaskIndex: 3, Attempt: 1}
	asg := runAsg(epoch, done, "")
	asg.Command, asg.Args = "/no/such/command", nil
	f.push(asg)
	r := f.waitReport(t, done, apiaryv1.ReportKind_REPORT_KIND_EXITED)
	if r.GetExitCode() != 0 || r.GetEndTimeMs()-r.GetStartTimeMs() < 300 || r.GetError() != "" {
		t.Fatalf("EXITED report %v", r)
	}
	if ks := kinds(f.reportsFor(done)); len(ks) != 2 || ks[0] != apiaryv1.ReportKind_REPORT_KIND_STARTED {
		t.Fatalf("reports %v, want STARTED then EXITED", ks)
	}

	// Local admission still applies: 2000 m does not fit in 1000 m.
	big := AttemptKey{JobID: "r1-big", TaskIndex: 0, Attempt: 1}
	a := runAsg(epoch, big, "exit 0")
	a.Resources = &apiaryv1.Resources{CpuMillis: 2000, MemoryMb: 10}
	f.push(a)
	f.waitReport(t, big, apiaryv1.ReportKind_REPORT_KIND_REFUSED)

	// Timeout shorter than the noop duration.
	slow := AttemptKey{JobID: "r1-slow", TaskIndex: 0, Attempt: 1}
	a = runAsg(epoch, slow, "exit 0")
	a.TimeoutMs = 100
	f.push(a)
	if r := f.waitReport(t, slow, apiaryv1.ReportKind_REPORT_KIND_TIMED_OUT); r.GetExitCode() != -1 {
		t.Fatalf("TIMED_OUT report %v", r)
	}

	// A CANCEL stops the timer at once.
	ta2cfg := func(k AttemptKey) *apiaryv1.Assignment { return runAsg(epoch, k, "exit 0") }
	cancelled := AttemptKey{JobID: "r1-cancel", TaskIndex: 0, Attempt: 1}
	f.push(ta2cfg(cancelled))
	f.push(cancelAsg(epoch, cancelled))
	if r := f.waitReport(t, cancelled, apiaryv1.ReportKind_REPORT_KIND_CANCELLED); r.GetExitCode() != -1 || r.GetEndTimeMs()-r.GetStartTimeMs() >= 300 {
		t.Fatalf("CANCELLED report %v", r)
	}

	// A rejected STARTED makes the attempt stale: stopped, never reported again.
	stale := AttemptKey{JobID: "r1-stale", TaskIndex: 0, Attempt: 1}
	f.push(ta2cfg(stale))
	f.waitReport(t, stale, apiaryv1.ReportKind_REPORT_KIND_STARTED)
	waitFor(t, 5*time.Second, func() bool { _, n := ta.Used(); return n == 0 }, "ledger released after the stale kill")

	// The shutdown drain hands a running noop attempt back as DRAINED.
	long := AttemptKey{JobID: "r1-long", TaskIndex: 0, Attempt: 1}
	f.push(ta2cfg(long))
	f.waitReport(t, long, apiaryv1.ReportKind_REPORT_KIND_STARTED)
	ta.stop(t)
	if ks := kinds(f.reportsFor(long)); len(ks) != 2 || ks[1] != apiaryv1.ReportKind_REPORT_KIND_DRAINED {
		t.Fatalf("reports %v, want STARTED then DRAINED", ks)
	}
	if ks := kinds(f.reportsFor(stale)); len(ks) != 1 {
		t.Fatalf("stale attempt reports %v, want only the rejected STARTED", ks)
	}
	for _, k := range []AttemptKey{done, slow, cancelled, stale, long} {
		if _, err := os.Stat(ta.workDir(k)); !os.IsNotExist(err) {
			t.Fatalf("%s: work dir exists (%v)", k, err)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(ta.dataDir, "attempts")); len(ents) != 0 {
		t.Fatalf("attempt records written: %v", ents)
	}
	// 5 started (done, slow, cancelled, stale, long), all ended; 1 refused.
	if c.Registrations.Load() != 1 || c.Started.Load() != 5 || c.Ended.Load() != 5 || c.Refused.Load() != 1 ||
		c.StartFailed.Load() != 0 || c.Heartbeats.Load() == 0 {
		t.Fatalf("counters: registrations %d started %d ended %d refused %d start_failed %d heartbeats %d",
			c.Registrations.Load(), c.Started.Load(), c.Ended.Load(), c.Refused.Load(), c.StartFailed.Load(), c.Heartbeats.Load())
	}
}

// lost_after without contact stops a noop attempt like a process: reported
// LOST with the epoch that still holds it.
func TestAgentNoopExecutorLostAfter(t *testing.T) {
	f := startFake(t)
	f.leaseTTLms = 400
	ta := startAgent(t, []string{f.addr}, func(c *Config) {
		c.Executor = NoopExecutor(time.Hour)
		c.DisconnectGrace = 1200 * time.Millisecond
	})
	e1 := ta.waitEpoch(t, 1)
	f.waitStream(t, e1)
	key := AttemptKey{JobID: "r1-cut", TaskIndex: 0, Attempt: 1}
	f.push(runAsg(e1, key, "exit 0"))
	f.waitReport(t, key, apiaryv1.ReportKind_REPORT_KIND_STARTED)
	f.mu.Lock()
	f.hbDown = true
	f.current = nil
	f.mu.Unlock()
	if r := f.waitReport(t, key, apiaryv1.ReportKind_REPORT_KIND_LOST); r.GetNodeEpoch() != e1 || r.GetExitCode() != -1 {
		t.Fatalf("LOST report %v, want epoch %d", r, e1)
	}
}

// Agents given Config.Conns share them: each registers as its own node
// over the same connection, and one that stops leaves it open for the
// others.
func TestAgentsShareConns(t *testing.T) {
	f := startFake(t)
	cc, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	shared := func(id string) func(*Config) {
		return func(c *Config) {
			c.NodeID, c.Conns, c.LANAddr, c.Executor = id, []*grpc.ClientConn{cc}, LANOff, NoopExecutor(0)
		}
	}
	a1 := startAgent(t, []string{f.addr}, shared("n1"))
	a2 := startAgent(t, []string{f.addr}, shared("n2"))
	e1, e2 := a1.waitEpoch(t, 1), a2.waitEpoch(t, 1)
	if e1 == e2 {
		t.Fatalf("both agents hold epoch %d", e1)
	}
	a1.stop(t)
	f.waitStream(t, e2)
	key := AttemptKey{JobID: "r1-after", TaskIndex: 0, Attempt: 1}
	f.push(runAsg(e2, key, "exit 0"))
	if r := f.waitReport(t, key, apiaryv1.ReportKind_REPORT_KIND_EXITED); r.GetNodeId() != "n2" {
		t.Fatalf("report %v, want from n2", r)
	}

	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{CoordinatorAddrs: []string{"a:1", "b:1"}, Conns: []*grpc.ClientConn{cc}, LANAddr: LANOff}, "1 connections for 2 coordinator addrs"},
		{Config{CoordinatorAddrs: []string{"a:1"}, Conns: []*grpc.ClientConn{cc}}, `need LANAddr "off"`},
	} {
		c.cfg.DataDir = t.TempDir()
		if _, err := New(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New: %v; want %q", err, c.want)
		}
	}
}
