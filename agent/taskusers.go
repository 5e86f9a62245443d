package agent

// Task users: every running attempt runs as a user of its own, taken from a
// range of ids that no account uses (systemd's DynamicUser=, Nomad's
// exec driver's "nobody" made per attempt), so that a task can read neither
// another task's /proc/<pid>/environ (its secret_env values) nor the
// agent's files (TLS key, join token, gossip keyring): a process may read
// another's environ only if it could ptrace it, which needs the same uid.
//
// An agent running as root takes a free id for each attempt (uid and gid
// the same number, no supplementary groups), creates the attempt's
// directory owned by it (mode 0700), and starts the process with
// SysProcAttr.Credential. The id is free again only once every process of
// the attempt is gone: its cgroup was emptied, or, without cgroups, no
// process of that uid is left. That takes a scan of /proc, which costs
// about 45 us per process on the host (reading /proc/<pid>/status), so a
// reaper goroutine scans once for the users of every attempt that ended
// meanwhile, kills what it finds (processes that left the group: setsid,
// daemons) and frees their ids. Ids are handed out round-robin from a
// random start, so an id comes back only after the rest of the range was
// used.
//
// Several agents share a host (apiary dev runs four): an id is held by a
// lock file under taskUIDLockDir, flock(2)ed while the attempt runs, which
// the kernel releases if the agent dies. The file then still names the
// dead holder, and the next agent that locks it first checks that no
// process of the uid survived (a task that left its group while its agent
// was SIGKILLed); if one did, the id is skipped until the restarted agent's
// sweep kills it.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Task user modes (Config.TaskUsers).
const (
	// TaskUsersAuto: on when the agent runs as root on Linux and its work
	// dir can be reached by other users (every directory above the data
	// dir searchable by others); otherwise off, logged at WARN at start.
	TaskUsersAuto = "auto"
	// TaskUsersOn: on; New fails when the agent does not run as root or
	// the work dir cannot be reached.
	TaskUsersOn = "on"
	// TaskUsersOff: every task runs as the agent's own user (logged at
	// WARN at start).
	TaskUsersOff = "off"
)

// DefaultTaskUIDs is the default range of task user ids: above the
// /etc/subuid range Debian gives the first user (100000-165535), 65536
// ids.
var DefaultTaskUIDs = UIDRange{First: 200000, Last: 265535}

// taskUIDLockDir holds one lock file per task user id in use on the host,
// shared by every agent on it (see the file comment).
const taskUIDLockDir = "/run/apiary/task-uids"

// minTaskUID is the lowest id a range may start at: distributions give
// ids below 1000 to system accounts.
const minTaskUID = 1000

// UIDRange is an inclusive range of user (and group) ids.
type UIDRange struct{ First, Last uint32 }

// ParseUIDRange parses "FIRST-LAST" (decimal, inclusive), as
// `apiary agent --task-uid-range` takes it. The error names the rule.
func ParseUIDRange(s string) (UIDRange, error) {
	a, b, ok := strings.Cut(strings.TrimSpace(s), "-")
	if !ok {
		return UIDRange{}, fmt.Errorf("task uid range %q: want FIRST-LAST, e.g. %s", s, DefaultTaskUIDs)
	}
	first, err1 := strconv.ParseUint(strings.TrimSpace(a), 10, 32)
	last, err2 := strconv.ParseUint(strings.TrimSpace(b), 10, 32)
	if err1 != nil || err2 != nil {
		return UIDRange{}, fmt.Errorf("task uid range %q: FIRST and LAST must be decimal user ids", s)
	}
	r := UIDRange{First: uint32(first), Last: uint32(last)}
	return r, r.validate()
}

// String returns "FIRST-LAST".
func (r UIDRange) String() string { return fmt.Sprintf("%d-%d", r.First, r.Last) }

func (r UIDRange) size() uint32 { return r.Last - r.First + 1 }

func (r UIDRange) contains(id uint32) bool { return id >= r.First && id <= r.Last }

func (r UIDRange) validate() error {
	switch {
	case r.First < minTaskUID:
		return fmt.Errorf("task uid range %s: must start at %d or above (lower ids are system accounts)", r, minTaskUID)
	case r.Last < r.First:
		return fmt.Errorf("task uid range %s: the last id is below the first", r)
	case r.Last >= 1<<31-1:
		return fmt.Errorf("task uid range %s: must end below %d", r, uint32(1<<31-1))
	}
	return nil
}

// resolveTaskUsers fills in TaskUsers (resolved to on or off) and
// TaskUIDs, and remembers why task users are off (logged at start). An
// error names the field: an unknown mode, a bad range, or "on" where it
// cannot work.
func (c *Config) resolveTaskUsers() error {
	mode := c.TaskUsers
	switch mode {
	case "":
		mode = TaskUsersAuto
	case TaskUsersAuto, TaskUsersOn, TaskUsersOff:
	default:
		return fmt.Errorf("task users: %q is not auto, on or off", c.TaskUsers)
	}
	if c.TaskUIDs == (UIDRange{}) {
		c.TaskUIDs = DefaultTaskUIDs
	}
	if err := c.TaskUIDs.validate(); err != nil {
		return err
	}
	c.TaskUsers, c.taskUsersWhy = TaskUsersOff, ""
	switch {
	case mode == TaskUsersOff:
		c.taskUsersWhy = "task users are turned off (--task-user-isolation=false)"
	case runtime.GOOS != "linux" || os.Geteuid() != 0:
		if mode == TaskUsersOn {
			return fmt.Errorf("task users: on needs an agent running as root on Linux (this one runs as uid %d on %s)", os.Geteuid(), runtime.GOOS)
		}
		c.taskUsersWhy = fmt.Sprintf("the agent does not run as root (uid %d)", os.Geteuid())
	default:
		if d := unsearchableAbove(c.DataDir); d != "" {
			if mode == TaskUsersOn {
				return fmt.Errorf("task users: the data dir %s cannot be reached by task users: %s is not searchable by others (chmod o+x it, or choose another --data-dir)", c.DataDir, d)
			}
			c.taskUsersWhy = fmt.Sprintf("the data dir %s cannot be reached by task users: %s is not searchable by others (chmod o+x it, or choose another --data-dir)", c.DataDir, d)
			return nil
		}
		c.TaskUsers = TaskUsersOn
	}
	return nil
}

// unsearchableAbove returns the first directory above dir (symlinks
// resolved) that users other than its owner and group may not search
// (no o+x), or "" when every one may be. dir itself is the agent's: it is
// made 0711 at start; missing directories are made 0755.
func unsearchableAbove(dir string) string {
	p := filepath.Dir(dir)
	for {
		if _, err := os.Stat(p); err == nil {
			break
		}
		up := filepath.Dir(p)
		if up == p {
			return ""
		}
		p = up
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return p
	}
	for d := real; ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil || st.Mode().Perm()&0o001 == 0 {
			return d
		}
		if up := filepath.Dir(d); up == d {
			return ""
		}
	}
}

// readableByOthers reports whether a user of the task range could read
// file: every directory above it searchable by others, and the file
// readable by others, or by its group when that group is a task id.
func readableByOthers(file string, r UIDRange) bool {
	real, err := filepath.EvalSymlinks(file)
	if err != nil {
		return false
	}
	st, err := os.Stat(real)
	if err != nil {
		return false
	}
	perm := st.Mode().Perm()
	gid := st.Sys().(*syscall.Stat_t).Gid
	if perm&0o004 == 0 && (perm&0o040 == 0 || !r.contains(gid)) {
		return false
	}
	for d := filepath.Dir(real); ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil || st.Mode().Perm()&0o001 == 0 {
			return false
		}
		if up := filepath.Dir(d); up == d {
			return true
		}
	}
}

// taskUsers hands out the task user ids of one agent.
type taskUsers struct {
	rng     UIDRange
	lockDir string
	log     *slog.Logger

	mu      sync.Mutex
	next    uint32          // offset in rng of the next id to try
	skip    map[uint32]bool // ids of accounts in /etc/passwd or /etc/group
	held    map[uint32]bool // ids this agent holds
	err     error           // why no id can be handed out (setup failed)
	reap    []*taskUser     // users of ended attempts for the reaper
	reaping bool            // the reaper goroutine runs
}

// reapBatch is how long the reaper gathers the users of attempts that end
// together before it scans /proc once for all of them.
const reapBatch = 20 * time.Millisecond

// taskUser is one attempt's user: uid and gid are the same number.
type taskUser struct {
	id    uint32
	lock  *os.File
	users *taskUsers
}

func newTaskUsers(r UIDRange, log *slog.Logger) *taskUsers {
	return &taskUsers{rng: r, lockDir: taskUIDLockDir, log: log,
		next: rand.Uint32N(r.size()), skip: map[uint32]bool{}, held: map[uint32]bool{},
		err: errors.New("task users: not set up yet")}
}

// setup makes the lock directory (root's, 0700, no symlink) and skips the
// ids of existing accounts and groups, with a WARN when the range holds
// some or overlaps /etc/subuid or /etc/subgid (container user namespaces).
// A failure is kept and returned by every acquire: attempts then fail to
// start (a node fault) rather than run without a user of their own.
func (u *taskUsers) setup() {
	err := secureDir(u.lockDir)
	skip := map[uint32]bool{}
	var names []string
	for _, f := range []string{"/etc/passwd", "/etc/group"} {
		for id, name := range accountIDs(f) {
			if u.rng.contains(id) {
				skip[id] = true
				names = append(names, name)
			}
		}
	}
	u.mu.Lock()
	u.skip, u.err = skip, err
	u.mu.Unlock()
	if len(names) > 0 {
		u.log.Warn("the task uid range holds ids of existing accounts; they are skipped", "range", u.rng, "accounts", names)
	}
	for _, f := range []string{"/etc/subuid", "/etc/subgid"} {
		if owner := subIDOverlap(f, u.rng); owner != "" {
			u.log.Warn("the task uid range overlaps ids delegated to a user's namespaces; their processes could read the tasks'", "range", u.rng, "file", f, "user", owner)
		}
	}
	if err != nil {
		u.log.Error("task users unusable: attempts fail to start until the agent is restarted", "err", err)
	}
}

// secureDir makes dir (and its parent) if missing, mode 0700, and checks
// that it is a directory owned by this user, not a symlink.
func secureDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("task users: lock dir: %w", err)
	}
	st, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("task users: lock dir: %w", err)
	}
	if !st.IsDir() || st.Sys().(*syscall.Stat_t).Uid != uint32(os.Geteuid()) {
		return fmt.Errorf("task users: lock dir %s: not a directory owned by uid %d", dir, os.Geteuid())
	}
	if st.Mode().Perm() != 0o700 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("task users: lock dir: %w", err)
		}
	}
	return nil
}

// accountIDs returns the ids (third field) of an /etc/passwd or
// /etc/group file, with their names.
func accountIDs(file string) map[uint32]string {
	out := map[uint32]string{}
	b, err := os.ReadFile(file)
	if err != nil {
		return out
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Split(strings.TrimSpace(line), ":")
		if len(f) < 3 {
			continue
		}
		if id, err := strconv.ParseUint(f[2], 10, 32); err == nil {
			out[uint32(id)] = f[0]
		}
	}
	return out
}

// subIDOverlap returns the user of the first /etc/subuid-style line
// (user:first:count) whose ids overlap r, or "".
func subIDOverlap(file string, r UIDRange) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return ""
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Split(strings.TrimSpace(line), ":")
		if len(f) != 3 {
			continue
		}
		first, err1 := strconv.ParseUint(f[1], 10, 32)
		n, err2 := strconv.ParseUint(f[2], 10, 32)
		if err1 == nil && err2 == nil && n > 0 && first <= uint64(r.Last) && first+n-1 >= uint64(r.First) {
			return f[0]
		}
	}
	return ""
}

// acquire takes a free id for one attempt. The error (a node fault) says
// why none is free.
func (u *taskUsers) acquire() (*taskUser, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.err != nil {
		return nil, u.err
	}
	n := u.rng.size()
	for i := range n {
		off := (u.next + i) % n
		id := u.rng.First + off
		if u.skip[id] || u.held[id] {
			continue
		}
		f, err := u.tryLock(id)
		if err != nil {
			return nil, err
		}
		if f == nil {
			continue
		}
		u.next = (off + 1) % n
		u.held[id] = true
		return &taskUser{id: id, lock: f, users: u}, nil
	}
	return nil, fmt.Errorf("task users: every id of %s is in use on this host", u.rng)
}

// tryLock locks id's file; nil (and no error) when another agent holds it,
// or when its last holder died and left processes of id behind.
func (u *taskUsers) tryLock(id uint32) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(u.lockDir, strconv.FormatUint(uint64(id), 10)),
		os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("task users: lock file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, nil
		}
		return nil, fmt.Errorf("task users: lock file: %w", err)
	}
	var b [1]byte
	if n, _ := f.ReadAt(b[:], 0); n > 0 && len(uidProcs("/proc", id)) > 0 {
		// The holder died without releasing it, and the attempt's
		// processes live on: not free until its agent's sweep.
		f.Close()
		return nil, nil
	}
	if err := f.Truncate(0); err == nil {
		_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("task users: lock file: %w", err)
	}
	return f, nil
}

// release frees the id: every process of the attempt must be gone.
func (t *taskUser) release() {
	_ = t.lock.Truncate(0)
	t.lock.Close()
	t.users.mu.Lock()
	delete(t.users.held, t.id)
	t.users.mu.Unlock()
}

// end frees the id once every process of it is gone: at once when the
// attempt's cgroup was emptied (gone is true; no process can leave a
// cgroup without root), else through the reaper, which kills what a scan
// of /proc finds with that uid first.
func (t *taskUser) end(gone bool) {
	if gone {
		t.release()
		return
	}
	u := t.users
	u.mu.Lock()
	u.reap = append(u.reap, t)
	start := !u.reaping
	u.reaping = true
	u.mu.Unlock()
	if start {
		go u.reaper()
	}
}

// reaper frees the ids of ended attempts, a batch at a time, and returns
// when none is left. An id with processes that survive killWait stays
// held until the agent exits (never handed out again by it; the next
// holder checks it), and is logged.
func (u *taskUsers) reaper() {
	for {
		time.Sleep(reapBatch)
		u.mu.Lock()
		batch := u.reap
		u.reap = nil
		if len(batch) == 0 {
			u.reaping = false
			u.mu.Unlock()
			return
		}
		u.mu.Unlock()
		ids := map[uint32]bool{}
		for _, t := range batch {
			ids[t.id] = true
		}
		left := killUIDs("/proc", ids, killWait)
		for _, t := range batch {
			if len(left[t.id]) > 0 {
				u.log.Error("processes of an attempt's task user survived the kill; the id stays held", "uid", t.id, "pids", left[t.id])
				continue
			}
			t.release()
		}
	}
}

// credential is the attempt's process credential: uid and gid the id, no
// supplementary groups.
func (t *taskUser) credential() *syscall.Credential {
	return &syscall.Credential{Uid: t.id, Gid: t.id, Groups: []uint32{}}
}

// uidProcs returns the live processes (not zombies) under procRoot whose
// real, effective, saved or file-system uid is id.
func uidProcs(procRoot string, id uint32) []int {
	return procsOf(procRoot, map[uint32]bool{id: true})[id]
}

// procsOf returns, for each of ids that has one, the live processes (not
// zombies) under procRoot whose real, effective, saved or file-system uid
// it is: one scan of /proc for all of them.
func procsOf(procRoot string, ids map[uint32]bool) map[uint32][]int {
	ents, err := os.ReadDir(procRoot)
	if err != nil {
		return nil
	}
	found := map[uint32][]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "status"))
		if err != nil {
			continue
		}
		var match []uint32
		zombie := false
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			k, v, _ := strings.Cut(sc.Text(), ":")
			switch k {
			case "State":
				v = strings.TrimSpace(v)
				zombie = strings.HasPrefix(v, "Z") || strings.HasPrefix(v, "X")
			case "Uid":
				for _, f := range strings.Fields(v) {
					if id, err := strconv.ParseUint(f, 10, 32); err == nil && ids[uint32(id)] && !slices.Contains(match, uint32(id)) {
						match = append(match, uint32(id))
					}
				}
			}
		}
		if !zombie {
			for _, id := range match {
				found[id] = append(found[id], pid)
			}
		}
	}
	return found
}

// killUIDs SIGKILLs every process of the uids ids, scanning again until
// none is left, for at most d; it returns the processes left of each uid
// (none: every one is gone).
func killUIDs(procRoot string, ids map[uint32]bool, d time.Duration) map[uint32][]int {
	end := time.Now().Add(d)
	for {
		found := procsOf(procRoot, ids)
		if len(found) == 0 || time.Now().After(end) {
			return found
		}
		for _, pids := range found {
			for _, p := range pids {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
		}
		pollUntil(min(time.Until(end), 200*time.Millisecond), func() bool { return len(procsOf(procRoot, ids)) == 0 })
	}
}

// makeAttemptDir creates an attempt's directory dir owned by user t, mode
// 0700, its missing parents 0711 (searchable, not listable, by the task
// users). A dir left by an earlier start of the same attempt is removed
// first: its files were written by another user, and the agent (root)
// opens the logs in it.
func (t *taskUser) makeAttemptDir(dir string) error {
	if err := os.Mkdir(dir, 0o700); errors.Is(err, fs.ErrExist) {
		if err := os.RemoveAll(dir); err != nil {
			return err
		}
		err = os.Mkdir(dir, 0o700)
		if err != nil {
			return err
		}
	} else if err != nil {
		if err := mkdirAllMode(filepath.Dir(dir), 0o711); err != nil {
			return err
		}
		if err := os.Mkdir(dir, 0o700); err != nil {
			return err
		}
	}
	return os.Lchown(dir, int(t.id), int(t.id))
}

// mkdirAllMode is os.MkdirAll with mode set on every directory it makes
// (the umask would clear bits of it).
func mkdirAllMode(dir string, mode os.FileMode) error {
	if st, err := os.Stat(dir); err == nil {
		if !st.IsDir() {
			return fmt.Errorf("%s: not a directory", dir)
		}
		return nil
	}
	if err := mkdirAllMode(filepath.Dir(dir), mode); err != nil {
		return err
	}
	if err := os.Mkdir(dir, mode); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return os.Chmod(dir, mode)
}

// homeEnv returns env with HOME set to dir when it holds the agent's own
// HOME (inherited through BaseEnv, which a task user cannot write to);
// a HOME the job set is left alone.
func homeEnv(env []string, dir string) []string {
	own, ok := os.LookupEnv("HOME")
	if !ok {
		return env
	}
	home, set := "", false
	for _, kv := range env {
		if v, found := strings.CutPrefix(kv, "HOME="); found {
			home, set = v, true
		}
	}
	if set && home != own {
		return env
	}
	return append(env[:len(env):len(env)], "HOME="+dir)
}

// setupTaskUsers runs at start, in the data-dir part: with task users on,
// it closes the data dir to them (DataDir and DataDir/work 0711, the
// records 0700), sets up the ids and warns about each credential file
// (Config.SecretFiles, the gossip keyring) a task user could read; with
// them off, it warns that tasks run as the agent's own user.
func (a *Agent) setupTaskUsers() {
	c := a.cfg
	if c.TaskUsers != TaskUsersOn || a.contain.users == nil {
		a.log.Warn("tasks run as the agent's own user: they can read its credentials (TLS key, join token, gossip keyring) "+
			"and each other's environment, secret_env values included; run agents as root with task users on, or one agent per trust domain",
			"uid", os.Geteuid(), "why", c.taskUsersWhy)
		return
	}
	for dir, mode := range map[string]os.FileMode{c.DataDir: 0o711, filepath.Join(c.DataDir, "work"): 0o711,
		filepath.Join(c.DataDir, "attempts"): 0o700} {
		if err := os.Chmod(dir, mode); err != nil {
			a.log.Error("task users: data dir mode not set", "dir", dir, "err", err)
		}
	}
	a.contain.users.setup()
	for _, f := range append([]string{c.GossipKeyringFile}, c.SecretFiles...) {
		if f != "" && readableByOthers(f, c.TaskUIDs) {
			a.log.Warn("a credential file of the agent is readable by other users, tasks included: chmod 600 it", "file", f)
		}
	}
	a.log.Info("attempts run as users of their own", "uids", c.TaskUIDs.String(), "locks", a.contain.users.lockDir)
}
