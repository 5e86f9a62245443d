package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/testutil"
)

// fakeCoord is a test double of a regional coordinator's AgentService: a
// real gRPC server on loopback that keeps epochs, re-sends the current
// assignments on every stream open, and records reports.
type fakeCoord struct {
	apiaryv1.UnimplementedAgentServiceServer
	addr string

	mu          sync.Mutex
	nextEpoch   int64
	valid       map[int64]bool
	registers   []*apiaryv1.RegisterNodeRequest
	streams     map[int]*fakeStream
	nextStream  int
	current     []*apiaryv1.Assignment
	reports     []*apiaryv1.ReportTaskStatusRequest
	reject      func(*apiaryv1.ReportTaskStatusRequest) string
	failReports int // answer this many reports with UNAVAILABLE first
	failed      int
	leaseTTLms  int64  // default 5000
	hbDown      bool   // answer heartbeats with UNAVAILABLE
	refuse      string // answer registrations with UNAUTHENTICATED and this message
	// loseRegisters: answer this many registrations with UNAVAILABLE (an
	// answer lost after the region committed); registerCalls records every
	// RegisterNode call, answered or not.
	loseRegisters int
	registerCalls []*apiaryv1.RegisterNodeRequest
	drainMs       int64 // HeartbeatResponse.drain_deadline_ms
	hbEveryMs     int64 // HeartbeatResponse.heartbeat_interval_ms
	beats         int   // heartbeats answered
	// adopt decides AdoptAttempts (nil: refuse all); adoptions records
	// the requests; drains and deregisters the epochs of those calls.
	adopt       func(*apiaryv1.AttemptRef) bool
	adoptions   []*apiaryv1.AdoptAttemptsRequest
	drains      []*apiaryv1.DrainSelfRequest
	deregisters []int64
}

func (f *fakeCoord) AdoptAttempts(_ context.Context, req *apiaryv1.AdoptAttemptsRequest) (*apiaryv1.AdoptAttemptsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.valid[req.GetNodeEpoch()] {
		return nil, status.Error(codes.FailedPrecondition, "node epoch gone")
	}
	f.adoptions = append(f.adoptions, req)
	out := &apiaryv1.AdoptAttemptsResponse{}
	for _, r := range req.GetAttempts() {
		ok := f.adopt != nil && f.adopt(r)
		out.Decisions = append(out.Decisions, &apiaryv1.AdoptDecision{Attempt: r, Adopted: ok})
	}
	return out, nil
}

func (f *fakeCoord) DrainSelf(_ context.Context, req *apiaryv1.DrainSelfRequest) (*apiaryv1.DrainSelfResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.drains = append(f.drains, req)
	return &apiaryv1.DrainSelfResponse{}, nil
}

func (f *fakeCoord) Deregister(_ context.Context, req *apiaryv1.DeregisterRequest) (*apiaryv1.DeregisterResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deregisters = append(f.deregisters, req.GetNodeEpoch())
	delete(f.valid, req.GetNodeEpoch())
	return &apiaryv1.DeregisterResponse{}, nil
}

type fakeStream struct {
	via   *hangable // nil when served by the fake itself
	epoch int64
	ch    chan *apiaryv1.Assignment
	kill  chan struct{}
}

func startFake(t *testing.T) *fakeCoord {
	t.Helper()
	lis := testutil.Listen(t)
	f := &fakeCoord{addr: lis.Addr().String(), valid: map[int64]bool{}, streams: map[int]*fakeStream{}}
	srv := grpc.NewServer()
	apiaryv1.RegisterAgentServiceServer(srv, f)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return f
}

func (f *fakeCoord) RegisterNode(_ context.Context, req *apiaryv1.RegisterNodeRequest) (*apiaryv1.RegisterNodeResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if strings.Contains(req.GetNodeId(), "/") {
		return nil, status.Error(codes.InvalidArgument, "node_id: bad")
	}
	f.registerCalls = append(f.registerCalls, req)
	if f.refuse != "" {
		return nil, status.Error(codes.Unauthenticated, f.refuse)
	}
	if f.loseRegisters > 0 {
		f.loseRegisters--
		return nil, status.Error(codes.Unavailable, "answer lost")
	}
	f.nextEpoch++
	f.valid[f.nextEpoch] = true
	f.registers = append(f.registers, req)
	ttl := f.leaseTTLms
	if ttl == 0 {
		ttl = 5000
	}
	return &apiaryv1.RegisterNodeResponse{NodeEpoch: f.nextEpoch, LeaseTtlMs: ttl, HeartbeatIntervalMs: 30, Region: "r1"}, nil
}

func (f *fakeCoord) Heartbeat(_ context.Context, req *apiaryv1.HeartbeatRequest) (*apiaryv1.HeartbeatResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.hbDown {
		return nil, status.Error(codes.Unavailable, "heartbeats down")
	}
	if !f.valid[req.GetNodeEpoch()] {
		return nil, status.Error(codes.FailedPrecondition, "node epoch gone")
	}
	f.beats++
	return &apiaryv1.HeartbeatResponse{LeaseTtlMs: f.leaseTTLms, DrainDeadlineMs: f.drainMs, HeartbeatIntervalMs: f.hbEveryMs}, nil
}

func (f *fakeCoord) StreamAssignments(req *apiaryv1.StreamAssignmentsRequest, st grpc.ServerStreamingServer[apiaryv1.StreamAssignmentsResponse]) error {
	return f.stream(nil, req, st)
}

func (f *fakeCoord) stream(via *hangable, req *apiaryv1.StreamAssignmentsRequest, st grpc.ServerStreamingServer[apiaryv1.StreamAssignmentsResponse]) error {
	f.mu.Lock()
	if !f.valid[req.GetNodeEpoch()] {
		f.mu.Unlock()
		return status.Error(codes.FailedPrecondition, "node epoch gone")
	}
	s := &fakeStream{via: via, epoch: req.GetNodeEpoch(), ch: make(chan *apiaryv1.Assignment, 1000), kill: make(chan struct{})}
	for _, a := range f.current {
		s.ch <- a
	}
	id := f.nextStream
	f.nextStream++
	f.streams[id] = s
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.streams, id)
		f.mu.Unlock()
	}()
	for {
		select {
		case <-st.Context().Done():
			return nil
		case <-s.kill:
			return status.Error(codes.Unavailable, "stream killed by test")
		case a := <-s.ch:
			if err := st.Send(&apiaryv1.StreamAssignmentsResponse{Assignment: a}); err != nil {
				return err
			}
		}
	}
}

func (f *fakeCoord) ReportTaskStatus(_ context.Context, req *apiaryv1.ReportTaskStatusRequest) (*apiaryv1.ReportTaskStatusResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failed < f.failReports {
		f.failed++
		return nil, status.Error(codes.Unavailable, "flaky")
	}
	f.reports = append(f.reports, req)
	reject := f.reject
	f.mu.Unlock()
	defer f.mu.Lock()
	if reject != nil {
		if reason := reject(req); reason != "" {
			return &apiaryv1.ReportTaskStatusResponse{Accepted: false, Reason: reason}, nil
		}
	}
	return &apiaryv1.ReportTaskStatusResponse{Accepted: true}, nil
}

// push makes a current (re-sent on open) and sends it on every open stream.
func (f *fakeCoord) push(a *apiaryv1.Assignment) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.current = append(f.current, a)
	for _, s := range f.streams {
		if s.via == nil || !s.via.hung.Load() {
			s.ch <- a
		}
	}
}

// hangable serves the same fake coordinator on a second address, and can
// hang like a paused process: calls block, open streams deliver nothing, but
// connections stay up.
type hangable struct {
	*fakeCoord
	addr string
	hung atomic.Bool
}

func (h *hangable) serve(t *testing.T) {
	lis := testutil.Listen(t)
	h.addr = lis.Addr().String()
	srv := grpc.NewServer()
	apiaryv1.RegisterAgentServiceServer(srv, h)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
}

func (h *hangable) block(ctx context.Context) {
	if h.hung.Load() {
		<-ctx.Done()
	}
}

func (h *hangable) RegisterNode(ctx context.Context, req *apiaryv1.RegisterNodeRequest) (*apiaryv1.RegisterNodeResponse, error) {
	h.block(ctx)
	return h.fakeCoord.RegisterNode(ctx, req)
}

func (h *hangable) Heartbeat(ctx context.Context, req *apiaryv1.HeartbeatRequest) (*apiaryv1.HeartbeatResponse, error) {
	h.block(ctx)
	return h.fakeCoord.Heartbeat(ctx, req)
}

func (h *hangable) StreamAssignments(req *apiaryv1.StreamAssignmentsRequest, st grpc.ServerStreamingServer[apiaryv1.StreamAssignmentsResponse]) error {
	h.block(st.Context())
	return h.fakeCoord.stream(h, req, st)
}

func (h *hangable) ReportTaskStatus(ctx context.Context, req *apiaryv1.ReportTaskStatusRequest) (*apiaryv1.ReportTaskStatusResponse, error) {
	h.block(ctx)
	return h.fakeCoord.ReportTaskStatus(ctx, req)
}

// killStreams ends every open stream with UNAVAILABLE.
func (f *fakeCoord) killStreams() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, s := range f.streams {
		close(s.kill)
		delete(f.streams, id)
	}
}

// expire ends an epoch, as a lapsed lease would.
func (f *fakeCoord) expire(epoch int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.valid, epoch)
}

func (f *fakeCoord) numRegisters() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.registers)
}

// waitStream waits until a stream of epoch is open.
func (f *fakeCoord) waitStream(t *testing.T, epoch int64) {
	t.Helper()
	f.waitStreamThat(t, func(s *fakeStream) bool { return s.epoch == epoch }, "a stream of epoch %d", epoch)
}

// waitStreamThat waits until an open stream satisfies ok; what (formatted
// with args) names it in the failure.
func (f *fakeCoord) waitStreamThat(t *testing.T, ok func(*fakeStream) bool, what string, args ...any) {
	t.Helper()
	waitFor(t, 10*time.Second, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, s := range f.streams {
			if ok(s) {
				return true
			}
		}
		return false
	}, what, args...)
}

// reportsFor returns the reports on key so far.
func (f *fakeCoord) reportsFor(key AttemptKey) []*apiaryv1.ReportTaskStatusRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*apiaryv1.ReportTaskStatusRequest
	for _, r := range f.reports {
		if r.GetJobId() == key.JobID && r.GetTaskIndex() == key.TaskIndex && r.GetAttempt() == key.Attempt {
			out = append(out, r)
		}
	}
	return out
}

// waitReport waits for a report of kind on key and returns it.
func (f *fakeCoord) waitReport(t *testing.T, key AttemptKey, kind apiaryv1.ReportKind) *apiaryv1.ReportTaskStatusRequest {
	t.Helper()
	var got *apiaryv1.ReportTaskStatusRequest
	waitFor(t, 15*time.Second, func() bool {
		for _, r := range f.reportsFor(key) {
			if r.GetKind() == kind {
				got = r
				return true
			}
		}
		return false
	}, "%s report for %s", kind, key)
	return got
}

type testAgent struct {
	*Agent
	dataDir string
	cancel  context.CancelFunc
	done    chan error
	once    sync.Once
}

// startAgent runs an agent against addrs until the test ends.
// startingAt orders two addresses so that the agent of nodeID starts at
// first (its start is the address its node id hashes to).
func startingAt(nodeID, first, second string) []string {
	if startIndex(nodeID, 2) == 0 {
		return []string{first, second}
	}
	return []string{second, first}
}

func startAgent(t *testing.T, addrs []string, mod func(*Config)) *testAgent {
	t.Helper()
	cfg := Config{
		NodeID:           "n1",
		Labels:           map[string]string{"zone": "z1"},
		Capacity:         Resources{CPUMillis: 4000, MemoryMB: 4096},
		DataDir:          t.TempDir(),
		CoordinatorAddrs: addrs,
		KillGrace:        500 * time.Millisecond,
		RPCTimeout:       2 * time.Second,
		MinBackoff:       10 * time.Millisecond,
		MaxBackoff:       200 * time.Millisecond,
		Logger:           slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if mod != nil {
		mod(&cfg)
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ta := &testAgent{Agent: a, dataDir: a.Config().DataDir, cancel: cancel, done: make(chan error, 1)}
	go func() { ta.done <- a.Run(ctx) }()
	t.Cleanup(func() { ta.stop(t) })
	return ta
}

// startConnected starts a fake coordinator and an agent against it (mod, if
// not nil, adjusts the agent's config), and waits until the agent is
// registered and has opened its assignment stream. It returns the epoch.
func startConnected(t *testing.T, mod func(*Config)) (*fakeCoord, *testAgent, int64) {
	t.Helper()
	f := startFake(t)
	ta := startAgent(t, []string{f.addr}, mod)
	epoch := ta.waitEpoch(t, 1)
	f.waitStream(t, epoch)
	return f, ta, epoch
}

// sync runs a sentinel assignment and waits for it to exit: the agent has
// handled every assignment pushed before it.
func (f *fakeCoord) sync(t *testing.T, epoch int64) {
	t.Helper()
	sentinel := AttemptKey{JobID: "r1-sentinel", TaskIndex: 0, Attempt: 1}
	f.push(runAsg(epoch, sentinel, "exit 0"))
	f.waitReport(t, sentinel, apiaryv1.ReportKind_REPORT_KIND_EXITED)
}

// stop cancels Run and waits for it to return.
func (ta *testAgent) stop(t *testing.T) {
	t.Helper()
	ta.once.Do(func() {
		ta.cancel()
		select {
		case err := <-ta.done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("Run did not return after cancel")
		}
	})
}

// waitEpoch waits until the agent is registered with an epoch >= min.
func (ta *testAgent) waitEpoch(t *testing.T, min int64) int64 {
	t.Helper()
	var e int64
	waitFor(t, 10*time.Second, func() bool { e = ta.Epoch(); return e >= min }, "epoch >= %d", min)
	return e
}

func (ta *testAgent) workDir(key AttemptKey) string {
	d, _ := ta.Agent.workDir(key)
	return d
}

func runAsg(epoch int64, key AttemptKey, script string) *apiaryv1.Assignment {
	return &apiaryv1.Assignment{
		Kind:         apiaryv1.Assignment_KIND_RUN,
		JobId:        key.JobID,
		TaskIndex:    key.TaskIndex,
		Attempt:      key.Attempt,
		NodeEpoch:    epoch,
		FencingToken: int64(key.Attempt) * 10,
		Command:      "sh",
		Args:         []string{"-c", script},
		Resources:    &apiaryv1.Resources{CpuMillis: 100, MemoryMb: 16},
	}
}

func cancelAsg(epoch int64, key AttemptKey) *apiaryv1.Assignment {
	return &apiaryv1.Assignment{Kind: apiaryv1.Assignment_KIND_CANCEL, JobId: key.JobID,
		TaskIndex: key.TaskIndex, Attempt: key.Attempt, NodeEpoch: epoch}
}

func kinds(rs []*apiaryv1.ReportTaskStatusRequest) []apiaryv1.ReportKind {
	var out []apiaryv1.ReportKind
	for _, r := range rs {
		out = append(out, r.GetKind())
	}
	return out
}

func TestAgentRegisterStreamRunReport(t *testing.T) {
	f, ta, epoch := startConnected(t, nil)

	reg := f.registers[0]
	if reg.GetNodeId() != "n1" || reg.GetLabels()["zone"] != "z1" || reg.GetCapacity().GetCpuMillis() != 4000 ||
		reg.GetCapacity().GetMemoryMb() != 4096 {
		t.Fatalf("register request %v", reg)
	}

	key := AttemptKey{JobID: "r1-job1", TaskIndex: 2, Attempt: 3}
	a := runAsg(epoch, key, `echo "$APIARY_JOB_ID $APIARY_TASK_INDEX $APIARY_ATTEMPT $APIARY_REGION $APIARY_NODE_ID $APIARY_FENCING_TOKEN $FOO"; echo oops >&2; sleep 0.2; exit 3`)
	a.Env = map[string]string{"FOO": "bar", "APIARY_NODE_ID": "spoofed"}
	f.push(a)

	ex := f.waitReport(t, key, apiaryv1.ReportKind_REPORT_KIND_EXITED)
	if ex.GetExitCode() != 3 || ex.GetNodeEpoch() != epoch || ex.GetNodeId() != "n1" {
		t.Fatalf("EXITED report %v", ex)
	}
	if want := "r1-job1 2 3 r1 n1 30 bar\n"; ex.GetStdoutTail() != want {
		t.Fatalf("stdout tail %q, want %q", ex.GetStdoutTail(), want)
	}
	if ex.GetStderrTail() != "oops\n" || ex.GetStartTimeMs() == 0 || ex.GetEndTimeMs() < ex.GetStartTimeMs() {
		t.Fatalf("EXITED report %v", ex)
	}
	if ks := kinds(f.reportsFor(key)); len(ks) != 2 || ks[0] != apiaryv1.ReportKind_REPORT_KIND_STARTED {
		t.Fatalf("reports %v, want STARTED then EXITED", ks)
	}
	b, err := os.ReadFile(filepath.Join(ta.workDir(key), "stdout.log"))
	if err != nil || !strings.HasPrefix(string(b), "r1-job1 2 3") {
		t.Fatalf("full log %q %v", b, err)
	}
	if want := filepath.Join(ta.dataDir, "work", "r1-job1", "2", "3"); ta.workDir(key) != want {
		t.Fatalf("work dir %s, want %s", ta.workDir(key), want)
	}
	waitFor(t, 5*time.Second, func() bool { _, n := ta.Used(); return n == 0 }, "ledger released")
}

func TestAgentEpochLostKillsAttemptsAndReregisters(t *testing.T) {
	f, ta, e1 := startConnected(t, nil)

	key := AttemptKey{JobID: "r1-long", TaskIndex: 0, Attempt: 1}
	f.push(runAsg(e1, key, `sleep 100 & echo $! > pids; echo $$ >> pids; wait`))
	f.waitReport(t, key, apiaryv1.ReportKind_REPORT_KIND_STARTED)
	pids := readPids(t, filepath.Join(ta.workDir(key), "pids"), 2)

	f.mu.Lock()
	f.current = nil // the coordinator reclaimed the epoch's tasks
	f.mu.Unlock()
	f.expire(e1)

	e2 := ta.waitEpoch(t, e1+1)
	if f.numRegisters() != 2 {
		t.Fatalf("registers %d, want 2", f.numRegisters())
	}
	// SIGKILL is delivered asynchronously: wait (bounded) for each to die.
	for _, p := range pids {
		waitFor(t, 5*time.Second, func() bool { return processGone(p) }, "pid %d of the lost epoch gone after re-registration", p)
	}
	// The new epoch works, and the old attempt was never reported again.
	f.waitStream(t, e2)
	k2 := AttemptKey{JobID: "r1-after", TaskIndex: 0, Attempt: 1}
	f.push(runAsg(e2, k2, "exit 0"))
	f.waitReport(t, k2, apiaryv1.ReportKind_REPORT_KIND_EXITED)
	if ks := kinds(f.reportsFor(key)); len(ks) != 1 {
		t.Fatalf("reports for the abandoned attempt %v, want only STARTED", ks)
	}
}

// TestAgentRetriesRegistrationWithOneID: the retries of one registration
// (answers lost) carry the id of the first call, so the region can answer a
// retry of a call that committed with that call's epoch; the registration
// after the epoch ends is a new one, with a new id.
func TestAgentRetriesRegistrationWithOneID(t *testing.T) {
	f := startFake(t)
	f.mu.Lock()
	f.loseRegisters = 2
	f.mu.Unlock()
	ta := startAgent(t, []string{f.addr}, nil)
	e1 := ta.waitEpoch(t, 1)
	f.expire(e1)
	ta.waitEpoch(t, e1+1)
	f.mu.Lock()
	calls := slices.Clone(f.registerCalls)
	f.mu.Unlock()
	if len(calls) != 4 {
		t.Fatalf("%d RegisterNode calls, want 4 (two lost answers, the epoch, the next epoch)", len(calls))
	}
	first := calls[0].GetRegistrationId()
	if first == "" {
		t.Fatal("registration sent without a registration_id")
	}
	for i, c := range calls[1:3] {
		if c.GetRegistrationId() != first {
			t.Fatalf("retry %d sent registration_id %q, want the first call's %q", i+1, c.GetRegistrationId(), first)
		}
	}
	if next := calls[3].GetRegistrationId(); next == "" || next == first {
		t.Fatalf("the registration after the epoch ended sent registration_id %q; want a new one (not %q)", next, first)
	}
}

func TestAgentDuplicateAssignmentRunsOnce(t *testing.T) {
	f, _, epoch := startConnected(t, nil)

	count := filepath.Join(t.TempDir(), "count")
	key := AttemptKey{JobID: "r1-dup", TaskIndex: 0, Attempt: 1}
	a := runAsg(epoch, key, "echo x >> "+count)
	f.push(a)
	f.push(a)
	f.waitReport(t, key, apiaryv1.ReportKind_REPORT_KIND_EXITED)
	// A reconnect re-sends every current assignment.
	f.killStreams()
	f.waitStream(t, epoch)
	f.push(a)
	f.sync(t, epoch)

	b, _ := os.ReadFile(count)
	if n := strings.Count(string(b), "x"); n != 1 {
		t.Fatalf("ran %d times, want 1", n)
	}
	// One end reported, at most one STARTED (none when the task ended
	// within startedReportDelay, 100 ms: not always so on a loaded host).
	ks := kinds(f.reportsFor(key))
	exited, started := 0, 0
	for _, k := range ks {
		switch k {
		case apiaryv1.ReportKind_REPORT_KIND_EXITED:
			exited++
		case apiaryv1.ReportKind_REPORT_KIND_STARTED:
			started++
		default:
			t.Fatalf("reports %v: unexpected %s", ks, k)
		}
	}
	if exited != 1 || started > 1 {
		t.Fatalf("reports %v, want one EXITED and at most one STARTED", ks)
	}
}

func TestAgentIgnoresOtherEpochAssignments(t *testing.T) {
	f, ta, epoch := startConnected(t, nil)

	stale := AttemptKey{JobID: "r1-stale", TaskIndex: 0, Attempt: 1}
	future := AttemptKey{JobID: "r1-future", TaskIndex: 0, Attempt: 1}
	f.push(runAsg(epoch-1, stale, "exit 0"))
	f.push(runAsg(epoch+5, future, "exit 0"))
	f.sync(t, epoch)
	for _, k := range []AttemptKey{stale, future} {
		if rs := f.reportsFor(k); len(rs) != 0 {
			t.Fatalf("%s: reports %v, want none", k, kinds(rs))
		}
		if _, err := os.Stat(ta.workDir(k)); !os.IsNotExist(err) {
			t.Fatalf("%s: work dir exists (%v)", k, err)
		}
	}
}

func TestAgentCancel(t *testing.T) {
	f, ta, epoch := startConnected(t, nil)

	key := AttemptKey{JobID: "r1-cancel", TaskIndex: 1, Attempt: 1}
	f.push(runAsg(epoch, key, `sleep 100 & echo $! > pids; echo $$ >> pids; wait`))
	f.waitReport(t, key, apiaryv1.ReportKind_REPORT_KIND_STARTED)
	pids := readPids(t, filepath.Join(ta.workDir(key), "pids"), 2)
	f.push(cancelAsg(epoch, key))
	r := f.waitReport(t, key, apiaryv1.ReportKind_REPORT_KIND_CANCELLED)
	if r.GetExitCode() != -1 {
		t.Fatalf("CANCELLED report %v", r)
	}
	// SIGKILL is delivered asynchronously: wait (bounded) for each to die.
	for _, p := range pids {
		waitFor(t, 5*time.Second, func() bool { return processGone(p) }, "pid %d gone after cancel", p)
	}

	// A cancel that arrives before its RUN: reported, and the RUN never runs.
	early := AttemptKey{JobID: "r1-early", TaskIndex: 0, Attempt: 1}
	f.push(cancelAsg(epoch, early))
	f.push(runAsg(epoch, early, "exit 0"))
	f.sync(t, epoch)
	f.waitReport(t, early, apiaryv1.ReportKind_REPORT_KIND_CANCELLED)
	if ks := kinds(f.reportsFor(early)); len(ks) != 1 {
		t.Fatalf("early-cancelled attempt reports %v, want only CANCELLED", ks)
	}
}

func TestAgentTimeout(t *testing.T) {
	f, _, epoch := startConnected(t, nil)

	key := AttemptKey{JobID: "r1-slow", TaskIndex: 0, Attempt: 1}
	a := runAsg(epoch, key, `echo begin; sleep 100`)
	a.TimeoutMs = 200
	f.push(a)
	r := f.waitReport(t, key, apiaryv1.ReportKind_REPORT_KIND_TIMED_OUT)
	if r.GetExitCode() != -1 || r.GetStdoutTail() != "begin\n" {
		t.Fatalf("TIMED_OUT report %v", r)
	}
}

func TestAgentRefusesWhatDoesNotFit(t *testing.T) {
	f, ta, epoch := startConnected(t, func(c *Config) {
		c.Capacity = Resources{CPUMillis: 1000, MemoryMB: 1024}
		c.MaxTasks = 1
	})

	big := AttemptKey{JobID: "r1-big", TaskIndex: 0, Attempt: 1}
	a := runAsg(epoch, big, "exit 0")
	a.Resources = &apiaryv1.Resources{CpuMillis: 2000, MemoryMb: 10}
	f.push(a)
	r := f.waitReport(t, big, apiaryv1.ReportKind_REPORT_KIND_REFUSED)
	if !strings.Contains(r.GetError(), "cpu") {
		t.Fatalf("REFUSED error %q", r.GetError())
	}

	hold := AttemptKey{JobID: "r1-hold", TaskIndex: 0, Attempt: 1}
	f.push(runAsg(epoch, hold, "sleep 100"))
	f.waitReport(t, hold, apiaryv1.ReportKind_REPORT_KIND_STARTED)
	second := AttemptKey{JobID: "r1-second", TaskIndex: 0, Attempt: 1}
	f.push(runAsg(epoch, second, "exit 0"))
	r = f.waitReport(t, second, apiaryv1.ReportKind_REPORT_KIND_REFUSED)
	if !strings.Contains(r.GetError(), "max tasks") {
		t.Fatalf("REFUSED error %q", r.GetError())
	}
	if ks := kinds(f.reportsFor(big)); len(ks) != 1 {
		t.Fatalf("refused attempt reports %v", ks)
	}
	if _, err := os.Stat(ta.workDir(second)); !os.IsNotExist(err) {
		t.Fatalf("refused attempt has a work dir (%v)", err)
	}
}

func TestAgentStartFailed(t *testing.T) {
	f, ta, epoch := startConnected(t, nil)

	key := AttemptKey{JobID: "r1-nocmd", TaskIndex: 0, Attempt: 1}
	a := runAsg(epoch, key, "")
	a.Command, a.Args = "apiary-no-such-command-xyz", nil
	f.push(a)
	r := f.waitReport(t, key, apiaryv1.ReportKind_REPORT_KIND_START_FAILED)
	if !strings.Contains(r.GetError(), "not found") {
		t.Fatalf("START_FAILED error %q", r.GetError())
	}
	if r.GetFault() != apiaryv1.FailureFault_FAILURE_FAULT_JOB {
		t.Fatalf("command not found: fault %s, want JOB", r.GetFault())
	}
	bad := AttemptKey{JobID: "../escape", TaskIndex: 0, Attempt: 1}
	f.push(runAsg(epoch, bad, "exit 0"))
	if r := f.waitReport(t, bad, apiaryv1.ReportKind_REPORT_KIND_START_FAILED); r.GetFault() != apiaryv1.FailureFault_FAILURE_FAULT_JOB {
		t.Fatalf("unusable job id: fault %s, want JOB", r.GetFault())
	}
	// The agent's own path is broken: a file where the job's work dir goes.
	broken := AttemptKey{JobID: "r1-brokendir", TaskIndex: 0, Attempt: 1}
	jobDir := filepath.Dir(filepath.Dir(ta.workDir(broken)))
	if err := os.MkdirAll(filepath.Dir(jobDir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(jobDir, []byte("not a dir"), 0o644); err != nil {
		t.Fatal(err)
	}
	f.push(runAsg(epoch, broken, "exit 0"))
	r = f.waitReport(t, broken, apiaryv1.ReportKind_REPORT_KIND_START_FAILED)
	if r.GetFault() != apiaryv1.FailureFault_FAILURE_FAULT_NODE || !strings.Contains(r.GetError(), "work dir") {
		t.Fatalf("broken work dir: fault %s error %q, want NODE and a work dir error", r.GetFault(), r.GetError())
	}
	waitFor(t, 5*time.Second, func() bool { _, n := ta.Used(); return n == 0 }, "ledger released")
}

func TestAgentRejectedReportKillsAttempt(t *testing.T) {
	f := startFake(t)
	pidFile := filepath.Join(t.TempDir(), "pids")
	pidc := make(chan int, 1)
	f.reject = func(r *apiaryv1.ReportTaskStatusRequest) string {
		if r.GetJobId() != "r1-stale" {
			return ""
		}
		// Reject once the process surely runs, so that the test sees it die.
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			b, _ := os.ReadFile(pidFile)
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				pidc <- pid
				break
			}
		}
		return "stale attempt"
	}
	ta := startAgent(t, []string{f.addr}, nil)
	epoch := ta.waitEpoch(t, 1)
	f.waitStream(t, epoch)

	key := AttemptKey{JobID: "r1-stale", TaskIndex: 0, Attempt: 1}
	f.push(runAsg(epoch, key, `echo $$ > `+pidFile+`; exec sleep 100`))
	var pid int
	select {
	case pid = <-pidc:
	case <-time.After(15 * time.Second):
		t.Fatal("the attempt never wrote its pid")
	}
	waitFor(t, 10*time.Second, func() bool { return processGone(pid) }, "stale attempt killed")
	waitFor(t, 5*time.Second, func() bool { _, n := ta.Used(); return n == 0 }, "ledger released")
	if ks := kinds(f.reportsFor(key)); len(ks) != 1 {
		t.Fatalf("reports %v, want only the rejected STARTED", ks)
	}
}

func TestAgentRetriesReportsAndFailsOver(t *testing.T) {
	// The first address refuses connections: the agent moves to the second.
	dead := testutil.FreeAddr(t) // reserved, and nobody binds it
	f := startFake(t)
	f.failReports = 3
	ta := startAgent(t, startingAt("n1", dead, f.addr), nil)
	epoch := ta.waitEpoch(t, 1)
	f.waitStream(t, epoch)

	key := AttemptKey{JobID: "r1-retry", TaskIndex: 0, Attempt: 1}
	f.push(runAsg(epoch, key, "exit 7"))
	r := f.waitReport(t, key, apiaryv1.ReportKind_REPORT_KIND_EXITED)
	if r.GetExitCode() != 7 || r.GetStartTimeMs() == 0 {
		t.Fatalf("EXITED report %v", r)
	}
}

func TestAgentShutdownDrainsAndDeregisters(t *testing.T) {
	f, ta, epoch := startConnected(t, nil)

	key := AttemptKey{JobID: "r1-run", TaskIndex: 0, Attempt: 1}
	f.push(runAsg(epoch, key, `sleep 100 & echo $! > pids; echo $$ >> pids; wait`))
	f.waitReport(t, key, apiaryv1.ReportKind_REPORT_KIND_STARTED)
	pids := readPids(t, filepath.Join(ta.workDir(key), "pids"), 2)
	// The running attempt is recorded on disk (group and leader start time)
	// and its processes carry the agent's marker.
	rec := readRecords(filepath.Join(ta.dataDir, "attempts"))["r1-run.0.1"]
	st, err := readProcStat("/proc", pids[1])
	if err != nil || rec.Pgid != pids[1] || rec.StartTicks != st.startTicks || rec.Dir != ta.workDir(key) {
		t.Fatalf("record %+v, want pgid %d start %d (%v)", rec, pids[1], st.startTicks, err)
	}
	env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pids[0]))
	if !strings.Contains(string(env), "\x00"+agentRunEnv+"="+agentMarker(ta.dataDir)+"\x00") {
		t.Fatalf("background child lacks %s", agentRunEnv)
	}
	ta.stop(t)
	// SIGKILL is delivered asynchronously: wait (bounded) for each to die.
	for _, p := range pids {
		waitFor(t, 5*time.Second, func() bool { return processGone(p) }, "pid %d gone after shutdown", p)
	}
	if recs := readRecords(filepath.Join(ta.dataDir, "attempts")); len(recs) != 0 {
		t.Fatalf("records left after a graceful stop: %v", recs)
	}
	// The stop is a drain: the node is marked draining, the attempt is
	// handed back as DRAINED (requeued, not charged), the epoch is released.
	if ks := kinds(f.reportsFor(key)); len(ks) != 2 || ks[1] != apiaryv1.ReportKind_REPORT_KIND_DRAINED {
		t.Fatalf("reports %v, want STARTED then DRAINED", ks)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.drains) != 1 || f.drains[0].GetNodeEpoch() != epoch || len(f.deregisters) != 1 || f.deregisters[0] != epoch {
		t.Fatalf("drains %v deregisters %v, want one each for epoch %d", f.drains, f.deregisters, epoch)
	}
}

func TestAgentOperatorDrainStopsAttemptsAtDeadline(t *testing.T) {
	f, ta, epoch := startConnected(t, nil)
	key := AttemptKey{JobID: "r1-drain", TaskIndex: 0, Attempt: 1}
	f.push(runAsg(epoch, key, `exec sleep 100`))
	f.waitReport(t, key, apiaryv1.ReportKind_REPORT_KIND_STARTED)
	f.mu.Lock()
	f.drainMs = time.Now().Add(300 * time.Millisecond).UnixMilli()
	f.mu.Unlock()
	r := f.waitReport(t, key, apiaryv1.ReportKind_REPORT_KIND_DRAINED)
	if r.GetNodeEpoch() != epoch {
		t.Fatalf("DRAINED with epoch %d, want %d", r.GetNodeEpoch(), epoch)
	}
	// While draining, a new attempt is refused, not run.
	k2 := AttemptKey{JobID: "r1-drain", TaskIndex: 1, Attempt: 1}
	f.push(runAsg(epoch, k2, `exit 0`))
	if r := f.waitReport(t, k2, apiaryv1.ReportKind_REPORT_KIND_REFUSED); !strings.Contains(r.GetError(), "draining") {
		t.Fatalf("refusal %q", r.GetError())
	}
	if ta.Epoch() != epoch {
		t.Fatalf("an operator's drain ended the epoch")
	}
}

func TestNewValidates(t *testing.T) {
	if _, err := New(Config{}); err == nil || !strings.Contains(err.Error(), "coordinator") {
		t.Fatalf("err %v", err)
	}
	a, err := New(Config{CoordinatorAddrs: []string{"127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	c := a.Config()
	if c.NodeID == "" || c.Capacity.CPUMillis <= 0 || c.Capacity.MemoryMB <= 0 || c.TailBytes != DefaultTailBytes || c.DataDir == "" {
		t.Fatalf("defaults %+v", c)
	}
}

// agentMetric is the sum of the agent's metric family name (0 if absent).
func agentMetric(t *testing.T, ta *testAgent, name string) float64 {
	t.Helper()
	fams, err := ta.cfg.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			return testutil.MetricSum(f)
		}
	}
	return 0
}

// cutOff starts an attempt on a connected agent with a short lease, then
// makes every heartbeat fail (the coordinators are unreachable) and waits
// for two lease TTLs: the attempt must keep running.
func cutOff(t *testing.T, cfg func(*Config)) (*fakeCoord, *testAgent, int64, AttemptKey, int) {
	f := startFake(t)
	f.leaseTTLms = 400
	ta := startAgent(t, []string{f.addr}, cfg)
	e1 := ta.waitEpoch(t, 1)
	f.waitStream(t, e1)
	key := AttemptKey{JobID: "r1-cut", TaskIndex: 0, Attempt: 1}
	asg := runAsg(e1, key, `echo $$ > pids; exec sleep 100`)
	asg.FencingToken = 42
	f.push(asg)
	f.waitReport(t, key, apiaryv1.ReportKind_REPORT_KIND_STARTED)
	pid := readPids(t, filepath.Join(ta.workDir(key), "pids"), 1)[0]
	f.mu.Lock()
	f.hbDown = true
	f.current = nil
	f.mu.Unlock()
	waitFor(t, 5*time.Second, func() bool { return agentMetric(t, ta, "apiary_agent_disconnected") == 1 }, "agent sees itself disconnected")
	if processGone(pid) {
		t.Fatal("attempt killed when the coordinators became unreachable")
	}
	return f, ta, e1, key, pid
}

func TestAgentKeepsAttemptsWhileCutOffAndAdopts(t *testing.T) {
	f, ta, e1, key, pid := cutOff(t, nil)
	// The lease lapsed meanwhile: the coordinator answers that the epoch is
	// gone. The agent registers again and the attempt is adopted.
	f.mu.Lock()
	f.adopt = func(r *apiaryv1.AttemptRef) bool { return r.GetFencingToken() == 42 && r.GetNodeEpoch() == e1 }
	delete(f.valid, e1)
	f.hbDown = false
	f.mu.Unlock()
	e2 := ta.waitEpoch(t, e1+1)
	waitFor(t, 5*time.Second, func() bool { f.mu.Lock(); defer f.mu.Unlock(); return len(f.adoptions) == 1 }, "adoption asked")
	if processGone(pid) {
		t.Fatal("adopted attempt was killed")
	}
	// Its result is reported with the new epoch.
	syscall.Kill(pid, syscall.SIGKILL)
	r := f.waitReport(t, key, apiaryv1.ReportKind_REPORT_KIND_EXITED)
	if r.GetNodeEpoch() != e2 {
		t.Fatalf("report of the adopted attempt carries epoch %d, want %d", r.GetNodeEpoch(), e2)
	}
}

func TestAgentKillsAttemptsNotAdopted(t *testing.T) {
	f, ta, e1, key, pid := cutOff(t, nil)
	f.mu.Lock()
	delete(f.valid, e1) // the lease lapsed and the task was reclaimed: adoption refused
	f.hbDown = false
	f.mu.Unlock()
	ta.waitEpoch(t, e1+1)
	waitFor(t, 10*time.Second, func() bool { return processGone(pid) }, "attempt not adopted is killed")
	if got := agentMetric(t, ta, "apiary_agent_stale_attempt_kills_total"); got != 1 {
		t.Fatalf("stale kills %v", got)
	}
	if ks := kinds(f.reportsFor(key)); len(ks) != 1 {
		t.Fatalf("reports %v, want only STARTED", ks)
	}
}

func TestAgentKillsAttemptsAfterDisconnectGrace(t *testing.T) {
	f, _, e1, key, pid := cutOff(t, func(c *Config) { c.DisconnectGrace = 1500 * time.Millisecond })
	waitFor(t, 10*time.Second, func() bool { return processGone(pid) }, "attempt killed after the disconnect grace")
	// Killed, it is not stale: its task is still this node's, so it is
	// handed back (LOST: requeued, not charged) with its epoch, which
	// still lives here (only heartbeats were failing).
	if r := f.waitReport(t, key, apiaryv1.ReportKind_REPORT_KIND_LOST); r.GetNodeEpoch() != e1 {
		t.Fatalf("LOST report with epoch %d, want %d", r.GetNodeEpoch(), e1)
	}
}

func TestAgentEpochEndedWhileConnectedAdoptsOrKills(t *testing.T) {
	// A coordinator ends the epoch while the agent is in contact (a serf
	// suspicion, a revoke): the agent registers again at once and offers its
	// attempts to the new epoch; one adopted keeps running, one refused is
	// killed and never reported.
	f, ta, epoch := startConnected(t, nil)
	keep := AttemptKey{JobID: "r1-revoked", TaskIndex: 0, Attempt: 1}
	drop := AttemptKey{JobID: "r1-revoked", TaskIndex: 1, Attempt: 1}
	for _, k := range []AttemptKey{keep, drop} {
		f.push(runAsg(epoch, k, `echo $$ > pids; exec sleep 100`))
		f.waitReport(t, k, apiaryv1.ReportKind_REPORT_KIND_STARTED)
	}
	keepPid := readPids(t, filepath.Join(ta.workDir(keep), "pids"), 1)[0]
	dropPid := readPids(t, filepath.Join(ta.workDir(drop), "pids"), 1)[0]
	f.mu.Lock()
	f.adopt = func(r *apiaryv1.AttemptRef) bool { return r.GetTaskIndex() == 0 }
	f.current = nil
	f.mu.Unlock()
	f.expire(epoch)
	waitFor(t, 10*time.Second, func() bool { return processGone(dropPid) }, "attempt not adopted killed")
	e2 := ta.waitEpoch(t, epoch+1)
	if processGone(keepPid) {
		t.Fatal("adopted attempt killed")
	}
	syscall.Kill(keepPid, syscall.SIGKILL)
	if r := f.waitReport(t, keep, apiaryv1.ReportKind_REPORT_KIND_EXITED); r.GetNodeEpoch() != e2 {
		t.Fatalf("adopted attempt reported with epoch %d, want %d", r.GetNodeEpoch(), e2)
	}
	if ks := kinds(f.reportsFor(drop)); len(ks) != 1 {
		t.Fatalf("refused attempt reports %v, want only STARTED", ks)
	}
}

func TestAgentLeavesHungCoordinator(t *testing.T) {
	// The first coordinator hangs with its connections up: heartbeats time
	// out there and move to the second, and the assignment stream must
	// follow them, or the node would look alive and never get work.
	f := startFake(t)
	h := &hangable{fakeCoord: f}
	h.serve(t)
	ta := startAgent(t, startingAt("n1", h.addr, f.addr), func(c *Config) { c.RPCTimeout = 200 * time.Millisecond })
	epoch := ta.waitEpoch(t, 1)
	f.waitStreamThat(t, func(s *fakeStream) bool { return s.via == h }, "stream on the first coordinator")
	h.hung.Store(true)
	key := AttemptKey{JobID: "r1-moved", TaskIndex: 0, Attempt: 1}
	f.push(runAsg(epoch, key, "exit 0"))
	f.waitReport(t, key, apiaryv1.ReportKind_REPORT_KIND_EXITED)
	if ta.Epoch() != epoch {
		t.Fatalf("epoch changed %d -> %d; failover should keep it", epoch, ta.Epoch())
	}
}

func TestAgentStopsWhenRegistrationIsInvalid(t *testing.T) {
	f := startFake(t)
	a, err := New(Config{NodeID: "bad/id", CoordinatorAddrs: []string{f.addr}, DataDir: t.TempDir(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.Run(ctx); status.Code(errors.Unwrap(err)) != codes.InvalidArgument || ctx.Err() != nil {
		t.Fatalf("Run: %v, want the INVALID_ARGUMENT refusal", err)
	}
}

// TestAgentRefusedRegistrationKillsHeldAttempts: the epoch ends (a revoked
// join token) and the region refuses the registration for good
// (UNAUTHENTICATED, not an outage): no epoch can adopt what the agent still
// holds, so it kills the attempt still running and drops the final report
// it still held (its attempt ended while reports failed), at once, and
// reports neither. It keeps registering with backoff and gets in once the
// refusal is lifted, with nothing left to offer for adoption.
func TestAgentRefusedRegistrationKillsHeldAttempts(t *testing.T) {
	f, ta, epoch := startConnected(t, nil)
	running := AttemptKey{JobID: "r1-refused", TaskIndex: 0, Attempt: 1}
	held := AttemptKey{JobID: "r1-refused", TaskIndex: 1, Attempt: 1}
	f.push(runAsg(epoch, running, `echo $$ > pids; exec sleep 100`))
	f.waitReport(t, running, apiaryv1.ReportKind_REPORT_KIND_STARTED)
	pid := readPids(t, filepath.Join(ta.workDir(running), "pids"), 1)[0]
	f.mu.Lock()
	f.failReports, f.failed = 1<<30, 0 // every report from now on is held
	f.mu.Unlock()
	f.push(runAsg(epoch, held, "exit 3"))
	waitFor(t, 10*time.Second, func() bool {
		ta.mu.Lock()
		defer ta.mu.Unlock()
		st := ta.seen[held]
		return st != nil && !st.finished.IsZero()
	}, "the second attempt ended, its report held")

	f.mu.Lock()
	f.refuse = "join_token: no such token in region r1 (revoked, or never made here)"
	f.current = nil
	f.mu.Unlock()
	f.expire(epoch)
	waitFor(t, 5*time.Second, func() bool { return processGone(pid) }, "the running attempt killed once the registration is refused")
	waitFor(t, 5*time.Second, func() bool { return agentMetric(t, ta, "apiary_agent_stale_attempt_kills_total") == 2 },
		"both attempts given up as stale")
	if ta.Epoch() != 0 {
		t.Fatalf("epoch %d while refused", ta.Epoch())
	}

	f.mu.Lock()
	f.refuse, f.failReports = "", 0
	f.mu.Unlock()
	e2 := ta.waitEpoch(t, epoch+1)
	f.sync(t, e2) // reports flow again: a held report not dropped would have gone first
	f.mu.Lock()
	adoptions := len(f.adoptions)
	f.mu.Unlock()
	if adoptions != 0 {
		t.Errorf("%d adoption requests; nothing should be left to adopt", adoptions)
	}
	if ks := kinds(f.reportsFor(running)); len(ks) != 1 {
		t.Errorf("killed attempt reports %v, want only STARTED", ks)
	}
	if ks := kinds(f.reportsFor(held)); len(ks) != 0 {
		t.Errorf("dropped attempt reports %v, want none", ks)
	}
}

// TestHeartbeatIntervalFollowsTheRegion: the region's heartbeat answer
// changes the agent's interval (a fleet that grew asks for fewer beats),
// never past a quarter of the lease.
func TestHeartbeatIntervalFollowsTheRegion(t *testing.T) {
	f := startFake(t)
	f.mu.Lock()
	f.hbEveryMs = 400 // registration says 30 ms
	f.mu.Unlock()
	startAgent(t, []string{f.addr}, nil)
	beats := func() int {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.beats
	}
	testutil.Eventually(t, 5*time.Second, "a first heartbeat", func() error {
		if beats() < 1 {
			return fmt.Errorf("no heartbeat yet")
		}
		return nil
	})
	b0, t0 := beats(), time.Now()
	testutil.Eventually(t, 10*time.Second, "three more heartbeats", func() error {
		if n := beats(); n < b0+3 {
			return fmt.Errorf("%d heartbeats since", n-b0)
		}
		return nil
	})
	if took := time.Since(t0); took < 800*time.Millisecond {
		t.Fatalf("3 heartbeats in %v: the agent kept its 30 ms interval, not the 400 ms the region answered", took)
	}
	// An interval past a quarter of the 5 s lease is capped there: beats
	// keep coming every 1.25 s, not every minute.
	f.mu.Lock()
	f.hbEveryMs = 60000
	f.mu.Unlock()
	b1 := beats()
	testutil.Eventually(t, 8*time.Second, "beats within the lease", func() error {
		if n := beats(); n < b1+3 {
			return fmt.Errorf("%d heartbeats since", n-b1)
		}
		return nil
	})
}
