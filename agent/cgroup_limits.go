package agent

// Resource limits per attempt (the job's resources.limits; QoS classes,
// internal/qos): written into the attempt's cgroup after it is created and
// before the process starts, so the process never runs unlimited; read
// back when the attempt ends, to tell an OOM kill by the limit from any
// other death. Kubernetes' kubelet does the same through the container
// runtime (memory.limit_in_bytes / memory.max, cpu.cfs_quota_us / cpu.max,
// and memory.oom.group under v2), and reports OOMKilled from the cgroup's
// oom_kill count.

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"syscall"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

// Limits is the most one attempt may use (Resources.limits); 0 is no limit
// on that resource.
type Limits struct {
	// CPUMillis is CPU in millicores: a CFS quota of CPUMillis*100 µs per
	// cfsPeriodUs (100 ms) period, at least minCFSQuotaUs.
	CPUMillis int64
	// MemoryMB is memory in MiB: the cgroup's memory limit, swap included
	// where the kernel accounts it, enforced by the kernel's OOM killer.
	MemoryMB int64
}

// limitsOf returns the limits of an assignment's resources.
func limitsOf(r *apiaryv1.Resources) Limits {
	l := r.GetLimits()
	return Limits{CPUMillis: max(l.GetCpuMillis(), 0), MemoryMB: max(l.GetMemoryMb(), 0)}
}

// The CFS bandwidth period of an attempt with a CPU limit, and the
// kernel's smallest quota (cpu.cfs_quota_us, cpu.max refuse less than
// 1 ms).
const (
	cfsPeriodUs   = 100_000
	minCFSQuotaUs = 1000
)

// cfsQuotaUs is the CFS quota per cfsPeriodUs of a CPU limit in
// millicores (1000 millicores = one CPU = the whole period).
func cfsQuotaUs(cpuMillis int64) int64 {
	return max(cpuMillis*cfsPeriodUs/1000, minCFSQuotaUs)
}

// limitCapabilities says which limits the containment can enforce: the
// memory limit needs the memory controller in the attempts' cgroups, the
// CPU limit the cpu controller (v1: a cpu hierarchy; v2: cpu enabled for
// the attempts).
func (c *containment) limitCapabilities() (memory, cpu bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.layout == nil {
		return false, false
	}
	return c.layout.has("memory"), c.layout.has("cpu")
}

// logLimits says once, at setup, which limits the agent enforces: Info
// "resource limits enforced by cgroups" when both are, else Warn "resource
// limits not enforced" with memory=BOOL cpu=BOOL and why. An attempt whose
// limit cannot be enforced still runs (it is never refused for it).
func (c *containment) logLimits(why string) {
	memory, cpu := c.limitCapabilities()
	if memory && cpu {
		c.log.Info("resource limits enforced by cgroups (resources.limits: memory limit, CFS quota)", "memory", true, "cpu", true)
		return
	}
	switch {
	case why != "":
	case !memory && !cpu:
		why = "the attempts' cgroups have neither the memory nor the cpu controller"
	case !memory:
		why = "the attempts' cgroups have no memory controller"
	default:
		why = "the attempts' cgroups have no cpu controller"
	}
	c.log.Warn("resource limits not enforced: attempts run without the resources.limits they ask for (and are not refused for them)",
		"memory", memory, "cpu", cpu, "why", why)
}

// limit writes l into g before its process starts. The memory limit is
// required once asked for where the memory controller is: a failed write
// is a node fault (the attempt does not start, rather than run unlimited).
// A failed CPU quota is logged and the attempt runs: under v1 a quota
// above an ancestor's is refused (EINVAL), and the ancestor's quota bounds
// the attempt then anyway. Limits the cgroup has no controller for are
// skipped (logLimits said so at setup).
func (c *containment) limit(g *attemptCgroup, l Limits, log *slog.Logger) error {
	if l.MemoryMB > 0 {
		if err := g.limitMemory(l.MemoryMB << 20); err != nil {
			return nodeFault(fmt.Errorf("cgroup memory limit %d MiB: %w", l.MemoryMB, err))
		}
	}
	if l.CPUMillis > 0 {
		if err := g.limitCPU(l.CPUMillis); err != nil {
			log.Warn("CPU limit not set; the attempt runs without it", "cpu_millis", l.CPUMillis, "err", err)
		}
	}
	return nil
}

// limitMemory sets the memory limit of g to bytes, swap included: v1
// memory.limit_in_bytes, then memory.memsw.limit_in_bytes to the same
// (memory+swap; present when the kernel accounts swap, and never below the
// memory limit, hence the order); v2 memory.max, memory.swap.max 0 and
// memory.oom.group 1 (an OOM kill takes every process of the attempt,
// not one of them). Without a memory controller it does nothing.
func (g *attemptCgroup) limitMemory(bytes int64) error {
	v := strconv.FormatInt(bytes, 10)
	switch {
	case g.memory != "":
		if err := writeFile(g.memory, "memory.limit_in_bytes", v); err != nil {
			return err
		}
		if exists(g.memory, "memory.memsw.limit_in_bytes") {
			if err := writeFile(g.memory, "memory.memsw.limit_in_bytes", v); err != nil {
				return fmt.Errorf("memory.memsw.limit_in_bytes: %w", err)
			}
		}
	case g.v2 != "" && exists(g.v2, "memory.max"):
		if err := writeFile(g.v2, "memory.max", v); err != nil {
			return err
		}
		if exists(g.v2, "memory.swap.max") {
			if err := writeFile(g.v2, "memory.swap.max", "0"); err != nil {
				return fmt.Errorf("memory.swap.max: %w", err)
			}
		}
		if exists(g.v2, "memory.oom.group") {
			_ = writeFile(g.v2, "memory.oom.group", "1")
		}
	default:
		return nil
	}
	g.memLimit = bytes
	return nil
}

// limitCPU sets the CFS quota of g for cpuMillis millicores: v1
// cpu.cfs_period_us 100000 and cpu.cfs_quota_us in the cpu hierarchy; v2
// cpu.max "QUOTA 100000". Without a cpu controller it does nothing.
func (g *attemptCgroup) limitCPU(cpuMillis int64) error {
	quota := cfsQuotaUs(cpuMillis)
	switch {
	case g.cpu != "":
		if err := writeFile(g.cpu, "cpu.cfs_period_us", strconv.Itoa(cfsPeriodUs)); err != nil {
			return fmt.Errorf("cpu.cfs_period_us: %w", err)
		}
		if err := writeFile(g.cpu, "cpu.cfs_quota_us", strconv.FormatInt(quota, 10)); err != nil {
			return fmt.Errorf("cpu.cfs_quota_us: %w", err)
		}
	case g.v2 != "" && exists(g.v2, "cpu.max"):
		if err := writeFile(g.v2, "cpu.max", fmt.Sprintf("%d %d", quota, cfsPeriodUs)); err != nil {
			return fmt.Errorf("cpu.max: %w", err)
		}
	}
	return nil
}

// oomEvents reads, once the attempt is over, how many of its processes the
// OOM killer ended in g (kills; -1 when the kernel does not say: v1 before
// Linux 4.13; v1 memory.oom_control "oom_kill", v2 memory.events
// "oom_kill") and whether its memory reached the limit (reached): a failed
// charge counted (v1 memory.failcnt or memory.memsw.failcnt, v2
// memory.events "max" or "oom"), or the peak (v1 memory.max_usage_in_bytes
// or memory.memsw.max_usage_in_bytes, v2 memory.peak) within one huge page
// (2 MiB, the largest charge that can fail) of the limit. The peak is
// needed: Linux 6.18 kept memory.failcnt at 0 through an OOM kill by the
// limit here (cgroup v1).
func (g *attemptCgroup) oomEvents() (kills int64, reached bool) {
	const hugePage = 2 << 20
	atLimit := func(dir string, files ...string) bool {
		for _, f := range files {
			if n, err := readInt(dir, f); err == nil && n >= g.memLimit-hugePage {
				return true
			}
		}
		return false
	}
	counted := func(dir string, files ...string) bool {
		for _, f := range files {
			if n, err := readInt(dir, f); err == nil && n > 0 {
				return true
			}
		}
		return false
	}
	switch {
	case g.memory != "":
		kills = -1
		if n, ok := statField(g.memory, "memory.oom_control", "oom_kill"); ok {
			kills = n
		}
		reached = counted(g.memory, "memory.failcnt", "memory.memsw.failcnt") ||
			atLimit(g.memory, "memory.max_usage_in_bytes", "memory.memsw.max_usage_in_bytes")
	case g.v2 != "":
		kills, _ = statField(g.v2, "memory.events", "oom_kill")
		maxed, _ := statField(g.v2, "memory.events", "max")
		oom, _ := statField(g.v2, "memory.events", "oom")
		reached = maxed > 0 || oom > 0 || atLimit(g.v2, "memory.peak")
	}
	return kills, reached
}

// memoryLimitError is the error of an attempt that its memory limit ended,
// or nil. u is the attempt's usage (its limit and OOM counts), outcome and
// sig how its main process ended (sig: the signal that killed it, 0 if it
// exited). The OOM killer counts kills from a host-wide OOM too, so a kill
// counts only if the cgroup also reached its limit. Without a kill count
// (v1 before Linux 4.13) the limit reached and a main process dead of
// SIGKILL that the agent did not send (outcome exited) counts. Texts:
// "killed by its memory limit (256 MiB): the cgroup's OOM killer ended it"
// when the main process died of it; "2 of its processes were killed by
// its memory limit (256 MiB) by the cgroup's OOM killer" otherwise.
func memoryLimitError(u Usage, outcome Outcome, sig syscall.Signal) error {
	if u.MemoryLimitBytes <= 0 || !u.MemoryLimitReached {
		return nil
	}
	mainKilled := outcome == OutcomeExited && sig == syscall.SIGKILL
	limit := fmt.Sprintf("%d MiB", u.MemoryLimitBytes>>20)
	switch {
	case u.OOMKills > 0 && mainKilled, u.OOMKills < 0 && mainKilled:
		return fmt.Errorf("killed by its memory limit (%s): the cgroup's OOM killer ended it", limit)
	case u.OOMKills == 1:
		return fmt.Errorf("1 of its processes was killed by its memory limit (%s) by the cgroup's OOM killer", limit)
	case u.OOMKills > 1:
		return fmt.Errorf("%d of its processes were killed by its memory limit (%s) by the cgroup's OOM killer", u.OOMKills, limit)
	}
	return nil
}

// exitSignal is the signal that ended a process (0: it exited, or its
// state is unknown).
func exitSignal(ps *os.ProcessState) syscall.Signal {
	if ps == nil {
		return 0
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return ws.Signal()
	}
	return 0
}
