package regional

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"apiary.dev/apiary/internal/lifecycle"
	"apiary.dev/apiary/internal/priority"
	"apiary.dev/apiary/placement"
	"apiary.dev/apiary/regional/scheduler"
	"apiary.dev/apiary/regional/store"
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
//     set, and one scheduling loop (package regional/scheduler, built here
//     from ownerDeps) schedules the shards it owns. The reconciler's hooks
//     feed the loop's scheduler.ShardSet (onShardsChanged, HandBack). The
//     loop keeps a watch cache of the whole region (node usage is derived
//     from every task on a node, whatever its shard), and acts only on the
//     tasks and jobs of its shards; every write it makes is fenced on the
//     epochs of the shards it writes for (store.EtcdCommitter).
//   - suspicion (suspicion.go): a coordinator revokes the session lease of a peer
//     whose API refuses connections or whose LAN member failed.

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
			_ = lifecycle.Sleep(ctx, 200*time.Millisecond)
			continue
		}
		pctx, cancel := store.EtcdCtx(ctx)
		rec := store.MemberRecord{ID: c.cfg.ID, APIAddr: c.AdvertisedAddr(), LANAddr: c.lanAddr(), APIOnly: c.cfg.APIOnly}
		_, err = c.cli.Put(pctx, store.KeyMember(c.cfg.ID), store.MustJSON(rec), clientv3.WithLease(s.Lease()))
		cancel()
		if err != nil {
			c.closeSession(s)
			_ = lifecycle.Sleep(ctx, 200*time.Millisecond)
			continue
		}
		c.sessions.publish(s)
		select {
		case <-s.Done():
			c.log.Warn("member session lease ended; its shards are dropped", "lease", int64(s.Lease()))
			// The client gave up on the lease (its keep-alive failed for a
			// TTL) but etcd may still hold it, with a claim that raced the
			// end: revoke it, so that those shards move now rather than
			// when it lapses.
			c.closeSession(s)
		case <-ctx.Done():
			c.closeSession(s)
		}
	}
}

// checkMemberID is the start of the members part: a member key of this
// coordinator's id that is already there belongs either to a predecessor
// that crashed (its API address is this process's, or refuses
// connections): its lease is revoked, so its shards move now instead of
// when it lapses; or to a live coordinator started with the same --id: the
// start fails, naming it, since the two would take each other's member key
// and one would drop out of the region unseen.
func (c *Coordinator) checkMemberID(ctx context.Context) error {
	gctx, cancel := store.EtcdCtx(ctx)
	resp, err := c.cli.Get(gctx, store.KeyMember(c.cfg.ID))
	cancel()
	if err != nil || len(resp.Kvs) == 0 {
		return nil // none, or etcd is slow: memberLoop retries its put
	}
	kv := resp.Kvs[0]
	var rec store.MemberRecord
	_ = json.Unmarshal(kv.Value, &rec)
	if rec.APIAddr != "" && rec.APIAddr != c.AdvertisedAddr() {
		if conn, derr := net.DialTimeout("tcp", rec.APIAddr, 300*time.Millisecond); derr == nil {
			conn.Close()
			return fmt.Errorf("id: coordinator id %s is in use by a live coordinator at %s (its member key is under lease %x); "+
				"give every coordinator of a region its own --id", c.cfg.ID, rec.APIAddr, kv.Lease)
		}
	}
	if err := c.revoke(ctx, clientv3.LeaseID(kv.Lease)); err != nil {
		c.log.Warn("could not revoke the lease of this id's previous run; its shards move when it lapses", "lease", kv.Lease, "err", err)
	} else {
		c.log.Info("revoked the lease of this id's previous run (it had crashed); its shards move now", "lease", kv.Lease, "api", rec.APIAddr)
	}
	return nil
}

// closeSession revokes the session's lease (its member key and shard
// claims go at once), except on a crash (Kill). Not Session.Close: that
// revokes under the session's context, which a stop has already ended.
func (c *Coordinator) closeSession(s *concurrency.Session) {
	s.Orphan()
	if c.crash.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := c.cli.Revoke(ctx, s.Lease()); err != nil {
		c.log.Warn("revoking the session lease failed; peers take the shards when it lapses", "lease", int64(s.Lease()), "err", err)
	}
}

// shardLayout names the region's shard owner keys.
func (c *Coordinator) shardLayout() shards.Layout {
	return shards.Layout{Prefix: store.PrefShards, Count: c.meta.ShardCount}
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
		_ = lifecycle.Sleep(ctx, 200*time.Millisecond)
	}
	if ctx.Err() != nil {
		return
	}
	if len(owners.Snapshot().Owners) > 0 {
		// The region was running (its shards had live owners): node
		// leases did not lapse for an outage, so no failover grace.
		c.noGrace.Store(true)
	}
	feed := c.members
	var wg sync.WaitGroup
	wg.Go(func() { feed.run(ctx, c) })
	wg.Go(func() { c.scheduleLoop(ctx, owners) })
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
			Lease: sess.Lease(), LeaseDone: sess.Done(), Members: members, HandBack: c.shardSet.HandBack,
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
	m := c.shardSet.Set(owned)
	c.metrics.ShardMoves.WithLabelValues("claim").Add(float64(m.Claimed))
	c.metrics.ShardMoves.WithLabelValues("hand_back").Add(float64(m.HandedBack))
	c.metrics.ShardMoves.WithLabelValues("lost").Add(float64(m.Lost))
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

// ownerDeps is what the scheduling loop needs from c; owners is the
// region's shard owners view (nil: no home-node rule).
func (c *Coordinator) ownerDeps(owners *shards.Owners) scheduler.Deps {
	p, pre := c.cfg.Placer, c.cfg.Placer
	if p == nil {
		// The main pass's snapshot carries only the existing allocations
		// of the batch's groups (and anti-affinity groups), so its engine
		// does not preempt; the preemption pass (regional/scheduler,
		// preempt.go) has its own engine and sees every active task. The
		// seed is the coordinator id's hash: a coordinator's choices are
		// reproducible, and two owners break ties differently.
		opts := placement.Options{Policy: c.cfg.SchedulerPolicy, Seed: int64(xxhash.Sum64String(c.cfg.ID)), DisablePreemption: true,
			Workload: c.cfg.Workload, PreemptionDelta: priority.PreemptionDelta, Weights: placement.Weights{Locality: c.cfg.LocalityWeight}}
		p = placement.New(opts)
		opts.DisablePreemption = false
		pre = placement.New(opts)
	}
	return scheduler.Deps{Region: c.meta.Region, Jurisdiction: c.meta.Jurisdiction, CoordID: c.cfg.ID, Placer: p,
		ShardCount: c.meta.ShardCount, Publish: c.publishShardStats,
		Retention: c.cfg.JobRetention, Client: c.cli, Commit: &store.EtcdCommitter{Client: c.cli, Layout: c.shardLayout(), Retry: c.txnRetry},
		Specs: &c.specs, Log: c.log, Metrics: c.metrics, Skipped: scheduler.SkippedCounter(c.cfg.Registry),
		Tracer: c.tracer, Tracing: c.tracing, DefaultLostAfter: c.cfg.DefaultLostAfter, GraceUntil: c.graceUntil(),
		Owners: owners, Preempter: pre, MaxPreemptions: c.cfg.MaxPreemptions, Jobs: c.jobs, Nodes: c.nodes, Hold: c.holdJob}
}

// scheduleLoop runs the scheduling loop of c's shards, rebuilding it (a
// fresh cache) when it fails (a closed watch, an etcd error), until ctx ends.
func (c *Coordinator) scheduleLoop(ctx context.Context, owners *shards.Owners) {
	for ctx.Err() == nil {
		err := scheduler.New(c.ownerDeps(owners), c.shardSet).Run(ctx)
		if ctx.Err() != nil {
			return
		}
		c.log.Warn("scheduling loop failed; reloading its cache", "err", err)
		_ = lifecycle.Sleep(ctx, 100*time.Millisecond)
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
	rec   store.MemberRecord
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
		gctx, cancel := store.EtcdCtx(ctx)
		resp, err := c.cli.Get(gctx, store.PrefMembers, clientv3.WithPrefix())
		cancel()
		if err != nil {
			_ = lifecycle.Sleep(ctx, 200*time.Millisecond)
			continue
		}
		live := map[string]memberPeer{}
		for _, kv := range resp.Kvs {
			live[string(kv.Key[len(store.PrefMembers):])] = decodePeer(kv)
		}
		f.publish(live)
		wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		for wr := range c.cli.Watch(wctx, store.PrefMembers, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1)) {
			if wr.Err() != nil {
				break
			}
			for _, ev := range wr.Events {
				id := string(ev.Kv.Key[len(store.PrefMembers):])
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
	_ = json.Unmarshal(kv.Value, &p.rec) // an undecodable record: a peer without addresses
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

// publishShardStats keeps the loop's latest per-shard counts for ListShards.
func (c *Coordinator) publishShardStats(st []scheduler.ShardStat) { c.shardStats.Store(&st) }

// graceUntil is the end of the failover grace (Config.FailoverGrace): none
// for a coordinator that started into a running region.
func (c *Coordinator) graceUntil() time.Time {
	if c.noGrace.Load() {
		return c.born
	}
	return c.born.Add(c.cfg.FailoverGrace)
}
