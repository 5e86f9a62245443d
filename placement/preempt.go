package placement

import (
	"cmp"
	"slices"
)

// preempt proposes evictions for a task that fits nowhere, in the spirit of
// Nomad's preemption (nomad/scheduler/preemption.go) and the K8s
// DefaultPreemption plugin: on every node that passes the task's non-capacity
// filters, pick the fewest existing allocations of lower priority (at least
// Options.PreemptionDelta lower) that make room, BestEffort first, then
// Burstable, then Guaranteed (a Guaranteed allocation only for a
// Guaranteed task: Kubernetes' QoS classes), lowest priority first within
// a class; propose the node needing the fewest evictions, then the lowest
// highest victim priority, then the lowest total victim priority.
//
// The proposal is a separate part of the plan: the engine does not count the
// freed room (no placement in the plan relies on it) and the caller must
// commit the evictions before the task is placed in a later pass. Within one
// Place call a victim is proposed at most once and a node hosts at most one
// preemption.
func (s *Session) preempt(c *taskCtx) *Preemption {
	st := s.st
	if len(st.snap.Existing) == 0 {
		return nil
	}
	if st.byNode == nil {
		idx := make(map[string]int, len(st.nodes))
		for i, n := range st.nodes {
			idx[n.ID] = i
		}
		st.byNode = make([][]victimRef, len(st.nodes))
		for k := range st.snap.Existing {
			a := &st.snap.Existing[k]
			i, ok := idx[a.NodeID]
			if !ok || st.batchIDs[a.TaskID] {
				continue
			}
			r := normRequest(a.Request)
			st.byNode[i] = append(st.byNode[i], victimRef{k: int32(k), pri: int32(a.Priority), qos: a.QoS, cpu: r.CPUMillis, mem: r.MemoryMiB})
		}
		st.claimed = make([]bool, len(st.snap.Existing))
		st.preempted = make([]bool, len(st.nodes))
	}
	maxVictimPri := c.t.Priority - s.e.opts.PreemptionDelta
	type choice struct {
		node   int
		evict  []int
		maxQoS int
		maxPri int
		sumPri int
	}
	var best *choice
	var victims []int
	// The nodes the task's label index allows, in the session's seeded
	// scan order, until PreemptionCandidates nodes with a set of victims were
	// found (Kubernetes' DefaultPreemption also stops after a bounded
	// number of candidate nodes): a full region of 10,000 nodes is not
	// scanned whole for every preemptor.
	cs := st.candidates(c)
	limit := s.e.opts.PreemptionCandidates
	if limit < 0 || limit > cs.total {
		limit = cs.total
	}
	found := 0
	start, stride := 0, 1
	if cs.total > 0 {
		start, stride = s.scanOrder(cs.total)
	}
	for j, p := 0, start; j < cs.total && found < limit; j++ {
		i := cs.at(p)
		if p += stride; p >= cs.total {
			p -= cs.total
		}
		allocs := st.byNode[i]
		if len(allocs) == 0 || st.preempted[i] || !c.staticOK(st, i) {
			continue
		}
		v := st.view(i)
		// Cheap bound first: free room plus every possible victim's must
		// cover the request's CPU and memory.
		victims = victims[:0]
		cpu, mem := v.cpuFree, v.memFree
		for _, a := range allocs {
			if int(a.pri) <= maxVictimPri && !st.claimed[a.k] && (a.qos != QoSGuaranteed || c.t.QoS == QoSGuaranteed) {
				victims = append(victims, int(a.k))
				cpu, mem = cpu+a.cpu, mem+a.mem
			}
		}
		if len(victims) == 0 || cpu < c.req.CPUMillis || mem < c.req.MemoryMiB {
			continue
		}
		ok := true
		for _, f := range c.filters[:c.nonRes] {
			if _, isMax := f.(maxTasksFilter); isMax {
				continue // evictions free task slots
			}
			if f.check(c, st, i, &v) != "" {
				ok = false
				break
			}
		}
		if !ok {
			continue
		}
		// BestEffort, then Burstable, then Guaranteed; lowest priority
		// first within a class; among equals the largest first, so few
		// evictions suffice.
		slices.SortFunc(victims, func(x, y int) int {
			ax, ay := &st.snap.Existing[x], &st.snap.Existing[y]
			if r := cmp.Compare(ax.QoS.evictOrder(), ay.QoS.evictOrder()); r != 0 {
				return r
			}
			if r := cmp.Compare(ax.Priority, ay.Priority); r != 0 {
				return r
			}
			if r := cmp.Compare(size(ay.Request), size(ax.Request)); r != 0 {
				return r
			}
			return cmp.Compare(ax.TaskID, ay.TaskID)
		})
		var picked []int
		fit := false
		for _, k := range victims {
			picked = append(picked, k)
			if s.fitsWithout(c, i, &v, picked) {
				fit = true
				break
			}
		}
		if !fit {
			continue
		}
		// Drop victims that turned out unnecessary, highest priority first.
		for j := len(picked) - 1; j >= 0 && len(picked) > 1; j-- {
			trial := slices.Delete(slices.Clone(picked), j, j+1)
			if s.fitsWithout(c, i, &v, trial) {
				picked = trial
			}
		}
		found++
		ch := choice{node: i, evict: picked}
		for _, k := range picked {
			a := &st.snap.Existing[k]
			ch.maxQoS = max(ch.maxQoS, a.QoS.evictOrder())
			ch.maxPri = max(ch.maxPri, a.Priority)
			ch.sumPri += a.Priority
		}
		if best == nil || cmp.Or(cmp.Compare(len(ch.evict), len(best.evict)), cmp.Compare(ch.maxQoS, best.maxQoS),
			cmp.Compare(ch.maxPri, best.maxPri), cmp.Compare(ch.sumPri, best.sumPri)) < 0 {
			b := ch
			best = &b
		}
	}
	if best == nil {
		return nil
	}
	p := &Preemption{ForTaskID: c.t.ID, NodeID: st.nodes[best.node].ID}
	for _, k := range best.evict {
		st.claimed[k] = true
		p.Evict = append(p.Evict, st.snap.Existing[k].TaskID)
	}
	st.preempted[best.node] = true
	return p
}

// victimRef is an existing allocation as the preemption scan reads it, kept
// per node in one contiguous slice (st.byNode): its index in Existing,
// priority, class and normalised request.
type victimRef struct {
	k        int32
	pri      int32
	qos      QoS
	cpu, mem int64
}

func size(r Resources) int64 {
	return r.CPUMillis + r.MemoryMiB + int64(r.GPUs)*1_000_000 + int64(r.GPUMilli)*1000
}

// fitsWithout reports whether the task fits node i once the given existing
// allocations are gone.
func (s *Session) fitsWithout(c *taskCtx, i int, v *view, evict []int) bool {
	w := *v
	w.gpuFree = slices.Clone(v.gpuFree)
	for _, k := range evict {
		a := &s.st.snap.Existing[k]
		r := normRequest(a.Request)
		w.cpuFree += r.CPUMillis
		w.memFree += r.MemoryMiB
		w.tasks--
		for _, g := range a.GPUIndices {
			if g < 0 || g >= len(w.gpuFree) {
				continue
			}
			if r.GPUs > 0 {
				w.gpuFree[g] = 1000
			} else {
				w.gpuFree[g] = min(1000, w.gpuFree[g]+r.GPUMilli)
			}
		}
	}
	if m := s.st.nodes[i].MaxTasks; m > 0 && w.tasks >= m {
		return false
	}
	return fits(c.req, &w) == ""
}
