package shards

import (
	"fmt"
	"math/bits"

	"github.com/cespare/xxhash/v2"
)

// DefaultCount is the default number of virtual shards in a region. It is
// fixed when the region is created.
const DefaultCount = 256

// MaxCount bounds the shard count.
const MaxCount = 65536

// Of returns the shard (0..count-1) that owns jobID: shard i owns the hash
// range [i*2^64/count, (i+1)*2^64/count) of xxhash64(jobID). Range (not
// modulo) partitioning keeps neighbouring shards contiguous so that a later
// split or merge moves whole ranges.
func Of(jobID string, count int) int {
	if count <= 0 {
		panic(fmt.Sprintf("shards.Of: count %d must be > 0", count))
	}
	hi, _ := bits.Mul64(xxhash.Sum64String(jobID), uint64(count))
	return int(hi)
}

// Validate checks a shard count.
func Validate(count int) error {
	if count < 1 || count > MaxCount {
		return fmt.Errorf("shard count: must be in 1..%d, got %d", MaxCount, count)
	}
	return nil
}
