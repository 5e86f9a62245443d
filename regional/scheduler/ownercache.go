package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/qos"
	"apiary.dev/apiary/placement"
	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/regional/taskstate"
)

// ownerCache is the shard owner's view of jobs, tasks and nodes: filled by
// one range read (load) and kept by watches (applyWatch) and by the owner's
// own committed writes (setTask, in a write's after). It holds no state of
// its own: everything in it can be rebuilt from etcd.
type ownerCache struct {
	jobs     map[string]*cJob
	jobTasks map[string]map[string]bool // job id -> task keys
	// jobDone counts each job's tasks and terminal tasks, with the latest
	// FinishedMs (retention finds finished jobs without reading tasks).
	jobDone map[string]*jobDone
	// shardTasks counts each shard's tasks by state, with the latest
	// AssignedMs (the per-second gauges and ListShards read them without
	// a pass over every task).
	shardTasks map[int]*shardTasks
	tasks      map[string]*cTask // task key -> task
	nodes      map[string]*cNode
	pending    map[string]*cTask // task key -> task, of the tasks in PENDING
	// pendingByJob is pending by job id: a round judges a job's shard,
	// owner, cancel flag and stages once, not once per task.
	pendingByJob map[string]map[string]*cTask
	byNode       map[string]map[string]bool // node id -> active task keys
	// byNodeEpoch counts the tasks of byNode by node and node epoch, so
	// that reclaim passes over a node whose only epoch is its live one
	// without visiting its tasks.
	byNodeEpoch map[string]map[int64]int
	// reserved maps a node id to the PENDING tasks holding a reservation
	// there (taskstate.Reservation; preempt.go).
	reserved map[string]map[string]bool
	// victimPri counts the active tasks that could be preempted (not being
	// preempted or cancelled already) by their job's priority: the
	// preemption pass runs only for a task that outranks the lowest.
	victimPri map[int32]int
	// dirtyCancel holds the jobs whose cancel flag was seen set: the next
	// round's cancels pass handles them.
	dirtyCancel map[string]bool
	// nodesGen counts node record and liveness changes (Snapshot.Generation).
	nodesGen uint64
	// nodesRev is the etcd revision up to which the node keys are known
	// (the load's revision, then each node event's): the region's
	// quarantine set changes only with a node's health record, so a set
	// ModRevision above it is a quarantine this cache has not seen yet
	// (planWrite compares it).
	nodesRev int64
	// useDirty holds the nodes where a task changed since their usage was
	// last computed (nodeSnapshot.usage).
	useDirty map[string]bool
	// aaJobs maps each anti-affinity group to the jobs with a task group
	// that names it (nodeSnapshot.existing adds their active tasks);
	// aaRev holds each anti-affinity scope key's ModRevision (planWrite
	// compares it).
	aaJobs map[string]map[string]bool
	aaRev  map[string]int64

	// specs receives every job record seen (shared with report commit);
	// nil in tests.
	specs *store.SpecCache
	// index receives every job record and task state change, and the
	// revision applied (ListJobs reads it); nil for none.
	index *JobIndex
	// nodeIndex receives every node's view after each change, and the
	// revision applied (the capacity summary reads it); nil for none.
	nodeIndex *NodeIndex
	// leftPending is called with a task key that left PENDING or the cache
	// (the reason gate forgets it); nil for none.
	leftPending func(key string)
	// skipped is called with a record that does not decode (it is left
	// out of the cache); nil for none.
	skipped func(what, key string, err error)
}

// jobDone is a job's task counts for retention: tasks held, how many are
// terminal, and the latest FinishedMs among them.
type jobDone struct {
	tasks, terminal int
	finishedMs      int64
}

// count adds (sign 1) or removes (sign -1) a task in state st finished at
// finishedMs.
func (d *jobDone) count(st apiaryv1.TaskState, finishedMs int64, sign int) {
	d.tasks += sign
	if taskstate.Terminal(st) {
		d.terminal += sign
		if sign > 0 {
			d.finishedMs = max(d.finishedMs, finishedMs)
		}
	}
}

// shardTasks is one shard's task counts by state and its latest
// AssignedMs.
type shardTasks struct {
	states       map[apiaryv1.TaskState]int
	lastAssigned int64
}

// countShard adds (sign 1) or removes (sign -1) task t of shard sh.
func (c *ownerCache) countShard(sh int, t *taskstate.Task, sign int) {
	st := c.shardTasks[sh]
	if st == nil {
		st = &shardTasks{states: map[apiaryv1.TaskState]int{}}
		c.shardTasks[sh] = st
	}
	if st.states[t.State] += sign; st.states[t.State] <= 0 {
		delete(st.states, t.State)
	}
	if sign > 0 {
		st.lastAssigned = max(st.lastAssigned, t.AssignedMs)
	}
}

type cJob struct {
	rec    store.JobRecord
	modRev int64
}

type cTask struct {
	key string
	// gk is groupKey(&rec), made once (gkey).
	gk     string
	shard  int
	rec    taskstate.Task
	modRev int64
	// victim: counted in ownerCache.victimPri under pri.
	victim bool
	pri    int32
}

// gkey is the task's groupKey, made on first use (a cTask is replaced, not
// modified, when its record changes).
func (ct *cTask) gkey() string {
	if ct.gk == "" {
		ct.gk = groupKey(&ct.rec)
	}
	return ct.gk
}

// cNode is a node's keys as the owner holds them (the shared decoding,
// store.NodeView, keyed by its id).
type cNode struct {
	id string
	store.NodeView
}

func newOwnerCache(specs *store.SpecCache) *ownerCache {
	return &ownerCache{jobs: map[string]*cJob{}, jobTasks: map[string]map[string]bool{}, jobDone: map[string]*jobDone{}, shardTasks: map[int]*shardTasks{}, tasks: map[string]*cTask{},
		nodes: map[string]*cNode{}, pending: map[string]*cTask{}, pendingByJob: map[string]map[string]*cTask{}, byNode: map[string]map[string]bool{}, byNodeEpoch: map[string]map[int64]int{}, reserved: map[string]map[string]bool{}, victimPri: map[int32]int{},
		dirtyCancel: map[string]bool{}, useDirty: map[string]bool{}, aaJobs: map[string]map[string]bool{},
		aaRev: map[string]int64{}, specs: specs}
}

// load reads jobs, tasks and nodes at one revision and returns it (the
// watches start after it).
func (c *ownerCache) load(ctx context.Context, kv clientv3.KV) (int64, error) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if c.index != nil {
		c.index.Reset()
	}
	if c.nodeIndex != nil {
		c.nodeIndex.Reset()
	}
	resp, err := kv.Txn(cctx).Then(clientv3.OpGet(store.PrefJobs, clientv3.WithPrefix()),
		clientv3.OpGet(store.PrefTasks, clientv3.WithPrefix()), clientv3.OpGet(store.PrefNodes, clientv3.WithPrefix()),
		clientv3.OpGet(store.PrefAntiAffinity, clientv3.WithPrefix())).Commit()
	if err != nil {
		return 0, fmt.Errorf("load: %w", err)
	}
	for _, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().Kvs {
			c.apply(kv, false)
		}
	}
	c.nodesRev = max(c.nodesRev, resp.Header.Revision)
	c.advance(resp.Header.Revision)
	return resp.Header.Revision, nil
}

// applyWatch applies one watch response; a closed or failed watch is an
// error (the owner loop ends and campaigns again).
func (c *ownerCache) applyWatch(wr clientv3.WatchResponse, ok bool) error {
	if !ok {
		return errors.New("watch closed")
	}
	if err := wr.Err(); err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	for _, ev := range wr.Events {
		c.apply(ev.Kv, ev.Type == clientv3.EventTypeDelete)
	}
	// Every event up to the header's revision is applied (a progress
	// notification carries no events, only the revision).
	c.advance(wr.Header.Revision)
	return nil
}

// advance tells the concurrent views that every event up to rev is
// applied.
func (c *ownerCache) advance(rev int64) {
	if c.index != nil {
		c.index.advance(rev)
	}
	if c.nodeIndex != nil {
		c.nodeIndex.advance(rev)
	}
}

// apply folds one key's new value (or deletion) into the cache; older
// revisions than the cached one are ignored (own writes are applied at
// commit time and seen again from the watch). A value that does not decode
// is left out and reported to skipped.
func (c *ownerCache) apply(kv *mvccpb.KeyValue, deleted bool) {
	key := string(kv.Key)
	switch {
	case store.IsTaskKey(key):
		shard, _, _, ok := store.ParseTaskKey(key)
		if !ok {
			return
		}
		old := c.tasks[key]
		if old != nil && kv.ModRevision <= old.modRev {
			return
		}
		if deleted {
			c.setTask(key, nil)
			return
		}
		var t taskstate.Task
		if err := json.Unmarshal(kv.Value, &t); err != nil {
			c.skip("task", key, err)
			return
		}
		c.setTask(key, &cTask{key: key, shard: shard, rec: t, modRev: kv.ModRevision})
	case store.IsJobKey(key):
		_, jobID, ok := store.ParseJobKey(key)
		if !ok {
			return
		}
		old := c.jobs[jobID]
		if deleted {
			c.indexAntiAffinity(jobID, old, false)
			delete(c.jobs, jobID)
			if c.index != nil {
				c.index.deleteJob(jobID)
			}
			return
		}
		if old != nil && kv.ModRevision <= old.modRev {
			return
		}
		var j store.JobRecord
		if err := json.Unmarshal(kv.Value, &j); err != nil {
			c.skip("job", key, err)
			return
		}
		c.indexAntiAffinity(jobID, old, false)
		c.jobs[jobID] = &cJob{rec: j, modRev: kv.ModRevision}
		c.indexAntiAffinity(jobID, c.jobs[jobID], true)
		if c.index != nil {
			c.index.putJob(&c.jobs[jobID].rec)
		}
		if c.specs != nil {
			c.specs.Put(&j)
		}
		if j.CancelRequested {
			c.dirtyCancel[jobID] = true
		}
	case store.IsAntiAffinityKey(key):
		if deleted {
			delete(c.aaRev, key)
		} else if kv.ModRevision > c.aaRev[key] {
			c.aaRev[key] = kv.ModRevision
		}
	case store.IsNodeKey(key):
		id, kind, ok := store.NodeKeyKind(key)
		if !ok {
			return
		}
		c.nodesRev = max(c.nodesRev, kv.ModRevision)
		n := c.nodes[id]
		if n == nil {
			n = &cNode{id: id}
			c.nodes[id] = n
		}
		q := n.Health.Quarantine
		if err := n.Apply(kind, kv, deleted); err != nil {
			c.skip("node", key, err)
		}
		if c.nodeIndex != nil && kind != store.NodeOutputKey {
			c.nodeIndex.put(id, n.NodeView)
		}
		// Node set, labels, capacity or quarantine may change: the
		// placement engine must rebuild its per-snapshot indexes. Usage
		// and the outcomes a health record counts do not change them.
		if kind != store.NodeUsageKey && (kind != store.NodeHealthKey || (q == nil) != (n.Health.Quarantine == nil)) {
			c.nodesGen++
		}
	}
}

func (c *ownerCache) skip(what, key string, err error) {
	if c.skipped != nil {
		c.skipped(what, key, err)
	}
}

// setTask replaces a cached task (nil removes it) and keeps the indexes in
// step.
func (c *ownerCache) setTask(key string, t *cTask) {
	if old := c.tasks[key]; old != nil {
		c.countShard(old.shard, &old.rec, -1)
		if d := c.jobDone[old.rec.JobID]; d != nil {
			if d.count(old.rec.State, 0, -1); d.tasks <= 0 {
				delete(c.jobDone, old.rec.JobID)
			}
		}
	}
	if t != nil {
		c.countShard(t.shard, &t.rec, 1)
		d := c.jobDone[t.rec.JobID]
		if d == nil {
			d = &jobDone{}
			c.jobDone[t.rec.JobID] = d
		}
		d.count(t.rec.State, t.rec.FinishedMs, 1)
	}
	if c.index != nil {
		var jobID string
		var from, to apiaryv1.TaskState
		var finished int64
		if old := c.tasks[key]; old != nil {
			jobID, from = old.rec.JobID, old.rec.State
		}
		if t != nil {
			jobID, to, finished = t.rec.JobID, t.rec.State, t.rec.FinishedMs
		}
		c.index.task(jobID, from, to, finished)
	}
	if t != nil && t.rec.NodeID != "" {
		c.useDirty[t.rec.NodeID] = true
	}
	if t != nil && t.rec.Reservation != nil {
		c.useDirty[t.rec.Reservation.NodeID] = true
	}
	if old := c.tasks[key]; old != nil && old.victim {
		if c.victimPri[old.pri]--; c.victimPri[old.pri] <= 0 {
			delete(c.victimPri, old.pri)
		}
	}
	if t != nil && taskstate.Active(t.rec.State) && t.rec.PreemptedBy == "" && !t.rec.CancelRequested {
		t.victim, t.pri = true, c.jobs[t.rec.JobID].priority()
		c.victimPri[t.pri]++
	}
	if old := c.tasks[key]; old != nil {
		if old.rec.NodeID != "" {
			c.useDirty[old.rec.NodeID] = true
		}
		if r := old.rec.Reservation; r != nil {
			c.useDirty[r.NodeID] = true
			if m := c.reserved[r.NodeID]; m != nil {
				delete(m, key)
				if len(m) == 0 {
					delete(c.reserved, r.NodeID)
				}
			}
		}
		if c.pending[key] != nil {
			delete(c.pending, key)
			if m := c.pendingByJob[old.rec.JobID]; m != nil {
				if delete(m, key); len(m) == 0 {
					delete(c.pendingByJob, old.rec.JobID)
				}
			}
		}
		if m := c.byNode[old.rec.NodeID]; m[key] {
			delete(m, key)
			c.countNodeEpoch(old.rec.NodeID, old.rec.NodeEpoch, -1)
		}
		if t == nil {
			c.forget(key)
			delete(c.tasks, key)
			if m := c.jobTasks[old.rec.JobID]; m != nil {
				delete(m, key)
			}
			return
		}
	}
	if t == nil {
		return
	}
	c.tasks[key] = t
	m := c.jobTasks[t.rec.JobID]
	if m == nil {
		m = map[string]bool{}
		c.jobTasks[t.rec.JobID] = m
	}
	m[key] = true
	if t.rec.State != apiaryv1.TaskState_TASK_STATE_PENDING {
		c.forget(key)
	}
	switch {
	case t.rec.State == apiaryv1.TaskState_TASK_STATE_PENDING:
		c.pending[key] = t
		pj := c.pendingByJob[t.rec.JobID]
		if pj == nil {
			pj = map[string]*cTask{}
			c.pendingByJob[t.rec.JobID] = pj
		}
		pj[key] = t
		if r := t.rec.Reservation; r != nil {
			m := c.reserved[r.NodeID]
			if m == nil {
				m = map[string]bool{}
				c.reserved[r.NodeID] = m
			}
			m[key] = true
		}
	case taskstate.Active(t.rec.State):
		bn := c.byNode[t.rec.NodeID]
		if bn == nil {
			bn = map[string]bool{}
			c.byNode[t.rec.NodeID] = bn
		}
		bn[key] = true
		c.countNodeEpoch(t.rec.NodeID, t.rec.NodeEpoch, 1)
	}
}

// countNodeEpoch adds d to the active tasks of node id's epoch.
func (c *ownerCache) countNodeEpoch(id string, epoch int64, d int) {
	m := c.byNodeEpoch[id]
	if m == nil {
		m = map[int64]int{}
		c.byNodeEpoch[id] = m
	}
	if m[epoch] += d; m[epoch] <= 0 {
		delete(m, epoch)
		if len(m) == 0 {
			delete(c.byNodeEpoch, id)
		}
	}
}

// onlyLiveEpoch reports whether every active task on node id runs under
// epoch alive (true too when it has none).
func (c *ownerCache) onlyLiveEpoch(id string, alive int64) bool {
	m := c.byNodeEpoch[id]
	return len(m) == 0 || (len(m) == 1 && m[alive] > 0)
}

// lowestVictim is the lowest job priority of an active task that could be
// preempted; false when there is none.
func (c *ownerCache) lowestVictim() (int32, bool) {
	low, ok := int32(0), false
	for p := range c.victimPri {
		if !ok || p < low {
			low, ok = p, true
		}
	}
	return low, ok
}

func (c *ownerCache) forget(key string) {
	if c.leftPending != nil {
		c.leftPending(key)
	}
}

// removeJob drops a deleted job and its tasks.
func (c *ownerCache) removeJob(id string) {
	for k := range c.jobTasks[id] {
		c.setTask(k, nil)
	}
	c.indexAntiAffinity(id, c.jobs[id], false)
	delete(c.jobTasks, id)
	delete(c.jobDone, id)
	delete(c.jobs, id)
	if c.index != nil {
		c.index.deleteJob(id)
	}
}

// indexAntiAffinity adds job id to (add false: removes it from) aaJobs
// under every anti-affinity group its record j's task groups name.
func (c *ownerCache) indexAntiAffinity(id string, j *cJob, add bool) {
	if j == nil {
		return
	}
	for _, g := range j.rec.Spec.GetTasks() {
		name := g.GetAntiAffinity().GetGroup()
		if name == "" {
			continue
		}
		m := c.aaJobs[name]
		switch {
		case add && m == nil:
			c.aaJobs[name] = map[string]bool{id: true}
		case add:
			m[id] = true
		case m != nil:
			delete(m, id)
			if len(m) == 0 {
				delete(c.aaJobs, name)
			}
		}
	}
}

// antiAffinityGroup is the anti-affinity group t's task group names ("" for
// none).
func (c *ownerCache) antiAffinityGroup(t *taskstate.Task) string {
	return c.group(t).GetAntiAffinity().GetGroup()
}

// antiAffinityScope is the scope of t's anti-affinity group
// (placement.ScopeNode when unset).
func (c *ownerCache) antiAffinityScope(t *taskstate.Task) string {
	if sc := c.group(t).GetAntiAffinity().GetScope(); sc != "" {
		return sc
	}
	return placement.ScopeNode
}

// antiAffinityLabelScopes is the label scopes (not the node scope) that the
// cached jobs' task groups naming anti-affinity group name use, sorted.
func (c *ownerCache) antiAffinityLabelScopes(name string) []string {
	var out []string
	for job := range c.aaJobs[name] {
		for _, g := range c.jobs[job].rec.Spec.GetTasks() {
			if aa := g.GetAntiAffinity(); aa.GetGroup() == name && aa.GetScope() != "" && aa.GetScope() != placement.ScopeNode &&
				!slices.Contains(out, aa.GetScope()) {
				out = append(out, aa.GetScope())
			}
		}
	}
	slices.Sort(out)
	return out
}

// group is the task group of a task (nil when its job is not cached).
func (c *ownerCache) group(t *taskstate.Task) *apiaryv1.TaskGroup {
	j := c.jobs[t.JobID]
	if j == nil || int(t.Group) >= len(j.rec.Spec.GetTasks()) {
		return nil
	}
	return j.rec.Spec.GetTasks()[t.Group]
}

// request is what one task of t's group asks for.
func (c *ownerCache) request(t *taskstate.Task) placement.Resources {
	r := c.group(t).GetResources()
	return placement.Resources{CPUMillis: r.GetCpuMillis(), MemoryMiB: r.GetMemoryMb(), GPUs: int(r.GetGpus()), GPUMilli: int(r.GetGpuMilli())}
}

// qos is the QoS class of t's group for the engine.
func (c *ownerCache) qos(t *taskstate.Task) placement.QoS {
	switch qos.Of(c.group(t).GetResources()) {
	case qos.Guaranteed:
		return placement.QoSGuaranteed
	case qos.BestEffort:
		return placement.QoSBestEffort
	}
	return placement.QoSBurstable
}

// jobPolicy is the retry policy of a task and its job record (nil, with the
// default policy, when the job is not cached).
func (c *ownerCache) jobPolicy(t *taskstate.Task) (taskstate.Policy, *store.JobRecord) {
	j := c.jobs[t.JobID]
	if j == nil {
		return store.PolicyOf(nil, t.Group), nil
	}
	return store.PolicyOf(j.rec.Spec, t.Group), &j.rec
}

func (j *cJob) priority() int32 {
	if j == nil {
		return 0
	}
	return j.rec.Spec.GetPriority()
}
