package bench

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/regional/taskstate"
)

// Keyspace prefixes the harness watches (read only). regional/keys.go is
// the one place that defines them; they are repeated here because the
// harness observes the region from the outside. The shard owner keys are
// package shards' Layout (shards.go).
const (
	prefTasks = "/apiary/tasks/"
	prefNodes = "/apiary/nodes/"
)

// prefFloor is the only prefix the harness writes under (measureFloor's
// keys, deleted after each timing): outside the region's keyspace, which
// no coordinator reads.
const prefFloor = "/apiary-bench/floor/"

// Config is what every benchmark needs.
type Config struct {
	// Binary is the apiary executable (built with CGO_ENABLED=0).
	Binary string
	// WorkDir holds data dirs and process logs (scratch).
	WorkDir string
	// Log receives progress lines.
	Log io.Writer
}

func (c Config) logf(format string, args ...any) {
	if c.Log != nil {
		fmt.Fprintf(c.Log, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
	}
}

// startRegion starts one region named "bench" with n coordinators and the
// given agents, under dir.
func startRegion(ctx context.Context, cfg Config, dir string, n int, agents []devcluster.AgentSpec, extra []string) (*devcluster.Cluster, *devcluster.Region, error) {
	return startRegionEnv(ctx, cfg, dir, n, agents, extra, nil)
}

// startRegionEnv is startRegion with env added to every process's
// environment.
func startRegionEnv(ctx context.Context, cfg Config, dir string, n int, agents []devcluster.AgentSpec, extra, env []string) (*devcluster.Cluster, *devcluster.Region, error) {
	return startRegionSpec(ctx, cfg, dir, devcluster.RegionSpec{Coordinators: n, Agents: agents, ExtraArgs: extra}, env)
}

// startRegionSpec starts the region rs, named "bench", under dir.
func startRegionSpec(ctx context.Context, cfg Config, dir string, rs devcluster.RegionSpec, env []string) (*devcluster.Cluster, *devcluster.Region, error) {
	_ = os.RemoveAll(dir)
	rs.Name = "bench"
	cl, err := devcluster.Start(ctx, devcluster.Options{Binary: cfg.Binary, Dir: dir, ExtraEnv: env,
		Regions: []devcluster.RegionSpec{rs}})
	if err != nil {
		return nil, nil, err
	}
	return cl, cl.Regions[0], nil
}

// etcdClient is a read-only observer of the region's etcd.
func etcdClient(endpoints []string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
}

// watchRegion watches the region's whole keyspace from now on (every event
// after the current revision), until ctx ends.
func watchRegion(ctx context.Context, cli *clientv3.Client) (clientv3.WatchChan, error) {
	gctx, gcancel := context.WithTimeout(ctx, 5*time.Second)
	g, err := cli.Get(gctx, "/apiary/meta")
	gcancel()
	if err != nil {
		return nil, err
	}
	return cli.Watch(ctx, "/apiary/", clientv3.WithPrefix(), clientv3.WithRev(g.Header.Revision+1)), nil
}

// agentProc is an agent started by the harness itself (the drain benchmark
// needs agents that start after the jobs were submitted).
type agentProc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// startAgent starts `apiary agent` with extra appended to its arguments.
func startAgent(cfg Config, dir, addr, id string, cpu, mem int64, maxTasks int, extra ...string) (*agentProc, error) {
	logf, err := os.Create(filepath.Join(dir, id+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(cfg.Binary, append([]string{"agent", "--insecure-dev", "--addr", addr, "--node-id", id,
		"--data-dir", filepath.Join(dir, id), "--cpu-millis", strconv.FormatInt(cpu, 10),
		"--memory-mb", strconv.FormatInt(mem, 10), "--max-tasks", strconv.Itoa(maxTasks)}, extra...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	p := &agentProc{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); logf.Close(); close(p.done) }()
	return p, nil
}

func (p *agentProc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// trueJob is a job of n tasks of /bin/true at 100 m / 16 MiB each.
func trueJob(name string, n int32) *apiaryv1.JobSpec {
	return &apiaryv1.JobSpec{Name: name, Tasks: []*apiaryv1.TaskGroup{{Name: "t", Count: n, Command: "/bin/true",
		Resources: &apiaryv1.Resources{CpuMillis: 100, MemoryMb: 16}}}}
}

// taskEvent is one task record change seen by the watch.
type taskEvent struct {
	key  string
	task taskstate.Task
	rev  int64
	at   time.Time
}

func decodeTask(b []byte) (taskstate.Task, bool) {
	var t taskstate.Task
	return t, json.Unmarshal(b, &t) == nil
}

// waitFor polls cond every 20 ms until it holds, ctx ends or limit passes.
func waitFor(ctx context.Context, limit time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(limit)
	var last error
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		last = err
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s (last: %v)", limit, what, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Summary is a distribution of one measured quantity (milliseconds unless
// the name says otherwise). Percentiles are nearest-rank over all samples.
type Summary struct {
	N                             int
	Min, P50, P95, P99, Max, Mean float64
}

// Summarize returns the distribution of xs.
func Summarize(xs []float64) Summary {
	if len(xs) == 0 {
		return Summary{}
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	rank := func(p float64) float64 {
		i := int(math.Ceil(p/100*float64(len(s)))) - 1
		if i < 0 {
			i = 0
		}
		return s[i]
	}
	var sum float64
	for _, x := range s {
		sum += x
	}
	return Summary{N: len(s), Min: s[0], P50: rank(50), P95: rank(95), P99: rank(99), Max: s[len(s)-1], Mean: sum / float64(len(s))}
}

func (s Summary) String() string {
	return fmt.Sprintf("n=%d min=%.0f p50=%.0f p95=%.0f p99=%.0f max=%.0f mean=%.0f", s.N, s.Min, s.P50, s.P95, s.P99, s.Max, s.Mean)
}

// WriteCSV writes a header and rows to path.
func WriteCSV(path string, header []string, rows [][]string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	_ = w.Write(header)
	_ = w.WriteAll(rows)
	w.Flush()
	if err := w.Error(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func f1(x float64) string { return strconv.FormatFloat(x, 'f', 1, 64) }

func coordIndex(r *devcluster.Region, id string) int {
	for i, p := range r.Coords {
		if p.Name == id {
			return i
		}
	}
	return -1
}

func without(xs []string, i int) []string {
	var out []string
	for j, x := range xs {
		if j != i {
			out = append(out, x)
		}
	}
	return out
}

func grpcCode(err error) string {
	if s, ok := status.FromError(err); ok {
		return s.Code().String()
	}
	return "unknown"
}

// cpuSeconds sums utime+stime+cutime+cstime of the processes (from
// /proc/<pid>/stat; clock ticks assumed 100/s, as on Linux).
func cpuSeconds(pids ...int) float64 {
	var total float64
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		// fields after ')': state(0) ... utime(11) stime(12) cutime(13) cstime(14)
		for _, k := range []int{11, 12, 13, 14} {
			if k < len(f) {
				v, _ := strconv.ParseFloat(f[k], 64)
				total += v / 100
			}
		}
	}
	return total
}

// dialProbed opens n connections with dial and sends one probe submission on
// each, so that every connection is up before timing starts.
func dialProbed(ctx context.Context, n int, dial func() (*grpc.ClientConn, error)) ([]*grpc.ClientConn, error) {
	n = max(n, 1)
	var conns []*grpc.ClientConn
	for i := 0; i < n; i++ {
		c, err := dial()
		if err != nil {
			closeAll(conns)
			return nil, err
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := apiaryv1.NewJobServiceClient(c).SubmitJob(pctx, &apiaryv1.SubmitJobRequest{Spec: trueJob("probe", 1)})
		cancel()
		if err != nil {
			closeAll(conns)
			return nil, fmt.Errorf("probe: %w", err)
		}
	}
	return conns, nil
}

func closeAll(conns []*grpc.ClientConn) {
	for _, c := range conns {
		_ = c.Close()
	}
}

// closedLoop runs clients goroutines that each submit spec back to back over
// conns (round robin) until end. Answers sent at or after measureFrom and
// received by end are measured: their latency into the returned histogram
// (µs), errors by gRPC code. onAnswer, if set, sees every answer (called
// concurrently).
func closedLoop(ctx context.Context, conns []*grpc.ClientConn, clients int, spec *apiaryv1.JobSpec, clientID string,
	reqID func(client, n int) string, measureFrom, end time.Time,
	onAnswer func(resp *apiaryv1.SubmitJobResponse, err error, sent, done time.Time)) (lat *hdrhistogram.Histogram, ok, bad int64, codes map[string]int64) {
	lat, codes = hdrhistogram.New(1, 60_000_000, 3), map[string]int64{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			js := apiaryv1.NewJobServiceClient(conns[i%len(conns)])
			h := hdrhistogram.New(1, 60_000_000, 3)
			var nOK, nBad int64
			myCodes := map[string]int64{}
			for n := 0; ; n++ {
				t := time.Now()
				if !t.Before(end) || ctx.Err() != nil {
					break
				}
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				resp, err := js.SubmitJob(cctx, &apiaryv1.SubmitJobRequest{Spec: spec, ClientId: clientID, RequestId: reqID(i, n)})
				cancel()
				done := time.Now()
				if onAnswer != nil {
					onAnswer(resp, err, t, done)
				}
				if done.After(end) {
					break // the answer came after the window closed
				}
				if t.Before(measureFrom) {
					continue
				}
				if err != nil {
					nBad++
					myCodes[grpcCode(err)]++
					continue
				}
				nOK++
				_ = h.RecordValue(done.Sub(t).Microseconds())
			}
			mu.Lock()
			defer mu.Unlock()
			lat.Merge(h)
			ok += nOK
			bad += nBad
			for k, v := range myCodes {
				codes[k] += v
			}
		}(i)
	}
	wg.Wait()
	return lat, ok, bad, codes
}

// hostCPU is one reading of the machine's busy CPU seconds (/proc/stat:
// user, nice, system, irq, softirq, steal) and of the harness's own process
// tree (itself with the children it has reaped, and its live children with
// theirs), clock ticks assumed 100/s.
type hostCPU struct {
	at         time.Time
	busy, tree float64
}

func readHostCPU() hostCPU {
	h := hostCPU{at: time.Now()}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line)
		for _, k := range []int{1, 2, 3, 6, 7, 8} { // user nice system irq softirq steal
			if k < len(f) {
				v, _ := strconv.ParseFloat(f[k], 64)
				h.busy += v / 100
			}
		}
	}
	self := os.Getpid()
	pids := []int{self}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		if b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil {
			s := string(b)
			if i := strings.LastIndexByte(s, ')'); i >= 0 {
				// fields after ')': state(0) ppid(1)
				if f := strings.Fields(s[i+1:]); len(f) > 1 && f[1] == strconv.Itoa(self) {
					pids = append(pids, pid)
				}
			}
		}
	}
	h.tree = cpuSeconds(pids...)
	return h
}

// foreignShare is the share of the machine's CPUs that processes outside
// the harness's tree (another session's tests, say) used between a and b:
// 0 on a quiet machine, 1 if they took every CPU.
func foreignShare(a, b hostCPU) float64 {
	secs := b.at.Sub(a.at).Seconds() * float64(runtime.NumCPU())
	if secs <= 0 {
		return 0
	}
	return max(0, (b.busy-a.busy)-(b.tree-a.tree)) / secs
}

// submitAll submits n jobs at once (one goroutine each, 30 s per call):
// job j's spec and request id come from job(j), under client id clientID.
// It returns the job ids in order, or the first submission error.
func submitAll(ctx context.Context, js apiaryv1.JobServiceClient, n int, clientID string,
	job func(j int) (*apiaryv1.JobSpec, string)) ([]string, error) {
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for j := range n {
		spec, reqID := job(j)
		wg.Go(func() {
			sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			resp, err := js.SubmitJob(sctx, &apiaryv1.SubmitJobRequest{Spec: spec, ClientId: clientID, RequestId: reqID})
			ids[j], errs[j] = resp.GetJobId(), err
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("submit: %w", err)
		}
	}
	return ids, nil
}
