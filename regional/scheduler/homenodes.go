package scheduler

import (
	"slices"
	"time"

	"apiary.dev/apiary/placement"
	"apiary.dev/apiary/shards"
)

// Home nodes: how owners keep their plans off each other's nodes.
//
// Owners share the nodes, and two plans that touch one node conflict on its
// usage key; the loser re-reads and requeues (reject and requeue). In a
// backlog every owner sees each freed slot at about the same moment, so
// without a rule most freed slots would be planned by several owners at
// once (issue 12 measured 0.53 conflicts per committed plan Txn with 3
// owners at the drain workload). Omega (Schwarzkopf et al., EuroSys 2013)
// shows that such optimistic schedulers stay cheap while conflicts are
// rare, and Sparrow's late binding avoids them by letting the node pick its
// next task; here every owner applies the same deterministic preference
// instead, computed from the cache it already holds:
//
//   - a node's owner order is the rendezvous order of the current shard
//     owners for the node's home shard (shards.Rank), and its preferred
//     owner is the first in that order with a placeable pending task (not
//     waiting out a retry backoff, its job not cancelled);
//   - a round of owner A leaves a node whose preferred owner is another
//     coordinator P to P (placement.Node.Reserved for that round) unless
//     A's most urgent candidate is more urgent than P's most urgent pending
//     task (higher priority or, at equal priority, submitted more than
//     yieldAge earlier: an owner whose queue has waited that much longer
//     competes for the others' nodes again, so none starves behind another's
//     stream of jobs), or the node has had free room in A's view for
//     spillAfter (P leaves it free: its tasks do not fit there, or P is
//     stalled).
//
// Nothing depends on it for safety: a clash it does not prevent is still
// caught by the usage compare. Owners whose views differ for a moment (the
// owner keys or the pending tasks) can still meet on a node.
const (
	// yieldAge is how much longer than the preferred owner's oldest task
	// (same priority) another owner's oldest candidate must have waited
	// before that owner plans on the preferred owner's nodes again.
	yieldAge = 2 * time.Second
	// spillAfter is how long a node with free room is left to its
	// preferred owner before the others plan on it.
	spillAfter = 500 * time.Millisecond
)

// OwnerView is the region's shard owners as the coordinator watches them
// (*shards.Owners).
type OwnerView interface {
	Snapshot() shards.Snapshot
}

// urgency orders pending work as the candidate heap does (groupHeap):
// higher priority first, then the older job.
type urgency struct {
	prio     int32
	submitMs int64
}

// exceeds reports whether u is more urgent than v by more than slackMs of
// waiting at equal priority.
func (u urgency) exceeds(v urgency, slackMs int64) bool {
	if u.prio != v.prio {
		return u.prio > v.prio
	}
	return u.submitMs+slackMs < v.submitMs
}

// heads holds the most urgent placeable pending task per owner.
type heads map[string]urgency

func (h heads) note(owner string, u urgency) {
	if cur, ok := h[owner]; !ok || u.exceeds(cur, 0) {
		h[owner] = u
	}
}

// homeNodes keeps the owners view and per-node state the rule needs.
type homeNodes struct {
	view OwnerView
	snap shards.Snapshot
	have bool
	// members is the distinct owners of snap (sorted); rank caches their
	// rendezvous order per home shard.
	members []string
	rank    map[int][]string
	// freeSince is when this loop first saw each node with free room
	// (dropped when it is seen full).
	freeSince map[string]time.Time
}

func newHomeNodes(v OwnerView) *homeNodes {
	if v == nil {
		return nil
	}
	return &homeNodes{view: v, rank: map[int][]string{}, freeSince: map[string]time.Time{}}
}

// refresh takes a new owners snapshot when the view changed.
func (h *homeNodes) refresh() {
	if h.have {
		select {
		case <-h.snap.Changed:
		default:
			return
		}
	}
	h.snap, h.have = h.view.Snapshot(), true
	h.members = h.members[:0]
	for _, o := range h.snap.Owners {
		h.members = append(h.members, o.Member)
	}
	slices.Sort(h.members)
	h.members = slices.Compact(h.members)
	clear(h.rank)
}

// ownerOf is shard s's owner ("" if none).
func (h *homeNodes) ownerOf(s int) string {
	return h.snap.Owners[s].Member
}

// order is the owner order for home shard s of a region of count shards.
func (h *homeNodes) order(s, count int) []string {
	r, ok := h.rank[s]
	if !ok {
		r = shards.Rank(h.members, s, count)
		h.rank[s] = r
	}
	return r
}

// reserve marks Reserved the nodes this round leaves to their preferred
// owner (see the rule above) and returns them, so that the caller clears the
// flag after the round, and how long until the first of them spills (0:
// none will). me is this coordinator's id, mine its most urgent candidate,
// others the most urgent pending task of every other owner; skip holds
// nodes the round must not reserve (a due canary).
func (h *homeNodes) reserve(nodes []*placement.Node, skip []*placement.Node, me string, mine urgency, others heads,
	homeShard func(string) int, count int, now time.Time) (reserved []*placement.Node, wake time.Duration) {
	if len(others) == 0 || count <= 0 {
		clear(h.freeSince)
		return nil, 0
	}
	for _, pn := range nodes {
		if pn.Ineligible || pn.Quarantined || slices.Contains(skip, pn) {
			continue
		}
		if !hasRoom(pn) {
			delete(h.freeSince, pn.ID)
			continue
		}
		since, ok := h.freeSince[pn.ID]
		if !ok {
			since = now
			h.freeSince[pn.ID] = now
		}
		left := spillAfter - now.Sub(since)
		if left <= 0 {
			continue
		}
		pref, head := "", urgency{}
		for _, m := range h.order(homeShard(pn.ID), count) {
			if m == me {
				break // this owner comes first among those with work
			}
			if u, ok := others[m]; ok {
				pref, head = m, u
				break
			}
		}
		if pref == "" || mine.exceeds(head, yieldAge.Milliseconds()) {
			continue
		}
		pn.Reserved = true
		reserved = append(reserved, pn)
		if wake == 0 || left < wake {
			wake = left
		}
	}
	if len(h.freeSince) > 2*len(nodes) {
		// Nodes that left the snapshot.
		clear(h.freeSince)
	}
	return reserved, wake
}

// hasRoom reports whether pn can take another task of some size.
func hasRoom(pn *placement.Node) bool {
	if pn.MaxTasks > 0 && pn.RunningTasks >= pn.MaxTasks {
		return false
	}
	return pn.Capacity.CPUMillis > pn.Allocated.CPUMillis && pn.Capacity.MemoryMiB > pn.Allocated.MemoryMiB
}
