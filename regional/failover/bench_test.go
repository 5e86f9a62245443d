package failover

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/ids"
	"apiary.dev/apiary/internal/testutil/etcdtest"
	"apiary.dev/apiary/regional/store"
)

// BenchmarkStandbyReads measures, over a real embedded etcd, the reads the
// standby side repeats: the leader's scan of a down home's standby records
// (activateDue, every 250 ms while that home is down) and one MovedJobs
// answer (every 250 ms per coordinator of each other region), at n standby
// records and n moved records plus n/10 claims. Run:
//
//	go test ./regional/failover -run '^$' -bench StandbyReads -benchtime 50x
func BenchmarkStandbyReads(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		cli := etcdtest.Start(b)
		srv := benchRegion(b, cli, n)
		ctx := context.Background()
		b.Run(fmt.Sprintf("scan/records=%d", n), func(b *testing.B) {
			for b.Loop() {
				recs, err := srv.m.standbys(ctx, "eu-west")
				if err != nil || len(recs) != n {
					b.Fatalf("%d records, %v; want %d", len(recs), err, n)
				}
			}
		})
		b.Run(fmt.Sprintf("moved/records=%d", n), func(b *testing.B) {
			for b.Loop() {
				resp, err := srv.MovedJobs(ctx, &apiaryv1.MovedJobsRequest{HomeRegion: "eu-west"})
				if err != nil || len(resp.GetMoved()) != n {
					b.Fatalf("%d moved, %v; want %d", len(resp.GetMoved()), err, n)
				}
			}
		})
	}
}

// benchRegion is eu-central with n standby records of eu-west's jobs (a
// four-task spec each), n moved records and n/10 claims.
func benchRegion(b *testing.B, cli *clientv3.Client, n int) *Server {
	b.Helper()
	ctx := context.Background()
	m := New(Config{Meta: store.MetaRecord{Region: "eu-central", Jurisdiction: "eu", ShardCount: 16}, Client: cli})
	spec := &apiaryv1.JobSpec{Name: "bench", Jurisdiction: "eu", MaxAttempts: 3,
		Tasks: []*apiaryv1.TaskGroup{{Name: "t", Count: 4, Command: "/bin/sleep", Args: []string{"3"}}}}
	now := time.Now()
	var ops []clientv3.Op
	flush := func() {
		if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			b.Fatal(err)
		}
		ops = ops[:0]
	}
	for i := 0; i < n; i++ {
		sid := ids.NewJobID("eu-west", now.Add(time.Duration(i)*time.Microsecond))
		mid := ids.NewJobID("eu-west", now.Add(time.Duration(n+i)*time.Microsecond))
		ops = append(ops,
			clientv3.OpPut(store.KeyStandby(sid), store.MustJSON(store.StandbyRecord{ID: sid, Home: "eu-west", Spec: spec, AfterMs: 30000,
				Standbys: []string{"eu-central", "eu-north"}, StoredMs: now.UnixMilli(), Where: &store.WhereRecord{Jurisdictions: []string{"eu"}}})),
			clientv3.OpPut(store.KeyMoved(mid), store.MustJSON(store.MovedRecord{Home: "eu-west", Epoch: 1, MovedMs: now.UnixMilli()})))
		if i%10 == 0 {
			ops = append(ops, clientv3.OpPut(store.KeyClaimed(ids.NewJobID("eu-west", now.Add(time.Duration(2*n+i)*time.Microsecond))),
				store.MustJSON(store.ClaimRecord{By: "eu-north", AtMs: now.UnixMilli()})))
		}
		if len(ops) >= 90 {
			flush()
		}
	}
	if len(ops) > 0 {
		flush()
	}
	return m.Server()
}
