package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
)

// FailoverOptions configures the failover benchmark.
type FailoverOptions struct {
	Trials int
	// TrickleEvery is the interval between single-task job submissions.
	TrickleEvery time.Duration
	Agents       int
	Slots        int
	// ExtraArgs go to every coordinator (the defaults are election 500 ms,
	// heartbeat 50 ms, suspect-after 300 ms, owner lease 1 s).
	ExtraArgs []string
	Timeout   time.Duration
}

// DefaultFailover is the configuration of `make bench`.
var DefaultFailover = FailoverOptions{Trials: 20, TrickleEvery: 20 * time.Millisecond, Agents: 2, Slots: 16,
	ExtraArgs: []string{"--etcd-election-ms", "500", "--etcd-heartbeat-ms", "50"}, Timeout: 30 * time.Second}

// FailoverTrial is one kill. Times are ms from the SIGKILL.
type FailoverTrial struct {
	Trial        int
	Killed       string
	KilledLeader bool // the killed coordinator also hosted the etcd raft leader
	OldEpoch     int64
	NewOwner     string
	NewEpoch     int64
	// OwnerMs: the killed owner's election key was deleted (its lease
	// revoked on suspicion, or expired): from then on the next oldest key
	// owns, and only its fenced writes can commit (watch receive time).
	OwnerMs float64
	// DispatchMs: the first task record written ASSIGNED at a revision
	// after the successor's owner key (so under its epoch), as received by
	// the harness's watch. This is the headline figure.
	DispatchMs float64
	// DispatchRecMs: the same task's assigned_ms (the successor's wall clock
	// when it built the plan) minus the kill's wall clock.
	DispatchRecMs float64
	// StartMs: the first task dispatched under the new epoch reported
	// RUNNING by its agent.
	StartMs float64
	// SubmitErrors: trickle submissions that failed (and were retried with
	// the same request id) during this trial, and their gRPC codes.
	SubmitErrors int64
	ErrorCodes   string
	// FirstSubmitOKMs: the first successful answer to a trickle SubmitJob
	// attempt sent after the kill (new work cannot reach the successor
	// before a submission commits).
	FirstSubmitOKMs float64
}

// trickle submits a single-task job every interval (open loop: a slow
// answer does not delay the next submission); a failed one is retried with
// the same request id until it succeeds.
type trickle struct {
	js     apiaryv1.JobServiceClient
	every  time.Duration
	errors atomic.Int64
	lost   atomic.Int64
	wg     sync.WaitGroup

	mu    sync.Mutex
	oks   [][2]time.Time // (sent, answered) of the attempts that succeeded
	codes map[string]int64
}

func (t *trickle) ok(sent, done time.Time) {
	t.mu.Lock()
	t.oks = append(t.oks, [2]time.Time{sent, done})
	if len(t.oks) > 100000 {
		t.oks = t.oks[50000:]
	}
	t.mu.Unlock()
}

func (t *trickle) fail(err error) {
	t.errors.Add(1)
	t.mu.Lock()
	if t.codes == nil {
		t.codes = map[string]int64{}
	}
	t.codes[grpcCode(err)]++
	t.mu.Unlock()
}

// firstOKAfter is the earliest answer to a successful attempt sent after t0.
func (t *trickle) firstOKAfter(t0 time.Time) time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	var first time.Time
	for _, p := range t.oks {
		if p[0].After(t0) && (first.IsZero() || p[1].Before(first)) {
			first = p[1]
		}
	}
	return first
}

func (t *trickle) takeCodes() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var parts []string
	for k, v := range t.codes {
		parts = append(parts, fmt.Sprintf("%s:%d", k, v))
	}
	sort.Strings(parts)
	t.codes = nil
	return strings.Join(parts, " ")
}

func (t *trickle) run(ctx context.Context) {
	tick := time.NewTicker(t.every)
	defer tick.Stop()
	sem := make(chan struct{}, 256)
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			t.wg.Wait()
			return
		case <-tick.C:
		}
		select {
		case sem <- struct{}{}:
		default:
			continue // too many in flight: skip a beat
		}
		t.wg.Add(1)
		go func(n int) {
			defer t.wg.Done()
			defer func() { <-sem }()
			req := &apiaryv1.SubmitJobRequest{Spec: trueJob("trickle", 1), ClientId: "bench-trickle", RequestId: fmt.Sprintf("r%d", n)}
			for try := 0; try < 40 && ctx.Err() == nil; try++ {
				sent := time.Now()
				sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				_, err := t.js.SubmitJob(sctx, req)
				cancel()
				if err == nil {
					t.ok(sent, time.Now())
					return
				}
				t.fail(err)
				select {
				case <-ctx.Done():
				case <-time.After(50 * time.Millisecond):
				}
			}
			t.lost.Add(1)
		}(n)
	}
}

// Failover runs o.Trials kills of the scheduling coordinator on one region.
func Failover(ctx context.Context, cfg Config, o FailoverOptions) ([]FailoverTrial, error) {
	dir := filepath.Join(cfg.WorkDir, "failover")
	var agents []devcluster.AgentSpec
	for i := 0; i < o.Agents; i++ {
		agents = append(agents, devcluster.AgentSpec{ID: fmt.Sprintf("agent-%d", i+1), CPUMillis: int64(o.Slots) * 100, MemoryMiB: int64(o.Slots) * 16 * 2, MaxTasks: o.Slots})
	}
	cl, r, err := startRegion(ctx, cfg, dir, 3, agents, o.ExtraArgs)
	if err != nil {
		return nil, err
	}
	defer cl.Stop()
	conn, err := r.Dial()
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	admin := apiaryv1.NewAdminServiceClient(conn)
	tr := &trickle{js: apiaryv1.NewJobServiceClient(conn), every: o.TrickleEvery}
	tctx, tcancel := context.WithCancel(ctx)
	go tr.run(tctx)
	defer tcancel()

	var out []FailoverTrial
	for i := 0; i < o.Trials; i++ {
		t, err := failoverTrial(ctx, cfg, r, admin, tr, o, i+1)
		if err != nil {
			return out, fmt.Errorf("trial %d: %w", i+1, err)
		}
		cfg.logf("failover trial %d: killed %s (etcd leader %v) owner@%.0fms dispatch@%.0fms (record %.0fms) start@%.0fms; first submit ok @%.0fms, submit errors %d [%s]",
			t.Trial, t.Killed, t.KilledLeader, t.OwnerMs, t.DispatchMs, t.DispatchRecMs, t.StartMs, t.FirstSubmitOKMs, t.SubmitErrors, t.ErrorCodes)
		out = append(out, t)
	}
	if n := tr.lost.Load(); n > 0 {
		return out, fmt.Errorf("%d trickle submissions were never accepted", n)
	}
	return out, nil
}

// healthy waits until all three coordinators serve, all etcd members answer
// a linearizable read and the nodes are READY.
func healthy(ctx context.Context, r *devcluster.Region, admin apiaryv1.AdminServiceClient, nodes int) error {
	var info *apiaryv1.GetRegionInfoResponse
	err := waitFor(ctx, 60*time.Second, "3 coordinators and a scheduler", func() (bool, error) {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		var err error
		info, err = admin.GetRegionInfo(cctx, &apiaryv1.GetRegionInfoRequest{})
		if err != nil {
			return false, err
		}
		sched := 0
		for _, c := range info.GetCoordinators() {
			if c.GetScheduler() {
				sched++
			}
		}
		return len(info.GetCoordinators()) == 3 && sched == 1 && info.GetNodesReady() == int32(nodes), fmt.Errorf("%d coordinators, %d schedulers, %d nodes", len(info.GetCoordinators()), sched, info.GetNodesReady())
	})
	if err != nil {
		return err
	}
	for _, ep := range r.EtcdEndpoints {
		cli, err := etcdClient([]string{ep})
		if err != nil {
			return err
		}
		err = waitFor(ctx, 30*time.Second, "etcd member "+ep, func() (bool, error) {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			_, err := cli.Get(cctx, "/apiary/meta")
			return err == nil, err
		})
		cli.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

func etcdLeaderName(ctx context.Context, endpoints []string) (string, error) {
	cli, err := etcdClient(endpoints)
	if err != nil {
		return "", err
	}
	defer cli.Close()
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := cli.Status(cctx, endpoints[0])
	if err != nil {
		return "", err
	}
	ml, err := cli.MemberList(cctx)
	if err != nil {
		return "", err
	}
	for _, m := range ml.Members {
		if m.ID == st.Leader {
			return m.Name, nil
		}
	}
	return "", fmt.Errorf("leader %x not in member list", st.Leader)
}

// ownerView is what a trial that kills the shard owner reads first: the
// owner coordinator (GetRegionInfo's scheduler) and its index, its epoch,
// whether it is also the etcd leader, an etcd client on the other members
// (to observe through the survivors only), and the owner election keys read
// through it (read; key is the owner's, the oldest: concurrency.Election).
type ownerView struct {
	owner  string
	idx    int
	epoch  int64
	leader bool
	cli    *clientv3.Client
	read   *clientv3.GetResponse
	key    string
	keys   map[string]int64
}

// viewOwner reads ownerView; the caller closes its cli.
func viewOwner(ctx context.Context, r *devcluster.Region, admin apiaryv1.AdminServiceClient) (ownerView, error) {
	var ov ownerView
	info, err := admin.GetRegionInfo(ctx, &apiaryv1.GetRegionInfoRequest{})
	if err != nil {
		return ov, err
	}
	for _, c := range info.GetCoordinators() {
		if c.GetScheduler() {
			ov.owner = c.GetId()
		}
	}
	if ov.idx = coordIndex(r, ov.owner); ov.idx < 0 {
		return ov, fmt.Errorf("scheduler %q is not a coordinator of the region", ov.owner)
	}
	ov.epoch = info.GetSchedulerEpoch()
	leader, err := etcdLeaderName(ctx, r.EtcdEndpoints)
	if err != nil {
		return ov, err
	}
	ov.leader = leader == ov.owner
	if ov.cli, err = etcdClient(without(r.EtcdEndpoints, ov.idx)); err != nil {
		return ov, err
	}
	gctx, gcancel := context.WithTimeout(ctx, 2*time.Second)
	ov.read, err = ov.cli.Get(gctx, prefOwner+"/", clientv3.WithPrefix())
	gcancel()
	if err != nil {
		ov.cli.Close()
		return ov, err
	}
	ov.keys = map[string]int64{}
	for _, kv := range ov.read.Kvs {
		ov.keys[string(kv.Key)] = kv.CreateRevision
	}
	var rev int64
	if ov.key, rev = oldest(ov.keys); ov.key == "" || rev != ov.epoch {
		ov.cli.Close()
		return ov, fmt.Errorf("owner keys %v do not match scheduler epoch %d", ov.keys, ov.epoch)
	}
	return ov, nil
}

func failoverTrial(ctx context.Context, cfg Config, r *devcluster.Region, admin apiaryv1.AdminServiceClient, tr *trickle, o FailoverOptions, n int) (FailoverTrial, error) {
	res := FailoverTrial{Trial: n}
	if err := healthy(ctx, r, admin, o.Agents); err != nil {
		return res, err
	}
	// Settle: the scheduler we are about to kill is the one GetRegionInfo
	// names, and it has dispatched since the region became healthy.
	ov, err := viewOwner(ctx, r, admin)
	if err != nil {
		return res, err
	}
	defer ov.cli.Close()
	killed, idx, cli, g, oldKey, keys := ov.owner, ov.idx, ov.cli, ov.read, ov.key, ov.keys
	res.Killed, res.OldEpoch, res.KilledLeader = killed, ov.epoch, ov.leader
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	w := cli.Watch(wctx, prefOwner+"/", clientv3.WithRange(prefTasks[:len(prefTasks)-1]+"0"), clientv3.WithRev(g.Header.Revision+1))
	// Wait for one dispatch under the current epoch first: the pipeline is live.
	live := time.NewTimer(10 * time.Second)
	defer live.Stop()
warm:
	for {
		select {
		case <-live.C:
			return res, fmt.Errorf("no dispatch by %s within 10 s before the kill", killed)
		case wr, ok := <-w:
			if !ok || wr.Err() != nil {
				return res, fmt.Errorf("watch: %v", wr.Err())
			}
			for _, ev := range wr.Events {
				k := string(ev.Kv.Key)
				if k == oldKey && ev.Type == clientv3.EventTypeDelete {
					return res, fmt.Errorf("ownership changed before the kill")
				}
				if t, ok := decodeTask(ev.Kv.Value); ok && t.State == apiaryv1.TaskState_TASK_STATE_ASSIGNED {
					break warm
				}
			}
		}
	}
	errsBefore := tr.errors.Load()
	tr.takeCodes()
	tKill := time.Now()
	if err := r.Coords[idx].Kill(); err != nil {
		return res, err
	}
	var deposedRev int64
	newKeys := map[string]bool{}
	timeout := time.NewTimer(o.Timeout)
	defer timeout.Stop()
	for res.StartMs == 0 {
		select {
		case <-timeout.C:
			return res, fmt.Errorf("no dispatch by a successor within %s (deposed at rev %d)", o.Timeout, deposedRev)
		case wr, ok := <-w:
			if !ok || wr.Err() != nil {
				return res, fmt.Errorf("watch: %v", wr.Err())
			}
			at := ms(time.Since(tKill))
			for _, ev := range wr.Events {
				k := string(ev.Kv.Key)
				if len(k) > len(prefOwner) && k[:len(prefOwner)] == prefOwner {
					if ev.Type == clientv3.EventTypeDelete {
						delete(keys, k)
						if k == oldKey && deposedRev == 0 {
							// The old owner key is gone (lease revoked on
							// suspicion or expired): the next oldest owns.
							deposedRev, res.OwnerMs = ev.Kv.ModRevision, at
							nk, rev := oldest(keys)
							res.NewEpoch = rev
							res.NewOwner = nk
						}
					} else if ev.IsCreate() {
						keys[k] = ev.Kv.CreateRevision
					}
					continue
				}
				if ev.Type != clientv3.EventTypePut {
					continue
				}
				t, ok := decodeTask(ev.Kv.Value)
				if !ok {
					continue
				}
				// After the old owner key is deleted, its fenced writes
				// fail: an ASSIGNED write is the successor's.
				if t.State == apiaryv1.TaskState_TASK_STATE_ASSIGNED && deposedRev != 0 && ev.Kv.ModRevision > deposedRev {
					if res.DispatchMs == 0 {
						res.DispatchMs = at
						res.DispatchRecMs = float64(t.AssignedMs - tKill.UnixMilli())
					}
					newKeys[k] = true
				}
				// Short tasks report no STARTED (agent: startedReportDelay),
				// so a COMPLETE also shows the successor's task ran.
				if (t.State == apiaryv1.TaskState_TASK_STATE_RUNNING || t.State == apiaryv1.TaskState_TASK_STATE_COMPLETE) && newKeys[k] && res.StartMs == 0 {
					res.StartMs = at
				}
			}
		}
	}
	if v, err := cli.Get(ctx, res.NewOwner); err == nil && len(v.Kvs) == 1 {
		res.NewOwner = string(v.Kvs[0].Value)
	}
	wcancel()
	res.SubmitErrors = tr.errors.Load() - errsBefore
	res.ErrorCodes = tr.takeCodes()
	if at := tr.firstOKAfter(tKill); !at.IsZero() {
		res.FirstSubmitOKMs = ms(at.Sub(tKill))
	}
	if err := r.RestartCoordinator(ctx, idx); err != nil {
		return res, fmt.Errorf("restart %s: %w", killed, err)
	}
	return res, nil
}

// oldest returns the key with the lowest create revision.
func oldest(keys map[string]int64) (string, int64) {
	var k string
	var rev int64
	for key, r := range keys {
		if k == "" || r < rev {
			k, rev = key, r
		}
	}
	return k, rev
}
