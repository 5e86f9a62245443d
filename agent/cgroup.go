package agent

// Cgroups per attempt: detection. Which cgroup hierarchy the agent can use
// is read from its own /proc/<pid>/mountinfo (which cgroup file systems are
// mounted where) and /proc/<pid>/cgroup (where the agent sits in each), both
// parsed by prometheus/procfs. The agent never moves itself: it creates its
// parent cgroup under its own cgroup in each hierarchy it uses, so several
// agents on one host, each with its own parent (named from its data dir, see
// cgroupParentName), never collide, and a host that runs the agent in a
// container or a systemd unit with a delegated subtree keeps its limits over
// the tasks too.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/prometheus/procfs"
)

// Values of Config.Cgroups (apiary agent --cgroups).
const (
	// CgroupsAuto uses cgroup v2 when its unified hierarchy offers the memory
	// and pids controllers, else v1 when its memory, pids and freezer
	// hierarchies are mounted, else v2 without controllers (kill and CPU
	// time, no memory), else none.
	CgroupsAuto = "auto"
	// CgroupsOff uses no cgroups: process groups and the records of
	// killOrphans only.
	CgroupsOff = "off"
	// CgroupsV1 uses cgroup v1 only.
	CgroupsV1 = "v1"
	// CgroupsV2 uses cgroup v2 only.
	CgroupsV2 = "v2"
)

// v1Required are the cgroup v1 controllers without which v1 is not used:
// memory (usage), pids (membership that survives setsid), freezer (a kill
// that no fork can outrun). v1Optional are used when mounted: cpu (the
// tasks' parent gets fewer cpu.shares than the agent) and cpuacct (CPU
// time).
var (
	v1Required = []string{"memory", "pids", "freezer"}
	v1Optional = []string{"cpu", "cpuacct"}
	// v2Wanted are the controllers enabled for the tasks under cgroup v2
	// when the agent's cgroup offers them.
	v2Wanted = []string{"cpu", "memory", "pids"}
)

// cgroupHier is one hierarchy the agent uses: its own cgroup there (home)
// and the controllers of that hierarchy it uses.
type cgroupHier struct {
	// home is the directory of the agent's own cgroup in this hierarchy
	// (mount point joined with the agent's path, relative to the mount's
	// root).
	home string
	// controllers: v1, those of v1Required and v1Optional mounted here;
	// v2, those of v2Wanted the agent's cgroup offers (cgroup.controllers).
	controllers []string
}

// cgroupLayout is a way to run attempts in cgroups: version 1 (one
// hierarchy per mount of memory, pids, freezer, cpu, cpuacct; co-mounted
// controllers share one) or 2 (one hierarchy).
type cgroupLayout struct {
	version int
	hiers   []cgroupHier
}

func (l cgroupLayout) String() string {
	var parts []string
	for _, h := range l.hiers {
		parts = append(parts, fmt.Sprintf("%s [%s]", h.home, strings.Join(h.controllers, ",")))
	}
	return fmt.Sprintf("cgroup v%d: %s", l.version, strings.Join(parts, "; "))
}

// has reports whether a hierarchy of l has controller c.
func (l cgroupLayout) has(c string) bool {
	for _, h := range l.hiers {
		if slices.Contains(h.controllers, c) {
			return true
		}
	}
	return false
}

// parseCgroupsMode checks a --cgroups value; the empty string is auto.
func parseCgroupsMode(s string) (string, error) {
	switch s {
	case "":
		return CgroupsAuto, nil
	case CgroupsAuto, CgroupsOff, CgroupsV1, CgroupsV2:
		return s, nil
	}
	return "", fmt.Errorf("cgroups: %q is not one of auto, off, v1, v2", s)
}

// detectCgroups returns the cgroup layouts the agent may use under mode, in
// order of preference, from the mount table and cgroup membership of
// process pid under the proc file system at procRoot; and, for each layout
// it ruled out, why. It reads each candidate's cgroup.controllers (v2) but
// writes nothing: setupCgroups tries the candidates.
//
// Under auto the order is: v2 when the agent's v2 cgroup offers memory and
// pids; v1 when memory, pids and freezer are mounted; v2 without those
// controllers (kill and CPU time only). v1 and v2 name one candidate each.
func detectCgroups(procRoot string, pid int, mode string) ([]cgroupLayout, []string) {
	if mode == CgroupsOff {
		return nil, []string{"--cgroups off"}
	}
	fs, err := procfs.NewFS(procRoot)
	if err != nil {
		return nil, []string{fmt.Sprintf("proc file system at %s: %v", procRoot, err)}
	}
	mounts, err := fs.GetProcMounts(pid)
	if err != nil {
		return nil, []string{fmt.Sprintf("mountinfo: %v", err)}
	}
	proc, err := fs.Proc(pid)
	var member []procfs.Cgroup
	if err == nil {
		member, err = proc.Cgroups()
	}
	if err != nil {
		return nil, []string{fmt.Sprintf("/proc/%d/cgroup: %v", pid, err)}
	}
	var why []string
	v2, v2err := detectV2(mounts, member)
	v1, v1err := detectV1(mounts, member)
	full := v2err == nil && slices.Contains(v2.hiers[0].controllers, "memory") &&
		slices.Contains(v2.hiers[0].controllers, "pids")
	var out []cgroupLayout
	switch mode {
	case CgroupsV2:
		if v2err != nil {
			return nil, []string{v2err.Error()}
		}
		return []cgroupLayout{v2}, nil
	case CgroupsV1:
		if v1err != nil {
			return nil, []string{v1err.Error()}
		}
		return []cgroupLayout{v1}, nil
	}
	if full {
		out = append(out, v2)
	} else if v2err == nil {
		why = append(why, fmt.Sprintf("cgroup v2 at %s offers [%s], not memory and pids",
			v2.hiers[0].home, strings.Join(v2.hiers[0].controllers, ",")))
	}
	if v1err == nil {
		out = append(out, v1)
	} else {
		why = append(why, v1err.Error())
	}
	if v2err != nil {
		why = append(why, v2err.Error())
	} else if !full {
		out = append(out, v2)
	}
	return out, why
}

// detectV2 finds the unified hierarchy and the agent's cgroup in it.
func detectV2(mounts []*procfs.MountInfo, member []procfs.Cgroup) (cgroupLayout, error) {
	var m *procfs.MountInfo
	for _, mi := range mounts {
		if mi.FSType == "cgroup2" {
			m = mi
			break
		}
	}
	if m == nil {
		return cgroupLayout{}, errors.New("cgroup v2: not mounted")
	}
	own := ""
	for _, c := range member {
		if c.HierarchyID == 0 && len(c.Controllers) == 0 {
			own = c.Path
		}
	}
	if own == "" {
		return cgroupLayout{}, errors.New("cgroup v2: the agent is in no v2 cgroup (no 0:: line in /proc/self/cgroup)")
	}
	home, err := homeDir(m, own)
	if err != nil {
		return cgroupLayout{}, fmt.Errorf("cgroup v2: %w", err)
	}
	b, err := os.ReadFile(filepath.Join(home, "cgroup.controllers"))
	if err != nil {
		return cgroupLayout{}, fmt.Errorf("cgroup v2: %w", err)
	}
	var ctrls []string
	for _, c := range strings.Fields(string(b)) {
		if slices.Contains(v2Wanted, c) {
			ctrls = append(ctrls, c)
		}
	}
	slices.Sort(ctrls)
	return cgroupLayout{version: 2, hiers: []cgroupHier{{home: home, controllers: ctrls}}}, nil
}

// detectV1 finds the v1 hierarchies of v1Required and v1Optional and the
// agent's cgroup in each.
func detectV1(mounts []*procfs.MountInfo, member []procfs.Cgroup) (cgroupLayout, error) {
	byMount := map[string]*cgroupHier{}
	var order []string
	var missing []string
	for _, c := range append(slices.Clone(v1Required), v1Optional...) {
		var m *procfs.MountInfo
		for _, mi := range mounts {
			if _, ok := mi.SuperOptions[c]; ok && mi.FSType == "cgroup" {
				m = mi
				break
			}
		}
		if m == nil {
			if slices.Contains(v1Required, c) {
				missing = append(missing, c)
			}
			continue
		}
		if h, ok := byMount[m.MountPoint]; ok {
			h.controllers = append(h.controllers, c)
			continue
		}
		own := ""
		for _, g := range member {
			if slices.Contains(g.Controllers, c) {
				own = g.Path
			}
		}
		if own == "" {
			if slices.Contains(v1Required, c) {
				return cgroupLayout{}, fmt.Errorf("cgroup v1: the agent is in no %s cgroup (/proc/self/cgroup)", c)
			}
			continue
		}
		home, err := homeDir(m, own)
		if err != nil {
			if slices.Contains(v1Required, c) {
				return cgroupLayout{}, fmt.Errorf("cgroup v1 %s: %w", c, err)
			}
			continue
		}
		byMount[m.MountPoint] = &cgroupHier{home: home, controllers: []string{c}}
		order = append(order, m.MountPoint)
	}
	if len(missing) > 0 {
		return cgroupLayout{}, fmt.Errorf("cgroup v1: no %s hierarchy mounted", strings.Join(missing, ", "))
	}
	l := cgroupLayout{version: 1}
	for _, mp := range order {
		l.hiers = append(l.hiers, *byMount[mp])
	}
	return l, nil
}

// homeDir is the directory of cgroup path own (as /proc/self/cgroup gives
// it) under mount m, whose root may be a subtree (a container's mount).
func homeDir(m *procfs.MountInfo, own string) (string, error) {
	rel := own
	if m.Root != "/" {
		if own != m.Root && !strings.HasPrefix(own, m.Root+"/") {
			return "", fmt.Errorf("the agent's cgroup %s is outside the subtree %s mounted at %s", own, m.Root, m.MountPoint)
		}
		rel = strings.TrimPrefix(own, m.Root)
	}
	return filepath.Join(m.MountPoint, rel), nil
}

// cgroupParentName is the name of the agent's parent cgroup in each
// hierarchy: "apiary-" and agentMarker of its data dir, so that a restarted
// agent (same data dir) finds its predecessor's attempts and two agents on
// one host never share one.
func cgroupParentName(dataDir string) string { return "apiary-" + agentMarker(dataDir) }
