package regional

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/hashicorp/serf/serf"
	"github.com/prometheus/client_golang/prometheus"

	"apiary.dev/apiary/internal/federation"
)

// WANConfig makes the coordinator a member of the federation's serf WAN pool,
// where the global router learns the region (global/registry). It is off
// when both Bind and Join are empty.
type WANConfig struct {
	// Bind is the serf host:port (UDP and TCP). Empty with Join set:
	// 127.0.0.1:0 (a free port).
	Bind string
	// Advertise is the host:port others reach this member at (default Bind).
	Advertise string
	// Join lists pool members (routers or other coordinators); joining is
	// retried every second until one answers.
	Join []string
}

func (w WANConfig) enabled() bool { return w.Bind != "" || len(w.Join) > 0 }

// wanMember is the coordinator's serf member.
type wanMember struct {
	mu       sync.Mutex
	serf     *serf.Serf
	lastTags map[string]string
	lastPub  time.Time
}

// tagRepublish forces a tag update at least this often (the summary's
// timestamp changes), so the router can tell a stale summary.
const tagRepublish = 5 * time.Second

// startWAN creates the serf member with the region's tags (the start of the
// "wan" part; runWAN joins the pool).
func (c *Coordinator) startWAN(context.Context) error {
	if !c.cfg.WAN.enabled() {
		return nil
	}
	bind := c.cfg.WAN.Bind
	if bind == "" {
		bind = "127.0.0.1:0"
	}
	tags, err := c.wanTags()
	if err != nil {
		return err
	}
	// The member name has no '/': memberlist reads "name/addr" on reconnect.
	sc, err := federation.NewSerfConfig(federation.MemberConfig{Name: c.meta.Region + "." + c.cfg.ID, Bind: bind,
		Advertise: c.cfg.WAN.Advertise, Tags: tags, Logger: c.log.With("component", "wan"), Gossip: c.gossip(poolWAN)})
	if err != nil {
		return err
	}
	c.warnPlainGossip(poolWAN, sc)
	s, err := serf.Create(sc)
	if err != nil {
		return fmt.Errorf("wan-bind: start serf on %s: %w", bind, err)
	}
	c.wan.mu.Lock()
	c.wan.serf = s
	c.wan.lastTags = tags
	c.wan.lastPub = time.Now()
	c.wan.mu.Unlock()
	m := s.LocalMember()
	c.log.Info("WAN member started", "wan_addr", fmt.Sprintf("%s:%d", m.Addr, m.Port), "join", c.cfg.WAN.Join)
	return nil
}

// runWAN joins the pool through cfg.WAN.Join, retrying every second for as
// long as the coordinator runs (ctx is the part's context, not a start-up
// one: a router started an hour later is still joined), then waits. A serf
// member that shuts down on its own fails the part.
func (c *Coordinator) runWAN(ctx context.Context) error {
	s := c.wan.serf
	federation.JoinLoop(ctx, s, c.cfg.WAN.Join, c.log)
	if ctx.Err() == nil && len(c.cfg.WAN.Join) > 0 {
		c.log.Info("joined WAN pool", "join", c.cfg.WAN.Join)
	}
	select {
	case <-ctx.Done():
		return nil
	case <-s.ShutdownCh():
		return fmt.Errorf("serf member %s shut down", s.LocalMember().Name)
	}
}

// stopWANPart leaves the pool (just shuts serf down after Kill).
func (c *Coordinator) stopWANPart(error) error {
	c.stopWAN(!c.crash.Load())
	return nil
}

// WANAddr is the serf address of the coordinator's WAN member, or "".
func (c *Coordinator) WANAddr() string {
	c.wan.mu.Lock()
	s := c.wan.serf
	c.wan.mu.Unlock()
	if s == nil {
		return ""
	}
	m := s.LocalMember()
	return fmt.Sprintf("%s:%d", m.Addr, m.Port)
}

// wanTags are the tags the coordinator publishes: the region's summary and
// the shards it owns now (0 before its reconciler runs, and for an API-only
// coordinator).
func (c *Coordinator) wanTags() (map[string]string, error) {
	health, cp, backlog := c.capacitySnapshot()
	return federation.CoordinatorTags{Region: c.meta.Region, ID: c.cfg.ID, Jurisdiction: c.meta.Jurisdiction,
		Labels: c.meta.Labels, APIAddr: c.AdvertisedAddr(), Health: health, Capacity: cp, Backlog: backlog,
		UpdatedMs: time.Now().UnixMilli(), Policy: c.cfg.Policy.Fingerprint(), ShardsOwned: len(c.OwnedShards())}.Encode()
}

// publishWAN updates the member's tags when any tag but the summary's time
// changed (the summary, or the number of shards owned) or every
// tagRepublish. It runs once per capacityLoop tick (SummaryRefresh), so a
// change is published within a tick and tags are set at most once a tick,
// however often ownership moves. SetTags blocks until the update is
// broadcast.
func (c *Coordinator) publishWAN() {
	c.wan.mu.Lock()
	defer c.wan.mu.Unlock()
	if c.wan.serf == nil {
		return
	}
	c.metrics.SerfMembers.DeletePartialMatch(prometheus.Labels{"pool": "wan"}) // the LAN pool's counts are lan.go's
	for state, n := range federation.MemberCounts(c.wan.serf) {
		c.metrics.SerfMembers.WithLabelValues("wan", state).Set(float64(n))
	}
	tags, err := c.wanTags()
	if err != nil {
		c.log.Warn("wan tags", "err", err)
		return
	}
	old := maps.Clone(c.wan.lastTags)
	delete(old, federation.TagUpdated)
	cmp := maps.Clone(tags)
	delete(cmp, federation.TagUpdated)
	if maps.Equal(old, cmp) && time.Since(c.wan.lastPub) < tagRepublish {
		return
	}
	if err := c.wan.serf.SetTags(tags); err != nil {
		c.log.Warn("wan set tags", "err", err)
		return
	}
	c.wan.lastTags, c.wan.lastPub = tags, time.Now()
}

// stopWAN leaves the pool gracefully (graceful stop) or just shuts serf
// down (crash: the others see the member fail).
func (c *Coordinator) stopWAN(leave bool) {
	c.wan.mu.Lock()
	s := c.wan.serf
	c.wan.serf = nil // publishWAN (the capacity part stops later) skips it
	c.wan.mu.Unlock()
	if s == nil {
		return
	}
	if leave {
		_ = s.Leave()
	}
	_ = s.Shutdown()
}
