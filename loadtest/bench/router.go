package bench

// Federation benchmarks (issue 6, "Measure and report"): a global router
// (`apiary global`) in front of two regions, all real subprocesses on
// loopback, started by internal/devcluster exactly as the federation tests
// start them.
//
//   - RouteSubmit: SubmitJob throughput and latency through the router versus
//     directly to the region the router picks, with the submit benchmark's
//     closed-loop method (N clients, warm-up, measured window).
//   - RegionKill: a trickle of submissions through the router that prefer the
//     victim region; SIGKILL every coordinator of the victim; time from the
//     kill until the router's view marks the region down (from then on it is
//     not eligible, so the router stops sending there), until the first
//     submission is accepted in the other region, and the last answer from
//     the victim; client-visible errors. The region is restarted and seen
//     routable again between trials.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"google.golang.org/grpc"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/cliconn"
	"apiary.dev/apiary/internal/devcluster"
)

// Federation region names: the router ranks unpinned jobs by free capacity,
// then by name, so with no agents (no free capacity anywhere) every
// unpinned job goes to FedFirst.
const (
	FedFirst  = "eu-west"
	FedSecond = "us-east"
)

// startFederation starts a router and two regions of one coordinator each,
// with agentsPerRegion agents each, no policy file (an unpinned job may run
// in either region). The router and every coordinator share one WAN pool.
func startFederation(ctx context.Context, cfg Config, dir string, agentsPerRegion int) (*devcluster.Cluster, error) {
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	agents := func(region string) []devcluster.AgentSpec {
		var out []devcluster.AgentSpec
		for i := 1; i <= agentsPerRegion; i++ {
			out = append(out, devcluster.AgentSpec{ID: fmt.Sprintf("%s-n%d", region, i), Labels: map[string]string{"zone": "a"}})
		}
		return out
	}
	return devcluster.Start(ctx, devcluster.Options{Binary: cfg.Binary, Dir: dir, Global: &devcluster.GlobalSpec{},
		Regions: []devcluster.RegionSpec{
			{Name: FedFirst, Jurisdiction: "eu", Labels: map[string]string{"jurisdiction": "eu"}, Agents: agents(FedFirst)},
			{Name: FedSecond, Jurisdiction: "us", Labels: map[string]string{"jurisdiction": "us"}, Agents: agents(FedSecond)},
		}})
}

func fedRegion(cl *devcluster.Cluster, name string) *devcluster.Region {
	for _, r := range cl.Regions {
		if r.Spec.Name == name {
			return r
		}
	}
	return nil
}

// RouteSubmitOptions configures one route-submit run.
type RouteSubmitOptions struct {
	// Target is "router" (SubmitJob to the global router) or "direct" (to
	// the coordinator of region FedFirst, where the router sends these jobs).
	Target   string
	Clients  int
	Conns    int
	Warmup   time.Duration
	Duration time.Duration
	Run      int
}

// RouteSubmitResult is one route-submit run.
type RouteSubmitResult struct {
	Opts     RouteSubmitOptions
	OK       int64
	Errors   int64
	PerSec   float64
	Latency  *hdrhistogram.Histogram // microseconds, measured window only
	ErrCodes map[string]int64
	// Regions counts the measured window's answers by
	// SubmitJobResponse.region.
	Regions map[string]int64
	// RouterCPU and CoordCPU are CPU seconds of the router process and of
	// both coordinators (incl. their etcd members), warm-up + window.
	RouterCPU, CoordCPU float64
}

// RouteSubmit runs closed-loop SubmitJob clients (single-task unpinned jobs
// with client_id and a unique request_id, no selector) against a fresh
// federation with no agents, either through the router or directly to
// region FedFirst. The router, both regions and the WAN pool run in both
// cases: only the path of the requests differs.
func RouteSubmit(ctx context.Context, cfg Config, o RouteSubmitOptions) (RouteSubmitResult, error) {
	res := RouteSubmitResult{Opts: o, Latency: hdrhistogram.New(1, 60_000_000, 3), ErrCodes: map[string]int64{}, Regions: map[string]int64{}}
	if o.Target != "router" && o.Target != "direct" {
		return res, fmt.Errorf("route-submit: target %q must be router or direct", o.Target)
	}
	dir := filepath.Join(cfg.WorkDir, fmt.Sprintf("route-submit-%s-%d", o.Target, o.Run))
	cl, err := startFederation(ctx, cfg, dir, 0)
	if err != nil {
		return res, err
	}
	defer cl.Stop()
	addrs := []string{cl.GlobalAddr}
	if o.Target == "direct" {
		addrs = fedRegion(cl, FedFirst).APIAddrs
	}
	var coordPids []int
	for _, r := range cl.Regions {
		for _, p := range r.Coords {
			coordPids = append(coordPids, p.Pid())
		}
	}
	conns, err := dialProbed(ctx, o.Conns, func() (*grpc.ClientConn, error) { return cliconn.Dial(strings.Join(addrs, ",")) })
	if err != nil {
		return res, fmt.Errorf("via %s: %w", o.Target, err)
	}
	defer closeAll(conns)
	routerPid := cl.Global.Pid()
	r0, c0 := cpuSeconds(routerPid), cpuSeconds(coordPids...)
	start := time.Now()
	measureFrom, end := start.Add(o.Warmup), start.Add(o.Warmup+o.Duration)
	var mu sync.Mutex
	lat, ok, bad, codes := closedLoop(ctx, conns, o.Clients, trueJob("route-submit", 1), "bench-route-submit",
		func(i, n int) string { return fmt.Sprintf("%s-%d-c%d-%d", o.Target, o.Run, i, n) }, measureFrom, end,
		func(resp *apiaryv1.SubmitJobResponse, err error, sent, done time.Time) {
			if err != nil || done.After(end) || sent.Before(measureFrom) {
				return
			}
			mu.Lock()
			res.Regions[resp.GetRegion()]++
			mu.Unlock()
		})
	res.Latency.Merge(lat)
	for k, v := range codes {
		res.ErrCodes[k] += v
	}
	res.RouterCPU, res.CoordCPU = cpuSeconds(routerPid)-r0, cpuSeconds(coordPids...)-c0
	res.OK, res.Errors = ok, bad
	res.PerSec = float64(res.OK) / o.Duration.Seconds()
	return res, nil
}

// RegionKillOptions configures the region-kill benchmark.
type RegionKillOptions struct {
	Trials int
	// Every is the trickle's period (open loop: one goroutine per
	// submission, so a slow answer does not delay the next one).
	Every time.Duration
	// Before and After are how long the trickle runs before and after the
	// SIGKILL.
	Before, After time.Duration
	// Timeout is each submission's deadline (the client's context).
	Timeout time.Duration
	// PollEvery is the period of the ListRegions poll of the router.
	PollEvery time.Duration
}

// DefaultRegionKill: 12 trials, a submission every 10 ms.
var DefaultRegionKill = RegionKillOptions{Trials: 12, Every: 10 * time.Millisecond, Before: time.Second, After: 3 * time.Second,
	Timeout: 5 * time.Second, PollEvery: 10 * time.Millisecond}

// KillSubmission is one submission of a region-kill trial; times are
// milliseconds from the SIGKILL of the victim's last coordinator.
type KillSubmission struct {
	SentMs, DoneMs float64
	Region         string // SubmitJobResponse.region ("" on error)
	Code           string // gRPC code on error ("" when accepted)
}

// RegionKillTrial is one trial; times are milliseconds from the SIGKILL of
// the victim's last coordinator (-1: not observed).
type RegionKillTrial struct {
	Trial          int
	Victim, Other  string
	Killed         []string
	PreKillVictim  int // accepted before the kill, answered by the victim
	PreKillOther   int // accepted before the kill, answered by the other region (should be 0)
	PreKillP50Ms   float64
	RouterDownMs   float64 // first ListRegions answer (sent after the kill) with the victim not up
	RouterDownWhy  string
	SerfFailedMs   float64 // first ListRegions answer with no victim coordinator "alive" in the pool
	FirstOtherMs   float64 // answer time of the first accepted submission answered by the other region
	FirstOtherSent float64 // ... and when it was sent
	LastVictimMs   float64 // answer time of the last accepted submission answered by the victim
	LastVictimSent float64
	// InFlight: sent before the kill, answered (or failed) after it.
	InFlight int
	// PostKill* are submissions sent after the kill.
	PostKillSent, PostKillOK, PostKillVictim int
	// BeforeDown: sent after the kill and before RouterDownMs (these the
	// router could still have tried on the victim first); their max latency.
	BeforeDown      int
	BeforeDownMaxMs float64
	PostKillP50Ms   float64
	PostKillMaxMs   float64
	Errors          int
	ErrorCodes      string
	// RestartUpMs: from starting the victim's coordinators again until the
	// router lists it up; RestartRoutedMs: until a submission preferring it
	// is accepted there.
	RestartUpMs, RestartRoutedMs float64
	Submissions                  []KillSubmission
}

// RegionKill runs the trials on one federation (one coordinator per region,
// no agents): victim FedSecond, other FedFirst; every job prefers the
// victim (region.prefer), so the router sends it there while it is up.
func RegionKill(ctx context.Context, cfg Config, o RegionKillOptions) ([]RegionKillTrial, error) {
	dir := filepath.Join(cfg.WorkDir, "region-kill")
	cl, err := startFederation(ctx, cfg, dir, 0)
	if err != nil {
		return nil, err
	}
	defer cl.Stop()
	victim := fedRegion(cl, FedSecond)
	conn, err := cliconn.Dial(cl.GlobalAddr)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	js, admin := apiaryv1.NewJobServiceClient(conn), apiaryv1.NewAdminServiceClient(conn)
	spec := trueJob("region-kill", 1)
	spec.Region = &apiaryv1.RegionSpec{Prefer: []string{FedSecond}}
	var seq atomic.Int64
	submit := func(ctx context.Context) (*apiaryv1.SubmitJobResponse, error) {
		cctx, cancel := context.WithTimeout(ctx, o.Timeout)
		defer cancel()
		return js.SubmitJob(cctx, &apiaryv1.SubmitJobRequest{Spec: spec, ClientId: "bench-region-kill", RequestId: fmt.Sprintf("k%d", seq.Add(1))})
	}
	// The victim must take preferred jobs before the first trial.
	if _, err := waitRoutedTo(ctx, submit, FedSecond, 30*time.Second); err != nil {
		return nil, err
	}
	var out []RegionKillTrial
	for trial := 1; trial <= o.Trials && ctx.Err() == nil; trial++ {
		t, err := regionKillTrial(ctx, cfg, o, trial, victim, submit, admin)
		if err != nil {
			return out, fmt.Errorf("trial %d: %w", trial, err)
		}
		cfg.logf("region-kill trial %d: router marks %s down at %.0f ms (%s), serf failed at %.0f ms; first accepted in %s at %.0f ms (sent %.0f); last victim answer %.0f ms (sent %.0f); in flight %d; post-kill %d sent, %d ok, %d on victim; %d before down (max %.1f ms); errors %d %s; restart: up %.0f ms, routed %.0f ms",
			trial, FedSecond, t.RouterDownMs, t.RouterDownWhy, t.SerfFailedMs, FedFirst, t.FirstOtherMs, t.FirstOtherSent, t.LastVictimMs, t.LastVictimSent,
			t.InFlight, t.PostKillSent, t.PostKillOK, t.PostKillVictim, t.BeforeDown, t.BeforeDownMaxMs, t.Errors, t.ErrorCodes, t.RestartUpMs, t.RestartRoutedMs)
		out = append(out, t)
	}
	return out, ctx.Err()
}

func waitRoutedTo(ctx context.Context, submit func(context.Context) (*apiaryv1.SubmitJobResponse, error), region string, limit time.Duration) (time.Time, error) {
	var at time.Time
	err := waitFor(ctx, limit, "a submission routed to "+region, func() (bool, error) {
		r, err := submit(ctx)
		if err != nil {
			return false, err
		}
		if r.GetRegion() != region {
			return false, fmt.Errorf("routed to %s", r.GetRegion())
		}
		at = time.Now()
		return true, nil
	})
	return at, err
}

func regionKillTrial(ctx context.Context, cfg Config, o RegionKillOptions, trial int, victim *devcluster.Region,
	submit func(context.Context) (*apiaryv1.SubmitJobResponse, error), admin apiaryv1.AdminServiceClient) (RegionKillTrial, error) {
	t := RegionKillTrial{Trial: trial, Victim: FedSecond, Other: FedFirst, RouterDownMs: -1, SerfFailedMs: -1, FirstOtherMs: -1,
		FirstOtherSent: -1, LastVictimMs: -1, LastVictimSent: -1, RestartUpMs: -1, RestartRoutedMs: -1}
	type sub struct {
		sent, done time.Time
		region     string
		err        error
	}
	var mu sync.Mutex
	var subs []sub
	var kill time.Time // set once, before the SIGKILL; read under mu
	var downAt, serfAt time.Time
	var downWhy string

	// Poll the router's view of the victim.
	pollCtx, stopPoll := context.WithCancel(ctx)
	pollDone := make(chan struct{})
	go func() {
		defer close(pollDone)
		for pollCtx.Err() == nil {
			sent := time.Now()
			cctx, cancel := context.WithTimeout(pollCtx, time.Second)
			resp, err := admin.ListRegions(cctx, &apiaryv1.ListRegionsRequest{})
			cancel()
			now := time.Now()
			mu.Lock()
			k := kill
			mu.Unlock()
			if err == nil && !k.IsZero() && sent.After(k) {
				for _, r := range resp.GetRegions() {
					if r.GetName() != FedSecond {
						continue
					}
					if !r.GetUp() && downAt.IsZero() {
						downAt, downWhy = now, r.GetDownReason()
					}
					alive := 0
					for _, c := range r.GetCoordinators() {
						if c.GetMemberStatus() == "alive" {
							alive++
						}
					}
					if alive == 0 && serfAt.IsZero() {
						serfAt = now
					}
				}
			}
			select {
			case <-pollCtx.Done():
			case <-time.After(o.PollEvery):
			}
		}
	}()
	defer func() { stopPoll(); <-pollDone }()

	// The trickle.
	var wg sync.WaitGroup
	trickleCtx, stopTrickle := context.WithCancel(ctx)
	trickleDone := make(chan struct{})
	go func() {
		defer close(trickleDone)
		tick := time.NewTicker(o.Every)
		defer tick.Stop()
		for {
			select {
			case <-trickleCtx.Done():
				return
			case <-tick.C:
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := sub{sent: time.Now()}
				// Not trickleCtx: a submission runs to its own deadline.
				r, err := submit(ctx)
				s.done, s.err = time.Now(), err
				if err == nil {
					s.region = r.GetRegion()
				}
				mu.Lock()
				subs = append(subs, s)
				mu.Unlock()
			}()
		}
	}()
	select {
	case <-ctx.Done():
	case <-time.After(o.Before):
	}
	// SIGKILL every coordinator of the victim; the clock starts at the last.
	for i, p := range victim.Coords {
		if !p.Running() {
			continue
		}
		t.Killed = append(t.Killed, p.Name)
		if i == len(victim.Coords)-1 {
			mu.Lock()
			kill = time.Now()
			mu.Unlock()
		}
		if err := p.Kill(); err != nil {
			stopTrickle()
			<-trickleDone
			wg.Wait()
			return t, err
		}
	}
	select {
	case <-ctx.Done():
	case <-time.After(o.After):
	}
	stopTrickle()
	<-trickleDone
	wg.Wait()
	stopPoll()
	<-pollDone

	rel := func(x time.Time) float64 { return ms(x.Sub(kill)) }
	if !downAt.IsZero() {
		t.RouterDownMs, t.RouterDownWhy = rel(downAt), downWhy
	}
	if !serfAt.IsZero() {
		t.SerfFailedMs = rel(serfAt)
	}
	sort.Slice(subs, func(a, b int) bool { return subs[a].sent.Before(subs[b].sent) })
	var pre, post []float64
	codes := map[string]int{}
	sawOther, sawVictim := false, false
	for _, s := range subs {
		ks := KillSubmission{SentMs: rel(s.sent), DoneMs: rel(s.done), Region: s.region}
		lat := ms(s.done.Sub(s.sent))
		if s.err != nil {
			ks.Code = grpcCode(s.err)
			t.Errors++
			codes[ks.Code]++
		}
		t.Submissions = append(t.Submissions, ks)
		before := s.sent.Before(kill)
		if before && !s.done.Before(kill) {
			t.InFlight++
		}
		if before && s.err == nil && s.done.Before(kill) {
			pre = append(pre, lat)
			if s.region == FedSecond {
				t.PreKillVictim++
			} else {
				t.PreKillOther++
			}
		}
		if !before {
			t.PostKillSent++
			post = append(post, lat)
			if s.err == nil {
				t.PostKillOK++
				if s.region == FedSecond {
					t.PostKillVictim++
				}
			}
			if !downAt.IsZero() && s.sent.Before(downAt) {
				t.BeforeDown++
				t.BeforeDownMaxMs = max(t.BeforeDownMaxMs, lat)
			}
		}
		if s.err == nil && s.region == FedFirst && s.done.After(kill) && (!sawOther || ks.DoneMs < t.FirstOtherMs) {
			t.FirstOtherMs, t.FirstOtherSent, sawOther = ks.DoneMs, ks.SentMs, true
		}
		if s.err == nil && s.region == FedSecond && (!sawVictim || ks.DoneMs > t.LastVictimMs) {
			t.LastVictimMs, t.LastVictimSent, sawVictim = ks.DoneMs, ks.SentMs, true
		}
	}
	t.PreKillP50Ms = Summarize(pre).P50
	ps := Summarize(post)
	t.PostKillP50Ms, t.PostKillMaxMs = ps.P50, ps.Max
	t.ErrorCodes = formatCodes(codes)
	if ctx.Err() != nil {
		return t, ctx.Err()
	}

	// Restart the victim and wait until the router routes to it again.
	restart := time.Now()
	for i := range victim.Coords {
		if err := victim.RestartCoordinator(ctx, i); err != nil {
			return t, err
		}
	}
	if err := waitFor(ctx, 60*time.Second, "router lists "+FedSecond+" up", func() (bool, error) {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		resp, err := admin.ListRegions(cctx, &apiaryv1.ListRegionsRequest{})
		if err != nil {
			return false, err
		}
		for _, r := range resp.GetRegions() {
			if r.GetName() == FedSecond && r.GetUp() {
				return true, nil
			}
		}
		return false, errors.New("not up")
	}); err != nil {
		return t, err
	}
	t.RestartUpMs = ms(time.Since(restart))
	at, err := waitRoutedTo(ctx, submit, FedSecond, 60*time.Second)
	if err != nil {
		return t, err
	}
	t.RestartRoutedMs = ms(at.Sub(restart))
	return t, nil
}

func formatCodes(m map[string]int) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	var parts []string
	for _, k := range ks {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}
