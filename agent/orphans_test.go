package agent

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

func discardLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestKillOrphans: processes left in an attempt dir by a previous run are
// killed; a process running elsewhere is not.
func TestKillOrphans(t *testing.T) {
	data := t.TempDir()
	dir := filepath.Join(data, "work", "eu-job", "0", "1")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	orphan := exec.Command("sh", "-c", "sleep 30 & wait")
	orphan.Dir = dir
	orphan.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := orphan.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- orphan.Wait() }()
	// A stranger: a live process whose cwd is not the attempt dir.
	stranger := exec.Command("sleep", "30")
	stranger.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := stranger.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Kill(-stranger.Process.Pid, syscall.SIGKILL); _ = stranger.Wait() }()
	if n := killOrphans(data, discardLog()); n < 1 {
		t.Fatalf("killed %d processes, want >= 1", n)
	}
	select {
	case <-waited:
	case <-time.After(10 * time.Second):
		t.Fatal("orphan still running")
	}
	if err := syscall.Kill(stranger.Process.Pid, 0); err != nil {
		t.Fatalf("stranger was killed: %v", err)
	}
}

// TestKillOrphansChildOfDeadLeader: the bug of issue 20. The leader of a
// recorded attempt is gone (Pdeathsig killed it with the agent); its
// background child, still in the group but outside the work dir and without
// the marker, is killed by the record. The old sweep killed only leaders.
func TestKillOrphansChildOfDeadLeader(t *testing.T) {
	data := t.TempDir()
	recDir := filepath.Join(data, "attempts")
	dir := filepath.Join(data, "work", "j", "0", "1")
	for _, d := range []string{recDir, dir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	pidFile := filepath.Join(dir, "child")
	// The child leaves the work dir, so only the record can find it.
	leader := exec.Command("sh", "-c", "(cd / && exec sleep 30) & echo $! > "+pidFile)
	leader.Dir = dir
	leader.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := leader.Start(); err != nil {
		t.Fatal(err)
	}
	st, err := readProcStat("/proc", leader.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	rec := filepath.Join(recDir, "j.0.1")
	if err := writeRecord(rec, attemptRecord{Dir: dir, Pgid: leader.Process.Pid, StartTicks: st.startTicks}); err != nil {
		t.Fatal(err)
	}
	if err := leader.Wait(); err != nil {
		t.Fatal(err)
	}
	child := readPids(t, pidFile, 1)[0]
	defer syscall.Kill(child, syscall.SIGKILL)
	waitFor(t, 10*time.Second, func() bool {
		cwd, _ := os.Readlink(fmt.Sprintf("/proc/%d/cwd", child))
		return cwd == "/"
	}, "child left the work dir")
	if pg, _ := syscall.Getpgid(child); pg != leader.Process.Pid {
		t.Fatalf("child's group %d, want %d", pg, leader.Process.Pid)
	}
	if n := killOrphans(data, discardLog()); n != 1 {
		t.Fatalf("killed %d processes, want 1", n)
	}
	waitFor(t, 10*time.Second, func() bool { return processGone(child) }, "child of the dead leader gone")
	if _, err := os.Stat(rec); !os.IsNotExist(err) {
		t.Fatalf("record not removed: %v", err)
	}
}

// TestKillOrphansSetsidEscape: a task process that left its group with
// setsid and its work dir is found by the agent's environment marker.
func TestKillOrphansSetsidEscape(t *testing.T) {
	data := t.TempDir()
	if err := os.MkdirAll(filepath.Join(data, "attempts"), 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(data, "work", "j", "0", "1")
	// The leader waits until the escapee is in its own session and out of
	// the work dir, so that the group kill at its exit cannot win the race.
	s := spec(t, "setsid sh -c 'cd / && echo $$ > "+dir+"/e.tmp && mv "+dir+"/e.tmp "+dir+"/escaped && exec sleep 30' & "+
		"while [ ! -e escaped ]; do sleep 0.01; done")
	s.Dir = dir
	s.Env = append(os.Environ(), agentRunEnv+"="+agentMarker(data))
	s.Record = filepath.Join(data, "attempts", "j.0.1")
	e, err := Start(s)
	if err != nil {
		t.Fatal(err)
	}
	if res := e.Wait(); res.Outcome != OutcomeExited {
		t.Fatalf("result %+v", res)
	}
	esc := readPids(t, filepath.Join(s.Dir, "escaped"), 1)[0]
	defer syscall.Kill(esc, syscall.SIGKILL)
	waitFor(t, 10*time.Second, func() bool {
		cwd, _ := os.Readlink(fmt.Sprintf("/proc/%d/cwd", esc))
		pg, _ := syscall.Getpgid(esc)
		return cwd == "/" && pg == esc
	}, "escapee in its own session outside the work dir")
	// The group kill at the leader's exit cannot reach it.
	if processGone(esc) {
		t.Fatal("escapee died with its group; the test proves nothing")
	}
	if _, err := os.Stat(s.Record); !os.IsNotExist(err) {
		t.Fatalf("record not removed at the end of the attempt: %v", err)
	}
	// Another agent (other data dir) does not touch it.
	if n := killOrphans(t.TempDir(), discardLog()); n != 0 {
		t.Fatalf("another agent killed %d processes", n)
	}
	if n := killOrphans(data, discardLog()); n != 1 {
		t.Fatalf("killed %d processes, want 1", n)
	}
	waitFor(t, 10*time.Second, func() bool { return processGone(esc) }, "escapee gone")
}

// TestFindOrphansPgidReuse: with a fake /proc, a recorded group id that was
// reused by an unrelated group (its live leader started at another time) or
// processes that started before the recorded leader are not orphans;
// members that started no earlier than the recorded leader are.
func TestFindOrphansPgidReuse(t *testing.T) {
	root := t.TempDir()
	proc := func(pid, pgid int, state string, start uint64, cwd string, env string) {
		d := filepath.Join(root, strconv.Itoa(pid))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		// Field 2 with spaces and ')' as a hostile comm would have.
		stat := fmt.Sprintf("%d (a) b) %s 1 %d %d 0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 %d 1000 100\n",
			pid, state, pgid, pgid, start)
		if err := os.WriteFile(filepath.Join(d, "stat"), []byte(stat), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "environ"), []byte(env), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(cwd, filepath.Join(d, "cwd")); err != nil {
			t.Fatal(err)
		}
	}
	work := "/data/work/"
	mark := "APIARY_AGENT_RUN=abc"
	// Group 100 recorded at 1000; its id now belongs to a live leader that
	// started at 5000: reused, none of its members match.
	proc(100, 100, "S", 5000, "/", "PATH=/bin\x00")
	proc(101, 100, "S", 5001, "/", "")
	// Group 200 recorded at 1000; leader gone. 201 started after: orphan;
	// 202 started before the leader: an unrelated process (not possible in
	// a real group, but a stale record must never kill it).
	proc(201, 200, "S", 1200, "/", "")
	proc(202, 200, "S", 900, "/", "")
	// A zombie member: already dead.
	proc(203, 200, "Z", 1300, "/", "")
	// Group 300 recorded at 1000, its leader alive with that start time.
	proc(300, 300, "S", 1000, "/", "")
	// In the work dir; carrying the marker; a stranger; ourselves.
	proc(400, 400, "S", 10, "/data/work/j/0/1", "")
	proc(500, 500, "S", 10, "/", "A=1\x00"+mark+"\x00B=2\x00")
	proc(600, 600, "S", 10, "/data/workshop", "APIARY_AGENT_RUN=abcd\x00")
	proc(700, 200, "S", 2000, "/data/work", mark)
	s := orphanScan{procRoot: root, self: 700, work: work, marker: []byte(mark), groups: []attemptRecord{
		{Pgid: 100, StartTicks: 1000}, {Pgid: 200, StartTicks: 1000}, {Pgid: 300, StartTicks: 1000},
	}}
	got := s.findOrphans()
	want := map[int]string{201: "group", 300: "group", 400: "dir", 500: "marker"}
	if len(got) != len(want) {
		t.Fatalf("found %v, want %v", got, want)
	}
	for pid, why := range want {
		if got[pid] != why {
			t.Fatalf("found %v, want %v", got, want)
		}
	}
}
