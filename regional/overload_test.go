package regional_test

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
)

// TestOverloadLosesNoAttempt is issue 20's "overload is not death": one
// agent that admits everything (--max-tasks 0, capacity for all) is given
// a 500-task job of CPU-burning shell loops, so the host is saturated by its
// own tasks (the issue measured 158 lost attempts with /bin/true, load
// average ~80). The agent must stay ahead of its tasks (they run at nice
// +10, in a cgroup with a quarter of the agent's CPU weight): the job
// completes with every task done by its first attempt, none lost to a
// lapsed lease (node_failures 0, attempt 1, one "complete" result each).
// The node lease is the default 2 s, as in the issue (the integration
// tests' 1 s lease leaves a starved heartbeat 750 ms).
func TestOverloadLosesNoAttempt(t *testing.T) {
	const tasks = 500
	script := `i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done`
	// The floor: the tasks' CPU work alone, spread over every core.
	var runs []time.Duration
	for range 5 {
		start := time.Now()
		if out, err := exec.Command("sh", "-c", script).CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		runs = append(runs, time.Since(start))
	}
	slices.Sort(runs)
	floor := runs[2] * tasks / time.Duration(runtime.NumCPU())

	_, r := cluster(t, devcluster.RegionSpec{Agents: []devcluster.AgentSpec{
		{ID: "n1", CPUMillis: tasks * 100, MemoryMiB: tasks * 16, MaxTasks: 0}},
		ExtraArgs: []string{"--node-lease-ttl", "2s"}})
	c := dial(t, r)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var maxLoad float64
	var maxRunnable int
	wg.Go(func() {
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			if b, err := os.ReadFile("/proc/loadavg"); err == nil {
				f := strings.Fields(string(b))
				if l, err := strconv.ParseFloat(f[0], 64); err == nil {
					maxLoad = max(maxLoad, l)
				}
				if run, _, ok := strings.Cut(f[3], "/"); ok {
					n, _ := strconv.Atoi(run)
					maxRunnable = max(maxRunnable, n)
				}
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	})
	id := submit(t, c, spec(t, fmt.Sprintf(`
name: overload
max_attempts: 1
tasks:
  - name: burn
    count: %d
    command: sh
    args: [-c, %q]
    resources: {cpu_millis: 100, memory_mb: 16}
`, tasks, script)))
	start := time.Now()
	j := waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 90*time.Second)
	took := time.Since(start)
	close(stop)
	wg.Wait()
	t.Logf("%d tasks on one agent (%d cores): %v from submit to complete; floor (the tasks' CPU work over every core) %v, ratio %.1f; load average (1 min) up to %.1f, up to %d runnable",
		tasks, runtime.NumCPU(), took.Round(time.Millisecond), floor.Round(time.Millisecond), float64(took)/float64(floor), maxLoad, maxRunnable)

	if n := len(j.GetTasks()); n != tasks {
		t.Fatalf("%d tasks, want %d", n, tasks)
	}
	var bad []string
	for _, tk := range logs(t, c, id) {
		var outcomes []string
		for _, a := range tk.GetAttempts() {
			outcomes = append(outcomes, a.GetOutcome())
		}
		if tk.GetAttempt() != 1 || tk.GetNodeFailures() != 0 || !slices.Equal(outcomes, []string{"complete"}) {
			bad = append(bad, fmt.Sprintf("task %d: attempt %d, node failures %d, results %v",
				tk.GetIndex(), tk.GetAttempt(), tk.GetNodeFailures(), outcomes))
		}
	}
	if len(bad) > 0 {
		t.Fatalf("%d of %d tasks lost an attempt:\n%s", len(bad), tasks, strings.Join(bad[:min(len(bad), 20)], "\n"))
	}
}
