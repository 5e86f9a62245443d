// Package lifecycle runs a process's long-running parts as one ordered list.
// Every part is a grafana/dskit services.Service (starting, running,
// stopping on its context); a Group starts the parts one after another, each
// Running before the next starts, and stops them in reverse order, waiting
// for each. A part that fails, or ends on its own, while the group runs is
// reported (Failed, Err, Run's error) naming the part, and the process stops.
// A part that fails to start stops every part started before it.
//
// `apiary region`, `apiary global` and `apiary agent` each build their list
// in one place (regional.Coordinator.Parts, cmd/apiary/global.go,
// agent.Agent.Parts) and run it with Run.
//
// Why not dskit's services.Manager: it starts every service at once and
// stops them all at once, while these processes need an order (etcd before
// the API that reads it; the WAN member leaves the pool before the owner
// resigns; the API stops before the group-commit workers it feeds).
//
// Start-up context: a dskit BasicService derives the context its running
// function loops on from the context given to StartAsync. A Group therefore
// starts every part with a context of its own, which ends only on Stop, and
// uses the caller's context only to bound the wait for Running: no
// long-running goroutine hangs off a start-up timeout.
//
// This package imports nothing of regional/, global/ or agent/.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/grafana/dskit/services"
)

// StopTimeout bounds how long Stop waits for one part to terminate before it
// logs a warning and goes on to the next.
const StopTimeout = 15 * time.Second

// Part is one named long-running part of a process.
type Part struct {
	Name    string
	Service services.Service
}

// New names a service.
func New(name string, svc services.Service) Part { return Part{Name: name, Service: svc} }

// Idle is a part with no loop of its own: up runs on start, down (may be
// nil) on stop.
func Idle(name string, up func(context.Context) error, down func() error) Part {
	var stop services.StoppingFn
	if down != nil {
		stop = func(error) error { return down() }
	}
	return New(name, services.NewIdleService(up, stop))
}

// Loop is a part whose work is fn, run until its context ends. If fn
// returns earlier (it has nothing to do, e.g. a disabled sweeper), the part
// idles until stopped.
func Loop(name string, fn func(context.Context)) Part {
	return New(name, services.NewBasicService(nil, func(ctx context.Context) error {
		fn(ctx)
		<-ctx.Done()
		return nil
	}, nil))
}

// Group is an ordered list of parts. Create it with NewGroup, then Start and
// Stop it once.
type Group struct {
	log   *slog.Logger
	parts []Part

	ctx    context.Context // parent of every part's context; ends on Stop
	cancel context.CancelFunc

	mu       sync.Mutex
	started  int // parts whose StartAsync was called
	stopping atomic.Bool

	failOnce sync.Once
	failErr  error
	failed   chan struct{}

	stopOnce sync.Once
	stopErr  error
	done     chan struct{}
}

// NewGroup returns a group of parts in start order (log: nil discards).
func NewGroup(log *slog.Logger, parts ...Part) *Group {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Group{log: log, parts: parts, failed: make(chan struct{}), done: make(chan struct{})}
}

// Start starts the parts in order and returns once every one is Running.
// ctx bounds only the start-up: the parts keep running after it ends, until
// Stop. If a part fails to start, or ctx ends first, Start stops the parts
// already started (in reverse order) and returns an error naming the part.
func (g *Group) Start(ctx context.Context) error {
	g.mu.Lock()
	if g.ctx != nil {
		g.mu.Unlock()
		return errors.New("lifecycle: group started twice")
	}
	g.ctx, g.cancel = context.WithCancel(context.WithoutCancel(ctx))
	g.mu.Unlock()
	for i, p := range g.parts {
		if g.stopping.Load() {
			return errors.New("lifecycle: stopped while starting")
		}
		g.mu.Lock()
		err := p.Service.StartAsync(g.ctx)
		if err == nil {
			g.started = i + 1
		}
		g.mu.Unlock()
		if err == nil {
			err = p.Service.AwaitRunning(ctx)
		}
		if err != nil {
			if fc := p.Service.FailureCase(); fc != nil {
				err = fc
			}
			_ = g.Stop()
			// A part still starting when ctx ended learns it when Stop
			// cancels it, and may then say why it was not ready (etcd: "does
			// a quorum of --initial-cluster run?"): prefer that to the bare
			// deadline.
			if fc := p.Service.FailureCase(); fc != nil && fc.Error() != context.Canceled.Error() {
				err = fc
			}
			err = fmt.Errorf("start %s: %w", p.Name, err)
			g.log.Error("part failed to start; stopped the parts already started", "part", p.Name, "err", err)
			return err
		}
		g.log.Info("part running", "part", p.Name)
		go g.watch(p)
	}
	return nil
}

// watch reports a part that terminates while the group is not stopping.
func (g *Group) watch(p Part) {
	_ = p.Service.AwaitTerminated(context.Background())
	if g.stopping.Load() {
		return
	}
	err := p.Service.FailureCase()
	if err == nil {
		err = errors.New("stopped on its own")
	}
	g.failOnce.Do(func() {
		g.failErr = fmt.Errorf("%s: %w", p.Name, err)
		g.log.Error("part failed; stopping the process", "part", p.Name, "err", err)
		close(g.failed)
	})
}

// Failed is closed when a part fails or ends while the group runs; Err says
// which part and why.
func (g *Group) Failed() <-chan struct{} { return g.failed }

// Err is the first part failure ("<part>: <error>"), or nil.
func (g *Group) Err() error {
	select {
	case <-g.failed:
		return g.failErr
	default:
		return nil
	}
}

// Done is closed when Stop has stopped every part.
func (g *Group) Done() <-chan struct{} { return g.done }

// Stop stops the started parts in reverse order, waiting up to StopTimeout
// for each. It returns the errors of parts that failed while stopping (nil
// when every part stopped cleanly). It may be called more than once (later
// calls wait for the first and return its result) and from any goroutine.
func (g *Group) Stop() error {
	g.stopOnce.Do(func() {
		g.stopping.Store(true)
		g.mu.Lock()
		n := g.started
		g.mu.Unlock()
		var errs []error
		for i := n - 1; i >= 0; i-- {
			p := g.parts[i]
			p.Service.StopAsync()
			ctx, cancel := context.WithTimeout(context.Background(), StopTimeout)
			err := p.Service.AwaitTerminated(ctx)
			timedOut := ctx.Err() != nil
			cancel()
			if st := p.Service.State(); timedOut && st != services.Terminated && st != services.Failed {
				g.log.Warn("part did not stop in time; going on", "part", p.Name, "timeout", StopTimeout)
				continue
			}
			if fc := p.Service.FailureCase(); fc != nil {
				errs = append(errs, fmt.Errorf("%s: %w", p.Name, fc))
			} else if err == nil {
				g.log.Info("part stopped", "part", p.Name)
			}
		}
		if g.cancel != nil {
			g.cancel()
		}
		g.stopErr = errors.Join(errs...)
		close(g.done)
	})
	<-g.done
	return g.stopErr
}

// Run starts the parts in order (the start-up bounded by startTimeout when
// it is positive), runs them until ctx ends or a part fails, then stops them
// in reverse order. It returns nil after a clean stop on ctx (also when ctx
// ends during the start-up); otherwise the
// error names the part that failed (to start, while running, or while
// stopping).
func Run(ctx context.Context, log *slog.Logger, startTimeout time.Duration, parts ...Part) error {
	g := NewGroup(log, parts...)
	sctx, cancel := ctx, context.CancelFunc(func() {})
	if startTimeout > 0 {
		sctx, cancel = context.WithTimeout(ctx, startTimeout)
	}
	err := g.Start(sctx)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil // asked to stop while starting; what started has stopped
		}
		return err
	}
	select {
	case <-ctx.Done():
		g.log.Info("stopping", "reason", context.Cause(ctx))
	case <-g.Failed():
	}
	stopErr := g.Stop()
	if ferr := g.Err(); ferr != nil {
		return ferr
	}
	return stopErr
}

// Sleep waits d or until ctx ends, whichever is first, and returns
// ctx.Err() in the second case (nil otherwise): the pause of a retry loop
// that must stop on its context at once.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
