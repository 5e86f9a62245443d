package scheduler

import (
	"context"
	"sync"
)

// watermark is the etcd revision up to which a watch-cache view (JobIndex,
// NodeIndex) has applied every event, with a wait for it to reach a
// revision: a reader that read etcd's current revision waits until the view
// has seen every write committed before its request.
type watermark struct {
	mu  sync.Mutex
	rev int64
	// advanced is closed and replaced whenever rev grows.
	advanced chan struct{}
}

func newWatermark() watermark { return watermark{advanced: make(chan struct{})} }

// advance records that every event up to rev was applied.
func (w *watermark) advance(rev int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if rev > w.rev {
		w.rev = rev
		close(w.advanced)
		w.advanced = make(chan struct{})
	}
}

// reset sets the revision to 0 (a reloading cache).
func (w *watermark) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.rev = 0
}

// Revision is the etcd revision up to which the view is current (0: not
// loaded).
func (w *watermark) Revision() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rev
}

// WaitFor waits until the view is current up to rev, or ctx ends (its
// error is returned then).
func (w *watermark) WaitFor(ctx context.Context, rev int64) error {
	for {
		w.mu.Lock()
		done, ch := w.rev >= rev, w.advanced
		w.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}
