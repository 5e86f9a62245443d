// Package e2e_test runs faults across real container networks against the
// Docker Compose federation of deploy/compose (issue 15): partitions that
// loopback cannot make. It needs a Docker daemon, docker-compose and the
// image (make image); `make test-docker` provides them and sets
// APIARY_E2E_DOCKER=1. Without a daemon the test is skipped and says why.
//
// The federation runs on its own project name, subnets and ports
// (APIARY_NET_PREFIX 10.98, APIARY_PORT_PREFIX 72), so it does not meet
// `make compose-up`'s. Every step is bounded in time, and everything the
// test made (containers, networks, volumes) is removed even when a step
// fails, which the test then checks.
//
// APIARY_E2E_TRIALS=N repeats each partition case N times (default 1) and
// APIARY_E2E_RESULTS=DIR writes each fault's recovery time there as CSV,
// for the figures of the closing note (n >= 5).
package e2e_test

import (
	"context"
	"encoding/csv"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/cliconn"
	"apiary.dev/apiary/internal/testutil"
	"apiary.dev/apiary/loadtest"
)

const (
	netPrefix  = "10.98"
	portPrefix = "72"
	ledgerPath = "/ledger/ledger.csv"
)

// fed is one compose federation started by the test.
type fed struct {
	t       *testing.T
	project string
	dir     string // the copy of deploy/compose the project runs from
	env     []string
	ledger  string // host path of the agents' shared ledger
	conn    *grpc.ClientConn
	jobs    apiaryv1.JobServiceClient
	admin   apiaryv1.AdminServiceClient
	results *csv.Writer
}

// run runs a command with a time bound and returns its combined output.
func run(ctx context.Context, limit time.Duration, env []string, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("%s %s: timed out after %v", name, strings.Join(args, " "), limit)
	}
	return string(out), err
}

// dockerReady says why the test cannot run here ("" when it can).
func dockerReady() string {
	if os.Getenv("APIARY_E2E_DOCKER") != "1" {
		return "APIARY_E2E_DOCKER is not 1 (make test-docker sets it)"
	}
	if _, err := exec.LookPath("docker-compose"); err != nil {
		return "docker-compose is not installed"
	}
	if out, err := run(context.Background(), 20*time.Second, nil, "docker", "info", "--format", "{{.ServerVersion}}"); err != nil {
		return "no Docker daemon answers: " + strings.TrimSpace(out)
	}
	if out, err := run(context.Background(), 20*time.Second, nil, "docker", "image", "inspect", "apiary:latest"); err != nil {
		return "no image apiary:latest (make image): " + strings.TrimSpace(lastLine(out))
	}
	return ""
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}

func copyFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, mode); err != nil {
		t.Fatal(err)
	}
}

// agentsOverride gives the four agents the host's ledger directory.
const agentsOverride = `version: "3.8"
services:
  eu-west-n1: {volumes: ["${APIARY_E2E_LEDGER}:/ledger"]}
  eu-west-n2: {volumes: ["${APIARY_E2E_LEDGER}:/ledger"]}
  us-east-n1: {volumes: ["${APIARY_E2E_LEDGER}:/ledger"]}
  us-east-n2: {volumes: ["${APIARY_E2E_LEDGER}:/ledger"]}
`

func startFed(t *testing.T) *fed {
	t.Helper()
	tmp := t.TempDir()
	f := &fed{t: t, project: fmt.Sprintf("apiarye2e%d", os.Getpid()), dir: filepath.Join(tmp, "compose"), ledger: filepath.Join(tmp, "ledger")}
	copyFile(t, "../compose/docker-compose.yml", filepath.Join(f.dir, "docker-compose.yml"), 0o644)
	copyFile(t, "../compose/certs.sh", filepath.Join(f.dir, "certs.sh"), 0o755)
	copyFile(t, "../policy.yaml", filepath.Join(tmp, "policy.yaml"), 0o644)
	if err := os.WriteFile(filepath.Join(f.dir, "docker-compose.e2e.yml"), []byte(agentsOverride), 0o644); err != nil {
		t.Fatal(err)
	}
	// Tasks run under user ids of their own: the ledger is writable by all.
	if err := os.MkdirAll(f.ledger, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(f.ledger, 0o777)
	if err := os.WriteFile(filepath.Join(f.ledger, "ledger.csv"), nil, 0o666); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(f.ledger, "ledger.csv"), 0o666)
	f.env = []string{"APIARY_NET_PREFIX=" + netPrefix, "APIARY_PORT_PREFIX=" + portPrefix, "APIARY_E2E_LEDGER=" + f.ledger, "APIARY_IMAGE=apiary:latest"}
	out, err := run(context.Background(), 60*time.Second, nil, filepath.Join(f.dir, "certs.sh"), testutil.Binary(t), netPrefix)
	if err != nil {
		t.Fatalf("certs.sh: %v\n%s", err, out)
	}
	// certs.sh keys its directory by the prefix (the coordinators' IPs),
	// as the compose file mounts it.
	tlsDir := filepath.Join(f.dir, "tls", netPrefix)
	if got := strings.TrimSpace(out); filepath.Clean(got) != tlsDir {
		t.Fatalf("certs.sh made %q; want %s", got, tlsDir)
	}
	t.Cleanup(f.teardown)
	if out, err := f.compose(180*time.Second, "up", "-d"); err != nil {
		t.Fatalf("compose up: %v\n%s", err, out)
	}
	f.waitHealthy(240 * time.Second)
	files := cliconn.TLSFiles{CA: filepath.Join(tlsDir, "apiary-ca.pem"), Cert: filepath.Join(tlsDir, "global-client-cli.pem"),
		Key: filepath.Join(tlsDir, "global-client-cli-key.pem")}
	r, err := files.Load()
	if err != nil {
		t.Fatal(err)
	}
	f.conn, err = cliconn.DialTLS("127.0.0.1:"+portPrefix+"00,127.0.0.1:"+portPrefix+"01", r, "router.global.apiary")
	if err != nil {
		t.Fatal(err)
	}
	f.jobs, f.admin = apiaryv1.NewJobServiceClient(f.conn), apiaryv1.NewAdminServiceClient(f.conn)
	f.waitRegions(90*time.Second, "both regions up with 3 coordinators and 2 nodes each", func(r *apiaryv1.RegionSummary) bool {
		return r.GetUp() && alive(r) == 3 && r.GetNodesReady() == 2
	}, "eu-west", "us-east")
	if dir := os.Getenv("APIARY_E2E_RESULTS"); dir != "" {
		os.MkdirAll(dir, 0o755)
		fh, err := os.Create(filepath.Join(dir, "recovery.csv"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.results.Flush(); fh.Close() })
		f.results = csv.NewWriter(fh)
		f.results.Write([]string{"case", "trial", "what", "ms"})
	}
	return f
}

func (f *fed) compose(limit time.Duration, args ...string) (string, error) {
	all := append([]string{"-p", f.project, "-f", filepath.Join(f.dir, "docker-compose.yml"), "-f", filepath.Join(f.dir, "docker-compose.e2e.yml")}, args...)
	return run(context.Background(), limit, f.env, "docker-compose", all...)
}

// teardown removes everything of the project and checks that nothing is
// left behind.
func (f *fed) teardown() {
	t := f.t
	if f.conn != nil {
		f.conn.Close()
	}
	if t.Failed() {
		for _, svc := range []string{"eu-west-1", "eu-west-2", "eu-west-3", "eu-west-n1", "router-1"} {
			out, _ := f.compose(30*time.Second, "logs", "--tail", "25", "--no-color", svc)
			t.Logf("--- %s ---\n%s", svc, out)
		}
	}
	if out, err := f.compose(120*time.Second, "down", "-v", "--remove-orphans", "-t", "5"); err != nil {
		t.Errorf("compose down: %v\n%s", err, out)
	}
	label := "label=com.docker.compose.project=" + f.project
	for _, what := range [][]string{{"ps", "-aq", "--filter", label}, {"network", "ls", "-q", "--filter", label}, {"volume", "ls", "-q", "--filter", label}} {
		out, err := run(context.Background(), 30*time.Second, nil, "docker", what...)
		if err != nil || strings.TrimSpace(out) != "" {
			t.Errorf("left behind after compose down (docker %s): %q %v", strings.Join(what, " "), out, err)
		}
	}
}

// container is the id of service svc's container.
func (f *fed) container(svc string) string {
	out, err := f.compose(30*time.Second, "ps", "-q", svc)
	if err != nil || strings.TrimSpace(out) == "" {
		f.t.Fatalf("container of %s: %v %q", svc, err, out)
	}
	return strings.TrimSpace(out)
}

// network is the docker network of the project's compose network name.
func (f *fed) network(name string) string {
	out, err := run(context.Background(), 30*time.Second, nil, "docker", "network", "ls", "-q", "--filter", "label=com.docker.compose.project="+f.project,
		"--filter", "label=com.docker.compose.network="+name)
	if err != nil || strings.TrimSpace(out) == "" {
		f.t.Fatalf("network %s: %v %q", name, err, out)
	}
	return strings.TrimSpace(out)
}

func (f *fed) waitHealthy(limit time.Duration) {
	t := f.t
	deadline := time.Now().Add(limit)
	for {
		out, err := f.compose(30*time.Second, "ps", "-q")
		ids := strings.Fields(out)
		var bad []string
		for _, id := range ids {
			st, _ := run(context.Background(), 10*time.Second, nil, "docker", "inspect", "-f", "{{.Name}} {{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}", id)
			if !strings.HasSuffix(strings.TrimSpace(st), " healthy") {
				bad = append(bad, strings.TrimSpace(st))
			}
		}
		if err == nil && len(ids) == 12 && len(bad) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not healthy within %v (%d containers): %v", limit, len(ids), bad)
		}
		time.Sleep(time.Second)
	}
}

func alive(r *apiaryv1.RegionSummary) int {
	n := 0
	for _, c := range r.GetCoordinators() {
		if c.GetMemberStatus() == "alive" && c.GetAnswers() {
			n++
		}
	}
	return n
}

// waitRegions waits until cond holds for each named region in the router's
// view; it returns how long that took.
func (f *fed) waitRegions(limit time.Duration, what string, cond func(*apiaryv1.RegionSummary) bool, names ...string) time.Duration {
	f.t.Helper()
	start := time.Now()
	var last []*apiaryv1.RegionSummary
	for time.Since(start) < limit {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := f.admin.ListRegions(ctx, &apiaryv1.ListRegionsRequest{})
		cancel()
		if err == nil {
			last = resp.GetRegions()
			ok := 0
			for _, r := range last {
				for _, n := range names {
					if r.GetName() == n && cond(r) {
						ok++
					}
				}
			}
			if ok == len(names) {
				return time.Since(start)
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	f.t.Fatalf("router's view: not %s within %v: %v", what, limit, last)
	return 0
}

// spec is a job of n ledger tasks of the given length in jurisdiction jur.
func spec(name, jur string, n int32, work time.Duration, extra func(*apiaryv1.TaskGroup)) *apiaryv1.JobSpec {
	g := &apiaryv1.TaskGroup{Name: "work", Count: n, Command: "/apiary",
		Args:      []string{"loadtest", "task", "--ledger=" + ledgerPath, "--sleep=" + work.String(), "--done"},
		Resources: &apiaryv1.Resources{CpuMillis: 100, MemoryMb: 32}}
	if extra != nil {
		extra(g)
	}
	return &apiaryv1.JobSpec{Name: name, Jurisdiction: jur, MaxAttempts: 5, Tasks: []*apiaryv1.TaskGroup{g}}
}

// submit submits with the CLI's retry rule (UNAVAILABLE retried with the
// same request id, within 15 s); it returns the job id or the final error.
func (f *fed) submit(s *apiaryv1.JobSpec, reqID string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var id string
	err := cliconn.Retry(ctx, 5*time.Second, func(ctx context.Context) error {
		resp, err := f.jobs.SubmitJob(ctx, &apiaryv1.SubmitJobRequest{Spec: s, ClientId: "e2e", RequestId: reqID})
		if err == nil {
			id = resp.GetJobId()
		}
		return err
	})
	return id, err
}

// submitBatch submits n jobs and fails the test if any is refused.
func (f *fed) submitBatch(prefix, jur string, n int, tasks int32, work time.Duration) []string {
	f.t.Helper()
	var ids []string
	for i := 0; i < n; i++ {
		id, err := f.submit(spec(fmt.Sprintf("%s-%d", prefix, i), jur, tasks, work, nil), fmt.Sprintf("%s-%s-%d", f.project, prefix, i))
		if err != nil {
			f.t.Fatalf("submit %s-%d: %v", prefix, i, err)
		}
		ids = append(ids, id)
	}
	return ids
}

func (f *fed) getJob(id string) (*apiaryv1.Job, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := f.jobs.GetJob(ctx, &apiaryv1.GetJobRequest{JobId: id})
	return resp.GetJob(), err
}

func terminal(s apiaryv1.JobState) bool {
	switch s {
	case apiaryv1.JobState_JOB_STATE_COMPLETE, apiaryv1.JobState_JOB_STATE_FAILED, apiaryv1.JobState_JOB_STATE_CANCELLED:
		return true
	}
	return false
}

// verify waits for the jobs to end (limit) and runs the load-test verifier
// over them and the ledger: nothing lost, one committed completion per
// task, no effect of a fenced attempt with a token as high as the
// committed one, jurisdictions kept, every job COMPLETE; with once, no
// task's work done twice.
func (f *fed) verify(what string, ids []string, limit time.Duration, once bool) loadtest.Verdict {
	f.t.Helper()
	jobs := map[string]*apiaryv1.Job{}
	deadline := time.Now().Add(limit)
	for _, id := range ids {
		for {
			j, err := f.getJob(id)
			if err == nil && terminal(j.GetState()) {
				jobs[id] = j
				break
			}
			if time.Now().After(deadline) {
				f.t.Errorf("%s: job %s not ended within %v (%v, %v)", what, id, limit, j.GetState(), err)
				break
			}
			time.Sleep(300 * time.Millisecond)
		}
	}
	fh, err := os.Open(filepath.Join(f.ledger, "ledger.csv"))
	if err != nil {
		f.t.Fatal(err)
	}
	defer fh.Close()
	ledger, err := loadtest.ReadLedger(fh)
	if err != nil {
		f.t.Fatal(err)
	}
	v := loadtest.VerifyWith(ids, jobs, ledger, map[string]string{"eu-west": "eu", "us-east": "us"}, loadtest.Checks{AllComplete: true, EffectOnce: once})
	if !v.OK() {
		f.t.Errorf("%s: verifier: %v", what, v.Error())
	}
	f.t.Logf("%s: verifier: %d accepted, %d complete, %d failed, %d re-executed effects", what, v.Accepted, v.Completed, v.Failed, v.ReexecutedEffects)
	return v
}

func (f *fed) record(c string, trial int, what string, d time.Duration) {
	f.t.Logf("%s trial %d: %s %d ms", c, trial, what, d.Milliseconds())
	if f.results != nil {
		f.results.Write([]string{c, strconv.Itoa(trial), what, strconv.FormatInt(d.Milliseconds(), 10)})
		f.results.Flush()
	}
}

func (f *fed) docker(limit time.Duration, args ...string) {
	f.t.Helper()
	if out, err := run(context.Background(), limit, nil, "docker", args...); err != nil {
		f.t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// disconnect cuts a container from a compose network; the returned func
// connects it again at its static address.
func (f *fed) disconnect(svc, network, ip string) func() {
	c, n := f.container(svc), f.network(network)
	f.docker(30*time.Second, "network", "disconnect", n, c)
	return func() { f.docker(30*time.Second, "network", "connect", "--ip", ip, n, c) }
}

func trials() int {
	n, _ := strconv.Atoi(os.Getenv("APIARY_E2E_TRIALS"))
	return max(n, 1)
}

// waitTask polls job id until cond holds for its task 0 (limit).
func (f *fed) waitTask(id string, limit time.Duration, what string, cond func(*apiaryv1.Task) bool) *apiaryv1.Task {
	f.t.Helper()
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if j, err := f.getJob(id); err == nil && len(j.GetTasks()) > 0 && cond(j.GetTasks()[0]) {
			return j.GetTasks()[0]
		}
		time.Sleep(200 * time.Millisecond)
	}
	j, err := f.getJob(id)
	f.t.Fatalf("job %s: not %s within %v (%v %v)", id, what, limit, j, err)
	return nil
}

func TestComposeFederationFaults(t *testing.T) {
	if why := dockerReady(); why != "" {
		t.Skip("skipped: " + why)
	}
	f := startFed(t)
	euIP := func(i int) string { return fmt.Sprintf("%s.1.1%d", netPrefix, i) }
	wanIP := func(i int) string { return fmt.Sprintf("%s.0.1%d", netPrefix, i) }

	t.Run("coordinator cut from its region network", func(t *testing.T) {
		f.t = t
		for trial := 1; trial <= trials(); trial++ {
			ids := f.submitBatch(fmt.Sprintf("coord%d", trial), "eu", 10, 2, 3*time.Second)
			heal := f.disconnect("eu-west-1", "eu-west", euIP(1))
			cut := time.Now()
			// The others see c1's session lapse and take its shards; new
			// work is placed and run while it is away.
			id, err := f.submit(spec("during-coord-cut", "eu", 1, 0, nil), fmt.Sprintf("%s-coordcut-%d", f.project, trial))
			if err != nil {
				heal()
				t.Fatalf("submit with c1 cut off: %v", err)
			}
			f.waitTask(id, 60*time.Second, "complete", func(tk *apiaryv1.Task) bool { return tk.GetState() == apiaryv1.TaskState_TASK_STATE_COMPLETE })
			f.record("coordinator-cut", trial, "fault to a new job's task complete", time.Since(cut))
			time.Sleep(max(0, 6*time.Second-time.Since(cut))) // well past its 2 s session lease
			heal()
			healed := time.Now()
			f.waitRegions(90*time.Second, "eu-west with 3 coordinators", func(r *apiaryv1.RegionSummary) bool { return r.GetUp() && alive(r) == 3 }, "eu-west")
			f.record("coordinator-cut", trial, "heal to 3 coordinators alive", time.Since(healed))
			// The old owner was fenced: its session (and with it the
			// epochs of its shard claims) ended while it was cut off, so
			// none of its writes from before could commit afterwards.
			logs, _ := run(context.Background(), 30*time.Second, nil, "docker", "logs", "--since", cut.Add(-time.Second).Format(time.RFC3339), f.container("eu-west-1"))
			if !strings.Contains(logs, "member session lease ended; its shards are dropped") {
				t.Errorf("eu-west-1 does not log that its session ended while it was cut off; its log since the cut:\n%s", lastLines(logs, 20))
			}
			f.verify("coordinator cut", append(ids, id), 120*time.Second, true)
		}
	})

	t.Run("agent cut past its lease", func(t *testing.T) {
		f.t = t
		for trial := 1; trial <= trials(); trial++ {
			// One long task that prefers eu-west-n1 (zone z1).
			id, err := f.submit(spec("agent-cut", "eu", 1, 40*time.Second, func(g *apiaryv1.TaskGroup) {
				g.Affinities = []*apiaryv1.Affinity{{Label: "zone", Op: "=", Values: []string{"z1"}, Weight: 100}}
			}), fmt.Sprintf("%s-agentcut-%d", f.project, trial))
			if err != nil {
				t.Fatal(err)
			}
			first := f.waitTask(id, 60*time.Second, "running", func(tk *apiaryv1.Task) bool { return tk.GetState() == apiaryv1.TaskState_TASK_STATE_RUNNING })
			node := first.GetNodeId()
			agent := map[string]string{"eu-west-n1": "eu-west-n1", "eu-west-n2": "eu-west-n2"}[node]
			if agent == "" {
				t.Fatalf("task runs on %q; want an eu-west agent", node)
			}
			// The agent's container has one network; its address there is
			// dynamic, so it reconnects without a fixed one.
			c, n := f.container(agent), f.network("eu-west")
			f.docker(30*time.Second, "network", "disconnect", n, c)
			cut := time.Now()
			moved := f.waitTask(id, 60*time.Second, "running again elsewhere", func(tk *apiaryv1.Task) bool {
				return tk.GetAttempt() > first.GetAttempt() && tk.GetState() == apiaryv1.TaskState_TASK_STATE_RUNNING && tk.GetNodeId() != node
			})
			f.record("agent-cut", trial, "fault to the task running on another node", time.Since(cut))
			f.docker(30*time.Second, "network", "connect", n, c)
			f.waitRegions(60*time.Second, "eu-west with 2 nodes ready", func(r *apiaryv1.RegionSummary) bool { return r.GetNodesReady() == 2 }, "eu-west")
			v := f.verify("agent cut", []string{id}, 120*time.Second, true)
			j, _ := f.getJob(id)
			if tk := j.GetTasks()[0]; tk.GetAttempt() != moved.GetAttempt() || tk.GetNodeId() == node {
				t.Errorf("committed attempt %d on %s; want attempt %d off %s (the stale attempt's report is rejected)", tk.GetAttempt(), tk.GetNodeId(), moved.GetAttempt(), node)
			}
			if v.ReexecutedEffects != 0 {
				t.Errorf("the stale attempt finished its work (%d); want it killed when its agent came back", v.ReexecutedEffects)
			}
		}
	})

	t.Run("eu-west cut from the WAN", func(t *testing.T) {
		f.t = t
		for trial := 1; trial <= trials(); trial++ {
			ids := f.submitBatch(fmt.Sprintf("wan%d", trial), "eu", 6, 1, 6*time.Second)
			var heals []func()
			for i := 1; i <= 3; i++ {
				heals = append(heals, f.disconnect(fmt.Sprintf("eu-west-%d", i), "wan", wanIP(i)))
			}
			cut := time.Now()
			f.waitRegions(60*time.Second, "eu-west down", func(r *apiaryv1.RegionSummary) bool { return !r.GetUp() }, "eu-west")
			f.record("wan-cut", trial, "fault to the router seeing eu-west down", time.Since(cut))
			_, err := f.submit(spec("eu-while-cut", "eu", 1, 0, nil), fmt.Sprintf("%s-wancut-eu-%d", f.project, trial))
			if st := status.Convert(err); err == nil || !strings.Contains(st.Message(), "eu-west") {
				t.Errorf("an EU job while eu-west is cut off: %v; want refused, naming eu-west and why", err)
			} else {
				t.Logf("refused as expected: %s: %s", st.Code(), st.Message())
			}
			// Without an idempotency key (apiary job run without
			// --request-id), the router picks a region itself: none may
			// take EU data now.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err = f.jobs.SubmitJob(ctx, &apiaryv1.SubmitJobRequest{Spec: spec("eu-while-cut-eph", "eu", 1, 0, nil), ClientId: "e2e",
				RequestId: fmt.Sprintf("%s-wancut-eph-%d", f.project, trial), EphemeralRequestId: true})
			cancel()
			if st := status.Convert(err); err == nil || !strings.Contains(st.Message(), "eu-west") {
				t.Errorf("an EU job (ephemeral request id) while eu-west is cut off: %v; want refused, naming eu-west and why", err)
			} else {
				t.Logf("refused as expected: %s: %s", st.Code(), st.Message())
			}
			// US personal data may run only in us-east, so its request's
			// home region is us-east too (a keyed request whose home is
			// eu-west waits for eu-west: never two jobs).
			usSpec := spec("us-while-cut", "us", 1, 0, nil)
			usSpec.DataClass = "personal"
			us, err := f.submit(usSpec, fmt.Sprintf("%s-wancut-us-%d", f.project, trial))
			if err != nil {
				t.Errorf("a US job while eu-west is cut off: %v; want accepted in us-east", err)
			}
			for _, h := range heals {
				h()
			}
			healed := time.Now()
			f.waitRegions(90*time.Second, "eu-west up", func(r *apiaryv1.RegionSummary) bool { return r.GetUp() && alive(r) == 3 }, "eu-west")
			f.record("wan-cut", trial, "heal to the router seeing eu-west up", time.Since(healed))
			if us != "" {
				ids = append(ids, us)
			}
			f.verify("WAN cut", ids, 120*time.Second, true)
		}
	})

	t.Run("whole region killed and restarted", func(t *testing.T) {
		f.t = t
		ids := f.submitBatch("kill", "eu", 8, 2, 4*time.Second)
		time.Sleep(2 * time.Second) // tasks in flight
		svcs := []string{"eu-west-1", "eu-west-2", "eu-west-3", "eu-west-n1", "eu-west-n2"}
		var cs []string
		for _, s := range svcs {
			cs = append(cs, f.container(s))
		}
		f.docker(60*time.Second, append([]string{"kill"}, cs...)...)
		killed := time.Now()
		time.Sleep(3 * time.Second)
		f.docker(60*time.Second, append([]string{"start"}, cs...)...)
		f.waitRegions(120*time.Second, "eu-west up with 3 coordinators and 2 nodes", func(r *apiaryv1.RegionSummary) bool {
			return r.GetUp() && alive(r) == 3 && r.GetNodesReady() == 2
		}, "eu-west")
		f.record("region-kill", 1, "kill to eu-west serving again (3 s down)", time.Since(killed))
		// Tasks killed with their agents run again: their work may be
		// done twice (lower tokens), never committed twice.
		f.verify("region kill", ids, 180*time.Second, false)
	})

	t.Run("rolling restart under load", func(t *testing.T) {
		f.t = t
		var (
			mu       sync.Mutex
			accepted []string
			failed   []string
			n        atomic.Int32
		)
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			tick := time.NewTicker(250 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				i := n.Add(1)
				id, err := f.submit(spec(fmt.Sprintf("roll-%d", i), "eu", 1, time.Second, nil), fmt.Sprintf("%s-roll-%d", f.project, i))
				mu.Lock()
				if err != nil {
					failed = append(failed, fmt.Sprintf("#%d: %v", i, err))
				} else {
					accepted = append(accepted, id)
				}
				mu.Unlock()
			}
		}()
		for i := 1; i <= 3; i++ {
			svc := fmt.Sprintf("eu-west-%d", i)
			start := time.Now()
			f.docker(90*time.Second, "restart", "-t", "20", f.container(svc))
			f.waitRegions(120*time.Second, "eu-west with 3 coordinators", func(r *apiaryv1.RegionSummary) bool { return r.GetUp() && alive(r) == 3 }, "eu-west")
			f.record("rolling-restart", i, "restart of "+svc+" to 3 coordinators alive", time.Since(start))
		}
		time.Sleep(2 * time.Second)
		close(stop)
		<-done
		mu.Lock()
		defer mu.Unlock()
		t.Logf("%d submissions during the rolling restart: %d accepted, %d failed", n.Load(), len(accepted), len(failed))
		if len(failed) > 0 {
			t.Errorf("failed submissions during a rolling restart: %v", failed)
		}
		f.verify("rolling restart", accepted, 120*time.Second, true)
	})
}
