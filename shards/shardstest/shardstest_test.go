package shardstest_test

import (
	"context"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"apiary.dev/apiary/internal/testutil/etcdtest"
	"apiary.dev/apiary/shards"
	"apiary.dev/apiary/shards/shardstest"
)

// TestCheckerCatchesDoubleOwner: an owner key written over (what a claim
// that is not create-if-absent would do) is reported as two owners, and a
// Checker started FromRevision(1) sees the claims made before it started.
func TestCheckerCatchesDoubleOwner(t *testing.T) {
	cli := etcdtest.Start(t)
	ctx := context.Background()
	l := shards.Layout{Prefix: "/t/check", Count: 8}
	if _, err := cli.Put(ctx, l.OwnerKey(1), "a"); err != nil {
		t.Fatal(err)
	}
	chk := shardstest.WatchNoDoubleOwner(t, cli, l, shardstest.FromRevision(1))
	chk.CaughtUp(t, cli)
	if got := chk.Counts(); got["a"] != 1 || len(got) != 1 {
		t.Fatalf("counts %v, want a: 1 (the claim before the start)", got)
	}
	if err := chk.Stop(); err != nil {
		t.Fatalf("a clean history: %v", err)
	}

	chk = shardstest.WatchNoDoubleOwner(t, cli, l)
	if _, err := cli.Put(ctx, l.OwnerKey(1), "b"); err != nil { // over a's key
		t.Fatal(err)
	}
	if _, err := cli.Delete(ctx, l.OwnerKey(2)); err != nil { // no key: no event, nothing to report
		t.Fatal(err)
	}
	if _, err := cli.Txn(ctx).Then(clientv3.OpPut(l.OwnerKey(3), "c")).Commit(); err != nil {
		t.Fatal(err)
	}
	chk.CaughtUp(t, cli)
	err := chk.Stop()
	if err == nil {
		t.Fatal("an overwritten owner key was not reported")
	}
	for _, want := range []string{"2 violations", "shard 1's owner key overwritten", "shard 1 has two owners: a"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Stop: %v\nwant it to say %q", err, want)
		}
	}
	if err := chk.Stop(); err != nil {
		t.Errorf("a second Stop returned the same violations again: %v", err)
	}
}
