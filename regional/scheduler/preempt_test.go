package scheduler

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/priority"
	"apiary.dev/apiary/placement"
	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/regional/taskstate"
)

// preemptHarness is an owner harness whose loop preempts (at most max
// preemptors per round).
func preemptHarness(t *testing.T, max int) *ownerHarness {
	h := newOwnerHarness(t)
	h.s.d.Preempter = placement.New(placement.Options{Policy: placement.PolicyBinpack, Seed: 1, PreemptionDelta: priority.PreemptionDelta})
	h.s.d.MaxPreemptions = max
	return h
}

// addPriorityJob stores a job of count pending tasks of cpuMillis each at
// priority pri (shard 0).
func (h *ownerHarness) addPriorityJob(id string, pri int32, cpuMillis int64, count int) {
	spec := &apiaryv1.JobSpec{Name: id, Priority: pri, Tasks: []*apiaryv1.TaskGroup{{Name: "g", Count: int32(count),
		Command: "true", Resources: &apiaryv1.Resources{CpuMillis: cpuMillis, MemoryMb: 64}}}}
	h.store.put(store.KeyJob(0, id), store.MustJSON(store.JobRecord{ID: id, Region: "eu-west", Spec: spec, SubmitMs: 1,
		TaskCount: int32(count)}))
	for i := range count {
		t := pending()
		t.JobID, t.Index = id, int32(i)
		h.store.put(store.KeyTask(0, id, int32(i)), store.MustJSON(&t))
	}
}

// report applies an agent's report of kind to a task, as the report path
// does (the task record and, when released, the assignment's deletion),
// and lets the cache see it.
func (h *ownerHarness) report(jobID string, index int32, kind apiaryv1.ReportKind, exit int32) taskstate.Result {
	h.t.Helper()
	tk := h.task(jobID, index)
	alive := h.store.get(store.KeyNodeAlive(tk.NodeID))
	res := taskstate.ApplyReport(tk, taskstate.Policy{MaxAttempts: 3}, taskstate.Report{Kind: kind, NodeID: tk.NodeID,
		NodeEpoch: tk.NodeEpoch, Attempt: tk.Attempt, ExitCode: exit}, alive.CreateRevision, 1, rand.New(rand.NewPCG(1, 2)))
	if res.Rejected != "" {
		h.t.Fatalf("report on %s/%d rejected: %s", jobID, index, res.Rejected)
	}
	h.store.put(store.KeyTask(0, jobID, index), store.MustJSON(&res.Task))
	if res.Released {
		h.store.del(store.KeyAssign(tk.NodeID, jobID, index))
	}
	h.load()
	return res
}

func (h *ownerHarness) usage(nodeID string) store.UsageRecord {
	h.t.Helper()
	var u store.UsageRecord
	if err := json.Unmarshal(h.store.get(store.KeyNodeUsage(nodeID)).Value, &u); err != nil {
		h.t.Fatal(err)
	}
	return u
}

// TestPreemptionCommitted: a full node of batch tasks, then an urgent task:
// one round marks the fewest victims preempted (their assignments become
// CANCELs) and reserves their room for the preemptor, counted in the node's
// usage; the preemptor is placed only after the victims' attempts ended,
// and the victims are requeued at once, uncharged, saying by whom.
func TestPreemptionCommitted(t *testing.T) {
	h := preemptHarness(t, 0)
	epoch := h.addNode("n1", 4000, 8192)
	h.addPriorityJob("batch", priority.BatchValue, 1000, 4)
	h.load()
	if err := h.round(); err != nil {
		t.Fatal(err)
	}
	h.addPriorityJob("urgent", priority.UrgentValue, 2000, 1)
	h.load()
	if err := h.round(); err != nil {
		t.Fatal(err)
	}
	u := h.task("urgent", 0)
	if u.State != apiaryv1.TaskState_TASK_STATE_PENDING || u.Reservation == nil || u.Reservation.NodeID != "n1" ||
		u.Reservation.NodeEpoch != epoch || len(u.Reservation.Victims) != 2 || u.PreemptedFor != 1 {
		t.Fatalf("preemptor after the round: %+v (reservation %+v), want PENDING holding a reservation on n1 for 2 victims", u, u.Reservation)
	}
	if !strings.Contains(u.UnplacedReason, "preempting 2 task(s)") {
		t.Errorf("preemptor's reason %q", u.UnplacedReason)
	}
	var victims []int32
	for i := range int32(4) {
		b := h.task("batch", i)
		a, _ := h.assignment("n1", "batch", i)
		if b.PreemptedBy == "" {
			if a.GetKind() != apiaryv1.Assignment_KIND_RUN {
				t.Errorf("batch/%d not preempted but its assignment is %v", i, a)
			}
			continue
		}
		victims = append(victims, i)
		if b.State != apiaryv1.TaskState_TASK_STATE_ASSIGNED || !strings.Contains(b.PreemptedBy, "job urgent task 0 (priority 90, urgent)") {
			t.Errorf("victim batch/%d: %+v, want ASSIGNED, preempted by the urgent task", i, b)
		}
		if a.GetKind() != apiaryv1.Assignment_KIND_CANCEL || a.GetAttempt() != 1 {
			t.Errorf("victim batch/%d's assignment %v, want a CANCEL of attempt 1", i, a)
		}
	}
	if len(victims) != 2 {
		t.Fatalf("victims %v, want the 2 that make room for 2000 millicores", victims)
	}
	if us := h.usage("n1"); us.CPUMillis != 6000 {
		t.Errorf("n1's usage key holds %d millicores, want 6000 (4 running + the reservation)", us.CPUMillis)
	}
	// Until the victims stop nothing moves, and nothing more is preempted.
	if err := h.round(); err != nil {
		t.Fatal(err)
	}
	if u := h.task("urgent", 0); u.State != apiaryv1.TaskState_TASK_STATE_PENDING || u.Reservation == nil {
		t.Fatalf("preemptor placed before its victims stopped: %+v", u)
	}
	// The first victim's attempt ends; the room is not complete yet.
	res := h.report("batch", victims[0], apiaryv1.ReportKind_REPORT_KIND_CANCELLED, -1)
	if res.Outcome != taskstate.OutcomePreempted || res.Task.State != apiaryv1.TaskState_TASK_STATE_PENDING || res.Task.Used != 0 ||
		!strings.Contains(res.Task.Error, "preempted by job urgent task 0") {
		t.Fatalf("victim's end: outcome %q, task %+v; want preempted, PENDING, not charged, naming the preemptor", res.Outcome, res.Task)
	}
	if err := h.round(); err != nil {
		t.Fatal(err)
	}
	if u := h.task("urgent", 0); u.State != apiaryv1.TaskState_TASK_STATE_PENDING {
		t.Fatalf("preemptor placed while a victim still runs: %+v", u)
	}
	if b := h.task("batch", victims[0]); b.State != apiaryv1.TaskState_TASK_STATE_PENDING {
		t.Fatalf("the requeued victim took the reserved room: %+v", b)
	}
	// The second one exits (killed: a non-zero exit): preempted too.
	if res := h.report("batch", victims[1], apiaryv1.ReportKind_REPORT_KIND_EXITED, 143); res.Outcome != taskstate.OutcomePreempted || res.Task.Used != 0 {
		t.Fatalf("killed victim: outcome %q used %d, want preempted, not charged", res.Outcome, res.Task.Used)
	}
	if err := h.round(); err != nil {
		t.Fatal(err)
	}
	u = h.task("urgent", 0)
	if u.State != apiaryv1.TaskState_TASK_STATE_ASSIGNED || u.NodeID != "n1" || u.Attempt != 1 || u.Reservation != nil {
		t.Fatalf("preemptor after its victims stopped: %+v, want ASSIGNED to n1, attempt 1, no reservation", u)
	}
	if a, _ := h.assignment("n1", "urgent", 0); a.GetKind() != apiaryv1.Assignment_KIND_RUN {
		t.Fatalf("preemptor's assignment %v, want RUN", a)
	}
	for _, i := range victims {
		if b := h.task("batch", i); b.State != apiaryv1.TaskState_TASK_STATE_PENDING || b.PreemptedFor != 0 {
			t.Errorf("victim batch/%d: %+v, want PENDING (the node is full again)", i, b)
		}
	}
	if us := h.usage("n1"); us.CPUMillis != 4000 {
		t.Errorf("n1's usage %d millicores after the placement, want 4000", us.CPUMillis)
	}
	if got := counterValue(h.metrics.Preemptions.WithLabelValues("placed")); got != 1 {
		t.Errorf("placed preemptions %v, want 1", got)
	}
	checkVictimIndex(t, h.s.cache)
	if low, ok := h.s.cache.lowestVictim(); !ok || low != priority.BatchValue {
		t.Errorf("lowest victim priority %d %v, want %d", low, ok, priority.BatchValue)
	}
}

// checkVictimIndex compares the cache's victimPri with a count from
// scratch.
func checkVictimIndex(t *testing.T, c *ownerCache) {
	t.Helper()
	want := map[int32]int{}
	for _, ct := range c.tasks {
		if taskstate.Active(ct.rec.State) && ct.rec.PreemptedBy == "" && !ct.rec.CancelRequested {
			want[c.jobs[ct.rec.JobID].priority()]++
		}
	}
	if len(want) != len(c.victimPri) {
		t.Fatalf("victimPri %v, want %v", c.victimPri, want)
	}
	for p, n := range want {
		if c.victimPri[p] != n {
			t.Fatalf("victimPri %v, want %v", c.victimPri, want)
		}
	}
}

// TestPreemptionRules: no preemption of a priority within
// priority.PreemptionDelta; at most MaxPreemptions preemptors per round; a
// preemptor whose reservation's node was lost preempts again elsewhere.
func TestPreemptionRules(t *testing.T) {
	h := preemptHarness(t, 1)
	h.addNode("n1", 2000, 8192)
	h.addNode("n2", 2000, 8192)
	h.addPriorityJob("standard", 85, 1000, 4)
	h.load()
	if err := h.round(); err != nil {
		t.Fatal(err)
	}
	h.addPriorityJob("urgent", priority.UrgentValue, 1000, 2)
	h.load()
	if err := h.round(); err != nil {
		t.Fatal(err)
	}
	for i := range int32(2) {
		if u := h.task("urgent", i); u.Reservation != nil {
			t.Fatalf("priority 90 preempted priority 85 (delta %d): %+v", priority.PreemptionDelta, u)
		}
	}
	checkVictimIndex(t, h.s.cache)
	h2 := preemptHarness(t, 1)
	h2.addNode("n1", 2000, 8192)
	h2.addNode("n2", 2000, 8192)
	h2.addPriorityJob("batch", priority.BatchValue, 1000, 4)
	h2.load()
	if err := h2.round(); err != nil {
		t.Fatal(err)
	}
	h2.addPriorityJob("urgent", priority.UrgentValue, 1000, 2)
	h2.load()
	if err := h2.round(); err != nil {
		t.Fatal(err)
	}
	checkVictimIndex(t, h2.s.cache)
	reserved := 0
	var holder int32
	for i := range int32(2) {
		if u := h2.task("urgent", i); u.Reservation != nil {
			reserved++
			holder = i
		}
	}
	if reserved != 1 {
		t.Fatalf("%d preemptors committed in one round, want MaxPreemptions = 1", reserved)
	}
	// The reservation's node epoch ends: the reservation ends with a
	// reason, and the urgent tasks preempt on the node left (the holder
	// again, with its second reservation for the placement).
	u := h2.task("urgent", holder)
	lost := u.Reservation.NodeID
	h2.watchDelete(store.KeyNodeAlive(lost))
	h2.s.preemptTried = map[string]time.Time{} // no retry wait
	if err := h2.round(); err != nil {
		t.Fatal(err)
	}
	if u = h2.task("urgent", holder); u.Reservation != nil && u.Reservation.NodeID == lost {
		t.Fatalf("reservation on the lost node kept: %+v", u.Reservation)
	}
	for range 3 {
		h2.s.preemptTried = map[string]time.Time{}
		if err := h2.round(); err != nil {
			t.Fatal(err)
		}
	}
	onLeft := 0
	for i := range int32(2) {
		u := h2.task("urgent", i)
		if r := u.Reservation; r != nil {
			if r.NodeID == lost {
				t.Fatalf("urgent/%d holds a reservation on the lost node %s", i, lost)
			}
			onLeft++
		}
		if i == holder && u.PreemptedFor != 1 {
			t.Errorf("holder after its node was lost: %+v, want PreemptedFor 1", u)
		}
	}
	// One preemption on the node left (its other batch task cannot make
	// room while the first victim still holds its own).
	if onLeft != 1 {
		t.Errorf("%d urgent tasks hold reservations on the node left, want 1", onLeft)
	}
	// The holder, whose reservation ended, may preempt again.
	if u := h2.task("urgent", holder); !taskstate.MayPreempt(u) && (u.Reservation == nil || u.Reservations != 2) {
		t.Errorf("holder after its node was lost: %+v, want it free to preempt again (or holding its second reservation)", u)
	}
}
