package regional

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"apiary.dev/apiary/shards"
)

// errFenced means a fenced write found a shard's owner key gone or replaced
// (its lease lapsed or was revoked, or the shard was handed back): this
// coordinator no longer owns the shard and must stop writing for it. Test for
// it with errors.Is; *fencedError names the shards.
var errFenced = errors.New("fenced: shard ownership lost")

// fence is the ownership a write for one shard depends on: the shard and the
// epoch (its owner key's CreateRevision) this coordinator claimed it at.
type fence struct {
	shard int
	epoch shards.Epoch
}

// fencedError is a fenced write's failure: the shards whose fence no longer
// holds. It wraps errFenced.
type fencedError struct{ shards []fence }

func (e *fencedError) Error() string {
	return fmt.Sprintf("shards %v: %v", e.shards, errFenced)
}

func (e *fencedError) Unwrap() error { return errFenced }

// committer is the owner loop's write path, the one seam between its
// decisions and etcd (as Nomad's Planner is for its schedulers): the loop
// builds compared writes, the committer applies them under the fences of
// the shards they write for. etcdCommitter is the real one; tests use an
// in-memory fake.
type committer interface {
	// fencedTxn commits ops only if every fence (a shard's owner key still
	// at its epoch) and every cmp holds. It returns a *fencedError naming
	// the shards whose fence failed when a fence is what failed, a response
	// with Succeeded false when another compare failed, and any other error
	// when the outcome is unknown.
	fencedTxn(ctx context.Context, fences []fence, cmps []clientv3.Cmp, ops []clientv3.Op) (*clientv3.TxnResponse, error)
	// read returns each key's current value (nil when it does not exist)
	// and the revision read at.
	read(ctx context.Context, keys []string) ([]*mvccpb.KeyValue, int64, error)
}

// etcdCommitter commits through the coordinator's etcd client under the
// shards' fences (layout names their owner keys).
type etcdCommitter struct {
	cli    *clientv3.Client
	layout shards.Layout
	// retry runs a Txn with a short deadline per attempt (txnRetry).
	retry func(ctx context.Context, build func(context.Context) (*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error)
}

// fencedTxn is the one path for every owner write: the ops commit only if
// each written shard's owner key still has the epoch this coordinator
// claimed it at (and the extra compares hold).
//
// A Txn whose outcome is unknown (timeout) is retried as is: its compares
// (the fences plus each touched key's revision) fail if it was applied.
func (e *etcdCommitter) fencedTxn(ctx context.Context, fences []fence, cmps []clientv3.Cmp, ops []clientv3.Op) (*clientv3.TxnResponse, error) {
	all := make([]clientv3.Cmp, 0, len(fences)+len(cmps))
	for _, f := range fences {
		all = append(all, e.layout.Fence(f.shard, f.epoch))
	}
	all = append(all, cmps...)
	resp, err := e.retry(ctx, func(actx context.Context) (*clientv3.TxnResponse, error) {
		return e.cli.Txn(actx).If(all...).Then(ops...).Commit()
	})
	if err != nil {
		return nil, err
	}
	if resp.Succeeded || len(fences) == 0 {
		return resp, nil
	}
	// Which compare failed? Read the owner keys.
	gets := make([]clientv3.Op, len(fences))
	for i, f := range fences {
		gets[i] = clientv3.OpGet(e.layout.OwnerKey(f.shard))
	}
	cctx, cancel := etcdCtx(ctx)
	defer cancel()
	chk, err := e.cli.Txn(cctx).Then(gets...).Commit()
	if err != nil {
		return nil, err
	}
	var lost []fence
	for i, r := range chk.Responses {
		kvs := r.GetResponseRange().Kvs
		if len(kvs) == 0 || kvs[0].CreateRevision != int64(fences[i].epoch) {
			lost = append(lost, fences[i])
		}
	}
	if len(lost) > 0 {
		return nil, &fencedError{shards: lost}
	}
	return resp, nil
}

func (e *etcdCommitter) read(ctx context.Context, keys []string) ([]*mvccpb.KeyValue, int64, error) {
	cctx, cancel := etcdCtx(ctx)
	defer cancel()
	ops := make([]clientv3.Op, 0, len(keys))
	for _, k := range keys {
		ops = append(ops, clientv3.OpGet(k))
	}
	resp, err := e.cli.Txn(cctx).Then(ops...).Commit()
	if err != nil {
		return nil, 0, err
	}
	out := make([]*mvccpb.KeyValue, len(keys))
	for i, r := range resp.Responses {
		if kvs := r.GetResponseRange().Kvs; len(kvs) > 0 {
			out[i] = kvs[0]
		}
	}
	return out, resp.Header.Revision, nil
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

// commit runs fencedTxn over chunks of writes (at most maxOpsPerFenced ops
// each, a write never split), each chunk fenced on the shards its writes
// are for. Inside a chunk each write is a nested Txn of its own compares
// and ops, so writes commit or fail one by one in one round trip: a plan
// that lost a node to another owner does not sink the other nodes' plans
// of the chunk. A write whose compares fail re-reads its keys into the
// cache and counts a conflict (per node for plans); a chunk whose fence
// fails drops the shards that were lost (dropShards) and none of its
// writes is made. Neither is retried here: the next round decides again.
// A write for a shard this loop no longer owns is left out.
func (s *scheduler) commit(ctx context.Context, ws []write) error {
	for len(ws) > 0 {
		var ops []clientv3.Op
		var fences []fence
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
		resp, err := s.d.commit.fencedTxn(ctx, fences, nil, ops)
		var fe *fencedError
		switch {
		case errors.As(err, &fe):
			s.dropShards(fe.shards, "fenced write")
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
				s.d.metrics.NodeConflicts.WithLabelValues(w.node).Inc()
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
func (s *scheduler) reread(ctx context.Context, keys []string) error {
	keys = slices.DeleteFunc(slices.Clone(keys), func(k string) bool {
		_, kind, ok := nodeKeyKind(k)
		return ok && kind == nodeUsageKey
	})
	if len(keys) == 0 {
		return nil
	}
	kvs, rev, err := s.d.commit.read(ctx, keys)
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
