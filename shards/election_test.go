package shards

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"apiary.dev/apiary/internal/testutil/etcdtest"
)

// startEtcd runs a one-member embedded etcd on loopback for the test.
func startEtcd(t *testing.T) *clientv3.Client { return etcdtest.Start(t) }

// TestCampaignRefusesLostKey: a candidate whose lease is revoked while it
// waits behind the owner must not win when the owner resigns (etcd's
// Election.Campaign alone returns success with the deleted key); the next
// campaign wins with a new, higher epoch. A normal hand-over still works.
func TestCampaignRefusesLostKey(t *testing.T) {
	cli := startEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := NewElector(cli, "/test/owner", "a", 5)
	b := NewElector(cli, "/test/owner", "b", 5)

	ta, err := a.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		term *Term
		err  error
	}
	done := make(chan result, 1)
	go func() {
		tb, err := b.Campaign(ctx)
		done <- result{tb, err}
	}()
	// Wait until b's key is there, then revoke its lease (as if b had been
	// paused past its TTL), then let a resign.
	var bKey *clientv3.GetResponse
	for {
		bKey, err = cli.Get(ctx, "/test/owner/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
		if err != nil {
			t.Fatal(err)
		}
		if len(bKey.Kvs) == 2 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("b's key never appeared")
		case <-time.After(10 * time.Millisecond):
		}
	}
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(bKey.Kvs[1].Lease)); err != nil {
		t.Fatal(err)
	}
	if err := ta.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if !errors.Is(r.err, ErrLostWhileWaiting) {
		t.Fatalf("b's campaign after its key was revoked: term %+v, err %v; want ErrLostWhileWaiting", r.term, r.err)
	}
	tb, err := b.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if tb.Epoch <= ta.Epoch {
		t.Fatalf("new epoch %d not above the old %d", tb.Epoch, ta.Epoch)
	}
	o, err := CurrentOwner(ctx, cli, "/test/owner")
	if err != nil || o.Value != "b" || o.Epoch != tb.Epoch {
		t.Fatalf("current owner %+v (err %v), want b at epoch %d", o, err, tb.Epoch)
	}
	if err := tb.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}
