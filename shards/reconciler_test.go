package shards_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"apiary.dev/apiary/internal/testutil"
	"apiary.dev/apiary/internal/testutil/etcdtest"
	"apiary.dev/apiary/shards"
	"apiary.dev/apiary/shards/shardstest"
)

// testMember is one reconciler with its own client and session lease.
type testMember struct {
	id        string
	cli       *clientv3.Client
	sess      *concurrency.Session
	feed      chan []string
	r         *shards.Reconciler
	done      chan error
	mu        sync.Mutex
	handBacks []int
}

// cluster runs reconcilers in this process against one embedded etcd.
type cluster struct {
	t       *testing.T
	cli     *clientv3.Client
	layout  shards.Layout
	base    shards.ReconcilerConfig
	members map[string]*testMember
	checker *shardstest.Checker
	// refuse, if set before the members start, runs first in every
	// HandBack hook (on the member's Run goroutine); its error fails it.
	refuse func(id string, s int) error
}

func newCluster(t *testing.T, cli *clientv3.Client, l shards.Layout, base shards.ReconcilerConfig) *cluster {
	return &cluster{t: t, cli: cli, layout: l, base: base, members: map[string]*testMember{}, checker: shardstest.WatchNoDoubleOwner(t, cli, l)}
}

// push sends list to a member, replacing a list it has not read yet.
func push(ch chan []string, list []string) {
	for {
		select {
		case ch <- slices.Clone(list):
			return
		default:
			select {
			case <-ch:
			default:
			}
		}
	}
}

// start runs member id's reconciler with the member list list.
func (c *cluster) start(id string, list []string) *testMember {
	t := c.t
	t.Helper()
	mcli, err := clientv3.New(clientv3.Config{Endpoints: c.cli.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := concurrency.NewSession(mcli, concurrency.WithTTL(3))
	if err != nil {
		t.Fatal(err)
	}
	m := &testMember{id: id, cli: mcli, sess: sess, feed: make(chan []string, 1), done: make(chan error, 1)}
	cfg := c.base
	cfg.Client, cfg.Layout, cfg.ID, cfg.Lease, cfg.LeaseDone, cfg.Members = mcli, c.layout, id, sess.Lease(), sess.Done(), m.feed
	key := c.layout.OwnerKey
	cfg.HandBack = func(ctx context.Context, s int) error {
		// The hook runs first: the shard is still ours in etcd and in
		// Owned while it finishes the shard's work.
		resp, err := mcli.Get(ctx, key(s))
		if err != nil {
			return err
		}
		if len(resp.Kvs) == 0 || string(resp.Kvs[0].Value) != id {
			c.checker.Fail("%s: hand-back of shard %d called while the key is %v", id, s, resp.Kvs)
		}
		if _, ok := m.r.Owned()[s]; !ok {
			c.checker.Fail("%s: hand-back of shard %d called after it left Owned", id, s)
		}
		if c.refuse != nil {
			if err := c.refuse(id, s); err != nil {
				return err
			}
		}
		m.mu.Lock()
		m.handBacks = append(m.handBacks, s)
		m.mu.Unlock()
		return nil
	}
	if m.r, err = shards.NewReconciler(cfg); err != nil {
		t.Fatal(err)
	}
	push(m.feed, list)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { m.done <- m.r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-m.done:
		case <-time.After(10 * time.Second):
			t.Errorf("%s: Run did not return", id)
		}
		sess.Orphan()
		mcli.Close()
	})
	c.members[id] = m
	return m
}

// setMembers feeds list to every member in feedTo.
func (c *cluster) setMembers(list []string, feedTo ...string) {
	for _, id := range feedTo {
		push(c.members[id].feed, list)
	}
}

// keys reads every owner key from etcd.
func (c *cluster) keys() map[int]shards.Ownership {
	c.t.Helper()
	resp, err := c.cli.Get(context.Background(), c.layout.Prefix+"/", clientv3.WithPrefix())
	if err != nil {
		c.t.Fatal(err)
	}
	m := map[int]shards.Ownership{}
	for _, kv := range resp.Kvs {
		if s, ok := c.layout.ShardOf(string(kv.Key)); ok {
			m[s] = shards.Ownership{Member: string(kv.Value), Epoch: shards.Epoch(kv.CreateRevision), Lease: clientv3.LeaseID(kv.Lease)}
		}
	}
	return m
}

// converged is nil once etcd's owner keys are shards.Desired(ids) and each of ids
// reports exactly its keys (same epochs) as Owned.
func (c *cluster) converged(ids []string) func() error {
	return func() error {
		want := shards.Desired(ids, c.layout.Count)
		got := c.keys()
		for s, w := range want {
			if got[s].Member != w {
				return fmt.Errorf("shard %d owned by %q, want %q", s, got[s].Member, w)
			}
		}
		for _, id := range ids {
			m := c.members[id]
			owned := m.r.Owned()
			n := 0
			for s, o := range got {
				if o.Member != id {
					continue
				}
				n++
				if owned[s] != o.Epoch || o.Lease != m.sess.Lease() {
					return fmt.Errorf("%s: shard %d at epoch %d lease %x in etcd, %d in Owned", id, s, o.Epoch, o.Lease, owned[s])
				}
			}
			if n != len(owned) {
				return fmt.Errorf("%s owns %d shards in etcd, %d in Owned", id, n, len(owned))
			}
		}
		return nil
	}
}

func countOf(keys map[int]shards.Ownership, id string) int {
	n := 0
	for _, o := range keys {
		if o.Member == id {
			n++
		}
	}
	return n
}

func assertShare(t *testing.T, keys map[int]shards.Ownership, id string, S, n int) {
	t.Helper()
	share := float64(S) / float64(n)
	if got := countOf(keys, id); math.Abs(float64(got)-share) > 0.2*share {
		t.Errorf("%s owns %d of %d shards, want %.0f +-20%%", id, got, S, share)
	}
}

// TestReconcilersStartAndJoin: three reconcilers started together each own
// their rendezvous share (S/3 +-20%) within 5 s; a fourth joins and takes its
// share, about S/4, from the three; only shards desired for it move, each
// after HandBack and the old key's delete; no shard has two owners at any
// revision (the checker sees every event).
func TestReconcilersStartAndJoin(t *testing.T) {
	cli := etcdtest.Start(t)
	const S = 256
	c := newCluster(t, cli, shards.Layout{Prefix: "/t/join", Count: S}, shards.ReconcilerConfig{Settle: 300 * time.Millisecond, MovesPerSecond: 200, MoveBurst: 32})
	three := []string{"coord-a", "coord-b", "coord-c"}
	start := time.Now()
	for _, id := range three {
		c.start(id, three)
	}
	testutil.Eventually(t, 5*time.Second, "three reconcilers own shards.Desired", c.converged(three))
	t.Logf("3 reconcilers converged %s after start", time.Since(start).Round(time.Millisecond))
	before := c.keys()
	for _, id := range three {
		assertShare(t, before, id, S, 3)
		if st := c.members[id].r.Stats(); st.Claims != countOf(before, id) || st.HandBacks != 0 || st.Lost != 0 {
			t.Errorf("%s after start: %+v, want %d claims and nothing else", id, st, countOf(before, id))
		}
	}

	four := append(slices.Clone(three), "coord-d")
	joined := time.Now()
	d := c.start("coord-d", four)
	c.setMembers(four, three...)
	testutil.Eventually(t, 5*time.Second, "four reconcilers own shards.Desired", c.converged(four))
	t.Logf("coord-d's share moved %s after it joined (settle 300 ms)", time.Since(joined).Round(time.Millisecond))
	after := c.keys()
	assertShare(t, after, "coord-d", S, 4)

	moved, handBacks := 0, 0
	for s := range S {
		if after[s] == before[s] {
			continue
		}
		moved++
		if after[s].Member != "coord-d" {
			t.Errorf("shard %d moved from %s to %s: only coord-d should gain", s, before[s].Member, after[s].Member)
		}
	}
	for _, id := range three {
		m := c.members[id]
		st := m.r.Stats()
		handBacks += st.HandBacks
		m.mu.Lock()
		if len(m.handBacks) != st.HandBacks {
			t.Errorf("%s: HandBack hook called %d times, %d hand-backs counted", id, len(m.handBacks), st.HandBacks)
		}
		m.mu.Unlock()
	}
	if st := d.r.Stats(); moved != countOf(after, "coord-d") || handBacks != moved || st.Claims != moved {
		t.Errorf("moved %d shards, coord-d owns %d and claimed %d, the others handed back %d", moved, countOf(after, "coord-d"), st.Claims, handBacks)
	}
	t.Logf("S=%d: 3 members own %d/%d/%d; with coord-d: %d/%d/%d/%d, %d moved", S,
		countOf(before, "coord-a"), countOf(before, "coord-b"), countOf(before, "coord-c"),
		countOf(after, "coord-a"), countOf(after, "coord-b"), countOf(after, "coord-c"), countOf(after, "coord-d"), moved)

	c.checker.CaughtUp(t, cli)
	creates, deletes := 0, 0
	for _, ev := range c.checker.EventsSince(start) {
		if ev.Create {
			creates++
		} else {
			deletes++
		}
	}
	if creates != S+moved || deletes != moved {
		t.Errorf("owner key events: %d creates, %d deletes; want %d and %d", creates, deletes, S+moved, moved)
	}
}

// TestReconcilerLeaseRevoked: when a member's lease is revoked (what
// suspicion does), its owner keys vanish at one revision, its reconciler
// drops every shard and returns shards.ErrLeaseGone, and the survivors claim its
// shards in rendezvous order (each goes to the next member in shards.Rank), while
// their own shards keep their epochs.
func TestReconcilerLeaseRevoked(t *testing.T) {
	cli := etcdtest.Start(t)
	const S = 64
	c := newCluster(t, cli, shards.Layout{Prefix: "/t/revoke", Count: S}, shards.ReconcilerConfig{Settle: 300 * time.Millisecond})
	three := []string{"coord-a", "coord-b", "coord-c"}
	for _, id := range three {
		c.start(id, three)
	}
	testutil.Eventually(t, 5*time.Second, "three reconcilers own shards.Desired", c.converged(three))
	before := c.keys()

	victim := c.members["coord-c"]
	survivors := three[:2]
	revoked := time.Now()
	if _, err := cli.Revoke(context.Background(), victim.sess.Lease()); err != nil {
		t.Fatal(err)
	}
	c.setMembers(survivors, survivors...) // the victim's member key went with its lease
	testutil.Eventually(t, 5*time.Second, "survivors own every shard", c.converged(survivors))
	t.Logf("revoke -> survivors own all %d shards: %s", S, time.Since(revoked).Round(time.Millisecond))

	select {
	case err := <-victim.done:
		victim.done <- err // for the cleanup
		if !errors.Is(err, shards.ErrLeaseGone) {
			t.Errorf("victim's Run returned %v, want shards.ErrLeaseGone", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("victim's Run still running 5 s after its lease was revoked")
	}
	if owned := victim.r.Owned(); len(owned) != 0 {
		t.Errorf("victim still owns %v", owned)
	}
	if st := victim.r.Stats(); st.Lost != countOf(before, "coord-c") {
		t.Errorf("victim lost %d shards, owned %d", st.Lost, countOf(before, "coord-c"))
	}
	after := c.keys()
	for s := range S {
		switch b := before[s]; {
		case b.Member == "coord-c":
			if next := shards.Rank(three, s, S)[1]; after[s].Member != next {
				t.Errorf("shard %d of coord-c went to %s, next in rendezvous order is %s", s, after[s].Member, next)
			}
		case after[s] != b:
			t.Errorf("shard %d of %s moved to %+v", s, b.Member, after[s])
		}
	}
}

// flapTime is how long flap takes.
const flapTime = 2 * time.Second

// flap toggles "coord-d" in and out of every member's list: joins and leaves
// 10 times in 2 s, ending out. It returns when the flapping started.
func flap(c *cluster, three []string) time.Time {
	four := append(slices.Clone(three), "coord-d")
	all := append(slices.Clone(three), "coord-d")
	began := time.Now()
	for range 10 {
		c.setMembers(four, all...)
		time.Sleep(100 * time.Millisecond) // the flapping itself is the input
		c.setMembers(three, all...)
		time.Sleep(100 * time.Millisecond)
	}
	return began
}

// TestReconcilerFlapRateLimited: with a short settle time (20 ms), a member
// that joins and leaves 10 times in 2 s does move shards, but no member hands
// back more than the token bucket allows (burst + rate x elapsed), every
// claim follows a hand-back, and no shard ever has two owners.
func TestReconcilerFlapRateLimited(t *testing.T) {
	cli := etcdtest.Start(t)
	const (
		S     = 64
		rate  = 8.0
		burst = 2
	)
	c := newCluster(t, cli, shards.Layout{Prefix: "/t/flap", Count: S}, shards.ReconcilerConfig{Settle: 20 * time.Millisecond, MovesPerSecond: rate, MoveBurst: burst})
	three := []string{"coord-a", "coord-b", "coord-c"}
	for _, id := range three {
		c.start(id, three)
	}
	c.start("coord-d", three)
	testutil.Eventually(t, 5*time.Second, "three reconcilers own shards.Desired", c.converged(three))
	c.checker.CaughtUp(t, cli)

	began := flap(c, three)
	// coord-d ends out: it hands its shards back, at its own rate.
	testutil.Eventually(t, 8*time.Second, "back to the three after the flapping", c.converged(three))
	elapsed := time.Since(began)
	c.checker.CaughtUp(t, cli)

	releases, claims, during := map[string]int{}, map[string]int{}, map[string]int{}
	for _, ev := range c.checker.EventsSince(began) {
		switch {
		case ev.Create:
			claims[ev.Member]++
		default:
			releases[ev.Member]++
			if ev.At.Before(began.Add(flapTime)) {
				during[ev.Member]++
			}
		}
	}
	// During the flapping itself, and from its start to the end.
	for id, n := range during {
		if limit := burst + int(rate*flapTime.Seconds()); n > limit {
			t.Errorf("%s handed back %d shards during the %s of flapping; the limit allows %d", id, n, flapTime, limit)
		}
	}
	allowed := burst + int(rate*elapsed.Seconds()+0.5)
	total := 0
	for _, id := range append(slices.Clone(three), "coord-d") {
		total += releases[id]
		if releases[id] > allowed {
			t.Errorf("%s handed back %d shards in %s; the limit allows %d", id, releases[id], elapsed.Round(time.Millisecond), allowed)
		}
		if st := c.members[id].r.Stats(); st.HandBacks != releases[id] || st.Lost != 0 {
			t.Errorf("%s: stats %+v, %d releases seen", id, st, releases[id])
		}
	}
	nClaims := 0
	for _, n := range claims {
		nClaims += n
	}
	if nClaims != total {
		t.Errorf("%d claims and %d hand-backs: every claim must follow a hand-back", nClaims, total)
	}
	if releases["coord-d"] == 0 {
		t.Error("coord-d never gained a shard: the flapping did not exercise the limit")
	}
	t.Logf("hand-backs during the %s of flapping: %v (limit %d each); until settled again %s later: %v (limit %d each), claims %v",
		flapTime, during, burst+int(rate*flapTime.Seconds()), elapsed.Round(time.Millisecond), releases, allowed, claims)
}

// TestReconcilerFlapSettle: with a settle time (1 s) longer than the
// flapper's stays (100 ms), the same flapping moves no shard at all.
func TestReconcilerFlapSettle(t *testing.T) {
	cli := etcdtest.Start(t)
	const S = 64
	c := newCluster(t, cli, shards.Layout{Prefix: "/t/settle", Count: S}, shards.ReconcilerConfig{Settle: time.Second, MovesPerSecond: 1000, MoveBurst: S})
	three := []string{"coord-a", "coord-b", "coord-c"}
	for _, id := range three {
		c.start(id, three)
	}
	c.start("coord-d", three)
	testutil.Eventually(t, 5*time.Second, "three reconcilers own shards.Desired", c.converged(three))
	before := c.keys()
	c.checker.CaughtUp(t, cli)
	began := flap(c, three)
	c.checker.CaughtUp(t, cli)
	if evs := c.checker.EventsSince(began); len(evs) != 0 {
		t.Errorf("flapping faster than the settle time moved shards: %d owner key events, first %+v", len(evs), evs[0])
	}
	if after := c.keys(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Error("owner keys changed during the flapping")
	}
}

// TestNewReconcilerValidation: each bad field is named with its rule.
func TestNewReconcilerValidation(t *testing.T) {
	cli := etcdtest.Start(t)
	l := shards.Layout{Prefix: "/t/v", Count: 8}
	lresp, err := cli.Grant(context.Background(), 30)
	if err != nil {
		t.Fatal(err)
	}
	lease := lresp.ID
	ok := shards.ReconcilerConfig{Client: cli, Layout: l, ID: "a", Lease: lease, Members: make(chan []string)}
	for _, tc := range []struct {
		edit func(*shards.ReconcilerConfig)
		want []string
	}{
		{func(c *shards.ReconcilerConfig) { c.Members = nil }, []string{"members", "nil"}},
		{func(c *shards.ReconcilerConfig) { c.Settle = -1 }, []string{"settle", ">= 0"}},
		{func(c *shards.ReconcilerConfig) { c.MovesPerSecond = -1 }, []string{"moves per second", ">= 0"}},
		{func(c *shards.ReconcilerConfig) { c.MoveBurst = -1 }, []string{"move burst", ">= 0"}},
		{func(c *shards.ReconcilerConfig) { c.HandBackTimeout = -1 }, []string{"hand-back timeout", ">= 0"}},
		{func(c *shards.ReconcilerConfig) { c.ID = "" }, []string{"id", "non-empty"}},
		{func(c *shards.ReconcilerConfig) { c.Lease = clientv3.NoLease }, []string{"lease"}},
		{func(c *shards.ReconcilerConfig) { c.Layout.Count = 0 }, []string{"shard count", "1..65536"}},
	} {
		cfg := ok
		tc.edit(&cfg)
		_, err := shards.NewReconciler(cfg)
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("error %v, want it to name %v", err, tc.want)
				break
			}
		}
	}
	if _, err := shards.NewReconciler(ok); err != nil {
		t.Fatal(err)
	}
}

// TestReconcilerHandBackError: a HandBack that fails keeps the shard (the
// old owner still owns it, nobody else claims it) and is retried until it
// succeeds; then the shard moves.
func TestReconcilerHandBackError(t *testing.T) {
	cli := etcdtest.Start(t)
	const S = 16
	c := newCluster(t, cli, shards.Layout{Prefix: "/t/hberr", Count: S}, shards.ReconcilerConfig{Settle: 50 * time.Millisecond})
	// coord-a's hook refuses its first 3 calls.
	refused := 0
	c.refuse = func(id string, s int) error {
		if id != "coord-a" || refused == 3 {
			return nil
		}
		refused++
		return errors.New("plan in flight")
	}
	a := c.start("coord-a", []string{"coord-a"})
	testutil.Eventually(t, 5*time.Second, "coord-a owns every shard", c.converged([]string{"coord-a"}))

	both := []string{"coord-a", "coord-b"}
	c.start("coord-b", both)
	c.setMembers(both, "coord-a")
	testutil.Eventually(t, 5*time.Second, "two reconcilers own shards.Desired", c.converged(both))
	if st := a.r.Stats(); st.HandBackErrors != 3 || st.HandBacks != countOf(c.keys(), "coord-b") {
		t.Errorf("coord-a: %+v, want 3 hand-back errors and %d hand-backs", st, countOf(c.keys(), "coord-b"))
	}
}

// TestReconcilersDisagree: two members whose member lists disagree (each
// sees only itself, as in a partitioned gossip view) both want every shard
// at once. Create-if-absent lets exactly one win each shard, at every
// revision; once their lists agree they converge on shards.Desired.
func TestReconcilersDisagree(t *testing.T) {
	cli := etcdtest.Start(t)
	const S = 256
	c := newCluster(t, cli, shards.Layout{Prefix: "/t/disagree", Count: S}, shards.ReconcilerConfig{Settle: 50 * time.Millisecond, MovesPerSecond: 1000, MoveBurst: S})
	c.start("coord-a", []string{"coord-a"})
	c.start("coord-b", []string{"coord-b"})
	testutil.Eventually(t, 5*time.Second, "every shard owned", func() error {
		if n := len(c.keys()); n != S {
			return fmt.Errorf("%d of %d shards owned", n, S)
		}
		return nil
	})
	split := c.keys()
	t.Logf("with disagreeing lists: coord-a won %d shards, coord-b %d", countOf(split, "coord-a"), countOf(split, "coord-b"))
	both := []string{"coord-a", "coord-b"}
	c.setMembers(both, both...)
	testutil.Eventually(t, 5*time.Second, "both own shards.Desired", c.converged(both))
	c.checker.CaughtUp(t, cli)
}
