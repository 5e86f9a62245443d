package regional_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/testutil"
)

// TestAgentKilledMidTask: SIGKILL the agent running a task; the node lease
// lapses, the task is reclaimed and reruns on the other node as attempt 2,
// and a late report for attempt 1 from the dead epoch is rejected.
func TestAgentKilledMidTask(t *testing.T) {
	_, r := cluster(t, devcluster.RegionSpec{Agents: twoAgents()})
	c := dial(t, r)
	id := submit(t, c, spec(t, `
name: long
max_attempts: 3
tasks:
  - name: work
    command: sh
    args: ["-c", "sleep 1.5; echo attempt $APIARY_ATTEMPT on $APIARY_NODE_ID"]
`))
	var first *apiaryv1.Task
	testutil.Eventually(t, 20*time.Second, "task running", func() error {
		j, err := getJob(c, id)
		if err != nil {
			return err
		}
		if tk := j.GetTasks()[0]; tk.GetState() == apiaryv1.TaskState_TASK_STATE_RUNNING {
			first = tk
			return nil
		}
		return fmt.Errorf("task %s", j.GetTasks()[0].GetState())
	})
	victim := map[string]*devcluster.Proc{"n1": r.Agents[0], "n2": r.Agents[1]}[first.GetNodeId()]
	if err := victim.Kill(); err != nil {
		t.Fatal(err)
	}
	j := waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 30*time.Second)
	tk := j.GetTasks()[0]
	if tk.GetAttempt() != 2 || tk.GetNodeId() == first.GetNodeId() {
		t.Fatalf("want attempt 2 on another node than %s, got attempt %d on %s", first.GetNodeId(), tk.GetAttempt(), tk.GetNodeId())
	}
	as := tk.GetAttempts()
	if len(as) != 2 || as[0].GetOutcome() != "lost" || as[1].GetOutcome() != "complete" {
		t.Fatalf("attempt history %v", as)
	}
	if as[1].GetFencingToken() <= as[0].GetFencingToken() {
		t.Fatalf("fencing token did not grow: %d then %d", as[0].GetFencingToken(), as[1].GetFencingToken())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, late := range []*apiaryv1.ReportTaskStatusRequest{
		{NodeId: first.GetNodeId(), NodeEpoch: first.GetNodeEpoch(), JobId: id, TaskIndex: 0, Attempt: 1, Kind: apiaryv1.ReportKind_REPORT_KIND_EXITED},
		{NodeId: first.GetNodeId(), NodeEpoch: first.GetNodeEpoch(), JobId: id, TaskIndex: 0, Attempt: 2, Kind: apiaryv1.ReportKind_REPORT_KIND_EXITED},
		{NodeId: tk.GetNodeId(), NodeEpoch: tk.GetNodeEpoch(), JobId: id, TaskIndex: 0, Attempt: 1, Kind: apiaryv1.ReportKind_REPORT_KIND_EXITED},
	} {
		resp, err := c.agent.ReportTaskStatus(ctx, late)
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetAccepted() {
			t.Fatalf("stale report accepted: %+v", late)
		}
	}
	if n := completions(logs(t, c, id)); n[0] != 1 {
		t.Fatalf("%d committed completions", n[0])
	}
}

// TestSchedulerKilledInThreeMemberRegion: SIGKILL the coordinator that owns
// the shards (and its etcd member) mid-job; a peer takes over with a higher
// epoch and the job finishes with exactly one committed completion per task.
func TestSchedulerKilledInThreeMemberRegion(t *testing.T) {
	agents := twoAgents()
	for i := range agents {
		agents[i].MaxTasks = 4
	}
	_, r := cluster(t, devcluster.RegionSpec{Coordinators: 3, Agents: agents})
	c := dial(t, r)
	const n = 40
	id := submit(t, c, spec(t, fmt.Sprintf(`
name: through-failover
tasks:
  - name: step
    count: %d
    command: sh
    args: ["-c", "sleep 0.2; echo token $APIARY_FENCING_TOKEN"]
`, n)))
	testutil.Eventually(t, 30*time.Second, "some tasks complete", func() error {
		j, err := getJob(c, id)
		if err != nil {
			return err
		}
		if j.GetCounts().GetComplete() < 8 {
			return fmt.Errorf("counts %v", j.GetCounts())
		}
		return nil
	})
	info := regionInfo(t, c)
	var victim int = -1
	for i, co := range info.GetCoordinators() {
		if co.GetScheduler() {
			for k, p := range r.Coords {
				if p.Name == co.GetId() {
					victim = k
				}
			}
			_ = i
		}
	}
	if victim < 0 {
		t.Fatalf("no scheduler in %v", info)
	}
	if err := r.Coords[victim].Kill(); err != nil {
		t.Fatal(err)
	}
	j := waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 60*time.Second)
	if j.GetCounts().GetComplete() != n {
		t.Fatalf("counts %v", j.GetCounts())
	}
	after := regionInfo(t, c)
	if after.GetSchedulerEpoch() <= info.GetSchedulerEpoch() {
		t.Fatalf("scheduler epoch %d after failover, was %d", after.GetSchedulerEpoch(), info.GetSchedulerEpoch())
	}
	for _, co := range after.GetCoordinators() {
		if co.GetScheduler() && co.GetId() == r.Coords[victim].Name {
			t.Fatalf("dead coordinator %s still the scheduler", co.GetId())
		}
	}
	done := completions(logs(t, c, id))
	for i := int32(0); i < n; i++ {
		if done[i] != 1 {
			t.Fatalf("task %d has %d committed completions", i, done[i])
		}
	}
}

// TestRegionRestartedFromDisk: crash every process of a region mid-job,
// start it again from the same data dirs; the job finishes and no task
// completes twice.
func TestRegionRestartedFromDisk(t *testing.T) {
	agents := []devcluster.AgentSpec{{ID: "n1", MaxTasks: 2}}
	_, r := cluster(t, devcluster.RegionSpec{Agents: agents})
	c := dial(t, r)
	const n = 6
	id := submit(t, c, spec(t, fmt.Sprintf(`
name: survives-restart
tasks:
  - name: step
    count: %d
    command: sh
    args: ["-c", "sleep 0.5; echo ok"]
`, n)))
	testutil.Eventually(t, 30*time.Second, "first tasks complete", func() error {
		j, err := getJob(c, id)
		if err != nil {
			return err
		}
		if j.GetCounts().GetComplete() < 2 {
			return fmt.Errorf("counts %v", j.GetCounts())
		}
		return nil
	})
	for _, p := range append(r.Agents, r.Coords...) {
		if err := p.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := r.RestartCoordinator(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := r.Agents[0].Start(); err != nil {
		t.Fatal(err)
	}
	j := waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 60*time.Second)
	if j.GetCounts().GetComplete() != n {
		t.Fatalf("counts %v", j.GetCounts())
	}
	done := completions(logs(t, c, id))
	for i := int32(0); i < n; i++ {
		if done[i] != 1 {
			t.Fatalf("task %d has %d committed completions", i, done[i])
		}
	}
}

func regionInfo(t *testing.T, c clients) *apiaryv1.GetRegionInfoResponse {
	t.Helper()
	var out *apiaryv1.GetRegionInfoResponse
	testutil.Eventually(t, 10*time.Second, "region info", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		var err error
		out, err = c.admin.GetRegionInfo(ctx, &apiaryv1.GetRegionInfoRequest{})
		if err != nil {
			return err
		}
		for _, co := range out.GetCoordinators() {
			if co.GetScheduler() {
				return nil
			}
		}
		return fmt.Errorf("no scheduler yet")
	})
	return out
}
