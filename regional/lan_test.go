package regional_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/testutil"
)

// lanLease is the node lease of the LAN tests: long, so that only the fast
// path (serf → fast reclaim) can move a task within lanDeadline. The fast
// path waits until the agent has been silent for half the lease (4 s,
// heartbeatVeto), so the deadline leaves 2 s for serf's detection, the
// reclaim and the placement, and stays 2 s short of the lease.
const (
	lanLease    = 8 * time.Second
	lanDeadline = 6 * time.Second
)

// lanRegion starts a one-coordinator region with the LAN pool (devcluster's
// default), two agents, an 8 s node lease, no failover grace (the owner of
// a fresh region would otherwise hold every reclaim for its first 10 s)
// and /metrics at the returned address.
func lanRegion(t *testing.T) (*devcluster.Region, clients, string) {
	metrics := testutil.FreeAddr(t)
	_, r := cluster(t, devcluster.RegionSpec{Agents: twoAgents(), ExtraArgs: []string{
		"--node-lease-ttl", lanLease.String(), "--failover-grace", "0s", "--metrics-addr", metrics}})
	return r, dial(t, r), metrics
}

func fastReclaims(t *testing.T, metrics string) float64 {
	return testutil.MetricSum(testutil.ScrapeMetrics(t, "http://"+metrics+"/metrics")["apiary_lan_fast_reclaims_total"])
}

// TestLANAgentKilledRerunsBeforeLease: SIGKILL the agent running a task;
// with an 8 s node lease, the task runs as attempt 2 on the other node
// within 6 s, because the coordinator ended the node epoch when serf
// declared the agent's member failed (apiary_lan_fast_reclaims_total).
// Without the LAN pool it waits out the lease and fails.
func TestLANAgentKilledRerunsBeforeLease(t *testing.T) {
	r, c, metrics := lanRegion(t)
	dir := t.TempDir()
	id := submit(t, c, spec(t, gatedJob(dir, 1, "max_attempts: 3")))
	first := waitAttemptRunning(t, c, id, 0, 1, 20*time.Second)
	if err := r.Agent(first.GetNodeId()).Kill(); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	second := waitAttemptRunning(t, c, id, 0, 2, lanDeadline)
	took := time.Since(t0)
	t.Logf("SIGKILL of %s → attempt 2 RUNNING on %s after %v (node lease %v)", first.GetNodeId(), second.GetNodeId(), took.Round(time.Millisecond), lanLease)
	if second.GetNodeId() == first.GetNodeId() {
		t.Fatalf("attempt 2 on the killed node %s", first.GetNodeId())
	}
	if n := fastReclaims(t, metrics); n < 1 {
		t.Fatalf("apiary_lan_fast_reclaims_total = %v: the task moved, but not by the fast path", n)
	}
	openGate(t, dir)
	j := waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 30*time.Second)
	as := j.GetTasks()[0].GetAttempts()
	if len(as) != 2 || as[0].GetOutcome() != "lost" || as[1].GetOutcome() != "complete" {
		t.Fatalf("attempt history %v", as)
	}
	if n := completions(logs(t, c, id)); n[0] != 1 {
		t.Fatalf("%d committed completions", n[0])
	}
}

// TestLANFalseSuspicionCommitsOnce: SIGSTOP the agent running a task until
// the coordinator has ended its epoch on serf's suspicion (after half the
// 8 s lease without heartbeats), then SIGCONT. The suspicion was wrong (the
// agent was only paused), and it costs the agent a re-registration and the
// attempt a rerun, never a duplicate: the agent kills the stale attempt as
// soon as it runs again, the task's effect happens once (by attempt 2), and
// exactly one attempt's result is committed.
func TestLANFalseSuspicionCommitsOnce(t *testing.T) {
	r, c, metrics := lanRegion(t)
	dir := t.TempDir()
	id := submit(t, c, spec(t, gatedJob(dir, 1, "max_attempts: 3")))
	first := waitAttemptRunning(t, c, id, 0, 1, 20*time.Second)
	victim := r.Agent(first.GetNodeId())
	before := fastReclaims(t, metrics)
	if err := victim.Pause(); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	testutil.Eventually(t, lanDeadline, "fast reclaim of the paused agent", func() error {
		if n := fastReclaims(t, metrics); n <= before {
			return fmt.Errorf("apiary_lan_fast_reclaims_total = %v", n)
		}
		return nil
	})
	paused := time.Since(t0)
	if err := victim.Resume(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s paused for %v (lease %v); its epoch %d was ended on suspicion", first.GetNodeId(), paused.Round(time.Millisecond), lanLease, first.GetNodeEpoch())
	// The resumed agent hears its epoch ended and kills the stale attempt,
	// before the gate opens.
	testutil.Eventually(t, 10*time.Second, "attempt 1's processes killed by the resumed agent", func() error {
		if ps := attemptProcs(id, 1); len(ps) > 0 {
			return fmt.Errorf("still running: %v", ps)
		}
		return nil
	})
	waitAttemptRunning(t, c, id, 0, 2, 20*time.Second)
	waitReady(t, c, first.GetNodeId(), first.GetNodeEpoch()) // re-registered: a new epoch
	openGate(t, dir)
	j := waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 30*time.Second)
	b, _ := os.ReadFile(filepath.Join(dir, "L.0"))
	if got := strings.Count(string(b), "done"); got != 1 || !strings.Contains(string(b), "done 2") {
		t.Fatalf("L.0 holds %q: want one effect (done), by attempt 2", b)
	}
	tasks := logs(t, c, id)
	if n := completions(tasks); n[0] != 1 {
		t.Fatalf("%d committed completions", n[0])
	}
	as := j.GetTasks()[0].GetAttempts()
	if len(as) != 2 || as[0].GetOutcome() != "lost" || as[1].GetOutcome() != "complete" {
		t.Fatalf("attempt history %v: want attempt 1 lost, attempt 2 complete", as)
	}
}

// TestLANDeposesPausedOwner: SIGSTOP a shard owner of a 3-coordinator
// region with a 10 s owner lease. Its API port still accepts connections,
// so the TCP probe (--suspect-after) never fires; a peer revokes its lease
// within 6 s because its LAN member was declared failed (logged
// via=lan_failed), and the survivors own every shard. Without the pool the
// paused coordinator keeps its shards until its lease expires.
func TestLANDeposesPausedOwner(t *testing.T) {
	_, r := cluster(t, devcluster.RegionSpec{Coordinators: 3, ExtraArgs: []string{"--owner-lease-ttl", "10s"}})
	c := dial(t, r)
	info := regionInfo(t, c)
	var owner string
	for _, co := range info.GetCoordinators() {
		if co.GetScheduler() {
			owner = co.GetId()
		}
	}
	var victim *devcluster.Proc
	for _, p := range r.Coords {
		if p.Name == owner {
			victim = p
		}
	}
	if victim == nil {
		t.Fatalf("no scheduler among %v", info.GetCoordinators())
	}
	// The pool must hold the owner before it is paused: a member that has
	// not joined yet (peers are found through etcd about every 2 s) cannot
	// be declared failed, and the lease decides instead.
	waitLANCoordinators(t, r)
	if err := victim.Pause(); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	var next string
	testutil.Eventually(t, lanDeadline, "a peer deposes the paused owner", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		in, err := c.admin.GetRegionInfo(ctx, &apiaryv1.GetRegionInfoRequest{})
		if err != nil {
			return err
		}
		var owned int32
		var by []string
		for _, co := range in.GetCoordinators() {
			if co.GetId() == owner && co.GetShardsOwned() > 0 {
				return fmt.Errorf("the paused %s still owns %d shards", owner, co.GetShardsOwned())
			}
			owned += co.GetShardsOwned()
			by = append(by, fmt.Sprintf("%s:%d", co.GetId(), co.GetShardsOwned()))
		}
		if owned != in.GetShardCount() || in.GetSchedulerEpoch() <= info.GetSchedulerEpoch() {
			return fmt.Errorf("%d of %d shards owned (%v), highest epoch %d", owned, in.GetShardCount(), by, in.GetSchedulerEpoch())
		}
		next = strings.Join(by, " ")
		return nil
	})
	t.Logf("paused %s's shards taken over (%s) after %v (owner lease 10 s)", owner, next, time.Since(t0).Round(time.Millisecond))
	var via bool
	for _, p := range r.Coords {
		if b, _ := os.ReadFile(p.LogPath); p != victim && strings.Contains(string(b), "revoked an unreachable coordinator's lease") && strings.Contains(string(b), "via=lan_failed") {
			via = true
		}
	}
	if !via {
		t.Fatal("no survivor logged a deposition via=lan_failed")
	}
	if err := victim.Resume(); err != nil {
		t.Fatal(err)
	}
	after := regionInfo(t, c)
	if after.GetSchedulerEpoch() <= info.GetSchedulerEpoch() {
		t.Fatalf("scheduler epoch %d after the resume, was %d", after.GetSchedulerEpoch(), info.GetSchedulerEpoch())
	}
}

// waitLANCoordinators waits until every coordinator of r has seen every
// coordinator (itself included) join its LAN pool (serf's EventMemberJoin
// lines in its log).
func waitLANCoordinators(t *testing.T, r *devcluster.Region) {
	t.Helper()
	testutil.Eventually(t, 20*time.Second, "every coordinator in every coordinator's LAN pool", func() error {
		for _, p := range r.Coords {
			b, err := os.ReadFile(p.LogPath)
			if err != nil {
				return err
			}
			for _, q := range r.Coords {
				if !strings.Contains(string(b), "EventMemberJoin: coordinator."+q.Name+".") {
					return fmt.Errorf("%s has not seen %s join", p.Name, q.Name)
				}
			}
		}
		return nil
	})
}
