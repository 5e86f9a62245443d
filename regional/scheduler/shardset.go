package scheduler

import (
	"context"
	"maps"
	"sync"

	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/shards"
)

// ShardSet is the set of shards the scheduling loop may write for, shared
// between the reconciler (which claims and hands back) and the loop (which
// reads it at the start of each round).
type ShardSet struct {
	mu sync.Mutex
	// latest is the reconciler's owned set (OnChange).
	latest map[int]shards.Epoch
	// dropped holds shards not to write for at that epoch: handed back (the
	// reconciler's owned set may still hold them for a moment) or found
	// fenced by a write.
	dropped map[int]shards.Epoch
	// handed holds the shards handed back (for the move counts).
	handed map[int]shards.Epoch
	// changed (capacity 1) wakes the loop when the set changes.
	changed chan struct{}
	// round (capacity 1) is held by the loop for the length of a round, so
	// that a hand-back can wait for the in-flight plan.
	round chan struct{}
}

// NewShardSet is an empty set (the loop writes for no shard until Set).
func NewShardSet() *ShardSet {
	return &ShardSet{latest: map[int]shards.Epoch{}, dropped: map[int]shards.Epoch{}, handed: map[int]shards.Epoch{},
		changed: make(chan struct{}, 1), round: make(chan struct{}, 1)}
}

// ShardMoves counts one change of the owned set.
type ShardMoves struct{ Claimed, HandedBack, Lost int }

// Set is the reconciler's OnChange (owned: shard → epoch); it returns what changed (a shard that
// left the set after a hand-back counts as handed back, any other as lost).
func (ss *ShardSet) Set(owned map[int]shards.Epoch) ShardMoves {
	var m ShardMoves
	ss.mu.Lock()
	for s, e := range owned {
		if old, ok := ss.latest[s]; !ok || old != e {
			m.Claimed++
		}
	}
	for s, e := range ss.latest {
		if now, ok := owned[s]; ok && now == e {
			continue
		}
		if h, ok := ss.handed[s]; ok && h == e {
			m.HandedBack++
		} else {
			m.Lost++
		}
	}
	ss.latest = maps.Clone(owned)
	for s, e := range ss.dropped {
		if owned[s] != e {
			delete(ss.dropped, s) // gone, or claimed again at a new epoch
		}
	}
	for s, e := range ss.handed {
		if owned[s] != e {
			delete(ss.handed, s)
		}
	}
	ss.mu.Unlock()
	ss.wake()
	return m
}

func (ss *ShardSet) wake() {
	select {
	case ss.changed <- struct{}{}:
	default:
	}
}

// current is the shards the loop may write for: owned and not dropped.
func (ss *ShardSet) current() map[int]shards.Epoch {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	out := make(map[int]shards.Epoch, len(ss.latest))
	for s, e := range ss.latest {
		if d, ok := ss.dropped[s]; !ok || d != e {
			out[s] = e
		}
	}
	return out
}

// drop stops writes for the fenced shards (until claimed again).
func (ss *ShardSet) drop(fs []store.Fence) {
	ss.mu.Lock()
	for _, f := range fs {
		ss.dropped[f.Shard] = f.Epoch
	}
	ss.mu.Unlock()
}

// HandBack is the reconciler's HandBack hook: the loop writes nothing more
// for s once it returns (the round in flight, if any, has finished, and the
// next one leaves s out). On timeout the shard is kept.
func (ss *ShardSet) HandBack(ctx context.Context, s int) error {
	ss.mu.Lock()
	e, ok := ss.latest[s]
	if ok {
		ss.dropped[s] = e
	}
	ss.mu.Unlock()
	if !ok {
		return nil
	}
	select {
	case ss.round <- struct{}{}:
		<-ss.round
		ss.mu.Lock()
		ss.handed[s] = e
		ss.mu.Unlock()
		return nil
	case <-ctx.Done():
		ss.mu.Lock()
		if ss.dropped[s] == e {
			delete(ss.dropped, s)
		}
		ss.mu.Unlock()
		return ctx.Err()
	}
}

// beginRound takes the round token (false when ctx ended first).
func (ss *ShardSet) beginRound(ctx context.Context) bool {
	select {
	case ss.round <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

func (ss *ShardSet) endRound() { <-ss.round }

// ShardStat is one shard's counts from the scheduling loop's cache (Deps.
// Publish): its PENDING and active (ASSIGNED, RUNNING) tasks, and the
// latest AssignedMs of its tasks (Unix ms; 0: none).
type ShardStat struct {
	Pending, Running int
	LastPlanMs       int64
}
