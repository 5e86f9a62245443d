package scheduler

import (
	"context"
	"errors"
	"slices"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"apiary.dev/apiary/regional/store"
)

// Committer is the loop's write path, the one seam between its decisions
// and etcd (as Nomad's Planner is for its schedulers): the loop builds
// compared writes, the committer applies them under the fences of the
// shards they write for. store.EtcdCommitter is the real one; tests use an
// in-memory fake (fakecommit_test.go). The interface lives here, with its
// one user; the fence types it speaks are store's.
type Committer interface {
	// FencedTxn commits ops only if every fence (a shard's owner key still
	// at its epoch) and every cmp holds. It returns a *store.FencedError
	// naming the shards whose fence failed when a fence is what failed, a
	// response with Succeeded false when another compare failed, and any
	// other error when the outcome is unknown.
	FencedTxn(ctx context.Context, fences []store.Fence, cmps []clientv3.Cmp, ops []clientv3.Op) (*clientv3.TxnResponse, error)
	// Read returns each key's current value (nil when it does not exist)
	// and the revision read at.
	Read(ctx context.Context, keys []string) ([]*mvccpb.KeyValue, int64, error)
}

// write is one compared write of the owner loop.
type write struct {
	// node is the node a plan write places on ("" for other writes): its
	// conflicts are counted per node.
	node string
	// shards are the shards the write is for (each task's; a node usage
	// sync names the node's home shard): the chunk that carries it is
	// fenced on each.
	shards []int
	cmps   []clientv3.Cmp
	ops    []clientv3.Op
	// keys are re-read into the cache when a compare fails.
	keys []string
	// after runs when the chunk committed, with the commit revision.
	after func(rev int64)
}

// forShard adds s to the shards the write is fenced on.
func (w *write) forShard(s int) {
	if !slices.Contains(w.shards, s) {
		w.shards = append(w.shards, s)
	}
}

// commit runs FencedTxn over chunks of writes (at most maxOpsPerFenced ops
// each, a write never split), each chunk fenced on the shards its writes
// are for. Inside a chunk each write is a nested Txn of its own compares
// and ops, so writes commit or fail one by one in one round trip: a plan
// that lost a node to another owner does not sink the other nodes' plans
// of the chunk. A write whose compares fail re-reads its keys into the
// cache and counts a conflict (per node for plans); a chunk whose fence
// fails drops the shards that were lost (dropShards) and none of its
// writes is made. Neither is retried here: the next round decides again.
// A write for a shard this loop no longer owns is left out.
func (s *Loop) commit(ctx context.Context, ws []write) error {
	for len(ws) > 0 {
		var ops []clientv3.Op
		var fences []store.Fence
		var chunk []write
		n := 0
		for len(ws) > 0 && (len(chunk) == 0 || n+len(ws[0].ops) <= maxOpsPerFenced) {
			w := ws[0]
			ws = ws[1:]
			fs, ok := s.fences(w.shards)
			if !ok {
				continue // a shard of it was lost earlier in the round
			}
			for _, f := range fs {
				if !slices.Contains(fences, f) {
					fences = append(fences, f)
				}
			}
			ops = append(ops, clientv3.OpTxn(w.cmps, w.ops, nil))
			n += len(w.ops)
			chunk = append(chunk, w)
		}
		if len(chunk) == 0 {
			continue
		}
		resp, err := s.d.Commit.FencedTxn(ctx, fences, nil, ops)
		var fe *store.FencedError
		switch {
		case errors.As(err, &fe):
			s.dropShards(fe.Shards, "fenced write")
			continue
		case err != nil:
			return err
		}
		var keys []string
		for i, w := range chunk {
			if resp.Responses[i].GetResponseTxn().GetSucceeded() {
				if w.after != nil {
					w.after(resp.Header.Revision)
				}
				continue
			}
			s.conflicts++
			if w.node != "" {
				s.d.Metrics.NodeConflicts.WithLabelValues(w.node).Inc()
			}
			keys = append(keys, w.keys...)
		}
		if len(keys) > 0 {
			if err := s.reread(ctx, keys); err != nil {
				return err
			}
		}
	}
	return nil
}

// reread refreshes the cache for keys after a failed compare. Node usage
// keys are not re-read: a node's usage is derived from the tasks on it, and
// another owner's plan writes its tasks and the usage key at one revision.
// The cache's one watch delivers both at once; a usage key read ahead of
// the tasks would let the next plan compare a fresh usage revision against
// a usage that misses that owner's tasks, and over-commit the node.
func (s *Loop) reread(ctx context.Context, keys []string) error {
	keys = slices.DeleteFunc(slices.Clone(keys), func(k string) bool {
		_, kind, ok := store.NodeKeyKind(k)
		return ok && kind == store.NodeUsageKey
	})
	if len(keys) == 0 {
		return nil
	}
	kvs, rev, err := s.d.Commit.Read(ctx, keys)
	if err != nil {
		return err
	}
	for i, kv := range kvs {
		if kv == nil {
			s.cache.apply(&mvccpb.KeyValue{Key: []byte(keys[i]), ModRevision: rev}, true)
			continue
		}
		s.cache.apply(kv, false)
	}
	return nil
}
