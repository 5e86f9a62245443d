package scheduler

import (
	"context"
	"errors"
	"testing"
	"time"

	"apiary.dev/apiary/shards"
)

// TestShardSetHandBack: a hand-back waits for the round in flight, then
// the shard is left out of the next round even while the reconciler's set
// still holds it, and counts as handed back (not lost) when it leaves; a
// new claim of it (a new epoch) brings it back. A hand-back that times out
// keeps the shard.
func TestShardSetHandBack(t *testing.T) {
	ss := NewShardSet()
	if m := ss.Set(map[int]shards.Epoch{1: 5, 2: 6}); m.Claimed != 2 {
		t.Fatalf("moves %+v, want 2 claimed", m)
	}
	if !ss.beginRound(context.Background()) {
		t.Fatal("round token")
	}
	done := make(chan error, 1)
	go func() { done <- ss.HandBack(context.Background(), 1) }()
	select {
	case err := <-done:
		t.Fatalf("hand-back returned during the round in flight: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	ss.endRound()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if cur := ss.current(); len(cur) != 1 || cur[2] != 6 {
		t.Fatalf("after the hand-back the loop may write for %v, want only shard 2", cur)
	}
	ss.Set(map[int]shards.Epoch{1: 5, 2: 6}) // the reconciler has not dropped it yet
	if _, ok := ss.current()[1]; ok {
		t.Fatal("a handed-back shard came back at the same epoch")
	}
	if m := ss.Set(map[int]shards.Epoch{2: 6}); m.HandedBack != 1 || m.Lost != 0 {
		t.Fatalf("moves %+v, want 1 handed back, 0 lost", m)
	}
	ss.Set(map[int]shards.Epoch{1: 9, 2: 6})
	if ss.current()[1] != 9 {
		t.Fatal("shard 1 claimed again at epoch 9 is not written for")
	}

	// A hand-back that cannot get the round in time keeps the shard.
	if !ss.beginRound(context.Background()) {
		t.Fatal("round token")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := ss.HandBack(ctx, 2); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("hand-back during a stuck round: %v, want the deadline", err)
	}
	ss.endRound()
	if ss.current()[2] != 6 {
		t.Fatal("a failed hand-back dropped the shard")
	}
	if m := ss.Set(map[int]shards.Epoch{1: 9}); m.Lost != 1 {
		t.Fatalf("moves %+v, want shard 2 counted lost (no hand-back completed)", m)
	}
}
