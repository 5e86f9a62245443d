package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

// DrainOptions configures the drain benchmark.
type DrainOptions struct {
	Coordinators int   // 3
	Jobs         int   // 20
	TasksPerJob  int32 // 100
	Agents       int   // 8
	Slots        int   // 32 (--max-tasks)
	// Agent capacity; 32 tasks x 100 m / 16 MiB fit in 3200 m / 512 MiB.
	CPUMillis, MemoryMiB int64
	Timeout              time.Duration
}

// DefaultDrain is issue 2's configuration.
var DefaultDrain = DrainOptions{Coordinators: 3, Jobs: 20, TasksPerJob: 100, Agents: 8, Slots: 32,
	CPUMillis: 3200, MemoryMiB: 512, Timeout: 120 * time.Second}

// DrainResult is one drain trial. Times are ms from the moment the harness
// started the first agent process (t0).
type DrainResult struct {
	Trial int
	Tasks int
	// FirstReady/LastReady: an agent's node alive key appeared (registered,
	// READY) as seen by the watch.
	FirstReadyMs, LastReadyMs float64
	// FirstAssign: first task ASSIGNED; FirstComplete: first COMPLETE.
	FirstAssignMs, FirstCompleteMs float64
	// Done: the last of the tasks reached COMPLETE.
	DoneMs float64
	// Extra dispatches beyond one per task (refusals, retries, losses).
	ExtraAttempts int
	Failed        int
	// PendingTasks as seen by GetRegionInfo before the agents started.
	PendingBefore int32
	// Timeline counts state transitions per 100 ms bin from t0:
	// [assigned, running, complete].
	Timeline [][3]int
	// CPU seconds (user+sys, children included) from t0 to done, read from
	// /proc: all coordinators together, all agents (and their tasks).
	CoordCPU, AgentCPU float64
	// PendingRewrites counts writes of task records that stay PENDING
	// (the scheduler recording a new unplaced reason); Reasons samples them.
	PendingRewrites int
	Reasons         []string
	// Events are every task state change seen: ms from t0, etcd revision,
	// state, node.
	Events []DrainEvent
}

// DrainEvent is one task state change.
type DrainEvent struct {
	AtMs  float64
	Rev   int64
	State apiaryv1.TaskState
	Node  string
}

// FromFirstReadyMs is the drain time measured from the first READY agent.
func (r DrainResult) FromFirstReadyMs() float64 { return r.DoneMs - r.FirstReadyMs }

// Drain runs one drain trial on a fresh region.
func Drain(ctx context.Context, cfg Config, o DrainOptions, trial int) (DrainResult, error) {
	res := DrainResult{Trial: trial, Tasks: o.Jobs * int(o.TasksPerJob)}
	dir := filepath.Join(cfg.WorkDir, fmt.Sprintf("drain-%d", trial))
	cl, r, err := startRegion(ctx, cfg, dir, o.Coordinators, nil, nil)
	if err != nil {
		return res, err
	}
	defer cl.Stop()
	conn, err := r.Dial()
	if err != nil {
		return res, err
	}
	defer conn.Close()
	js := apiaryv1.NewJobServiceClient(conn)
	admin := apiaryv1.NewAdminServiceClient(conn)
	cli, err := etcdClient(r.EtcdEndpoints)
	if err != nil {
		return res, err
	}
	defer cli.Close()

	// Submit every job before any agent exists.
	var wg sync.WaitGroup
	errs := make(chan error, o.Jobs)
	for j := 0; j < o.Jobs; j++ {
		wg.Add(1)
		go func(j int) {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			_, err := js.SubmitJob(sctx, &apiaryv1.SubmitJobRequest{Spec: trueJob(fmt.Sprintf("drain-%d", j), o.TasksPerJob),
				ClientId: "bench-drain", RequestId: fmt.Sprintf("t%d-j%d", trial, j)})
			errs <- err
		}(j)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return res, fmt.Errorf("submit: %w", err)
		}
	}
	// Quiesce: every task is stored PENDING. With no ready node the
	// scheduler writes nothing (GetJob explains "no ready nodes"), so the
	// region is idle once the submissions are in.
	var startRev int64
	if err := waitFor(ctx, 60*time.Second, "tasks stored pending", func() (bool, error) {
		gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		resp, err := cli.Get(gctx, prefTasks, clientv3.WithPrefix())
		if err != nil {
			return false, err
		}
		n := 0
		for _, kv := range resp.Kvs {
			if t, ok := decodeTask(kv.Value); ok && t.State == apiaryv1.TaskState_TASK_STATE_PENDING {
				n++
			}
		}
		startRev = resp.Header.Revision
		return n == res.Tasks, fmt.Errorf("%d of %d", n, res.Tasks)
	}); err != nil {
		return res, err
	}
	if info, err := admin.GetRegionInfo(ctx, &apiaryv1.GetRegionInfoRequest{}); err == nil {
		res.PendingBefore = info.GetPendingTasks()
	}

	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	tasksW := cli.Watch(wctx, prefTasks, clientv3.WithPrefix(), clientv3.WithRev(startRev+1))
	nodesW := cli.Watch(wctx, prefNodes, clientv3.WithPrefix(), clientv3.WithRev(startRev+1))

	var coordPids []int
	for _, p := range r.Coords {
		coordPids = append(coordPids, p.Pid())
	}
	coordCPU0 := cpuSeconds(coordPids...)
	t0 := time.Now()
	var agents []*agentProc
	defer func() {
		var wg sync.WaitGroup
		for _, a := range agents {
			wg.Add(1)
			go func(a *agentProc) { defer wg.Done(); a.stop() }(a)
		}
		wg.Wait()
	}()
	for i := 0; i < o.Agents; i++ {
		a, err := startAgent(cfg, dir, r.Addr(), fmt.Sprintf("agent-%d", i+1), o.CPUMillis, o.MemoryMiB, o.Slots)
		if err != nil {
			return res, err
		}
		agents = append(agents, a)
	}
	state := map[string]apiaryv1.TaskState{}
	complete, failed := 0, 0
	ready := 0
	timeout := time.NewTimer(o.Timeout)
	defer timeout.Stop()
	for complete+failed < res.Tasks {
		select {
		case <-timeout.C:
			return res, fmt.Errorf("drain: %d of %d tasks complete after %s", complete, res.Tasks, o.Timeout)
		case wr, ok := <-nodesW:
			if !ok || wr.Err() != nil {
				return res, fmt.Errorf("nodes watch ended: %v", wr.Err())
			}
			at := ms(time.Since(t0))
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypePut && strings.HasSuffix(string(ev.Kv.Key), "/alive") && ev.IsCreate() {
					ready++
					if ready == 1 {
						res.FirstReadyMs = at
					}
					if ready == o.Agents {
						res.LastReadyMs = at
					}
				}
			}
		case wr, ok := <-tasksW:
			if !ok || wr.Err() != nil {
				return res, fmt.Errorf("tasks watch ended: %v", wr.Err())
			}
			at := ms(time.Since(t0))
			bin := int(at / 100)
			for len(res.Timeline) <= bin {
				res.Timeline = append(res.Timeline, [3]int{})
			}
			for _, ev := range wr.Events {
				if ev.Type != clientv3.EventTypePut {
					continue
				}
				t, ok := decodeTask(ev.Kv.Value)
				if !ok {
					continue
				}
				k := string(ev.Kv.Key)
				prev := state[k]
				if prev == t.State {
					if t.State == apiaryv1.TaskState_TASK_STATE_PENDING {
						res.PendingRewrites++
						if len(res.Reasons) < 5 && !slices.Contains(res.Reasons, t.UnplacedReason) {
							res.Reasons = append(res.Reasons, t.UnplacedReason)
						}
					}
					continue
				}
				state[k] = t.State
				res.Events = append(res.Events, DrainEvent{AtMs: at, Rev: ev.Kv.ModRevision, State: t.State, Node: t.NodeID})
				switch t.State {
				case apiaryv1.TaskState_TASK_STATE_ASSIGNED:
					if res.FirstAssignMs == 0 {
						res.FirstAssignMs = at
					}
					res.Timeline[bin][0]++
				case apiaryv1.TaskState_TASK_STATE_RUNNING:
					res.Timeline[bin][1]++
				case apiaryv1.TaskState_TASK_STATE_COMPLETE:
					complete++
					res.Timeline[bin][2]++
					if complete == 1 {
						res.FirstCompleteMs = at
					}
				case apiaryv1.TaskState_TASK_STATE_FAILED, apiaryv1.TaskState_TASK_STATE_CANCELLED:
					failed++
				}
			}
			res.DoneMs = at
		}
	}
	res.Failed = failed
	res.CoordCPU = cpuSeconds(coordPids...) - coordCPU0
	var agentPids []int
	for _, a := range agents {
		agentPids = append(agentPids, a.cmd.Process.Pid)
	}
	res.AgentCPU = cpuSeconds(agentPids...) // agents started at t0
	// Cross-check through the API: every job COMPLETE; count dispatches.
	lresp, err := js.ListJobs(ctx, &apiaryv1.ListJobsRequest{Limit: 1000})
	if err != nil {
		return res, err
	}
	for _, j := range lresp.GetJobs() {
		g, err := js.GetJob(ctx, &apiaryv1.GetJobRequest{JobId: j.GetId()})
		if err != nil {
			return res, err
		}
		if g.GetJob().GetState() != apiaryv1.JobState_JOB_STATE_COMPLETE {
			return res, fmt.Errorf("job %s is %s after drain", j.GetId(), g.GetJob().GetState())
		}
		for _, t := range g.GetJob().GetTasks() {
			res.ExtraAttempts += int(t.GetAttempt()) - 1
		}
	}
	return res, nil
}
