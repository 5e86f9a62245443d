package regional

import (
	"fmt"
	"testing"
	"time"

	"apiary.dev/apiary/regional/scheduler"
)

// TestMassFailureGuard: the fast reclaim stands down when more nodes'
// agents failed within 10 s than nodes remain alive (a view this broken is
// more likely the coordinator's own network), but not for one node that
// crashes and restarts repeatedly, nor for a minority of a large pool.
func TestMassFailureGuard(t *testing.T) {
	t0 := time.Now()
	live := func(names ...string) map[string]bool {
		m := map[string]bool{}
		for _, n := range names {
			m[n] = true
		}
		return m
	}
	// One node of three killed and restarted every 2 s: each time it is the
	// only failed node.
	var l lanMember
	for i := 0; i < 6; i++ {
		n, alive := l.noteAgentFailure(live("n2", "n3"), "n1", t0.Add(time.Duration(i)*2*time.Second))
		if massFailure(n, alive) || n != 1 {
			t.Fatalf("restart %d: failed %d alive %d counted as a mass failure", i, n, alive)
		}
	}
	// 50 nodes; 20 fail at once: a minority, acted on.
	l = lanMember{}
	all := map[string]bool{}
	for i := 0; i < 50; i++ {
		all[fmt.Sprintf("n%d", i)] = true
	}
	for i := 0; i < 20; i++ {
		delete(all, fmt.Sprintf("n%d", i))
		if n, alive := l.noteAgentFailure(all, fmt.Sprintf("n%d", i), t0); massFailure(n, alive) {
			t.Fatalf("failure %d of 50 (failed %d, alive %d) counted as a mass failure", i+1, n, alive)
		}
	}
	// Then 6 more: 26 failed, 24 alive.
	var last bool
	for i := 20; i < 26; i++ {
		delete(all, fmt.Sprintf("n%d", i))
		n, alive := l.noteAgentFailure(all, fmt.Sprintf("n%d", i), t0.Add(time.Second))
		last = massFailure(n, alive)
	}
	if !last {
		t.Fatal("26 of 50 failed within a second: not a mass failure")
	}
	// 11 s later the window has passed.
	if n, alive := l.noteAgentFailure(all, "n30", t0.Add(12*time.Second)); massFailure(n, alive) {
		t.Fatalf("after the window: failed %d alive %d", n, alive)
	}
	// Small pools: 2 of 3 failing is still acted on.
	l = lanMember{}
	l.noteAgentFailure(live("n2", "n3"), "n1", t0)
	if n, alive := l.noteAgentFailure(live("n3"), "n2", t0); massFailure(n, alive) {
		t.Fatalf("2 of 3: failed %d alive %d", n, alive)
	}
}

// TestHeartbeatVetoFollowsLateBeats: the fast reclaim's veto is 2 heartbeat
// intervals (or half the lease, if longer) while beats arrive on time, grows to 1.5 times the longest gap
// between two beats of one epoch seen in the last 30 s when they arrive
// late (a busy machine), and ignores gaps that span two epochs or are longer
// than the lease (the beats went to another coordinator meanwhile).
func TestHeartbeatVetoFollowsLateBeats(t *testing.T) {
	c := &Coordinator{cfg: Config{NodeLeaseTTL: 2 * time.Second}, nodes: scheduler.NewNodeIndex()}
	t0 := time.Now()
	at := t0
	beat := func(node string, epoch int64, after time.Duration) {
		at = at.Add(after)
		c.beats.note(node, epoch, at, 2*time.Second)
	}
	for i := 0; i < 10; i++ {
		beat("n1", 7, 500*time.Millisecond)
	}
	if v := c.heartbeatVeto(at); v != time.Second {
		t.Fatalf("beats on time: veto %v, want 1s (2 intervals of 500ms)", v)
	}
	beat("n1", 8, 1500*time.Millisecond) // a new epoch: not a gap
	beat("n2", 3, 0)
	beat("n2", 3, 5*time.Second) // longer than the lease: beats went elsewhere
	if v := c.heartbeatVeto(at); v != time.Second {
		t.Fatalf("after a new epoch and an over-long gap: veto %v, want 1s", v)
	}
	beat("n1", 8, 0)
	beat("n1", 8, 1300*time.Millisecond) // a late beat of a live epoch
	if v := c.heartbeatVeto(at); v != 1950*time.Millisecond {
		t.Fatalf("after a 1.3s gap: veto %v, want 1.95s", v)
	}
	beat("n1", 8, 600*time.Millisecond)
	if v := c.heartbeatVeto(at); v != 1950*time.Millisecond {
		t.Fatalf("a shorter gap after the late one: veto %v, want 1.95s (the window's longest)", v)
	}
	if v := c.heartbeatVeto(at.Add(31 * time.Second)); v != time.Second {
		t.Fatalf("31 s later: veto %v, want 1s again", v)
	}
	c.cfg.NodeLeaseTTL = 10 * time.Second
	if v := c.heartbeatVeto(at.Add(31 * time.Second)); v != 5*time.Second {
		t.Fatalf("a 10 s lease: veto %v, want 5s (half the lease)", v)
	}
	// A fleet past --max-heartbeats-per-second beats every few seconds
	// on a lease of four intervals: a gap up to that epoch's lease counts,
	// though it passes --node-lease-ttl.
	at = at.Add(time.Minute)
	c.beats.note("n3", 4, at, 20*time.Second)
	at = at.Add(9 * time.Second)
	c.beats.note("n3", 4, at, 20*time.Second)
	if v := c.heartbeatVeto(at); v != 13500*time.Millisecond {
		t.Fatalf("a 9 s gap under a 20 s epoch lease: veto %v, want 13.5s", v)
	}
}
