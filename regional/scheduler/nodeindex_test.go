package scheduler

import (
	"context"
	"testing"
	"time"

	"apiary.dev/apiary/regional/store"
)

// TestNodeIndexFollowsTheCache: the owner cache puts every node's view in
// the index as its keys change (record, liveness, usage), Each answers
// only once the cache has advanced to a revision, and Reset empties it and
// sets it back to "not loaded".
func TestNodeIndexFollowsTheCache(t *testing.T) {
	h := newOwnerHarness(t)
	idx := NewNodeIndex()
	h.s.cache.nodeIndex = idx
	h.addNode("n1", 4000, 4096)
	e2 := h.addNode("n2", 8000, 8192)
	h.load()
	if rev := idx.Each(func(string, *store.NodeView) { t.Fatal("Each called before the cache advanced") }); rev != 0 {
		t.Fatalf("Each before advance: revision %d, want 0", rev)
	}
	h.s.cache.advance(h.store.rev)
	views := map[string]store.NodeView{}
	rev := idx.Each(func(id string, v *store.NodeView) { views[id] = *v })
	if rev != h.store.rev || len(views) != 2 {
		t.Fatalf("Each: revision %d (want %d), %d nodes (want 2)", rev, h.store.rev, len(views))
	}
	if v := views["n2"]; !v.Ready() || v.Rec.Capacity.GetCpuMillis() != 8000 || v.Alive != e2 {
		t.Fatalf("n2's view %+v: want ready, 8000 m, epoch %d", v, e2)
	}

	// n2's lease ends (its alive key deleted), and the index says so after
	// the cache applied the event; a waiter for that revision wakes.
	waited := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		waited <- idx.WaitFor(ctx, h.store.rev+1)
	}()
	h.watchDelete(store.KeyNodeAlive("n2"))
	h.s.cache.advance(h.store.rev + 1) // the deletion's revision (the fake store does not count deletions)
	if err := <-waited; err != nil {
		t.Fatalf("WaitFor: %v", err)
	}
	ready := map[string]bool{}
	idx.Each(func(id string, v *store.NodeView) { ready[id] = v.Ready() })
	if ready["n2"] || !ready["n1"] {
		t.Fatalf("after n2's alive key went: ready %v; want n1 only", ready)
	}

	idx.Reset()
	if rev := idx.Each(func(string, *store.NodeView) { t.Fatal("Each called after Reset") }); rev != 0 || idx.Len() != 0 {
		t.Fatalf("after Reset: revision %d, %d nodes; want 0, 0", rev, idx.Len())
	}
}
