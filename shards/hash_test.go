package shards

import (
	"fmt"
	"testing"
)

func TestOfInRangeAndStable(t *testing.T) {
	counts := make([]int, DefaultCount)
	for i := 0; i < 100000; i++ {
		id := fmt.Sprintf("eu-west-%08d", i)
		s := Of(id, DefaultCount)
		if s < 0 || s >= DefaultCount {
			t.Fatalf("shard %d out of range", s)
		}
		if s != Of(id, DefaultCount) {
			t.Fatalf("unstable shard for %s", id)
		}
		counts[s]++
	}
	// Every shard gets work and none gets more than twice its share.
	for s, c := range counts {
		if c == 0 || c > 2*100000/DefaultCount {
			t.Fatalf("shard %d got %d of 100000 ids", s, c)
		}
	}
}

func TestOfRangePartition(t *testing.T) {
	// With count 1 everything is shard 0; doubling the count splits a range
	// into two neighbours (range partitioning, not modulo).
	for i := 0; i < 1000; i++ {
		id := fmt.Sprintf("job-%d", i)
		if Of(id, 1) != 0 {
			t.Fatal("count 1 must map to shard 0")
		}
		if a, b := Of(id, 128), Of(id, 256); b/2 != a {
			t.Fatalf("%s: shard %d of 128 but %d of 256", id, a, b)
		}
	}
}

func TestValidate(t *testing.T) {
	if Validate(0) == nil || Validate(MaxCount+1) == nil || Validate(256) != nil {
		t.Fatal("Validate bounds wrong")
	}
}
