package regional

import "context"

// groupCommit is a group-commit queue: callers submit items and wait; a fixed
// number of workers each take everything queued (up to max) and flush it as
// one batch, so that under load one etcd Txn carries many submissions or
// reports (etcd's own batching stops at one raft entry per request).
type groupCommit[T any] struct {
	ch    chan T
	max   int
	flush func([]T)
}

func newGroupCommit[T any](workers, max int, flush func([]T)) *groupCommit[T] {
	g := &groupCommit[T]{ch: make(chan T, max*workers*2), max: max, flush: flush}
	for i := 0; i < workers; i++ {
		go g.loop()
	}
	return g
}

// submit queues an item; it fails only when ctx ends first.
func (g *groupCommit[T]) submit(ctx context.Context, item T) error {
	select {
	case g.ch <- item:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *groupCommit[T]) loop() {
	batch := make([]T, 0, g.max)
	for first := range g.ch {
		batch = append(batch[:0], first)
	drain:
		for len(batch) < g.max {
			select {
			case it, ok := <-g.ch:
				if !ok {
					break drain
				}
				batch = append(batch, it)
			default:
				break drain
			}
		}
		g.flush(batch)
	}
}

func (g *groupCommit[T]) close() { close(g.ch) }
