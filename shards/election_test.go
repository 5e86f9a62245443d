package shards

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"apiary.dev/apiary/internal/testutil"
)

// freeURL returns http://127.0.0.1:<a free port>.
func freeURL(t *testing.T) url.URL {
	t.Helper()
	u, _ := url.Parse("http://" + testutil.FreeAddr(t))
	return *u
}

// startEtcd runs a one-member embedded etcd on loopback for the test.
func startEtcd(t *testing.T) *clientv3.Client {
	t.Helper()
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = "m1", t.TempDir()
	cu, pu := freeURL(t), freeURL(t)
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = "m1=" + pu.String()
	cfg.WarningUnaryRequestDuration = embed.DefaultWarningUnaryRequestDuration
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(20 * time.Second):
		t.Fatal("etcd not ready")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{cu.String()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

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
