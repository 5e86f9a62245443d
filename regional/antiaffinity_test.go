package regional_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/testutil"
	"apiary.dev/apiary/placement"
	"apiary.dev/apiary/shards"
)

// TestAntiAffinityAcrossJobsAndOwners: 1-task jobs that name one
// anti-affinity group, submitted at once to a region of 3 shard owners and
// 8 agents (zones z0..z3, two agents each), run on distinct nodes although
// they are in different jobs and shards (and bin-packing alone would stack
// them on one node); a group scoped by the zone label gets one task per
// zone; one member more than there are scopes waits, PENDING, with the
// engine's reason.
func TestAntiAffinityAcrossJobsAndOwners(t *testing.T) {
	var agents []devcluster.AgentSpec
	for i := 0; i < 8; i++ {
		agents = append(agents, devcluster.AgentSpec{ID: fmt.Sprintf("a%d", i), Labels: map[string]string{"zone": fmt.Sprintf("z%d", i/2)},
			CPUMillis: 4000, MemoryMiB: 4096, MaxTasks: 8})
	}
	_, r := cluster(t, devcluster.RegionSpec{Coordinators: 3, Agents: agents, NoLAN: true})
	c := dial(t, r)
	owners := waitShardsSpread(t, c, 3)
	zoneOf := map[string]string{}
	for _, a := range agents {
		zoneOf[a.ID] = a.Labels["zone"]
	}

	// submitAll submits n jobs of group g (scope: "" for the default) at
	// once and returns their ids.
	submitAll := func(prefix, g, scope string, n int) []string {
		aa := "{group: " + g + "}"
		if scope != "" {
			aa = "{group: " + g + ", scope: " + scope + "}"
		}
		ids := make([]string, n)
		var wg sync.WaitGroup
		for i := range ids {
			s := spec(t, fmt.Sprintf(`
name: %s-%d
tasks:
  - name: main
    command: sleep
    args: ["60"]
    resources: {cpu_millis: 100, memory_mb: 16}
    anti_affinity: %s
`, prefix, i, aa))
			wg.Go(func() { ids[i] = submit(t, c, s) })
		}
		wg.Wait()
		t.Cleanup(func() {
			for _, id := range ids {
				_, _ = c.jobs.CancelJob(callCtx(t), &apiaryv1.CancelJobRequest{JobId: id})
			}
		})
		return ids
	}
	// nodes waits until want of the jobs run (RUNNING) and the rest, if
	// any, are PENDING with a reason containing reason, and returns each
	// running job's node.
	nodes := func(ids []string, want int, reason string) map[string]string {
		t.Helper()
		var at map[string]string
		testutil.Eventually(t, 60*time.Second, fmt.Sprintf("%d of %d jobs running", want, len(ids)), func() error {
			at = map[string]string{}
			var waiting []string
			for _, id := range ids {
				j, err := getJob(c, id)
				if err != nil {
					return err
				}
				tk := j.GetTasks()[0]
				switch tk.GetState() {
				case apiaryv1.TaskState_TASK_STATE_RUNNING:
					at[id] = tk.GetNodeId()
				case apiaryv1.TaskState_TASK_STATE_PENDING:
					waiting = append(waiting, tk.GetUnplacedReason())
				default:
					return fmt.Errorf("job %s task %s", id, tk.GetState())
				}
			}
			if len(at) != want {
				return fmt.Errorf("%d running", len(at))
			}
			for _, w := range waiting {
				if !strings.Contains(w, reason) {
					return fmt.Errorf("pending with reason %q, want %q", w, reason)
				}
			}
			return nil
		})
		return at
	}

	db := submitAll("db", "db", "", 6)
	shardOwners := map[string]bool{}
	for _, id := range db {
		shardOwners[owners.GetShards()[shards.Of(id, int(owners.GetShardCount()))].GetOwner()] = true
	}
	at := nodes(db, 6, "")
	if distinct := distinctValues(at); distinct != 6 {
		t.Fatalf("6 members of group db on %d nodes: %v", distinct, at)
	}
	t.Logf("group db: 6 jobs in the shards of %d owners, on nodes %v", len(shardOwners), at)

	web := submitAll("web", "web", "zone", 5)
	at = nodes(web, 4, placement.ReasonAntiAffinity)
	zones := map[string]string{}
	for id, n := range at {
		zones[id] = zoneOf[n]
	}
	if distinct := distinctValues(zones); distinct != 4 {
		t.Fatalf("4 running members of group web (scope zone) in %d zones: %v", distinct, zones)
	}

	more := submitAll("db-more", "db", "", 3)
	at = nodes(append(db, more...), 8, placement.ReasonAntiAffinity)
	if distinct := distinctValues(at); distinct != 8 {
		t.Fatalf("8 running members of group db on %d nodes: %v", distinct, at)
	}
}

// distinctValues counts the distinct values of m.
func distinctValues(m map[string]string) int {
	seen := map[string]bool{}
	for _, v := range m {
		seen[v] = true
	}
	return len(seen)
}
