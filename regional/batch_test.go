package regional

import (
	"fmt"
	"testing"
)

// TestPartitionedCommitKeepsAKeyOnOneWorker: items of one key always go to
// the same worker's queue, and distinct keys use every worker.
func TestPartitionedCommitKeepsAKeyOnOneWorker(t *testing.T) {
	g := newPartitionedCommit(4, 8, func(s string) string { return s }, func([]string) {})
	used := map[chan string]bool{}
	for i := range 64 {
		k := fmt.Sprintf("node-%d", i)
		q := g.queue(k)
		if g.queue(k) != q {
			t.Fatalf("key %s went to two queues", k)
		}
		used[q] = true
	}
	if len(used) != 4 {
		t.Fatalf("64 keys used %d of 4 worker queues", len(used))
	}
}
