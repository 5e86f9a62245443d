package regional

import (
	"context"
	"encoding/json"
	"fmt"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/federation"
	"apiary.dev/apiary/internal/jobspec"
	"apiary.dev/apiary/internal/lifecycle"
	"apiary.dev/apiary/internal/priority"
	"apiary.dev/apiary/regional/nodehealth"
	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/regional/taskstate"
)

// Admission at the door: before a submission writes anything, the region
// checks (1) the sovereignty policy (internal/sovereignty), (2) that
// every task fits on at least one of its registered nodes, and (3) that the
// pending backlog of the job's priority class is below its bound. (2) and (3)
// use a summary that capacityLoop refreshes from etcd every
// CapacityRefresh; the same summary is published in the WAN tags.

// CapacityRefresh is how often the coordinator re-reads node capacity (and,
// with a backlog bound, the backlog): the WAN summary's refresh
// (federation.SummaryRefresh).
const CapacityRefresh = federation.SummaryRefresh

// BacklogBounds maps a priority class (priority.Batch, ClassStandard,
// ClassUrgent) to the most PENDING tasks the region keeps before it refuses
// new jobs of that class with RESOURCE_EXHAUSTED. 0 or absent: unbounded.
type BacklogBounds map[string]int64

// ParseBacklogBounds parses "N" (every class) or "class=N,..." (classes
// batch, standard, urgent); N >= 0, 0 meaning unbounded.
func ParseBacklogBounds(s string) (BacklogBounds, error) {
	out := BacklogBounds{}
	s = strings.TrimSpace(s)
	if s == "" {
		return out, nil
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n < 0 {
			return nil, fmt.Errorf("max-pending: must be >= 0, got %d", n)
		}
		for _, c := range priority.Classes {
			out[c] = n
		}
		return out, nil
	}
	for _, part := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		n, err := strconv.ParseInt(v, 10, 64)
		if !ok || err != nil || n < 0 {
			return nil, fmt.Errorf("max-pending: %q must be N or class=N with N >= 0", part)
		}
		known := false
		for _, c := range priority.Classes {
			known = known || c == k
		}
		if !known {
			return nil, fmt.Errorf("max-pending: class %q must be one of %s", k, strings.Join(priority.Classes, ", "))
		}
		out[k] = n
	}
	return out, nil
}

func (b BacklogBounds) any() bool {
	for _, n := range b {
		if n > 0 {
			return true
		}
	}
	return false
}

// capacityState is the last summary read from etcd, plus the tasks this
// coordinator accepted since that read began.
type capacityState struct {
	// refresh serializes refreshes (refreshCapacity).
	refresh sync.Mutex
	mu      sync.Mutex
	// nodesRev is the etcd revision the last summary's nodes are current
	// to (refreshCapacityAfter).
	nodesRev int64
	readOK   bool
	// everRead: some read succeeded (so a failed one is an outage, and
	// the next good one a recovery, worth a log line).
	everRead  bool
	readAt    time.Time
	cap       federation.Capacity
	sizes     []federation.Res // distinct capacities of registered nodes
	gpuModels map[string]bool  // GPU models of registered nodes
	nodesSeen int
	// From the last read (health also from this coordinator's report
	// commits since, health.go): live counts the ready nodes (the share
	// guard's denominator); ready and eligible (ready and taking
	// placements) name them; held names the nodes an operator
	// quarantined; health holds every node's attribution record (the rest
	// of the region that nodehealth's outlier rule compares a node with).
	live            int
	ready, eligible map[string]bool
	held            map[string]bool
	health          map[string]nodehealth.Record
	// region is the health sum over the nodes above (health.go), kept
	// between report batches; nil when the sets were replaced.
	region  *regionSum
	pending map[string]int64 // by class, from the last read (-1 unknown)
	// extra holds the jobs this coordinator accepted that the last read
	// did not see yet (job id → class and task count).
	extra map[string]localJob
	// lastSeen: job ids the last read saw (a job committed just before that
	// read must not be added to extra afterwards).
	lastSeen map[string]int32
}

type localJob struct {
	class string
	tasks int64
}

// extraBy sums the not-yet-read local jobs of a class.
func (st *capacityState) extraBy(class string) int64 {
	var n int64
	for _, j := range st.extra {
		if j.class == class {
			n += j.tasks
		}
	}
	return n
}

// refreshCapacity recomputes the capacity summary. Nodes come from the node
// index (the scheduling loop's watch cache) once it is loaded, and the
// backlog (when bounded) from the job index; until then both are read from
// etcd. Every refresh makes one linearizable read (a single key when both
// indexes are loaded), so an etcd without quorum shows as etcd-unavailable.
// Refreshes run one at a time.
func (c *Coordinator) refreshCapacity(ctx context.Context) {
	c.capState.refresh.Lock()
	defer c.capState.refresh.Unlock()
	c.refreshCapacityLocked(ctx)
}

// refreshCapacityLocked is refreshCapacity with capState.refresh held.
func (c *Coordinator) refreshCapacityLocked(ctx context.Context) {
	st := &c.capState
	fromCache := c.nodes.Revision() > 0
	bounded := c.cfg.Backlog.any()
	fromIndex := bounded && c.jobs.Revision() > 0
	var ops []clientv3.Op
	nodesAt, jobsAt := -1, -1
	if !fromCache {
		nodesAt = len(ops)
		ops = append(ops, clientv3.OpGet(store.PrefNodes, clientv3.WithPrefix()))
	}
	if bounded && !fromIndex {
		jobsAt = len(ops)
		ops = append(ops, clientv3.OpGet(store.PrefJobs, clientv3.WithPrefix()), clientv3.OpGet(store.PrefTasks, clientv3.WithPrefix()))
	}
	if len(ops) == 0 {
		// The quorum probe: one key, keys only.
		ops = append(ops, clientv3.OpGet(store.KeyMember(c.cfg.ID), clientv3.WithKeysOnly()))
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	resp, err := c.cli.Txn(cctx).Then(ops...).Commit()
	cancel()
	st.mu.Lock()
	wasOK := st.readOK
	st.mu.Unlock()
	if err != nil {
		st.mu.Lock()
		st.readOK = false
		lastRead := st.readAt
		st.mu.Unlock()
		// One slow read on a loaded host is no lost quorum: health says
		// NOT_SERVING once reads have failed for notServingAfter.
		if lastRead.IsZero() || time.Since(lastRead) >= notServingAfter {
			c.setServing(false)
		}
		if wasOK {
			// Say it once per outage: the router already shows the region
			// down (etcd-unavailable), an operator reading this log needs
			// to know why the coordinator stays up doing nothing.
			c.log.Warn("the region's etcd answers no reads (lost quorum? see apiary region status); the coordinator keeps trying and publishes etcd-unavailable",
				"err", err)
		}
		return
	}
	if !wasOK && st.everRead {
		c.log.Info("the region's etcd answers reads again")
	}
	st.mu.Lock()
	st.everRead = true
	st.mu.Unlock()
	var ns nodeSummary
	ns.init()
	nodesRev := resp.Header.Revision
	if fromCache {
		if rev := c.nodes.Each(ns.add); rev > 0 {
			nodesRev = rev
		} else {
			return // reloading since the check above: the next refresh reads
		}
	} else {
		for id, nv := range store.DecodeNodes(resp.Responses[nodesAt].GetResponseRange().Kvs) {
			ns.add(id, nv)
		}
	}
	var pending map[string]int64
	var seenJobs map[string]int32
	switch {
	case fromIndex:
		seenJobs, pending = map[string]int32{}, map[string]int64{}
		if c.jobs.EachPending(func(rec *store.JobRecord, n int32) {
			seenJobs[rec.ID] = rec.Spec.GetPriority()
			pending[priority.Of(rec.Spec.GetPriority())] += int64(n)
		}) == 0 {
			seenJobs, pending = nil, nil // reloading: unknown until the next refresh
		}
	case bounded:
		prio := map[string]int32{}
		seenJobs = prio
		for _, kv := range resp.Responses[jobsAt].GetResponseRange().Kvs {
			var j store.JobRecord
			if json.Unmarshal(kv.Value, &j) == nil {
				prio[j.ID] = j.Spec.GetPriority()
			}
		}
		pending = map[string]int64{}
		for _, kv := range resp.Responses[jobsAt+1].GetResponseRange().Kvs {
			var t taskstate.Task
			if json.Unmarshal(kv.Value, &t) == nil && t.State == apiaryv1.TaskState_TASK_STATE_PENDING {
				pending[priority.Of(prio[t.JobID])]++
			}
		}
	}
	st.mu.Lock()
	st.readOK, st.readAt, st.cap, st.sizes, st.gpuModels, st.nodesSeen, st.pending = true, time.Now(), ns.sum, ns.sizes, ns.models, ns.nodesSeen, pending
	st.live, st.health, st.ready, st.eligible, st.held = ns.live, ns.health, ns.ready, ns.eligible, ns.held
	st.region = nil
	st.nodesRev = nodesRev
	st.lastSeen = seenJobs
	c.setServing(true)
	if !bounded {
		clear(st.extra)
	}
	for id := range st.extra {
		if _, seen := seenJobs[id]; seen {
			delete(st.extra, id) // counted in pending (if still pending)
		}
	}
	st.mu.Unlock()
}

// notServingAfter: how long the region's etcd must have answered no read of
// this coordinator before its gRPC health says NOT_SERVING.
const notServingAfter = 3 * time.Second

// setServing sets the gRPC health service's answer (grpc.health.v1, the
// server as a whole): SERVING while the region's etcd answers this
// coordinator's reads, NOT_SERVING from start until the first read and
// once reads have failed for notServingAfter (a member cut off from its
// region's quorum). Routers,
// other regions' failover probes and container health checks all ask it,
// so none of them sends work to a coordinator that cannot commit it.
func (c *Coordinator) setServing(ok bool) {
	if c.health == nil {
		return
	}
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ok {
		st = healthpb.HealthCheckResponse_SERVING
	}
	c.health.SetServingStatus("", st)
}

// nodeSummary is the node half of the capacity summary, summed one node at
// a time (add) from the node index or from a range read.
type nodeSummary struct {
	sum                   federation.Capacity
	seen                  map[federation.Res]bool
	sizes                 []federation.Res
	nodesSeen, live       int
	models                map[string]bool
	health                map[string]nodehealth.Record
	ready, eligible, held map[string]bool
}

func (ns *nodeSummary) init() {
	ns.seen, ns.models, ns.health = map[federation.Res]bool{}, map[string]bool{}, map[string]nodehealth.Record{}
	ns.ready, ns.eligible, ns.held = map[string]bool{}, map[string]bool{}, map[string]bool{}
}

func (ns *nodeSummary) add(id string, nv *store.NodeView) {
	if nv.HealthRev != 0 {
		ns.health[id] = nv.Health
	}
	if nv.Ready() {
		ns.live++
		ns.ready[id] = true
		ns.eligible[id] = !nv.NoPlacements()
	}
	if nv.Rec != nil && nv.Rec.Quarantined {
		ns.held[id] = true
	}
	r := nv.Rec
	if r == nil || r.Capacity == nil {
		return
	}
	ns.nodesSeen++
	if r.GPUModel != "" {
		ns.models[r.GPUModel] = true
	}
	size := federation.Res{CPUMillis: r.Capacity.GetCpuMillis(), MemoryMiB: r.Capacity.GetMemoryMb(), GPUs: int64(r.Capacity.GetGpus())}
	if !ns.seen[size] {
		ns.seen[size] = true
		ns.sizes = append(ns.sizes, size)
	}
	sum := &ns.sum
	sum.Largest.CPUMillis = max(sum.Largest.CPUMillis, size.CPUMillis)
	sum.Largest.MemoryMiB = max(sum.Largest.MemoryMiB, size.MemoryMiB)
	sum.Largest.GPUs = max(sum.Largest.GPUs, size.GPUs)
	if !nv.Ready() || nv.NoPlacements() {
		return
	}
	sum.NodesReady++
	free := size
	if u := nv.Usage; u != nil && u.Epoch == r.Epoch {
		free.CPUMillis -= u.CPUMillis
		free.MemoryMiB -= u.MemoryMiB
		free.GPUs -= int64(u.GPUs)
	}
	sum.Free.CPUMillis += max(free.CPUMillis, 0)
	sum.Free.MemoryMiB += max(free.MemoryMiB, 0)
	sum.Free.GPUs += max(free.GPUs, 0)
}

// refreshCapacityAfter makes the capacity summary include a node write
// committed at rev (a registration, a drain, a quarantine), so admission
// judges "fits no node" with it: it waits (up to 2 s) until the node index
// holds rev, and recomputes unless a refresh since did. In a registration
// storm the recomputes coalesce: a write waits at most capacityCoalesce
// behind the last one, and every write the index holds by then is counted
// by the one recompute. Before the index is loaded it reads etcd.
func (c *Coordinator) refreshCapacityAfter(ctx context.Context, rev int64) {
	st := &c.capState
	if c.nodes.Revision() > 0 {
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_ = c.nodes.WaitFor(wctx, rev)
		cancel()
		st.mu.Lock()
		doneRev, at := st.nodesRev, st.readAt
		st.mu.Unlock()
		if doneRev >= rev {
			return
		}
		if wait := capacityCoalesce - time.Since(at); wait > 0 {
			if lifecycle.Sleep(ctx, wait) != nil {
				return
			}
		}
	}
	st.refresh.Lock()
	defer st.refresh.Unlock()
	st.mu.Lock()
	doneRev := st.nodesRev
	st.mu.Unlock()
	if doneRev >= rev {
		return // a refresh that this one waited behind counted it
	}
	c.refreshCapacityLocked(ctx)
}

// capacityCoalesce is the shortest time between two refreshes that
// refreshCapacityAfter starts (a registration waits at most this long).
const capacityCoalesce = 50 * time.Millisecond

// capacitySnapshot returns the summary for the WAN tags.
func (c *Coordinator) capacitySnapshot() (health string, cp federation.Capacity, backlog []federation.Backlog) {
	st := &c.capState
	st.mu.Lock()
	defer st.mu.Unlock()
	switch {
	case !st.readOK:
		health = federation.HealthEtcdDown
	case st.cap.NodesReady == 0:
		health = federation.HealthNoNodes
	default:
		health = federation.HealthOK
	}
	for _, class := range priority.Classes {
		b := federation.Backlog{Class: class, Pending: -1, Bound: c.cfg.Backlog[class]}
		if st.pending != nil {
			b.Pending = st.pending[class] + st.extraBy(class)
		}
		backlog = append(backlog, b)
	}
	return health, st.cap, backlog
}

// admit runs the capacity checks on a validated, defaulted spec. It writes
// nothing.
func (c *Coordinator) admit(spec *apiaryv1.JobSpec) error {
	st := &c.capState
	st.mu.Lock()
	defer st.mu.Unlock()
	// A task larger than every registered node can never be placed.
	if st.readOK && st.nodesSeen > 0 {
		for g, grp := range spec.GetTasks() {
			r := grp.GetResources()
			need := federation.Res{CPUMillis: r.GetCpuMillis(), MemoryMiB: r.GetMemoryMb(), GPUs: int64(r.GetGpus())}
			if r.GetGpuMilli() > 0 && need.GPUs == 0 {
				need.GPUs = 1
			}
			fits := false
			for _, s := range st.sizes {
				if need.CPUMillis <= s.CPUMillis && need.MemoryMiB <= s.MemoryMiB && need.GPUs <= s.GPUs {
					fits = true
					break
				}
			}
			if !fits {
				l := st.cap.Largest
				return status.Errorf(codes.FailedPrecondition,
					"tasks[%d].resources: needs cpu %dm, memory %d MiB, %d GPU(s), more than any node of region %s has (the most any node has: cpu %dm, memory %d MiB, %d GPU(s), not necessarily on one node); it could never be placed",
					g, need.CPUMillis, need.MemoryMiB, need.GPUs, c.meta.Region, l.CPUMillis, l.MemoryMiB, l.GPUs)
			}
		}
	}
	class := priority.Of(spec.GetPriority())
	if bound := c.cfg.Backlog[class]; bound > 0 {
		pending := st.extraBy(class)
		if st.pending != nil {
			pending += st.pending[class]
		}
		if pending >= bound {
			s := status.Newf(codes.ResourceExhausted,
				"backlog: region %s has %d pending %s-class tasks, at its bound of %d; retry later or in another region",
				c.meta.Region, pending, class, bound)
			if d, err := s.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(2 * CapacityRefresh)}); err == nil {
				s = d
			}
			return s.Err()
		}
	}
	return nil
}

// admitted records a committed submission in the local backlog count until
// the next read sees it.
func (c *Coordinator) admitted(jobID string, spec *apiaryv1.JobSpec) {
	if !c.cfg.Backlog.any() {
		return
	}
	st := &c.capState
	st.mu.Lock()
	defer st.mu.Unlock()
	if _, seen := st.lastSeen[jobID]; seen {
		return
	}
	st.extra[jobID] = localJob{class: priority.Of(spec.GetPriority()), tasks: int64(jobspec.TaskCount(spec))}
}

// capacityLoop refreshes the summary every CapacityRefresh and publishes it
// on the WAN member, if any.
func (c *Coordinator) capacityLoop(ctx context.Context) {
	t := time.NewTicker(CapacityRefresh)
	defer t.Stop()
	for {
		c.refreshCapacity(ctx)
		c.publishWAN()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
