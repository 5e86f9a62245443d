package scheduler

import (
	"container/heap"
	"sort"
	"time"

	"apiary.dev/apiary/placement"
)

// Candidate selection: which pending tasks a round hands the engine
// (admit), and when a task's unplaced reason is worth writing
// (reasonGate). Both are pure: they read the cache and snapshot, never etcd.

// Unplaced-reason write gating (reasonGate).
const (
	reasonAfter = 2 * time.Second
	reasonEvery = 5 * time.Second
)

// reasonGate gates unplaced-reason writes: a task's reason is recorded once
// it has waited reasonAfter, then at most every reasonEvery, so a busy region
// does not rewrite its queue every round.
type reasonGate struct {
	unplacedSince map[string]time.Time
	reasonAt      map[string]time.Time
}

func newReasonGate() *reasonGate {
	return &reasonGate{unplacedSince: map[string]time.Time{}, reasonAt: map[string]time.Time{}}
}

// due reports whether reason should be written now for the task key whose
// recorded reason is current; it starts the task's wait on first sight and
// notes the write when it says yes.
func (g *reasonGate) due(key, current, reason string, now time.Time) bool {
	since, ok := g.unplacedSince[key]
	if !ok {
		g.unplacedSince[key] = now
		return false
	}
	if current == reason || now.Sub(since) < reasonAfter ||
		(current != "" && now.Sub(g.reasonAt[key]) < reasonEvery) {
		return false
	}
	g.reasonAt[key] = now
	return true
}

// forget drops a task that left PENDING (or the cache).
func (g *reasonGate) forget(key string) {
	delete(g.unplacedSince, key)
	delete(g.reasonAt, key)
}

// candGroup is the placeable pending tasks of one task group.
type candGroup struct {
	key   string
	job   *cJob
	tasks []*cTask
}

// maxExplain bounds the tasks admitted per round only to learn why they do
// not fit (one per group that has no room).
const maxExplain = 64

// admit picks the candidates worth a placement pass, highest priority and
// oldest job first. It reserves room for them in a copy of the nodes' free
// capacity (resources and task caps, ignoring constraints: an upper bound),
// so the round considers at most about as many tasks as the region can take;
// a group with no room left gets one candidate, which the engine uses to say
// why the group waits (at most maxExplain per round). The rest wait for the
// next round instead of being filtered against every node again: a round's
// cost follows free capacity, not the backlog (Nomad gets the same effect by
// blocking evaluations until capacity frees).
func admit(c *ownerCache, groups map[string]*candGroup, snap *placement.Snapshot) (admitted, waiting []*cTask) {
	// A heap, not a sort: once the region is full only the first groups
	// (and maxExplain more) are popped, so a large backlog costs O(groups).
	order := &groupHeap{}
	for _, g := range groups {
		order.gs = append(order.gs, g)
	}
	heap.Init(order)
	free := newFreeRoom(snap.Nodes)
	explain := maxExplain
	for order.Len() > 0 {
		if len(free.nodes) == 0 && explain == 0 {
			for _, g := range order.gs {
				waiting = append(waiting, g.tasks...)
			}
			break
		}
		g := heap.Pop(order).(*candGroup)
		k := 0
		if len(admitted) < maxPlaceBatch {
			k = free.take(c.request(&g.tasks[0].rec), min(len(g.tasks), maxPlaceBatch-len(admitted)))
		}
		if k < len(g.tasks) {
			sort.Slice(g.tasks, func(a, b int) bool { return g.tasks[a].rec.Index < g.tasks[b].rec.Index })
			if k == 0 && explain > 0 {
				k, explain = 1, explain-1
			}
		}
		admitted = append(admitted, g.tasks[:k]...)
		waiting = append(waiting, g.tasks[k:]...)
	}
	return admitted, waiting
}

// groupHeap orders candidate groups: higher priority, then older job, then
// key.
type groupHeap struct{ gs []*candGroup }

func (h *groupHeap) Len() int { return len(h.gs) }
func (h *groupHeap) Less(a, b int) bool {
	ga, gb := h.gs[a], h.gs[b]
	if pa, pb := ga.job.priority(), gb.job.priority(); pa != pb {
		return pa > pb
	}
	if ga.job.rec.SubmitMs != gb.job.rec.SubmitMs {
		return ga.job.rec.SubmitMs < gb.job.rec.SubmitMs
	}
	return ga.key < gb.key
}
func (h *groupHeap) Swap(a, b int) { h.gs[a], h.gs[b] = h.gs[b], h.gs[a] }
func (h *groupHeap) Push(x any)    { h.gs = append(h.gs, x.(*candGroup)) }
func (h *groupHeap) Pop() any {
	g := h.gs[len(h.gs)-1]
	h.gs = h.gs[:len(h.gs)-1]
	return g
}

// freeRoom is a scratch copy of the nodes' free capacity; nodes that are full
// drop out, so once the region is full a group costs O(1).
type freeRoom struct {
	nodes []freeNode
}

type freeNode struct {
	cpu, mem int64
	gpus     int
	tasks    int
}

func newFreeRoom(nodes []*placement.Node) *freeRoom {
	f := &freeRoom{}
	for _, n := range nodes {
		if n.Quarantined || n.Ineligible || n.Reserved {
			continue
		}
		fn := freeNode{cpu: n.Capacity.CPUMillis - n.Allocated.CPUMillis, mem: n.Capacity.MemoryMiB - n.Allocated.MemoryMiB,
			gpus: n.Capacity.GPUs - n.Allocated.GPUs, tasks: 1 << 30}
		if n.MaxTasks > 0 {
			fn.tasks = n.MaxTasks - n.RunningTasks
		}
		if hasRoom(n) {
			f.nodes = append(f.nodes, fn)
		}
	}
	return f
}

// take reserves room for up to want tasks of size req and returns how many
// fit.
func (f *freeRoom) take(req placement.Resources, want int) int {
	got := 0
	for i := 0; i < len(f.nodes) && got < want; {
		n := &f.nodes[i]
		c := n.tasks
		if req.CPUMillis > 0 {
			c = min(c, int(n.cpu/req.CPUMillis))
		}
		if req.MemoryMiB > 0 {
			c = min(c, int(n.mem/req.MemoryMiB))
		}
		if req.GPUs > 0 {
			c = min(c, n.gpus/req.GPUs)
		}
		c = min(c, want-got)
		if c > 0 {
			got += c
			n.tasks -= c
			n.cpu -= int64(c) * req.CPUMillis
			n.mem -= int64(c) * req.MemoryMiB
			n.gpus -= c * req.GPUs
		}
		if n.tasks <= 0 || n.cpu <= 0 || n.mem <= 0 {
			f.nodes[i] = f.nodes[len(f.nodes)-1]
			f.nodes = f.nodes[:len(f.nodes)-1]
			continue
		}
		i++
	}
	return got
}
