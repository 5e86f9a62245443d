package regional

// Defragmentation of the embedded etcd member's backend. etcd's
// compaction (EtcdConfig.CompactionRetention, periodic) frees the pages of
// old revisions inside the bbolt file but never shrinks the file: the free
// pages count against the quota (EtcdConfig.QuotaBytes) until a
// defragmentation rewrites the file. A defragmentation blocks the member
// for its whole run (no reads, writes or applies on it; about a second per
// few hundred MiB), so each coordinator with a member runs it on its own
// member only, rarely, and never while another member of the region runs
// one:
//
//   - at most once per DefragInterval (default 1 h; the first check one
//     interval after the etcd part started), and only when the free pages
//     (DbSize - DbSizeInUse, etcd's Status) are at least
//     DefragMinFreeFraction of the file (default 25%) and at least
//     DefragMinFreeBytes (default 64 MiB);
//   - with other members, only when every other member answers Status on
//     its client URL (a member that is down already costs the margin the
//     defragmentation would use: with 3 members, one down and one
//     defragmenting leaves no quorum);
//   - one member at a time: the member first puts store.KeyDefragLock with
//     its name, under a lease of defragLockTTL, only if the key is absent
//     (a Txn comparing its CreateRevision with 0), and revokes the lease
//     when done; a coordinator that dies mid-way leaves the lock for at
//     most defragLockTTL;
//   - a member that is the raft leader hands leadership to a healthy
//     follower first (etcd's MoveLeader), so that the region keeps a
//     leader that answers while it defragments.
//
// Client-only coordinators (EtcdConfig.Endpoints) own no member and never
// defragment. Every defragmentation is logged (sizes before and after, how
// long it took) and counted in MetricEtcdDefrags. The same idea as
// etcd's own guidance (defragment one member at a time) and the
// etcd-defrag tool's thresholds (a rule on free space before defragmenting).

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/etcdserver"
	"go.uber.org/zap"

	"apiary.dev/apiary/internal/telemetry"
	"apiary.dev/apiary/regional/store"
)

// Defragmentation defaults (EtcdConfig.DefragInterval,
// DefragMinFreeFraction, DefragMinFreeBytes).
const (
	DefaultDefragInterval        = time.Hour
	DefaultDefragMinFreeFraction = 0.25
	DefaultDefragMinFreeBytes    = 64 << 20
)

// MetricEtcdDefrags counts the defragmentations of the coordinator's own
// member, by result ("ok", "error").
const MetricEtcdDefrags = "apiary_etcd_defrags_total"

const (
	// defragCheckEvery is how often the loop looks at the member's
	// Status (never more often than the interval).
	defragCheckEvery = time.Minute
	// defragLockTTL bounds how long a dead coordinator's lock stays.
	defragLockTTL = 10 * time.Minute
	// defragProbeTimeout bounds each other member's Status probe and the
	// leadership transfer.
	defragProbeTimeout = 3 * time.Second
)

// defragger is the defragmentation loop of one embedded member.
type defragger struct {
	cli      *clientv3.Client // the member's in-process client
	srv      *etcdserver.EtcdServer
	name     string
	interval time.Duration
	minFrac  float64
	minBytes int64
	peerTLS  *tls.Config // to probe the other members' client URLs (nil: plaintext)
	log      *slog.Logger
	count    *prometheus.CounterVec // nil: not counted
	last     time.Time              // last defragmentation (or the loop's start)
}

// newDefragger is the loop of the member srv (cli its in-process client)
// with c's settings; nil when DefragInterval is negative (off).
func newDefragger(c EtcdConfig, srv *etcdserver.EtcdServer, cli *clientv3.Client, peerTLS *tls.Config, reg prometheus.Registerer, log *slog.Logger) *defragger {
	if c.DefragInterval < 0 {
		return nil
	}
	d := &defragger{cli: cli, srv: srv, name: c.Name, interval: c.DefragInterval, minFrac: c.DefragMinFreeFraction,
		minBytes: c.DefragMinFreeBytes, peerTLS: peerTLS, log: log}
	if d.interval == 0 {
		d.interval = DefaultDefragInterval
	}
	if d.minFrac == 0 {
		d.minFrac = DefaultDefragMinFreeFraction
	}
	if d.minBytes == 0 {
		d.minBytes = DefaultDefragMinFreeBytes
	}
	if reg != nil {
		cv := prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricEtcdDefrags,
			Help: "Defragmentations of this coordinator's embedded etcd member, by result (ok, error)."}, []string{"result"})
		if cv, err := telemetry.RegisterCounterVec(reg, cv); err == nil {
			d.count = cv
		} else {
			log.Warn("etcd defrag: counter not registered; defragmentations are logged only", "metric", MetricEtcdDefrags, "err", err)
		}
	}
	return d
}

// run checks every defragCheckEvery (or interval, if shorter) until ctx
// ends; the first defragmentation comes one interval after the start.
func (d *defragger) run(ctx context.Context) {
	d.last = time.Now()
	t := time.NewTicker(min(d.interval, defragCheckEvery))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := d.step(ctx, time.Now()); err != nil && ctx.Err() == nil {
			d.log.Warn("etcd defrag: failed; tried again at a later check", "member", d.name, "err", err)
		}
	}
}

// defragOutcome is what one step did.
type defragOutcome struct {
	// Done: the member was defragmented; Skip says why not otherwise.
	Done bool
	Skip string
	// Before and After are the backend file's size (bytes) before and
	// after; InUse the part in use before.
	Before, After, InUse int64
	Took                 time.Duration
}

// step is one check at now: it defragments the member if the rules of this
// file allow it, and says what it did. An error is a failed Status, lock
// or defragmentation (counted as "error" when the defragmentation itself
// failed).
func (d *defragger) step(ctx context.Context, now time.Time) (defragOutcome, error) {
	var out defragOutcome
	if !d.last.IsZero() && now.Sub(d.last) < d.interval {
		out.Skip = fmt.Sprintf("last defragmentation %s ago (at most one per %s)", now.Sub(d.last).Round(time.Second), d.interval)
		return out, nil
	}
	st, err := d.status(ctx)
	if err != nil {
		return out, err
	}
	out.Before, out.InUse = st.DbSize, st.DbSizeInUse
	free := st.DbSize - st.DbSizeInUse
	if free < d.minBytes || float64(free) < d.minFrac*float64(st.DbSize) {
		out.Skip = fmt.Sprintf("%d of %d bytes free: below %d bytes or %.0f%%", free, st.DbSize, d.minBytes, 100*d.minFrac)
		return out, nil
	}
	if why := d.othersReady(ctx); why != "" {
		out.Skip = why
		d.log.Info("etcd defrag: not now", "member", d.name, "why", why)
		return out, nil
	}
	lease, holder, err := d.lock(ctx)
	if err != nil {
		return out, err
	}
	if lease == 0 {
		out.Skip = fmt.Sprintf("member %s is defragmenting (%s)", holder, store.KeyDefragLock)
		return out, nil
	}
	defer d.unlock(lease)
	// The server's own Defragment (not the in-process client's: its
	// maintenance server has no health notifier and panics). It cannot be
	// cancelled; the lock's lease outlives it by far (about a second per
	// few hundred MiB).
	start := time.Now()
	err = d.srv.Defragment()
	out.Took = time.Since(start)
	d.last = now
	if err != nil {
		d.inc("error")
		return out, fmt.Errorf("defragment member %s: %w", d.name, err)
	}
	out.Done = true
	d.inc("ok")
	if st, err := d.status(ctx); err == nil {
		out.After = st.DbSize
	}
	d.log.Info("etcd defrag: member defragmented", "member", d.name, "size_before", out.Before, "in_use_before", out.InUse,
		"size_after", out.After, "took", out.Took.Round(time.Millisecond).String())
	return out, nil
}

func (d *defragger) inc(result string) {
	if d.count != nil {
		d.count.WithLabelValues(result).Inc()
	}
}

func (d *defragger) status(ctx context.Context) (*clientv3.StatusResponse, error) {
	sctx, cancel := context.WithTimeout(ctx, defragProbeTimeout)
	defer cancel()
	st, err := d.cli.Status(sctx, "")
	if err != nil {
		return nil, fmt.Errorf("status of member %s: %w", d.name, err)
	}
	return st, nil
}

// othersReady is "" when every other voting member answers Status on one
// of its client URLs, and, if this member leads, leadership moved to one
// of them; else why not.
func (d *defragger) othersReady(ctx context.Context) string {
	self := d.srv.MemberID()
	var ready []uint64
	for _, m := range d.srv.Cluster().Members() {
		if m.ID == self {
			continue
		}
		if m.IsLearner || len(m.ClientURLs) == 0 {
			return fmt.Sprintf("member %s is a learner or has not published its client URLs", m.Name)
		}
		if err := d.probe(ctx, m.ClientURLs); err != nil {
			return fmt.Sprintf("member %s does not answer (%v): one member down and one defragmenting could cost the quorum", m.Name, err)
		}
		ready = append(ready, uint64(m.ID))
	}
	if len(ready) == 0 || d.srv.Leader() != self {
		return ""
	}
	slices.Sort(ready)
	mctx, cancel := context.WithTimeout(ctx, defragProbeTimeout)
	defer cancel()
	if err := d.srv.MoveLeader(mctx, uint64(self), ready[0]); err != nil {
		return fmt.Sprintf("this member leads and could not hand leadership over (%v)", err)
	}
	d.log.Info("etcd defrag: moved raft leadership before defragmenting", "member", d.name, "to", fmt.Sprintf("%x", ready[0]))
	return ""
}

// probe asks one of urls for Status within defragProbeTimeout.
func (d *defragger) probe(ctx context.Context, urls []string) error {
	pctx, cancel := context.WithTimeout(ctx, defragProbeTimeout)
	defer cancel()
	cli, err := clientv3.New(clientv3.Config{Endpoints: urls, DialTimeout: defragProbeTimeout, TLS: d.peerTLS, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	var last error
	for _, u := range urls {
		if _, last = cli.Status(pctx, u); last == nil {
			return nil
		}
	}
	return last
}

// lock takes store.KeyDefragLock under a new lease of defragLockTTL:
// the lease, or 0 and the holder's name when another member holds it.
func (d *defragger) lock(ctx context.Context) (clientv3.LeaseID, string, error) {
	lctx, cancel := store.EtcdCtx(ctx)
	defer cancel()
	l, err := d.cli.Grant(lctx, int64(defragLockTTL/time.Second))
	if err != nil {
		return 0, "", fmt.Errorf("defrag lock: %w", err)
	}
	resp, err := d.cli.Txn(lctx).If(clientv3.Compare(clientv3.CreateRevision(store.KeyDefragLock), "=", 0)).
		Then(clientv3.OpPut(store.KeyDefragLock, d.name, clientv3.WithLease(l.ID))).
		Else(clientv3.OpGet(store.KeyDefragLock)).Commit()
	if err == nil && resp.Succeeded {
		return l.ID, "", nil
	}
	d.unlock(l.ID)
	if err != nil {
		return 0, "", fmt.Errorf("defrag lock: %w", err)
	}
	holder := "?"
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		holder = string(kvs[0].Value)
	}
	return 0, holder, nil
}

// unlock revokes the lock's lease (the key goes with it); on failure the
// lease ends by itself within defragLockTTL.
func (d *defragger) unlock(lease clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), defragProbeTimeout)
	defer cancel()
	if _, err := d.cli.Revoke(ctx, lease); err != nil && !errors.Is(err, context.Canceled) {
		d.log.Warn("etcd defrag: could not release the lock; it ends with its lease", "key", store.KeyDefragLock, "ttl", defragLockTTL.String(), "err", err)
	}
}
