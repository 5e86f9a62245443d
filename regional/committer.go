package regional

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"apiary.dev/apiary/shards"
)

// errFenced means a fenced write found the owner key gone or replaced (or
// the owner's lease ended): this coordinator no longer owns the shards and
// must stop writing for them. Test for it with errors.Is.
var errFenced = errors.New("fenced: shard ownership lost")

// errLeaseEnded is the owner loop's end when its election lease ends.
var errLeaseEnded = fmt.Errorf("owner lease ended: %w", errFenced)

// committer is the owner loop's write path, the one seam between its
// decisions and etcd (as Nomad's Planner is for its schedulers): the loop
// builds compared writes, the committer applies them under the owner's
// fence. etcdCommitter is the real one; tests use an in-memory fake.
type committer interface {
	// fencedTxn commits ops only if the owner's fence (its term's epoch)
	// and cmps hold. It returns an error wrapping errFenced when the fence
	// is what failed, a response with Succeeded false when another compare
	// failed, and any other error when the outcome is unknown.
	fencedTxn(ctx context.Context, cmps []clientv3.Cmp, ops []clientv3.Op) (*clientv3.TxnResponse, error)
	// read returns each key's current value (nil when it does not exist)
	// and the revision read at.
	read(ctx context.Context, keys []string) ([]*mvccpb.KeyValue, int64, error)
}

// etcdCommitter commits through the coordinator's etcd client under a
// term's fence.
type etcdCommitter struct {
	cli  *clientv3.Client
	term *shards.Term
	// retry runs a Txn with a short deadline per attempt (txnRetry).
	retry func(ctx context.Context, build func(context.Context) (*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error)
}

// fencedTxn is the one path for every owner write: the ops commit only if
// the owner key still has this term's epoch (and the extra compares hold).
//
// A Txn whose outcome is unknown (timeout) is retried as is: its compares
// (the fence plus each touched key's revision) fail if it was applied.
func (e *etcdCommitter) fencedTxn(ctx context.Context, cmps []clientv3.Cmp, ops []clientv3.Op) (*clientv3.TxnResponse, error) {
	all := append([]clientv3.Cmp{e.term.Fence()}, cmps...)
	resp, err := e.retry(ctx, func(actx context.Context) (*clientv3.TxnResponse, error) {
		return e.cli.Txn(actx).If(all...).Then(ops...).Commit()
	})
	if err != nil {
		return nil, err
	}
	if resp.Succeeded {
		return resp, nil
	}
	cctx, cancel := etcdCtx(ctx)
	defer cancel()
	chk, err := e.cli.Txn(cctx).If(e.term.Fence()).Commit()
	if err != nil {
		return nil, err
	}
	if !chk.Succeeded {
		return nil, fmt.Errorf("epoch %d: %w", e.term.Epoch, errFenced)
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
	cmps []clientv3.Cmp
	ops  []clientv3.Op
	// keys are re-read into the cache when a compare fails.
	keys []string
	// after runs when the chunk committed, with the commit revision.
	after func(rev int64)
}

// commit runs fencedTxn over chunks of writes (at most maxOpsPerFenced ops
// each, a write never split). A chunk whose compares fail (other than the
// fence) re-reads its keys into the cache and counts a conflict; its writes
// are not retried here (the next round decides again).
func (s *scheduler) commit(ctx context.Context, ws []write) error {
	for len(ws) > 0 {
		var cmps []clientv3.Cmp
		var ops []clientv3.Op
		var keys []string
		n := 0
		for n < len(ws) && (n == 0 || len(ops)+len(ws[n].ops) <= maxOpsPerFenced) {
			cmps = append(cmps, ws[n].cmps...)
			ops = append(ops, ws[n].ops...)
			keys = append(keys, ws[n].keys...)
			n++
		}
		resp, err := s.d.commit.fencedTxn(ctx, cmps, ops)
		if err != nil {
			return err
		}
		if resp.Succeeded {
			for _, w := range ws[:n] {
				if w.after != nil {
					w.after(resp.Header.Revision)
				}
			}
		} else {
			s.conflicts++
			if err := s.reread(ctx, keys); err != nil {
				return err
			}
		}
		ws = ws[n:]
	}
	return nil
}

// reread refreshes the cache for keys after a failed compare.
func (s *scheduler) reread(ctx context.Context, keys []string) error {
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
