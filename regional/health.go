package regional

import (
	"encoding/json"
	"fmt"
	"sort"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/regional/nodehealth"
	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/regional/taskstate"
)

// Per-node failure attribution in the report path (the rules are package
// nodehealth's; docs/architecture.md, "Bad nodes"). Each report batch reads
// the health record of every reporting node and the region's set of
// automatically quarantined nodes in its read Txn; a failure is judged
// against the node's record before taskstate applies it (Blame); every
// ended attempt's outcome is added to the node's window and may quarantine
// it, release it (a canary's success) or push its next canary out (a
// canary's failure); the records are written in the batch's write Txn,
// compared on their ModRevision, so two coordinators committing reports of
// one node conflict and redo, and the share guard's count cannot be
// overtaken.

// autoQuarantineBy is Node.quarantined_by for an automatic quarantine.
const autoQuarantineBy = "apiary (automatic)"

// quarantineSet is /apiary/quarantine: the automatically quarantined nodes
// (id → since, Unix ms), kept with their health records in one Txn so that
// the share guard counts them exactly.
type quarantineSet struct {
	Nodes map[string]int64 `json:"nodes,omitempty"`
}

// healthState is what a report batch holds of node health.
type healthState struct {
	nodes  map[string]*nodeHealth // node id ->
	set    quarantineSet
	setRev int64 // ModRevision of the set (0: none yet)
	setMod bool
	events []healthEvent
	// reporting holds the batch's reporting nodes; region is the region's
	// sum, taken at the batch's first judgement (regionOf).
	reporting map[string]bool
	region    *regionHealth
}

// nodeHealth is one reporting node's record inside a batch.
type nodeHealth struct {
	rec     nodehealth.Record
	rev     int64 // its ModRevision (0: none yet)
	changed bool
}

// healthEvent is a quarantine decision, logged and counted once the batch
// committed.
type healthEvent struct {
	node   string
	event  nodehealth.Event
	reason string
	rec    nodehealth.Record
}

func newHealthState() *healthState { return &healthState{nodes: map[string]*nodeHealth{}} }

// healthReads are the read ops for a batch's nodes (besides their alive
// keys): each node's health record and the region's quarantine set.
func healthReads(nodes []string) []clientv3.Op {
	ops := []clientv3.Op{clientv3.OpGet(store.KeyQuarantineSet)}
	for _, id := range nodes {
		ops = append(ops, clientv3.OpGet(store.KeyNodeHealth(id)))
	}
	return ops
}

// fold takes a key from the batch's read Txn; it returns false for keys
// that are not health keys. A record that does not decode is an error: the
// batch fails rather than overwrite what it cannot read.
func (h *healthState) fold(key string, value []byte, modRev int64) (bool, error) {
	if key == store.KeyQuarantineSet {
		if err := json.Unmarshal(value, &h.set); err != nil {
			return true, fmt.Errorf("decode %s: %w", key, err)
		}
		h.setRev = modRev
		return true, nil
	}
	id, kind, ok := store.NodeKeyKind(key)
	if !ok || kind != store.NodeHealthKey {
		return false, nil
	}
	nh := h.node(id)
	if err := json.Unmarshal(value, &nh.rec); err != nil {
		return true, fmt.Errorf("decode %s: %w", key, err)
	}
	nh.rev = modRev
	return true, nil
}

func (h *healthState) node(id string) *nodeHealth {
	nh := h.nodes[id]
	if nh == nil {
		nh = &nodeHealth{}
		h.nodes[id] = nh
	}
	return nh
}

// regionHealth is the region's side of node health as one report batch
// sees it: the outcomes over the window summed over every node that is
// ready and not quarantined (a dead or quarantined node's failures would
// raise the bar for the others), from the coordinator's last read of the
// nodes and the records it committed since (noteHealth) and, for the nodes
// of the batch, their records as read with it. It starts from the
// coordinator's regionSum and is kept current as the batch's outcomes
// change its nodes' records (observe), so a batch costs a pass over its
// own nodes, not over the region's.
type regionHealth struct {
	total nodehealth.Stats
	// part is each of the batch's nodes' share of total.
	part map[string]nodehealth.Stats
	// live is the region's live node count; eligible counts the ready
	// nodes that take placements.
	live, eligible int
	// ready, takes and held are the capacity summary's sets as of the sum
	// (refreshCapacity replaces them, never writes into them).
	ready, takes, held map[string]bool
}

// counted reports whether node id's record rec is part of the region's
// sum: the node is ready, not held by an operator and not quarantined.
func (g *regionHealth) counted(id string, rec nodehealth.Record) bool {
	return g.ready[id] && !g.held[id] && rec.Quarantine == nil
}

// regionSum is the coordinator's regionHealth over every node (part holds
// each counted node's share), summed at most every regionSumMaxAge (the
// window's decay) or when the capacity refresh replaced the node sets, and
// kept current between by noteHealth. Guarded by capacityState.mu.
type regionSum struct {
	regionHealth
	atMs int64
}

// regionSumMaxAge bounds how old a regionSum may be (the capacity summary
// itself is refreshed once a second).
const regionSumMaxAge = time.Second

// regionSumLocked returns the coordinator's regionSum at nowMs, summing it
// anew when it is missing or older than regionSumMaxAge. st.mu is held.
func (c *Coordinator) regionSumLocked(nowMs int64) *regionSum {
	st := &c.capState
	if g := st.region; g != nil && nowMs-g.atMs < regionSumMaxAge.Milliseconds() && nowMs >= g.atMs {
		return g
	}
	g := &regionSum{atMs: nowMs, regionHealth: regionHealth{part: map[string]nodehealth.Stats{}, live: st.live,
		ready: st.ready, takes: st.eligible, held: st.held}}
	for n := range st.ready {
		if st.eligible[n] {
			g.eligible++
		}
		if r, ok := st.health[n]; ok && g.counted(n, r) {
			s := r.Totals(c.cfg.Quarantine, nowMs)
			g.total = addStats(g.total, s, 1)
			g.part[n] = s
		}
	}
	st.region = g
	return g
}

// regionOf returns batch h's regionHealth: the coordinator's regionSum with
// the batch's nodes' records as read with it in place of the sum's.
func (c *Coordinator) regionOf(h *healthState, nowMs int64) *regionHealth {
	if h.region != nil {
		return h.region
	}
	st := &c.capState
	st.mu.Lock()
	base := c.regionSumLocked(nowMs)
	g := base.regionHealth
	st.mu.Unlock()
	g.part = map[string]nodehealth.Stats{}
	for n := range h.reporting {
		g.part[n] = base.part[n]
	}
	for n, nh := range h.nodes {
		var s nodehealth.Stats
		if g.counted(n, nh.rec) {
			s = nh.rec.Totals(c.cfg.Quarantine, nowMs)
		}
		g.total = addStats(addStats(g.total, base.part[n], -1), s, 1)
		g.part[n] = s
	}
	h.region = &g
	return h.region
}

// renote keeps batch h's region sum current after node id's record changed
// to rec in the batch.
func (c *Coordinator) renote(h *healthState, id string, rec nodehealth.Record, nowMs int64) {
	g := h.region
	if g == nil {
		return // not summed yet: regionOf will read rec
	}
	var s nodehealth.Stats
	if g.counted(id, rec) {
		s = rec.Totals(c.cfg.Quarantine, nowMs)
	}
	g.total = addStats(addStats(g.total, g.part[id], -1), s, 1)
	g.part[id] = s
}

// addStats is a + sign×b over attempts and failures (all that Judge and
// Apply read of the rest of the region).
func addStats(a, b nodehealth.Stats, sign int) nodehealth.Stats {
	a.Attempts += sign * b.Attempts
	a.Failures += sign * b.Failures
	return a
}

// restOf is the rest of the region's outcomes for node id (regionHealth,
// without id's share), the region's live node count, and whether another
// node could take the task (ready and taking placements).
func (c *Coordinator) restOf(h *healthState, id string, nowMs int64) (rest nodehealth.Stats, live int, other bool) {
	g := c.regionOf(h, nowMs)
	if _, ok := g.part[id]; !ok {
		// Not one of the batch's reporting nodes (regionOf copied theirs).
		st := &c.capState
		st.mu.Lock()
		if st.region != nil {
			g.part[id] = st.region.part[id]
		}
		st.mu.Unlock()
	}
	self := 0
	if g.ready[id] && g.takes[id] {
		self = 1
	}
	return addStats(g.total, g.part[id], -1), g.live, g.eligible-self > 0
}

// guardAllows is the share guard for quarantining node id now: it counts
// the automatically quarantined nodes that still hold a place (ready and
// not held by an operator's quarantine, which wins and is never probed).
func (c *Coordinator) guardAllows(h *healthState, id string, live int) bool {
	st := &c.capState
	st.mu.Lock()
	n := 0
	for q := range h.set.Nodes {
		if q != id && st.ready[q] && !st.held[q] {
			n++
		}
	}
	st.mu.Unlock()
	return nodehealth.GuardAllows(c.cfg.Quarantine, n, max(live, n+1))
}

// noteHealth keeps the coordinator's view of the region's health records
// (capacityState.health, recomputed from the node index every refresh) current with the records
// it just committed, so that the next batch compares with them rather than
// with a read up to a second old.
func (c *Coordinator) noteHealth(h *healthState) {
	st := &c.capState
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.health == nil {
		st.health = map[string]nodehealth.Record{}
	}
	for id, nh := range h.nodes {
		if nh.changed {
			st.health[id] = nh.rec
			if g := st.region; g != nil {
				var s nodehealth.Stats
				if g.counted(id, nh.rec) {
					s = nh.rec.Totals(c.cfg.Quarantine, g.atMs)
				}
				g.total = addStats(addStats(g.total, g.part[id], -1), s, 1)
				g.part[id] = s
			}
		}
	}
}

// failureKind reports whether a report may end its attempt in a failure
// that the node could be blamed for.
func failureKind(r *apiaryv1.ReportTaskStatusRequest) bool {
	switch r.GetKind() {
	case apiaryv1.ReportKind_REPORT_KIND_EXITED:
		return r.GetExitCode() != 0
	case apiaryv1.ReportKind_REPORT_KIND_TIMED_OUT, apiaryv1.ReportKind_REPORT_KIND_START_FAILED:
		return true
	}
	return false
}

// healthView is what a report's node is judged against: the rest of the
// region (restOf), whether the share guard lets the node be quarantined,
// and whether another node takes placements. A report's failure is judged
// (blame) and then counted (observe) against the same view, computed once.
type healthView struct {
	rest  nodehealth.Stats
	guard bool
	other bool
}

// viewOf is node id's healthView in batch h at nowMs.
func (c *Coordinator) viewOf(h *healthState, id string, nowMs int64) healthView {
	rest, live, other := c.restOf(h, id, nowMs)
	return healthView{rest: rest, guard: c.guardAllows(h, id, live), other: other}
}

// blame is the region's verdict on the reporting node for a failure of a
// task of job, before it is applied: BlameNode when nodehealth.Judge finds
// it Faulty, else BlameUnproven (a failure that would be final is confirmed
// on a second node) when another node takes placements, else BlameNone.
// view is called only for a report that may be a failure.
func (c *Coordinator) blame(h *healthState, r *apiaryv1.ReportTaskStatusRequest, view func() healthView, nowMs int64) taskstate.Blame {
	if !failureKind(r) {
		return taskstate.BlameNone
	}
	id, v := r.GetNodeId(), view()
	if nodehealth.Judge(c.cfg.Quarantine, h.node(id).rec, r.GetJobId(), v.rest, v.guard, nowMs) == nodehealth.Faulty {
		return taskstate.BlameNode
	}
	if v.other && !c.cfg.Quarantine.Off {
		// A failure that would be final is confirmed on another node: a
		// host that just broke has no record against it yet, and its
		// earlier successes prove nothing now. Only another node that
		// takes placements can confirm.
		return taskstate.BlameUnproven
	}
	return taskstate.BlameNone
}

// observe counts the outcome of an attempt of job that ended on node id
// (assigned at assignedMs) and applies the quarantine rules against v.
func (c *Coordinator) observe(h *healthState, id, job string, failed bool, assignedMs int64, v healthView, nowMs int64) {
	nh := h.node(id)
	rec, ev, reason := nodehealth.Apply(c.cfg.Quarantine, nh.rec, nodehealth.Outcome{AtMs: nowMs, Job: job, Failed: failed},
		assignedMs, v.rest, v.guard, nowMs)
	nh.rec, nh.changed = rec, true
	c.renote(h, id, rec, nowMs)
	switch ev {
	case nodehealth.Quarantined:
		if h.set.Nodes == nil {
			h.set.Nodes = map[string]int64{}
		}
		h.set.Nodes[id], h.setMod = nowMs, true
	case nodehealth.Released:
		delete(h.set.Nodes, id)
		h.setMod = true
	}
	if ev != nodehealth.None {
		h.events = append(h.events, healthEvent{node: id, event: ev, reason: reason, rec: rec})
	}
}

// writes adds the batch's health records (and the set, when it changed) to
// its write Txn, each compared on the ModRevision it was read at.
func (h *healthState) writes(cmps []clientv3.Cmp, ops []clientv3.Op) ([]clientv3.Cmp, []clientv3.Op) {
	ids := make([]string, 0, len(h.nodes))
	for id, nh := range h.nodes {
		if nh.changed {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	for _, id := range ids {
		k := store.KeyNodeHealth(id)
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", h.nodes[id].rev))
		ops = append(ops, clientv3.OpPut(k, store.MustJSON(&h.nodes[id].rec)))
	}
	if h.setMod {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(store.KeyQuarantineSet), "=", h.setRev))
		ops = append(ops, clientv3.OpPut(store.KeyQuarantineSet, store.MustJSON(&h.set)))
	}
	return cmps, ops
}

// announce logs and counts the batch's quarantine decisions once they are
// committed.
func (c *Coordinator) announce(h *healthState) {
	for _, e := range h.events {
		name := "none"
		switch e.event {
		case nodehealth.Quarantined:
			name = "quarantined"
			c.log.Warn("node quarantined automatically", "node", e.node, "reason", e.reason, "strikes", e.rec.Strikes,
				"canary_in", probeIn(e.rec))
		case nodehealth.Refused:
			name = "refused"
			if c.refusedOnce(e.node) {
				c.log.Warn("node is an outlier but the quarantine share guard refused to quarantine it (logged once a minute per node)",
					"node", e.node, "reason", e.reason, "quarantined", len(h.set.Nodes), "max_share", c.cfg.Quarantine.MaxShare)
			}
		case nodehealth.Released:
			name = "released"
			c.log.Info("node released from automatic quarantine: its canary succeeded", "node", e.node, "strikes", e.rec.Strikes)
		case nodehealth.Requarantined:
			name = "requarantined"
			c.log.Warn("node stays quarantined: its canary failed", "node", e.node, "strikes", e.rec.Strikes, "next_canary_in", probeIn(e.rec))
		}
		c.metrics.QuarantineEvents.WithLabelValues(name).Inc()
	}
}

// refusedOnce reports whether a share-guard refusal of node id should be
// logged: once a minute per node (every failure there is refused again).
func (c *Coordinator) refusedOnce(id string) bool {
	r := &c.refusedLogged
	r.Lock()
	defer r.Unlock()
	if r.at == nil {
		r.at = map[string]time.Time{}
	}
	if t, ok := r.at[id]; ok && time.Since(t) < time.Minute {
		return false
	}
	r.at[id] = time.Now()
	return true
}

func probeIn(r nodehealth.Record) string {
	if r.Quarantine == nil {
		return ""
	}
	return time.Until(time.UnixMilli(r.Quarantine.ProbeAtMs)).Round(time.Second).String()
}
