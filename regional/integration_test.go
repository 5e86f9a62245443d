package regional_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/jobspec"
	"apiary.dev/apiary/internal/testutil"
	"apiary.dev/apiary/regional/store"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testutil.Cleanup()
	os.Exit(code)
}

// cluster starts one region as real processes and stops it at test end.
func cluster(t *testing.T, rs devcluster.RegionSpec) (*devcluster.Cluster, *devcluster.Region) {
	t.Helper()
	if rs.Name == "" {
		rs.Name = "eu-west"
		rs.Jurisdiction = "eu"
	}
	if !slices.Contains(rs.ExtraArgs, "--node-lease-ttl") {
		rs.ExtraArgs = append(rs.ExtraArgs, "--node-lease-ttl", "1s")
	}
	bin := testutil.Binary(t) // built before the start deadline runs
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cl := startCluster(t, ctx, devcluster.Options{Binary: bin, Dir: t.TempDir(), Regions: []devcluster.RegionSpec{rs}})
	return cl, cl.Regions[0]
}

// startCluster is the one way these tests start processes: devcluster.Start
// with opts (failing the test if it fails), stopped at test end; a failed
// test gets each process's goroutine stacks (SIGQUIT) and log tail.
func startCluster(t *testing.T, ctx context.Context, opts devcluster.Options) *devcluster.Cluster {
	t.Helper()
	cl, err := devcluster.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			// Where was each process stuck? SIGQUIT makes Go dump every
			// goroutine's stack into the log before it exits.
			for _, p := range procs(cl) {
				if p.Running() {
					p.DumpStacks(5 * time.Second)
				}
			}
		}
		cl.Stop()
		if t.Failed() {
			dumpLogs(t, cl)
		}
	})
	return cl
}

func procs(cl *devcluster.Cluster) []*devcluster.Proc {
	var ps []*devcluster.Proc
	for _, r := range cl.Regions {
		ps = append(append(ps, r.Coords...), r.Agents...)
	}
	return ps
}

// dumpLogs logs each process's log tail (the router's too), and in full the
// goroutine dump a SIGQUIT left in it (up to 256 KiB).
func dumpLogs(t *testing.T, cl *devcluster.Cluster) {
	for _, p := range procs(cl) {
		b, _ := os.ReadFile(p.LogPath)
		tail := b
		if i := bytes.Index(b, []byte("SIGQUIT: quit")); i >= 0 {
			tail = b[max(0, i-4000):]
			if len(tail) > 256<<10 {
				tail = tail[:256<<10]
			}
		} else if len(b) > 4000 {
			tail = b[len(b)-4000:]
		}
		t.Logf("--- %s log tail ---\n%s", p.Name, tail)
	}
	if cl.Global != nil {
		b, _ := os.ReadFile(cl.Global.LogPath)
		t.Logf("--- router log tail ---\n%s", b[max(0, len(b)-4000):])
	}
}

type clients struct {
	conn  *grpc.ClientConn
	jobs  apiaryv1.JobServiceClient
	agent apiaryv1.AgentServiceClient
	admin apiaryv1.AdminServiceClient
}

func dial(t *testing.T, r *devcluster.Region) clients {
	t.Helper()
	conn, err := r.Dial()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return clients{conn, apiaryv1.NewJobServiceClient(conn), apiaryv1.NewAgentServiceClient(conn), apiaryv1.NewAdminServiceClient(conn)}
}

func spec(t *testing.T, yaml string) *apiaryv1.JobSpec {
	t.Helper()
	s, err := jobspec.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	if err := jobspec.Validate(s); err != nil {
		t.Fatal(err)
	}
	return s
}

func submit(t *testing.T, c clients, s *apiaryv1.JobSpec) string {
	t.Helper()
	var id string
	testutil.Eventually(t, 20*time.Second, "submit", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := c.jobs.SubmitJob(ctx, &apiaryv1.SubmitJobRequest{Spec: s, ClientId: "test", RequestId: fmt.Sprintf("r-%d", time.Now().UnixNano())})
		if err != nil {
			if status.Code(err) == codes.Unavailable {
				return err
			}
			t.Fatalf("submit: %v", err)
		}
		id = resp.GetJobId()
		return nil
	})
	return id
}

func getJob(c clients, id string) (*apiaryv1.Job, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.jobs.GetJob(ctx, &apiaryv1.GetJobRequest{JobId: id})
	if err != nil {
		return nil, err
	}
	return resp.GetJob(), nil
}

// waitState waits until the job reaches state (failing fast on another
// terminal state).
func waitState(t *testing.T, c clients, id string, want apiaryv1.JobState, timeout time.Duration) *apiaryv1.Job {
	t.Helper()
	var j *apiaryv1.Job
	testutil.Eventually(t, timeout, "job "+id+" "+want.String(), func() error {
		var err error
		if j, err = getJob(c, id); err != nil {
			return err
		}
		if j.GetState() == want {
			return nil
		}
		switch j.GetState() {
		case apiaryv1.JobState_JOB_STATE_COMPLETE, apiaryv1.JobState_JOB_STATE_FAILED, apiaryv1.JobState_JOB_STATE_CANCELLED:
			t.Fatalf("job %s ended %s, want %s: %v", id, j.GetState(), want, j.GetTasks())
		}
		return fmt.Errorf("state %s, counts %v", j.GetState(), j.GetCounts())
	})
	return j
}

func logs(t *testing.T, c clients, id string) []*apiaryv1.Task {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.jobs.GetJobLogs(ctx, &apiaryv1.GetJobLogsRequest{JobId: id, TaskIndex: -1})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetTasks()
}

// completions counts the committed completions of each task index.
func completions(tasks []*apiaryv1.Task) map[int32]int {
	out := map[int32]int{}
	for _, tk := range tasks {
		for _, a := range tk.GetAttempts() {
			if a.GetOutcome() == "complete" {
				out[tk.GetIndex()]++
			}
		}
	}
	return out
}

func twoAgents() []devcluster.AgentSpec {
	return []devcluster.AgentSpec{
		{ID: "n1", Labels: map[string]string{"zone": "a"}},
		{ID: "n2", Labels: map[string]string{"zone": "b"}},
	}
}

// TestOneMemberRegion runs the single-member cases on one region: a 20-task
// job and its logs (also through the CLI), retries, idempotent submission,
// server-side validation, and malformed job files leaving no trace.
func TestOneMemberRegion(t *testing.T) {
	_, r := cluster(t, devcluster.RegionSpec{Agents: twoAgents()})
	c := dial(t, r)

	t.Run("JurisdictionLabelSpelledOtherwiseIsRefused", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := c.agent.RegisterNode(ctx, &apiaryv1.RegisterNodeRequest{NodeId: "claims-us", Labels: map[string]string{"Jurisdiction": "us"},
			Capacity: &apiaryv1.Resources{CpuMillis: 1000, MemoryMb: 1024}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `the jurisdiction label is spelled "jurisdiction"`) {
			t.Fatalf("RegisterNode with label Jurisdiction=us: %v; want INVALID_ARGUMENT naming the key", err)
		}
	})

	t.Run("RetriedRegistrationKeepsItsEpoch", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		reg := func(node, regID string) (*apiaryv1.RegisterNodeResponse, error) {
			return c.agent.RegisterNode(ctx, &apiaryv1.RegisterNodeRequest{NodeId: node, RegistrationId: regID,
				Capacity: &apiaryv1.Resources{CpuMillis: 1000, MemoryMb: 1024}})
		}
		// Deregistered at the end: the later subtests' tasks must not be
		// placed on nodes no agent runs.
		last := map[string]int64{}
		defer func() {
			for n, e := range last {
				if _, err := c.agent.Deregister(context.Background(), &apiaryv1.DeregisterRequest{NodeId: n, NodeEpoch: e}); err != nil {
					t.Errorf("deregister %s epoch %d: %v", n, e, err)
				}
			}
		}()
		mustReg := func(node, regID string) int64 {
			t.Helper()
			resp, err := reg(node, regID)
			if err != nil {
				t.Fatalf("RegisterNode(%s, %q): %v", node, regID, err)
			}
			if resp.GetLeaseTtlMs() <= 0 || resp.GetHeartbeatIntervalMs() <= 0 {
				t.Fatalf("RegisterNode(%s, %q): lease %d ms, interval %d ms", node, regID, resp.GetLeaseTtlMs(), resp.GetHeartbeatIntervalMs())
			}
			last[node] = resp.GetNodeEpoch()
			return resp.GetNodeEpoch()
		}
		beat := func(node string, epoch int64) error {
			_, err := c.agent.Heartbeat(ctx, &apiaryv1.HeartbeatRequest{NodeId: node, NodeEpoch: epoch})
			return err
		}
		e1 := mustReg("regid-a", "R1")
		if e := mustReg("regid-a", "R1"); e != e1 {
			t.Fatalf("a retry with the same registration_id made epoch %d; want the first call's %d", e, e1)
		}
		if err := beat("regid-a", e1); err != nil {
			t.Fatalf("heartbeat of the kept epoch: %v", err)
		}
		e2 := mustReg("regid-a", "R2")
		if e2 <= e1 {
			t.Fatalf("a new registration_id made epoch %d; want a new one above %d", e2, e1)
		}
		if err := beat("regid-a", e1); status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("heartbeat of the replaced epoch %d: %v; want FAILED_PRECONDITION", e1, err)
		}
		// An id that made an ended epoch does not bring it back.
		if e := mustReg("regid-a", "R1"); e <= e2 {
			t.Fatalf("registration_id of an ended epoch: epoch %d; want a new one above %d", e, e2)
		}
		// Without an id every call starts a new epoch, as before.
		n1 := mustReg("regid-b", "")
		if n2 := mustReg("regid-b", ""); n2 <= n1 {
			t.Fatalf("two registrations without an id: epochs %d then %d; want a new one", n1, n2)
		}
		// The same registration sent four times at once: one epoch, alive.
		epochs := make(chan int64, 4)
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := reg("regid-c", "SAME")
				if err != nil {
					t.Errorf("concurrent RegisterNode: %v", err)
					epochs <- 0
					return
				}
				epochs <- resp.GetNodeEpoch()
			}()
		}
		wg.Wait()
		close(epochs)
		var first int64
		for e := range epochs {
			if first == 0 {
				first = e
			}
			if e != first || e == 0 {
				t.Fatalf("concurrent registrations with one id answered epochs %d and %d; want one", first, e)
			}
		}
		last["regid-c"] = first
		if err := beat("regid-c", first); err != nil {
			t.Fatalf("heartbeat of the concurrently registered epoch: %v", err)
		}
		if _, err := reg("regid-d", "not valid!"); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "registration_id") {
			t.Fatalf("RegisterNode with registration_id %q: %v; want INVALID_ARGUMENT naming the field", "not valid!", err)
		}
	})

	t.Run("TwentyTasksCompleteWithLogs", func(t *testing.T) {
		id := submit(t, c, spec(t, `
name: fanout
tasks:
  - name: shard
    count: 20
    command: sh
    args: ["-c", "echo task $APIARY_TASK_INDEX attempt $APIARY_ATTEMPT token $APIARY_FENCING_TOKEN; echo warn $APIARY_TASK_INDEX >&2"]
`))
		j := waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 30*time.Second)
		if j.GetCounts().GetComplete() != 20 {
			t.Fatalf("counts %v", j.GetCounts())
		}
		tasks := logs(t, c, id)
		if len(tasks) != 20 {
			t.Fatalf("%d tasks in logs", len(tasks))
		}
		for _, tk := range tasks {
			if len(tk.GetAttempts()) != 1 {
				t.Fatalf("task %d: %d attempts", tk.GetIndex(), len(tk.GetAttempts()))
			}
			a := tk.GetAttempts()[0]
			want := fmt.Sprintf("task %d attempt 1 token %d", tk.GetIndex(), a.GetFencingToken())
			if a.GetFencingToken() <= 0 || !strings.Contains(a.GetStdoutTail(), want) {
				t.Fatalf("task %d stdout %q, want %q", tk.GetIndex(), a.GetStdoutTail(), want)
			}
			if !strings.Contains(a.GetStderrTail(), fmt.Sprintf("warn %d", tk.GetIndex())) {
				t.Fatalf("task %d stderr %q", tk.GetIndex(), a.GetStderrTail())
			}
		}
		out, err := exec.Command(testutil.Binary(t), "job", "logs", id, "--addr", r.APIAddrs[0]).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "task 7 attempt 1") {
			t.Fatalf("apiary job logs: %v\n%s", err, out)
		}
	})

	t.Run("LargeOutputCompletes", func(t *testing.T) {
		id := submit(t, c, spec(t, `
name: loud
tasks:
  - name: a
    count: 4
    command: sh
    args: ["-c", "head -c 300000 /dev/zero | tr '\\0' '<'; head -c 300000 /dev/zero | tr '\\0' '<' >&2"]
`))
		waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 30*time.Second)
		for _, tk := range logs(t, c, id) {
			a := tk.GetAttempts()[0]
			if len(a.GetStdoutTail()) != 16384 || strings.Trim(a.GetStdoutTail(), "<") != "" || len(a.GetStderrTail()) != 16384 {
				t.Fatalf("task %d: tails of %d and %d bytes", tk.GetIndex(), len(a.GetStdoutTail()), len(a.GetStderrTail()))
			}
		}
	})

	t.Run("RetryableFailureRetriesAndCompletes", func(t *testing.T) {
		id := submit(t, c, spec(t, `
name: retry-once
max_attempts: 3
tasks:
  - name: flaky
    command: sh
    args: ["-c", "[ \"$APIARY_ATTEMPT\" = 1 ] && exit 75; echo ok"]
    retryable_exit_codes: [75]
`))
		j := waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 30*time.Second)
		tk := j.GetTasks()[0]
		if tk.GetAttempt() != 2 || len(tk.GetAttempts()) != 2 || tk.GetAttempts()[0].GetOutcome() != "retry" || tk.GetAttempts()[0].GetExitCode() != 75 {
			t.Fatalf("task %+v", tk)
		}
	})

	t.Run("AlwaysFailingStopsAtMaxAttempts", func(t *testing.T) {
		id := submit(t, c, spec(t, `
name: always-fails
max_attempts: 2
tasks:
  - name: bad
    command: sh
    args: ["-c", "exit 1"]
    retryable_exit_codes: [1]
`))
		j := waitState(t, c, id, apiaryv1.JobState_JOB_STATE_FAILED, 30*time.Second)
		tk := j.GetTasks()[0]
		if tk.GetAttempt() != 2 || len(tk.GetAttempts()) != 2 || tk.GetState() != apiaryv1.TaskState_TASK_STATE_FAILED {
			t.Fatalf("want FAILED after exactly 2 attempts, got attempt %d, %d results: %+v", tk.GetAttempt(), len(tk.GetAttempts()), tk)
		}
		if !strings.Contains(tk.GetError(), "max_attempts 2") {
			t.Fatalf("error %q does not say why", tk.GetError())
		}
	})

	t.Run("NonRetryableExitIsConfirmedOnASecondNodeThenFinal", func(t *testing.T) {
		// A non-retryable exit is the job's once a second node confirms it
		// (docs/architecture.md, "Bad nodes"): one bad host cannot fail a
		// job, and a bad job costs one more attempt, never more.
		id := submit(t, c, spec(t, `
name: terminal
max_attempts: 5
tasks:
  - name: bad-input
    command: sh
    args: ["-c", "exit 3"]
    retryable_exit_codes: [75]
`))
		j := waitState(t, c, id, apiaryv1.JobState_JOB_STATE_FAILED, 30*time.Second)
		tk := j.GetTasks()[0]
		as := logs(t, c, id)[0].GetAttempts()
		if tk.GetAttempt() != 2 || len(as) != 2 || as[0].GetNodeId() == as[1].GetNodeId() ||
			!strings.Contains(tk.GetError(), "not in retryable_exit_codes") || !strings.Contains(tk.GetError(), "confirmed on 2 distinct nodes") {
			t.Fatalf("non-retryable exit: want 2 attempts on 2 nodes and a confirmed error, got %+v", tk)
		}
		if as[0].GetFault() != apiaryv1.FailureFault_FAILURE_FAULT_UNCONFIRMED || as[1].GetFault() != apiaryv1.FailureFault_FAILURE_FAULT_JOB {
			t.Fatalf("faults %s, %s; want UNCONFIRMED then JOB", as[0].GetFault(), as[1].GetFault())
		}
	})

	t.Run("UnplaceableTaskSaysWhyAndCancels", func(t *testing.T) {
		// Larger than every node: refused at submission, nothing stored.
		ctx0, cancel0 := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := c.jobs.SubmitJob(ctx0, &apiaryv1.SubmitJobRequest{Spec: spec(t, "name: too-big\ntasks:\n  - name: huge\n    command: \"true\"\n    resources:\n      memory_mb: 100000\n")})
		cancel0()
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "tasks[0].resources") || !strings.Contains(err.Error(), "could never be placed") {
			t.Fatalf("task larger than every node: %v", err)
		}
		// Fits a node's size but no node's labels: accepted, explained.
		id := submit(t, c, spec(t, `
name: nowhere
tasks:
  - name: picky
    count: 3
    command: "true"
    constraints:
      - label: zone
        op: "="
        values: [mars]
`))
		testutil.Eventually(t, 15*time.Second, "unplaced reason", func() error {
			j, err := getJob(c, id)
			if err != nil {
				return err
			}
			for _, tk := range j.GetTasks() {
				if !strings.Contains(tk.GetUnplacedReason(), "zone") {
					return fmt.Errorf("task %d reason %q", tk.GetIndex(), tk.GetUnplacedReason())
				}
			}
			return nil
		})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := c.jobs.CancelJob(ctx, &apiaryv1.CancelJobRequest{JobId: id}); err != nil {
			t.Fatal(err)
		}
		waitState(t, c, id, apiaryv1.JobState_JOB_STATE_CANCELLED, 15*time.Second)
	})

	t.Run("CancelKillsRunningTask", func(t *testing.T) {
		marker := filepath.Join(t.TempDir(), "still-running")
		id := submit(t, c, spec(t, fmt.Sprintf(`
name: long-runner
tasks:
  - name: sleeper
    command: sh
    args: ["-c", "sleep 0.2; sleep 30; touch %s"]
`, marker)))
		testutil.Eventually(t, 15*time.Second, "running", func() error {
			j, err := getJob(c, id)
			if err != nil {
				return err
			}
			if j.GetTasks()[0].GetState() != apiaryv1.TaskState_TASK_STATE_RUNNING {
				return fmt.Errorf("state %s", j.GetTasks()[0].GetState())
			}
			return nil
		})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := c.jobs.CancelJob(ctx, &apiaryv1.CancelJobRequest{JobId: id}); err != nil {
			t.Fatal(err)
		}
		j := waitState(t, c, id, apiaryv1.JobState_JOB_STATE_CANCELLED, 15*time.Second)
		if tk := j.GetTasks()[0]; tk.GetState() != apiaryv1.TaskState_TASK_STATE_CANCELLED || len(tk.GetAttempts()) != 1 || tk.GetAttempts()[0].GetOutcome() != "cancelled" {
			t.Fatalf("task after cancel: %+v", tk)
		}
		if _, err := os.Stat(marker); err == nil {
			t.Fatal("cancelled task's process ran to the end")
		}
	})

	t.Run("ListJobsPagesFromTheIndex", func(t *testing.T) {
		// Jobs submitted just before are listed at once (the list waits for
		// the job index to reach etcd's revision), a page at a time in
		// descending id order, with the counts GetJob derives.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		want := map[string]bool{}
		for i := range 12 {
			want[submit(t, c, spec(t, fmt.Sprintf("name: paged-%d\ntasks:\n  - name: a\n    count: 2\n    command: \"true\"\n", i)))] = true
		}
		seen := map[string]bool{}
		token, prev, pages := "", "", 0
		for {
			resp, err := c.jobs.ListJobs(ctx, &apiaryv1.ListJobsRequest{Limit: 5, PageToken: token})
			if err != nil {
				t.Fatal(err)
			}
			pages++
			if len(resp.GetJobs()) > 5 {
				t.Fatalf("page of %d jobs, limit 5", len(resp.GetJobs()))
			}
			for _, j := range resp.GetJobs() {
				if seen[j.GetId()] || (prev != "" && j.GetId() >= prev) {
					t.Fatalf("job %s after %s: not in descending order or listed twice", j.GetId(), prev)
				}
				seen[j.GetId()], prev = true, j.GetId()
				if want[j.GetId()] && countTotal(j.GetCounts()) != 2 {
					t.Fatalf("job %s listed with counts %v, want 2 tasks", j.GetId(), j.GetCounts())
				}
			}
			if token = resp.GetNextPageToken(); token == "" {
				break
			}
		}
		for id := range want {
			if !seen[id] {
				t.Fatalf("job %s submitted before the list is missing from %d pages", id, pages)
			}
		}
		if pages < 3 {
			t.Fatalf("%d pages for at least 12 jobs at 5 a page", pages)
		}
		// A write outside the index's keys (etcd's revision moves, no event
		// reaches the watch): the list still answers at once, the watch
		// stream's progress notification bringing the index's revision up.
		cli, err := clientv3.New(clientv3.Config{Endpoints: r.EtcdEndpoints, DialTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer cli.Close()
		for i := range 3 {
			if _, err := cli.Put(ctx, "/zz-test/unrelated", fmt.Sprint(i)); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if _, err := c.jobs.ListJobs(ctx, &apiaryv1.ListJobsRequest{Limit: 1}); err != nil {
				t.Fatal(err)
			}
			if d := time.Since(start); d > 3*time.Second {
				t.Fatalf("list after an unrelated write took %v: the index waited for an event", d)
			}
		}
		for _, tok := range []string{strings.Repeat("x", 300), "garbage", "eu-west-0000"} {
			if _, err := c.jobs.ListJobs(ctx, &apiaryv1.ListJobsRequest{PageToken: tok}); status.Code(err) != codes.InvalidArgument ||
				!strings.Contains(err.Error(), "page_token") {
				t.Fatalf("page token %.20q: %v, want INVALID_ARGUMENT naming page_token", tok, err)
			}
		}
	})

	t.Run("SubmitIsIdempotentPerRequestID", func(t *testing.T) {
		s := spec(t, "name: once\ntasks:\n  - name: a\n    command: \"true\"\n")
		req := &apiaryv1.SubmitJobRequest{Spec: s, ClientId: "cli-1", RequestId: "req-42"}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// 16 racing duplicates and a sequential one all get the same job.
		ids := make([]string, 16)
		var wg sync.WaitGroup
		for i := range ids {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				resp, err := c.jobs.SubmitJob(ctx, req)
				if err != nil {
					t.Errorf("submit %d: %v", i, err)
					return
				}
				ids[i] = resp.GetJobId()
			}(i)
		}
		wg.Wait()
		again, err := c.jobs.SubmitJob(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		for i, id := range ids {
			if id != again.GetJobId() {
				t.Fatalf("submission %d got job %s, want %s", i, id, again.GetJobId())
			}
		}
		if !again.GetDeduplicated() {
			t.Fatal("repeat not marked deduplicated")
		}
		other := spec(t, "name: once\ntasks:\n  - name: a\n    command: \"false\"\n")
		_, err = c.jobs.SubmitJob(ctx, &apiaryv1.SubmitJobRequest{Spec: other, ClientId: "cli-1", RequestId: "req-42"})
		if status.Code(err) != codes.AlreadyExists || !strings.Contains(err.Error(), "request_id") {
			t.Fatalf("same request id, other payload: want ALREADY_EXISTS naming request_id, got %v", err)
		}
		list, err := c.jobs.ListJobs(ctx, &apiaryv1.ListJobsRequest{Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, j := range list.GetJobs() {
			if j.GetRequestId() == "req-42" {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("%d jobs stored for one request id", n)
		}

		// The CLI's --request-id: the same key and file twice give one job;
		// the key with another file is refused with exit 2.
		dir := t.TempDir()
		f1, f2 := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")
		if err := os.WriteFile(f1, []byte("name: keyed\ntasks:\n  - name: a\n    command: \"true\"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f2, []byte("name: keyed\ntasks:\n  - name: a\n    command: \"false\"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		run := func(f string) (string, string, int) {
			cmd := exec.Command(testutil.Binary(t), "job", "run", f, "--request-id", "nightly-1", "--addr", r.APIAddrs[0])
			var stdout, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			return strings.TrimSpace(stdout.String()), stderr.String(), code
		}
		id1, _, code1 := run(f1)
		id2, msg2, code2 := run(f1)
		if code1 != 0 || code2 != 0 || id1 == "" || id1 != id2 || !strings.Contains(msg2, "already submitted; same job") {
			t.Fatalf("same --request-id twice: ids %q/%q, exits %d/%d, stderr %q", id1, id2, code1, code2, msg2)
		}
		if _, msg3, code3 := run(f2); code3 != 2 || !strings.Contains(msg3, "request_id") {
			t.Fatalf("same --request-id, other file: exit %d, stderr %q", code3, msg3)
		}
	})

	t.Run("InvalidInputLeavesNoTrace", func(t *testing.T) {
		cli, err := clientv3.New(clientv3.Config{Endpoints: r.EtcdEndpoints, DialTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer cli.Close()
		count := func() int64 {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			resp, err := cli.Get(ctx, store.Root, clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err != nil {
				t.Fatal(err)
			}
			return resp.Count
		}
		waitQuiet := func() int64 {
			// Usage keys settle after the earlier subtests; wait for a
			// stable count rather than a fixed time.
			var last int64 = -1
			testutil.Eventually(t, 10*time.Second, "stable key count", func() error {
				n := count()
				if n != last {
					last = n
					return fmt.Errorf("count moved to %d", n)
				}
				return nil
			})
			return last
		}
		before := waitQuiet()
		dir := filepath.Join("..", "internal", "jobspec", "testdata", "malformed")
		files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
		if err != nil || len(files) < 20 {
			t.Fatalf("want >= 20 malformed files in %s, got %d (%v)", dir, len(files), err)
		}
		huge := filepath.Join(t.TempDir(), "huge.yaml")
		if err := os.WriteFile(huge, append([]byte("name: huge\ntasks:\n"), []byte(strings.Repeat("# padding padding padding\n", 10<<20/26))...), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, huge)
		for _, f := range files {
			expect := "" // the generated huge file has no expectation line
			if f != huge {
				expect = testutil.ReadExpectation(t, f).Text()
			}
			cmd := exec.Command(testutil.Binary(t), "job", "run", f, "--addr", r.APIAddrs[0])
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("%s: want exit code 2, got %v\n%s", filepath.Base(f), err, out)
			}
			if expect != "" && !strings.Contains(string(out), expect) {
				t.Fatalf("%s: message does not name %q:\n%s", filepath.Base(f), expect, out)
			}
		}
		// The server validates too: a spec that skipped the CLI is refused
		// with the field named, before anything is written.
		bad := spec(t, "name: ok\ntasks:\n  - name: a\n    command: \"true\"\n")
		bad.Tasks[0].Resources = &apiaryv1.Resources{MemoryMb: -5}
		bad.Tasks = append(bad.Tasks, &apiaryv1.TaskGroup{Name: "b"})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = c.jobs.SubmitJob(ctx, &apiaryv1.SubmitJobRequest{Spec: bad, ClientId: "x", RequestId: "y"})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "tasks[0].resources.memory_mb") || !strings.Contains(err.Error(), "tasks[1].command") {
			t.Fatalf("server-side validation: %v", err)
		}
		if after := count(); after != before {
			t.Fatalf("invalid input changed etcd: %d keys before, %d after", before, after)
		}
	})
}

func countTotal(c *apiaryv1.TaskCounts) int32 {
	return c.GetPending() + c.GetAssigned() + c.GetRunning() + c.GetComplete() + c.GetFailed() + c.GetCancelled()
}
