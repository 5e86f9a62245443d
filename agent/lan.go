package agent

import (
	"context"
	"fmt"
	"maps"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/grafana/dskit/services"
	"github.com/hashicorp/serf/serf"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/federation"
	"apiary.dev/apiary/internal/lan"
	"apiary.dev/apiary/internal/lifecycle"
)

// LANOff as Config.LANAddr (--lan-addr off) runs no LAN member.
const LANOff = "off"

// lanFreeEvery bounds how often a change of free capacity alone republishes
// the tags (SetTags blocks until the update is broadcast, MEASURED.md trap
// 7); a change of epoch is published at once.
const lanFreeEvery = time.Second

// lanCheck is how often the tags are compared with the ledger.
const lanCheck = 250 * time.Millisecond

// agentLAN is the agent's member of its region's serf LAN pool (the "lan"
// part). It joins the addresses of the latest RegisterNodeResponse.lan_join,
// read by a unary client interceptor on the coordinator connections (no
// other part needs them), keeps its tags (internal/lan.AgentTags: node id,
// epoch, free capacity) current, and leaves the pool when the agent stops,
// so that a clean stop is a leave, never a failure. A crash is a failure:
// the coordinators end the epoch at once (regional/lan.go).
type agentLAN struct {
	a    *Agent
	serf *serf.Serf

	mu      sync.Mutex
	join    []string      // latest lan_join, sorted
	joinNew chan struct{} // 1-buffered: join changed
}

// lanParts is the "lan" part, or none with LANAddr off. It comes before
// "sessions": it must add its interceptor before the coordinator
// connections are made, and it leaves the pool only after the sessions have
// stopped (drained and deregistered), so the pool never sees a live agent go.
func (a *Agent) lanParts() []lifecycle.Part {
	if a.cfg.LANAddr == LANOff {
		return nil
	}
	l := &agentLAN{a: a, joinNew: make(chan struct{}, 1)}
	return []lifecycle.Part{lifecycle.New("lan", services.NewBasicService(l.start, l.run, l.stop))}
}

// start creates the member (bound, joined to nobody yet) and hooks the
// coordinator connections' dial options.
func (l *agentLAN) start(context.Context) error {
	a := l.a
	bind := a.cfg.LANAddr
	if bind == "" {
		bind = defaultLANAddr(a.cfg.CoordinatorAddrs)
	}
	tags, err := l.tags()
	if err != nil {
		return err
	}
	conf, err := lan.NewSerfConfig(lan.MemberConfig{Name: lan.MemberName(lan.RoleAgent, a.cfg.NodeID), Bind: bind,
		Tags: tags, Logger: a.log.With("component", "lan"),
		Gossip: federation.Gossip{Key: a.cfg.GossipKey, KeyringFile: a.cfg.GossipKeyringFile}})
	if err != nil {
		return err
	}
	if conf.MemberlistConfig.Keyring == nil && a.cfg.GossipWarnPlain {
		a.log.Warn("gossip is unencrypted: TLS is on but the LAN member runs without a key, so anyone who can reach the pool " +
			"can read this node's tags and report it failed; give every member of the region --gossip-key (README, \"Gossip encryption\")")
	}
	if l.serf, err = serf.Create(conf); err != nil {
		return fmt.Errorf("lan-addr: start serf on %s: %w", bind, err)
	}
	// The sessions part dials after this part started. newCoordinators
	// picks insecure transport only when there are no extra options, so it
	// is named here when this interceptor would be the only one.
	opts := slices.Clip(a.cfg.DialOptions)
	if len(opts) == 0 {
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	a.cfg.DialOptions = append(opts, grpc.WithChainUnaryInterceptor(l.observe))
	a.log.Info("LAN member started", "lan_addr", lan.Addr(l.serf.LocalMember()), "member", l.serf.LocalMember().Name)
	return nil
}

// observe records lan_join from every successful RegisterNode.
func (l *agentLAN) observe(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if r, ok := reply.(*apiaryv1.RegisterNodeResponse); ok && err == nil {
		join := slices.Sorted(slices.Values(r.GetLanJoin()))
		l.mu.Lock()
		changed := !slices.Equal(join, l.join)
		l.join = join
		l.mu.Unlock()
		if changed {
			select {
			case l.joinNew <- struct{}{}:
			default:
			}
		}
	}
	return err
}

// run joins the pool (federation.JoinLoop over the latest lan_join,
// restarted when it changes) and republishes the tags when the epoch
// changes (at once) or the free capacity does (at most every
// lanFreeEvery), until ctx ends. A member that shuts down on its own fails
// the part.
func (l *agentLAN) run(ctx context.Context) error {
	a := l.a
	var joined []string
	stopJoin := func() {}
	defer func() { stopJoin() }()
	last := l.serf.LocalMember().Tags
	var lastSet time.Time
	tick := time.NewTicker(lanCheck)
	defer tick.Stop()
	for {
		l.mu.Lock()
		join := l.join
		l.mu.Unlock()
		if !slices.Equal(join, joined) {
			stopJoin()
			jctx, cancel := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() { federation.JoinLoop(jctx, l.serf, join, nil); close(done) }()
			stopJoin = func() { cancel(); <-done }
			joined = join
			if len(join) == 0 {
				a.log.Info("the region runs no LAN pool; liveness is the lease alone")
			} else {
				a.log.Info("joining the region's LAN pool", "lan_join", join)
			}
		}
		a.mu.Lock()
		epochChanged := a.changed
		a.mu.Unlock()
		if tags, err := l.tags(); err == nil && !maps.Equal(tags, last) &&
			(tags[lan.TagEpoch] != last[lan.TagEpoch] || time.Since(lastSet) >= lanFreeEvery) {
			if err := l.serf.SetTags(tags); err != nil {
				a.log.Warn("LAN: set tags", "err", err)
			} else {
				last, lastSet = tags, time.Now()
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-l.serf.ShutdownCh():
			return fmt.Errorf("serf LAN member %s shut down", l.serf.LocalMember().Name)
		case <-epochChanged:
		case <-l.joinNew:
		case <-tick.C:
		}
	}
}

// stop leaves the pool: the coordinators see a leave, not a failure, and
// end nothing (the sessions part has already released the epoch).
func (l *agentLAN) stop(error) error {
	if err := l.serf.Leave(); err != nil {
		l.a.log.Warn("LAN: leave", "err", err)
	}
	return l.serf.Shutdown()
}

// tags are the agent's current tags: node id, epoch, free capacity.
func (l *agentLAN) tags() (map[string]string, error) {
	a := l.a
	used, n := a.Used()
	free := lan.Free{CPUMillis: a.cfg.Capacity.CPUMillis - used.CPUMillis, MemoryMiB: a.cfg.Capacity.MemoryMB - used.MemoryMB,
		GPUs: a.cfg.Capacity.GPUs - used.GPUs, Tasks: -1}
	if a.cfg.MaxTasks > 0 {
		free.Tasks = int32(a.cfg.MaxTasks - n)
	}
	return lan.AgentTags{NodeID: a.cfg.NodeID, Epoch: a.Epoch(), Free: free}.Encode()
}

// defaultLANAddr is the local address of the route to the first coordinator
// that resolves, port 0 (a UDP "dial" sends nothing; it only picks the
// source address), or 0.0.0.0:0 (memberlist then advertises a private
// address of the host).
func defaultLANAddr(coords []string) string {
	for _, c := range coords {
		conn, err := net.Dial("udp", c)
		if err != nil {
			continue
		}
		ua, ok := conn.LocalAddr().(*net.UDPAddr)
		conn.Close()
		if ok {
			return net.JoinHostPort(ua.IP.String(), "0")
		}
	}
	return "0.0.0.0:0"
}
