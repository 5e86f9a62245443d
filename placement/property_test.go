package placement

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

var (
	zonesV = []string{"a", "b", "c"}
	jurV   = []string{"eu", "us", ""}
	models = []string{"T4", "V100"}
)

func genSnapshot(t *rapid.T) *Snapshot {
	n := rapid.IntRange(1, 10).Draw(t, "nodes")
	snap := &Snapshot{}
	for i := 0; i < n; i++ {
		labels := map[string]string{"zone": rapid.SampledFrom(zonesV).Draw(t, "zone"), "cores": strconv.Itoa(rapid.IntRange(1, 64).Draw(t, "cores"))}
		if j := rapid.SampledFrom(jurV).Draw(t, "jur"); j != "" {
			labels["jurisdiction"] = j
		}
		cpu := int64(rapid.IntRange(0, 8000).Draw(t, "cpu"))
		mem := int64(rapid.IntRange(0, 8000).Draw(t, "mem"))
		nd := &Node{ID: fmt.Sprintf("n%d", i), Labels: labels,
			Capacity:  Resources{CPUMillis: cpu, MemoryMiB: mem, GPUs: rapid.IntRange(0, 4).Draw(t, "gpus")},
			Allocated: Resources{CPUMillis: int64(rapid.IntRange(0, int(cpu)).Draw(t, "acpu")), MemoryMiB: int64(rapid.IntRange(0, int(mem)).Draw(t, "amem"))},
			MaxTasks:  rapid.IntRange(0, 3).Draw(t, "maxtasks"),
		}
		if nd.Capacity.GPUs > 0 {
			nd.GPUModel = rapid.SampledFrom(models).Draw(t, "model")
			if rapid.Bool().Draw(t, "gpuused") {
				for g := 0; g < nd.Capacity.GPUs; g++ {
					nd.GPUFreeMilli = append(nd.GPUFreeMilli, rapid.SampledFrom([]int{0, 200, 500, 1000}).Draw(t, "free"))
				}
			}
		}
		nd.Quarantined = rapid.IntRange(0, 9).Draw(t, "q") == 0
		nd.Ineligible = rapid.IntRange(0, 9).Draw(t, "inel") == 0
		snap.Nodes = append(snap.Nodes, nd)
	}
	for k := rapid.IntRange(0, 4).Draw(t, "existing"); k > 0; k-- {
		snap.Existing = append(snap.Existing, Allocation{TaskID: fmt.Sprintf("old%d", k), GroupKey: rapid.SampledFrom([]string{"g0", "g1", "g2"}).Draw(t, "egroup"),
			NodeID: snap.Nodes[rapid.IntRange(0, n-1).Draw(t, "enode")].ID})
	}
	return snap
}

// groupRules are per group, so that every task of a group carries the same.
type groupRules struct {
	distinct bool
	perZone  int
	anti     bool
}

func genTasks(t *rapid.T, snap *Snapshot) []Task {
	rules := map[string]groupRules{}
	for _, g := range []string{"g0", "g1", "g2"} {
		rules[g] = groupRules{distinct: rapid.Bool().Draw(t, "distinct"), perZone: rapid.IntRange(0, 2).Draw(t, "perzone"), anti: rapid.Bool().Draw(t, "anti")}
	}
	ops := []Constraint{
		{Label: "zone", Op: "=", Values: []string{"a"}}, {Label: "zone", Op: "!=", Values: []string{"b"}},
		{Label: "zone", Op: "in", Values: []string{"a", "c"}}, {Label: "zone", Op: "not_in", Values: []string{"c"}},
		{Label: "jurisdiction", Op: "exists"}, {Label: "jurisdiction", Op: "not_exists"},
		{Label: "cores", Op: ">", Values: []string{"16"}}, {Label: "cores", Op: "<", Values: []string{"40"}},
	}
	n := rapid.IntRange(1, 14).Draw(t, "tasks")
	var out []Task
	for i := 0; i < n; i++ {
		g := rapid.SampledFrom([]string{"g0", "g1", "g2"}).Draw(t, "group")
		r := rules[g]
		tk := Task{ID: fmt.Sprintf("t%d", i), GroupKey: g, Priority: rapid.IntRange(0, 100).Draw(t, "prio"),
			Request:       Resources{CPUMillis: int64(rapid.IntRange(0, 3000).Draw(t, "rcpu")), MemoryMiB: int64(rapid.IntRange(0, 3000).Draw(t, "rmem"))},
			DistinctHosts: r.distinct}
		switch rapid.IntRange(0, 2).Draw(t, "gpukind") {
		case 1:
			tk.Request.GPUs = rapid.IntRange(1, 3).Draw(t, "rgpus")
		case 2:
			tk.Request.GPUMilli = rapid.IntRange(1, 999).Draw(t, "rmilli")
		}
		if r.perZone > 0 {
			tk.DistinctProperties = []DistinctProperty{{Label: "zone", MaxPerValue: r.perZone}}
		}
		if r.anti {
			tk.AntiAffinityGroups = []string{g}
		}
		for k := rapid.IntRange(0, 2).Draw(t, "ncons"); k > 0; k-- {
			tk.Constraints = append(tk.Constraints, rapid.SampledFrom(ops).Draw(t, "cons"))
		}
		if rapid.Bool().Draw(t, "hasjur") {
			tk.Jurisdictions = []string{rapid.SampledFrom([]string{"eu", "us"}).Draw(t, "tjur")}
		}
		if rapid.Bool().Draw(t, "hasmodels") {
			tk.GPUModels = []string{rapid.SampledFrom(models).Draw(t, "tmodel")}
		}
		if rapid.IntRange(0, 4).Draw(t, "hasexcl") == 0 {
			tk.ExcludedNodes = map[string]bool{snap.Nodes[0].ID: true}
		}
		if rapid.Bool().Draw(t, "hasaff") {
			tk.Affinities = []Affinity{{Label: "zone", Op: "=", Values: []string{"b"}, Weight: rapid.IntRange(-100, 100).Draw(t, "w")}}
			tk.Spreads = []Spread{{Label: "zone", Weight: 50}}
		}
		tk.Policy = rapid.SampledFrom([]Policy{"", PolicySpread, PolicyFragmentation, PolicyBestFit, PolicyRandom}).Draw(t, "policy")
		out = append(out, tk)
	}
	return out
}

// holds is an independent reading of the constraint operators.
func holds(c Constraint, labels map[string]string) bool {
	v, ok := labels[c.Label]
	in := func() bool {
		for _, x := range c.Values {
			if x == v {
				return true
			}
		}
		return false
	}
	num := func() (float64, float64, bool) {
		a, e1 := strconv.ParseFloat(v, 64)
		b, e2 := strconv.ParseFloat(c.Values[0], 64)
		return a, b, ok && e1 == nil && e2 == nil
	}
	switch c.Op {
	case "=":
		return ok && v == c.Values[0]
	case "!=":
		return !ok || v != c.Values[0]
	case "in":
		return ok && in()
	case "not_in":
		return !ok || !in()
	case "exists":
		return ok
	case "not_exists":
		return !ok
	case ">":
		a, b, good := num()
		return good && a > b
	case "<":
		a, b, good := num()
		return good && a < b
	}
	return false
}

func deepCopy(s *Snapshot) *Snapshot {
	c := &Snapshot{Existing: append([]Allocation(nil), s.Existing...)}
	for _, n := range s.Nodes {
		m := *n
		m.GPUFreeMilli = append([]int(nil), n.GPUFreeMilli...)
		if n.GPUFreeMilli == nil {
			m.GPUFreeMilli = nil
		}
		lab := map[string]string{}
		for k, v := range n.Labels {
			lab[k] = v
		}
		m.Labels = lab
		c.Nodes = append(c.Nodes, &m)
	}
	return c
}

func TestPropertyPlanIsValid(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		snap := genSnapshot(t)
		tasks := genTasks(t, snap)
		orig := deepCopy(snap)
		opts := Options{Policy: rapid.SampledFrom([]Policy{PolicyBinpack, PolicySpread, PolicyFragmentation}).Draw(t, "engine"),
			Seed: rapid.Int64().Draw(t, "seed"), CandidateLimit: rapid.SampledFrom([]int{0, -1, 1, 2}).Draw(t, "limit")}
		plan := New(opts).Place(snap, tasks)

		if !reflect.DeepEqual(snap, orig) {
			t.Fatal("snapshot mutated")
		}
		if again := New(opts).Place(snap, tasks); !reflect.DeepEqual(plan, again) {
			t.Fatalf("same seed and input, different plans:\n%+v\n%+v", plan, again)
		}
		byID := map[string]*Task{}
		for i := range tasks {
			byID[tasks[i].ID] = &tasks[i]
		}
		nodes := map[string]*Node{}
		for _, n := range snap.Nodes {
			nodes[n.ID] = n
		}
		seen := map[string]bool{}
		for _, u := range plan.Unplaced {
			if seen[u.TaskID] {
				t.Fatalf("task %s twice", u.TaskID)
			}
			seen[u.TaskID] = true
			if slices.ContainsFunc(plan.Preemptions, func(p Preemption) bool { return p.ForTaskID == u.TaskID }) {
				// A preemptor's reason is its proposal; the per-filter
				// counts are left out (engine.go).
				if !strings.HasPrefix(u.Reason, "preempting ") {
					t.Fatalf("unplaced preemptor %+v: reason does not name the preemption", u)
				}
				continue
			}
			sum := 0
			for _, c := range u.Excluded {
				sum += c
			}
			if sum != len(snap.Nodes) || u.Reason == "" {
				t.Fatalf("unplaced %+v: counts add to %d of %d nodes", u, sum, len(snap.Nodes))
			}
		}
		type use struct {
			cpu, mem int64
			tasks    int
			gpu      []int
		}
		usage := map[string]*use{}
		replaced := map[string]bool{}
		for _, a := range snap.Existing {
			if byID[a.TaskID] != nil {
				replaced[a.TaskID] = true
			}
		}
		groupNode := map[[2]string]int{}
		groupZone := map[[2]string]int{}
		for _, a := range snap.Existing {
			if !replaced[a.TaskID] {
				groupNode[[2]string{a.GroupKey, a.NodeID}]++
				groupZone[[2]string{a.GroupKey, nodes[a.NodeID].Labels["zone"]}]++
			}
		}
		for _, p := range plan.Placements {
			if seen[p.TaskID] {
				t.Fatalf("task %s twice", p.TaskID)
			}
			seen[p.TaskID] = true
			tk, n := byID[p.TaskID], nodes[p.NodeID]
			if n == nil || tk == nil {
				t.Fatalf("placement %+v refers to unknown task or node", p)
			}
			if n.Quarantined || n.Ineligible || tk.ExcludedNodes[n.ID] {
				t.Fatalf("%s on unusable node %+v", tk.ID, n)
			}
			if len(tk.Jurisdictions) > 0 && n.Labels["jurisdiction"] != tk.Jurisdictions[0] {
				t.Fatalf("%s outside its jurisdiction on %s", tk.ID, n.ID)
			}
			for _, c := range tk.Constraints {
				if !holds(c, n.Labels) {
					t.Fatalf("%s on %s breaks %+v", tk.ID, n.ID, c)
				}
			}
			gpuReq := tk.Request.GPUs > 0 || tk.Request.GPUMilli > 0
			if gpuReq && len(tk.GPUModels) > 0 && n.GPUModel != tk.GPUModels[0] {
				t.Fatalf("%s on GPU model %s", tk.ID, n.GPUModel)
			}
			u := usage[n.ID]
			if u == nil {
				u = &use{cpu: n.Allocated.CPUMillis, mem: n.Allocated.MemoryMiB, tasks: n.RunningTasks}
				for g := 0; g < n.Capacity.GPUs; g++ {
					f := 1000
					if n.GPUFreeMilli != nil {
						f = n.GPUFreeMilli[g]
					}
					u.gpu = append(u.gpu, f)
				}
				usage[n.ID] = u
			}
			u.cpu += tk.Request.CPUMillis
			u.mem += tk.Request.MemoryMiB
			u.tasks++
			if u.cpu > n.Capacity.CPUMillis || u.mem > n.Capacity.MemoryMiB || (n.MaxTasks > 0 && u.tasks > n.MaxTasks) {
				t.Fatalf("node %s over-committed: %+v of %+v", n.ID, u, n.Capacity)
			}
			switch {
			case tk.Request.GPUs > 0:
				if len(p.GPUIndices) != tk.Request.GPUs {
					t.Fatalf("%s got GPUs %v", tk.ID, p.GPUIndices)
				}
				for _, g := range p.GPUIndices {
					if u.gpu[g] != 1000 {
						t.Fatalf("%s got busy GPU %d on %s (%v)", tk.ID, g, n.ID, u.gpu)
					}
					u.gpu[g] = 0
				}
			case tk.Request.GPUMilli > 0:
				if len(p.GPUIndices) != 1 {
					t.Fatalf("%s got GPUs %v", tk.ID, p.GPUIndices)
				}
				g := p.GPUIndices[0]
				u.gpu[g] -= tk.Request.GPUMilli
				if u.gpu[g] < 0 {
					t.Fatalf("GPU %d of %s over-committed", g, n.ID)
				}
			default:
				if len(p.GPUIndices) != 0 {
					t.Fatalf("%s got GPUs %v", tk.ID, p.GPUIndices)
				}
			}
			kn, kz := [2]string{tk.GroupKey, n.ID}, [2]string{tk.GroupKey, n.Labels["zone"]}
			if (tk.DistinctHosts || len(tk.AntiAffinityGroups) > 0) && groupNode[kn] > 0 {
				t.Fatalf("%s shares %s with its group", tk.ID, n.ID)
			}
			if len(tk.DistinctProperties) > 0 && groupZone[kz] >= tk.DistinctProperties[0].MaxPerValue {
				t.Fatalf("%s exceeds %d per zone in zone %s", tk.ID, tk.DistinctProperties[0].MaxPerValue, kz[1])
			}
			groupNode[kn]++
			groupZone[kz]++
		}
		if len(seen) != len(tasks) {
			t.Fatalf("%d of %d tasks accounted for", len(seen), len(tasks))
		}
	})
}
