// Package shardstest checks shard ownership from outside, for the tests of
// package shards and of its users (the regional coordinator): a Checker
// watches every owner key of a Layout and checks each event as etcd
// orders them. It is test support: it imports package testing and must
// not be linked into a binary.
package shardstest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"apiary.dev/apiary/internal/testutil"
	"apiary.dev/apiary/shards"
)

// Event is one change of an owner key, as the Checker saw it.
type Event struct {
	// At is when the Checker received it.
	At    time.Time
	Shard int
	// Member is the new owner (a create) or the old one (a delete).
	Member string
	// Rev is the event's revision (the key's ModRevision).
	Rev    int64
	Create bool
}

// Checker watches every owner key of a layout and checks each event: a put
// always creates its key (never overwrites: claims are create-if-absent),
// no shard gets a second owner (a create for a shard whose key the Checker
// believes exists: a missed delete, or an overwrite), a delete removes a
// key that exists, and a new owner's CreateRevision is above the previous
// owner's delete. Safe for concurrent use.
type Checker struct {
	layout shards.Layout

	mu         sync.Mutex
	owners     map[int]shards.Ownership
	lastDelete map[int]int64
	events     []Event
	rev        int64
	violations []string
	returned   int // violations already returned by Stop

	cancel context.CancelFunc
	done   chan struct{}
}

// Option changes where a Checker starts.
type Option func(*options)

type options struct{ from int64 }

// FromRevision starts the Checker at revision rev (at least 1): it reads
// the owner keys as they were at rev and checks every event after it, so a
// Checker started late still sees the claims made since rev (etcd must not
// have compacted past rev). Without it the Checker starts at the current
// revision.
func FromRevision(rev int64) Option { return func(o *options) { o.from = rev } }

// WatchNoDoubleOwner starts a Checker of l's owner keys through cli. It
// fails t at once if the first read fails, and at t's cleanup with every
// violation that Stop has not returned. The watch stops at Stop or at
// cleanup.
func WatchNoDoubleOwner(t testing.TB, cli *clientv3.Client, l shards.Layout, opts ...Option) *Checker {
	t.Helper()
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if err := l.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	gopts := []clientv3.OpOption{clientv3.WithPrefix()}
	if o.from > 0 {
		gopts = append(gopts, clientv3.WithRev(o.from))
	}
	gctx, gcancel := context.WithTimeout(ctx, 10*time.Second)
	resp, err := cli.Get(gctx, l.Prefix+"/", gopts...)
	gcancel()
	if err != nil {
		cancel()
		t.Fatalf("shardstest: read the owner keys under %s/: %v", l.Prefix, err)
	}
	rev := resp.Header.Revision
	if o.from > 0 {
		rev = o.from
	}
	c := &Checker{layout: l, owners: map[int]shards.Ownership{}, lastDelete: map[int]int64{}, rev: rev, cancel: cancel, done: make(chan struct{})}
	for _, kv := range resp.Kvs {
		if s, ok := l.ShardOf(string(kv.Key)); ok {
			c.owners[s] = shards.Ownership{Member: string(kv.Value), Epoch: shards.Epoch(kv.CreateRevision), Lease: clientv3.LeaseID(kv.Lease)}
		}
	}
	wch := cli.Watch(ctx, l.Prefix+"/", clientv3.WithPrefix(), clientv3.WithRev(rev+1), clientv3.WithPrevKV())
	go func() {
		defer close(c.done)
		for wr := range wch {
			if wr.Err() != nil || wr.CompactRevision != 0 {
				if ctx.Err() == nil {
					c.Fail("shardstest: the owner key watch failed (compacted at %d?): %v", wr.CompactRevision, wr.Err())
				}
				return
			}
			for _, ev := range wr.Events {
				c.apply(ev)
			}
		}
	}()
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	return c
}

// Fail records a violation found outside the Checker (e.g. by a test's
// hook); it is reported like the Checker's own.
func (c *Checker) Fail(format string, args ...any) {
	c.mu.Lock()
	c.violations = append(c.violations, fmt.Sprintf(format, args...))
	c.mu.Unlock()
}

func (c *Checker) apply(ev *clientv3.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	kv := ev.Kv
	c.rev = kv.ModRevision
	s, ok := c.layout.ShardOf(string(kv.Key))
	if !ok {
		return
	}
	cur, owned := c.owners[s]
	if ev.Type == mvccpb.DELETE {
		if !owned {
			c.violations = append(c.violations, fmt.Sprintf("rev %d: delete of shard %d, which had no owner", kv.ModRevision, s))
		}
		delete(c.owners, s)
		c.lastDelete[s] = kv.ModRevision
		c.events = append(c.events, Event{At: time.Now(), Shard: s, Member: cur.Member, Rev: kv.ModRevision})
		return
	}
	if kv.CreateRevision != kv.ModRevision {
		c.violations = append(c.violations, fmt.Sprintf("rev %d: shard %d's owner key overwritten (created at %d) by %s", kv.ModRevision, s, kv.CreateRevision, kv.Value))
	}
	if owned {
		c.violations = append(c.violations, fmt.Sprintf("rev %d: shard %d has two owners: %s (epoch %d) and %s", kv.ModRevision, s, cur.Member, cur.Epoch, kv.Value))
	}
	if d, ok := c.lastDelete[s]; ok && kv.CreateRevision <= d {
		c.violations = append(c.violations, fmt.Sprintf("rev %d: shard %d claimed by %s at or before the old key's delete at %d", kv.ModRevision, s, kv.Value, d))
	}
	c.owners[s] = shards.Ownership{Member: string(kv.Value), Epoch: shards.Epoch(kv.CreateRevision), Lease: clientv3.LeaseID(kv.Lease)}
	c.events = append(c.events, Event{At: time.Now(), Shard: s, Member: string(kv.Value), Rev: kv.ModRevision, Create: true})
}

// EventsSince returns the events received at or after t, in revision order.
func (c *Checker) EventsSince(t time.Time) []Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := slices.IndexFunc(c.events, func(e Event) bool { return !e.At.Before(t) })
	if i < 0 {
		return nil
	}
	return slices.Clone(c.events[i:])
}

// Owners is every shard's owner as the Checker's events say (at Rev).
func (c *Checker) Owners() map[int]shards.Ownership {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.owners)
}

// Counts is the number of shards each member owns as the Checker's
// events say.
func (c *Checker) Counts() map[string]int {
	out := map[string]int{}
	for _, o := range c.Owners() {
		out[o.Member]++
	}
	return out
}

// Rev is the revision of the last event the Checker applied.
func (c *Checker) Rev() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rev
}

// CaughtUp waits (up to 5 s, else fails t) until the Checker has seen
// every revision up to now: it puts <prefix>/checker-mark, a key outside
// the layout's owner keys, and waits for the watch to pass its revision.
func (c *Checker) CaughtUp(t testing.TB, cli *clientv3.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	resp, err := cli.Put(ctx, c.layout.Prefix+"/checker-mark", "")
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, "owner checker caught up", func() error {
		if rev := c.Rev(); rev < resp.Header.Revision {
			return fmt.Errorf("checker at rev %d, etcd at %d", rev, resp.Header.Revision)
		}
		return nil
	})
}

// Stop ends the watch (waiting for it) and returns, as one error, the
// violations not returned by an earlier Stop (nil when there are none).
func (c *Checker) Stop() error {
	c.cancel()
	<-c.done
	c.mu.Lock()
	defer c.mu.Unlock()
	v := c.violations[c.returned:]
	c.returned = len(c.violations)
	if len(v) == 0 {
		return nil
	}
	return fmt.Errorf("shard ownership under %s/: %d violations:\n%s", c.layout.Prefix, len(v), strings.Join(v, "\n"))
}
