package scheduler

import (
	"cmp"
	"slices"
	"time"

	"apiary.dev/apiary/placement"
)

// Candidate selection: which pending tasks a round hands the engine
// (admitter), and when a task's unplaced reason is worth writing
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
	index int32 // the group's index in its job's spec
	tasks []*cTask
}

// maxExplain bounds the tasks admitted per round only to learn why they do
// not fit (one per group that has no room).
const maxExplain = 64

// moreUrgent orders jobs for admission: higher priority, then older, then
// job id (a total order, so rounds are repeatable).
func moreUrgent(a, b *cJob) int {
	if pa, pb := a.priority(), b.priority(); pa != pb {
		return cmp.Compare(pb, pa)
	}
	if a.rec.SubmitMs != b.rec.SubmitMs {
		return cmp.Compare(a.rec.SubmitMs, b.rec.SubmitMs)
	}
	return cmp.Compare(a.rec.ID, b.rec.ID)
}

// admitter picks the candidates worth a placement pass from groups added
// most urgent first (Loop.place adds them in moreUrgent order). It reserves
// room for them in a copy of the nodes' free capacity (resources and task
// caps, ignoring constraints: an upper bound), so the round considers at
// most about as many tasks as the region can take, and at most
// maxPlaceBatch; a group with no room left gets one candidate, which the
// engine uses to say why the group waits (at most maxExplain per round).
// The rest of a group wait for the next round instead of being filtered
// against every node again.
type admitter struct {
	c       *ownerCache
	free    *freeRoom
	explain int
	// admitted go to the engine; waiting are the rest of the added
	// groups' tasks (they get their group's unplaced reason).
	admitted, waiting []*cTask
}

func newAdmitter(c *ownerCache, snap *placement.Snapshot) *admitter {
	return &admitter{c: c, free: newFreeRoom(snap.Nodes), explain: maxExplain}
}

// add admits what fits of g.
func (a *admitter) add(g *candGroup) {
	k := 0
	if len(a.admitted) < maxPlaceBatch {
		k = a.free.take(a.c.request(&g.tasks[0].rec), min(len(g.tasks), maxPlaceBatch-len(a.admitted)))
	}
	if k < len(g.tasks) {
		slices.SortFunc(g.tasks, func(x, y *cTask) int { return cmp.Compare(x.rec.Index, y.rec.Index) })
		if k == 0 && a.explain > 0 {
			k, a.explain = 1, a.explain-1
		}
	}
	a.admitted = append(a.admitted, g.tasks[:k]...)
	a.waiting = append(a.waiting, g.tasks[k:]...)
}

// full reports whether a further group could add nothing but waiting
// tasks: no free room or a full batch, and no explanation left.
func (a *admitter) full() bool {
	return (len(a.free.nodes) == 0 || len(a.admitted) >= maxPlaceBatch) && a.explain == 0
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
