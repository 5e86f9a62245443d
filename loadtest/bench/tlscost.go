package bench

// The cost of mutual TLS and role checks (issue 19, "Measure"): SubmitJob
// throughput and latency, and the agent registration rate, of a 1-member
// region run with mutual TLS (internal/pki, authz of internal/authz) against
// the same region run plaintext (--insecure-dev), and with mutual TLS and
// ACLs on (--acl): submissions carry a client token whose policy grants
// submit in the job's namespace (a management token would skip the policy
// decision), registrations a join token per node (bound in the epoch's
// Txn).

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"google.golang.org/grpc"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/cliconn"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/pki"
)

// TLSCostOptions configures the tlscost benchmark.
type TLSCostOptions struct {
	// Runs is the number of runs per mode (plaintext, mTLS, mTLS + ACL);
	// the modes alternate within each round, their order reversed every
	// other round (plain, mtls, acl, acl, mtls, plain, ...), so all share
	// the machine's drift.
	Runs int
	// Clients closed-loop SubmitJob clients over Conns gRPC connections,
	// Warmup (not measured) then Duration measured, as in Submit.
	Clients  int
	Conns    int
	Warmup   time.Duration
	Duration time.Duration
	// Nodes is how many fake nodes register per run, by Workers
	// concurrent goroutines; each node dials its own connection (with
	// mTLS presenting its own agent certificate, minted before timing).
	Nodes   int
	Workers int
}

// DefaultTLSCost is issue 19's configuration: 3 runs per mode, 64 clients
// over 8 connections, 2 s warm-up, 10 s measured; 200 registrations by 8
// workers.
var DefaultTLSCost = TLSCostOptions{Runs: 3, Clients: 64, Conns: 8, Warmup: 2 * time.Second, Duration: 10 * time.Second,
	Nodes: 200, Workers: 8}

// TLSCostRun is one run of one mode: a submit phase and a registration
// phase, each against a fresh 1-member region.
type TLSCostRun struct {
	TLS bool
	// ACL: TLS with ACLs on (the region's --acl; tokens on every call).
	ACL bool
	Run int

	// Submit phase (see SubmitResult): successes and failures in the
	// measured window, jobs/s, latency in µs, errors by gRPC code, and the
	// coordinator's CPU seconds (with its etcd member) from warm-up start
	// to window end, and the jobs it accepted in that time (probes
	// included).
	OK, Errors int64
	PerSec     float64
	Latency    *hdrhistogram.Histogram
	ErrCodes   map[string]int64
	CoordCPU   float64
	Accepted   int64

	// Registration phase: Registered nodes of RegNodes in RegSeconds
	// (wall, from the first dial to the last answer), RegPerSec of them;
	// RegLatency is each node's dial + RegisterNode in µs (the
	// connection is new, so it includes the TCP and, with mTLS, the TLS
	// handshake); RegCPU the coordinator's CPU seconds in that time.
	RegNodes, Registered  int
	RegErrCodes           map[string]int64
	RegSeconds, RegPerSec float64
	RegLatency            *hdrhistogram.Histogram
	RegCPU                float64
}

// Mode is "acl", "mtls" or "plain".
func (r TLSCostRun) Mode() string {
	if r.ACL {
		return "acl"
	}
	if r.TLS {
		return "mtls"
	}
	return "plain"
}

// startTLSCostRegion starts a 1-member region named "bench" under dir,
// with mutual TLS when useTLS, and ACLs on when useACL.
func startTLSCostRegion(ctx context.Context, cfg Config, dir string, useTLS, useACL bool) (*devcluster.Cluster, *devcluster.Region, error) {
	cl, err := devcluster.Start(ctx, devcluster.Options{Binary: cfg.Binary, Dir: dir, TLS: useTLS, ACL: useACL,
		Regions: []devcluster.RegionSpec{{Name: "bench", Coordinators: 1}}})
	if err != nil {
		return nil, nil, err
	}
	return cl, cl.Regions[0], nil
}

// TLSCostSubmit runs the submit phase of one run: closed-loop SubmitJob
// clients (as Submit does, tracing off) against a fresh 1-member region,
// plaintext or with mutual TLS as the cluster's client certificate.
func TLSCostSubmit(ctx context.Context, cfg Config, o TLSCostOptions, mode string, run int) (TLSCostRun, error) {
	res := TLSCostRun{TLS: mode != "plain", ACL: mode == "acl", Run: run, Latency: hdrhistogram.New(1, 60_000_000, 3), ErrCodes: map[string]int64{}}
	dir := filepath.Join(cfg.WorkDir, fmt.Sprintf("tlscost-submit-%s-%d", res.Mode(), run))
	cl, r, err := startTLSCostRegion(ctx, cfg, dir, res.TLS, res.ACL)
	if err != nil {
		return res, err
	}
	defer cl.Stop()
	pid := r.Coords[0].Pid()
	dial := r.Dial
	if res.ACL {
		secret, err := benchClientToken(ctx, r)
		if err != nil {
			return res, err
		}
		dial = func() (*grpc.ClientConn, error) { return r.DialWithToken(secret) }
	}
	conns, err := dialProbed(ctx, o.Conns, dial)
	if err != nil {
		return res, err
	}
	defer closeAll(conns)
	var accepted atomic.Int64
	cpu0 := cpuSeconds(pid)
	start := time.Now()
	measureFrom, end := start.Add(o.Warmup), start.Add(o.Warmup+o.Duration)
	lat, ok, bad, codes := closedLoop(ctx, conns, o.Clients, trueJob("tlscost", 1), "bench-tlscost",
		func(i, n int) string { return fmt.Sprintf("c%d-%d", i, n) }, measureFrom, end,
		func(_ *apiaryv1.SubmitJobResponse, err error, _, _ time.Time) {
			if err == nil {
				accepted.Add(1)
			}
		})
	res.CoordCPU = cpuSeconds(pid) - cpu0
	res.Latency.Merge(lat)
	res.OK, res.Errors, res.ErrCodes = ok, bad, codes
	res.Accepted = accepted.Load()
	res.PerSec = float64(ok) / o.Duration.Seconds()
	return res, ctx.Err()
}

// TLSCostRegister runs the registration phase of one run into res: o.Nodes
// fake nodes (ids reg-0001 ...) register with RegisterNode against a fresh
// 1-member region, o.Workers at a time. Each node dials its own
// connection: with mutual TLS as its own agent certificate (minted with
// the cluster's CA before timing, as authz binds node_id to the
// certificate's id), else plaintext. One probe node registers before
// timing. The nodes never heartbeat (their leases lapse after the run).
func TLSCostRegister(ctx context.Context, cfg Config, o TLSCostOptions, res *TLSCostRun) error {
	res.RegNodes, res.RegErrCodes = o.Nodes, map[string]int64{}
	res.RegLatency = hdrhistogram.New(1, 60_000_000, 3)
	dir := filepath.Join(cfg.WorkDir, fmt.Sprintf("tlscost-register-%s-%d", res.Mode(), res.Run))
	cl, r, err := startTLSCostRegion(ctx, cfg, dir, res.TLS, res.ACL)
	if err != nil {
		return err
	}
	defer cl.Stop()
	ids := []string{"reg-probe"}
	for i := 1; i <= o.Nodes; i++ {
		ids = append(ids, fmt.Sprintf("reg-%04d", i))
	}
	// Join tokens (ACL mode) are made before timing, one per node,
	// unbound: the registration binds it in its epoch's Txn.
	joins := make([]string, len(ids))
	if res.ACL {
		if joins, err = benchJoinTokens(ctx, r, len(ids)); err != nil {
			return err
		}
	}
	// Certificates are minted and loaded before timing.
	creds := make([]*pki.Reloader, len(ids))
	serverName := ""
	if res.TLS {
		serverName = pki.RegionServerName(r.Spec.Name)
		for i, id := range ids {
			f, err := cl.PKI().Cert(pki.RoleAgent, r.Spec.Name, id)
			if err != nil {
				return err
			}
			if creds[i], err = f.Load(); err != nil {
				return err
			}
		}
	}
	register := func(i int) (*grpc.ClientConn, time.Duration, error) {
		t := time.Now()
		c, err := cliconn.DialTLS(r.Addr(), creds[i], serverName)
		if err != nil {
			return nil, 0, err
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err = apiaryv1.NewAgentServiceClient(c).RegisterNode(cctx, &apiaryv1.RegisterNodeRequest{NodeId: ids[i],
			Capacity: &apiaryv1.Resources{CpuMillis: 4000, MemoryMb: 4096}, MaxTasks: 4, JoinToken: joins[i]})
		return c, time.Since(t), err
	}
	probe, _, err := register(0)
	if probe != nil {
		defer probe.Close()
	}
	if err != nil {
		return fmt.Errorf("probe registration: %w", err)
	}
	pid := r.Coords[0].Pid()
	conns := make([]*grpc.ClientConn, len(ids))
	defer func() {
		for _, c := range conns {
			if c != nil {
				_ = c.Close()
			}
		}
	}()
	var next atomic.Int64
	next.Store(1)
	var mu sync.Mutex
	var wg sync.WaitGroup
	cpu0 := cpuSeconds(pid)
	start := time.Now()
	for w := 0; w < max(o.Workers, 1); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(ids) || ctx.Err() != nil {
					return
				}
				c, d, err := register(i)
				mu.Lock()
				conns[i] = c
				if err != nil {
					res.RegErrCodes[grpcCode(err)]++
				} else {
					res.Registered++
					_ = res.RegLatency.RecordValue(d.Microseconds())
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	res.RegSeconds = time.Since(start).Seconds()
	res.RegCPU = cpuSeconds(pid) - cpu0
	res.RegPerSec = float64(res.Registered) / res.RegSeconds
	return ctx.Err()
}

// RunTLSCost runs o.Runs rounds of both modes (see TLSCostOptions), writes
// tlscost.csv to out and returns the summary's markdown section. A run
// that fails is logged and left out (the error names the first).
func RunTLSCost(ctx context.Context, cfg Config, o TLSCostOptions, out string) (string, error) {
	var runs []TLSCostRun
	var firstErr error
	for run := 1; run <= o.Runs && ctx.Err() == nil; run++ {
		order := []string{"plain", "mtls", "acl"}
		if run%2 == 0 {
			order = []string{"acl", "mtls", "plain"}
		}
		for _, mode := range order {
			if ctx.Err() != nil {
				break
			}
			r, err := TLSCostSubmit(ctx, cfg, o, mode, run)
			if err == nil {
				err = TLSCostRegister(ctx, cfg, o, &r)
			}
			if err != nil {
				cfg.logf("tlscost %s run %d: %v", r.Mode(), run, err)
				if firstErr == nil {
					firstErr = fmt.Errorf("tlscost %s run %d: %w", r.Mode(), run, err)
				}
				continue
			}
			h, g := r.Latency, r.RegLatency
			cfg.logf("tlscost %s run %d: submit %d ok, %d errors %v, %.0f jobs/s, p50 %.1f p99 %.1f max %.1f ms, coord cpu %.1f s (%d accepted); register %d/%d in %.2f s = %.1f/s, p50 %.1f p99 %.1f max %.1f ms, errors %v, coord cpu %.2f s",
				r.Mode(), run, r.OK, r.Errors, r.ErrCodes, r.PerSec, msq(h, 50), msq(h, 99), msq(h, 100), r.CoordCPU, r.Accepted,
				r.Registered, r.RegNodes, r.RegSeconds, r.RegPerSec, msq(g, 50), msq(g, 99), msq(g, 100), r.RegErrCodes, r.RegCPU)
			runs = append(runs, r)
		}
	}
	var rows [][]string
	for _, r := range runs {
		h, g := r.Latency, r.RegLatency
		rows = append(rows, []string{r.Mode(), strconv.Itoa(r.Run), strconv.Itoa(o.Clients), strconv.Itoa(o.Conns), o.Duration.String(),
			strconv.FormatInt(r.OK, 10), strconv.FormatInt(r.Errors, 10), FormatCounts(r.ErrCodes), f1(r.PerSec),
			f2(msq(h, 50)), f2(msq(h, 90)), f2(msq(h, 99)), f2(msq(h, 99.9)), f2(msq(h, 100)), f2(h.Mean() / 1000),
			f1(r.CoordCPU), strconv.FormatInt(r.Accepted, 10), f1(r.CoordCPU / float64(max(r.Accepted, 1)) * 1e6),
			strconv.Itoa(o.Workers), strconv.Itoa(r.RegNodes), strconv.Itoa(r.Registered), FormatCounts(r.RegErrCodes),
			strconv.FormatFloat(r.RegSeconds, 'f', 3, 64), f1(r.RegPerSec), f2(msq(g, 50)), f2(msq(g, 99)), f2(msq(g, 100)),
			strconv.FormatFloat(r.RegCPU, 'f', 2, 64)})
	}
	if err := WriteCSV(filepath.Join(out, "tlscost.csv"), []string{"mode", "run", "clients", "conns", "duration", "ok", "errors", "error_codes", "jobs_per_s",
		"p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms", "mean_ms", "coord_cpu_s", "accepted", "coord_cpu_us_per_job",
		"reg_workers", "reg_nodes", "registered", "reg_error_codes", "reg_seconds", "reg_per_s", "reg_p50_ms", "reg_p99_ms", "reg_max_ms", "reg_coord_cpu_s"}, rows); err != nil {
		return "", err
	}
	return tlsCostMarkdown(o, runs), firstErr
}

// tlsCostMarkdown is the summary section: every run, then the median over
// runs per mode with each mode's ratio to plain.
func tlsCostMarkdown(o TLSCostOptions, runs []TLSCostRun) string {
	var b strings.Builder
	fmt.Fprintf(&b, "## tlscost (issue 19): mutual TLS + role checks, and ACL tokens, against plaintext\n\n"+
		"1-member region, fresh per phase and run; mode plain = every process --insecure-dev, mtls = devcluster Options.TLS (CA, per-process certificates, authz on every RPC), "+
		"acl = mtls plus --acl (submissions carry a client token whose one policy grants submit+read in namespace default; each registration a fresh unbound join token, bound in the epoch's Txn). "+
		"%d run(s) per mode, alternating (plain, mtls, acl | acl, mtls, plain | ...).\n"+
		"Submit: SubmitJob of single-task jobs (client_id + request_id), %d closed-loop clients over %d connections, %s warm-up, %s measured, no agents, tracing off; with mTLS the clients present the cluster's client certificate.\n"+
		"Register: %d fake nodes call RegisterNode, %d workers at a time, each node on a new connection (dial + handshake + RPC timed; with mTLS its own agent certificate, minted before timing); rate = registered / wall time of the batch.\n\n",
		o.Runs, o.Clients, o.Conns, o.Warmup, o.Duration, o.Nodes, o.Workers)
	b.WriteString("| mode | run | ok | errors | jobs/s | p50 ms | p99 ms | max ms | coord CPU µs/job | registered | reg/s | reg p50 ms | reg p99 ms | reg max ms | reg errors |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range runs {
		h, g := r.Latency, r.RegLatency
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %.0f | %.2f | %.2f | %.2f | %.0f | %d/%d | %.1f | %.2f | %.2f | %.2f | %s |\n",
			r.Mode(), r.Run, r.OK, r.Errors, r.PerSec, msq(h, 50), msq(h, 99), msq(h, 100), r.CoordCPU/float64(max(r.Accepted, 1))*1e6,
			r.Registered, r.RegNodes, r.RegPerSec, msq(g, 50), msq(g, 99), msq(g, 100), FormatCounts(r.RegErrCodes))
	}
	type col struct {
		name string
		get  func(TLSCostRun) float64
	}
	cols := []col{
		{"jobs/s", func(r TLSCostRun) float64 { return r.PerSec }},
		{"submit p50 ms", func(r TLSCostRun) float64 { return msq(r.Latency, 50) }},
		{"submit p99 ms", func(r TLSCostRun) float64 { return msq(r.Latency, 99) }},
		{"submit max ms", func(r TLSCostRun) float64 { return msq(r.Latency, 100) }},
		{"coord CPU µs/job", func(r TLSCostRun) float64 { return r.CoordCPU / float64(max(r.Accepted, 1)) * 1e6 }},
		{"registrations/s", func(r TLSCostRun) float64 { return r.RegPerSec }},
		{"registration p50 ms", func(r TLSCostRun) float64 { return msq(r.RegLatency, 50) }},
		{"registration p99 ms", func(r TLSCostRun) float64 { return msq(r.RegLatency, 99) }},
	}
	med := func(mode string, c col) (Summary, int) {
		var xs []float64
		for _, r := range runs {
			if r.Mode() == mode {
				xs = append(xs, c.get(r))
			}
		}
		return Summarize(xs), len(xs)
	}
	b.WriteString("\nMedian over runs [min–max]; plain is the floor, ratios = mode median / plain median:\n\n" +
		"| quantity | plain (n) | mTLS (n) | mTLS + ACL (n) | mTLS / plain | mTLS+ACL / plain |\n|---|---|---|---|---|---|\n")
	ratio := func(x, floor Summary, nx, nf int) string {
		if nx == 0 || nf == 0 || floor.P50 == 0 {
			return "-"
		}
		return strconv.FormatFloat(x.P50/floor.P50, 'f', 2, 64)
	}
	for _, c := range cols {
		p, np := med("plain", c)
		t, nt := med("mtls", c)
		a, na := med("acl", c)
		fmt.Fprintf(&b, "| %s | %s [%s–%s] (%d) | %s [%s–%s] (%d) | %s [%s–%s] (%d) | %s | %s |\n", c.name,
			f2(p.P50), f2(p.Min), f2(p.Max), np, f2(t.P50), f2(t.Min), f2(t.Max), nt, f2(a.P50), f2(a.Min), f2(a.Max), na,
			ratio(t, p, nt, np), ratio(a, p, na, np))
	}
	b.WriteString("\n(median = nearest-rank p50 of the runs; coordinator CPU from /proc, the process with its embedded etcd member, warm-up start to window end, per accepted job; raw rows: tlscost.csv)\n\n")
	return b.String()
}

// msq is h's p-quantile in ms (h in µs).
func msq(h *hdrhistogram.Histogram, p float64) float64 {
	if h == nil {
		return 0
	}
	return float64(h.ValueAtQuantile(p)) / 1000
}

func f2(x float64) string { return strconv.FormatFloat(x, 'f', 2, 64) }

// benchClientToken makes, as the cluster's management token, a policy
// granting submit and read in namespace "default" and a client token with
// it, and returns the token's secret.
func benchClientToken(ctx context.Context, r *devcluster.Region) (string, error) {
	cc, err := r.Dial()
	if err != nil {
		return "", err
	}
	defer cc.Close()
	c := apiaryv1.NewACLServiceClient(cc)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := c.ApplyACLPolicy(cctx, &apiaryv1.ApplyACLPolicyRequest{Policy: &apiaryv1.ACLPolicy{Name: "bench-submit",
		Namespaces: []*apiaryv1.ACLNamespaceRule{{Name: "default", Capabilities: []string{"submit", "read"}}}}}); err != nil {
		return "", fmt.Errorf("acl policy: %w", err)
	}
	resp, err := c.CreateACLToken(cctx, &apiaryv1.CreateACLTokenRequest{Name: "bench-client", Type: "client", Policies: []string{"bench-submit"}})
	if err != nil {
		return "", fmt.Errorf("acl token: %w", err)
	}
	return resp.GetToken().GetSecretId(), nil
}

// benchJoinTokens makes n unbound agent join tokens of the region, as the
// cluster's management token, and returns their secrets.
func benchJoinTokens(ctx context.Context, r *devcluster.Region, n int) ([]string, error) {
	cc, err := r.Dial()
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	c := apiaryv1.NewACLServiceClient(cc)
	out := make([]string, n)
	for i := range out {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		resp, err := c.CreateACLToken(cctx, &apiaryv1.CreateACLTokenRequest{Name: fmt.Sprintf("bench-join-%d", i), Type: "agent", Region: r.Spec.Name})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("join token %d: %w", i, err)
		}
		out[i] = resp.GetToken().GetSecretId()
	}
	return out, nil
}
