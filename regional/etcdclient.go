package regional

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"apiary.dev/apiary/internal/pki"
	"apiary.dev/apiary/regional/store"
)

// A client-only coordinator (EtcdConfig.Endpoints, `apiary region
// --etcd-endpoints`) embeds no etcd member: it reaches the region's etcd,
// which the coordinators with embedded members form (the consensus tier:
// 1, 3 or 5), through a gRPC client. It runs every other part as a
// coordinator with a member does (API, member key, shard reconciler,
// scheduling loop), so the region's scheduling tier can grow without
// growing its raft group. Coordinator.Etcd is nil for it.

const (
	// EtcdClientDialTimeout bounds the client's first connection and its
	// authentication; the client itself keeps reconnecting after that.
	EtcdClientDialTimeout = 5 * time.Second
	// etcdClientKeepAlive is the client's gRPC keepalive ping interval and
	// timeout: a connection to a member that died without closing it (a
	// host gone, SIGSTOP) is dropped within about twice this, and calls go
	// to the other endpoints.
	etcdClientKeepAlive = 2 * time.Second
	// etcdClientProbe is how often the etcd part of a client-only
	// coordinator checks that the region's etcd answers.
	etcdClientProbe = time.Second
	// EtcdUnreachableWarn is how long a client-only coordinator's etcd
	// must not answer before the etcd part logs a warning (then again
	// every etcdUnreachableRepeat while it lasts).
	EtcdUnreachableWarn   = 5 * time.Second
	etcdUnreachableRepeat = time.Minute
	// etcdGRPCOverhead is what etcd's server allows above MaxRequestBytes
	// for a request's gRPC framing (embed's grpcOverheadBytes).
	etcdGRPCOverhead = 512 << 10
)

// checkClientOnly refuses, with Endpoints set, the settings of an
// embedded member (naming every flag given) and an endpoint that is not
// scheme://host[:port]. The scheme is checkSchemes'.
func (c EtcdConfig) checkClientOnly() error {
	var given []string
	if c.ClientURL != "" {
		given = append(given, "--etcd-client-url")
	}
	if c.PeerURL != "" {
		given = append(given, "--etcd-peer-url")
	}
	if c.InitialCluster != "" {
		given = append(given, "--initial-cluster")
	}
	if c.ClusterState != "" && c.ClusterState != "new" {
		given = append(given, "--initial-cluster-state")
	}
	if len(given) > 0 {
		return fmt.Errorf("%s: not with --etcd-endpoints: a coordinator with --etcd-endpoints embeds no etcd member "+
			"(it is a client of the members at %s), so it has no member URL or cluster of its own; give one or the other",
			strings.Join(given, ", "), strings.Join(c.Endpoints, ","))
	}
	for _, ep := range c.Endpoints {
		if strings.TrimSpace(ep) == "" {
			return errors.New("--etcd-endpoints: an empty URL in the list (give comma-separated client URLs of the members, e.g. http://10.0.0.1:2379,http://10.0.0.2:2379)")
		}
		u, err := url.Parse(ep)
		if err != nil || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
			return fmt.Errorf("--etcd-endpoints: %q must be scheme://host:port, a member's --etcd-client-url", ep)
		}
	}
	return nil
}

// etcdClientConfig is the client of a client-only coordinator: every
// endpoint (calls balanced over those that answer), gRPC keepalives, the
// same request size the embedded members accept, and with TLS mutual TLS
// as the coordinator's region certificate, verifying that each member
// serves a certificate of region.<region>.apiary (the name the members
// allow their clients, EtcdTLS.AllowedHostname) against the current CA
// bundle. The Reloader's configuration reads the certificate and bundle
// at each handshake, so a reload applies to the next connection.
func (c *Coordinator) etcdClientConfig() clientv3.Config {
	cfg := clientv3.Config{
		Endpoints:            c.cfg.Etcd.Endpoints,
		DialTimeout:          EtcdClientDialTimeout,
		DialKeepAliveTime:    etcdClientKeepAlive,
		DialKeepAliveTimeout: etcdClientKeepAlive,
		PermitWithoutStream:  true,
		MaxCallSendMsgSize:   etcdMaxRequestBytes + etcdGRPCOverhead,
		Logger:               etcdZap(c.log),
	}
	if c.cfg.TLS != nil {
		cfg.TLS = c.etcdClientTLS()
	}
	return cfg
}

// etcdClientTLS is the client TLS of a client-only coordinator (nil
// without Config.TLS).
func (c *Coordinator) etcdClientTLS() *tls.Config {
	if c.cfg.TLS == nil {
		return nil
	}
	return c.cfg.TLS.ClientTLSConfig(pki.RegionServerName(c.cfg.Region))
}

// startEtcdClient is the etcd part's start in client-only mode: the data
// dir (made if missing; refused if it holds a member's data), the client,
// and the region meta (initMeta: created if absent, checked otherwise).
// Until the meta is read it logs every etcdWaitReport what it finds at
// each endpoint. The client does not block on its dial, so the start waits
// as long as ctx (the 60 s start-up bound of `apiary region`), and the
// error then names the endpoints and what was wrong with each.
func (c *Coordinator) startEtcdClient(ctx context.Context) error {
	dir := c.cfg.Etcd.DataDir
	if fi, err := os.Stat(filepath.Join(dir, "member")); err == nil && fi.IsDir() {
		return fmt.Errorf("--data-dir %s holds an etcd member's data (member/), and --etcd-endpoints runs no member: "+
			"that member would stay in the region's cluster without running, which costs quorum; remove it from the cluster "+
			"(etcdctl member remove) and give a fresh --data-dir, or start the coordinator with its member again", dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("--data-dir: %w", err)
	}
	cli, err := clientv3.New(c.etcdClientConfig())
	if err != nil {
		return fmt.Errorf("--etcd-endpoints %s: %w", strings.Join(c.cfg.Etcd.Endpoints, ","), err)
	}
	c.cli, c.watchCli = cli, cli
	wctx, stopReport := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var problems endpointProblems
	wg.Go(func() { c.reportEndpointWait(wctx, &problems) })
	err = c.initMeta(ctx)
	stopReport()
	wg.Wait()
	if err != nil {
		c.closeEtcd()
		found := problems.get()
		if found == "" { // failed before the first report: look once now
			pctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			found = c.probeEndpoints(pctx)
			cancel()
		}
		return fmt.Errorf("--etcd-endpoints %s: %w (%s)", strings.Join(c.cfg.Etcd.Endpoints, ","), err, found)
	}
	c.log.Info("etcd: client only, no embedded member", "endpoints", strings.Join(c.cfg.Etcd.Endpoints, ","))
	return nil
}

// endpointProblems is the last report of reportEndpointWait.
type endpointProblems struct {
	mu sync.Mutex
	s  string
}

func (p *endpointProblems) set(s string) {
	p.mu.Lock()
	p.s = s
	p.mu.Unlock()
}

func (p *endpointProblems) get() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.s
}

// reportEndpointWait logs, every etcdWaitReport until ctx ends, that the
// region's etcd has not answered yet and what each endpoint looks like
// from here (probePeer: nothing listens, a certificate of another region,
// this coordinator's certificate refused), and keeps the last findings in
// p for the start's error.
func (c *Coordinator) reportEndpointWait(ctx context.Context, p *endpointProblems) {
	start := time.Now()
	t := time.NewTicker(etcdWaitReport)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		found := c.probeEndpoints(ctx)
		if ctx.Err() != nil {
			return
		}
		p.set(found)
		c.log.Warn("etcd not answering yet: waiting for the region's etcd at --etcd-endpoints",
			"waited", time.Since(start).Round(time.Second).String(), "endpoints", found)
	}
}

// probeEndpoints says what each endpoint looks like from here, in one
// line: "URL: ok" or "URL: <why not>" for each.
func (c *Coordinator) probeEndpoints(ctx context.Context) string {
	var out []string
	for _, ep := range c.cfg.Etcd.Endpoints {
		if err := probePeer(ctx, ep, c.etcdClientTLS(), pki.RegionServerName(c.cfg.Region)); err != nil {
			out = append(out, fmt.Sprintf("%s: %v", ep, err))
			continue
		}
		out = append(out, ep+": reachable (no quorum, or still starting?)")
	}
	return strings.Join(out, "; ")
}

// runEtcdClient is the etcd part's run in client-only mode. It never fails
// the process: when the region's etcd does not answer (every endpoint
// down, or no quorum), the coordinator's session lease lapses on the
// members after its TTL (Config.OwnerLeaseTTL), which drops its member
// key and every shard claim at one revision, so the coordinators that
// still reach etcd take its shards over; its own session ends on the
// client side after the same TTL and its scheduling loop's fenced writes
// fail meanwhile, so it writes nothing for the shards it lost. It keeps
// serving its API (calls that need etcd fail as UNAVAILABLE) and rejoins
// when etcd answers again, as a coordinator whose member lost its quorum
// does. A member's own death fails the process instead (runEtcdPart)
// because that coordinator's data dir and ports belong to the member.
//
// It checks etcd every etcdClientProbe with a linearizable read and logs
// a warning once it has not answered for EtcdUnreachableWarn (then every
// etcdUnreachableRepeat, with what each endpoint looks like), and when it
// answers again.
func (c *Coordinator) runEtcdClient(ctx context.Context) error {
	t := time.NewTicker(etcdClientProbe)
	defer t.Stop()
	var downSince, warned time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, etcdClientProbe)
		_, err := c.cli.Get(pctx, store.KeyMeta, clientv3.WithCountOnly())
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		now := time.Now()
		switch {
		case err == nil && !downSince.IsZero():
			if !warned.IsZero() {
				c.log.Info("etcd answers again through --etcd-endpoints", "unreachable_for", now.Sub(downSince).Round(100*time.Millisecond).String())
			}
			downSince, warned = time.Time{}, time.Time{}
		case err == nil:
		case downSince.IsZero():
			downSince = now
		case now.Sub(downSince) >= EtcdUnreachableWarn && (warned.IsZero() || now.Sub(warned) >= etcdUnreachableRepeat):
			warned = now
			c.log.Warn("etcd does not answer through --etcd-endpoints; this coordinator's session lease lapses and its shards move to "+
				"coordinators that reach etcd; it keeps running and rejoins when etcd answers",
				"unreachable_for", now.Sub(downSince).Round(time.Second).String(), "err", err, "endpoints", c.probeEndpoints(ctx))
		}
	}
}
