package shards

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"apiary.dev/apiary/internal/testutil"
	"apiary.dev/apiary/internal/testutil/etcdtest"
)

func containsAll(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

func grant(t *testing.T, cli *clientv3.Client, ttl int64) clientv3.LeaseID {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l, err := cli.Grant(ctx, ttl)
	if err != nil {
		t.Fatal(err)
	}
	return l.ID
}

func TestLayoutKeys(t *testing.T) {
	l := Layout{Prefix: DefaultPrefix, Count: 256}
	if k := l.OwnerKey(7); k != "/apiary/shards/00007/owner" {
		t.Fatalf("OwnerKey(7) = %s", k)
	}
	for key, want := range map[string]int{"/apiary/shards/00007/owner": 7, "/apiary/shards/00255/owner": 255} {
		if s, ok := l.ShardOf(key); !ok || s != want {
			t.Fatalf("ShardOf(%s) = %d, %v", key, s, ok)
		}
	}
	for _, key := range []string{
		"/apiary/shards/owner/694d9a8e1c2f3b04", // today's election key
		"/apiary/shards/00256/owner",            // beyond the count
		"/apiary/shards/7/owner",                // not padded
		"/apiary/shards/00007/owner/x",
		"/apiary/shardsx/00007/owner",
	} {
		if s, ok := l.ShardOf(key); ok {
			t.Fatalf("ShardOf(%s) = %d, want not an owner key", key, s)
		}
	}
	for _, bad := range []struct {
		l    Layout
		want []string
	}{
		{Layout{Prefix: "/apiary/shards/", Count: 4}, []string{"shards prefix", "not end with"}},
		{Layout{Prefix: "apiary", Count: 4}, []string{"shards prefix", "start with /"}},
		{Layout{Prefix: "/p", Count: 0}, []string{"shard count", "1..65536"}},
	} {
		if err := bad.l.Validate(); err == nil || !containsAll(err.Error(), bad.want...) {
			t.Fatalf("Validate(%+v) = %v, want %v", bad.l, err, bad.want)
		}
	}
}

// TestClaimRelease: a claim creates the owner key only if absent, under the
// claimer's lease, with the key's CreateRevision as epoch; a second claimer
// is refused and told who owns it; a retried claim by the owner returns the
// same epoch; the fence holds only for the current epoch; release compares
// the epoch; a claim under a revoked lease says the lease is gone.
func TestClaimRelease(t *testing.T) {
	cli := startEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l := Layout{Prefix: "/t/shards", Count: 16}
	la, lb := grant(t, cli, 30), grant(t, cli, 30)
	a, err := NewClaimer(cli, l, "a", la)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := NewClaimer(cli, l, "b", lb)

	e1, err := a.Claim(ctx, 3)
	if err != nil || e1 <= 0 {
		t.Fatalf("claim: %d, %v", e1, err)
	}
	resp, _ := cli.Get(ctx, l.OwnerKey(3))
	if kv := resp.Kvs[0]; string(kv.Value) != "a" || clientv3.LeaseID(kv.Lease) != la || Epoch(kv.CreateRevision) != e1 {
		t.Fatalf("owner key %s=%s lease %x create %d, want a under %x at %d", kv.Key, kv.Value, kv.Lease, kv.CreateRevision, la, e1)
	}
	if again, err := a.Claim(ctx, 3); err != nil || again != e1 {
		t.Fatalf("retried claim: %d, %v; want %d", again, err, e1)
	}
	_, err = b.Claim(ctx, 3)
	var owned *OwnedError
	if !errors.Is(err, ErrOwned) || !errors.As(err, &owned) || owned.Member != "a" || owned.Epoch != e1 || owned.Lease != la {
		t.Fatalf("b's claim of a's shard: %v", err)
	}

	fenced := func(c *Claimer, e Epoch) bool {
		r, err := cli.Txn(ctx).If(c.Fence(3, e)).Then(clientv3.OpPut("/t/data", "x")).Commit()
		if err != nil {
			t.Fatal(err)
		}
		return r.Succeeded
	}
	if !fenced(a, e1) {
		t.Fatal("owner's fenced write refused")
	}
	if err := b.Release(ctx, 3, e1+1); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("release at a wrong epoch: %v", err)
	}
	if err := a.Release(ctx, 3, e1); err != nil {
		t.Fatal(err)
	}
	if fenced(a, e1) {
		t.Fatal("fenced write after release committed")
	}
	if err := a.Release(ctx, 3, e1); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("second release: %v", err)
	}
	e2, err := b.Claim(ctx, 3)
	if err != nil || e2 <= e1 {
		t.Fatalf("b's claim after release: %d, %v; want an epoch above %d", e2, err, e1)
	}
	if fenced(a, e1) || !fenced(b, e2) {
		t.Fatal("fence does not follow the epoch")
	}

	// A revoked lease drops its keys and refuses further claims.
	if _, err := cli.Revoke(ctx, lb); err != nil {
		t.Fatal(err)
	}
	if fenced(b, e2) {
		t.Fatal("fenced write after the lease was revoked committed")
	}
	if _, err := b.Claim(ctx, 4); !errors.Is(err, ErrLeaseGone) {
		t.Fatalf("claim under a revoked lease: %v", err)
	}

	// Bad input names the field and its rule, before any etcd call.
	for _, tc := range []struct {
		err  error
		want []string
	}{
		{func() error { _, err := a.Claim(ctx, 16); return err }(), []string{"shard", "0..15", "16"}},
		{func() error { _, err := a.Claim(ctx, -1); return err }(), []string{"shard", "0..15"}},
		{a.Release(ctx, 2, 0), []string{"epoch", "> 0"}},
		{func() error { _, err := NewClaimer(cli, l, "", la); return err }(), []string{"id", "non-empty"}},
		{func() error { _, err := NewClaimer(cli, l, "a/b", la); return err }(), []string{"id", "without /"}},
		{func() error { _, err := NewClaimer(cli, l, "a", clientv3.NoLease); return err }(), []string{"lease"}},
		{func() error { _, err := NewClaimer(nil, l, "a", la); return err }(), []string{"client"}},
	} {
		if tc.err == nil || !containsAll(tc.err.Error(), tc.want...) {
			t.Fatalf("error %v, want it to name %v", tc.err, tc.want)
		}
	}
}

// TestOwnersView: the view follows claims, releases and lease revocations,
// ignores other keys under the prefix (today's election keys), and after a
// compaction past its watch revision reloads and ends up right.
func TestOwnersView(t *testing.T) {
	cli := startEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l := Layout{Prefix: "/t/shards", Count: 8}
	lease := grant(t, cli, 30)
	c, _ := NewClaimer(cli, l, "m1", lease)
	if _, err := cli.Put(ctx, "/t/shards/owner/1234", "elected"); err != nil {
		t.Fatal(err)
	}
	e0, err := c.Claim(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	o, err := WatchOwners(ctx, cli, l)
	if err != nil {
		t.Fatal(err)
	}
	want := func(w map[int]Ownership) func() error {
		return func() error {
			snap := o.Snapshot()
			if fmt.Sprint(snap.Owners) != fmt.Sprint(w) {
				return fmt.Errorf("view at rev %d: %v, want %v", snap.Rev, snap.Owners, w)
			}
			return nil
		}
	}
	testutil.Eventually(t, 5*time.Second, "initial load", want(map[int]Ownership{0: {"m1", e0, lease}}))
	e5, _ := c.Claim(ctx, 5)
	_ = c.Release(ctx, 0, e0)
	testutil.Eventually(t, 5*time.Second, "claim and release seen", want(map[int]Ownership{5: {"m1", e5, lease}}))
	if _, err := cli.Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, "revocation seen", want(map[int]Ownership{}))

	// A view whose watch starts below the compacted revision reloads.
	stale := &Owners{cli: cli, layout: l, changed: make(chan struct{})}
	if err := stale.load(ctx); err != nil {
		t.Fatal(err)
	}
	lease2 := grant(t, cli, 30)
	c2, _ := NewClaimer(cli, l, "m2", lease2)
	e2, _ := c2.Claim(ctx, 2)
	e3, _ := c2.Claim(ctx, 3)
	_ = c2.Release(ctx, 3, e3)
	resp, err := cli.Get(ctx, "/t")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	go stale.run(ctx)
	o = stale
	testutil.Eventually(t, 5*time.Second, "reload after compaction", want(map[int]Ownership{2: {"m2", e2, lease2}}))
	if o.Reloads() == 0 {
		t.Fatal("no reload counted after the compaction")
	}
	e4, _ := c2.Claim(ctx, 4)
	testutil.Eventually(t, 5*time.Second, "watch resumed after the reload", want(map[int]Ownership{2: {"m2", e2, lease2}, 4: {"m2", e4, lease2}}))
}

// startEtcd starts an embedded etcd for a test (closed at cleanup).
func startEtcd(t *testing.T) *clientv3.Client { return etcdtest.Start(t) }

// TestClaimMany: one Txn claims the free shards of a batch, reports the
// ones another member holds, finds its own earlier claims again (a retry),
// and fails with ErrLeaseGone once the lease is revoked.
func TestClaimMany(t *testing.T) {
	cli := startEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l := Layout{Prefix: "/t/shards", Count: 16}
	grant := func() clientv3.LeaseID {
		g, err := cli.Grant(ctx, 30)
		if err != nil {
			t.Fatal(err)
		}
		return g.ID
	}
	la, lb := grant(), grant()
	a, _ := NewClaimer(cli, l, "a", la)
	b, _ := NewClaimer(cli, l, "b", lb)
	eb, err := b.Claim(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	got, owned, err := a.ClaimMany(ctx, []int{1, 2, 3, 4})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[1] == 0 || got[1] != got[2] || got[2] != got[4] {
		t.Fatalf("claimed %v, want shards 1, 2, 4 at one epoch", got)
	}
	var oe *OwnedError
	if !errors.As(owned[3], &oe) || oe.Member != "b" || oe.Epoch != eb {
		t.Fatalf("shard 3: %v, want owned by b at epoch %d", owned[3], eb)
	}
	again, _, err := a.ClaimMany(ctx, []int{1, 2})
	if err != nil || again[1] != got[1] || again[2] != got[2] {
		t.Fatalf("retried claim: %v, %v; want the epochs of the first claim %v", again, err, got)
	}
	if _, _, err := a.ClaimMany(ctx, make([]int, MaxClaimBatch+1)); err == nil {
		t.Fatal("a batch over MaxClaimBatch was accepted")
	}
	if _, err := cli.Revoke(ctx, la); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.ClaimMany(ctx, []int{5}); !errors.Is(err, ErrLeaseGone) {
		t.Fatalf("claim under a revoked lease: %v, want ErrLeaseGone", err)
	}
}

func TestSnapshotPerMember(t *testing.T) {
	s := Snapshot{Owners: map[int]Ownership{0: {Member: "a"}, 1: {Member: "b"}, 2: {Member: "a"}}}
	if got := s.PerMember(); len(got) != 2 || got["a"] != 2 || got["b"] != 1 {
		t.Fatalf("PerMember: %v, want a:2 b:1", got)
	}
}
