package regional

import (
	"context"
	"errors"
	"sync"
)

// errCommitStopped: the group-commit workers have stopped (the coordinator
// is shutting down).
var errCommitStopped = errors.New("coordinator is stopping: group commit closed")

// groupCommit is a group-commit queue: callers submit items and wait; a fixed
// number of workers each take everything queued (up to max) and flush it as
// one batch, so that under load one etcd Txn carries many submissions or
// reports (etcd's own batching stops at one raft entry per request). The
// workers run in the coordinator's "group-commit" part (run).
type groupCommit[T any] struct {
	ch      chan T
	workers int
	max     int
	flush   func([]T)
	stopped chan struct{} // closed when run has returned
}

func newGroupCommit[T any](workers, max int, flush func([]T)) *groupCommit[T] {
	return &groupCommit[T]{ch: make(chan T, max*workers*2), workers: workers, max: max, flush: flush,
		stopped: make(chan struct{})}
}

// submit queues an item; it fails when ctx ends first or the workers have
// stopped (errCommitStopped).
func (g *groupCommit[T]) submit(ctx context.Context, item T) error {
	select {
	case <-g.stopped:
		return errCommitStopped
	default:
	}
	select {
	case g.ch <- item:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-g.stopped:
		return errCommitStopped
	}
}

// run runs the workers until ctx ends; each then flushes what is queued and
// returns. run returns when every worker has.
func (g *groupCommit[T]) run(ctx context.Context) {
	defer close(g.stopped)
	var wg sync.WaitGroup
	for i := 0; i < g.workers; i++ {
		wg.Go(func() { g.loop(ctx) })
	}
	wg.Wait()
}

func (g *groupCommit[T]) loop(ctx context.Context) {
	batch := make([]T, 0, g.max)
	for {
		var first T
		select {
		case first = <-g.ch:
		case <-ctx.Done():
			// Flush what was queued before the stop (the API has stopped).
			for {
				batch = g.take(batch[:0])
				if len(batch) == 0 {
					return
				}
				g.flush(batch)
			}
		}
		batch = g.take(append(batch[:0], first))
		g.flush(batch)
	}
}

// take appends queued items to batch, without waiting, up to max.
func (g *groupCommit[T]) take(batch []T) []T {
	for len(batch) < g.max {
		select {
		case it := <-g.ch:
			batch = append(batch, it)
		default:
			return batch
		}
	}
	return batch
}
