package placement

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// Nodes a task failed on are hard-excluded while another node is feasible,
// and used (ranked by the failure penalty) when only they are.
func TestFailedOnAvoidance(t *testing.T) {
	req := Resources{CPUMillis: 1000, MemoryMiB: 1000}
	cases := []struct {
		name  string
		opts  Options
		nodes func() []*Node
		task  Task
		want  string
	}{
		{name: "affinity toward the failed node does not bring the task back",
			nodes: func() []*Node {
				return []*Node{node("bad", 4000, 4000, 0, map[string]string{"zone": "a"}), node("good", 4000, 4000, 0, map[string]string{"zone": "b"})}
			},
			task: Task{Request: req, FailedOn: map[string]int{"bad": 1},
				Affinities: []Affinity{{Label: "zone", Op: "=", Values: []string{"a"}, Weight: 100}}},
			want: "good"},
		{name: "bin-packing toward the failed node does not bring the task back",
			nodes: func() []*Node {
				bad := node("bad", 4000, 4000, 0, nil)
				bad.Allocated = Resources{CPUMillis: 2900, MemoryMiB: 2900}
				return []*Node{bad, node("good", 64000, 64000, 0, nil)}
			},
			task: Task{Request: req, FailedOn: map[string]int{"bad": 1}},
			want: "good"},
		{name: "only the failed node is big enough: placed there, not left unplaced",
			nodes: func() []*Node {
				return []*Node{node("bad", 4000, 4000, 0, nil), node("small", 500, 4000, 0, nil)}
			},
			task: Task{Request: req, FailedOn: map[string]int{"bad": 2}},
			want: "bad"},
		{name: "the other nodes are ineligible: placed on the failed node",
			nodes: func() []*Node {
				d := node("draining", 4000, 4000, 0, nil)
				d.Ineligible = true
				return []*Node{node("bad", 4000, 4000, 0, nil), d}
			},
			task: Task{Request: req, FailedOn: map[string]int{"bad": 1}},
			want: "bad"},
		{name: "only the failed node matches the constraints: placed there",
			nodes: func() []*Node {
				return []*Node{node("bad", 4000, 4000, 0, map[string]string{"disk": "ssd"}), node("good", 4000, 4000, 0, nil)}
			},
			task: Task{Request: req, FailedOn: map[string]int{"bad": 1}, Constraints: []Constraint{{Label: "disk", Op: "exists"}}},
			want: "bad"},
		{name: "failed everywhere: the penalty picks the node with fewer failures",
			nodes: func() []*Node { return []*Node{node("a", 4000, 4000, 0, nil), node("b", 4000, 4000, 0, nil)} },
			task:  Task{Request: req, FailedOn: map[string]int{"a": 3, "b": 1}},
			want:  "b"},
		{name: "a zero count is no failure",
			nodes: func() []*Node {
				a := node("a", 4000, 4000, 0, nil)
				a.Allocated = Resources{CPUMillis: 2900, MemoryMiB: 2900}
				return []*Node{a, node("b", 64000, 64000, 0, nil), node("c", 64000, 64000, 0, nil)}
			},
			task: Task{Request: req, FailedOn: map[string]int{"a": 0, "c": 1}},
			want: "a"},
		{name: "failed nodes do not use up the candidate limit",
			opts: Options{CandidateLimit: 2},
			nodes: func() []*Node {
				var ns []*Node
				for i := range 20 {
					ns = append(ns, node(fmt.Sprintf("n%02d", i), 4000, 4000, 0, nil))
				}
				return ns
			},
			task: func() Task {
				f := map[string]int{}
				for i := range 19 {
					f[fmt.Sprintf("n%02d", i)] = 1
				}
				return Task{Request: req, FailedOn: f}
			}(),
			want: "n19"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.task.ID = "t"
			for seed := int64(0); seed < 20; seed++ {
				o := tc.opts
				o.Seed = seed
				got, p := placeOne(t, o, &Snapshot{Nodes: tc.nodes()}, tc.task)
				if got != tc.want {
					t.Fatalf("seed %d: placed on %q, want %q (plan %+v)", seed, got, tc.want, p)
				}
			}
		})
	}
}

// A node the task did not fail on that is full for now keeps the task off
// the node it failed on: it waits, and the reason says why.
func TestFailedOnWaitsForRoomElsewhere(t *testing.T) {
	full := node("good", 4000, 4000, 0, nil)
	full.Allocated = Resources{CPUMillis: 3500, MemoryMiB: 3500}
	snap := &Snapshot{Nodes: []*Node{node("bad", 4000, 4000, 0, nil), full}}
	task := Task{ID: "t", Request: Resources{CPUMillis: 1000, MemoryMiB: 1000}, FailedOn: map[string]int{"bad": 2}}
	for _, preempt := range []bool{false, true} {
		got, p := placeOne(t, Options{DisablePreemption: !preempt}, snap, task)
		if got != "" {
			t.Fatalf("placed on %q, want unplaced until good has room", got)
		}
		u := p.Unplaced[0]
		if u.Excluded[ReasonFailedHere] != 1 || u.Excluded[ReasonCPU] != 1 ||
			!strings.Contains(u.Reason, "failed here before: 1 node") {
			t.Fatalf("unplaced %+v, want 1 node under %q and 1 under cpu", u, ReasonFailedHere)
		}
		if len(p.Preemptions) != 0 {
			t.Fatalf("preemptions %+v for a task that could run on a node it failed on", p.Preemptions)
		}
	}
}

// On random clusters (every node big enough, no hard rules), a task with
// failures is placed on a node it did not fail on whenever one is feasible
// now (the same task with those nodes excluded places), waits while such a
// node exists, and is placed on a node it failed on only when every node
// is one.
func TestFailedOnAvoidanceRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	waited, fellBack, avoided := 0, 0, 0
	for iter := range 300 {
		n := 1 + rng.IntN(12)
		var nodes []*Node
		failed := map[string]int{}
		excluded := map[string]bool{}
		for i := range n {
			nd := node(fmt.Sprintf("n%d", i), 4000, 4000, 0, map[string]string{"zone": fmt.Sprint(rng.IntN(3))})
			nd.Allocated = Resources{CPUMillis: int64(rng.IntN(5)) * 1000, MemoryMiB: int64(rng.IntN(5)) * 1000}
			nodes = append(nodes, nd)
			if rng.IntN(2) == 0 {
				failed[nd.ID] = 1 + rng.IntN(3)
				excluded[nd.ID] = true
			}
		}
		task := Task{ID: "t", Request: Resources{CPUMillis: 1000, MemoryMiB: 1000}, FailedOn: failed,
			Affinities: []Affinity{{Label: "zone", Op: "=", Values: []string{"0"}, Weight: 100}}}
		opts := Options{Seed: int64(iter), CandidateLimit: []int{0, 1, 3}[rng.IntN(3)]}
		got, _ := placeOne(t, opts, &Snapshot{Nodes: nodes}, task)
		plain := task
		plain.FailedOn = nil
		anywhere, _ := placeOne(t, opts, &Snapshot{Nodes: nodes}, plain)
		excl := task
		excl.ExcludedNodes = excluded
		elsewhere, _ := placeOne(t, opts, &Snapshot{Nodes: nodes}, excl)
		switch {
		case elsewhere != "" && (got == "" || failed[got] > 0):
			t.Fatalf("iter %d: placed on %q (failed %d times) though %q was feasible", iter, got, failed[got], elsewhere)
		case len(failed) < n && got != "" && failed[got] > 0:
			t.Fatalf("iter %d: placed on %q (failed %d times) though a node it did not fail on exists", iter, got, failed[got])
		case len(failed) == n && (got == "") != (anywhere == ""):
			t.Fatalf("iter %d: failed on every node: placed on %q, %q without FailedOn", iter, got, anywhere)
		}
		switch {
		case got == "" && anywhere != "":
			waited++
		case got != "" && failed[got] > 0:
			fellBack++
		case got != "" && len(failed) > 0:
			avoided++
		}
	}
	if waited == 0 || fellBack == 0 || avoided == 0 {
		t.Fatalf("cases not covered: waited %d, fell back %d, avoided %d", waited, fellBack, avoided)
	}
}
