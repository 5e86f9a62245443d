package shards

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Defaults of ReconcilerConfig.
const (
	// DefaultSettle is how long a member must stay in the live set before
	// shards move to it.
	DefaultSettle = 2 * time.Second
	// DefaultMovesPerSecond bounds a member's hand-backs per second.
	DefaultMovesPerSecond = 128
	// DefaultMoveBurst is the hand-backs a member may make at once.
	DefaultMoveBurst = 32
	// DefaultHandBackTimeout bounds one HandBack call.
	DefaultHandBackTimeout = 5 * time.Second
	// etcdTimeout bounds each claim and release attempt: a call sent to a
	// raft leader that just died or froze waits until it times out (a
	// call without a deadline blocks about 7 s), while a new leader is
	// there within about a second; a short attempt and the next step's
	// retry reach it (claims and releases are safe to repeat). A 5 s bound
	// once left a dead coordinator's shards unclaimed for 5 s behind one
	// stuck release (TestLANDeposesPausedOwner in a clean-clone CI run).
	etcdTimeout = time.Second
	// retryDelay is the pause before retrying a failed claim, release or
	// hand-back.
	retryDelay = 100 * time.Millisecond
)

// ReconcilerConfig configures one member's reconciler.
type ReconcilerConfig struct {
	// Client is the member's etcd client.
	Client *clientv3.Client
	// Layout names the owner keys (prefix and shard count).
	Layout Layout
	// ID is this member's id, as it appears in Members and as the value of
	// the owner keys it creates.
	ID string
	// Lease is the member's lease: every owner key it creates lives under
	// it. Use the lease of the member's presence key, so that losing it
	// (expiry, or a revoke on suspicion) drops the member from the live set
	// and all its shards at one revision.
	Lease clientv3.LeaseID
	// LeaseDone, if set, is closed when Lease is gone
	// (concurrency.Session.Done): Run then returns ErrLeaseGone at once.
	LeaseDone <-chan struct{}
	// Members delivers the live member set, whole, each time it changes;
	// the latest list wins (order and duplicates do not matter). The list
	// must hold ID for this member to own anything, and must drop a dead
	// member for the others to take its shards. Required.
	Members <-chan []string
	// HandBack is called before a shard is released to the member it is
	// desired for: it must stop the shard's work and finish or abandon its
	// in-flight plans, and return only when nothing more will be written
	// for the shard. An error keeps the shard (retried later). May be nil.
	HandBack func(ctx context.Context, s int) error
	// OnChange, if set, is called from Run's goroutine with a copy of the
	// owned shards and their epochs each time the set changes (a claim, a
	// hand-back, a loss). It must not block for long.
	OnChange func(owned map[int]Epoch)
	// Owners, if set, is the owners view Run uses (so that one view serves
	// the reconciler and the coordinator's admin API); by default Run
	// starts its own.
	Owners *Owners
	// Settle is how long a member must be in the live set before shards
	// move to it (default DefaultSettle). Members in the first list Run
	// receives count as settled: a restarting member does not wait for
	// peers that were already there. A member that leaves and comes back
	// starts again, so a member flapping faster than Settle gains nothing.
	Settle time.Duration
	// MovesPerSecond and MoveBurst rate-limit this member's hand-backs (a
	// token bucket; defaults DefaultMovesPerSecond, DefaultMoveBurst).
	// Claims of unowned shards are not limited: delaying them would only
	// lengthen the pause of the shards nobody owns, and every claim of a
	// live member's shard follows one of that member's limited hand-backs.
	MovesPerSecond float64
	MoveBurst      int
	// HandBackTimeout bounds one HandBack call (default
	// DefaultHandBackTimeout).
	HandBackTimeout time.Duration
	// Log receives claims, hand-backs and losses (default: discarded).
	Log *slog.Logger
}

// ReconcilerStats counts a reconciler's moves since it started.
type ReconcilerStats struct {
	// Claims is the shards claimed.
	Claims int
	// HandBacks is the shards handed back (HandBack returned nil).
	HandBacks int
	// HandBackErrors is the HandBack calls that failed (the shard was kept).
	HandBackErrors int
	// Lost is the shards whose owner key went away without a hand-back
	// (lease expired or revoked, key deleted by someone else).
	Lost int
}

// Reconciler is the loop each coordinator runs to converge its shard
// ownership on the desired assignment (Desired of the settled live members):
// it claims the unowned shards desired for it, hands back the shards it owns
// that are desired for another member, and never claims a shard someone else
// owns: it waits until that owner key is deleted (a hand-back, a lapsed or
// revoked lease). Create-if-absent claims make two owners of one shard
// impossible at any revision; the new owner's epoch is above the old key's
// delete. The conflict model is Omega's shared state: every member acts on
// its own view, and etcd's compare decides.
type Reconciler struct {
	cfg     ReconcilerConfig
	claimer *Claimer
	log     *slog.Logger

	mu    sync.Mutex
	owned map[int]Epoch
	stats ReconcilerStats

	// Used by Run's goroutine only.
	seen      map[string]time.Time // member -> when it (re)joined the set
	releasing map[int]Epoch        // handed back, release not yet confirmed
	bucket    tokenBucket
}

// NewReconciler checks cfg (errors name the field and its rule) and returns
// a reconciler ready to Run.
func NewReconciler(cfg ReconcilerConfig) (*Reconciler, error) {
	claimer, err := NewClaimer(cfg.Client, cfg.Layout, cfg.ID, cfg.Lease)
	if err != nil {
		return nil, err
	}
	switch {
	case cfg.Members == nil:
		return nil, errors.New("members: must be a channel of the live member set, got nil")
	case cfg.Settle < 0:
		return nil, fmt.Errorf("settle: must be >= 0, got %s", cfg.Settle)
	case cfg.MovesPerSecond < 0:
		return nil, fmt.Errorf("moves per second: must be >= 0, got %g", cfg.MovesPerSecond)
	case cfg.MoveBurst < 0:
		return nil, fmt.Errorf("move burst: must be >= 0, got %d", cfg.MoveBurst)
	case cfg.HandBackTimeout < 0:
		return nil, fmt.Errorf("hand-back timeout: must be >= 0, got %s", cfg.HandBackTimeout)
	case cfg.Owners != nil && cfg.Owners.layout != cfg.Layout:
		return nil, fmt.Errorf("owners: view of %+v, reconciler of %+v", cfg.Owners.layout, cfg.Layout)
	}
	if cfg.Settle == 0 {
		cfg.Settle = DefaultSettle
	}
	if cfg.MovesPerSecond == 0 {
		cfg.MovesPerSecond = DefaultMovesPerSecond
	}
	if cfg.MoveBurst == 0 {
		cfg.MoveBurst = DefaultMoveBurst
	}
	if cfg.HandBackTimeout == 0 {
		cfg.HandBackTimeout = DefaultHandBackTimeout
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Reconciler{
		cfg: cfg, claimer: claimer, log: log.With("member", cfg.ID),
		owned: map[int]Epoch{}, releasing: map[int]Epoch{},
		bucket: tokenBucket{rate: cfg.MovesPerSecond, burst: float64(cfg.MoveBurst), tokens: float64(cfg.MoveBurst)},
	}, nil
}

// Owned returns a copy of the shards this member owns, with their epochs. A
// shard leaves the set when HandBack for it has returned nil (before the
// release commits) or when its owner key is found gone.
func (r *Reconciler) Owned() map[int]Epoch {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.owned)
}

// Stats returns the reconciler's counters.
func (r *Reconciler) Stats() ReconcilerStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats
}

// Claimer is the reconciler's claimer (for Fence).
func (r *Reconciler) Claimer() *Claimer { return r.claimer }

// Run reconciles until ctx ends (it returns nil) or the lease is gone (it
// returns ErrLeaseGone, with every shard dropped). It does not release the
// shards when ctx ends: to hand them all over at once, stop their work and
// revoke the lease (concurrency.Session.Close). Run must be called once.
func (r *Reconciler) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	owners := r.cfg.Owners
	if owners == nil {
		var err error
		if owners, err = WatchOwners(ctx, r.cfg.Client, r.cfg.Layout); err != nil {
			return err
		}
	}
	var (
		membersCh = r.cfg.Members
		members   []string // latest list received
		haveList  bool
		eff       []string // settled members the desired assignment is for
		desired   = Desired(nil, r.cfg.Layout.Count)
	)
	for {
		now := time.Now()
		if haveList {
			r.observe(members, now)
		}
		next, settleWait := r.effective(now)
		if !slices.Equal(next, eff) {
			eff = next
			desired = Desired(eff, r.cfg.Layout.Count)
			r.log.Debug("desired assignment", "settled members", strings.Join(eff, ","))
		}
		snap := owners.Snapshot()
		wait, err := r.step(ctx, desired, snap)
		if err != nil {
			r.dropAll()
			return err
		}

		timer := time.NewTimer(min(wait, settleWait))
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-r.cfg.LeaseDone:
			timer.Stop()
			r.dropAll()
			return ErrLeaseGone
		case ms, ok := <-membersCh:
			if !ok {
				membersCh = nil // no more updates: keep the last list
			} else {
				members, haveList = ms, true
			}
		case <-snap.Changed:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// observe updates when each member joined the set.
func (r *Reconciler) observe(list []string, now time.Time) {
	ms := normalize(list)
	if r.seen == nil {
		r.seen = make(map[string]time.Time, len(ms))
		for _, m := range ms {
			r.seen[m] = now.Add(-r.cfg.Settle)
		}
		return
	}
	for _, m := range ms {
		if _, ok := r.seen[m]; !ok {
			r.seen[m] = now
		}
	}
	for m := range r.seen {
		if _, ok := slices.BinarySearch(ms, m); !ok {
			delete(r.seen, m)
		}
	}
}

// effective returns the settled members, sorted, and how long until the next
// one settles (a long time if none is pending).
func (r *Reconciler) effective(now time.Time) ([]string, time.Duration) {
	wait := time.Hour
	var eff []string
	for m, since := range r.seen {
		if age := now.Sub(since); age >= r.cfg.Settle {
			eff = append(eff, m)
		} else {
			wait = min(wait, r.cfg.Settle-age)
		}
	}
	slices.Sort(eff)
	return eff, wait
}

// step does one round against snap: drop lost shards, retry pending
// releases, claim, hand back. wait is when to run again at the latest (a
// retry, or the next hand-back token); err is ErrLeaseGone.
func (r *Reconciler) step(ctx context.Context, desired []string, snap Snapshot) (wait time.Duration, err error) {
	id := r.cfg.ID
	wait = time.Hour

	// Shards whose key is gone (or another's) in a view that has seen our
	// claim are lost: the lease lapsed or was revoked.
	r.mu.Lock()
	lost := 0
	for s, e := range r.owned {
		if snap.Rev < int64(e) {
			continue // the view has not caught up with our claim yet
		}
		if o, ok := snap.Owners[s]; !ok || o.Epoch != e {
			delete(r.owned, s)
			lost++
			r.log.Warn("shard lost", "shard", s, "epoch", e)
		}
	}
	r.stats.Lost += lost
	r.mu.Unlock()
	if lost > 0 {
		r.notify()
	}

	for s, e := range r.releasing {
		if ctx.Err() != nil {
			return wait, nil
		}
		if err := r.release(ctx, s, e); err != nil {
			wait = retryDelay
		}
	}

	var want []int
	for s, d := range desired {
		if d != id || ctx.Err() != nil {
			continue
		}
		r.mu.Lock()
		_, mine := r.owned[s]
		r.mu.Unlock()
		_, pending := r.releasing[s]
		if _, taken := snap.Owners[s]; mine || pending || taken {
			continue
		}
		want = append(want, s)
	}
	// Claim in batches (one Txn each), publishing each batch at once, so
	// that a takeover of many shards costs a few commits.
	claimed := 0
	for len(want) > 0 && ctx.Err() == nil {
		batch := want[:min(len(want), MaxClaimBatch)]
		want = want[len(batch):]
		cctx, cancel := context.WithTimeout(ctx, etcdTimeout)
		got, _, err := r.claimer.ClaimMany(cctx, batch)
		cancel()
		switch {
		case err == nil:
			// Shards another holds: the view is behind; its next change
			// wakes us.
			r.mu.Lock()
			for s, e := range got {
				r.owned[s] = e
			}
			r.stats.Claims += len(got)
			r.mu.Unlock()
			claimed += len(got)
			if len(got) > 0 {
				r.log.Debug("shards claimed", "count", len(got))
				r.notify()
			}
		case errors.Is(err, ErrLeaseGone):
			return wait, err
		default:
			if ctx.Err() == nil {
				r.log.Warn("claim failed", "shards", len(batch), "err", err)
				wait = retryDelay
			}
		}
	}
	if claimed > 0 {
		r.log.Info("shards claimed", "count", claimed)
	}

	// Hand back, rate-limited, the shards desired for another settled
	// member (never to nobody: with no settled member, keep them).
	for _, s := range slices.Sorted(maps.Keys(r.Owned())) {
		d := desired[s]
		if d == "" || d == id || ctx.Err() != nil {
			continue
		}
		if now := time.Now(); !r.bucket.take(now) {
			return min(wait, r.bucket.wait(now)), nil
		}
		if err := r.handBack(ctx, s); err != nil {
			wait = retryDelay
		}
	}
	return wait, nil
}

// handBack runs the HandBack hook for s, drops s, and releases it.
func (r *Reconciler) handBack(ctx context.Context, s int) error {
	r.mu.Lock()
	e, ok := r.owned[s]
	r.mu.Unlock()
	if !ok {
		return nil
	}
	if r.cfg.HandBack != nil {
		hctx, cancel := context.WithTimeout(ctx, r.cfg.HandBackTimeout)
		err := r.cfg.HandBack(hctx, s)
		cancel()
		if err != nil {
			r.mu.Lock()
			r.stats.HandBackErrors++
			r.mu.Unlock()
			r.log.Warn("hand-back failed, shard kept", "shard", s, "epoch", e, "err", err)
			return err
		}
	}
	r.mu.Lock()
	delete(r.owned, s)
	r.stats.HandBacks++
	r.mu.Unlock()
	r.notify()
	r.log.Debug("shard handed back", "shard", s, "epoch", e)
	r.releasing[s] = e
	return r.release(ctx, s, e)
}

// release deletes a handed-back shard's key; a key already gone counts as
// released.
func (r *Reconciler) release(ctx context.Context, s int, e Epoch) error {
	rctx, cancel := context.WithTimeout(ctx, etcdTimeout)
	err := r.claimer.Release(rctx, s, e)
	cancel()
	if err == nil || errors.Is(err, ErrNotOwner) {
		delete(r.releasing, s)
		return nil
	}
	r.log.Warn("release failed, will retry", "shard", s, "epoch", e, "err", err)
	return err
}

func (r *Reconciler) dropAll() {
	r.mu.Lock()
	n := len(r.owned)
	r.stats.Lost += n
	clear(r.owned)
	r.mu.Unlock()
	clear(r.releasing)
	if n > 0 {
		r.log.Warn("lease gone, all shards dropped", "count", n)
		r.notify()
	}
}

func (r *Reconciler) notify() {
	if r.cfg.OnChange != nil {
		r.cfg.OnChange(r.Owned())
	}
}

// tokenBucket allows rate events per second on average and burst at once.
type tokenBucket struct {
	rate, burst, tokens float64
	last                time.Time
}

func (b *tokenBucket) refill(now time.Time) {
	if !b.last.IsZero() {
		b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	}
	b.last = now
}

// take spends a token if one is there.
func (b *tokenBucket) take(now time.Time) bool {
	b.refill(now)
	if b.tokens >= 1 {
		b.tokens--
		return true
	}
	return false
}

// wait is how long until the next token.
func (b *tokenBucket) wait(now time.Time) time.Duration {
	b.refill(now)
	if b.tokens >= 1 {
		return 0
	}
	return time.Duration((1 - b.tokens) / b.rate * float64(time.Second))
}
