package failover

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"apiary.dev/apiary/internal/ids"
	"apiary.dev/apiary/internal/testutil/etcdtest"
	"apiary.dev/apiary/regional/store"
)

// TestPendingSubmissions: over a real etcd, a failover submission's pending
// record is deleted by its commit, which requires it unchanged; once
// abandoned (by the submitter, or by the leader after pendingGrace) the
// job can no longer commit; and a submission whose job did commit is never
// abandoned (its record is tidied away instead).
func TestPendingSubmissions(t *testing.T) {
	cli := etcdtest.Start(t)
	ctx := context.Background()
	now := time.Now()
	m := New(Config{Meta: store.MetaRecord{Region: "eu-west", ShardCount: 1}, Client: cli, Now: func() time.Time { return now },
		Retry: func(ctx context.Context, build func(context.Context) (*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error) {
			return build(ctx)
		}})
	job := func() *store.JobRecord {
		return &store.JobRecord{ID: ids.NewJobID("eu-west", time.Now()), Failover: &store.FailoverRecord{Standbys: []string{"eu-central", "eu-north"}}}
	}
	commit := func(rec *store.JobRecord, rev int64) bool {
		t.Helper()
		resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(store.KeyJob(0, rec.ID)), "=", 0), PendingGuard(rec.ID, rev)).
			Then(clientv3.OpPut(store.KeyJob(0, rec.ID), "{}"), PendingDelete(rec.ID)).Commit()
		if err != nil {
			t.Fatal(err)
		}
		return resp.Succeeded
	}
	pending := func(id string) *store.PendingRecord {
		t.Helper()
		resp, err := cli.Get(ctx, store.KeyFailoverPending(id))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 0 {
			return nil
		}
		var p store.PendingRecord
		if err := json.Unmarshal(resp.Kvs[0].Value, &p); err != nil {
			t.Fatal(err)
		}
		return &p
	}

	// Committed: the pending record goes with the commit.
	a := job()
	rev, err := m.Begin(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	if p := pending(a.ID); p == nil || len(p.Standbys) != 2 || p.Abandoned {
		t.Fatalf("pending record %+v; want the two standbys, not abandoned", p)
	}
	if _, err := m.Begin(ctx, a); err == nil {
		t.Error("a second Begin of the same job id succeeded")
	}
	if !commit(a, rev) || pending(a.ID) != nil {
		t.Fatal("the commit failed or left the pending record")
	}
	// Abandoned after the commit: refused, nothing changes.
	if ok, err := m.Abandon(ctx, a.ID, 0, rev, "test"); ok || err != nil {
		t.Errorf("abandon of a committed job: %v %v; want false", ok, err)
	}

	// Abandoned first: the commit is refused.
	b := job()
	rev, err = m.Begin(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := m.Abandon(ctx, b.ID, 0, rev, "its commit failed"); !ok || err != nil {
		t.Fatalf("abandon: %v %v; want true", ok, err)
	}
	if p := pending(b.ID); p == nil || !p.Abandoned || p.Reason != "its commit failed" || len(p.Standbys) != 2 {
		t.Errorf("pending record %+v; want abandoned, kept for both standbys (no region was reachable)", p)
	}
	if commit(b, rev) {
		t.Error("an abandoned submission committed")
	}

	// A pending record whose job exists (an ambiguous commit answered an
	// error): never abandoned, tidied away.
	c := job()
	rev, err = m.Begin(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, store.KeyJob(0, c.ID), "{}"); err != nil {
		t.Fatal(err)
	}
	if ok, err := m.Abandon(ctx, c.ID, 0, rev, "test"); ok || err != nil {
		t.Errorf("abandon of a job that exists: %v %v; want false", ok, err)
	}
	if pending(c.ID) != nil {
		t.Error("the pending record of a job that exists was kept")
	}

	// The leader's sweep: a submission pending past pendingGrace (its
	// coordinator died between its standby writes and its commit) is
	// abandoned; a younger one is left alone.
	old, young := job(), job()
	rev, err = m.Begin(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	now = now.Add(pendingGrace)
	if _, err := m.Begin(ctx, young); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Second)
	m.sweepPending(ctx)
	if p := pending(old.ID); p == nil || !p.Abandoned {
		t.Errorf("pending record past the grace %+v; want abandoned", p)
	}
	if p := pending(young.ID); p == nil || p.Abandoned {
		t.Errorf("pending record within the grace %+v; want left alone", p)
	}
	if commit(old, rev) {
		t.Error("a submission abandoned by the sweep committed")
	}
}
