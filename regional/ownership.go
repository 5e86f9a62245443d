package regional

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"apiary.dev/apiary/shards"
)

// Sharded ownership (docs/architecture.md, "Shards"): every coordinator runs
// the same three pieces.
//
//   - members (memberLoop): one session lease per coordinator, holding its
//     presence key /apiary/members/<id>; the same lease holds every shard
//     owner key it creates, so a lapsed or revoked lease drops the member
//     from the live set and all its shards at one revision.
//   - owner (runOwner): a shards.Reconciler per session converges the
//     coordinator's claims on the rendezvous assignment of the live member
//     set, and one scheduling loop (scheduler.go) schedules the shards it
//     owns. The loop keeps a watch cache of the whole region (node usage is
//     derived from every task on a node, whatever its shard), and acts only
//     on the tasks and jobs of its shards; every write it makes is fenced on
//     the epochs of the shards it writes for (commit, committer.go).
//   - suspicion (suspicion.go): a coordinator revokes the lease of a memberPeer
//     whose API refuses connections or whose LAN member failed.

// shardSet is the set of shards the scheduling loop may write for, shared
// between the reconciler (which claims and hands back) and the loop (which
// reads it at the start of each round).
type shardSet struct {
	mu sync.Mutex
	// latest is the reconciler's owned set (OnChange).
	latest map[int]shards.Epoch
	// dropped holds shards not to write for at that epoch: handed back (the
	// reconciler's owned set may still hold them for a moment) or found
	// fenced by a write.
	dropped map[int]shards.Epoch
	// handed holds the shards handed back (for the move counts).
	handed map[int]shards.Epoch
	// changed (capacity 1) wakes the loop when the set changes.
	changed chan struct{}
	// round (capacity 1) is held by the loop for the length of a round, so
	// that a hand-back can wait for the in-flight plan.
	round chan struct{}
}

func newShardSet() *shardSet {
	return &shardSet{latest: map[int]shards.Epoch{}, dropped: map[int]shards.Epoch{}, handed: map[int]shards.Epoch{},
		changed: make(chan struct{}, 1), round: make(chan struct{}, 1)}
}

// shardMoves counts one change of the owned set.
type shardMoves struct{ claimed, handedBack, lost int }

// set is the reconciler's OnChange; it returns what changed (a shard that
// left the set after a hand-back counts as handed back, any other as lost).
func (ss *shardSet) set(owned map[int]shards.Epoch) shardMoves {
	var m shardMoves
	ss.mu.Lock()
	for s, e := range owned {
		if old, ok := ss.latest[s]; !ok || old != e {
			m.claimed++
		}
	}
	for s, e := range ss.latest {
		if now, ok := owned[s]; ok && now == e {
			continue
		}
		if h, ok := ss.handed[s]; ok && h == e {
			m.handedBack++
		} else {
			m.lost++
		}
	}
	ss.latest = maps.Clone(owned)
	for s, e := range ss.dropped {
		if owned[s] != e {
			delete(ss.dropped, s) // gone, or claimed again at a new epoch
		}
	}
	for s, e := range ss.handed {
		if owned[s] != e {
			delete(ss.handed, s)
		}
	}
	ss.mu.Unlock()
	ss.wake()
	return m
}

func (ss *shardSet) wake() {
	select {
	case ss.changed <- struct{}{}:
	default:
	}
}

// current is the shards the loop may write for: owned and not dropped.
func (ss *shardSet) current() map[int]shards.Epoch {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	out := make(map[int]shards.Epoch, len(ss.latest))
	for s, e := range ss.latest {
		if d, ok := ss.dropped[s]; !ok || d != e {
			out[s] = e
		}
	}
	return out
}

// drop stops writes for the fenced shards (until claimed again).
func (ss *shardSet) drop(fs []fence) {
	ss.mu.Lock()
	for _, f := range fs {
		ss.dropped[f.shard] = f.epoch
	}
	ss.mu.Unlock()
}

// handBack is the reconciler's HandBack hook: the loop writes nothing more
// for s once it returns (the round in flight, if any, has finished, and the
// next one leaves s out). On timeout the shard is kept.
func (ss *shardSet) handBack(ctx context.Context, s int) error {
	ss.mu.Lock()
	e, ok := ss.latest[s]
	if ok {
		ss.dropped[s] = e
	}
	ss.mu.Unlock()
	if !ok {
		return nil
	}
	select {
	case ss.round <- struct{}{}:
		<-ss.round
		ss.mu.Lock()
		ss.handed[s] = e
		ss.mu.Unlock()
		return nil
	case <-ctx.Done():
		ss.mu.Lock()
		if ss.dropped[s] == e {
			delete(ss.dropped, s)
		}
		ss.mu.Unlock()
		return ctx.Err()
	}
}

// beginRound takes the round token (false when ctx ended first).
func (ss *shardSet) beginRound(ctx context.Context) bool {
	select {
	case ss.round <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

func (ss *shardSet) endRound() { <-ss.round }

// sessionBox publishes the coordinator's current member session (memberLoop)
// to the owner part.
type sessionBox struct {
	mu      sync.Mutex
	s       *concurrency.Session
	changed chan struct{} // closed and replaced at each publish
}

func newSessionBox() *sessionBox { return &sessionBox{changed: make(chan struct{})} }

func (b *sessionBox) publish(s *concurrency.Session) {
	b.mu.Lock()
	b.s = s
	close(b.changed)
	b.changed = make(chan struct{})
	b.mu.Unlock()
}

// next waits for a live session other than prev (nil when ctx ends).
func (b *sessionBox) next(ctx context.Context, prev *concurrency.Session) *concurrency.Session {
	for {
		b.mu.Lock()
		s, ch := b.s, b.changed
		b.mu.Unlock()
		if s != nil && s != prev {
			select {
			case <-s.Done():
			default:
				return s
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ch:
		}
	}
}

// memberLoop keeps /apiary/members/<id> under the coordinator's session
// lease (the lease of its shard claims too) and publishes each session. On
// a graceful stop it revokes the lease, which hands every shard over at
// once; on a crash (Kill) the lease is left to lapse or be revoked on
// suspicion.
func (c *Coordinator) memberLoop(ctx context.Context) {
	ttl := int(c.cfg.OwnerLeaseTTL.Seconds() + 0.5)
	for ctx.Err() == nil {
		s, err := concurrency.NewSession(c.cli, concurrency.WithTTL(ttl), concurrency.WithContext(ctx))
		if err != nil {
			sleepCtx(ctx, 200*time.Millisecond)
			continue
		}
		pctx, cancel := etcdCtx(ctx)
		rec := memberRecord{ID: c.cfg.ID, APIAddr: c.Addr(), LANAddr: c.lanAddr(), APIOnly: c.cfg.APIOnly}
		_, err = c.cli.Put(pctx, keyMember(c.cfg.ID), mustJSON(rec), clientv3.WithLease(s.Lease()))
		cancel()
		if err != nil {
			c.closeSession(s)
			sleepCtx(ctx, 200*time.Millisecond)
			continue
		}
		c.sessions.publish(s)
		select {
		case <-s.Done():
			c.log.Warn("member session lease ended; its shards are dropped", "lease", int64(s.Lease()))
		case <-ctx.Done():
			c.closeSession(s)
		}
	}
}

// closeSession revokes the session's lease, except on a crash (Kill).
func (c *Coordinator) closeSession(s *concurrency.Session) {
	if c.crash.Load() {
		s.Orphan()
		return
	}
	_ = s.Close()
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// shardLayout names the region's shard owner keys.
func (c *Coordinator) shardLayout() shards.Layout {
	return shards.Layout{Prefix: prefShards, Count: c.meta.ShardCount}
}

// runOwner is the "owner" part: the owners view, the live member feed, the
// scheduling loop, and a reconciler for each member session.
func (c *Coordinator) runOwner(ctx context.Context) {
	layout := c.shardLayout()
	var owners *shards.Owners
	for ctx.Err() == nil {
		var err error
		if owners, err = shards.WatchOwners(ctx, c.cli, layout); err == nil {
			break
		}
		c.log.Warn("shard owners view failed; retrying", "err", err)
		sleepCtx(ctx, 200*time.Millisecond)
	}
	if ctx.Err() != nil {
		return
	}
	c.owners.Store(owners)
	if len(owners.Snapshot().Owners) > 0 {
		// The region was running (its shards had live owners): node
		// leases did not lapse for an outage, so no failover grace.
		c.noGrace.Store(true)
	}
	feed := c.members
	var wg sync.WaitGroup
	wg.Go(func() { feed.run(ctx, c) })
	wg.Go(func() { c.scheduleLoop(ctx) })
	defer wg.Wait()

	if c.cfg.APIOnly {
		<-ctx.Done() // owns nothing; the loop still serves ListShards
		return
	}
	var sess *concurrency.Session
	for {
		if sess = c.sessions.next(ctx, sess); sess == nil {
			return
		}
		rctx, cancel := context.WithCancel(ctx)
		members := feed.subscribe(rctx)
		r, err := shards.NewReconciler(shards.ReconcilerConfig{Client: c.cli, Layout: layout, ID: c.cfg.ID,
			Lease: sess.Lease(), LeaseDone: sess.Done(), Members: members, HandBack: c.shardSet.handBack,
			OnChange: c.onShardsChanged, Owners: owners, Settle: c.cfg.ShardSettle, Log: c.log})
		if err != nil {
			cancel()
			c.log.Error("shard reconciler", "err", err)
			return
		}
		c.reconciler.Store(r)
		err = r.Run(rctx)
		cancel()
		if err != nil && !errors.Is(err, shards.ErrLeaseGone) && ctx.Err() == nil {
			c.log.Warn("shard reconciler ended", "err", err)
		}
	}
}

// onShardsChanged is the reconciler's OnChange: the loop's set and the
// ownership gauges.
func (c *Coordinator) onShardsChanged(owned map[int]shards.Epoch) {
	m := c.shardSet.set(owned)
	c.metrics.ShardMoves.WithLabelValues("claim").Add(float64(m.claimed))
	c.metrics.ShardMoves.WithLabelValues("hand_back").Add(float64(m.handedBack))
	c.metrics.ShardMoves.WithLabelValues("lost").Add(float64(m.lost))
	var top shards.Epoch
	for _, e := range owned {
		top = max(top, e)
	}
	c.metrics.ShardsOwned.Set(float64(len(owned)))
	c.metrics.OwnerEpoch.Set(float64(top))
	if len(owned) > 0 {
		c.metrics.Owner.Set(1)
	} else {
		c.metrics.Owner.Set(0)
	}
}

// scheduleLoop runs the scheduling loop, rebuilding it (a fresh cache) when
// it fails (a closed watch, an etcd error), until ctx ends.
func (c *Coordinator) scheduleLoop(ctx context.Context) {
	for ctx.Err() == nil {
		err := newScheduler(c).run(ctx)
		if ctx.Err() != nil {
			return
		}
		c.log.Warn("scheduling loop failed; reloading its cache", "err", err)
		sleepCtx(ctx, 100*time.Millisecond)
	}
}

// OwnedShards returns the shards this coordinator owns, with their epochs.
func (c *Coordinator) OwnedShards() map[int]shards.Epoch {
	if r := c.reconciler.Load(); r != nil {
		return r.Owned()
	}
	return nil
}

// Owning reports whether this coordinator owns at least one shard.
func (c *Coordinator) Owning() bool { return len(c.OwnedShards()) > 0 }

// memberFeed follows /apiary/members/ (a range read, then a watch) and
// hands the ids of the live members that schedule (not APIOnly) to each
// reconciler, and every live member's record and lease to suspicion.
type memberFeed struct {
	mu      sync.Mutex
	ids     []string
	have    bool
	changed chan struct{} // closed and replaced at each change
	peers   map[string]memberPeer
}

// memberPeer is one live coordinator as its member key says.
type memberPeer struct {
	rec   memberRecord
	lease clientv3.LeaseID
}

func newMemberFeed() *memberFeed { return &memberFeed{changed: make(chan struct{})} }

// live returns the live members' records and leases.
func (f *memberFeed) live() map[string]memberPeer {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.peers)
}

func (f *memberFeed) run(ctx context.Context, c *Coordinator) {
	for ctx.Err() == nil {
		gctx, cancel := etcdCtx(ctx)
		resp, err := c.cli.Get(gctx, prefMembers, clientv3.WithPrefix())
		cancel()
		if err != nil {
			sleepCtx(ctx, 200*time.Millisecond)
			continue
		}
		live := map[string]memberPeer{}
		for _, kv := range resp.Kvs {
			live[string(kv.Key[len(prefMembers):])] = decodePeer(kv)
		}
		f.publish(live)
		wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		for wr := range c.cli.Watch(wctx, prefMembers, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1)) {
			if wr.Err() != nil {
				break
			}
			for _, ev := range wr.Events {
				id := string(ev.Kv.Key[len(prefMembers):])
				if ev.Type == clientv3.EventTypeDelete {
					delete(live, id)
				} else {
					live[id] = decodePeer(ev.Kv)
				}
			}
			f.publish(live)
		}
		wcancel()
	}
}

func decodePeer(kv *mvccpb.KeyValue) memberPeer {
	p := memberPeer{lease: clientv3.LeaseID(kv.Lease)}
	_ = json.Unmarshal(kv.Value, &p.rec) // an undecodable record: a memberPeer without addresses
	return p
}

func (f *memberFeed) publish(live map[string]memberPeer) {
	var ids []string // the shard assignment's members: not the API-only ones
	for id, p := range live {
		if !p.rec.APIOnly {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.peers = maps.Clone(live)
	if f.have && slices.Equal(ids, f.ids) {
		return
	}
	f.ids, f.have = ids, true
	close(f.changed)
	f.changed = make(chan struct{})
}

// subscribe returns a channel that receives the current member list, then
// each new one, until ctx ends (an unread list is replaced by a newer one).
func (f *memberFeed) subscribe(ctx context.Context) <-chan []string {
	out := make(chan []string)
	go func() {
		for {
			f.mu.Lock()
			ids, have, ch := f.ids, f.have, f.changed
			f.mu.Unlock()
			if have {
				select {
				case out <- ids:
				case <-ch:
					continue // newer list: offer that one instead
				case <-ctx.Done():
					return
				}
			}
			select {
			case <-ch:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// shardStat is one shard's counts from the scheduling loop's cache.
type shardStat struct {
	pending, running int
	lastPlanMs       int64
}

// publishShardStats keeps the loop's latest per-shard counts for ListShards.
func (c *Coordinator) publishShardStats(st []shardStat) { c.shardStats.Store(&st) }

// graceUntil is the end of the failover grace (Config.FailoverGrace): none
// for a coordinator that started into a running region.
func (c *Coordinator) graceUntil() time.Time {
	if c.noGrace.Load() {
		return c.born
	}
	return c.born.Add(c.cfg.FailoverGrace)
}
