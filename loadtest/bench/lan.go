package bench

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/serf/serf"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	clientv3 "go.etcd.io/etcd/client/v3"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/lan"
	"apiary.dev/apiary/regional"
)

// The serf LAN pool benchmarks (issue 20, "Measure"): how soon a killed
// agent's task runs elsewhere with and without the pool, what the pool's
// gossip costs per agent, and how soon a dead or paused shard owner is
// deposed by each detector.

// AgentFailOptions configures the kill-agent benchmark.
type AgentFailOptions struct {
	Trials int
	Agents int
	// LeaseTTL is the region's --node-lease-ttl.
	LeaseTTL time.Duration
	// LAN runs the region with its serf LAN pool (devcluster's default);
	// false runs it without (NoLAN: leases only).
	LAN       bool
	ExtraArgs []string
	Timeout   time.Duration
}

// DefaultAgentFail is the configuration of `make bench` (run once with LAN
// and once without).
var DefaultAgentFail = AgentFailOptions{Trials: 20, Agents: 3, LeaseTTL: 2 * time.Second, LAN: true,
	ExtraArgs: []string{"--etcd-election-ms", "500", "--etcd-heartbeat-ms", "50"}, Timeout: 30 * time.Second}

// AgentFailTrial is one SIGKILL of the agent running the trial's task.
// Times are ms from the SIGKILL, taken by the harness.
type AgentFailTrial struct {
	Trial  int
	LAN    bool
	Victim string
	Epoch  int64
	// DetectMs: the harness's own serf member (an observer in the pool)
	// received EventMemberFailed for the victim: serf's detection alone,
	// the floor of the fast path (LAN only).
	DetectMs float64
	// AliveGoneMs: the victim's alive key was deleted (fast reclaim or
	// lease expiry), seen by a watch.
	AliveGoneMs float64
	// DispatchMs: the task record written ASSIGNED as attempt 2 on another
	// node; RunningMs: the same attempt reported RUNNING (the headline:
	// the task runs elsewhere).
	DispatchMs float64
	RunningMs  float64
	// FastPath: the coordinator's apiary_lan_fast_reclaims_total grew
	// during the trial (the epoch was ended by the LAN pool, not the lease).
	FastPath bool
}

// AgentFail runs o.Trials kills of an agent running a task in a
// one-coordinator region with o.Agents agents.
func AgentFail(ctx context.Context, cfg Config, o AgentFailOptions) ([]AgentFailTrial, error) {
	mode := map[bool]string{true: "lan", false: "lease"}[o.LAN]
	var agents []devcluster.AgentSpec
	for i := 0; i < o.Agents; i++ {
		agents = append(agents, devcluster.AgentSpec{ID: fmt.Sprintf("agent-%d", i+1), CPUMillis: 1000, MemoryMiB: 1024, MaxTasks: 4})
	}
	port, err := devcluster.FreePort()
	if err != nil {
		return nil, err
	}
	metrics := fmt.Sprintf("127.0.0.1:%d", port)
	extra := append(append([]string{}, o.ExtraArgs...), "--node-lease-ttl", o.LeaseTTL.String(), "--metrics-addr", metrics)
	cl, r, err := startRegionSpec(ctx, cfg, filepath.Join(cfg.WorkDir, "agentfail-"+mode),
		devcluster.RegionSpec{Coordinators: 1, Agents: agents, ExtraArgs: extra, NoLAN: !o.LAN}, nil)
	if err != nil {
		return nil, err
	}
	started := time.Now()
	defer cl.Stop()
	conn, err := r.Dial()
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	js := apiaryv1.NewJobServiceClient(conn)
	cli, err := etcdClient(r.EtcdEndpoints)
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	var obs *serfObserver
	if o.LAN {
		if obs, err = newSerfObserver(r.LANAddrs); err != nil {
			return nil, err
		}
		defer obs.close()
	}
	// A coordinator replaces no lost epoch for its failover grace
	// (regional.DefaultFailoverGrace) after it started, so the trials begin
	// after it.
	if wait := regional.DefaultFailoverGrace + time.Second - time.Since(started); wait > 0 {
		cfg.logf("agentfail %s: waiting %s for the first owner term's failover grace", mode, wait.Round(time.Second))
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
	}
	var out []AgentFailTrial
	for i := 1; i <= o.Trials && ctx.Err() == nil; i++ {
		t, err := agentFailTrial(ctx, r, js, cli, obs, metrics, o, mode, i)
		if err != nil {
			return out, fmt.Errorf("agentfail %s trial %d: %w", mode, i, err)
		}
		cfg.logf("agentfail %s trial %d: killed %s (epoch %d): serf detect @%.0fms, alive key gone @%.0fms, attempt 2 dispatched @%.0fms, running @%.0fms, fast path %v",
			mode, i, t.Victim, t.Epoch, t.DetectMs, t.AliveGoneMs, t.DispatchMs, t.RunningMs, t.FastPath)
		out = append(out, t)
	}
	return out, ctx.Err()
}

func agentFailTrial(ctx context.Context, r *devcluster.Region, js apiaryv1.JobServiceClient, cli *clientv3.Client, obs *serfObserver, metrics string, o AgentFailOptions, mode string, n int) (AgentFailTrial, error) {
	res := AgentFailTrial{Trial: n, LAN: o.LAN}
	if err := r.WaitNodes(ctx, o.Agents); err != nil {
		return res, err
	}
	spec := &apiaryv1.JobSpec{Name: "agentfail", MaxAttempts: 5, Tasks: []*apiaryv1.TaskGroup{{Name: "t", Count: 1, Command: "sleep", Args: []string{"3600"},
		Resources: &apiaryv1.Resources{CpuMillis: 100, MemoryMb: 16}}}}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	sub, err := js.SubmitJob(sctx, &apiaryv1.SubmitJobRequest{Spec: spec, ClientId: "bench-agentfail", RequestId: fmt.Sprintf("%s-%d-%d", mode, n, time.Now().UnixNano())})
	cancel()
	if err != nil {
		return res, fmt.Errorf("submit: %w", err)
	}
	id := sub.GetJobId()
	defer func() {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, _ = js.CancelJob(cctx, &apiaryv1.CancelJobRequest{JobId: id})
		cancel()
	}()
	var first *apiaryv1.Task
	if err := waitFor(ctx, 20*time.Second, "task running", func() (bool, error) {
		gctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		j, err := js.GetJob(gctx, &apiaryv1.GetJobRequest{JobId: id})
		if err != nil {
			return false, err
		}
		first = j.GetJob().GetTasks()[0]
		return first.GetState() == apiaryv1.TaskState_TASK_STATE_RUNNING, fmt.Errorf("task %s", first.GetState())
	}); err != nil {
		return res, err
	}
	res.Victim, res.Epoch = first.GetNodeId(), first.GetNodeEpoch()
	var victim *devcluster.Proc
	for _, p := range r.Agents {
		if p.Name == res.Victim {
			victim = p
		}
	}
	if victim == nil {
		return res, fmt.Errorf("task runs on %q, not an agent of the region", res.Victim)
	}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	w, err := watchRegion(wctx, cli)
	if err != nil {
		return res, err
	}
	alive := prefNodes + res.Victim + "/alive"
	before := metricSum(metrics, "apiary_lan_fast_reclaims_total")
	t0 := time.Now()
	if err := victim.Kill(); err != nil {
		return res, err
	}
	timeout := time.NewTimer(o.Timeout)
	defer timeout.Stop()
	for res.RunningMs == 0 {
		select {
		case <-timeout.C:
			return res, fmt.Errorf("attempt 2 not running within %s", o.Timeout)
		case wr, ok := <-w:
			if !ok || wr.Err() != nil {
				return res, fmt.Errorf("watch: %v", wr.Err())
			}
			at := ms(time.Since(t0))
			for _, ev := range wr.Events {
				k := string(ev.Kv.Key)
				if k == alive && ev.Type == clientv3.EventTypeDelete && res.AliveGoneMs == 0 {
					res.AliveGoneMs = at
				}
				if ev.Type != clientv3.EventTypePut || !strings.HasPrefix(k, prefTasks) || !strings.Contains(k, "/"+id+"/") {
					continue
				}
				t, ok := decodeTask(ev.Kv.Value)
				if !ok || t.Attempt < 2 || t.NodeID == res.Victim {
					continue
				}
				if t.State == apiaryv1.TaskState_TASK_STATE_ASSIGNED && res.DispatchMs == 0 {
					res.DispatchMs = at
				}
				if t.State == apiaryv1.TaskState_TASK_STATE_RUNNING || t.State == apiaryv1.TaskState_TASK_STATE_COMPLETE {
					res.RunningMs = at
					if res.DispatchMs == 0 {
						res.DispatchMs = at
					}
				}
			}
		}
	}
	if obs != nil {
		if at, ok := obs.failedAt(res.Victim, t0); ok {
			res.DetectMs = ms(at.Sub(t0))
		}
	}
	res.FastPath = metricSum(metrics, "apiary_lan_fast_reclaims_total") > before
	// The crashed host comes back (a new member, a new epoch).
	if err := victim.Start(); err != nil {
		return res, err
	}
	return res, nil
}

// serfObserver is the harness's own member of a region's LAN pool: it
// records when each agent's member is declared failed. It publishes
// role=observer, which coordinators and agents ignore.
type serfObserver struct {
	s    *serf.Serf
	mu   sync.Mutex
	seen map[string][]time.Time // node id -> failed events
	done chan struct{}
}

func newSerfObserver(join []string) (*serfObserver, error) {
	events := make(chan serf.Event, 1024)
	conf, err := lan.NewSerfConfig(lan.MemberConfig{Name: lan.MemberName("observer", "bench"), Bind: "127.0.0.1:0",
		Tags: map[string]string{lan.TagRole: "observer"}})
	if err != nil {
		return nil, err
	}
	conf.EventCh = events
	s, err := serf.Create(conf)
	if err != nil {
		return nil, err
	}
	o := &serfObserver{s: s, seen: map[string][]time.Time{}, done: make(chan struct{})}
	go func() {
		defer close(o.done)
		for {
			select {
			case <-s.ShutdownCh():
				return
			case e := <-events:
				me, ok := e.(serf.MemberEvent)
				if !ok || me.Type != serf.EventMemberFailed {
					continue
				}
				now := time.Now()
				o.mu.Lock()
				for _, m := range me.Members {
					if at, ok := lan.DecodeAgentTags(m.Tags); ok {
						o.seen[at.NodeID] = append(o.seen[at.NodeID], now)
					}
				}
				o.mu.Unlock()
			}
		}
	}()
	if _, err := s.Join(join, true); err != nil {
		o.close()
		return nil, fmt.Errorf("observer: join %v: %w", join, err)
	}
	return o, nil
}

// failedAt is the first failure of node's member seen after t0.
func (o *serfObserver) failedAt(node string, t0 time.Time) (time.Time, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, at := range o.seen[node] {
		if at.After(t0) {
			return at, true
		}
	}
	return time.Time{}, false
}

func (o *serfObserver) close() {
	_ = o.s.Leave()
	_ = o.s.Shutdown()
	<-o.done
}

// metricSum is the sum of a metric family's series at a /metrics address
// (0 if it cannot be read).
func metricSum(addr, name string) float64 {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0
	}
	var v float64
	for _, m := range fams[name].GetMetric() {
		v += m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	return v
}

// SerfCPUOptions configures the gossip cost benchmark: Agents agent
// members and one coordinator member in one pool, all in this process.
type SerfCPUOptions struct {
	Agents int
	// Window is each measured phase: idle, then with every agent changing
	// its free-capacity tag every TagEvery (staggered).
	Window   time.Duration
	TagEvery time.Duration
	// Kills is how many agents are then shut down (one at a time, no
	// leave) to time crash detection in a pool this size.
	Kills int
}

// DefaultSerfCPU is the configuration of `make bench`.
var DefaultSerfCPU = SerfCPUOptions{Agents: 50, Window: 60 * time.Second, TagEvery: time.Second, Kills: 5}

// SerfCPUResult is what SerfCPU measured. CPU is this process's user+system
// time (getrusage) over each window: serf, memberlist and the Go runtime
// for Agents+1 members, nothing else running in the process.
type SerfCPUResult struct {
	Agents, Members int
	Window          time.Duration
	IdleCPUSeconds  float64
	TagsCPUSeconds  float64
	TagUpdates      int64
	// Per agent per minute of wall time.
	IdlePerAgentMin, TagsPerAgentMin float64
	// DetectMs: the coordinator member's first EventMemberFailed after
	// each kill.
	DetectMs []float64
}

// SerfCPU runs o.Agents+1 in-process LAN members (internal/lan's tuned
// configuration, loopback, port 0) and measures their CPU cost.
func SerfCPU(ctx context.Context, cfg Config, o SerfCPUOptions) (SerfCPUResult, error) {
	res := SerfCPUResult{Agents: o.Agents, Window: o.Window}
	events := make(chan serf.Event, 4096)
	mk := func(name string, tags map[string]string, ch chan serf.Event) (*serf.Serf, error) {
		conf, err := lan.NewSerfConfig(lan.MemberConfig{Name: name, Bind: "127.0.0.1:0", Tags: tags})
		if err != nil {
			return nil, err
		}
		conf.EventCh = ch
		return serf.Create(conf)
	}
	ctags, _ := lan.CoordinatorTags{ID: "c1"}.Encode()
	coord, err := mk(lan.MemberName(lan.RoleCoordinator, "c1"), ctags, events)
	if err != nil {
		return res, err
	}
	defer coord.Shutdown()
	var failedMu sync.Mutex
	failed := map[string]time.Time{}
	go func() {
		for {
			select {
			case <-coord.ShutdownCh():
				return
			case e := <-events:
				if me, ok := e.(serf.MemberEvent); ok && me.Type == serf.EventMemberFailed {
					failedMu.Lock()
					for _, m := range me.Members {
						if at, ok := lan.DecodeAgentTags(m.Tags); ok {
							failed[at.NodeID] = time.Now()
						}
					}
					failedMu.Unlock()
				}
			}
		}
	}()
	join := []string{lan.Addr(coord.LocalMember())}
	agents := make([]*serf.Serf, o.Agents)
	for i := range agents {
		tags, _ := lan.AgentTags{NodeID: fmt.Sprintf("n%d", i+1), Epoch: int64(100 + i), Free: lan.Free{CPUMillis: 4000, MemoryMiB: 4096, Tasks: -1}}.Encode()
		s, err := mk(lan.MemberName(lan.RoleAgent, fmt.Sprintf("n%d", i+1)), tags, nil)
		if err != nil {
			return res, err
		}
		defer s.Shutdown()
		if _, err := s.Join(join, true); err != nil {
			return res, err
		}
		agents[i] = s
	}
	if err := waitFor(ctx, 60*time.Second, "every member alive everywhere", func() (bool, error) {
		for _, s := range append([]*serf.Serf{coord}, agents...) {
			if n := federationAlive(s); n != o.Agents+1 {
				return false, fmt.Errorf("%s sees %d alive", s.LocalMember().Name, n)
			}
		}
		return true, nil
	}); err != nil {
		return res, err
	}
	res.Members = o.Agents + 1
	cfg.logf("serfcpu: %d members converged; measuring %s idle", res.Members, o.Window)
	cpu := func() float64 {
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
	}
	sleep := func(d time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
			return nil
		}
	}
	c0 := cpu()
	if err := sleep(o.Window); err != nil {
		return res, err
	}
	res.IdleCPUSeconds = cpu() - c0
	cfg.logf("serfcpu: idle %.2f CPU s; now every agent changes its tags every %s", res.IdleCPUSeconds, o.TagEvery)
	tctx, tcancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var updates sync.Map
	for i, s := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select { // stagger
			case <-tctx.Done():
				return
			case <-time.After(o.TagEvery * time.Duration(i) / time.Duration(len(agents))):
			}
			tick := time.NewTicker(o.TagEvery)
			defer tick.Stop()
			for k := int64(1); ; k++ {
				select {
				case <-tctx.Done():
					return
				case <-tick.C:
				}
				tags, _ := lan.AgentTags{NodeID: fmt.Sprintf("n%d", i+1), Epoch: int64(100 + i), Free: lan.Free{CPUMillis: 4000 - 100*(k%10), MemoryMiB: 4096, Tasks: -1}}.Encode()
				if s.SetTags(tags) == nil {
					updates.Store(i, k)
				}
			}
		}()
	}
	c1 := cpu()
	err = sleep(o.Window)
	res.TagsCPUSeconds = cpu() - c1
	tcancel()
	wg.Wait()
	if err != nil {
		return res, err
	}
	updates.Range(func(_, v any) bool { res.TagUpdates += v.(int64); return true })
	minutes := o.Window.Minutes()
	res.IdlePerAgentMin = res.IdleCPUSeconds / float64(o.Agents) / minutes
	res.TagsPerAgentMin = res.TagsCPUSeconds / float64(o.Agents) / minutes
	for k := 0; k < o.Kills && k < len(agents); k++ {
		node := fmt.Sprintf("n%d", k+1)
		t0 := time.Now()
		_ = agents[k].Shutdown()
		if err := waitFor(ctx, 20*time.Second, node+" failed at the coordinator", func() (bool, error) {
			failedMu.Lock()
			defer failedMu.Unlock()
			at, ok := failed[node]
			return ok && at.After(t0), nil
		}); err != nil {
			return res, err
		}
		failedMu.Lock()
		res.DetectMs = append(res.DetectMs, ms(failed[node].Sub(t0)))
		failedMu.Unlock()
	}
	return res, nil
}

func federationAlive(s *serf.Serf) int {
	n := 0
	for _, m := range s.Members() {
		if m.Status == serf.StatusAlive {
			n++
		}
	}
	return n
}

// OwnerDetectOptions configures the owner-suspicion benchmark: a
// 3-coordinator region, the shard owner killed (SIGKILL) or paused
// (SIGSTOP until it was deposed), under each detector configuration.
type OwnerDetectOptions struct {
	Trials    int
	ExtraArgs []string
	Timeout   time.Duration
}

// DefaultOwnerDetect is the configuration of `make bench`.
var DefaultOwnerDetect = OwnerDetectOptions{Trials: 10,
	ExtraArgs: []string{"--etcd-election-ms", "500", "--etcd-heartbeat-ms", "50"}, Timeout: 20 * time.Second}

// OwnerDetectors are the configurations compared: the TCP probe of the
// owner's API alone (no LAN pool), the LAN pool alone (--suspect-after
// -1s), and both (the default with a pool).
var OwnerDetectors = []struct {
	Name  string
	NoLAN bool
	Args  []string
}{
	{"tcp", true, nil},
	{"lan", false, []string{"--suspect-after", "-1s"}},
	{"both", false, nil},
}

// OwnerDetectTrial is one fault of the shard owner; DeposedMs is from the
// fault to the deletion of its election key (deposed on suspicion, or its
// lease expired), seen by a watch on a surviving member.
type OwnerDetectTrial struct {
	Detector     string
	Fault        string // kill or pause
	Trial        int
	Owner        string
	KilledLeader bool
	DeposedMs    float64
}

// OwnerDetect runs o.Trials kills and o.Trials pauses of the owner for
// each detector configuration.
func OwnerDetect(ctx context.Context, cfg Config, o OwnerDetectOptions) ([]OwnerDetectTrial, error) {
	var out []OwnerDetectTrial
	for _, d := range OwnerDetectors {
		cl, r, err := startRegionSpec(ctx, cfg, filepath.Join(cfg.WorkDir, "ownerdetect-"+d.Name),
			devcluster.RegionSpec{Coordinators: 3, ExtraArgs: append(append([]string{}, o.ExtraArgs...), d.Args...), NoLAN: d.NoLAN}, nil)
		if err != nil {
			return out, err
		}
		trials, err := ownerDetectRegion(ctx, cfg, r, o, d.Name)
		cl.Stop()
		out = append(out, trials...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

func ownerDetectRegion(ctx context.Context, cfg Config, r *devcluster.Region, o OwnerDetectOptions, detector string) ([]OwnerDetectTrial, error) {
	conn, err := r.Dial()
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	admin := apiaryv1.NewAdminServiceClient(conn)
	var out []OwnerDetectTrial
	for i := 1; i <= o.Trials && ctx.Err() == nil; i++ {
		for _, fault := range []string{"kill", "pause"} {
			t, err := ownerDetectTrial(ctx, r, admin, o, detector, fault, i)
			if err != nil {
				return out, fmt.Errorf("ownerdetect %s %s trial %d: %w", detector, fault, i, err)
			}
			cfg.logf("ownerdetect %s %s trial %d: owner %s (etcd leader %v) deposed @%.0fms", detector, fault, i, t.Owner, t.KilledLeader, t.DeposedMs)
			out = append(out, t)
		}
	}
	return out, ctx.Err()
}

func ownerDetectTrial(ctx context.Context, r *devcluster.Region, admin apiaryv1.AdminServiceClient, o OwnerDetectOptions, detector, fault string, n int) (OwnerDetectTrial, error) {
	res := OwnerDetectTrial{Detector: detector, Fault: fault, Trial: n}
	if err := healthy(ctx, r, admin, 0); err != nil {
		return res, err
	}
	ov, err := viewOwner(ctx, r, admin)
	if err != nil {
		return res, err
	}
	defer ov.cli.Close()
	idx, cli, g, oldKey := ov.idx, ov.cli, ov.read, ov.key
	res.Owner, res.KilledLeader = ov.owner, ov.leader
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	w := cli.Watch(wctx, oldKey, clientv3.WithRev(g.Header.Revision+1))
	p := r.Coords[idx]
	t0 := time.Now()
	if fault == "kill" {
		err = p.Kill()
	} else {
		err = p.Pause()
	}
	if err != nil {
		return res, err
	}
	timeout := time.NewTimer(o.Timeout)
	defer timeout.Stop()
	for res.DeposedMs == 0 {
		select {
		case <-timeout.C:
			if fault == "pause" {
				_ = p.Resume()
			}
			return res, fmt.Errorf("owner key %s not deleted within %s", oldKey, o.Timeout)
		case wr, ok := <-w:
			if !ok || wr.Err() != nil {
				return res, fmt.Errorf("watch: %v", wr.Err())
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					res.DeposedMs = ms(time.Since(t0))
				}
			}
		}
	}
	if fault == "pause" {
		return res, p.Resume()
	}
	return res, r.RestartCoordinator(ctx, idx)
}
