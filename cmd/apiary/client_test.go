package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/jobspec"

	"apiary.dev/apiary/internal/testutil"
)

// The CLI tests run the real binary path: the test binary re-executes itself
// as `apiary ARGS...` (TestCLIHelperProcess calls main), so exit codes and
// stderr are exactly what a user gets.

const cliHelperEnv = "APIARY_CLI_TEST_HELPER"

func TestCLIHelperProcess(t *testing.T) {
	if os.Getenv(cliHelperEnv) != "1" {
		t.Skip("helper process for the CLI tests")
	}
	args := os.Args
	for i, a := range args {
		if a == "--" {
			args = args[i+1:]
			break
		}
	}
	os.Args = append([]string{"apiary"}, args...)
	main()
	os.Exit(0)
}

type cliResult struct {
	code           int
	stdout, stderr string
	took           time.Duration
}

// runCLI runs `apiary args...` in a subprocess. env entries are added to a
// copy of the environment without APIARY_ADDR.
func runCLI(t *testing.T, env []string, args ...string) cliResult {
	t.Helper()
	return runCLIInput(t, "", env, args...)
}

// runCLIInput is runCLI with stdin as the command's standard input.
func runCLIInput(t *testing.T, stdin string, env []string, args ...string) cliResult {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^TestCLIHelperProcess$", "--"}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "APIARY_ADDR=") {
			cmd.Env = append(cmd.Env, e)
		}
	}
	cmd.Env = append(cmd.Env, cliHelperEnv+"=1")
	cmd.Env = append(cmd.Env, env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	err := cmd.Run()
	r := cliResult{stdout: out.String(), stderr: errb.String(), took: time.Since(start)}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running the CLI: %v", err)
	}
	return r
}

// closedAddr returns a loopback address nobody listens on (a port reserved
// for this test binary that nothing binds).
func closedAddr(t *testing.T) string {
	t.Helper()
	return testutil.FreeAddr(t)
}

// countingListener accepts and counts TCP connections (proof of dialing).
func countingListener(t *testing.T) (string, *atomic.Int32) {
	t.Helper()
	l := testutil.Listen(t)
	var n atomic.Int32
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			c.Close()
		}
	}()
	t.Cleanup(func() { l.Close() })
	return l.Addr().String(), &n
}

func TestCLIMalformedFilesExit2WithoutDialing(t *testing.T) {
	files, err := filepath.Glob("../../internal/jobspec/testdata/malformed/*.yaml")
	if err != nil || len(files) < 20 {
		t.Fatalf("want >= 20 malformed files, got %d (%v)", len(files), err)
	}
	// The 10 MB file is generated, never committed.
	huge := filepath.Join(t.TempDir(), "huge.yaml")
	var b bytes.Buffer
	b.WriteString("name: huge\ntasks:\n")
	for b.Len() < 10<<20 {
		b.WriteString("  - {name: t, command: echo, args: [\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"]}\n")
	}
	if err := os.WriteFile(huge, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	closed := closedAddr(t)
	listen, dials := countingListener(t)
	for i, path := range append(files, huge) {
		want := "1 MiB"
		if path != huge {
			want = testutil.ReadExpectation(t, path).Text()
		}
		t.Run(filepath.Base(path), func(t *testing.T) {
			// Alternate between a closed port (--addr) and a listener that
			// counts connections ($APIARY_ADDR): neither may be dialed.
			args := []string{"job", "run", path, "--timeout", "5s"}
			var env []string
			if i%2 == 0 {
				args = append(args, "--addr", closed)
			} else {
				env = []string{"APIARY_ADDR=" + listen}
			}
			r := runCLI(t, env, args...)
			if r.code != exitInvalid {
				t.Fatalf("exit %d, want %d (invalid, nothing sent); stderr:\n%s", r.code, exitInvalid, r.stderr)
			}
			if !strings.Contains(r.stderr, want) {
				t.Fatalf("stderr does not contain %q:\n%s", want, r.stderr)
			}
			if !strings.Contains(r.stderr, "nothing was submitted") {
				t.Fatalf("stderr does not say nothing was submitted:\n%s", r.stderr)
			}
			if r.took > 3*time.Second {
				t.Fatalf("took %v", r.took)
			}
		})
	}
	if n := dials.Load(); n != 0 {
		t.Fatalf("the CLI connected %d times for invalid files", n)
	}
}

func TestCLIUnreachableExit3(t *testing.T) {
	r := runCLI(t, nil, "job", "run", "../../examples/hello.yaml", "--addr", closedAddr(t), "--timeout", "1s")
	if r.code != exitUnavailable {
		t.Fatalf("exit %d, want %d; stderr:\n%s", r.code, exitUnavailable, r.stderr)
	}
	if r.took > 4*time.Second {
		t.Fatalf("took %v with --timeout 1s", r.took)
	}
	if !strings.Contains(r.stderr, "unavailable") {
		t.Fatalf("stderr: %s", r.stderr)
	}
	// Every read command too, through $APIARY_ADDR.
	for _, args := range [][]string{{"job", "status", "x-1"}, {"job", "list"}, {"job", "cancel", "x"}, {"job", "logs", "x"}, {"node", "list"}} {
		r := runCLI(t, []string{"APIARY_ADDR=" + closedAddr(t)}, append(args, "--timeout", "300ms")...)
		if r.code != exitUnavailable {
			t.Errorf("%v: exit %d, want 3; stderr: %s", args, r.code, r.stderr)
		}
	}
}

func TestCLIFlagErrorsExit2(t *testing.T) {
	for _, args := range [][]string{
		{"job", "run"},
		{"job", "run", "does-not-exist.yaml"},
		{"job", "run", "../../examples/hello.yaml", "--output", "yaml"},
		{"job", "list", "--state", "sleeping"},
		{"job", "logs", "x", "--task", "-5"},
		{"job", "status"},
	} {
		r := runCLI(t, nil, append(args, "--addr", closedAddr(t))...)
		if r.code != exitInvalid {
			t.Errorf("%v: exit %d, want 2; stderr: %s", args, r.code, r.stderr)
		}
	}
}

// ---------------------------------------------------------------------------
// A fake JobService/AdminService, to test the client side of each call.

type fakeAPI struct {
	apiaryv1.UnimplementedJobServiceServer
	apiaryv1.UnimplementedAdminServiceServer

	mu          sync.Mutex
	submits     []*apiaryv1.SubmitJobRequest
	failSubmits int // fail this many SubmitJob calls with UNAVAILABLE first
	watchCalls  int
	jobs        map[string]*apiaryv1.Job
}

func (f *fakeAPI) SubmitJob(_ context.Context, req *apiaryv1.SubmitJobRequest) (*apiaryv1.SubmitJobResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.submits = append(f.submits, req)
	if f.failSubmits > 0 {
		f.failSubmits--
		return nil, status.Error(codes.Unavailable, "coordinator is electing a leader")
	}
	switch req.GetSpec().GetName() {
	case "reject-me":
		return nil, (&jobspec.ValidationError{Errors: []jobspec.FieldError{{Field: "tasks[0].command", Rule: "not allowed here"}}}).GRPCStatus().Err()
	case "dup":
		return nil, status.Error(codes.AlreadyExists, "request id reused with another payload")
	}
	id := "test-" + req.GetSpec().GetName()
	f.jobs[id] = &apiaryv1.Job{Id: id, Region: "test", Spec: req.GetSpec(), State: apiaryv1.JobState_JOB_STATE_PENDING}
	return &apiaryv1.SubmitJobResponse{JobId: id, Region: "test"}, nil
}

func (f *fakeAPI) GetJob(_ context.Context, req *apiaryv1.GetJobRequest) (*apiaryv1.GetJobResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	j, ok := f.jobs[req.GetJobId()]
	if req.GetJobId() == "down-1" {
		return nil, status.Errorf(codes.Unavailable, "region down of job down-1 is down: no coordinator alive in the WAN pool")
	}
	if !ok {
		return nil, status.Errorf(codes.NotFound, "no job %s", req.GetJobId())
	}
	return &apiaryv1.GetJobResponse{Job: j}, nil
}

func (f *fakeAPI) ListJobs(_ context.Context, req *apiaryv1.ListJobsRequest) (*apiaryv1.ListJobsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	resp := &apiaryv1.ListJobsResponse{UnavailableRegions: []string{"ap-south"}}
	for _, j := range f.jobs {
		if ns := req.GetNamespace(); ns != "" && j.GetSpec().GetNamespace() != ns {
			continue
		}
		if req.GetState() == 0 || req.GetState() == j.GetState() {
			resp.Jobs = append(resp.Jobs, &apiaryv1.Job{Id: j.Id, Region: j.Region, Spec: j.Spec, State: j.State, Counts: j.Counts})
		}
	}
	return resp, nil
}

func (f *fakeAPI) CancelJob(_ context.Context, req *apiaryv1.CancelJobRequest) (*apiaryv1.CancelJobResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	j, ok := f.jobs[req.GetJobId()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "no job %s", req.GetJobId())
	}
	j.CancelRequested = true
	return &apiaryv1.CancelJobResponse{Job: j}, nil
}

// WatchJob plays a script chosen by the job name: "ok" completes, "bad"
// fails, "flaky" breaks the first stream before completing.
func (f *fakeAPI) WatchJob(req *apiaryv1.WatchJobRequest, stream grpc.ServerStreamingServer[apiaryv1.WatchJobResponse]) error {
	f.mu.Lock()
	f.watchCalls++
	calls := f.watchCalls
	j, ok := f.jobs[req.GetJobId()]
	f.mu.Unlock()
	if !ok {
		return status.Errorf(codes.NotFound, "no job %s", req.GetJobId())
	}
	send := func(s apiaryv1.JobState, c *apiaryv1.TaskCounts) error {
		f.mu.Lock()
		j.State, j.Counts = s, c
		snap := &apiaryv1.Job{Id: j.Id, Region: j.Region, Spec: j.Spec, State: s, Counts: c, Tasks: j.Tasks}
		f.mu.Unlock()
		return stream.Send(&apiaryv1.WatchJobResponse{Job: snap})
	}
	if err := send(apiaryv1.JobState_JOB_STATE_RUNNING, &apiaryv1.TaskCounts{Running: 1}); err != nil {
		return err
	}
	name := j.GetSpec().GetName()
	if name == "flaky" && calls == 1 {
		return status.Error(codes.Unavailable, "coordinator went away")
	}
	final := apiaryv1.JobState_JOB_STATE_COMPLETE
	counts := &apiaryv1.TaskCounts{Complete: 1}
	if name == "bad" {
		final, counts = apiaryv1.JobState_JOB_STATE_FAILED, &apiaryv1.TaskCounts{Failed: 1}
	}
	return send(final, counts)
}

func (f *fakeAPI) GetJobLogs(_ context.Context, req *apiaryv1.GetJobLogsRequest) (*apiaryv1.GetJobLogsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.jobs[req.GetJobId()]; !ok {
		return nil, status.Errorf(codes.NotFound, "no job %s", req.GetJobId())
	}
	return &apiaryv1.GetJobLogsResponse{Tasks: []*apiaryv1.Task{{
		JobId: req.GetJobId(), Index: 0, Group: "flaky", State: apiaryv1.TaskState_TASK_STATE_COMPLETE, Attempt: 2,
		Attempts: []*apiaryv1.AttemptResult{
			{Attempt: 1, NodeId: "node-a", Outcome: "retry", ExitCode: 75, StderrTail: "pretending the backend is busy\n"},
			{Attempt: 2, NodeId: "node-b", Outcome: "complete", StdoutTail: "attempt 2: done\n", StartTimeMs: 1000, EndTimeMs: 2500},
		},
	}}}, nil
}

func (f *fakeAPI) ListNodes(context.Context, *apiaryv1.ListNodesRequest) (*apiaryv1.ListNodesResponse, error) {
	return &apiaryv1.ListNodesResponse{Nodes: []*apiaryv1.Node{{
		Id: "node-a", Labels: map[string]string{"zone": "a", "arch": "amd64"}, Epoch: 7, Status: apiaryv1.NodeStatus_NODE_STATUS_READY,
		Capacity: &apiaryv1.Resources{CpuMillis: 8000, MemoryMb: 16384, Gpus: 2}, Allocated: &apiaryv1.Resources{CpuMillis: 1500, MemoryMb: 512},
		Quarantined: true, QuarantineReason: "5 failures in 60s", GpuModel: "a100", RunningTasks: 3,
	}}}, nil
}

func startFake(t *testing.T) (*fakeAPI, string) {
	t.Helper()
	f := &fakeAPI{jobs: map[string]*apiaryv1.Job{}}
	l := testutil.Listen(t)
	s := grpc.NewServer()
	apiaryv1.RegisterJobServiceServer(s, f)
	apiaryv1.RegisterAdminServiceServer(s, f)
	go s.Serve(l)
	t.Cleanup(s.Stop)
	return f, l.Addr().String()
}

func writeJob(t *testing.T, name string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name+".yaml")
	src := "name: " + name + "\ntasks:\n  - name: main\n    command: echo\n    args: [hi]\n"
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCLIRunRetriesWithSameRequestID(t *testing.T) {
	f, addr := startFake(t)
	f.failSubmits = 2
	r := runCLI(t, []string{"APIARY_ADDR=" + addr}, "job", "run", writeJob(t, "hello"), "--timeout", "10s")
	if r.code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", r.code, r.stderr)
	}
	if strings.TrimSpace(r.stdout) != "test-hello" {
		t.Fatalf("stdout %q, want the job id", r.stdout)
	}
	f.mu.Lock()
	submits := append([]*apiaryv1.SubmitJobRequest(nil), f.submits...)
	f.mu.Unlock()
	if len(submits) != 3 {
		t.Fatalf("%d SubmitJob calls, want 3", len(submits))
	}
	first := submits[0]
	if first.GetClientId() == "" || len(first.GetRequestId()) < 16 {
		t.Fatalf("client id %q, request id %q", first.GetClientId(), first.GetRequestId())
	}
	for _, s := range submits[1:] {
		if s.GetRequestId() != first.GetRequestId() || s.GetClientId() != first.GetClientId() {
			t.Fatal("a retry changed the request id or client id")
		}
	}
	// Defaults were applied before sending, and the spec validates server-side.
	if sp := first.GetSpec(); sp.GetPriority() != 50 || sp.GetTasks()[0].GetResources().GetMemoryMb() != 64 || jobspec.Validate(sp) != nil {
		t.Fatalf("sent spec: %v", sp)
	}
	// A second run is a new submission: same client id, new request id.
	r = runCLI(t, []string{"APIARY_ADDR=" + addr}, "job", "run", writeJob(t, "hello"))
	f.mu.Lock()
	last := f.submits[len(f.submits)-1]
	f.mu.Unlock()
	if r.code != 0 || last.GetClientId() != first.GetClientId() || last.GetRequestId() == first.GetRequestId() {
		t.Fatalf("second run: exit %d, ids %v", r.code, last)
	}
	// --request-id is sent as given (a script's own idempotency key), and
	// a malformed one is refused before anything is sent.
	r = runCLI(t, []string{"APIARY_ADDR=" + addr}, "job", "run", "--request-id", "nightly-2026-11-29", writeJob(t, "hello"))
	f.mu.Lock()
	last = f.submits[len(f.submits)-1]
	n := len(f.submits)
	f.mu.Unlock()
	if r.code != 0 || last.GetRequestId() != "nightly-2026-11-29" || last.GetClientId() != first.GetClientId() {
		t.Fatalf("--request-id: exit %d, ids %v", r.code, last)
	}
	for _, key := range []string{"has space", "", strings.Repeat("k", 129)} {
		r = runCLI(t, []string{"APIARY_ADDR=" + addr}, "job", "run", "--request-id", key, writeJob(t, "hello"))
		f.mu.Lock()
		after := len(f.submits)
		f.mu.Unlock()
		if r.code != 2 || !strings.Contains(r.stderr, fmt.Sprintf("--request-id %q", key)) || after != n {
			t.Fatalf("--request-id %q: exit %d, stderr %q, %d submits sent", key, r.code, r.stderr, after-n)
		}
	}
}

func TestCLIRunWaitExitCodes(t *testing.T) {
	_, addr := startFake(t)
	for _, tc := range []struct {
		name string
		code int
	}{{"ok", exitOK}, {"bad", exitJobFailed}, {"flaky", exitOK}} {
		r := runCLI(t, nil, "job", "run", writeJob(t, tc.name), "--wait", "--addr", addr, "--timeout", "5s")
		if r.code != tc.code {
			t.Errorf("%s: exit %d, want %d; stderr:\n%s", tc.name, r.code, tc.code, r.stderr)
		}
		if !strings.Contains(r.stdout, "test-"+tc.name) {
			t.Errorf("%s: stdout has no job status:\n%s", tc.name, r.stdout)
		}
	}
	// JSON: one protojson Job object.
	r := runCLI(t, nil, "job", "run", writeJob(t, "ok"), "--wait", "--addr", addr, "-o", "json")
	var job apiaryv1.Job
	if err := protojson.Unmarshal([]byte(r.stdout), &job); err != nil || job.GetState() != apiaryv1.JobState_JOB_STATE_COMPLETE {
		t.Fatalf("json output %q: %v", r.stdout, err)
	}
}

func TestCLIServerErrors(t *testing.T) {
	_, addr := startFake(t)
	env := []string{"APIARY_ADDR=" + addr}
	r := runCLI(t, env, "job", "run", writeJob(t, "reject-me"))
	if r.code != exitInvalid || !strings.Contains(r.stderr, "tasks[0].command: not allowed here") {
		t.Errorf("server-side invalid: exit %d; stderr:\n%s", r.code, r.stderr)
	}
	r = runCLI(t, env, "job", "run", writeJob(t, "dup"))
	if r.code != exitInvalid || !strings.Contains(r.stderr, "already exists") {
		t.Errorf("already exists: exit %d; stderr:\n%s", r.code, r.stderr)
	}
	for _, args := range [][]string{{"job", "status", "nope-1"}, {"job", "cancel", "nope-1"}, {"job", "logs", "nope-1"}} {
		r = runCLI(t, env, args...)
		if r.code != exitInvalid || !strings.Contains(r.stderr, "job nope-1 not found") {
			t.Errorf("%v: exit %d; stderr:\n%s", args, r.code, r.stderr)
		}
	}
	// The server answers UNAVAILABLE for what is behind it: its answer,
	// not a hint about the address, within --timeout.
	r = runCLI(t, env, "job", "status", "down-1", "--timeout", "1s")
	if r.code != exitUnavailable || !strings.Contains(r.stderr, "answered that it cannot do this now: ") ||
		!strings.Contains(r.stderr, "region down of job down-1 is down") || strings.Contains(r.stderr, "the address comes from") {
		t.Errorf("a region down behind the server: exit %d; stderr:\n%s", r.code, r.stderr)
	}
	// --addr wins over $APIARY_ADDR.
	r = runCLI(t, []string{"APIARY_ADDR=" + closedAddr(t)}, "job", "list", "--addr", addr)
	if r.code != exitOK {
		t.Errorf("--addr did not override $APIARY_ADDR: exit %d; stderr:\n%s", r.code, r.stderr)
	}
}

func TestCLIReadCommandsOutput(t *testing.T) {
	_, addr := startFake(t)
	env := []string{"APIARY_ADDR=" + addr}
	if r := runCLI(t, env, "job", "run", writeJob(t, "ok"), "--wait"); r.code != 0 {
		t.Fatalf("run: %d %s", r.code, r.stderr)
	}
	r := runCLI(t, env, "job", "status", "test-ok")
	if r.code != 0 || !strings.Contains(r.stdout, "State:") || !strings.Contains(r.stdout, "COMPLETE") {
		t.Errorf("status: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "job", "status", "test-ok", "-o", "json")
	var job apiaryv1.Job
	if err := protojson.Unmarshal([]byte(r.stdout), &job); err != nil || job.GetId() != "test-ok" {
		t.Errorf("status json %q: %v", r.stdout, err)
	}
	r = runCLI(t, env, "job", "list", "--state", "complete")
	if r.code != 0 || !strings.Contains(r.stdout, "test-ok") || !strings.Contains(r.stderr, "ap-south") {
		t.Errorf("list: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "job", "logs", "test-ok")
	if r.code != 0 || !strings.Contains(r.stdout, "attempt 1 on node-a: retry, exit 75") ||
		!strings.Contains(r.stdout, "pretending the backend is busy") || !strings.Contains(r.stdout, "attempt 2: done") {
		t.Errorf("logs: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "job", "cancel", "test-ok")
	if r.code != 0 || !strings.Contains(r.stdout, "already ended") {
		t.Errorf("cancel: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "node", "list")
	if r.code != 0 || !strings.Contains(r.stdout, "node-a") || !strings.Contains(r.stdout, "5 failures in 60s") ||
		!strings.Contains(r.stdout, "1500/8000") || !strings.Contains(r.stdout, "arch=amd64,zone=a") {
		t.Errorf("node list: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	t.Logf("node list:\n%s", r.stdout)
}

func TestCLIWaitSurvivesBrokenStream(t *testing.T) {
	f, addr := startFake(t)
	r := runCLI(t, nil, "job", "run", writeJob(t, "flaky"), "--wait", "--addr", addr, "--timeout", "5s")
	f.mu.Lock()
	calls := f.watchCalls
	f.mu.Unlock()
	if r.code != exitOK || calls < 2 {
		t.Fatalf("exit %d after %d WatchJob calls; stderr:\n%s", r.code, calls, r.stderr)
	}
	t.Logf("stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
}

func TestPrintJobTable(t *testing.T) {
	job := &apiaryv1.Job{
		Id: "eu-west-01h", Region: "eu-west", Shard: 17, Spec: &apiaryv1.JobSpec{Name: "fanout"},
		State:  apiaryv1.JobState_JOB_STATE_RUNNING,
		Counts: &apiaryv1.TaskCounts{Complete: 1, Running: 1, Pending: 1, Failed: 1},
		Tasks: []*apiaryv1.Task{
			{Index: 0, Group: "shard", State: apiaryv1.TaskState_TASK_STATE_COMPLETE, Attempt: 1, NodeId: "node-a",
				Attempts: []*apiaryv1.AttemptResult{{Attempt: 1, Outcome: "complete", EndTimeMs: 1}}},
			{Index: 1, Group: "shard", State: apiaryv1.TaskState_TASK_STATE_RUNNING, Attempt: 2, NodeId: "node-b"},
			{Index: 2, Group: "shard", State: apiaryv1.TaskState_TASK_STATE_PENDING, UnplacedReason: "memory: 3 nodes, constraint arch=arm64: 5 nodes"},
			{Index: 3, Group: "shard", State: apiaryv1.TaskState_TASK_STATE_FAILED, Attempt: 3, NodeId: "node-c",
				Error: "exit code 2 is not retryable", Attempts: []*apiaryv1.AttemptResult{{Attempt: 3, Outcome: "failed", ExitCode: 2, EndTimeMs: 1}}},
		},
	}
	var b bytes.Buffer
	printJob(&b, job)
	out := b.String()
	for _, want := range []string{"INDEX  GROUP  STATE", "UNPLACED_REASON", "memory: 3 nodes, constraint arch=arm64: 5 nodes",
		"exit code 2 is not retryable", "eu-west (shard 17)", "4 total: 1 complete, 1 running"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
	t.Logf("\n%s", out)
}

// A wrong address (connection refused on every address, nothing ever
// answered) fails within 3 s with the default --timeout of 30 s.
func TestCLIRefusedFailsFast(t *testing.T) {
	for _, args := range [][]string{
		{"job", "run", "../../examples/hello.yaml", "--addr", closedAddr(t) + "," + closedAddr(t)},
		{"job", "status", "eu-west-1", "--addr", closedAddr(t)},
		{"node", "list", "--addr", closedAddr(t)},
		{"region", "list", "--addr", closedAddr(t)},
		{"region", "status", "--addr", closedAddr(t)},
	} {
		r := runCLI(t, nil, args...)
		if r.code != exitUnavailable {
			t.Errorf("%v: exit %d, want %d; stderr:\n%s", args, r.code, exitUnavailable, r.stderr)
		}
		if r.took >= 3*time.Second {
			t.Errorf("%v: took %v, want < 3s", args, r.took)
		}
		if !strings.Contains(r.stderr, "nothing answers there") || !strings.Contains(r.stderr, "connection refused") {
			t.Errorf("%v: stderr does not say nothing answers:\n%s", args, r.stderr)
		}
		t.Logf("%v: exit %d in %v: %s", args, r.code, r.took.Round(time.Millisecond), strings.TrimSpace(r.stderr))
	}
}

// A server that answers UNAVAILABLE (a coordinator electing a leader) is
// still retried for --timeout, not given up on after RefusedBudget.
func TestCLIServerUnavailableRetriedForTimeout(t *testing.T) {
	f, addr := startFake(t)
	f.failSubmits = 1000
	r := runCLI(t, nil, "job", "run", writeJob(t, "hello"), "--addr", addr, "--timeout", "4s")
	if r.code != exitUnavailable || r.took < 4*time.Second {
		t.Fatalf("exit %d after %v, want 3 after --timeout 4s; stderr:\n%s", r.code, r.took, r.stderr)
	}
	if !strings.Contains(r.stderr, "electing a leader") {
		t.Fatalf("stderr:\n%s", r.stderr)
	}
}
