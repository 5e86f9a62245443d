package agent

import (
	"fmt"
	"testing"
)

// A fleet sharing one address list starts spread over every coordinator, a
// node always starts at the same one, and failover goes round the list from
// there.
func TestCoordinatorStartSpreadsAFleet(t *testing.T) {
	addrs := []string{"c1:7000", "c2:7000", "c3:7000"}
	counts := make([]int, len(addrs))
	const nodes = 3000
	for i := range nodes {
		id := fmt.Sprintf("edge-%05d", i)
		c := sharedCoordinators(addrs, nil).startAt(id)
		cur, _ := c.watch()
		if again, _ := sharedCoordinators(addrs, nil).startAt(id).watch(); again != cur {
			t.Fatalf("node %s started at %d, then at %d", id, cur, again)
		}
		counts[cur]++
	}
	for i, n := range counts {
		// Each coordinator's share is within 10% of a third.
		if n < nodes/3*9/10 || n > nodes/3*11/10 {
			t.Fatalf("coordinator %s is the start of %d of %d nodes (all: %v); want about %d", addrs[i], n, nodes, counts, nodes/3)
		}
	}

	c := sharedCoordinators(addrs, nil)
	c.cur = 2
	changed := c.changed
	c.failover(2)
	if cur, _ := c.watch(); cur != 0 {
		t.Fatalf("failover from the last address went to %d, want 0 (round the list)", cur)
	}
	select {
	case <-changed:
	default:
		t.Fatal("failover did not signal the change")
	}
	c.failover(2) // a second caller failing on the old one moves nothing
	if cur, _ := c.watch(); cur != 0 {
		t.Fatalf("a stale failover moved the agent to %d", cur)
	}

	if got := sharedCoordinators(addrs[:1], nil).startAt("any"); got.cur != 0 {
		t.Fatalf("one address: start %d", got.cur)
	}
}
