package regional_test

import (
	"os"
	"strings"
	"testing"
	"time"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/testutil"
)

// TestQoSLimitsAndBestEffort (issue 13), on one region with one agent of
// 1000 millicores and 512 MiB:
//
//   - a Guaranteed task (limits = requests, 32 MiB) that allocates about
//     200 MB is killed by its cgroup's memory limit, and its attempt
//     result's error says so (skipped, with the agent's words, when the
//     agent has no cgroup memory controller: limits are not enforced there);
//   - a BestEffort task runs and completes while another job's task holds
//     all of the node's CPU and memory: it reserves nothing.
func TestQoSLimitsAndBestEffort(t *testing.T) {
	_, r := cluster(t, devcluster.RegionSpec{NoLAN: true,
		Agents: []devcluster.AgentSpec{{ID: "n1", CPUMillis: 1000, MemoryMiB: 512}}})
	c := dial(t, r)

	t.Run("guaranteed task killed by its memory limit", func(t *testing.T) {
		// The agent says at start which limits it enforces (agent
		// logLimits), before it registers.
		var log string
		testutil.Eventually(t, 10*time.Second, "the agent's word on resource limits", func() error {
			b, _ := os.ReadFile(r.Agents[0].LogPath)
			log = string(b)
			if !strings.Contains(log, "resource limits enforced by cgroups") && !strings.Contains(log, "resource limits not enforced") {
				return os.ErrNotExist
			}
			return nil
		})
		for _, line := range strings.Split(log, "\n") {
			if strings.Contains(line, "resource limits not enforced") && strings.Contains(line, "memory=false") {
				t.Skipf("the agent enforces no memory limit on this host:\n%s", line)
			}
		}
		id := submit(t, c, spec(t, `
name: guaranteed-oom
max_attempts: 1
tasks:
  - name: hog
    command: sh
    args: ["-c", "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo ${#x}"]
    resources: {cpu_millis: 1000, memory_mb: 32, limits: {cpu_millis: 1000, memory_mb: 32}}
`))
		waitState(t, c, id, apiaryv1.JobState_JOB_STATE_FAILED, 30*time.Second)
		tasks := logs(t, c, id)
		if len(tasks) != 1 || len(tasks[0].GetAttempts()) != 1 {
			t.Fatalf("tasks %v, want one with one attempt", tasks)
		}
		a := tasks[0].GetAttempts()[0]
		want := "killed by its memory limit (32 MiB): the cgroup's OOM killer ended it"
		if !strings.Contains(a.GetError(), want) || a.GetExitCode() != -1 {
			t.Fatalf("attempt result: outcome %q, exit %d, error %q; want exit -1 and %q", a.GetOutcome(), a.GetExitCode(), a.GetError(), want)
		}
		if strings.Contains(a.GetStdoutTail(), "200000000") {
			t.Fatalf("the task finished its allocation: %q", a.GetStdoutTail())
		}
	})

	t.Run("best-effort task runs on a full node", func(t *testing.T) {
		hog := submit(t, c, spec(t, `
name: takes-the-node
tasks:
  - name: hold
    command: sleep
    args: ["60"]
    resources: {cpu_millis: 1000, memory_mb: 512}
`))
		waitRunning(t, c, hog, 1)
		be := submit(t, c, spec(t, `
name: best-effort
tasks:
  - name: be
    command: sh
    args: ["-c", "echo best effort"]
    resources: {best_effort: true}
`))
		j := waitState(t, c, be, apiaryv1.JobState_JOB_STATE_COMPLETE, 20*time.Second)
		if n := j.GetTasks()[0].GetNodeId(); n != "n1" {
			t.Fatalf("ran on %q", n)
		}
		// Still on the node: the BestEffort task ran beside it, not after it.
		if h, err := getJob(c, hog); err != nil || h.GetCounts().GetRunning() != 1 {
			t.Fatalf("the job holding the node: %v (err %v), want its task still running", h.GetCounts(), err)
		}
		if out := logs(t, c, be)[0].GetAttempts()[0].GetStdoutTail(); out != "best effort\n" {
			t.Fatalf("stdout %q", out)
		}
		if _, err := c.jobs.CancelJob(callCtx(t), &apiaryv1.CancelJobRequest{JobId: hog}); err != nil {
			t.Fatal(err)
		}
	})
}
