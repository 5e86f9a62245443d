package regional

import (
	"fmt"
	"testing"
	"time"
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
