package placement

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// explain is the slow path for a task that fits nowhere: it runs the filter
// stage on every node, counts each node under the first filter that rejected
// it, and decides whether the failure is fragmentation: the nodes that pass
// every non-capacity filter have enough free CPU, memory and GPU between
// them, but no single node has all of it (DESIGN.md, "Placement with
// reject-and-requeue"); or one node has the CPU, memory and GPU milli but
// its free GPU is split across devices (shares where whole GPUs are asked
// for, or no single GPU with room for a share).
func (s *Session) explain(c *taskCtx) *Unplaced {
	st := s.st
	counts := map[string]int{}
	var cpu, mem int64
	gpu := 0
	usable := 0
	splitGPU := false // a node refused only because its free GPU is split
	need := c.req.GPUs*1000 + c.req.GPUMilli
	for i := range st.nodes {
		v := st.view(i)
		if c.avoidFailed && c.t.FailedOn[st.nodes[i].ID] > 0 && c.feasible(st, i, &v) == "" {
			counts[ReasonFailedHere]++
			continue
		}
		for k, f := range c.filters {
			r := f.check(c, st, i, &v)
			if r == "" {
				continue
			}
			counts[r]++
			if k >= c.nonRes {
				usable++
				cpu += max(v.cpuFree, 0)
				mem += max(v.memFree, 0)
				if c.req.GPUs > 0 || c.req.GPUMilli > 0 {
					f := sumFree(v.gpuFree)
					gpu += f
					splitGPU = splitGPU || ((r == ReasonGPU || r == ReasonGPUShare) && f >= need &&
						v.cpuFree >= c.req.CPUMillis && v.memFree >= c.req.MemoryMiB)
				}
			}
			break
		}
	}
	u := &Unplaced{TaskID: c.t.ID, Excluded: counts}
	u.Fragmented = splitGPU || (usable > 1 && cpu >= c.req.CPUMillis && mem >= c.req.MemoryMiB &&
		gpu >= need)
	u.Reason = formatReason(counts, u.Fragmented)
	return u
}

// formatReason renders counts as "memory: 812 nodes, constraint zone in
// [a]: 400 nodes, quarantined: 3 nodes", largest first.
func formatReason(counts map[string]int, fragmented bool) string {
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if c := cmp.Compare(counts[b], counts[a]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	var b strings.Builder
	if fragmented {
		b.WriteString("fragmented: enough free in total but split across nodes or GPUs; ")
	}
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		n := counts[k]
		unit := "nodes"
		if n == 1 {
			unit = "node"
		}
		fmt.Fprintf(&b, "%s: %d %s", k, n, unit)
	}
	return b.String()
}
