package regional

import (
	"context"
	"encoding/json"
	"errors"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/placement"
	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/regional/taskstate"
)

// listScanTasks bounds the records (task records, and job records looked
// at) one ListJobs page reads from etcd when the job index lags
// (listJobsFromEtcd): past it the page ends early,
// with a next_page_token, so a filtered list over a large region is many
// bounded calls rather than one read of every record.
const listScanTasks = 20000

// listShardOps is how many shards' first reads go in one Txn (etcd's
// --max-txn-ops defaults to 128).
const listShardOps = 64

// etcdJobList is one ListJobs page to read from etcd: jobs with an id
// below before (all when ""), newest id first, whose namespace mayRead
// allows and whose state is state (any when UNSPECIFIED); at most limit
// of them, and at most scanTasks task records read for the page.
type etcdJobList struct {
	before    string
	limit     int
	state     apiaryv1.JobState
	mayRead   func(namespace string) bool
	policy    placement.Policy
	scanTasks int
}

// shardCursor walks one shard's job records in descending id order, a
// batch at a time: hi is the exclusive upper key of its next read.
type shardCursor struct {
	shard int
	hi    string
	batch int64
	buf   []*mvccpb.KeyValue
	done  bool
}

// listJobsFromEtcd answers ListJobs from etcd when the job index lags (a
// reloading cache, a stalled loop): the same page the index gives (newest
// id first, below q.before, state and namespace filters, counts from the
// job's task records), read at one revision. Its cost follows the page,
// not the region: each shard's job records are read in descending key
// order a batch at a time and merged by id (job keys are sharded, so no
// single range is in id order), and the tasks of a job are read only when
// the job is next in the merge. A page ends early, with a next_page_token
// (the last job id looked at), once q.scanTasks records were read,
// as AIP-158 allows (a page may hold fewer than limit jobs while more
// follow). Errors: UNAVAILABLE when etcd does not answer or the listing's
// revision was compacted meanwhile (retry).
func listJobsFromEtcd(ctx context.Context, cli *clientv3.Client, shardCount int, q etcdJobList) (*apiaryv1.ListJobsResponse, error) {
	fail := func(err error) error {
		if errors.Is(err, rpctypes.ErrCompacted) {
			return status.Error(codes.Unavailable, "list jobs: the listing's revision was compacted while it read; retry")
		}
		if s, ok := status.FromError(err); ok && s.Code() == codes.Canceled {
			return err
		}
		return status.Errorf(codes.Unavailable, "list jobs: %v", err)
	}
	first := int64(min(64, max(2, 2*q.limit/max(shardCount, 1)+1)))
	curs := make([]*shardCursor, shardCount)
	for sh := range curs {
		lo := store.PrefShardJobs(sh)
		hi := clientv3.GetPrefixRangeEnd(lo)
		if q.before != "" {
			hi = lo + q.before
		}
		curs[sh] = &shardCursor{shard: sh, hi: hi, batch: first}
	}
	var rev int64
	rangeOp := func(c *shardCursor) clientv3.Op {
		opts := []clientv3.OpOption{clientv3.WithRange(c.hi), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend),
			clientv3.WithLimit(c.batch)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		return clientv3.OpGet(store.PrefShardJobs(c.shard), opts...)
	}
	took := func(c *shardCursor, r *clientv3.GetResponse) {
		c.buf = r.Kvs
		if len(r.Kvs) > 0 {
			c.hi = string(r.Kvs[len(r.Kvs)-1].Key)
		}
		c.done = !r.More || len(r.Kvs) == 0
		c.batch = min(c.batch*2, 512)
	}
	// The first batch of every shard, listShardOps shards per Txn; the
	// first Txn fixes the revision the rest read at.
	for lo := 0; lo < len(curs); lo += listShardOps {
		part := curs[lo:min(lo+listShardOps, len(curs))]
		ops := make([]clientv3.Op, len(part))
		for i, c := range part {
			ops[i] = rangeOp(c)
		}
		cctx, cancel := store.EtcdCtx(ctx)
		resp, err := cli.Txn(cctx).Then(ops...).Commit()
		cancel()
		if err != nil {
			return nil, fail(err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for i, c := range part {
			took(c, (*clientv3.GetResponse)(resp.Responses[i].GetResponseRange()))
		}
	}
	// next refills c when its batch is used up; it reports whether c has a
	// job left.
	next := func(c *shardCursor) (bool, error) {
		if len(c.buf) > 0 {
			return true, nil
		}
		if c.done {
			return false, nil
		}
		cctx, cancel := store.EtcdCtx(ctx)
		r, err := cli.Get(cctx, store.PrefShardJobs(c.shard), clientv3.WithRange(c.hi),
			clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(c.batch), clientv3.WithRev(rev))
		cancel()
		if err != nil {
			return false, fail(err)
		}
		took(c, r)
		return len(c.buf) > 0, nil
	}
	idOf := func(c *shardCursor) string {
		return strings.TrimPrefix(string(c.buf[0].Key), store.PrefShardJobs(c.shard))
	}
	out := &apiaryv1.ListJobsResponse{}
	scanned, last := 0, ""
	for {
		// The shard whose next job has the highest id.
		var best *shardCursor
		for _, c := range curs {
			ok, err := next(c)
			if err != nil {
				return nil, err
			}
			if ok && (best == nil || idOf(c) > idOf(best)) {
				best = c
			}
		}
		if best == nil {
			return out, nil // every shard is read to its end
		}
		if len(out.Jobs) == q.limit {
			out.NextPageToken = out.Jobs[q.limit-1].GetId()
			return out, nil
		}
		if scanned >= q.scanTasks && last != "" {
			// The budget is spent: the next page starts below the last job
			// looked at (every job between it and best's was looked at).
			out.NextPageToken = last
			return out, nil
		}
		kv, id := best.buf[0], idOf(best)
		best.buf, last = best.buf[1:], id
		scanned++ // a job record looked at counts as a record read
		v := &jobView{}
		if json.Unmarshal(kv.Value, &v.rec) != nil || !q.mayRead(v.rec.Spec.GetNamespace()) {
			continue
		}
		cctx, cancel := store.EtcdCtx(ctx)
		tr, err := cli.Get(cctx, store.PrefJobTasks(best.shard, v.rec.ID), clientv3.WithPrefix(), clientv3.WithRev(rev))
		cancel()
		if err != nil {
			return nil, fail(err)
		}
		scanned += len(tr.Kvs)
		for _, tkv := range tr.Kvs {
			var t taskstate.Task
			if json.Unmarshal(tkv.Value, &t) == nil {
				v.tasks = append(v.tasks, t)
			}
		}
		if j := v.toProto(false, false, q.policy); q.state == apiaryv1.JobState_JOB_STATE_UNSPECIFIED || j.State == q.state {
			out.Jobs = append(out.Jobs, j)
		}
	}
}
