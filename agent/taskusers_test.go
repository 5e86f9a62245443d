package agent

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/testutil"
)

// needRoot skips a test that needs root to start processes as other users.
// CI runs as root (as this machine does), so there it always runs.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("starts processes as other users: needs root (CI runs as root)")
	}
}

// reachableDir is a new test directory that other users may search down
// to (t.TempDir's parent is 0700): a data dir task users can reach.
func reachableDir(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	if err := os.Chmod(filepath.Dir(d), 0o711); err != nil {
		t.Fatal(err)
	}
	return d
}

// owner returns the owner uid and permission bits of path.
func owner(t *testing.T, path string) (uint32, os.FileMode) {
	t.Helper()
	st, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Sys().(*syscall.Stat_t).Uid, st.Mode().Perm()
}

// lockHeld reports whether id's lock file names a holder.
func lockHeld(id uint32) bool {
	b, _ := os.ReadFile(filepath.Join(taskUIDLockDir, strconv.FormatUint(uint64(id), 10)))
	return len(b) > 0
}

// TestTaskUsersIsolateAttempts is issue 19's finding on one agent run as
// root with task users on: attempt A holds a secret_env value in its
// environment; attempt B, on the same agent, tries to read A's
// /proc/<pid>/environ, A's work dir, the agent's gossip keyring, its join
// token, its records and its own environment, and is refused every one
// (Permission denied), while its own work (a file in its dir, its HOME, its
// GPU) goes on. Each attempt runs as its own uid of the range, owns its
// 0700 work dir and its logs; a credential file other users can read is
// named at start; A's id is free again once A was cancelled.
func TestTaskUsersIsolateAttempts(t *testing.T) {
	needRoot(t)
	data := reachableDir(t)
	keyring := filepath.Join(data, "gossip.keyring")
	token := filepath.Join(filepath.Dir(data), "join.token") // reachable, 0600
	leaky := filepath.Join(filepath.Dir(data), "leaky.key")  // 0644: named at start
	for f, mode := range map[string]os.FileMode{keyring: 0o600, token: 0o600, leaky: 0o644} {
		if err := os.WriteFile(f, []byte("SECRET-"+filepath.Base(f)), mode); err != nil {
			t.Fatal(err)
		}
	}
	logs := &testutil.LogBuffer{}
	f, ta, epoch := startConnected(t, func(c *Config) {
		c.DataDir = data
		c.TaskUsers = TaskUsersOn
		c.SecretFiles = []string{token, leaky}
		c.Capacity.GPUs = 1
		c.LANAddr = LANOff
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	if !strings.Contains(logs.String(), "attempts run as users of their own") {
		t.Errorf("no start line about task users:\n%s", logs)
	}
	for _, want := range []string{"file=" + leaky} {
		if !strings.Contains(logs.String(), want) || strings.Contains(logs.String(), "file="+token) {
			t.Errorf("want a WARN naming %s only:\n%s", leaky, logs)
		}
	}

	keyA := AttemptKey{JobID: "r1-holder", TaskIndex: 0, Attempt: 1}
	asgA := runAsg(epoch, keyA, "echo $$ > pid.tmp && mv pid.tmp pid; exec sleep 30")
	asgA.Env = map[string]string{"DB_PASSWORD": "hunter2-secret"}
	f.push(asgA)
	dirA := ta.workDir(keyA)
	pidA := readPids(t, filepath.Join(dirA, "pid"), 1)[0]
	st, err := os.Stat(fmt.Sprintf("/proc/%d", pidA))
	if err != nil {
		t.Fatal(err)
	}
	uidA := st.Sys().(*syscall.Stat_t).Uid
	if !DefaultTaskUIDs.contains(uidA) || !lockHeld(uidA) {
		t.Fatalf("attempt A runs as uid %d (lock held %v), want one of %s", uidA, lockHeld(uidA), DefaultTaskUIDs)
	}
	if u, mode := owner(t, dirA); u != uidA || mode != 0o700 {
		t.Errorf("A's work dir: owner %d mode %o, want %d 0700", u, mode, uidA)
	}
	if u, mode := owner(t, filepath.Join(dirA, "stdout.log")); u != uidA || mode != 0o600 {
		t.Errorf("A's stdout.log: owner %d mode %o, want %d 0600", u, mode, uidA)
	}
	// The pid file is written just before the shell execs sleep: read in
	// the middle of that execve, /proc/<pid>/environ can come back empty
	// (seen once in CI), so wait for the environment of the running sleep.
	testutil.Eventually(t, 10*time.Second, "A's environment holds its secret (else the test proves nothing)", func() error {
		if env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pidA)); !bytes.Contains(env, []byte("hunter2-secret")) {
			return fmt.Errorf("environ of %d: %d bytes without the secret", pidA, len(env))
		}
		return nil
	})

	keyB := AttemptKey{JobID: "r1-reader", TaskIndex: 0, Attempt: 1}
	try := func(name, cmd string) string { return cmd + "; echo " + name + "=$?; " }
	asgB := runAsg(epoch, keyB, "id -u; "+
		try("environ", fmt.Sprintf("cat /proc/%d/environ", pidA))+
		try("workdir", "ls "+dirA)+
		try("keyring", "cat "+keyring)+
		try("token", "cat "+token)+
		try("records", "ls "+filepath.Join(data, "attempts"))+
		try("listwork", "ls "+filepath.Join(data, "work"))+
		try("agentenv", fmt.Sprintf("cat /proc/%d/environ", os.Getpid()))+
		"echo own-work > mine && cat mine && echo cache > $HOME/.cache-test && echo home=ok; echo gpu=$CUDA_VISIBLE_DEVICES")
	asgB.Resources.Gpus = 1
	asgB.GpuIndices = []int32{0}
	f.push(asgB)
	r := f.waitReport(t, keyB, apiaryv1.ReportKind_REPORT_KIND_EXITED)
	out, errOut := r.GetStdoutTail(), r.GetStderrTail()
	t.Logf("B's stdout:\n%s\nB's stderr:\n%s", out, errOut)
	if strings.Contains(out+errOut, "hunter2") || strings.Contains(out+errOut, "SECRET-") {
		t.Fatal("attempt B read a secret")
	}
	for _, name := range []string{"environ", "workdir", "keyring", "token", "records", "listwork", "agentenv"} {
		if !strings.Contains(out, name+"=1") && !strings.Contains(out, name+"=2") {
			t.Errorf("%s: not refused (want a non-zero exit)", name)
		}
	}
	if n := strings.Count(errOut, "Permission denied"); n < 7 {
		t.Errorf("%d 'Permission denied' in B's stderr, want 7", n)
	}
	lines := strings.Fields(out)
	uidB, err := strconv.ParseUint(lines[0], 10, 32)
	if err != nil || !DefaultTaskUIDs.contains(uint32(uidB)) || uint32(uidB) == uidA {
		t.Errorf("B ran as uid %q, want another id of %s than A's %d", lines[0], DefaultTaskUIDs, uidA)
	}
	for _, want := range []string{"own-work", "home=ok", "gpu=0"} {
		if !strings.Contains(out, want) {
			t.Errorf("B's own work: no %q in its output", want)
		}
	}
	if r.GetExitCode() != 0 {
		t.Errorf("B exit %d, want 0", r.GetExitCode())
	}

	f.push(cancelAsg(epoch, keyA))
	f.waitReport(t, keyA, apiaryv1.ReportKind_REPORT_KIND_CANCELLED)
	waitFor(t, 5*time.Second, func() bool { return !lockHeld(uidA) }, "A's uid %d released", uidA)
	if ps := uidProcs("/proc", uidA); len(ps) > 0 {
		t.Errorf("processes of A's uid left after its id was released: %v", ps)
	}
}

// TestTaskUserEscapeeKilled: a task that leaves its process group (setsid)
// and ignores SIGTERM does not outlive its attempt, whether the attempt
// exited or timed out: with cgroups it is dead when the result is ready
// (its cgroup is killed) and the uid free; without them the reaper kills
// it (a scan of /proc for the attempt's uid; before task users only the
// next agent start's sweep did) and then frees the uid.
func TestTaskUserEscapeeKilled(t *testing.T) {
	needRoot(t)
	for _, mode := range []string{CgroupsOff, CgroupsAuto} {
		for _, end := range []string{"exit", "timeout"} {
			t.Run(mode+"/"+end, func(t *testing.T) {
				data := reachableDir(t)
				if err := os.MkdirAll(filepath.Join(data, "attempts"), 0o700); err != nil {
					t.Fatal(err)
				}
				c := newContainment(Config{DataDir: data, Cgroups: mode, TaskUsers: TaskUsersOn, TaskUIDs: DefaultTaskUIDs}, discardLog(), nil)
				c.setup()
				c.users.setup()
				t.Cleanup(c.close)
				tail := ""
				if end == "timeout" {
					tail = "; sleep 30"
				}
				s := spec(t, "setsid sh -c 'trap \"\" TERM; echo $$ > esc.tmp; mv esc.tmp escaped; exec sleep 30' & "+
					"while [ ! -e escaped ]; do sleep 0.01; done"+tail)
				s.Dir = filepath.Join(data, "work", "j", "0", "1")
				s.Record = filepath.Join(data, "attempts", "j.0.1")
				s.KillGrace = 100 * time.Millisecond
				s.contain, s.cgroup = c, "a-j.0.1"
				if end == "timeout" {
					s.Timeout = 500 * time.Millisecond
				}
				e, err := Start(s)
				if err != nil {
					t.Fatal(err)
				}
				uid := e.user.id
				esc := readPids(t, filepath.Join(s.Dir, "escaped"), 1)[0]
				t.Cleanup(func() { _ = syscall.Kill(esc, syscall.SIGKILL) })
				if pg, _ := syscall.Getpgid(esc); pg == e.Pid() {
					t.Fatal("escapee still in the attempt's group; the test proves nothing")
				}
				res := e.Wait()
				want := map[string]Outcome{"exit": OutcomeExited, "timeout": OutcomeTimedOut}[end]
				if res.Outcome != want {
					t.Fatalf("outcome %v, want %v", res.Outcome, want)
				}
				t.Logf("cgroup v%d", c.version())
				if c.version() == 0 {
					waitFor(t, 5*time.Second, func() bool { return !lockHeld(uid) }, "uid %d released by the reaper", uid)
				}
				if !processGone(esc) {
					t.Fatalf("escapee %d (uid %d) outlived its attempt", esc, uid)
				}
				if lockHeld(uid) {
					t.Errorf("uid %d still held after the attempt", uid)
				}
			})
		}
	}
}

// TestTaskUIDLocks: the ids are shared by every agent of the host through
// their lock files: one agent's ids are not handed to another until
// released, a full range is an error naming it, and an id whose last
// holder died while a process of it lives on is skipped until that
// process is gone.
func TestTaskUIDLocks(t *testing.T) {
	needRoot(t)
	r := UIDRange{First: 300000, Last: 300002} // outside the default range real agents here use
	a, b := newTaskUsers(r, discardLog()), newTaskUsers(r, discardLog())
	a.setup()
	b.setup()
	var held []*taskUser
	seen := map[uint32]bool{}
	for range 3 {
		u, err := a.acquire()
		if err != nil {
			t.Fatal(err)
		}
		if seen[u.id] || !r.contains(u.id) {
			t.Fatalf("id %d handed out twice or outside %s", u.id, r)
		}
		seen[u.id] = true
		held = append(held, u)
	}
	if _, err := a.acquire(); err == nil || !strings.Contains(err.Error(), r.String()) {
		t.Fatalf("full range: err %v, want one naming %s", err, r)
	}
	if _, err := b.acquire(); err == nil {
		t.Fatal("another agent got an id this one holds")
	}
	held[1].release()
	u, err := b.acquire()
	if err != nil || u.id != held[1].id {
		t.Fatalf("after a release: %v, %v; want id %d", u, err, held[1].id)
	}
	u.release()

	// id's holder died (its lock file still names it) and left a process.
	id := held[1].id
	if err := os.WriteFile(filepath.Join(taskUIDLockDir, strconv.FormatUint(uint64(id), 10)), []byte("999999999\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	left := exec.Command("sleep", "30")
	left.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: id, Gid: id, Groups: []uint32{}}}
	if err := left.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = left.Process.Kill(); _ = left.Wait() })
	if u, err := b.acquire(); err == nil {
		t.Fatalf("got id %d while a process of it lives and the others are held", u.id)
	}
	_ = left.Process.Kill()
	_ = left.Wait()
	if u, err = b.acquire(); err != nil || u.id != id {
		t.Fatalf("after the leftover died: %v, %v; want id %d", u, err, id)
	}
	u.release()
	held[0].release()
	held[2].release()
}

// TestTaskUsersConfig: the mode, the range and where task users cannot
// work are checked by New, naming the field; "auto" turns them off (and
// says why at start) where "on" refuses.
func TestTaskUsersConfig(t *testing.T) {
	for _, c := range []struct{ in, err string }{
		{"200000-265535", ""},
		{"1000-1000", ""},
		{"200000", "want FIRST-LAST"},
		{"a-b", "decimal"},
		{"0-65535", "must start at 1000 or above"},
		{"300-400", "must start at 1000 or above"},
		{"5000-4000", "below the first"},
		{"5000-4294967295", "must end below"},
	} {
		_, err := ParseUIDRange(c.in)
		if (c.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.err)) {
			t.Errorf("ParseUIDRange(%q): %v, want %q", c.in, err, c.err)
		}
	}
	base := Config{NodeID: "n1", CoordinatorAddrs: []string{"127.0.0.1:1"}, Capacity: Resources{CPUMillis: 1000, MemoryMB: 512}}
	with := func(mod func(*Config)) (Config, error) { c := base; mod(&c); return c.withDefaults() }
	if _, err := with(func(c *Config) { c.TaskUsers = "maybe" }); err == nil || !strings.Contains(err.Error(), "task users") {
		t.Errorf("bad mode: %v", err)
	}
	if _, err := with(func(c *Config) { c.TaskUIDs = UIDRange{First: 0, Last: 10} }); err == nil || !strings.Contains(err.Error(), "task uid range") {
		t.Errorf("range with root in it: %v", err)
	}
	open := reachableDir(t)
	closed := filepath.Join(open, "closed") // 0700: task users cannot reach what is below
	if err := os.Mkdir(closed, 0o700); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() != 0 {
		c, err := with(func(c *Config) { c.DataDir = open })
		if err != nil || c.TaskUsers != TaskUsersOff || !strings.Contains(c.taskUsersWhy, "not run as root") {
			t.Errorf("auto without root: %q (%s), %v; want off, saying why", c.TaskUsers, c.taskUsersWhy, err)
		}
		if _, err := with(func(c *Config) { c.DataDir, c.TaskUsers = open, TaskUsersOn }); err == nil || !strings.Contains(err.Error(), "root") {
			t.Errorf("on without root: %v, want refused", err)
		}
		return
	}
	c, err := with(func(c *Config) { c.DataDir = open })
	if err != nil || c.TaskUsers != TaskUsersOn || c.TaskUIDs != DefaultTaskUIDs {
		t.Errorf("auto as root, reachable: %q %s, %v; want on with the default range", c.TaskUsers, c.TaskUIDs, err)
	}
	c, err = with(func(c *Config) { c.DataDir = filepath.Join(closed, "agent") })
	if err != nil || c.TaskUsers != TaskUsersOff || !strings.Contains(c.taskUsersWhy, closed+" is not searchable") {
		t.Errorf("auto, unreachable: %q (%s), %v; want off naming %s", c.TaskUsers, c.taskUsersWhy, err, closed)
	}
	if _, err := with(func(c *Config) { c.DataDir, c.TaskUsers = filepath.Join(closed, "agent"), TaskUsersOn }); err == nil || !strings.Contains(err.Error(), closed+" is not searchable") {
		t.Errorf("on, unreachable: %v; want refused naming %s", err, closed)
	}
	c, err = with(func(c *Config) { c.DataDir, c.TaskUsers = open, TaskUsersOff })
	if err != nil || c.TaskUsers != TaskUsersOff || !strings.Contains(c.taskUsersWhy, "turned off") {
		t.Errorf("off: %q (%s), %v", c.TaskUsers, c.taskUsersWhy, err)
	}
}

// TestTaskUsersOffWarns: an agent whose tasks run as its own user says so
// at start, at WARN, with what they can read (the non-root agent's case;
// cmd/apiary's TestAgentWithoutRootWarns runs a real one as another user).
func TestTaskUsersOffWarns(t *testing.T) {
	logs := &testutil.LogBuffer{}
	startConnected(t, func(c *Config) {
		c.TaskUsers = TaskUsersOff
		c.LANAddr = LANOff
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	got := logs.String()
	if !strings.Contains(got, "level=WARN msg=\"tasks run as the agent's own user: they can read its credentials") ||
		!strings.Contains(got, "secret_env") || !strings.Contains(got, "turned off") {
		t.Errorf("no WARN about tasks running as the agent's user:\n%s", got)
	}
}

// TestHomeEnv: a HOME inherited from the agent becomes the work dir; one
// the job set stays.
func TestHomeEnv(t *testing.T) {
	t.Setenv("HOME", "/root-home")
	if got := homeEnv([]string{"A=1", "HOME=/root-home"}, "/w"); got[len(got)-1] != "HOME=/w" {
		t.Errorf("inherited HOME: %v", got)
	}
	if got := homeEnv([]string{"HOME=/root-home", "HOME=/job"}, "/w"); got[len(got)-1] != "HOME=/job" {
		t.Errorf("job's HOME: %v", got)
	}
	if got := homeEnv([]string{"A=1"}, "/w"); got[len(got)-1] != "HOME=/w" {
		t.Errorf("no HOME: %v", got)
	}
}
