package failover

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/serf/serf"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/federation"
	"apiary.dev/apiary/internal/ids"
	"apiary.dev/apiary/internal/jobspec"
	"apiary.dev/apiary/internal/sovereignty"
	"apiary.dev/apiary/regional/store"
)

// DefaultAfter is failover.after for a job that leaves it 0 in a region
// whose --failover-after is unset.
const DefaultAfter = 30 * time.Second

// MaxStandbys is how many standby regions hold a failover job's spec.
const MaxStandbys = 2

// Timing of the loops (a var for tests that need none changed).
var (
	probeEvery    = 500 * time.Millisecond
	probeTimeout  = 400 * time.Millisecond
	putTimeout    = 3 * time.Second
	pushEvery     = 200 * time.Millisecond
	activateEvery = 250 * time.Millisecond
	movedEvery    = 250 * time.Millisecond
	// claimStagger delays each later standby's activation (activateDue).
	claimStagger = 2 * time.Second
	// poolSettle: how long a WAN member must have seen other regions
	// before a home it does not see at all counts as down.
	poolSettle = 3 * time.Second
)

// Config is what a coordinator gives its failover manager.
type Config struct {
	Meta    store.MetaRecord
	CoordID string
	Policy  *sovereignty.Policy
	// DefaultAfter is the region's --failover-after: failover.after for
	// jobs that leave it 0, and, when > 0, failover for jobs without a
	// failover block. 0: only jobs with a failover block fail over, after
	// DefaultAfter (the package's).
	DefaultAfter time.Duration
	// Peers is the region's --failover-peers: the regions its jobs may
	// fail over to (empty: every eligible region).
	Peers  []string
	Client *clientv3.Client
	// Serf is the coordinator's WAN member (nil: no pool, and no failover).
	Serf func() *serf.Serf
	// Lease is the coordinator's current member session lease (0: none).
	Lease func() clientv3.LeaseID
	// MayRun is the region's own admission of a job it would run (its
	// sovereignty policy and labels: the check a submission passes); a
	// standby record that fails it is refused.
	MayRun func(*apiaryv1.JobSpec) (*store.WhereRecord, error)
	// Dial connects to a coordinator of region at addr (mTLS when on).
	Dial func(region, addr string) (*grpc.ClientConn, error)
	// Retry runs a Txn with the coordinator's per-attempt deadlines.
	Retry func(ctx context.Context, build func(context.Context) (*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error)
	Log   *slog.Logger
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// Manager is a coordinator's failover manager: the home side and the
// standby side of every failover job of the region.
type Manager struct {
	cfg Config

	mu      sync.Mutex
	conns   map[string]*grpc.ClientConn // by API address
	answers map[string]bool             // API address -> its last probe answered
	// downSince: since when each region has been seen down (zero: up).
	downSince map[string]time.Time
	// answered: per standby region, the start of this region's lease on
	// its failover jobs from that region's last MovedJobs answer: the
	// call's start minus how long a majority there had seen this region
	// down (Hold).
	answered map[string]time.Time
	// claimed: per standby region, this region's jobs another standby
	// claimed there (job id -> claimer): held until the claimer says they
	// moved.
	claimed map[string]map[string]string
	// seenDown: per other region, whether its last MovedJobs answer said
	// it sees this region down (recordAnswer logs the changes).
	seenDown map[string]bool
	// acks: per standby region, the jobs of its last answer this region
	// marked MOVED, acknowledged on the next MovedJobs call.
	acks map[string][]string
	// observed: the observation this coordinator last wrote per region
	// (down since, ms; 0: none) under observedLease (observe writes only
	// changes).
	observed      map[string]int64
	observedLease clientv3.LeaseID
	// pending progress per standby region.
	queue map[string]*batch
	// asking: regions with a MovedJobs call in flight; wg waits for them.
	asking map[string]bool
	wg     sync.WaitGroup
	// joinedAt: when the WAN view first held another region.
	joinedAt time.Time
	// moved: jobs of this region that a standby activated (markMoved).
	moved map[string]movedMark
	// releasing: jobs with a release of a claim left behind in flight;
	// released: jobs whose claimer released them (job id -> claimer).
	releasing map[string]bool
	released  map[string]string
	// tomb: the lease of the tombstones written now, granted at tombAt.
	tomb   clientv3.LeaseID
	tombAt time.Time
}

type batch struct {
	done  []*apiaryv1.TaskDone
	ended []string
}

// New returns a manager; Run runs its loops.
func New(cfg Config) *Manager {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Manager{cfg: cfg, conns: map[string]*grpc.ClientConn{}, answers: map[string]bool{},
		downSince: map[string]time.Time{}, answered: map[string]time.Time{}, claimed: map[string]map[string]string{}, acks: map[string][]string{}, seenDown: map[string]bool{}, observed: map[string]int64{}, queue: map[string]*batch{}}
}

// Regions is the federation as this coordinator sees it: the WAN pool's
// members, a region up when a coordinator of it is alive and answered its
// last health probe (federation.BuildRegions).
func (m *Manager) Regions() []federation.Region {
	s := m.serf()
	if s == nil {
		return nil
	}
	m.mu.Lock()
	ans := make(map[string]bool, len(m.answers))
	for k, v := range m.answers {
		ans[k] = v
	}
	m.mu.Unlock()
	return federation.BuildRegions(s.Members(), func(addr string) bool { return ans[addr] })
}

func (m *Manager) serf() *serf.Serf {
	if m.cfg.Serf == nil {
		return nil
	}
	return m.cfg.Serf()
}

// Enabled reports whether the region can fail jobs over (it is in a WAN
// pool).
func (m *Manager) Enabled() bool { return m.serf() != nil }

// Plan decides a new job's failover: nil when the job does not fail over
// (no block and no region default, or failover.disabled), else the record
// to store with the job: its standbys in activation order, or, when no
// region may take it over, why (NotEligible; the job is still accepted and
// simply never moves).
func (m *Manager) Plan(spec *apiaryv1.JobSpec) *store.FailoverRecord {
	return plan(m.cfg, m.Enabled(), m.Regions(), spec)
}

// plan is Plan over a given view of the pool (regions; inPool false: the
// region is in no WAN pool).
func plan(cfg Config, inPool bool, regions []federation.Region, spec *apiaryv1.JobSpec) *store.FailoverRecord {
	m := struct{ cfg Config }{cfg}
	f := spec.GetFailover()
	if f.GetDisabled() || (f == nil && m.cfg.DefaultAfter <= 0) {
		return nil
	}
	after := time.Duration(f.GetAfterMs()) * time.Millisecond
	if after == 0 {
		after = m.cfg.DefaultAfter
	}
	if after == 0 {
		after = DefaultAfter
	}
	rec := &store.FailoverRecord{AfterMs: after.Milliseconds(), Home: m.cfg.Meta.Region}
	if jobspec.HasSecrets(spec) {
		// Sealed under this region's keyring: no standby could open them,
		// and their plain values must not leave the region.
		rec.NotEligible = "the job has secret_env, sealed under the home region's keyring, which no standby holds"
		return rec
	}
	if !inPool {
		rec.NotEligible = "the home region is in no WAN pool (start its coordinators with --wan-join)"
		return rec
	}
	allowed := f.GetRegions()
	if len(allowed) == 0 {
		allowed = m.cfg.Peers
	} else if len(m.cfg.Peers) > 0 {
		var both []string
		for _, r := range allowed {
			if slices.Contains(m.cfg.Peers, r) {
				both = append(both, r)
			}
		}
		allowed = both
		if len(allowed) == 0 {
			rec.NotEligible = fmt.Sprintf("failover.regions %v: none of them is in the home region's --failover-peers %v", f.GetRegions(), m.cfg.Peers)
			return rec
		}
	}
	var peers []federation.Region
	var why []string
	for _, r := range regions {
		switch {
		case r.Name == m.cfg.Meta.Region:
		case len(allowed) > 0 && !slices.Contains(allowed, r.Name):
			why = append(why, fmt.Sprintf("%s: not in failover.regions or --failover-peers", r.Name))
		default:
			peers = append(peers, r)
		}
	}
	ok, excluded := federation.Eligible(peers, m.cfg.Policy, spec)
	for _, e := range excluded {
		why = append(why, e.String())
	}
	if len(allowed) > 0 {
		// The job's (or the region's) order, not routing's.
		sort.SliceStable(ok, func(a, b int) bool {
			return slices.Index(allowed, ok[a].Name) < slices.Index(allowed, ok[b].Name)
		})
	}
	for _, r := range ok {
		if len(rec.Standbys) == MaxStandbys {
			break
		}
		rec.Standbys = append(rec.Standbys, r.Name)
	}
	if len(rec.Standbys) == 0 {
		if len(why) == 0 {
			why = append(why, "no other region in the WAN pool")
		}
		sort.Strings(why)
		rec.NotEligible = "no region may take the job over: " + strings.Join(why, "; ")
	}
	return rec
}

// ErrNoStandby is Replicate's error when no standby acknowledged the job.
var ErrNoStandby = errors.New("failover: no standby region acknowledged the job's spec")

// Replicate writes the job's standby record in each of rec.Failover's
// standbys, in parallel, before the job is committed here (so an
// acknowledged failover job is never lost with its home region). It
// returns the standbys that acknowledged, in order; it fails (wrapping
// ErrNoStandby, as UNAVAILABLE) when none did. A standby that fails is
// left out of the job's record.
func (m *Manager) Replicate(ctx context.Context, rec *store.JobRecord) ([]string, error) {
	fo := rec.Failover
	sj := m.standbyJob(rec)
	errs := make([]error, len(fo.Standbys))
	var wg sync.WaitGroup
	for i, region := range fo.Standbys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, putTimeout)
			defer cancel()
			errs[i] = m.call(cctx, region, func(ctx context.Context, c apiaryv1.FailoverServiceClient) error {
				_, err := c.PutStandby(ctx, &apiaryv1.PutStandbyRequest{Job: sj})
				return err
			})
		}()
	}
	wg.Wait()
	var acked, failed []string
	for i, region := range fo.Standbys {
		if errs[i] == nil {
			acked = append(acked, region)
		} else {
			failed = append(failed, fmt.Sprintf("%s: %v", region, status.Convert(errs[i]).Message()))
		}
	}
	if len(acked) == 0 {
		return nil, status.Errorf(codes.Unavailable, "%v (%s); nothing was committed: retry, or submit with failover: off", ErrNoStandby, strings.Join(failed, "; "))
	}
	if len(failed) > 0 {
		m.cfg.Log.Warn("failover: a standby did not take the job", "job", rec.ID, "failed", failed, "standbys", acked)
	}
	return acked, nil
}

// standbyJob is the standby record of this region's failover job rec as
// PutStandby takes it.
func (m *Manager) standbyJob(rec *store.JobRecord) *apiaryv1.StandbyJob {
	fo := rec.Failover
	return &apiaryv1.StandbyJob{JobId: rec.ID, HomeRegion: m.cfg.Meta.Region, Spec: rec.Spec, SubmitTimeMs: rec.SubmitMs,
		ClientId: rec.ClientID, RequestId: rec.RequestID, Traceparent: rec.Traceparent, AfterMs: fo.AfterMs,
		Standbys: fo.Standbys, HomeEpoch: fo.Epoch}
}

// call runs fn against a coordinator of region that answers, trying each
// in turn until one does (UNAVAILABLE when none).
func (m *Manager) call(ctx context.Context, region string, fn func(context.Context, apiaryv1.FailoverServiceClient) error) error {
	var addrs []string
	for _, r := range m.Regions() {
		if r.Name == region {
			addrs = r.Addrs()
			if len(addrs) == 0 {
				for _, c := range r.Coordinators {
					if c.Status == "alive" {
						addrs = append(addrs, c.Tags.APIAddr)
					}
				}
			}
		}
	}
	if len(addrs) == 0 {
		return status.Errorf(codes.Unavailable, "region %s: no coordinator alive in the WAN pool", region)
	}
	var last error
	for _, addr := range addrs {
		cc, err := m.conn(region, addr)
		if err != nil {
			last = err
			continue
		}
		err = fn(ctx, apiaryv1.NewFailoverServiceClient(cc))
		if err == nil || status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			return err
		}
		last = err
	}
	return last
}

func (m *Manager) conn(region, addr string) (*grpc.ClientConn, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if cc := m.conns[addr]; cc != nil {
		return cc, nil
	}
	cc, err := m.cfg.Dial(region, addr)
	if err != nil {
		return nil, err
	}
	m.conns[addr] = cc
	return cc, nil
}

// Close closes the manager's connections.
func (m *Manager) Close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, cc := range m.conns {
		cc.Close()
	}
	m.conns = map[string]*grpc.ClientConn{}
}

// Hold reports whether the dispatch of a job must wait. A failover job of
// this region runs here only while this region holds a lease on it: some
// standby S of the job answered MovedJobs within the last after/2, and a
// majority of S's coordinators did not then see this region down (the
// lease counts from the call's start minus how long they had). The lease
// is safe because of two rules on the standby side:
//   - a standby activates a job only once a majority of its coordinators
//     have seen the home down for after (due), so S itself cannot before
//     the lease ends;
//   - a standby activates only with a grant from every other standby of
//     the job (claimOthers, none skipped), and a region grants only once a
//     majority of its coordinators have seen the home down for after
//     (ClaimJob), so no other standby can either: S would have to grant.
//
// A job another standby has claimed (ClaimJob granted) is held until the
// claimer says it moved, or released it (release). A home that was paused, partitioned or dead for
// longer than after/2, or whose standbys see it down, holds the job: its
// tasks are not placed and reports on it wait. The price: while no standby
// of a job answers, the job waits (one standby answering suffices).
func (m *Manager) Hold(rec *store.JobRecord) bool {
	held, _, _ := m.hold(rec)
	return held
}

// HoldReason is why Hold holds rec ("" when it does not): the claim, or
// what each standby last answered.
func (m *Manager) HoldReason(rec *store.JobRecord) string {
	held, claimer, granter := m.hold(rec)
	switch {
	case !held:
		return ""
	case claimer != "":
		return fmt.Sprintf("standby region %s claimed the job (granted by %s) to take it over; held until %s says whether it did, or gives it up", claimer, granter, claimer)
	}
	now := m.cfg.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	var why []string
	for _, s := range rec.Failover.Standbys {
		switch at := m.answered[s]; {
		case at.IsZero():
			why = append(why, s+": no answer yet")
		case m.seenDown[s]:
			why = append(why, s+": sees this region down")
		default:
			why = append(why, fmt.Sprintf("%s: last saw this region up %v ago", s, now.Sub(at).Round(time.Second)))
		}
	}
	return fmt.Sprintf("no standby saw this region up within after/2 (%v), so one may be taking the job over (%s); cancel it to give it up here",
		time.Duration(rec.Failover.AfterMs)*time.Millisecond/2, strings.Join(why, "; "))
}

// hold is Hold's decision, without words (the scheduling loop and every
// report ask it): whether rec is held, and, when by a claim, the claimer
// and the region that granted it.
func (m *Manager) hold(rec *store.JobRecord) (held bool, claimer, granter string) {
	if rec == nil || rec.Failover == nil || rec.Failover.Epoch != 0 || rec.Failover.MovedTo != "" || len(rec.Failover.Standbys) == 0 {
		return false, "", ""
	}
	now := m.cfg.Now()
	fresh := time.Duration(rec.Failover.AfterMs) * time.Millisecond / 2
	m.mu.Lock()
	defer m.mu.Unlock()
	for granter, cl := range m.claimed {
		if by, ok := cl[rec.ID]; ok && m.released[rec.ID] != by {
			return true, by, granter
		}
	}
	for _, s := range rec.Failover.Standbys {
		if at := m.answered[s]; !at.IsZero() && now.Sub(at) <= fresh {
			return false, "", ""
		}
	}
	return true, "", ""
}

// Run runs the manager's loops until ctx ends: probing, observing, and,
// on the region's leader, progress, activation and the moved check.
func (m *Manager) Run(ctx context.Context) {
	if !m.Enabled() {
		<-ctx.Done()
		return
	}
	var wg sync.WaitGroup
	for _, loop := range []func(context.Context){m.probeLoop, m.progressLoop, m.activateLoop, m.movedLoop, m.pendingLoop} {
		wg.Add(1)
		go func() { defer wg.Done(); loop(ctx) }()
	}
	wg.Wait()
	m.wg.Wait()
	m.Close()
}

// leader reports whether this coordinator is the smallest live member id
// of the region (the failover leader).
func (m *Manager) leader(ctx context.Context) bool {
	cctx, cancel := store.EtcdCtx(ctx)
	defer cancel()
	resp, err := m.cfg.Client.Get(cctx, store.PrefMembers, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1))
	if err != nil || len(resp.Kvs) == 0 {
		return false
	}
	return strings.TrimPrefix(string(resp.Kvs[0].Key), store.PrefMembers) == m.cfg.CoordID
}

// probeLoop probes every other region's coordinators (gRPC health) and
// keeps, per region, since when it has been seen down: not up in the WAN
// pool and no probe answered. While a region with standby jobs here is
// down, the coordinator's observation is in etcd under its lease.
func (m *Manager) probeLoop(ctx context.Context) {
	t := time.NewTicker(probeEvery)
	defer t.Stop()
	for {
		m.probeOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (m *Manager) probeOnce(ctx context.Context) {
	s := m.serf()
	if s == nil {
		return
	}
	type target struct{ region, addr string }
	var targets []target
	for _, mem := range s.Members() {
		t, ok := federation.DecodeCoordinatorTags(mem.Tags)
		if !ok || t.Region == m.cfg.Meta.Region || t.APIAddr == "" {
			continue
		}
		if mem.Status != serf.StatusAlive {
			m.setAnswer(t.APIAddr, false)
			continue
		}
		targets = append(targets, target{t.Region, t.APIAddr})
	}
	var wg sync.WaitGroup
	for _, tg := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.setAnswer(tg.addr, m.probe(ctx, tg.region, tg.addr))
		}()
	}
	wg.Wait()
	now := m.cfg.Now()
	regions := m.Regions()
	m.mu.Lock()
	for _, r := range regions {
		if r.Name == m.cfg.Meta.Region {
			continue
		}
		if r.Up {
			delete(m.downSince, r.Name)
		} else if m.downSince[r.Name].IsZero() {
			m.downSince[r.Name] = now
			m.cfg.Log.Warn("failover: region seen down", "region", r.Name, "reason", r.DownReason)
		}
	}
	m.mu.Unlock()
	m.observe(ctx)
}

func (m *Manager) setAnswer(addr string, ok bool) {
	m.mu.Lock()
	m.answers[addr] = ok
	m.mu.Unlock()
}

func (m *Manager) probe(ctx context.Context, region, addr string) bool {
	cc, err := m.conn(region, addr)
	if err != nil {
		return false
	}
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	resp, err := healthpb.NewHealthClient(cc).Check(pctx, &healthpb.HealthCheckRequest{})
	return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
}

// DownFor is how long region has been seen down by this coordinator (0:
// up, or never seen).
func (m *Manager) DownFor(region string) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	since := m.downSince[region]
	if since.IsZero() {
		return 0
	}
	return m.cfg.Now().Sub(since)
}

// sawAlive records that region just called this coordinator (a standby
// write or progress): it is not down, whatever the pool says yet.
func (m *Manager) sawAlive(region string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.downSince, region)
}

// observe writes (or deletes) this coordinator's observation of each other
// region: of the homes of its standby jobs (activation, due) and of every
// region of the pool (a region that stands by for a job without a record of
// it still witnesses its home, ClaimJob). Only changes are written.
func (m *Manager) observe(ctx context.Context) {
	lease := clientv3.NoLease
	if m.cfg.Lease != nil {
		lease = m.cfg.Lease()
	}
	if lease == clientv3.NoLease {
		return
	}
	homes, err := m.standbyHomes(ctx)
	if err != nil {
		return
	}
	// A home this coordinator's WAN member never saw (it joined the pool
	// after the home died: serf does not gossip long-dead members) is down,
	// once the member has been in the pool (other members alive) for
	// poolSettle, long enough to have learned every live region.
	known := map[string]bool{}
	regions := m.Regions()
	for _, r := range regions {
		known[r.Name] = true
	}
	m.mu.Lock()
	if m.joinedAt.IsZero() && len(regions) > 1 {
		m.joinedAt = m.cfg.Now()
	}
	settled := !m.joinedAt.IsZero() && m.cfg.Now().Sub(m.joinedAt) >= poolSettle
	for home := range homes {
		if settled && !known[home] && m.downSince[home].IsZero() {
			m.downSince[home] = m.cfg.Now()
			m.cfg.Log.Warn("failover: a home region of standby jobs is not in the WAN pool; seen down", "region", home)
		}
	}
	for r := range known {
		if r != m.cfg.Meta.Region {
			homes[r] = true
		}
	}
	if m.observedLease != lease {
		// A new session: the old observations went with its lease.
		m.observed, m.observedLease = map[string]int64{}, lease
	}
	var ops []clientv3.Op
	want := map[string]int64{}
	for home := range homes {
		var ms int64
		if since := m.downSince[home]; !since.IsZero() {
			ms = since.UnixMilli()
		}
		want[home] = ms
		last, wrote := m.observed[home]
		switch {
		case ms != 0 && last != ms:
			ops = append(ops, clientv3.OpPut(store.KeyObserve(home, m.cfg.CoordID), store.MustJSON(store.ObserveRecord{DownSinceMs: ms}), clientv3.WithLease(lease)))
		case ms == 0 && (!wrote || last != 0):
			ops = append(ops, clientv3.OpDelete(store.KeyObserve(home, m.cfg.CoordID)))
		}
	}
	m.mu.Unlock()
	if len(ops) == 0 {
		return
	}
	cctx, cancel := store.EtcdCtx(ctx)
	defer cancel()
	if _, err := m.cfg.Client.Txn(cctx).Then(ops...).Commit(); err != nil {
		m.cfg.Log.Debug("failover: write observation", "err", err)
		return
	}
	m.mu.Lock()
	if m.observedLease == lease {
		for home, ms := range want {
			m.observed[home] = ms
		}
	}
	m.mu.Unlock()
}

// standbyHomes lists the home regions of this region's standby records
// (a keys-only read: a standby job's id names its home, PutStandby).
func (m *Manager) standbyHomes(ctx context.Context) (map[string]bool, error) {
	cctx, cancel := store.EtcdCtx(ctx)
	defer cancel()
	resp, err := m.cfg.Client.Get(cctx, store.PrefStandby, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, kv := range resp.Kvs {
		if home := ids.RegionOf(string(kv.Key[len(store.PrefStandby):])); home != "" {
			out[home] = true
		}
	}
	return out, nil
}

type standbyKV struct {
	rec    store.StandbyRecord
	modRev int64
}

// standbys reads the region's standby records of jobs of home. A job id
// begins with its region's name (ids.NewJobID), so one home's records are
// one key range (filtered by the record's home: region "eu" is a prefix of
// "eu-west").
func (m *Manager) standbys(ctx context.Context, home string) ([]standbyKV, error) {
	cctx, cancel := store.EtcdCtx(ctx)
	defer cancel()
	resp, err := m.cfg.Client.Get(cctx, store.PrefStandby+home+"-", clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	out := make([]standbyKV, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var r store.StandbyRecord
		if json.Unmarshal(kv.Value, &r) != nil || r.ID == "" || r.Home != home {
			continue
		}
		out = append(out, standbyKV{rec: r, modRev: kv.ModRevision})
	}
	return out, nil
}
