package shards

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Ownership is one shard's owner as an owner key says.
type Ownership struct {
	// Member is the owner's id (the key's value).
	Member string
	// Epoch is the key's CreateRevision.
	Epoch Epoch
	// Lease is the lease the key lives under.
	Lease clientv3.LeaseID
}

// Snapshot is the owners view at one etcd revision.
type Snapshot struct {
	// Owners maps each owned shard to its owner; unowned shards are absent.
	// It is the caller's copy.
	Owners map[int]Ownership
	// Rev is the etcd revision the view reflects: every owner key change
	// up to Rev is in Owners.
	Rev int64
	// Changed is closed at the view's next change (or when the view stops).
	Changed <-chan struct{}
}

// Owners is a watch-based view of every shard's owner, kept current from one
// Get and then a Watch from the next revision; after a compaction, a
// cancelled watch or a lost leader it reloads with a fresh Get (so it never
// misses a delete). Safe for concurrent use.
type Owners struct {
	cli    *clientv3.Client
	layout Layout

	mu      sync.Mutex
	owners  map[int]Ownership
	rev     int64
	changed chan struct{}
	reloads int
}

// WatchOwners loads the owner keys of l and keeps the view current until ctx
// ends. The first load happens before it returns (its error is returned: an
// invalid layout or etcd's).
func WatchOwners(ctx context.Context, cli *clientv3.Client, l Layout) (*Owners, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	o := &Owners{cli: cli, layout: l, changed: make(chan struct{})}
	if err := o.load(ctx); err != nil {
		return nil, fmt.Errorf("load shard owners: %w", err)
	}
	go o.run(ctx)
	return o, nil
}

// Snapshot returns a copy of the view, its revision, and a channel closed at
// the next change.
func (o *Owners) Snapshot() Snapshot {
	o.mu.Lock()
	defer o.mu.Unlock()
	return Snapshot{Owners: maps.Clone(o.owners), Rev: o.rev, Changed: o.changed}
}

// Get returns shard s's owner; ok is false if nobody owns it.
func (o *Owners) Get(s int) (own Ownership, ok bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	own, ok = o.owners[s]
	return own, ok
}

// Reloads counts the full reloads after the first load (compactions,
// cancelled watches).
func (o *Owners) Reloads() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.reloads
}

// notifyLocked wakes the waiters of the current Changed channel.
func (o *Owners) notifyLocked() {
	close(o.changed)
	o.changed = make(chan struct{})
}

func (o *Owners) load(ctx context.Context) error {
	snap, err := ReadOwners(ctx, o.cli, o.layout)
	if err != nil {
		return err
	}
	o.mu.Lock()
	o.owners, o.rev = snap.Owners, snap.Rev
	o.notifyLocked()
	o.mu.Unlock()
	return nil
}

// PerMember counts the shards each member owns.
func (s Snapshot) PerMember() map[string]int {
	out := map[string]int{}
	for _, o := range s.Owners {
		out[o.Member]++
	}
	return out
}

// ReadOwners reads every shard's owner once (one range read, bounded by
// 5 s); the Snapshot's Changed is nil. Errors are etcd's.
func ReadOwners(ctx context.Context, cli *clientv3.Client, l Layout) (Snapshot, error) {
	gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := cli.Get(gctx, l.watchPrefix(), clientv3.WithPrefix())
	if err != nil {
		return Snapshot{}, err
	}
	m := make(map[int]Ownership, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		if s, ok := l.ShardOf(string(kv.Key)); ok {
			m[s] = Ownership{Member: string(kv.Value), Epoch: Epoch(kv.CreateRevision), Lease: clientv3.LeaseID(kv.Lease)}
		}
	}
	return Snapshot{Owners: m, Rev: resp.Header.Revision}, nil
}

func (o *Owners) run(ctx context.Context) {
	defer func() {
		o.mu.Lock()
		o.notifyLocked()
		o.mu.Unlock()
	}()
	for ctx.Err() == nil {
		o.mu.Lock()
		from := o.rev + 1
		o.mu.Unlock()
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wch := o.cli.Watch(wctx, o.layout.watchPrefix(), clientv3.WithPrefix(), clientv3.WithRev(from))
		o.follow(wch)
		cancel()
		// The watch ended: compacted, cancelled, or the member lost its
		// leader. Read everything again, backing off while etcd refuses.
		for backoff := 50 * time.Millisecond; ctx.Err() == nil; backoff = min(2*backoff, time.Second) {
			if err := o.load(ctx); err == nil {
				o.mu.Lock()
				o.reloads++
				o.mu.Unlock()
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(backoff):
			}
		}
	}
}

// follow applies watch responses until the watch ends or fails.
func (o *Owners) follow(wch clientv3.WatchChan) {
	for resp := range wch {
		if resp.Canceled || resp.CompactRevision != 0 || resp.Err() != nil {
			return
		}
		o.mu.Lock()
		if resp.IsProgressNotify() {
			// Every event up to the header's revision has been sent.
			o.rev = max(o.rev, resp.Header.Revision)
		}
		for _, ev := range resp.Events {
			s, ok := o.layout.ShardOf(string(ev.Kv.Key))
			if !ok {
				continue
			}
			if ev.Type == mvccpb.DELETE {
				delete(o.owners, s)
			} else {
				o.owners[s] = Ownership{Member: string(ev.Kv.Value), Epoch: Epoch(ev.Kv.CreateRevision), Lease: clientv3.LeaseID(ev.Kv.Lease)}
			}
		}
		// The last event's revision, not the header's: a catching-up
		// watch may send a batch with the store's current revision in the
		// header and more events still to come.
		if n := len(resp.Events); n > 0 {
			o.rev = max(o.rev, resp.Events[n-1].Kv.ModRevision)
		}
		o.notifyLocked()
		o.mu.Unlock()
	}
}
