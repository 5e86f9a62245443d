// Package etcdtest starts a one-member embedded etcd on loopback for a
// test, the real thing (not a fake), for packages whose tests need etcd
// without a coordinator (shards, regional/aclstore). It is apart from
// internal/testutil so that tests which do not need etcd do not link its
// server.
package etcdtest

import (
	"net/url"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"apiary.dev/apiary/internal/testutil"
)

// Start runs a one-member etcd (plaintext, loopback ports from
// testutil.FreeAddr, data in a t.TempDir) until the test ends, and
// returns a client of it (closed at the end too). Make more clients from
// cli.Endpoints() for separate sessions and leases. The member's raft
// timings and quota are etcd's defaults; its logs are discarded.
func Start(t testing.TB) *clientv3.Client {
	t.Helper()
	free := func() url.URL {
		u, err := url.Parse("http://" + testutil.FreeAddr(t))
		if err != nil {
			t.Fatal(err)
		}
		return *u
	}
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = "m1", t.TempDir()
	cu, pu := free(), free()
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = "m1=" + pu.String()
	// MEASURED.md trap 1: the zero value logs every request as slow.
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
		t.Fatal("etcd not ready after 20 s")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{cu.String()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}
