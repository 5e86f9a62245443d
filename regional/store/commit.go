package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"apiary.dev/apiary/shards"
)

// ErrFenced means a fenced write found a shard's owner key gone or replaced
// (its lease lapsed or was revoked, or the shard was handed back): this
// coordinator no longer owns the shard and must stop writing for it. Test for
// it with errors.Is; *FencedError names the shards.
var ErrFenced = errors.New("fenced: shard ownership lost")

// Fence is the ownership a write for one shard depends on: the shard and the
// epoch (its owner key's CreateRevision) this coordinator claimed it at.
type Fence struct {
	Shard int
	Epoch shards.Epoch
}

// FencedError is a fenced write's failure: the shards whose fence no longer
// holds. It wraps ErrFenced.
type FencedError struct{ Shards []Fence }

func (e *FencedError) Error() string {
	return fmt.Sprintf("shards %v: %v", e.Shards, ErrFenced)
}

func (e *FencedError) Unwrap() error { return ErrFenced }

// EtcdCommitter commits through the coordinator's etcd client under the
// shards' fences (Layout names their owner keys). It is the real
// implementation of the scheduling loop's write path (scheduler.Committer).
type EtcdCommitter struct {
	Client *clientv3.Client
	Layout shards.Layout
	// Retry runs a Txn with a short deadline per attempt (the coordinator's
	// txnRetry).
	Retry func(ctx context.Context, build func(context.Context) (*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error)
}

// FencedTxn is the one path for every owner write: the ops commit only if
// each written shard's owner key still has the epoch this coordinator
// claimed it at (and the extra compares hold).
//
// A Txn whose outcome is unknown (timeout) is retried as is: its compares
// (the fences plus each touched key's revision) fail if it was applied.
func (e *EtcdCommitter) FencedTxn(ctx context.Context, fences []Fence, cmps []clientv3.Cmp, ops []clientv3.Op) (*clientv3.TxnResponse, error) {
	all := make([]clientv3.Cmp, 0, len(fences)+len(cmps))
	for _, f := range fences {
		all = append(all, e.Layout.Fence(f.Shard, f.Epoch))
	}
	all = append(all, cmps...)
	resp, err := e.Retry(ctx, func(actx context.Context) (*clientv3.TxnResponse, error) {
		return e.Client.Txn(actx).If(all...).Then(ops...).Commit()
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
		gets[i] = clientv3.OpGet(e.Layout.OwnerKey(f.Shard))
	}
	cctx, cancel := EtcdCtx(ctx)
	defer cancel()
	chk, err := e.Client.Txn(cctx).Then(gets...).Commit()
	if err != nil {
		return nil, err
	}
	var lost []Fence
	for i, r := range chk.Responses {
		kvs := r.GetResponseRange().Kvs
		if len(kvs) == 0 || kvs[0].CreateRevision != int64(fences[i].Epoch) {
			lost = append(lost, fences[i])
		}
	}
	if len(lost) > 0 {
		return nil, &FencedError{Shards: lost}
	}
	return resp, nil
}

// Read returns each key's current value (nil when it does not exist) and
// the revision read at, in one read Txn.
func (e *EtcdCommitter) Read(ctx context.Context, keys []string) ([]*mvccpb.KeyValue, int64, error) {
	cctx, cancel := EtcdCtx(ctx)
	defer cancel()
	ops := make([]clientv3.Op, 0, len(keys))
	for _, k := range keys {
		ops = append(ops, clientv3.OpGet(k))
	}
	resp, err := e.Client.Txn(cctx).Then(ops...).Commit()
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

// EtcdCtx bounds every etcd call of the coordinator (MEASURED.md trap 4):
// 5 s.
func EtcdCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, 5*time.Second)
}
