package regional

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/ids"
	"apiary.dev/apiary/placement"
	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/regional/taskstate"
)

// listScanTasks bounds the records (task records, and job records looked
// at) one ListJobs page reads from etcd when the job index lags
// (listJobsFromEtcd): past it the page ends early, with a next_page_token,
// so a filtered list over a large region is many bounded calls rather than
// one read of every record.
const listScanTasks = 20000

// listShardOps is how many shards' ranges go in one Txn (etcd's
// --max-txn-ops defaults to 128).
const listShardOps = 64

// etcdJobList is one ListJobs page to read from etcd: jobs with an id
// below before (all when ""), newest id first, whose namespace mayRead
// allows and whose state is state (any when UNSPECIFIED); at most limit
// of them, and at most scanTasks records read for the page. region is the
// region's name (its job ids start with it).
type etcdJobList struct {
	region    string
	before    string
	limit     int
	state     apiaryv1.JobState
	mayRead   func(namespace string) bool
	policy    placement.Policy
	scanTasks int
}

// jobKV is a job record read in a window, with its id and shard.
type jobKV struct {
	id    string
	shard int
	kv    *mvccpb.KeyValue
}

// listJobsFromEtcd answers ListJobs from etcd when the job index lags (a
// reloading cache, a stalled loop): the same page the index gives (newest
// id first, below q.before, state and namespace filters, counts from the
// job's task records), read at one revision.
//
// Its cost follows the page, not the region. Job keys are sharded, so no
// range is in id order, and etcd ignores a range's limit when it sorts in
// descending order (it reads the whole range, then sorts and truncates).
// Job ids begin with their submission time (ids.NewJobID), so the page is
// read a window of ids at a time, newest first: [lo, before) across every
// shard, with lo found by index-only counts (doubling a span of time, then
// halving, below a millisecond too) so that the window holds about the
// records the page wants; each window is read in ascending order without
// a limit and merged by id. A job's tasks are read only when it is next.
//
// A page ends early, with a next_page_token, once q.scanTasks records
// were read, as AIP-158 allows (a page may hold fewer than limit jobs, or
// none, while more follow). That token is ids.Floor of the last job
// looked at's millisecond, after every job of that millisecond was looked
// at: not the id of a job the caller may not read. Errors: UNAVAILABLE
// when etcd does not answer or the listing's revision was compacted
// meanwhile (retry); the context's own error (CANCELED, DEADLINE_EXCEEDED)
// when it ends.
func listJobsFromEtcd(ctx context.Context, cli *clientv3.Client, shardCount int, q etcdJobList) (*apiaryv1.ListJobsResponse, error) {
	fail := func(err error) error {
		if ctx.Err() != nil {
			return status.FromContextError(ctx.Err()).Err()
		}
		if errors.Is(err, rpctypes.ErrCompacted) {
			return status.Error(codes.Unavailable, "list jobs: the listing's revision was compacted while it read; retry")
		}
		return status.Errorf(codes.Unavailable, "list jobs: %v", err)
	}
	var rev int64
	// each runs one range op per shard, listShardOps per Txn, at rev (the
	// first Txn fixes it).
	each := func(op func(sh int) clientv3.Op) ([]*etcdserverpb.ResponseOp, error) {
		var out []*etcdserverpb.ResponseOp
		for lo := 0; lo < shardCount; lo += listShardOps {
			var ops []clientv3.Op
			for sh := lo; sh < min(lo+listShardOps, shardCount); sh++ {
				ops = append(ops, op(sh))
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
			out = append(out, resp.Responses...)
		}
		return out, nil
	}
	// rangeOp is shard sh's job keys with an id in [lo, hi) ("" lo: from
	// the first; "" hi: to the last).
	rangeOp := func(sh int, lo, hi string, opts ...clientv3.OpOption) clientv3.Op {
		p := store.PrefShardJobs(sh)
		end := clientv3.GetPrefixRangeEnd(p)
		if hi != "" {
			end = p + hi
		}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		return clientv3.OpGet(p+lo, append(opts, clientv3.WithRange(end))...)
	}
	count := func(lo, hi string) (int64, error) {
		rs, err := each(func(sh int) clientv3.Op { return rangeOp(sh, lo, hi, clientv3.WithCountOnly()) })
		var n int64
		for _, r := range rs {
			n += r.GetResponseRange().GetCount()
		}
		return n, err
	}
	// window returns the lower bound of the next window below hi (whose
	// ids' times are below top, Unix ms): a string lo with want to 4x want
	// records in [lo, hi) where the ids allow, searched by growing a span
	// of time back from top 4-fold from 1 s, then by halving between the
	// last bound with too few and the first with enough, in milliseconds
	// and below one (ids.Between splits a millisecond by the ids' random
	// bits). "" when every record below hi is fewer than want.
	window := func(hi string, top, want int64) (string, error) {
		tooFew := hi // a bound whose window holds fewer than want
		for d := int64(1000); ; d *= 4 {
			lo := ids.Floor(q.region, top-d)
			if top-d <= 0 {
				lo = ids.Floor(q.region, 0)
			}
			n, err := count(lo, hi)
			if err != nil {
				return "", err
			}
			if n < want {
				if top-d <= 0 {
					return "", nil // the region's first id is reached
				}
				tooFew = lo
				continue
			}
			for n > 4*want {
				mid, ok := ids.Between(lo, tooFew)
				if !ok {
					break
				}
				m, err := count(mid, hi)
				if err != nil {
					return "", err
				}
				if m >= want {
					lo, n = mid, m
				} else {
					tooFew = mid
				}
			}
			return lo, nil
		}
	}

	out := &apiaryv1.ListJobsResponse{}
	scanned := 0
	// The windows start at the token's time when it is an id of this
	// region, else (no token, or one above every id of the region, as the
	// router passes on another region's) a minute ahead of now. A window
	// reaches up to hi whatever its span, so ids from the future, and ids
	// that sort above every id of the region (jobs under another region's
	// name), are read in the first window; those below every id of the
	// region, in the last (top 0: one window, no search).
	hi := q.before
	soon := time.Now().Add(time.Minute).UnixMilli()
	top := soon
	switch ms, ok := ids.TimeOf(hi); {
	case hi == "":
	case hi <= ids.Floor(q.region, 0):
		top = 0
	case ok && ids.RegionOf(hi) == q.region:
		top = min(ms+1, soon)
	}
	idAt := len(store.PrefShardJobs(0)) // every shard prefix has this length
	for {
		want := int64(min(max(64, 2*(q.limit-len(out.Jobs)+1)), 4096))
		lo := ""
		if top > 0 {
			var err error
			if lo, err = window(hi, top, want); err != nil {
				return nil, err
			}
		}
		rs, err := each(func(sh int) clientv3.Op { return rangeOp(sh, lo, hi) })
		if err != nil {
			return nil, err
		}
		var kvs []jobKV
		for sh, r := range rs {
			for _, kv := range r.GetResponseRange().GetKvs() {
				kvs = append(kvs, jobKV{id: string(kv.Key[idAt:]), shard: sh, kv: kv})
			}
		}
		slices.SortFunc(kvs, func(a, b jobKV) int { return strings.Compare(b.id, a.id) })
		for i := 0; i < len(kvs); i++ {
			if len(out.Jobs) == q.limit {
				out.NextPageToken = out.Jobs[q.limit-1].GetId()
				return out, nil
			}
			if scanned >= q.scanTasks && i > 0 {
				// The budget is spent: finish the last job's millisecond,
				// then hand on its floor (no job's id). An id of another
				// shape has no time: go on to the next that has one.
				if ms, ok := ids.TimeOf(kvs[i-1].id); ok {
					if floor := ids.Floor(ids.RegionOf(kvs[i-1].id), ms); kvs[i].id < floor {
						out.NextPageToken = floor
						return out, nil
					}
				}
			}
			j, err := readListedJob(ctx, cli, rev, kvs[i], q, &scanned, fail)
			if err != nil {
				return nil, err
			}
			if j != nil {
				out.Jobs = append(out.Jobs, j)
			}
		}
		if lo == "" {
			return out, nil // every shard is read to its first job
		}
		if len(out.Jobs) == q.limit {
			out.NextPageToken = out.Jobs[q.limit-1].GetId()
			return out, nil
		}
		if scanned >= q.scanTasks {
			out.NextPageToken = lo // a floor: every job above it was looked at
			return out, nil
		}
		// lo is an id of this region's shape (a floor, or a point inside a
		// millisecond): the next window ends there.
		hi = lo
		ms, _ := ids.TimeOf(lo)
		top = ms + 1
		if lo == ids.Floor(q.region, 0) {
			top = 0 // only keys below every id of the region are left
		}
	}
}

// readListedJob reads the tasks of one job record of a window (at rev) and
// renders it, or returns nil for a record the caller may not read, one
// that does not decode or whose id is not its key's, or one of another
// state than asked. Every record looked at and task read counts in
// scanned.
func readListedJob(ctx context.Context, cli *clientv3.Client, rev int64, jk jobKV, q etcdJobList, scanned *int,
	fail func(error) error) (*apiaryv1.Job, error) {
	*scanned++
	v := &jobView{}
	if json.Unmarshal(jk.kv.Value, &v.rec) != nil || v.rec.ID != jk.id || !q.mayRead(v.rec.Spec.GetNamespace()) {
		return nil, nil
	}
	cctx, cancel := store.EtcdCtx(ctx)
	tr, err := cli.Get(cctx, store.PrefJobTasks(jk.shard, jk.id), clientv3.WithPrefix(), clientv3.WithRev(rev))
	cancel()
	if err != nil {
		return nil, fail(err)
	}
	*scanned += len(tr.Kvs)
	for _, tkv := range tr.Kvs {
		var t taskstate.Task
		if json.Unmarshal(tkv.Value, &t) == nil {
			v.tasks = append(v.tasks, t)
		}
	}
	if j := v.toProto(false, false, q.policy); q.state == apiaryv1.JobState_JOB_STATE_UNSPECIFIED || j.State == q.state {
		return j, nil
	}
	return nil, nil
}
