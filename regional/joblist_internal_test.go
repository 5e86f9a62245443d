package regional

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/ids"
	"apiary.dev/apiary/internal/testutil/etcdtest"
	"apiary.dev/apiary/placement"
	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/regional/taskstate"
	"apiary.dev/apiary/shards"
)

// TestListJobsFromEtcdPagesLikeTheIndex: the ListJobs fallback for a
// lagging job index (listJobsFromEtcd), walked page by page to the end,
// lists exactly the jobs a read of every record gives, newest id first,
// with the same counts and states, for every state filter, a namespace
// filter, page sizes from 1 up and scan budgets from one task record up
// (a spent budget ends a page early with a token, and the walk still
// misses nothing and repeats nothing). Real etcd, records written as the
// coordinator writes them.
func TestListJobsFromEtcdPagesLikeTheIndex(t *testing.T) {
	cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const shardCount = 8
	rng := rand.New(rand.NewPCG(7, 16))
	states := []apiaryv1.TaskState{apiaryv1.TaskState_TASK_STATE_PENDING, apiaryv1.TaskState_TASK_STATE_RUNNING,
		apiaryv1.TaskState_TASK_STATE_COMPLETE, apiaryv1.TaskState_TASK_STATE_FAILED}
	// Ids as the region makes them, over three hours, with bursts: ten jobs
	// in one millisecond, and runs of jobs a few ms apart.
	base := time.Now().Add(-3 * time.Hour)
	for i := range 70 {
		at := base.Add(time.Duration(rng.Int64N(int64(3 * time.Hour))))
		switch {
		case i < 10:
			at = base.Add(time.Hour)
		case i < 25:
			at = base.Add(2*time.Hour + time.Duration(i)*time.Millisecond)
		}
		id := ids.NewJobID("eu-west", at)
		sh := shards.Of(id, shardCount)
		ns := ""
		if i%3 == 0 {
			ns = "team-a"
		}
		n := 1 + rng.IntN(6)
		rec := store.JobRecord{ID: id, Region: "eu-west", Shard: sh, TaskCount: int32(n), CancelRequested: i%11 == 0,
			Spec: &apiaryv1.JobSpec{Name: "j", Namespace: ns, Tasks: []*apiaryv1.TaskGroup{{Name: "g", Command: "true", Count: int32(n)}}}}
		ops := []clientv3.Op{clientv3.OpPut(store.KeyJob(sh, id), store.MustJSON(rec))}
		// Most jobs' tasks share a state, so that every job state occurs.
		common := states[rng.IntN(len(states))]
		for x := range n {
			st := common
			if rng.IntN(4) == 0 {
				st = states[rng.IntN(len(states))]
			}
			ops = append(ops, clientv3.OpPut(store.KeyTask(sh, id, int32(x)), store.MustJSON(taskstate.Task{JobID: id, Index: int32(x), State: st, FinishedMs: int64(1000 + x)})))
		}
		if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	// A record of another prefix between jobs/ and tasks/ is not a job; a
	// record whose id is not its key's is left out.
	if _, err := cli.Put(ctx, store.PrefAntiAffinity+"x", "{}"); err != nil {
		t.Fatal(err)
	}
	odd := ids.NewJobID("eu-west", base.Add(time.Hour))
	if _, err := cli.Put(ctx, store.KeyJob(shards.Of(odd, shardCount), odd), `{"spec":{"name":"x"}}`); err != nil {
		t.Fatal(err)
	}

	// The oracle: every job and task record read at once.
	all, err := cli.Txn(ctx).Then(clientv3.OpGet(store.PrefJobs, clientv3.WithPrefix()),
		clientv3.OpGet(store.PrefTasks, clientv3.WithPrefix())).Commit()
	if err != nil {
		t.Fatal(err)
	}
	views := map[string]*jobView{}
	for _, kv := range all.Responses[0].GetResponseRange().Kvs {
		v := &jobView{}
		if err := json.Unmarshal(kv.Value, &v.rec); err != nil {
			t.Fatal(err)
		}
		if v.rec.ID != "" {
			views[v.rec.ID] = v
		}
	}
	for _, kv := range all.Responses[1].GetResponseRange().Kvs {
		_, jobID, _, _ := store.ParseTaskKey(string(kv.Key))
		var tk taskstate.Task
		if err := json.Unmarshal(kv.Value, &tk); err != nil {
			t.Fatal(err)
		}
		views[jobID].tasks = append(views[jobID].tasks, tk)
	}
	want := func(state apiaryv1.JobState, ns string) []*apiaryv1.Job {
		var out []*apiaryv1.Job
		for _, v := range views {
			j := v.toProto(false, false, placement.Policy(""))
			if (state == apiaryv1.JobState_JOB_STATE_UNSPECIFIED || j.State == state) && (ns == "" || v.rec.Spec.GetNamespace() == ns) {
				out = append(out, j)
			}
		}
		sort.Slice(out, func(a, b int) bool { return out[a].Id > out[b].Id })
		return out
	}
	seenStates := map[apiaryv1.JobState]bool{}
	for _, j := range want(apiaryv1.JobState_JOB_STATE_UNSPECIFIED, "") {
		seenStates[j.State] = true
	}
	if len(seenStates) < 4 {
		t.Fatalf("the jobs cover only %d job states: %v", len(seenStates), seenStates)
	}

	for _, ns := range []string{"", "team-a"} {
		for st := range apiaryv1.JobState_name {
			state := apiaryv1.JobState(st)
			exp := want(state, ns)
			for _, limit := range []int{1, 3, 7, 100} {
				for _, budget := range []int{1, 5, 20000} {
					if budget == 1 && (ns != "" || state != apiaryv1.JobState_JOB_STATE_UNSPECIFIED) {
						continue // a page per record: once is enough (the walks cost a window search per page)
					}
					name := fmt.Sprintf("ns=%q state=%s limit=%d budget=%d", ns, state, limit, budget)
					var got []*apiaryv1.Job
					token, pages := "", 0
					for {
						q := etcdJobList{region: "eu-west", before: token, limit: limit, state: state, policy: placement.Policy(""), scanTasks: budget,
							mayRead: func(jobNS string) bool { return ns == "" || jobNS == ns }}
						resp, err := listJobsFromEtcd(ctx, cli, shardCount, q)
						if err != nil {
							t.Fatalf("%s: page %d: %v", name, pages, err)
						}
						pages++
						if len(resp.GetJobs()) > limit {
							t.Fatalf("%s: page of %d jobs", name, len(resp.GetJobs()))
						}
						if budget == 20000 && resp.GetNextPageToken() != "" && len(resp.GetJobs()) != limit {
							t.Fatalf("%s: a page of %d jobs with a token and the budget unspent", name, len(resp.GetJobs()))
						}
						got = append(got, resp.GetJobs()...)
						if token = resp.GetNextPageToken(); token == "" {
							break
						}
						// A token is a job the caller was shown, or no job.
						if !ids.IsJobID(token) || (views[token] != nil && (len(resp.GetJobs()) == 0 || resp.GetJobs()[len(resp.GetJobs())-1].GetId() != token)) {
							t.Fatalf("%s: page %d: token %q is not the last job listed, nor a floor that names no job", name, pages, token)
						}
						if pages > 200 {
							t.Fatalf("%s: over 200 pages", name)
						}
					}
					if len(got) != len(exp) {
						t.Fatalf("%s: %d jobs listed in %d pages, want %d", name, len(got), pages, len(exp))
					}
					for i := range exp {
						if got[i].GetId() != exp[i].GetId() || got[i].GetState() != exp[i].GetState() ||
							got[i].GetCounts().String() != exp[i].GetCounts().String() || got[i].GetFinishTimeMs() != exp[i].GetFinishTimeMs() {
							t.Fatalf("%s: job %d is %s %s %v, want %s %s %v", name, i, got[i].GetId(), got[i].GetState(), got[i].GetCounts(),
								exp[i].GetId(), exp[i].GetState(), exp[i].GetCounts())
						}
					}
					// Unfiltered, a token means another job follows; filtered,
					// it means another job is to be looked at, so the last
					// page may be empty.
					full := max(1, (len(exp)+limit-1)/limit)
					if budget == 20000 && (pages < full || pages > full+1 ||
						(pages == full+1 && (state == apiaryv1.JobState_JOB_STATE_UNSPECIFIED && ns == "" || len(exp)%limit != 0))) {
						t.Fatalf("%s: %d pages for %d jobs", name, pages, len(exp))
					}
				}
			}
		}
	}
}

// BenchmarkListJobsFromEtcdPage: one limit-100 page of the fallback
// (listJobsFromEtcd) over regions of 1,000 and 20,000 single-task jobs
// submitted over a day, 16 shards, real etcd. The page's cost should not
// grow with the region (a descending range read with a limit reads the
// whole range: etcd sorts, then truncates).
//
//	go test ./regional -run '^$' -bench ListJobsFromEtcdPage
func BenchmarkListJobsFromEtcdPage(b *testing.B) {
	for _, n := range []int{1000, 20000} {
		b.Run(fmt.Sprintf("jobs=%d", n), func(b *testing.B) {
			cli := etcdtest.Start(b)
			ctx := context.Background()
			rng := rand.New(rand.NewPCG(1, uint64(n)))
			now := time.Now()
			var ops []clientv3.Op
			flush := func() {
				if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
					b.Fatal(err)
				}
				ops = ops[:0]
			}
			for range n {
				id := ids.NewJobID("eu-west", now.Add(-time.Duration(rng.Int64N(int64(24*time.Hour)))))
				sh := shards.Of(id, 16)
				rec := store.JobRecord{ID: id, Region: "eu-west", Shard: sh, TaskCount: 1,
					Spec: &apiaryv1.JobSpec{Name: "j", Tasks: []*apiaryv1.TaskGroup{{Name: "g", Command: "true", Count: 1}}}}
				ops = append(ops, clientv3.OpPut(store.KeyJob(sh, id), store.MustJSON(rec)),
					clientv3.OpPut(store.KeyTask(sh, id, 0), store.MustJSON(taskstate.Task{JobID: id, State: apiaryv1.TaskState_TASK_STATE_COMPLETE})))
				if len(ops) >= 100 {
					flush()
				}
			}
			if len(ops) > 0 {
				flush()
			}
			q := etcdJobList{region: "eu-west", limit: 100, mayRead: func(string) bool { return true }, scanTasks: listScanTasks}
			b.ResetTimer()
			for b.Loop() {
				resp, err := listJobsFromEtcd(ctx, cli, 16, q)
				if err != nil || len(resp.GetJobs()) != 100 {
					b.Fatalf("%d jobs, %v", len(resp.GetJobs()), err)
				}
			}
		})
	}
}

// TestListJobsFromEtcdOtherRegionsTokensAndDenseMilliseconds: a token of
// another region that sorts above every id of this one (the router passes
// one region's token to all) lists this region's newest jobs, as no token
// does; one that sorts below every id lists nothing; 600 jobs submitted in
// one millisecond page exactly, a page at a time, with small pages and
// budgets (the windows split the millisecond by the ids' random bits).
func TestListJobsFromEtcdOtherRegionsTokensAndDenseMilliseconds(t *testing.T) {
	cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const shardCount = 4
	now := time.Now()
	var all []string
	var ops []clientv3.Op
	put := func(id string) {
		sh := shards.Of(id, shardCount)
		rec := store.JobRecord{ID: id, Region: "eu-west", Shard: sh, TaskCount: 1,
			Spec: &apiaryv1.JobSpec{Name: "j", Tasks: []*apiaryv1.TaskGroup{{Name: "g", Command: "true", Count: 1}}}}
		ops = append(ops, clientv3.OpPut(store.KeyJob(sh, id), store.MustJSON(rec)),
			clientv3.OpPut(store.KeyTask(sh, id, 0), store.MustJSON(taskstate.Task{JobID: id, State: apiaryv1.TaskState_TASK_STATE_COMPLETE})))
		if len(ops) >= 100 {
			if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
				t.Fatal(err)
			}
			ops = ops[:0]
		}
		all = append(all, id)
	}
	dense := now.Add(-time.Hour)
	for range 600 {
		put(ids.NewJobID("eu-west", dense))
	}
	for i := range 40 {
		put(ids.NewJobID("eu-west", now.Add(-time.Duration(i)*time.Minute)))
	}
	if len(ops) > 0 {
		if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(all)
	slices.Reverse(all)
	walk := func(first string, limit, budget int) []string {
		var got []string
		token := first
		for pages := 0; ; pages++ {
			if pages > 2000 {
				t.Fatalf("token %q limit %d budget %d: no end after 2000 pages", first, limit, budget)
			}
			resp, err := listJobsFromEtcd(ctx, cli, shardCount, etcdJobList{region: "eu-west", before: token, limit: limit,
				mayRead: func(string) bool { return true }, scanTasks: budget})
			if err != nil {
				t.Fatal(err)
			}
			for _, j := range resp.GetJobs() {
				got = append(got, j.GetId())
			}
			if token = resp.GetNextPageToken(); token == "" {
				return got
			}
		}
	}
	for _, c := range []struct{ limit, budget int }{{100, 20000}, {10, 20000}, {7, 5}, {1000, 50}} {
		if got := walk("", c.limit, c.budget); !slices.Equal(got, all) {
			t.Fatalf("limit %d budget %d: %d jobs listed, want %d in order", c.limit, c.budget, len(got), len(all))
		}
	}
	above := ids.NewJobID("us-east", now) // "us-east-..." sorts above every "eu-west-..."
	if got := walk(above, 100, 20000); !slices.Equal(got, all) {
		t.Fatalf("a token of us-east: %d jobs listed, want all %d", len(got), len(all))
	}
	for _, below := range []string{ids.NewJobID("eu", now), ids.NewJobID("ap-south", now)} {
		if got := walk(below, 100, 20000); len(got) != 0 {
			t.Fatalf("a token below every eu-west id (%s): %d jobs listed", below, len(got))
		}
	}
	// Jobs under other regions' names (a region may come to hold them)
	// are listed too, above and below this region's ids.
	for _, id := range []string{ids.NewJobID("us-east", now), ids.NewJobID("eu", now.Add(-time.Minute)), ids.NewJobID("ap", now)} {
		put(id)
	}
	if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
		t.Fatal(err)
	}
	ops = ops[:0]
	slices.Sort(all)
	slices.Reverse(all)
	for _, c := range []struct{ limit, budget int }{{100, 20000}, {3, 2}} {
		if got := walk("", c.limit, c.budget); !slices.Equal(got, all) {
			t.Fatalf("with other regions' ids, limit %d budget %d: %d jobs listed, want %d in order", c.limit, c.budget, len(got), len(all))
		}
	}
}
