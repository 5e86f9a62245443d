package regional

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/serf/serf"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"apiary.dev/apiary/internal/federation"
	"apiary.dev/apiary/internal/lan"
	"apiary.dev/apiary/internal/telemetry"
	"apiary.dev/apiary/regional/store"
)

// The region's serf LAN pool (Config.LANAddr; vocabulary in internal/lan).
// Every coordinator joins it, finding its peers through their member
// records (/apiary/members/<id>, which carry each one's LAN address), and
// hands the addresses to agents in RegisterNodeResponse.lan_join. Two
// decisions are taken from it:
//
//   - Fast reclaim. When serf declares an agent's member failed (a crash, a
//     pause or a partition: never a leave), the coordinator ends the node
//     epoch the member was tagged with, if and only if it is still the
//     node's current epoch: one Txn comparing the alive key's
//     CreateRevision with it deletes the alive key, then the lease is
//     revoked. To the shard owner this is a lease that ended early: its
//     reclaim requeues the epoch's tasks (package regional/scheduler).
//     Every coordinator acts on the event; the compare lets one of them
//     win. A wrong suspicion costs the agent a re-registration (its
//     attempts of that epoch are killed and run again elsewhere); fencing
//     keeps it from ever committing twice, so Apiary need not tell a crash
//     from a pause.
//   - Owner suspicion (suspicion.go): a shard owner whose LAN member failed
//     is deposed at once. This catches a paused owner, whose API port still
//     accepts connections.
//
// The lease stays the authority: with the pool down, or an agent that is
// in no pool, liveness is what it was (lease expiry).

// lanPeerRefresh is how often a coordinator re-reads its peers' member
// records for their LAN addresses and republishes the pool's member counts.
const lanPeerRefresh = 2 * time.Second

// Mass-failure guard: when more nodes' agents failed within
// massFailureWindow (and have no live member now) than nodes have a live
// agent member (and more than massFailureMin), this coordinator's view is
// not trusted (its own network may be at fault) and the leases decide. A
// node that failed and came back (a restart: a new member) does not count.
const (
	massFailureWindow = 10 * time.Second
	massFailureMin    = 2
)

// lanMember is the coordinator's LAN pool member.
type lanMember struct {
	mu      sync.Mutex
	serf    *serf.Serf
	addr    string   // this member's host:port
	peers   []string // the other coordinators' LAN addresses, sorted
	ctx     context.Context
	cancel  context.CancelFunc
	drained chan struct{}        // closed when the event loop has ended
	failed  map[string]time.Time // node id -> its agent's last failure seen (mass-failure guard)
	wg      sync.WaitGroup
	// keyring is the member's gossip keyring (nil: plain gossip), set at
	// start and kept after a stop: serf changes it in place on every
	// keyring operation. It seals secret_env values (secrets.go).
	keyring *memberlist.Keyring

	metricsOnce sync.Once
	metrics     *telemetry.LANMetrics
}

// lanMetrics registers the LAN metrics once (also used by suspicion.go
// without a LAN pool).
func (c *Coordinator) lanMetrics() *telemetry.LANMetrics {
	c.lan.metricsOnce.Do(func() { c.lan.metrics = telemetry.NewLANMetrics(c.cfg.Registry) })
	return c.lan.metrics
}

// startLAN creates the serf member (the start of the "lan" part; runLAN
// joins the peers). Its event loop runs until serf shuts down.
func (c *Coordinator) startLAN(context.Context) error {
	c.lanMetrics()
	tags, err := lan.CoordinatorTags{ID: c.cfg.ID}.Encode()
	if err != nil {
		return err
	}
	events := make(chan serf.Event, 256)
	sc, err := lan.NewSerfConfig(lan.MemberConfig{Name: lan.MemberName(lan.RoleCoordinator, c.cfg.ID),
		Bind: c.cfg.LANAddr, Tags: tags, Logger: c.log.With("component", "lan"), Gossip: c.gossip(poolLAN)})
	if err != nil {
		return err
	}
	c.warnPlainGossip(poolLAN, sc)
	sc.EventCh = events
	s, err := serf.Create(sc)
	if err != nil {
		return fmt.Errorf("lan-addr: start serf on %s: %w", c.cfg.LANAddr, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.lan.mu.Lock()
	c.lan.serf, c.lan.addr = s, lan.Addr(s.LocalMember())
	c.lan.keyring = sc.MemberlistConfig.Keyring
	c.lan.ctx, c.lan.cancel = ctx, cancel
	c.lan.drained = make(chan struct{})
	c.lan.mu.Unlock()
	go c.lanEvents(ctx, s, events)
	c.log.Info("LAN member started", "lan_addr", c.lan.addr, "member", s.LocalMember().Name)
	return nil
}

// runLAN keeps the member joined to every peer coordinator named in the
// member records (federation.JoinLoop, restarted when the set changes) and
// publishes the pool's member counts, until ctx ends. A serf member that
// shuts down on its own fails the part.
func (c *Coordinator) runLAN(ctx context.Context) error {
	s := c.lan.serf
	var joined []string
	stopJoin := func() {}
	defer func() { stopJoin() }()
	tick := time.NewTicker(lanPeerRefresh)
	defer tick.Stop()
	for {
		if peers, err := c.readLANPeers(ctx); err == nil && !slices.Equal(peers, joined) {
			stopJoin()
			jctx, cancel := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() { federation.JoinLoop(jctx, s, peers, nil); close(done) }()
			stopJoin = func() { cancel(); <-done }
			joined = peers
			c.lan.mu.Lock()
			c.lan.peers = peers
			c.lan.mu.Unlock()
			c.log.Info("LAN peers", "peers", peers)
		}
		c.metrics.SerfMembers.DeletePartialMatch(prometheus.Labels{"pool": "lan"})
		for state, n := range federation.MemberCounts(s) {
			c.metrics.SerfMembers.WithLabelValues("lan", state).Set(float64(n))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-s.ShutdownCh():
			return fmt.Errorf("serf LAN member %s shut down", s.LocalMember().Name)
		case <-tick.C:
		}
	}
}

// readLANPeers returns the LAN addresses in the other coordinators' member
// records, sorted.
func (c *Coordinator) readLANPeers(ctx context.Context) ([]string, error) {
	gctx, cancel := store.EtcdCtx(ctx)
	defer cancel()
	resp, err := c.cli.Get(gctx, store.PrefMembers, clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	peers := []string{}
	for _, kv := range resp.Kvs {
		var m store.MemberRecord
		if json.Unmarshal(kv.Value, &m) == nil && m.ID != c.cfg.ID && m.LANAddr != "" {
			peers = append(peers, m.LANAddr)
		}
	}
	slices.Sort(peers)
	return peers, nil
}

// stopLANPart leaves the pool (graceful stop) or just shuts serf down
// (Kill: the others see the member fail), after the fast reclaims in
// flight have ended.
func (c *Coordinator) stopLANPart(error) error {
	c.lan.mu.Lock()
	s, cancel := c.lan.serf, c.lan.cancel
	c.lan.serf = nil // lanJoin and the suspicion loop see no pool from now on
	c.lan.mu.Unlock()
	if s == nil {
		return nil
	}
	cancel()
	c.lan.wg.Wait()
	if !c.crash.Load() {
		_ = s.Leave()
	}
	_ = s.Shutdown()
	<-c.lan.drained
	return nil
}

// lanAddr is this coordinator's LAN member address ("" without a pool), for
// its member record.
func (c *Coordinator) lanAddr() string {
	c.lan.mu.Lock()
	defer c.lan.mu.Unlock()
	if c.lan.serf == nil {
		return ""
	}
	return c.lan.addr
}

// lanJoin is RegisterNodeResponse.lan_join: this coordinator's LAN address
// first, then its peers' (nil without a pool).
func (c *Coordinator) lanJoin() []string {
	c.lan.mu.Lock()
	defer c.lan.mu.Unlock()
	if c.lan.serf == nil {
		return nil
	}
	return append([]string{c.lan.addr}, c.lan.peers...)
}

// lanCoordinatorFailed reports whether the pool holds a failed member of
// coordinator id and no live one (a restarted coordinator joins under a new
// name, and its old member stays failed for a while). False without a pool.
func (c *Coordinator) lanCoordinatorFailed(id string) bool {
	c.lan.mu.Lock()
	s := c.lan.serf
	c.lan.mu.Unlock()
	if s == nil {
		return false
	}
	failed, alive := false, false
	for _, m := range s.Members() {
		if ct, ok := lan.DecodeCoordinatorTags(m.Tags); ok && ct.ID == id {
			switch m.Status {
			case serf.StatusFailed:
				failed = true
			case serf.StatusAlive, serf.StatusLeaving:
				alive = true
			}
		}
	}
	return failed && !alive
}

// lanEvents reads serf's events until serf shuts down (serf blocks on a
// full event channel, so it is always drained) and acts on member failures.
func (c *Coordinator) lanEvents(ctx context.Context, s *serf.Serf, events <-chan serf.Event) {
	defer close(c.lan.drained)
	for {
		select {
		case <-s.ShutdownCh():
			return
		case e := <-events:
			me, ok := e.(serf.MemberEvent)
			if !ok || me.Type != serf.EventMemberFailed || ctx.Err() != nil {
				continue
			}
			for _, m := range me.Members {
				c.lanMemberFailed(ctx, s, m)
			}
		}
	}
}

// lanMemberFailed handles one member serf declared failed.
func (c *Coordinator) lanMemberFailed(ctx context.Context, s *serf.Serf, m serf.Member) {
	met := c.lanMetrics()
	if ct, ok := lan.DecodeCoordinatorTags(m.Tags); ok {
		met.Suspicions.WithLabelValues(lan.RoleCoordinator).Inc()
		c.log.Warn("LAN: coordinator member failed", "peer", ct.ID, "member", m.Name)
		return // the suspicion loop reads the pool's view of the owner
	}
	at, ok := lan.DecodeAgentTags(m.Tags)
	if !ok {
		return
	}
	met.Suspicions.WithLabelValues(lan.RoleAgent).Inc()
	if at.Epoch == 0 {
		met.FastReclaimSkips.WithLabelValues("unregistered").Inc()
		return
	}
	if n, alive := c.lan.noteAgentFailure(liveNodes(s), at.NodeID, time.Now()); massFailure(n, alive) {
		met.FastReclaimSkips.WithLabelValues("mass_failure").Inc()
		c.log.Warn("LAN: too many agents failed at once to trust this view; leaving the node to its lease",
			"node", at.NodeID, "epoch", at.Epoch, "failed_recently", n, "alive", alive)
		return
	}
	c.lan.mu.Lock()
	stopping := c.lan.serf == nil // stopLANPart waits only for reclaims added before it
	if !stopping {
		c.lan.wg.Add(1)
	}
	c.lan.mu.Unlock()
	if stopping {
		return
	}
	go func() {
		defer c.lan.wg.Done()
		c.fastReclaim(ctx, at, m.Name)
	}()
}

// lanAgentAlive reports whether the pool holds an alive member of the
// agent at its tagged epoch (false without a pool).
func (c *Coordinator) lanAgentAlive(at lan.AgentTags) bool {
	c.lan.mu.Lock()
	s := c.lan.serf
	c.lan.mu.Unlock()
	if s == nil {
		return false
	}
	for _, m := range s.Members() {
		if t, ok := lan.DecodeAgentTags(m.Tags); ok && t.NodeID == at.NodeID && t.Epoch == at.Epoch && m.Status == serf.StatusAlive {
			return true
		}
	}
	return false
}

// liveNodes are the nodes with an alive agent member in s.
func liveNodes(s *serf.Serf) map[string]bool {
	live := map[string]bool{}
	for _, m := range s.Members() {
		if at, ok := lan.DecodeAgentTags(m.Tags); ok && m.Status == serf.StatusAlive {
			live[at.NodeID] = true
		}
	}
	return live
}

// noteAgentFailure records node's agent failure and returns the nodes whose
// agents failed within massFailureWindow and are not in live, and the
// number of live nodes.
func (l *lanMember) noteAgentFailure(live map[string]bool, node string, now time.Time) (failed, alive int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failed == nil {
		l.failed = map[string]time.Time{}
	}
	l.failed[node] = now
	for n, t := range l.failed {
		switch {
		case now.Sub(t) >= massFailureWindow:
			delete(l.failed, n)
		case !live[n]:
			failed++
		}
	}
	return failed, len(live)
}

// massFailure: failed nodes are too many for this view to be trusted.
func massFailure(failed, alive int) bool { return failed > massFailureMin && failed > alive }

// fastReclaim ends the node epoch a failed agent member was tagged with, if
// it is still current and its heartbeats stopped too, and logs and counts
// what happened. serf only speeds the lease up, so its verdict needs the
// lease's evidence: only the coordinator the agent heartbeats to (it has a
// recent beat of that epoch) acts, and only once no beat has arrived for
// heartbeatVeto; a beat that arrives after serf's verdict means a false
// suspicion (an agent too busy to answer serf's probes in time, yet alive)
// and the epoch is left alone.
func (c *Coordinator) fastReclaim(ctx context.Context, at lan.AgentTags, member string) {
	met := c.lanMetrics()
	failedAt := time.Now()
	veto := c.heartbeatVeto(failedAt)
	_, lease := c.heartbeatTiming()
	for {
		b, ok := c.beats.last(at.NodeID)
		switch {
		case !ok || b.epoch != at.Epoch || time.Since(b.at) > lease+veto:
			met.FastReclaimSkips.WithLabelValues("not_heartbeat_coordinator").Inc()
			c.log.Debug("LAN: agent member failed; its heartbeats go to another coordinator, which decides",
				"node", at.NodeID, "epoch", at.Epoch, "member", member)
			return
		case b.at.After(failedAt):
			met.FastReclaimSkips.WithLabelValues("heartbeats_arrive").Inc()
			c.log.Info("LAN: agent member failed but its heartbeats still arrive; false suspicion, epoch kept",
				"node", at.NodeID, "epoch", at.Epoch, "member", member, "last_heartbeat_ago", time.Since(b.at).Round(time.Millisecond))
			return
		}
		wait := veto - time.Since(b.at)
		if wait <= 0 {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
	if c.lanAgentAlive(at) {
		// The member came back (serf refuted its own failure) while the
		// veto ran: serf no longer says anything against the node.
		met.FastReclaimSkips.WithLabelValues("member_alive_again").Inc()
		c.log.Info("LAN: agent member failed but is alive again; epoch kept", "node", at.NodeID, "epoch", at.Epoch, "member", member)
		return
	}
	ended, err := c.endNodeEpoch(ctx, at.NodeID, at.Epoch)
	switch {
	case err != nil:
		met.FastReclaimSkips.WithLabelValues("error").Inc()
		if ctx.Err() == nil {
			c.log.Warn("fast reclaim failed; the lease decides", "node", at.NodeID, "epoch", at.Epoch, "err", err)
		}
	case !ended:
		met.FastReclaimSkips.WithLabelValues("epoch_changed").Inc()
		c.log.Info("LAN: failed agent's epoch already ended", "node", at.NodeID, "epoch", at.Epoch, "member", member)
	default:
		met.FastReclaims.WithLabelValues("member_failed").Inc()
		c.log.Warn("fast reclaim: node epoch ended before its lease", "node", at.NodeID, "epoch", at.Epoch,
			"reason", "member_failed: serf declared the agent's LAN member failed and its heartbeats stopped", "member", member,
			"since_heartbeat", time.Since(c.mustBeat(at.NodeID)).Round(time.Millisecond))
	}
}

// heartbeatVeto is how long without a heartbeat an agent serf declared
// failed must have gone before its epoch is ended early: the longest of 2
// heartbeat intervals (1.5 let a busy agent starting a batch of tasks be
// ended), half the node lease (an operator who set a long lease asked for
// long silences to be tolerated: serf may shorten that wait by half, not to
// 1 s), and 1.5 times the longest gap between two heartbeats of one live
// epoch seen here in the last gapWindow. On a machine or network
// busy enough that live agents' beats arrive late, serf's probes fail too
// (a drain of 2,000 tasks on 8 agents sharing 2 busy vCPUs saw beats 1.1-1.4 s
// apart at a 500 ms interval, and serf declaring live agents failed several
// times a minute, which ended their epochs and failed tasks as killed
// workers); the veto then grows to the lease TTL or past it, and the lease
// decides. Memberlist's own Lifeguard local health multiplier backs off its
// probes on the same reasoning.
func (c *Coordinator) heartbeatVeto(now time.Time) time.Duration {
	interval, lease := c.heartbeatTiming()
	v := max(2*interval, lease/2)
	if g := c.beats.slowestGap(now); 3*g/2 > v {
		v = 3 * g / 2
	}
	return v
}

// mustBeat is the time of the node's last heartbeat here (zero if none).
func (c *Coordinator) mustBeat(node string) time.Time {
	b, _ := c.beats.last(node)
	return b.at
}

// beat is a node's last heartbeat served by this coordinator.
type beat struct {
	epoch int64
	at    time.Time
}

// beatLog remembers the last heartbeat each node sent this coordinator
// (fastReclaim's evidence); entries older than a minute are dropped. It
// also keeps the longest recent gap between two heartbeats of one epoch
// (heartbeatVeto).
type beatLog struct {
	mu    sync.Mutex
	beats map[string]beat
	swept time.Time
	// slowest is the longest counted gap seen within gapWindow, at
	// slowestAt.
	slowest   time.Duration
	slowestAt time.Time
}

// gapWindow is how long a slow heartbeat keeps the fast reclaim's veto up.
const gapWindow = 30 * time.Second

// note records a heartbeat (or registration) of node's epoch at now. A gap
// since the epoch's previous one counts toward slowestGap only up to
// maxGap, the epoch's lease TTL (scaled with the fleet, heartbeatTiming):
// a longer gap means the beats went to another coordinator
// meanwhile. 0 counts none.
func (l *beatLog) note(node string, epoch int64, now time.Time, maxGap time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.beats == nil {
		l.beats = map[string]beat{}
	}
	if prev, ok := l.beats[node]; ok && prev.epoch == epoch {
		if gap := now.Sub(prev.at); gap <= maxGap && (gap >= l.slowest || now.Sub(l.slowestAt) > gapWindow) {
			l.slowest, l.slowestAt = gap, now
		}
	}
	l.beats[node] = beat{epoch, now}
	if now.Sub(l.swept) > time.Minute {
		l.swept = now
		for n, b := range l.beats {
			if now.Sub(b.at) > time.Minute {
				delete(l.beats, n)
			}
		}
	}
}

// slowestGap is the longest gap between two heartbeats of one epoch seen
// within gapWindow before now (0 if none).
func (l *beatLog) slowestGap(now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.slowestAt) > gapWindow {
		return 0
	}
	return l.slowest
}

func (l *beatLog) last(node string) (beat, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.beats[node]
	return b, ok
}

// endNodeEpoch ends (node, epoch) if it is the node's current epoch: one Txn
// compares the alive key's CreateRevision with epoch and deletes the key,
// then the epoch's lease is revoked. It reports whether this call ended it;
// false with a nil error means the epoch was no longer current.
func (c *Coordinator) endNodeEpoch(ctx context.Context, node string, epoch int64) (bool, error) {
	alive := store.KeyNodeAlive(node)
	resp, err := c.txnRetry(ctx, func(actx context.Context) (*clientv3.TxnResponse, error) {
		return c.cli.Txn(actx).If(clientv3.Compare(clientv3.CreateRevision(alive), "=", epoch)).
			Then(clientv3.OpGet(alive), clientv3.OpDelete(alive)).Commit()
	})
	if err != nil {
		return false, err
	}
	if !resp.Succeeded {
		return false, nil
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 && kvs[0].Lease != 0 {
		rctx, cancel := store.EtcdCtx(ctx)
		_, err := c.cli.Revoke(rctx, clientv3.LeaseID(kvs[0].Lease))
		cancel()
		if err != nil && status.Code(err) != codes.NotFound {
			// The epoch is over already (its alive key is gone); the
			// lease just runs out.
			c.log.Warn("revoke ended epoch's lease", "node", node, "epoch", epoch, "err", err)
		}
	}
	return true, nil
}
