package agent

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

// fakeProc writes a fake /proc/<pid>/{mountinfo,cgroup} under root.
func fakeProc(t *testing.T, root string, pid int, mountinfo, cgroup string) {
	t.Helper()
	d := filepath.Join(root, strconv.Itoa(pid))
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{"mountinfo": mountinfo, "cgroup": cgroup} {
		if err := os.WriteFile(filepath.Join(d, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDetectCgroups: the layouts detectCgroups offers, in order, for mount
// tables of the kinds met in practice, with the cgroup file systems faked
// as plain directories under a temporary root (the paths in the mount
// table point there).
func TestDetectCgroups(t *testing.T) {
	type hier struct {
		home  string // relative to the fake root
		ctrls string
	}
	type layout struct {
		version int
		hiers   []hier
	}
	// This development machine: v1 controllers, each mounted alone, memory
	// in a sub-cgroup; cgroup2 at unified with hugetlb only.
	hybrid := `30 22 0:27 / R/sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:28 / R/sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
32 30 0:29 / R/sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
33 30 0:30 / R/sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
34 30 0:31 / R/sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 30 0:33 / R/sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 30 0:35 / R/sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
39 30 0:36 / R/sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
40 30 0:37 / R/sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`
	hybridCg := `9:name=systemd:/
8:pids:/
6:freezer:/
4:memory:/process_api/163d
3:cpuset:/
2:cpuacct:/
1:cpu:/
0::/
`
	// A systemd host with the unified hierarchy only, the agent in its
	// service's cgroup.
	unified := `25 22 0:23 / R/sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
`
	unifiedCg := "0::/system.slice/apiary.service\n"
	// A container: v1 with cpu,cpuacct co-mounted, every mount's root the
	// container's own cgroup; no freezer.
	container := `700 690 0:40 /docker/abc R/sys/fs/cgroup/cpu,cpuacct ro,nosuid - cgroup cgroup rw,cpu,cpuacct
701 690 0:41 /docker/abc R/sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
702 690 0:42 /docker/abc R/sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids
703 690 0:43 /docker/abc R/sys/fs/cgroup/freezer rw,nosuid - cgroup cgroup rw,freezer
`
	containerCg := "5:freezer:/docker/abc\n4:pids:/docker/abc\n3:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n"
	cases := []struct {
		name, mountinfo, cgroup, mode string
		controllers                   map[string]string // fake cgroup.controllers files (v2)
		want                          []layout
		why                           []string // substrings, in order
	}{
		{name: "hybrid auto: v1, then v2 without controllers", mountinfo: hybrid, cgroup: hybridCg, mode: CgroupsAuto,
			controllers: map[string]string{"sys/fs/cgroup/unified": "hugetlb"},
			want: []layout{
				{1, []hier{{"sys/fs/cgroup/memory/process_api/163d", "memory"}, {"sys/fs/cgroup/pids", "pids"},
					{"sys/fs/cgroup/freezer", "freezer"}, {"sys/fs/cgroup/cpu", "cpu"}, {"sys/fs/cgroup/cpuacct", "cpuacct"}}},
				{2, []hier{{"sys/fs/cgroup/unified", ""}}},
			},
			why: []string{"offers [], not memory and pids"}},
		{name: "hybrid v2 asked", mountinfo: hybrid, cgroup: hybridCg, mode: CgroupsV2,
			controllers: map[string]string{"sys/fs/cgroup/unified": "hugetlb"},
			want:        []layout{{2, []hier{{"sys/fs/cgroup/unified", ""}}}}},
		{name: "unified auto", mountinfo: unified, cgroup: unifiedCg, mode: CgroupsAuto,
			controllers: map[string]string{"sys/fs/cgroup/system.slice/apiary.service": "cpuset cpu io memory hugetlb pids rdma misc"},
			want:        []layout{{2, []hier{{"sys/fs/cgroup/system.slice/apiary.service", "cpu,memory,pids"}}}},
			why:         []string{"cgroup v1: no memory, pids, freezer hierarchy mounted"}},
		{name: "unified, v1 asked", mountinfo: unified, cgroup: unifiedCg, mode: CgroupsV1,
			controllers: map[string]string{"sys/fs/cgroup/system.slice/apiary.service": "cpu memory pids"},
			why:         []string{"cgroup v1: no memory, pids, freezer hierarchy mounted"}},
		{name: "container: co-mounted, subtree roots", mountinfo: container, cgroup: containerCg, mode: CgroupsAuto,
			want: []layout{{1, []hier{{"sys/fs/cgroup/memory", "memory"}, {"sys/fs/cgroup/pids", "pids"},
				{"sys/fs/cgroup/freezer", "freezer"}, {"sys/fs/cgroup/cpu,cpuacct", "cpu,cpuacct"}}}},
			why: []string{"cgroup v2: not mounted"}},
		{name: "container without freezer", mountinfo: strings.ReplaceAll(container, "rw,freezer", "rw,net_cls"), cgroup: containerCg,
			mode: CgroupsAuto, why: []string{"cgroup v1: no freezer hierarchy mounted", "cgroup v2: not mounted"}},
		{name: "agent outside the mounted subtree", mountinfo: container, cgroup: strings.ReplaceAll(containerCg, "3:memory:/docker/abc", "3:memory:/other"),
			mode: CgroupsAuto, why: []string{"cgroup v1 memory: the agent's cgroup /other is outside the subtree /docker/abc", "cgroup v2: not mounted"}},
		{name: "off", mountinfo: hybrid, cgroup: hybridCg, mode: CgroupsOff, why: []string{"--cgroups off"}},
		{name: "no cgroup mounts", mountinfo: "22 1 0:21 / R/proc rw - proc proc rw\n", cgroup: "", mode: CgroupsAuto,
			why: []string{"cgroup v1: no memory, pids, freezer hierarchy mounted", "cgroup v2: not mounted"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			proc := filepath.Join(root, "proc")
			fakeProc(t, proc, 42, strings.ReplaceAll(tc.mountinfo, "R/", root+"/"), tc.cgroup)
			for dir, ctrls := range tc.controllers {
				d := filepath.Join(root, dir)
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(d, "cgroup.controllers"), []byte(ctrls+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, why := detectCgroups(proc, 42, tc.mode)
			var gotL []layout
			for _, l := range got {
				gl := layout{version: l.version}
				for _, h := range l.hiers {
					rel, _ := filepath.Rel(root, h.home)
					gl.hiers = append(gl.hiers, hier{rel, strings.Join(h.controllers, ",")})
				}
				gotL = append(gotL, gl)
			}
			if fmt.Sprint(gotL) != fmt.Sprint(tc.want) {
				t.Errorf("layouts\n got %v\nwant %v", gotL, tc.want)
			}
			if len(why) != len(tc.why) {
				t.Fatalf("why %q, want %d reasons like %q", why, len(tc.why), tc.why)
			}
			for i, w := range tc.why {
				if !strings.Contains(why[i], w) {
					t.Errorf("why[%d] = %q, want it to contain %q", i, why[i], w)
				}
			}
		})
	}
}

// TestSetupLayoutSkipsUnwritable: a candidate whose parent cgroup cannot be
// created (here its home is a file) is refused with the reason; v1 needs
// the agent's own tasks files writable.
func TestSetupLayoutSkipsUnwritable(t *testing.T) {
	root := t.TempDir()
	home := filepath.Join(root, "memory")
	if err := os.WriteFile(home, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	l := cgroupLayout{version: 1, hiers: []cgroupHier{{home: home, controllers: []string{"memory"}}}}
	if _, err := setupLayout(&l, "apiary-x"); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Fatalf("setupLayout on a file: %v", err)
	}
	pids := filepath.Join(root, "pids")
	if err := os.Mkdir(pids, 0o755); err != nil {
		t.Fatal(err)
	}
	l = cgroupLayout{version: 1, hiers: []cgroupHier{{home: pids, controllers: []string{"pids"}}}}
	if _, err := setupLayout(&l, "apiary-x"); err == nil || !strings.Contains(err.Error(), "tasks not writable") {
		t.Fatalf("setupLayout without a tasks file: %v", err)
	}
	if _, err := os.Stat(filepath.Join(pids, "apiary-x")); !os.IsNotExist(err) {
		t.Fatalf("parent left behind: %v", err)
	}
}

// newTestContainment sets up a containment for an agent with data dir
// data under mode, removed at the end of the test.
func newTestContainment(t *testing.T, data, mode string) *containment {
	t.Helper()
	c := newContainment(Config{DataDir: data, Cgroups: mode}, discardLog(), nil)
	c.setup()
	t.Cleanup(c.close)
	return c
}

// niceOf returns a process's nice value (field 19 of /proc/<pid>/stat).
func niceOf(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	n, err := strconv.Atoi(f[19-3])
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCgroupKillsSetsidEscapee is issue 20's containment case: a task that
// escapes its process group with setsid. Under each cgroup mode the host
// allows, the escapee is dead when the attempt's result is ready, whether
// the attempt timed out, was cancelled or its main process just exited, and
// its cgroup is gone; the task ran at nice +10. Where the mode is unusable
// here, the documented fallback holds instead: the escapee outlives the
// attempt, and only the restart sweep (killOrphans, by the environment
// marker) kills it. Before cgroups, the escapee always outlived its attempt.
func TestCgroupKillsSetsidEscapee(t *testing.T) {
	for _, mode := range []string{CgroupsAuto, CgroupsV1, CgroupsV2} {
		for _, end := range []string{"timeout", "cancel", "exit"} {
			t.Run(mode+"/"+end, func(t *testing.T) {
				data := t.TempDir()
				if err := os.MkdirAll(filepath.Join(data, "attempts"), 0o755); err != nil {
					t.Fatal(err)
				}
				c := newTestContainment(t, data, mode)
				dir := filepath.Join(data, "work", "j", "0", "1")
				effect := filepath.Join(data, "F")
				// The escapee ignores SIGTERM, like a daemon that
				// wants to outlive its parent, and writes its effect
				// after 30 s unless killed.
				tail := "; sleep 30"
				if end == "exit" {
					tail = ""
				}
				s := spec(t, "setsid sh -c 'trap \"\" TERM; echo $$ > esc.tmp; mv esc.tmp escaped; sleep 30; echo effect >> "+effect+"' & "+
					"while [ ! -e escaped ]; do sleep 0.01; done; echo started"+tail)
				s.Dir = dir
				s.Env = append(os.Environ(), agentRunEnv+"="+agentMarker(data))
				s.Record = filepath.Join(data, "attempts", "j.0.1")
				s.KillGrace = 200 * time.Millisecond
				s.contain, s.cgroup = c, "a-j.0.1"
				if end == "timeout" {
					s.Timeout = time.Second
				}
				e, err := Start(s)
				if err != nil {
					t.Fatal(err)
				}
				if n := niceOf(t, e.Pid()); n != niceOf(t, os.Getpid())+taskNice {
					t.Errorf("task nice %d, want the agent's + %d", n, taskNice)
				}
				esc := readPids(t, filepath.Join(dir, "escaped"), 1)[0]
				t.Cleanup(func() { _ = syscall.Kill(esc, syscall.SIGKILL) })
				if pg, _ := syscall.Getpgid(esc); pg == e.Pid() {
					t.Fatal("escapee still in the attempt's group; the test proves nothing")
				}
				if end == "cancel" {
					e.Cancel()
				}
				res := e.Wait()
				want := map[string]Outcome{"timeout": OutcomeTimedOut, "cancel": OutcomeCancelled, "exit": OutcomeExited}[end]
				if res.Outcome != want {
					t.Fatalf("outcome %v, want %v", res.Outcome, want)
				}
				if c.version() == 0 {
					t.Logf("cgroups %s unusable here: checking the fallback", mode)
					if processGone(esc) {
						t.Fatal("escapee died with its attempt without cgroups")
					}
					if n := killOrphans(data, discardLog()); n != 1 {
						t.Fatalf("restart sweep killed %d processes, want 1", n)
					}
					waitFor(t, 10*time.Second, func() bool { return processGone(esc) }, "escapee gone after the sweep")
					return
				}
				t.Logf("cgroup v%d", c.version())
				// Dead now, not eventually: the result waits for the cgroup.
				if !processGone(esc) {
					t.Fatalf("escapee %d outlived its attempt (cgroup v%d)", esc, c.version())
				}
				if !res.Usage.Measured || res.Usage.CPUSeconds <= 0 {
					t.Errorf("usage %+v, want measured CPU time", res.Usage)
				}
				for _, p := range c.parents {
					if _, err := os.Stat(filepath.Join(p, "a-j.0.1")); !os.IsNotExist(err) {
						t.Errorf("attempt cgroup left in %s: %v", p, err)
					}
				}
				if _, err := os.Stat(s.Record); !os.IsNotExist(err) {
					t.Errorf("record left: %v", err)
				}
			})
		}
	}
}

// TestCgroupSweepAtStart: a previous run left an attempt cgroup holding a
// process that escaped every other scan (own session, cwd /, empty
// environment: no group, no work dir, no marker). The next agent start
// kills it and removes the cgroup, found by the record and, without the
// record, by the parent cgroup's listing. Without cgroups it survives, as
// the README says.
func TestCgroupSweepAtStart(t *testing.T) {
	for _, withRecord := range []bool{true, false} {
		t.Run(fmt.Sprintf("record=%v", withRecord), func(t *testing.T) {
			data := t.TempDir()
			recDir := filepath.Join(data, "attempts")
			if err := os.MkdirAll(recDir, 0o755); err != nil {
				t.Fatal(err)
			}
			prev := newTestContainment(t, data, CgroupsAuto)
			// The previous run: its attempt started through the
			// containment, then the agent "crashed": the leader died,
			// nothing killed the cgroup.
			g, err := prev.create("a-j.0.1")
			if err != nil {
				t.Fatal(err)
			}
			pidFile := filepath.Join(data, "esc")
			leader := exec.Command("sh", "-c", "setsid env -i /bin/sh -c 'cd / && echo $$ > "+pidFile+".tmp && mv "+pidFile+".tmp "+pidFile+" && exec sleep 30' &")
			leader.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			if err := prev.start(leader, g); err != nil {
				t.Fatal(err)
			}
			rec := attemptRecord{Dir: filepath.Join(data, "work", "j", "0", "1"), Pgid: leader.Process.Pid}
			if g != nil {
				rec.Cgroups = g.dirs
			}
			if withRecord {
				if err := writeRecord(filepath.Join(recDir, "j.0.1"), rec); err != nil {
					t.Fatal(err)
				}
			}
			_ = leader.Wait()
			esc := readPids(t, pidFile, 1)[0]
			t.Cleanup(func() { _ = syscall.Kill(esc, syscall.SIGKILL) })
			// No scan without cgroups would find it.
			s := orphanScan{procRoot: "/proc", self: os.Getpid(), work: filepath.Join(data, "work") + "/",
				marker: []byte(agentRunEnv + "=" + agentMarker(data)), groups: []attemptRecord{rec}}
			// Once it is sleep, its shell has reaped mv: it is alone.
			waitFor(t, 10*time.Second, func() bool {
				cwd, _ := os.Readlink(fmt.Sprintf("/proc/%d/cwd", esc))
				comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", esc))
				return cwd == "/" && strings.TrimSpace(string(comm)) == "sleep"
			}, "escapee out of the work dir, sleeping")
			if why, found := s.findOrphans()[esc]; found {
				t.Fatalf("the scans without cgroups find the escapee (%s); the test proves nothing", why)
			}
			if g == nil {
				t.Log("no cgroups here: checking the fallback")
				next := newTestContainment(t, data, CgroupsAuto)
				if n := next.sweep(); n != 0 {
					t.Fatalf("sweep without cgroups killed %d", n)
				}
				killOrphans(data, discardLog())
				if processGone(esc) {
					t.Fatal("escapee killed without cgroups?")
				}
				return
			}
			// The restart: a new containment on the same data dir.
			next := newContainment(Config{DataDir: data, Cgroups: CgroupsAuto}, discardLog(), nil)
			next.setup()
			t.Cleanup(next.close)
			if n := next.sweep(); n != 1 {
				t.Fatalf("sweep killed %d processes, want 1", n)
			}
			if !processGone(esc) {
				t.Fatalf("escapee %d survived the sweep", esc)
			}
			for _, d := range g.dirs {
				if _, err := os.Stat(d); !os.IsNotExist(err) {
					t.Errorf("cgroup %s left: %v", d, err)
				}
			}
		})
	}
}

// TestAgentReportsTaskUsage: with cgroups, the agent's metrics show the
// memory of a running attempt and the CPU time of one that burned CPU, and
// its cgroup version; without them, version 0 and no usage.
func TestAgentReportsTaskUsage(t *testing.T) {
	f, ta, epoch := startConnected(t, nil)
	gather := func() map[string]float64 {
		mfs, err := ta.cfg.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				out[mf.GetName()] = value(m)
			}
		}
		return out
	}
	burn := AttemptKey{JobID: "r1-burn", TaskIndex: 0, Attempt: 1}
	f.push(runAsg(epoch, burn, "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; sleep 30"))
	version := ta.contain.version()
	if version == 0 {
		waitFor(t, 10*time.Second, func() bool { return len(f.reportsFor(burn)) > 0 }, "STARTED")
		m := gather()
		if _, ok := m["apiary_agent_task_cpu_seconds_total"]; ok || m["apiary_agent_cgroup_version"] != 0 {
			t.Fatalf("no cgroups, yet metrics %v", m)
		}
		return
	}
	waitFor(t, 20*time.Second, func() bool {
		m := gather()
		return m["apiary_agent_task_cpu_seconds_total"] >= 0.05 && m["apiary_agent_task_memory_bytes"] > 0
	}, "CPU time and memory of the running attempt in the metrics")
	if m := gather(); m["apiary_agent_cgroup_version"] != float64(version) {
		t.Fatalf("cgroup version %v, want %d", m["apiary_agent_cgroup_version"], version)
	}
	before := gather()["apiary_agent_task_cpu_seconds_total"]
	f.push(&apiaryv1.Assignment{Kind: apiaryv1.Assignment_KIND_CANCEL, JobId: burn.JobID, TaskIndex: 0, Attempt: 1, NodeEpoch: epoch})
	f.waitReport(t, burn, apiaryv1.ReportKind_REPORT_KIND_CANCELLED)
	m := gather()
	if m["apiary_agent_task_memory_bytes"] != 0 {
		t.Errorf("memory %v with no attempt running", m["apiary_agent_task_memory_bytes"])
	}
	if m["apiary_agent_task_cpu_seconds_total"] < before {
		t.Errorf("CPU counter went back from %v to %v", before, m["apiary_agent_task_cpu_seconds_total"])
	}
}

func value(m *dto.Metric) float64 {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	}
	return 0
}

// TestCgroupParentWeighsLess: under v1 the tasks' parent cgroup has
// cpu.shares 256, under v2 cpu.weight 25 (when the cpu controller is
// there), and two agents on one host (two data dirs) get two parents.
func TestCgroupParentWeighsLess(t *testing.T) {
	a := newTestContainment(t, t.TempDir(), CgroupsAuto)
	b := newTestContainment(t, t.TempDir(), CgroupsAuto)
	if a.version() == 0 {
		t.Log("no cgroups here: nothing to weigh")
		return
	}
	if slices.Equal(a.parents, b.parents) {
		t.Fatalf("two agents share the parents %v", a.parents)
	}
	checked := false
	for _, p := range a.parents {
		for file, want := range map[string]int64{"cpu.shares": taskCPUShares, "cpu.weight": taskCPUWeight} {
			if got, err := readInt(p, file); err == nil {
				checked = true
				if got != want {
					t.Errorf("%s/%s = %d, want %d", p, file, got, want)
				}
			}
		}
	}
	if !checked && a.layout.has("cpu") {
		t.Errorf("no cpu weight set in %v", a.parents)
	}
}

// TestReservedCPU: --reserved-cpu-millis comes off the detected capacity
// only.
func TestReservedCPU(t *testing.T) {
	base := Config{NodeID: "n", DataDir: t.TempDir(), CoordinatorAddrs: []string{"127.0.0.1:1"}}
	c := base
	c.ReservedCPUMillis = 500
	got, err := c.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(runtime.NumCPU())*1000 - 500; got.Capacity.CPUMillis != want {
		t.Fatalf("cpu %d, want %d", got.Capacity.CPUMillis, want)
	}
	c.Capacity.CPUMillis = 1000
	if _, err := c.withDefaults(); err == nil || !strings.Contains(err.Error(), "reserved cpu millis: applies to detected capacity only") {
		t.Fatalf("reserved with given cpu: %v", err)
	}
	c = base
	c.ReservedCPUMillis = int64(runtime.NumCPU()) * 1000
	if _, err := c.withDefaults(); err == nil || !strings.Contains(err.Error(), "leaves nothing") {
		t.Fatalf("reserving the whole host: %v", err)
	}
	c = base
	c.Cgroups = "v3"
	if _, err := c.withDefaults(); err == nil || !strings.Contains(err.Error(), `cgroups: "v3"`) {
		t.Fatalf("cgroups v3: %v", err)
	}
}
