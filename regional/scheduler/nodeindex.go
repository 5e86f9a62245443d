package scheduler

import (
	"sync"

	"apiary.dev/apiary/regional/store"
)

// NodeIndex is the region's nodes as the scheduling loop's watch cache
// (ownerCache) holds them, read concurrently by the coordinator's capacity
// summary (admission's "fits no node", the share guard, the WAN capacity
// tag): the summary costs a walk of memory, not a range read of every node
// key every second on every coordinator (Kubernetes' scheduler and
// apiserver serve such reads from their informers' caches the same way).
// Its revision (Revision, WaitFor) is the cache's, so a writer of a node
// key can wait until the index holds its write.
//
// Every coordinator's loop (API-only ones too) keeps one; a loop that
// reloads its cache resets it (Reset) and fills it again.
type NodeIndex struct {
	watermark
	mu    sync.RWMutex
	nodes map[string]store.NodeView
}

// NewNodeIndex returns an empty index at revision 0.
func NewNodeIndex() *NodeIndex {
	return &NodeIndex{nodes: map[string]store.NodeView{}, watermark: newWatermark()}
}

// Reset empties the index (a reloading cache fills it again) and sets its
// revision to 0.
func (x *NodeIndex) Reset() {
	x.mu.Lock()
	defer x.mu.Unlock()
	clear(x.nodes)
	x.reset()
}

// put replaces a node's view with a copy of v. The copy shares v's record,
// usage and health values, which NodeView.Apply replaces and never
// modifies; its Outputs (a map Apply modifies) are left out.
func (x *NodeIndex) put(id string, v store.NodeView) {
	v.Outputs = nil
	x.mu.Lock()
	defer x.mu.Unlock()
	x.nodes[id] = v
}

// Each calls fn with every node's view under the index's read lock (fn
// must not call the index nor keep v) and returns the revision they are
// current to (0: the index is not loaded; fn was not called).
func (x *NodeIndex) Each(fn func(id string, v *store.NodeView)) int64 {
	// Reset zeroes the revision under mu: read under it, a revision above
	// 0 means the load since the last Reset has finished.
	x.mu.RLock()
	defer x.mu.RUnlock()
	rev := x.Revision()
	if rev == 0 {
		return 0
	}
	for id, v := range x.nodes {
		fn(id, &v)
	}
	return rev
}

// Get returns a copy of one node's view (false: the index is not loaded
// or holds no such node). Its record, usage and health are shared and must
// not be modified.
func (x *NodeIndex) Get(id string) (store.NodeView, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if x.Revision() == 0 {
		return store.NodeView{}, false
	}
	v, ok := x.nodes[id]
	return v, ok
}

// Len is the number of nodes held.
func (x *NodeIndex) Len() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return len(x.nodes)
}
