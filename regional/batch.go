package regional

import (
	"context"
	"errors"
	"sync"

	"github.com/cespare/xxhash/v2"
)

// errCommitStopped: the group-commit workers have stopped (the coordinator
// is shutting down).
var errCommitStopped = errors.New("coordinator is stopping: group commit closed")

// groupCommit is a group-commit queue: callers submit items and wait; a fixed
// number of workers each take everything queued (up to max) and flush it as
// one batch, so that under load one etcd Txn carries many submissions or
// reports (etcd's own batching stops at one raft entry per request). The
// workers run in the coordinator's "group-commit" part (run).
//
// With a partition key (newPartitionedCommit), each worker takes only the
// items whose key hashes to it, so that two batches in flight never hold
// items of one key: reports of one node write that node's health record
// under a ModRevision compare, and two workers' batches sharing a node
// would fail each other's write and fall back to one Txn per report.
type groupCommit[T any] struct {
	chs     []chan T // one shared by every worker, or one per worker
	key     func(T) string
	workers int
	max     int
	flush   func([]T)
	stopped chan struct{} // closed when run has returned
}

func newGroupCommit[T any](workers, max int, flush func([]T)) *groupCommit[T] {
	return &groupCommit[T]{chs: []chan T{make(chan T, max*workers*2)}, workers: workers, max: max, flush: flush,
		stopped: make(chan struct{})}
}

// newPartitionedCommit is newGroupCommit whose items are split among the
// workers by key(item).
func newPartitionedCommit[T any](workers, max int, key func(T) string, flush func([]T)) *groupCommit[T] {
	g := &groupCommit[T]{key: key, workers: workers, max: max, flush: flush, stopped: make(chan struct{})}
	for range workers {
		g.chs = append(g.chs, make(chan T, max*2))
	}
	return g
}

// queue is the channel item goes to.
func (g *groupCommit[T]) queue(item T) chan T {
	if len(g.chs) == 1 {
		return g.chs[0]
	}
	return g.chs[xxhash.Sum64String(g.key(item))%uint64(len(g.chs))]
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
	case g.queue(item) <- item:
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
		ch := g.chs[i%len(g.chs)]
		wg.Go(func() { g.loop(ctx, ch) })
	}
	wg.Wait()
}

func (g *groupCommit[T]) loop(ctx context.Context, ch chan T) {
	batch := make([]T, 0, g.max)
	for {
		var first T
		select {
		case first = <-ch:
		case <-ctx.Done():
			// Flush what was queued before the stop (the API has stopped).
			for {
				batch = g.take(ch, batch[:0])
				if len(batch) == 0 {
					return
				}
				g.flush(batch)
			}
		}
		batch = g.take(ch, append(batch[:0], first))
		g.flush(batch)
	}
}

// take appends items queued on ch to batch, without waiting, up to max.
func (g *groupCommit[T]) take(ch chan T, batch []T) []T {
	for len(batch) < g.max {
		select {
		case it := <-ch:
			batch = append(batch, it)
		default:
			return batch
		}
	}
	return batch
}
