package scheduler

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"strings"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/shards"
)

// fakeStore is an in-memory committer for unit tests of the owner loop (as
// Nomad's scheduler Harness stands in for its Planner): a key-value map with
// etcd's revision rules (one revision per committed Txn; CreateRevision kept
// by a Put; Version counted) that evaluates the loop's compares and applies
// its puts, deletes (single key or range) and nested Txns.
type fakeStore struct {
	rev int64
	kvs map[string]*mvccpb.KeyValue
	// fenced makes every FencedTxn fail on its fences (all of them).
	fenced bool
	// fences is the fences of the last FencedTxn.
	fences []store.Fence
	// err, when set, is returned by the next FencedTxn (an unknown outcome).
	err error
	// txns counts FencedTxn calls; failed those whose compares failed.
	txns, failed int
}

var _ Committer = (*fakeStore)(nil)

func newFakeStore() *fakeStore { return &fakeStore{kvs: map[string]*mvccpb.KeyValue{}} }

// put writes key outside any owner write (another writer: an agent, a
// coordinator serving a report, a test) and returns the new revision.
func (f *fakeStore) put(key, value string) int64 {
	f.rev++
	f.putAt(key, value, f.rev)
	return f.rev
}

// del deletes key outside any owner write.
func (f *fakeStore) del(key string) {
	f.rev++
	delete(f.kvs, key)
}

func (f *fakeStore) putAt(key, value string, rev int64) {
	kv := &mvccpb.KeyValue{Key: []byte(key), Value: []byte(value), CreateRevision: rev, ModRevision: rev, Version: 1}
	if old := f.kvs[key]; old != nil {
		kv.CreateRevision, kv.Version = old.CreateRevision, old.Version+1
	}
	f.kvs[key] = kv
}

func (f *fakeStore) get(key string) *mvccpb.KeyValue { return f.kvs[key] }

// all returns every key-value, sorted by key (what a load would read).
func (f *fakeStore) all() []*mvccpb.KeyValue {
	out := make([]*mvccpb.KeyValue, 0, len(f.kvs))
	for _, kv := range f.kvs {
		out = append(out, kv)
	}
	sort.Slice(out, func(a, b int) bool { return bytes.Compare(out[a].Key, out[b].Key) < 0 })
	return out
}

func (f *fakeStore) FencedTxn(_ context.Context, fences []store.Fence, cmps []clientv3.Cmp, ops []clientv3.Op) (*clientv3.TxnResponse, error) {
	f.txns++
	f.fences = fences
	if err := f.err; err != nil {
		f.err = nil
		return nil, err
	}
	if f.fenced {
		return nil, &store.FencedError{Shards: fences}
	}
	if !f.holds(cmps) {
		f.failed++
		return &clientv3.TxnResponse{Header: &pb.ResponseHeader{Revision: f.rev}}, nil
	}
	f.rev++
	resps := f.apply(ops)
	return &clientv3.TxnResponse{Header: &pb.ResponseHeader{Revision: f.rev}, Succeeded: true, Responses: resps}, nil
}

func (f *fakeStore) Read(_ context.Context, keys []string) ([]*mvccpb.KeyValue, int64, error) {
	out := make([]*mvccpb.KeyValue, len(keys))
	for i, k := range keys {
		out[i] = f.kvs[k]
	}
	return out, f.rev, nil
}

func (f *fakeStore) holds(cmps []clientv3.Cmp) bool {
	for _, c := range cmps {
		if !f.compare(pb.Compare(c)) {
			return false
		}
	}
	return true
}

func (f *fakeStore) compare(c pb.Compare) bool {
	kv := f.kvs[string(c.Key)]
	if kv == nil {
		kv = &mvccpb.KeyValue{}
	}
	var r int
	switch c.Target {
	case pb.Compare_CREATE:
		r = cmpInt(kv.CreateRevision, c.GetCreateRevision())
	case pb.Compare_MOD:
		r = cmpInt(kv.ModRevision, c.GetModRevision())
	case pb.Compare_VERSION:
		r = cmpInt(kv.Version, c.GetVersion())
	case pb.Compare_VALUE:
		r = bytes.Compare(kv.Value, c.GetValue())
	default:
		panic(fmt.Sprintf("fakeStore: compare target %s", c.Target))
	}
	switch c.Result {
	case pb.Compare_EQUAL:
		return r == 0
	case pb.Compare_NOT_EQUAL:
		return r != 0
	case pb.Compare_GREATER:
		return r > 0
	case pb.Compare_LESS:
		return r < 0
	}
	panic(fmt.Sprintf("fakeStore: compare result %s", c.Result))
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// apply applies ops at the current revision and returns a response per op
// (a nested Txn's says whether its compares held; f.failed counts those
// that did not).
func (f *fakeStore) apply(ops []clientv3.Op) []*pb.ResponseOp {
	out := make([]*pb.ResponseOp, 0, len(ops))
	for _, op := range ops {
		key := string(op.KeyBytes())
		switch {
		case op.IsPut():
			f.putAt(key, string(op.ValueBytes()), f.rev)
			out = append(out, &pb.ResponseOp{Response: &pb.ResponseOp_ResponsePut{ResponsePut: &pb.PutResponse{}}})
		case op.IsDelete():
			out = append(out, &pb.ResponseOp{Response: &pb.ResponseOp_ResponseDeleteRange{ResponseDeleteRange: &pb.DeleteRangeResponse{}}})
			end := string(op.RangeBytes())
			if end == "" {
				delete(f.kvs, key)
				continue
			}
			for k := range f.kvs {
				if k >= key && k < end {
					delete(f.kvs, k)
				}
			}
		case op.IsTxn():
			cmps, thenOps, elseOps := op.Txn()
			ok := f.holds(cmps)
			if ok {
				f.apply(thenOps)
			} else {
				f.failed++
				f.apply(elseOps)
			}
			out = append(out, &pb.ResponseOp{Response: &pb.ResponseOp_ResponseTxn{ResponseTxn: &pb.TxnResponse{Succeeded: ok}}})
		default:
			panic("fakeStore: unsupported op on " + key)
		}
	}
	return out
}

// keys lists the stored keys under prefix.
func (f *fakeStore) keys(prefix string) []string {
	var out []string
	for k := range f.kvs {
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// ownedShardSet is a shard set that owns the given shards, as the
// reconciler would leave it after claiming them.
func ownedShardSet(owned map[int]shards.Epoch) *ShardSet {
	ss := NewShardSet()
	ss.Set(owned)
	return ss
}
