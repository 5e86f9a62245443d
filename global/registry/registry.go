// Package registry is the global router's live view of the regions: a serf
// WAN pool that every regional coordinator joins with tags (region,
// jurisdiction, labels, gRPC address, health, capacity summary, backlog,
// shards owned; see internal/federation), plus a gRPC health probe of every alive coordinator.
//
// A region is up while at least one of its coordinators is alive in the pool,
// does not report its etcd as unavailable, and answered the router's last
// health probe (probes run every ProbeEvery; a coordinator that has not
// answered for AnswerWithin is not counted). The registry keeps no durable
// state: a restarted router rebuilds it from the pool within a second or two.
//
// What coordinators share with the router (the tag schema, the tuned serf
// configuration, the region view built from members) is internal/federation;
// this package is the router's own: its WAN member, the health probes and the
// pooled connections to coordinators. It must not import regional/.
//
// Lifecycle: Open validates the configuration; Service is the registry as a
// dskit service (start: create the serf member; run: join the pool, retrying
// for as long as it runs, and probe; stop: leave and close connections),
// which `apiary global` runs in its ordered list of parts. New and Close do
// the same for callers without a list.
package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/grafana/dskit/services"
	"github.com/hashicorp/serf/serf"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"apiary.dev/apiary/internal/cliconn"
	"apiary.dev/apiary/internal/federation"
	"apiary.dev/apiary/internal/pki"
	"apiary.dev/apiary/internal/telemetry"
)

// Probe timings of coordinator API health checks (loopback/LAN values).
const (
	ProbeEvery   = 250 * time.Millisecond
	probeTimeout = 400 * time.Millisecond
	// AnswerWithin: a coordinator counts as answering if its last successful
	// probe is this recent.
	AnswerWithin = 900 * time.Millisecond
)

// Config configures the router's WAN member.
type Config struct {
	// Name is the router's unique member name in the pool.
	Name string
	// Bind and Advertise are host:port for serf (port 0 picks one).
	Bind      string
	Advertise string
	// Join lists pool members to join (coordinators or other routers);
	// retried every second until one answers.
	Join   []string
	Logger *slog.Logger
	// TLS, when set, is the router's certificate: its connections to
	// coordinators use mutual TLS and verify region.<region>.apiary of the
	// region the coordinator's WAN member says it belongs to (so a member
	// that claims a region cannot be served by another region's
	// coordinator), or the address's host when no member names the
	// address. Nil: plaintext (`apiary global --insecure-dev`).
	TLS *pki.Reloader
	// Gossip encrypts the router's WAN member (federation.Gossip: the key
	// and the file serf keeps the keyring in; the zero value is plain
	// text). Every member of the pool needs a key of its keyring.
	Gossip federation.Gossip
}

// Registry is the live region view.
type Registry struct {
	cfg  Config
	log  *slog.Logger
	sc   *serf.Config
	serf *serf.Serf // set by the service's start
	svc  *services.BasicService

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn // by API address
	last  map[string]time.Time        // last successful probe, by API address
}

// Open validates cfg and returns a registry whose member is not created
// yet: run Service (WANAddr, Serf and Regions are valid once it runs).
// Errors name the Config field.
func Open(cfg Config) (*Registry, error) {
	if cfg.Name == "" {
		return nil, errors.New("name: the router's member name must be set")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	sc, err := federation.NewSerfConfig(federation.MemberConfig{Name: cfg.Name, Bind: cfg.Bind, Advertise: cfg.Advertise,
		Tags: map[string]string{federation.TagRole: federation.RoleGlobal}, Logger: cfg.Logger, Gossip: cfg.Gossip})
	if err != nil {
		return nil, err
	}
	r := &Registry{cfg: cfg, log: cfg.Logger, sc: sc, conns: map[string]*grpc.ClientConn{}, last: map[string]time.Time{}}
	r.svc = services.NewBasicService(r.start, r.run, r.stop)
	return r, nil
}

// New opens the registry and starts its service: the member is created,
// joining and probing run until Close.
func New(cfg Config) (*Registry, error) {
	r, err := Open(cfg)
	if err != nil {
		return nil, err
	}
	if err := services.StartAndAwaitRunning(context.Background(), r.svc); err != nil {
		if fc := r.svc.FailureCase(); fc != nil {
			err = fc
		}
		return nil, err
	}
	return r, nil
}

// Service is the registry's lifecycle (see the package comment). It fails
// if the serf member shuts down on its own.
func (r *Registry) Service() services.Service { return r.svc }

func (r *Registry) start(context.Context) error {
	s, err := serf.Create(r.sc)
	if err != nil {
		return fmt.Errorf("wan-bind: start serf on %s: %w", r.cfg.Bind, err)
	}
	r.serf = s
	return nil
}

// run joins (retrying every second while it runs: ctx is the service's own
// context, never a start-up one) and probes until ctx ends.
func (r *Registry) run(ctx context.Context) error {
	lctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { federation.JoinLoop(lctx, r.serf, r.cfg.Join, r.log) })
	wg.Go(func() { r.probeLoop(lctx) })
	var err error
	select {
	case <-ctx.Done():
	case <-r.serf.ShutdownCh():
		err = fmt.Errorf("serf member %s shut down", r.cfg.Name)
	}
	cancel()
	wg.Wait()
	return err
}

func (r *Registry) stop(error) error {
	_ = r.serf.Leave()
	_ = r.serf.Shutdown()
	r.mu.Lock()
	defer r.mu.Unlock()
	for a, c := range r.conns {
		c.Close()
		delete(r.conns, a)
	}
	return nil
}

// WANAddr is the serf address others can join (host:port).
func (r *Registry) WANAddr() string {
	m := r.serf.LocalMember()
	return fmt.Sprintf("%s:%d", m.Addr, m.Port)
}

// GossipEncrypted says whether the WAN member has a keyring (Config.Gossip
// gave a key or an existing keyring file); valid after Open.
func (r *Registry) GossipEncrypted() bool { return r.sc.MemberlistConfig.Keyring != nil }

// Serf exposes the member (tests: RemoveFailedNode).
func (r *Registry) Serf() *serf.Serf { return r.serf }

// Close stops the service: leaves the pool and closes every connection.
func (r *Registry) Close() {
	_ = services.StopAndAwaitTerminated(context.Background(), r.svc)
}

// Conn returns a (cached) client connection to a coordinator's API.
func (r *Registry) Conn(addr string) (*grpc.ClientConn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.conns[addr]; ok {
		return c, nil
	}
	creds := grpc.WithTransportCredentials(insecure.NewCredentials())
	if r.cfg.TLS != nil {
		creds = pki.DialOption(r.cfg.TLS, r.serverNameOf(addr))
	}
	opts := []grpc.DialOption{creds,
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64 << 20)),
		// The router decides "nothing was sent" from connection state
		// (cliconn.NotConnected), not from error texts.
		cliconn.NotConnectedInterceptor()}
	// Forwarded SubmitJob/CancelJob carry the router's trace context.
	if h := telemetry.GRPCClientHandler(nil); h != nil {
		opts = append(opts, grpc.WithStatsHandler(h))
	}
	c, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, err
	}
	r.conns[addr] = c
	return c, nil
}

// serverNameOf is the name a coordinator's certificate must carry to be
// served at addr: region.<region>.apiary of the region the WAN member
// whose API address is addr belongs to, or "" (the address's host) when
// no member names addr.
func (r *Registry) serverNameOf(addr string) string {
	if r.serf == nil {
		return ""
	}
	for _, m := range r.serf.Members() {
		if t, ok := federation.DecodeCoordinatorTags(m.Tags); ok && t.APIAddr == addr {
			return pki.RegionServerName(t.Region)
		}
	}
	return ""
}

// MarkFailed forgets a coordinator's last good probe, so it does not count
// as answering until it answers again (the router saw a connection refused).
func (r *Registry) MarkFailed(addr string) {
	r.mu.Lock()
	delete(r.last, addr)
	r.mu.Unlock()
}

func (r *Registry) probeLoop(ctx context.Context) {
	t := time.NewTicker(ProbeEvery)
	defer t.Stop()
	for {
		r.probeOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (r *Registry) probeOnce(ctx context.Context) {
	alive := map[string]bool{}
	for _, m := range r.serf.Members() {
		if t, ok := federation.DecodeCoordinatorTags(m.Tags); ok && m.Status == serf.StatusAlive {
			alive[t.APIAddr] = true
		}
	}
	var wg sync.WaitGroup
	for addr := range alive {
		conn, err := r.Conn(addr)
		if err != nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(ctx, probeTimeout)
			defer cancel()
			resp, err := healthpb.NewHealthClient(conn).Check(pctx, &healthpb.HealthCheckRequest{})
			if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
				r.mu.Lock()
				r.last[addr] = time.Now()
				r.mu.Unlock()
			}
		}()
	}
	wg.Wait()
	// Drop connections of coordinators that left the pool.
	r.mu.Lock()
	for a, c := range r.conns {
		if !alive[a] {
			c.Close()
			delete(r.conns, a)
			delete(r.last, a)
		}
	}
	r.mu.Unlock()
}

// Regions returns the current view, sorted by name.
func (r *Registry) Regions() []federation.Region {
	now := time.Now()
	r.mu.Lock()
	last := make(map[string]time.Time, len(r.last))
	for k, v := range r.last {
		last[k] = v
	}
	r.mu.Unlock()
	return federation.BuildRegions(r.serf.Members(), func(apiAddr string) bool {
		return !last[apiAddr].IsZero() && now.Sub(last[apiAddr]) <= AnswerWithin
	})
}

// Region returns one region by name.
func (r *Registry) Region(name string) (federation.Region, bool) {
	for _, reg := range r.Regions() {
		if reg.Name == name {
			return reg, true
		}
	}
	return federation.Region{}, false
}
