package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/proto"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/telemetry"
	"apiary.dev/apiary/placement"
	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/regional/taskstate"
	"apiary.dev/apiary/shards"
)

// Unit tests of the owner loop's rounds against fakeStore (no etcd, no
// processes): the round's decisions, the writes it commits, and what it does
// when a commit fails.

// ownerHarness is an owner loop over a fakeStore, with its own metrics.
type ownerHarness struct {
	t       *testing.T
	store   *fakeStore
	s       *Loop
	metrics *telemetry.RegionMetrics
	skipped *prometheus.CounterVec
}

func newOwnerHarness(t *testing.T) *ownerHarness {
	t.Helper()
	reg := prometheus.NewRegistry()
	h := &ownerHarness{t: t, store: newFakeStore(), metrics: telemetry.NewRegionMetrics(reg), skipped: SkippedCounter(reg)}
	h.s = New(Deps{Region: "eu-west", Jurisdiction: "eu", CoordID: "c1",
		Placer:     placement.New(placement.Options{Policy: placement.PolicyBinpack, Seed: 1, DisablePreemption: true}),
		ShardCount: 1, Retention: -1, Commit: h.store, Log: slog.New(slog.DiscardHandler), Metrics: h.metrics, Skipped: h.skipped},
		ownedShardSet(map[int]shards.Epoch{0: 1}))
	h.s.refreshOwned()
	return h
}

// addNode registers a ready node (alive key, record of its epoch, empty
// usage) and returns its epoch.
func (h *ownerHarness) addNode(id string, cpuMillis, memMiB int64) int64 {
	epoch := h.store.put(store.KeyNodeAlive(id), id)
	h.store.put(store.KeyNode(id), store.MustJSON(store.NodeRecord{ID: id, Epoch: epoch,
		Capacity: &apiaryv1.Resources{CpuMillis: cpuMillis, MemoryMb: memMiB}}))
	h.store.put(store.KeyNodeUsage(id), store.MustJSON(store.UsageRecord{}))
	return epoch
}

// addJob stores a job of one group of len(tasks) tasks of cpuMillis each
// (shard 0), with the tasks as given (their JobID and Index are set here).
func (h *ownerHarness) addJob(id string, cpuMillis int64, cancel bool, tasks ...taskstate.Task) {
	spec := &apiaryv1.JobSpec{Name: id, Tasks: []*apiaryv1.TaskGroup{{Name: "g", Count: int32(len(tasks)),
		Command: "true", Resources: &apiaryv1.Resources{CpuMillis: cpuMillis, MemoryMb: 64}}}}
	h.store.put(store.KeyJob(0, id), store.MustJSON(store.JobRecord{ID: id, Region: "eu-west", Spec: spec, SubmitMs: 1,
		TaskCount: int32(len(tasks)), CancelRequested: cancel}))
	for i, t := range tasks {
		t.JobID, t.Index = id, int32(i)
		h.store.put(store.KeyTask(0, id, int32(i)), store.MustJSON(&t))
	}
}

// load fills the loop's cache from the store, as run's range read does.
func (h *ownerHarness) load() {
	for _, kv := range h.store.all() {
		h.s.cache.apply(kv, false)
	}
}

// watchDelete tells the cache that key was deleted, as the watch would.
func (h *ownerHarness) watchDelete(key string) {
	h.store.del(key)
	h.s.cache.apply(&mvccpb.KeyValue{Key: []byte(key), ModRevision: h.store.rev}, true)
}

func (h *ownerHarness) round() error {
	_, err := h.s.round(context.Background())
	return err
}

func (h *ownerHarness) task(jobID string, index int32) taskstate.Task {
	h.t.Helper()
	kv := h.store.get(store.KeyTask(0, jobID, index))
	if kv == nil {
		h.t.Fatalf("task %s/%d: not stored", jobID, index)
	}
	var t taskstate.Task
	if err := json.Unmarshal(kv.Value, &t); err != nil {
		h.t.Fatal(err)
	}
	return t
}

func (h *ownerHarness) assignment(nodeID, jobID string, index int32) (*apiaryv1.Assignment, *mvccpb.KeyValue) {
	h.t.Helper()
	kv := h.store.get(store.KeyAssign(nodeID, jobID, index))
	if kv == nil {
		return nil, nil
	}
	var a apiaryv1.Assignment
	if err := proto.Unmarshal(kv.Value, &a); err != nil {
		h.t.Fatal(err)
	}
	return &a, kv
}

func pending() taskstate.Task {
	return taskstate.Task{State: apiaryv1.TaskState_TASK_STATE_PENDING}
}

// TestOwnerRoundCommitsPlan: a round places the pending tasks and commits
// the plan: each task ASSIGNED to the node's epoch, its RUN assignment, and
// the node's usage, in fenced writes.
func TestOwnerRoundCommitsPlan(t *testing.T) {
	h := newOwnerHarness(t)
	epoch := h.addNode("n1", 4000, 8192)
	h.addJob("j1", 1000, false, pending(), pending())
	h.load()
	if err := h.round(); err != nil {
		t.Fatalf("round: %v", err)
	}
	for i := int32(0); i < 2; i++ {
		tk := h.task("j1", i)
		if tk.State != apiaryv1.TaskState_TASK_STATE_ASSIGNED || tk.NodeID != "n1" || tk.NodeEpoch != epoch || tk.Attempt != 1 {
			t.Fatalf("task %d after the round: %+v, want ASSIGNED to n1 epoch %d, attempt 1", i, tk, epoch)
		}
		a, _ := h.assignment("n1", "j1", i)
		if a == nil || a.GetKind() != apiaryv1.Assignment_KIND_RUN || a.GetNodeEpoch() != epoch || a.GetRegion() != "eu-west" || a.GetCommand() != "true" {
			t.Fatalf("assignment of task %d: %v, want RUN of `true` for epoch %d in eu-west", i, a, epoch)
		}
	}
	var u store.UsageRecord
	if err := json.Unmarshal(h.store.get(store.KeyNodeUsage("n1")).Value, &u); err != nil {
		t.Fatal(err)
	}
	if u.Tasks != 2 || u.CPUMillis != 2000 || u.Epoch != epoch {
		t.Fatalf("usage after the plan: %+v, want 2 tasks, 2000 cpu millis, epoch %d", u, epoch)
	}
	if got := counterValue(h.metrics.Placements); got != 2 {
		t.Fatalf("placements counted: %v, want 2", got)
	}
	if len(h.s.cache.pending) != 0 {
		t.Fatalf("cache still holds %d pending tasks", len(h.s.cache.pending))
	}
}

// TestOwnerFencedCommitDropsShard: a commit whose fence fails drops the
// shard (another coordinator owns it now): the round goes on without error,
// nothing is written, the fenced write is counted, and later rounds write
// nothing for the shard. An error of unknown outcome (a timeout) ends the
// round with an error that is not store.ErrFenced, and keeps the shard.
func TestOwnerFencedCommitDropsShard(t *testing.T) {
	h := newOwnerHarness(t)
	h.addNode("n1", 4000, 8192)
	h.addJob("j1", 1000, false, pending())
	h.load()
	rev := h.store.rev

	h.store.err = fmt.Errorf("commit: %w", context.DeadlineExceeded)
	err := h.round()
	if err == nil || errors.Is(err, store.ErrFenced) {
		t.Fatalf("round with an etcd timeout: err %v, want an error that is not errFenced", err)
	}
	if !h.s.owns(0) {
		t.Fatal("an etcd timeout dropped the shard")
	}
	if want := []store.Fence{{Shard: 0, Epoch: 1}}; !slices.Equal(h.store.fences, want) {
		t.Fatalf("the plan was fenced on %v, want %v", h.store.fences, want)
	}

	h.store.fenced = true
	if err := h.round(); err != nil {
		t.Fatalf("round with the fence gone: %v, want the shard dropped and no error", err)
	}
	if h.s.owns(0) {
		t.Fatal("shard 0 still owned after its fence failed")
	}
	if got := counterValue(h.metrics.FencedWrites); got != 1 {
		t.Fatalf("fenced writes counted: %v, want 1", got)
	}
	h.store.fenced = false
	txns := h.store.txns
	if err := h.round(); err != nil {
		t.Fatal(err)
	}
	if h.store.txns != txns {
		t.Fatalf("a round after the shard was dropped committed %d Txns", h.store.txns-txns)
	}
	if h.store.rev != rev || h.task("j1", 0).State != apiaryv1.TaskState_TASK_STATE_PENDING {
		t.Fatalf("a failed commit wrote: revision %d -> %d, task %s", rev, h.store.rev, h.task("j1", 0).State)
	}
	// The reconciler's owned set still holding the shard at the dropped
	// epoch does not bring it back; a new claim (a new epoch) does.
	h.s.set.Set(map[int]shards.Epoch{0: 1})
	h.s.refreshOwned()
	if h.s.owns(0) {
		t.Fatal("a dropped shard came back at the same epoch")
	}
	h.s.set.Set(map[int]shards.Epoch{0: 9})
	h.s.refreshOwned()
	if !h.s.owns(0) {
		t.Fatal("a shard claimed again at a new epoch is not owned")
	}
}

// TestOwnerUsageConflictRequeues: when the node's usage changed since the
// cache read it (another owner's plan), the plan's compare on its
// ModRevision fails: the tasks stay PENDING and are counted as requeued.
// The cache does not re-read the usage key (another owner's tasks written
// with it would be missing from the derived usage): it waits for the
// watch, and the round after the watch delivered the change commits.
func TestOwnerUsageConflictRequeues(t *testing.T) {
	h := newOwnerHarness(t)
	epoch := h.addNode("n1", 4000, 8192)
	h.addJob("j1", 1000, false, pending())
	h.load()
	newRev := h.store.put(store.KeyNodeUsage("n1"), store.MustJSON(store.UsageRecord{Epoch: epoch}))

	if err := h.round(); err != nil {
		t.Fatalf("round: %v", err)
	}
	if tk := h.task("j1", 0); tk.State != apiaryv1.TaskState_TASK_STATE_PENDING {
		t.Fatalf("task after a conflicting plan: %s, want PENDING", tk.State)
	}
	if a, _ := h.assignment("n1", "j1", 0); a != nil {
		t.Fatalf("a conflicting plan wrote an assignment: %v", a)
	}
	if c, r := counterValue(h.metrics.PlanConflicts), counterValue(h.metrics.Requeues); c != 1 || r != 1 {
		t.Fatalf("conflicts %v, requeues %v; want 1 and 1", c, r)
	}
	if got := h.s.cache.nodes["n1"].UsageRev; got == newRev {
		t.Fatalf("cached usage revision %d after the conflict: re-read ahead of the watch", got)
	}
	if err := h.round(); err != nil {
		t.Fatalf("round before the watch: %v", err)
	}
	if tk := h.task("j1", 0); tk.State != apiaryv1.TaskState_TASK_STATE_PENDING {
		t.Fatalf("task placed before the watch delivered the node's usage: %s", tk.State)
	}
	h.s.cache.apply(h.store.get(store.KeyNodeUsage("n1")), false) // the watch event

	if err := h.round(); err != nil {
		t.Fatalf("second round: %v", err)
	}
	if tk := h.task("j1", 0); tk.State != apiaryv1.TaskState_TASK_STATE_ASSIGNED {
		t.Fatalf("task after the next round: %s, want ASSIGNED", tk.State)
	}
}

// TestOwnerReclaimsLostNodeTask: the running task of a node whose lease is
// gone returns to PENDING, with a "lost" result for its attempt and its
// assignment deleted.
func TestOwnerReclaimsLostNodeTask(t *testing.T) {
	h := newOwnerHarness(t)
	epoch := h.addNode("n1", 4000, 8192)
	h.addJob("j1", 1000, false, taskstate.Task{State: apiaryv1.TaskState_TASK_STATE_RUNNING, Attempt: 1, Used: 1,
		NodeID: "n1", NodeEpoch: epoch})
	h.store.put(store.KeyAssign("n1", "j1", 0), "run")
	h.load()
	h.watchDelete(store.KeyNodeAlive("n1")) // the lease expired

	if err := h.round(); err != nil {
		t.Fatalf("round: %v", err)
	}
	tk := h.task("j1", 0)
	if tk.State != apiaryv1.TaskState_TASK_STATE_PENDING || tk.NodeFailures != 1 {
		t.Fatalf("task after its node was lost: %+v, want PENDING with 1 node failure", tk)
	}
	kv := h.store.get(store.KeyResult(0, "j1", 0, 1))
	if kv == nil {
		t.Fatal("no result recorded for the lost attempt")
	}
	var res apiaryv1.AttemptResult
	if err := json.Unmarshal(kv.Value, &res); err != nil {
		t.Fatal(err)
	}
	if res.GetOutcome() != taskstate.OutcomeLost || res.GetNodeId() != "n1" {
		t.Fatalf("result of the lost attempt: %v, want outcome lost on n1", &res)
	}
	if h.store.get(store.KeyAssign("n1", "j1", 0)) != nil {
		t.Fatal("the lost attempt's assignment is still stored")
	}
	if got := counterValue(h.metrics.Reclaims); got != 1 {
		t.Fatalf("reclaims counted: %v, want 1", got)
	}
}

// TestOwnerReclaimsOnlyTheLostEpoch: a node that came back under a new
// epoch holds a task of its old epoch and one of its live epoch; the round
// reclaims the old one only. The per-node epoch counts that let reclaim
// pass over a node whose tasks all run under its live epoch follow every
// change of the tasks.
func TestOwnerReclaimsOnlyTheLostEpoch(t *testing.T) {
	h := newOwnerHarness(t)
	old := h.addNode("n1", 4000, 8192)
	h.store.del(store.KeyNodeAlive("n1"))               // its lease expired, and it registered again:
	live := h.store.put(store.KeyNodeAlive("n1"), "n1") // a new epoch
	if live == old {
		t.Fatal("the re-registration did not make a new epoch")
	}
	h.addJob("j1", 1000, false,
		taskstate.Task{State: apiaryv1.TaskState_TASK_STATE_RUNNING, Attempt: 1, Used: 1, NodeID: "n1", NodeEpoch: old},
		taskstate.Task{State: apiaryv1.TaskState_TASK_STATE_RUNNING, Attempt: 1, Used: 1, NodeID: "n1", NodeEpoch: live})
	h.store.put(store.KeyAssign("n1", "j1", 0), "run")
	h.store.put(store.KeyAssign("n1", "j1", 1), "run")
	h.load()
	// The cache holds the live epoch from the alive key's CreateRevision;
	// the node's record still names the old one.
	if n := h.s.cache.nodes["n1"]; n == nil || n.Alive == 0 {
		t.Fatal("node n1 not alive in the cache")
	}
	if h.s.cache.onlyLiveEpoch("n1", h.s.cache.nodes["n1"].Alive) {
		t.Fatal("onlyLiveEpoch: true with a task of an old epoch on the node")
	}
	if err := h.round(); err != nil {
		t.Fatalf("round: %v", err)
	}
	if tk := h.task("j1", 0); tk.State != apiaryv1.TaskState_TASK_STATE_PENDING {
		t.Fatalf("task of the old epoch after the round: %v, want PENDING", tk.State)
	}
	if h.s.cache.pendingByJob["j1"][store.KeyTask(0, "j1", 0)] == nil {
		t.Fatal("the requeued task is not in its job's pending set")
	}
	alive := h.s.cache.nodes["n1"].Alive
	if tk := h.task("j1", 1); tk.State != apiaryv1.TaskState_TASK_STATE_RUNNING || tk.NodeEpoch != alive {
		t.Fatalf("task of the live epoch after the round: %v epoch %d, want RUNNING on %d", tk.State, tk.NodeEpoch, alive)
	}
	if !h.s.cache.onlyLiveEpoch("n1", alive) {
		t.Fatalf("onlyLiveEpoch: false after the old epoch's task was reclaimed (counts %v)", h.s.cache.byNodeEpoch["n1"])
	}
	// The live task ends: the node holds nothing, and its counts are gone.
	key := store.KeyTask(0, "j1", 1)
	ct := h.s.cache.tasks[key]
	done := ct.rec
	done.State = apiaryv1.TaskState_TASK_STATE_COMPLETE
	h.s.cache.setTask(key, &cTask{key: key, shard: ct.shard, rec: done, modRev: ct.modRev + 1})
	if _, ok := h.s.cache.byNodeEpoch["n1"]; ok {
		t.Fatalf("epoch counts of a node without active tasks: %v, want none", h.s.cache.byNodeEpoch["n1"])
	}
}

// TestOwnerCancelsJob: a job's cancel flag cancels its pending task at once
// and turns its running task's assignment into a CANCEL for the agent (the
// assignment key's CreateRevision, the fencing token, kept).
func TestOwnerCancelsJob(t *testing.T) {
	h := newOwnerHarness(t)
	epoch := h.addNode("n1", 4000, 8192)
	h.addJob("j1", 1000, true, taskstate.Task{State: apiaryv1.TaskState_TASK_STATE_RUNNING, Attempt: 1, Used: 1,
		NodeID: "n1", NodeEpoch: epoch}, pending())
	token := h.store.put(store.KeyAssign("n1", "j1", 0), "run")
	h.load()

	if err := h.round(); err != nil {
		t.Fatalf("round: %v", err)
	}
	if tk := h.task("j1", 1); tk.State != apiaryv1.TaskState_TASK_STATE_CANCELLED {
		t.Fatalf("pending task of a cancelled job: %s, want CANCELLED", tk.State)
	}
	if tk := h.task("j1", 0); tk.State != apiaryv1.TaskState_TASK_STATE_RUNNING || !tk.CancelRequested {
		t.Fatalf("running task of a cancelled job: %+v, want RUNNING with cancel requested", tk)
	}
	a, kv := h.assignment("n1", "j1", 0)
	if a == nil || a.GetKind() != apiaryv1.Assignment_KIND_CANCEL || kv.CreateRevision != token {
		t.Fatalf("assignment after cancel: %v (create revision %d), want a CANCEL keeping %d", a, kv.CreateRevision, token)
	}
}

// TestOwnerCountsUndecodableRecords: a task record that does not decode is
// left out of the cache and counted (it used to be dropped without a word).
func TestOwnerCountsUndecodableRecords(t *testing.T) {
	h := newOwnerHarness(t)
	h.addJob("j1", 1000, false, pending())
	h.store.put(store.KeyTask(0, "j1", 1), "{not json")
	h.load()
	if _, ok := h.s.cache.tasks[store.KeyTask(0, "j1", 1)]; ok {
		t.Fatal("an undecodable task is in the cache")
	}
	if got := counterValue(h.skipped.WithLabelValues("task")); got != 1 {
		t.Fatalf("skipped task records counted: %v, want 1", got)
	}
}

// counterValue reads a counter's value.
func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}
