package agent

// Cgroups per attempt: the agent's parent cgroup, one cgroup per attempt
// under it, the kill that no escapee survives, usage, and the sweep of a
// previous run's attempt cgroups. Small direct file writes, not a library:
// the agent needs mkdir, rmdir and a dozen control files, and
// containerd/cgroups/v3 (which resolves and builds here) brings
// godbus, go-systemd and opencontainers/runtime-spec for v1, cilium/ebpf for
// v2, and creates a cgroup in every v1 hierarchy (cpuset, blkio, devices,
// ...) unless told otherwise.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"apiary.dev/apiary/internal/telemetry"
)

// The tasks' parent cgroup weighs less than the agent when the CPU is
// contended: cpu.shares 256 under v1 (a quarter of the 1024 of a cgroup or
// a nice-0 thread beside it; the agent's threads sit in its own cgroup, the
// parent's parent), cpu.weight 25 under v2 (a quarter of the default 100).
// Within the parent, attempts share equally. This is Kubernetes' and
// systemd's arrangement: the node's daemons outweigh the pods' slice.
const (
	taskCPUShares = 256
	taskCPUWeight = 25
)

// killWait bounds how long the kill of an attempt's cgroup waits for its
// processes to be gone before the cgroup is left for the next agent start.
const killWait = 10 * time.Second

// Usage is what an attempt's processes used, read from its cgroup.
type Usage struct {
	// Measured is false when the attempt ran without a cgroup; the other
	// fields are then 0.
	Measured bool
	// CPUSeconds is the user and system CPU time of all of the attempt's
	// processes, children and escapees included (cpuacct.usage under v1,
	// cpu.stat usage_usec under v2).
	CPUSeconds float64
	// MemoryBytes is the memory charged to the cgroup now, page cache
	// included (memory.usage_in_bytes, memory.current); 0 without a memory
	// controller.
	MemoryBytes int64
	// MemoryPeakBytes is the most charged at once (memory.max_usage_in_bytes,
	// memory.peak from Linux 5.19); 0 when the kernel does not say.
	MemoryPeakBytes int64
	// MemoryLimitBytes is the memory limit the attempt ran under
	// (Limits.MemoryMB, cgroup_limits.go); 0: none.
	MemoryLimitBytes int64
	// OOMKills counts the attempt's processes the OOM killer ended in its
	// cgroup (memory.oom_control oom_kill under v1, from Linux 4.13;
	// memory.events oom_kill under v2); -1 when the kernel does not say.
	OOMKills int64
	// MemoryLimitReached says that its memory reached the limit
	// (oomEvents: a failed charge counted, or the peak at the limit).
	MemoryLimitReached bool
}

// attemptCgroup is one attempt's cgroup: a directory per hierarchy.
type attemptCgroup struct {
	dirs []string
	// Where each file lives (the directory in its hierarchy), or "":
	// v2 is the attempt's v2 directory (all of the below there); freezer,
	// memory, cpu, cpuacct are v1 directories.
	v2, freezer, memory, cpu, cpuacct string
	// memLimit is the memory limit written (limitMemory), in bytes; 0:
	// none.
	memLimit int64
}

// attemptCgroupOf returns the attempt cgroup made of dirs, telling each
// directory's role by the control files in it (v2 has cgroup.controllers).
func attemptCgroupOf(dirs []string) *attemptCgroup {
	g := &attemptCgroup{dirs: dirs}
	for _, d := range dirs {
		if exists(d, "cgroup.controllers") {
			g.v2 = d
			continue
		}
		if exists(d, "freezer.state") {
			g.freezer = d
		}
		if exists(d, "memory.usage_in_bytes") {
			g.memory = d
		}
		if exists(d, "cpuacct.usage") {
			g.cpuacct = d
		}
		if exists(d, "cpu.cfs_quota_us") {
			g.cpu = d
		}
	}
	return g
}

func exists(dir, file string) bool {
	_, err := os.Stat(filepath.Join(dir, file))
	return err == nil
}

// procs returns the processes in the cgroup and its descendants in every
// hierarchy (each once), without self; sawSelf says whether self was among
// them (a launcher thread that could not leave: never freeze that cgroup).
func (g *attemptCgroup) procs(self int) (pids []int, sawSelf bool) {
	seen := map[int]bool{}
	for _, d := range g.dirs {
		_ = filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err != nil || !e.IsDir() {
				return nil
			}
			b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
			if err != nil {
				return nil
			}
			for _, f := range strings.Fields(string(b)) {
				pid, err := strconv.Atoi(f)
				switch {
				case err != nil || seen[pid]:
				case pid == self:
					sawSelf = true
				default:
					seen[pid] = true
					pids = append(pids, pid)
				}
			}
			return nil
		})
	}
	return pids, sawSelf
}

// signal sends sig to every process of the cgroup (not frozen first: for
// SIGTERM, and for SIGKILL ahead of kill). It does not wait. It reads one
// cgroup.procs (every hierarchy holds the same processes; kill covers
// descendant cgroups), as it runs under the agent's lock on cancels.
func (g *attemptCgroup) signal(sig syscall.Signal) {
	d := g.v2
	if d == "" {
		d = g.freezer
	}
	if d == "" && len(g.dirs) > 0 {
		d = g.dirs[0]
	}
	b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
	if err != nil {
		return
	}
	self := os.Getpid()
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil && pid != self {
			_ = syscall.Kill(pid, sig)
		}
	}
}

// kill kills every process of the cgroup and waits until none is left, for
// at most d; it reports whether the cgroup is empty. Under v2 it writes
// cgroup.kill (Linux 5.14), which the kernel applies to every member at
// once; otherwise it freezes the cgroup, SIGKILLs every member (a frozen
// process cannot fork, so none is missed and none of the pids is reused),
// and thaws it, so the kills take effect. Repeated while processes remain.
func (g *attemptCgroup) kill(d time.Duration) bool {
	self := os.Getpid()
	end := time.Now().Add(d)
	for {
		pids, sawSelf := g.procs(self)
		if len(pids) == 0 && !sawSelf {
			return true
		}
		switch {
		case g.v2 != "" && exists(g.v2, "cgroup.kill") && !sawSelf:
			_ = writeFile(g.v2, "cgroup.kill", "1")
		case (g.freezer != "" || g.v2 != "") && !sawSelf:
			g.freeze(true)
			pids, _ = g.procs(self)
			for _, p := range pids {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
			g.freeze(false)
		default:
			for _, p := range pids {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
		}
		if g.waitEmpty(self, min(time.Until(end), 500*time.Millisecond)) {
			return !sawSelf
		}
		if time.Now().After(end) {
			return false
		}
	}
}

// freeze freezes (on) or thaws the cgroup; freezing waits up to 200 ms for
// the kernel to say it is frozen (a process in uninterruptible sleep delays
// it; the kill goes on regardless and is repeated).
func (g *attemptCgroup) freeze(on bool) {
	if g.v2 != "" {
		_ = writeFile(g.v2, "cgroup.freeze", map[bool]string{true: "1", false: "0"}[on])
		if on {
			pollUntil(200*time.Millisecond, func() bool { return eventsField(g.v2, "frozen") == 1 })
		}
		return
	}
	if g.freezer == "" {
		return
	}
	_ = writeFile(g.freezer, "freezer.state", map[bool]string{true: "FROZEN", false: "THAWED"}[on])
	if on {
		pollUntil(200*time.Millisecond, func() bool {
			b, _ := os.ReadFile(filepath.Join(g.freezer, "freezer.state"))
			return strings.TrimSpace(string(b)) == "FROZEN"
		})
	}
}

// waitEmpty waits up to d until no process but self is in the cgroup.
func (g *attemptCgroup) waitEmpty(self int, d time.Duration) bool {
	return pollUntil(d, func() bool {
		pids, _ := g.procs(self)
		return len(pids) == 0
	})
}

// pollUntil calls cond every 1 ms, backing off to 20 ms, until it holds
// (true) or d passed (false). The kernel offers no wake-up for a v1
// cgroup becoming empty that a process can wait on.
func pollUntil(d time.Duration, cond func() bool) bool {
	end := time.Now().Add(d)
	wait := time.Millisecond
	for {
		if cond() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
		time.Sleep(wait)
		wait = min(2*wait, 20*time.Millisecond)
	}
}

// usage reads the cgroup's CPU time and memory.
func (g *attemptCgroup) usage() Usage {
	var u Usage
	switch {
	case g.cpuacct != "":
		if ns, err := readInt(g.cpuacct, "cpuacct.usage"); err == nil {
			u.CPUSeconds, u.Measured = float64(ns)/1e9, true
		}
	case g.v2 != "":
		if us, ok := statField(g.v2, "cpu.stat", "usage_usec"); ok {
			u.CPUSeconds, u.Measured = float64(us)/1e6, true
		}
	}
	switch {
	case g.memory != "":
		u.MemoryBytes, _ = readInt(g.memory, "memory.usage_in_bytes")
		u.MemoryPeakBytes, _ = readInt(g.memory, "memory.max_usage_in_bytes")
	case g.v2 != "":
		u.MemoryBytes, _ = readInt(g.v2, "memory.current")
		u.MemoryPeakBytes, _ = readInt(g.v2, "memory.peak")
	}
	if u.MemoryBytes > 0 || u.MemoryPeakBytes > 0 {
		u.Measured = true
	}
	return u
}

// remove removes the cgroup's directories, descendants first; processes
// that just died may keep a directory busy for a moment.
func (g *attemptCgroup) remove() error {
	var errs []error
	for _, d := range g.dirs {
		errs = append(errs, rmdirTree(d))
	}
	return errors.Join(errs...)
}

func rmdirTree(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	for _, e := range ents {
		if e.IsDir() {
			_ = rmdirTree(filepath.Join(dir, e.Name()))
		}
	}
	var rmErr error
	pollUntil(time.Second, func() bool {
		rmErr = syscall.Rmdir(dir)
		return rmErr == nil || errors.Is(rmErr, syscall.ENOENT) || !errors.Is(rmErr, syscall.EBUSY)
	})
	if rmErr != nil && !errors.Is(rmErr, syscall.ENOENT) {
		return fmt.Errorf("remove cgroup %s: %w", dir, rmErr)
	}
	return nil
}

func writeFile(dir, file, value string) error {
	f, err := os.OpenFile(filepath.Join(dir, file), os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	return errors.Join(err, f.Close())
}

func readInt(dir, file string) (int64, error) {
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// statField reads "key value" lines (cpu.stat, cgroup.events) and returns
// key's value.
func statField(dir, file, key string) (int64, bool) {
	f, err := os.Open(filepath.Join(dir, file))
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

func eventsField(dir, key string) int64 {
	n, _ := statField(dir, "cgroup.events", key)
	return n
}

// containment is how an agent contains its attempts: the cgroups it
// found usable (setup), the launcher threads that start the processes at
// a lower priority and inside their cgroup (cgroup_launch.go), and the usage of
// running attempts for the metrics. Without cgroups it still lowers the
// tasks' priority; the process groups and the records of killOrphans are
// the rest of the containment then.
type containment struct {
	mode       string
	parentName string
	recDir     string // <DataDir>/attempts: the records list attempt cgroups
	log        *slog.Logger
	users      *taskUsers // the attempts' own users (taskusers.go); nil: off

	mu      sync.Mutex
	layout  *cgroupLayout // nil: no cgroups
	parents []string      // the parent cgroup in each hierarchy of layout
	running map[*attemptCgroup]struct{}
	doneCPU float64 // CPU seconds of attempts whose cgroup is gone
}

// newContainment returns an agent's containment (no cgroups until setup)
// and registers its metrics on reg.
func newContainment(c Config, log *slog.Logger, reg prometheus.Registerer) *containment {
	ct := &containment{mode: c.Cgroups, parentName: cgroupParentName(c.DataDir),
		recDir: filepath.Join(c.DataDir, "attempts"), log: log, running: map[*attemptCgroup]struct{}{}}
	if c.TaskUsers == TaskUsersOn {
		ct.users = newTaskUsers(c.TaskUIDs, log)
	}
	if reg != nil {
		telemetry.RegisterTaskUsage(reg, ct.metrics)
	}
	return ct
}

// setup finds the cgroups the agent can use (detectCgroups), creates the
// parent cgroup in each hierarchy and starts the launcher threads. When no
// cgroups are usable it logs why once (a warning; an error when --cgroups
// named a version) and the agent goes on without them.
func (c *containment) setup() {
	if err := startLaunchers(); err != nil {
		c.log.Warn("tasks run at the agent's own priority", "err", err)
	}
	cands, why := detectCgroups("/proc", os.Getpid(), c.mode)
	for _, l := range cands {
		parents, err := setupLayout(&l, c.parentName)
		if err != nil {
			why = append(why, err.Error())
			continue
		}
		c.mu.Lock()
		c.layout, c.parents = &l, parents
		c.mu.Unlock()
		c.log.Info("attempts run in cgroups", "version", l.version, "parents", parents,
			"memory", l.has("memory"), "cpu_weight", l.has("cpu"))
		c.logLimits("")
		return
	}
	defer c.logLimits("no cgroups for attempts")
	lvl := slog.LevelWarn
	if c.mode == CgroupsV1 || c.mode == CgroupsV2 {
		lvl = slog.LevelError
	}
	c.log.Log(context.Background(), lvl, "no cgroups for attempts: a task that leaves its process group (setsid) outlives its attempt until the agent restarts",
		"cgroups", c.mode, "why", strings.Join(why, "; "))
}

// setupLayout creates the parent cgroup name in each hierarchy of l and
// returns their directories. v1: cpu.shares of the parent is taskCPUShares;
// the agent must be able to write its own cgroups' tasks files (its
// launcher threads go back there after each start). v2: the controllers of
// v2Wanted the agent's cgroup offers are enabled for the parent's children
// (and in the agent's cgroup first, which fails when it holds processes
// and is not the root: "no internal processes"; the agent does not move
// itself), l's controllers become those the parent really has, and
// cpu.weight of the parent is taskCPUWeight when it has cpu.
func setupLayout(l *cgroupLayout, name string) ([]string, error) {
	var parents []string
	undo := func() {
		for _, p := range parents {
			_ = syscall.Rmdir(p)
		}
	}
	for _, h := range l.hiers {
		p := filepath.Join(h.home, name)
		if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			undo()
			return nil, fmt.Errorf("cgroup v%d: %w", l.version, err)
		}
		parents = append(parents, p)
		if l.version == 1 {
			if err := syscall.Access(filepath.Join(h.home, "tasks"), 2 /* W_OK */); err != nil {
				undo()
				return nil, fmt.Errorf("cgroup v1: the agent's own cgroup %s: tasks not writable: %w", h.home, err)
			}
			if slices.Contains(h.controllers, "cpu") {
				_ = writeFile(p, "cpu.shares", strconv.Itoa(taskCPUShares))
			}
			continue
		}
		if err := syscall.Access(filepath.Join(p, "cgroup.procs"), 2 /* W_OK */); err != nil {
			undo()
			return nil, fmt.Errorf("cgroup v2: %s: cgroup.procs not writable: %w", p, err)
		}
		for _, c := range h.controllers {
			_ = writeFile(h.home, "cgroup.subtree_control", "+"+c)
		}
		b, _ := os.ReadFile(filepath.Join(p, "cgroup.controllers"))
		var got []string
		for _, c := range strings.Fields(string(b)) {
			if slices.Contains(v2Wanted, c) && writeFile(p, "cgroup.subtree_control", "+"+c) == nil {
				got = append(got, c)
			}
		}
		slices.Sort(got)
		l.hiers[0].controllers = got
		if slices.Contains(got, "cpu") {
			_ = writeFile(p, "cpu.weight", strconv.Itoa(taskCPUWeight))
		}
	}
	return parents, nil
}

// version returns the cgroup version in use, 0 for none.
func (c *containment) version() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.layout == nil {
		return 0
	}
	return c.layout.version
}

// create makes the cgroup of one attempt, named name, in every hierarchy;
// nil without cgroups.
func (c *containment) create(name string) (*attemptCgroup, error) {
	c.mu.Lock()
	parents := c.parents
	c.mu.Unlock()
	if parents == nil {
		return nil, nil
	}
	var dirs []string
	for _, p := range parents {
		d := filepath.Join(p, name)
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			_ = (&attemptCgroup{dirs: dirs}).remove()
			return nil, fmt.Errorf("cgroup: %w", err)
		}
		dirs = append(dirs, d)
	}
	g := attemptCgroupOf(dirs)
	c.mu.Lock()
	c.running[g] = struct{}{}
	c.mu.Unlock()
	return g, nil
}

// start starts cmd on a launcher thread (at the tasks' lower priority) in
// cgroup g (nil: none): under v2 by clone3's CLONE_INTO_CGROUP
// (SysProcAttr.UseCgroupFD), under v1 by the launcher thread joining g's
// cgroups before the fork, so the process is in its cgroup from its first
// instruction and nothing it forks can be outside. See cgroup_launch.go.
func (c *containment) start(cmd *exec.Cmd, g *attemptCgroup) error {
	var join, home []string
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	if g != nil && g.v2 != "" {
		fd, err := syscall.Open(g.v2, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
		if err != nil {
			return nodeFault(fmt.Errorf("cgroup: %w", err))
		}
		defer syscall.Close(fd)
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
	} else if g != nil {
		c.mu.Lock()
		if c.layout != nil {
			for _, h := range c.layout.hiers {
				home = append(home, h.home)
			}
		}
		c.mu.Unlock()
		if home == nil {
			return nodeFault(errors.New("cgroup: the agent's cgroups were closed"))
		}
		join = g.dirs
	}
	err, stuck := launch(cmd, join, home)
	if stuck != nil {
		c.log.Error("a launcher thread could not leave an attempt's cgroup; it is retired", "err", stuck)
	}
	return err
}

// finish kills whatever is left in g (kill), reads its usage, and removes
// it; empty says whether no process is left in it. A cgroup that does not
// empty within killWait is left for the next agent start's sweep, and
// logged.
func (c *containment) finish(g *attemptCgroup) (u Usage, empty bool) {
	empty = g.kill(killWait)
	u = g.usage()
	if g.memLimit > 0 {
		u.MemoryLimitBytes = g.memLimit
		u.OOMKills, u.MemoryLimitReached = g.oomEvents()
	}
	c.mu.Lock()
	delete(c.running, g)
	c.doneCPU += u.CPUSeconds
	c.mu.Unlock()
	if !empty {
		c.log.Error("an attempt's cgroup still holds processes after the kill; left for the next start", "cgroup", g.dirs)
		return u, false
	}
	if err := g.remove(); err != nil {
		c.log.Warn("attempt cgroup not removed", "err", err)
	}
	return u, true
}

// metrics is the usage of the attempts for the metrics: CPU seconds of
// every attempt so far (finished ones included), memory charged to running
// ones now, and the cgroup version (ok false without cgroups).
func (c *containment) metrics() (cpuSeconds, memoryBytes float64, version int, ok bool) {
	c.mu.Lock()
	if c.layout == nil {
		c.mu.Unlock()
		return 0, 0, 0, false
	}
	version, cpuSeconds = c.layout.version, c.doneCPU
	running := make([]*attemptCgroup, 0, len(c.running))
	for g := range c.running {
		running = append(running, g)
	}
	c.mu.Unlock()
	for _, g := range running {
		u := g.usage()
		cpuSeconds += u.CPUSeconds
		memoryBytes += float64(u.MemoryBytes)
	}
	return cpuSeconds, memoryBytes, version, true
}

// sweep kills and removes the attempt cgroups a previous run of this agent
// left: every child of the parent cgroups (whichever cgroups this run
// uses), and every cgroup an attempt record names (so one made under
// another layout or another agent cgroup is found too). It runs at start,
// before any attempt, and returns how many processes were in them.
func (c *containment) sweep() int {
	c.mu.Lock()
	parents := c.parents
	c.mu.Unlock()
	byName := map[string][]string{}
	var names []string
	for _, p := range parents {
		ents, _ := os.ReadDir(p)
		for _, e := range ents {
			if e.IsDir() {
				if _, ok := byName[e.Name()]; !ok {
					names = append(names, e.Name())
				}
				byName[e.Name()] = append(byName[e.Name()], filepath.Join(p, e.Name()))
			}
		}
	}
	groups := make([][]string, 0, len(names))
	for _, n := range names {
		groups = append(groups, byName[n])
	}
	for _, rec := range readRecords(c.recDir) {
		var dirs []string
		for _, d := range rec.Cgroups {
			if exists(d, "cgroup.procs") {
				dirs = append(dirs, d)
			}
		}
		if len(dirs) > 0 {
			groups = append(groups, dirs)
		}
	}
	killed := 0
	for _, dirs := range groups {
		g := attemptCgroupOf(dirs)
		pids, _ := g.procs(os.Getpid())
		if len(pids) > 0 {
			c.log.Warn("killing the processes of a previous run's attempt cgroup", "cgroup", dirs, "processes", len(pids))
		}
		killed += len(pids)
		if !g.kill(killWait) {
			c.log.Error("a previous run's attempt cgroup still holds processes after the kill", "cgroup", dirs)
			continue
		}
		if err := g.remove(); err != nil {
			c.log.Warn("previous run's attempt cgroup not removed", "err", err)
		}
	}
	return killed
}

// close removes the parent cgroups (when empty: every attempt has ended).
func (c *containment) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.parents {
		_ = syscall.Rmdir(p)
	}
	c.layout, c.parents = nil, nil
}

// startContainment sets up the agent's containment (cgroups, launcher
// threads, task users) and kills and removes every attempt cgroup a
// previous run left. It runs in the data-dir part, before killOrphans'
// scans.
func (a *Agent) startContainment() {
	a.setupTaskUsers()
	a.contain.setup()
	if n := a.contain.sweep(); n > 0 {
		a.log.Warn("killed processes in a previous run's attempt cgroups", "processes", n)
	}
}

// attemptCgroupName is the name of key's cgroup under the agent's parent:
// "a-" and the name of its record (<job>.<task>.<attempt>), so that no job
// id can name a cgroup control file.
func attemptCgroupName(key AttemptKey) string {
	return fmt.Sprintf("a-%s.%d.%d", key.JobID, key.TaskIndex, key.Attempt)
}

// usageAttr is the "usage" group of an attempt's end log line (cpu_seconds,
// memory_peak_bytes), empty (so left out) when it had no cgroup.
func usageAttr(u Usage) slog.Attr {
	if !u.Measured {
		return slog.Attr{}
	}
	return slog.Group("usage", "cpu_seconds", u.CPUSeconds, "memory_peak_bytes", u.MemoryPeakBytes)
}
