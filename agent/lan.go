package agent

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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

	joined atomic.Bool // a join succeeded (joinLoop)
	// aloneAfter is checkAlone's patience (lanAloneAfter; tests shorten it).
	aloneAfter time.Duration

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
	l := &agentLAN{a: a, joinNew: make(chan struct{}, 1), aloneAfter: lanAloneAfter}
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

// run joins the pool (joinLoop over the latest lan_join, restarted when it
// changes) and republishes the tags when the epoch changes (at once) or
// the free capacity does (at most every lanFreeEvery), until ctx ends. It
// also watches that a member that joined stays in the pool (checkAlone). A
// member that shuts down on its own fails the part.
func (l *agentLAN) run(ctx context.Context) error {
	a := l.a
	var joined []string
	stopJoin := func() {}
	defer func() { stopJoin() }()
	last := l.serf.LocalMember().Tags
	var lastSet time.Time
	var alone aloneWatch
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
			go func() { l.joinLoop(jctx, join); close(done) }()
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
		l.checkAlone(&alone, joined)
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

// lanJoinRetry is how often joinLoop tries again a join that failed (as
// federation.JoinLoop does).
const lanJoinRetry = time.Second

// lanAloneAfter is how long a member that joined may see no other alive
// member, while the agent holds an epoch, before checkAlone says so: a
// little more than federation.RejoinEvery, so that one rejoin was tried.
const lanAloneAfter = federation.RejoinEvery + 2*time.Second

// joinLoop joins the pool through addrs (the coordinators' LAN members),
// trying every lanJoinRetry until one answers, then hands over to
// federation.JoinLoop, which rejoins addresses that left the pool, until
// ctx ends. A failed join is logged at ERROR with its likely cause
// (joinHint: most often a gossip key missing or not the pool's) when its
// error is new, then every remindEvery (repeatLog), not every try: an
// agent out of the pool still registers and runs tasks, but the region
// sees it die only when its lease lapses.
func (l *agentLAN) joinLoop(ctx context.Context, addrs []string) {
	if len(addrs) == 0 {
		return
	}
	log := l.a.log
	var failed repeatLog
	for ctx.Err() == nil {
		n, err := l.serf.Join(addrs, true)
		if n > 0 {
			l.joined.Store(true)
			if failed.logged() {
				log.Info("joined the region's LAN pool", "lan_join", addrs, "members", l.aliveOthers())
			}
			federation.JoinLoop(ctx, l.serf, addrs, nil)
			return
		}
		if ctx.Err() != nil {
			return
		}
		why := joinErrText(err)
		failed.log(log, slog.LevelError, why, "cannot join the region's LAN pool: "+l.joinHint(why)+
			"; until it joins, the region sees this node fail only when its lease lapses", "lan_join", addrs, "err", why)
		select {
		case <-ctx.Done():
		case <-time.After(lanJoinRetry):
		}
	}
}

// joinErrText is serf's Join error on one line: memberlist's multierror
// ("1 error occurred:\n\t* failed to join ADDR: WHY\n\n") as its items
// joined with "; ".
func joinErrText(err error) string {
	if err == nil {
		return "no member answered"
	}
	var items []string
	for _, line := range strings.Split(err.Error(), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasSuffix(line, "occurred:") {
			continue
		}
		items = append(items, strings.TrimPrefix(line, "* "))
	}
	return strings.Join(items, "; ")
}

// joinHint is what to do about a failed join whose error (one line) is
// why: memberlist's answers about encryption name the gossip key, any
// other failure is read as unreachable members.
func (l *agentLAN) joinHint(why string) string {
	const flag = "--gossip-key or $APIARY_GOSSIP_KEY"
	file := ""
	if f := l.a.cfg.GossipKeyringFile; f != "" {
		if _, err := os.Stat(f); err == nil {
			file = f
		}
	}
	switch {
	case strings.Contains(why, "encryption is not configured"):
		return "the region's LAN pool is encrypted and this agent has no gossip key: give it the region's key as " + flag
	case strings.Contains(why, "no installed keys could decrypt"):
		h := "the region's LAN pool is encrypted with a key this agent does not hold: give it the region's key as " + flag
		if file != "" {
			h += " (its keyring is kept in " + file + ", which is loaded instead of the flag: after changing the key, " +
				"remove the file, or install the key with `apiary keyring`)"
		}
		return h
	case strings.Contains(why, "remote state is not encrypted"):
		h := "this agent has a gossip key but the region's LAN pool is not encrypted: start it without " + flag
		if file != "" {
			h += " and without the keyring file " + file
		}
		return h + ", or give the region's coordinators the key"
	}
	return "no coordinator's LAN member answered (TCP and UDP to lan_join must reach them from this host; " +
		"if the region's pool is encrypted, this agent needs its key too: " + flag + ")"
}

// aloneWatch is checkAlone's state.
type aloneWatch struct {
	since time.Time // when the member was first seen alone (zero: it is not)
	said  bool      // the ERROR was logged for this episode
}

// checkAlone logs one ERROR when the member, after joining (joined: the
// lan_join it joined through), has seen no other alive member for
// lanAloneAfter while the coordinators answered its heartbeats (so they
// answer over gRPC but not over gossip: UDP blocked, or keys that changed),
// and one INFO when members are back. While no coordinator answers, the
// region is out of reach anyway, and nothing is said.
func (l *agentLAN) checkAlone(w *aloneWatch, joined []string) {
	if !l.joined.Load() || !l.a.inContact() {
		w.since = time.Time{}
		return
	}
	n := l.aliveOthers()
	switch {
	case n > 0:
		if w.said {
			l.a.log.Info("back in the region's LAN pool", "members", n)
		}
		*w = aloneWatch{}
	case w.since.IsZero():
		w.since = time.Now()
	case !w.said && time.Since(w.since) >= l.aloneAfter:
		w.said = true
		l.a.log.Error("the LAN member joined the region's pool but sees no other alive member: the coordinators answer over gRPC "+
			"but not over gossip (is UDP to lan_join blocked, or was the pool's gossip key changed without this agent?); "+
			"the region sees this node fail only when its lease lapses", "lan_join", joined, "alone_for", time.Since(w.since).Round(time.Second))
	}
}

// aliveOthers is the number of alive members of the pool other than this one.
func (l *agentLAN) aliveOthers() int {
	n := 0
	self := l.serf.LocalMember().Name
	for _, m := range l.serf.Members() {
		if m.Status == serf.StatusAlive && m.Name != self {
			n++
		}
	}
	return n
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
