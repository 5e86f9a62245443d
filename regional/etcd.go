package regional

import (
	"context"
	"fmt"
	"net/url"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// EtcdConfig configures the embedded etcd member of a coordinator.
type EtcdConfig struct {
	// Name is the member name (defaults to the coordinator id).
	Name string
	// DataDir holds the member's WAL and snapshots.
	DataDir string
	// ClientURL and PeerURL are listened on and advertised, e.g.
	// http://127.0.0.1:2379 and http://127.0.0.1:2380.
	ClientURL string
	PeerURL   string
	// InitialCluster is "name=peerURL,..."; empty means a one-member cluster.
	InitialCluster string
	// ClusterState is "new" (default) or "existing".
	ClusterState string
	// ElectionMs and HeartbeatMs are raft timings (default 500 and 50: see
	// MEASURED.md; leader crash to next write is about 0.7 s).
	ElectionMs  uint
	HeartbeatMs uint
	// QuotaBytes is the backend quota (default 4 GiB).
	QuotaBytes int64
	// CompactionRetention keeps this much history (default "1h", periodic).
	CompactionRetention string
}

// startEtcd starts the embedded member and waits until it serves (or ctx
// ends). The caller closes it with e.Close() exactly once.
func startEtcd(ctx context.Context, c EtcdConfig) (*embed.Etcd, error) {
	cfg := embed.NewConfig()
	cfg.Name = c.Name
	cfg.Dir = c.DataDir
	cu, err := url.Parse(c.ClientURL)
	if err != nil {
		return nil, fmt.Errorf("etcd-client-url: %w", err)
	}
	pu, err := url.Parse(c.PeerURL)
	if err != nil {
		return nil, fmt.Errorf("etcd-peer-url: %w", err)
	}
	// MEASURED.md trap 2: set all four URL lists, the cluster and its token.
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = c.InitialCluster
	if cfg.InitialCluster == "" {
		cfg.InitialCluster = c.Name + "=" + c.PeerURL
	}
	cfg.InitialClusterToken = "apiary-" + tokenOf(cfg.InitialCluster)
	cfg.ClusterState = embed.ClusterStateFlagNew
	if c.ClusterState == "existing" {
		cfg.ClusterState = embed.ClusterStateFlagExisting
	}
	cfg.ElectionMs, cfg.TickMs = orDefault(c.ElectionMs, 500), orDefault(c.HeartbeatMs, 50)
	// MEASURED.md trap 1: the zero value logs every request as slow.
	cfg.WarningUnaryRequestDuration = embed.DefaultWarningUnaryRequestDuration
	cfg.QuotaBackendBytes = c.QuotaBytes
	if cfg.QuotaBackendBytes == 0 {
		cfg.QuotaBackendBytes = 4 << 30
	}
	cfg.AutoCompactionMode = "periodic"
	cfg.AutoCompactionRetention = c.CompactionRetention
	if cfg.AutoCompactionRetention == "" {
		cfg.AutoCompactionRetention = "1h"
	}
	// Plans, submissions and report batches are multi-key Txns.
	cfg.MaxTxnOps = 32768
	cfg.MaxRequestBytes = 16 << 20
	cfg.Logger = "zap"
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{"stderr"}
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start etcd member %s: %w", c.Name, err)
	}
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("etcd member %s: %w", c.Name, err)
	case <-ctx.Done():
		// Without a quorum a graceful Close can wait forever: stop hard,
		// and do not wait for the rest (the process is giving up anyway).
		e.Server.HardStop()
		go e.Close()
		return nil, fmt.Errorf("etcd member %s not ready (does a quorum of --initial-cluster run?): %w", c.Name, ctx.Err())
	}
}

func tokenOf(cluster string) string {
	h := uint32(2166136261)
	for i := 0; i < len(cluster); i++ {
		h = (h ^ uint32(cluster[i])) * 16777619
	}
	return fmt.Sprintf("%08x", h)
}

func orDefault(v, d uint) uint {
	if v == 0 {
		return d
	}
	return v
}
