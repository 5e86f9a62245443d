package lifecycle

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/grafana/dskit/services"
	"go.uber.org/goleak"
)

// recorder logs the start and stop of fake parts, in order.
type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) add(e string) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

func (r *recorder) get() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// fake is a part that records "start X" and "stop X"; startErr fails its
// start; its running function returns on ctx or when fail is closed.
func (r *recorder) fake(name string, startErr error, fail chan error) Part {
	return New(name, services.NewBasicService(
		func(context.Context) error {
			r.add("start " + name)
			return startErr
		},
		func(ctx context.Context) error {
			select {
			case <-ctx.Done():
				return nil
			case err := <-fail:
				return err
			}
		},
		func(error) error {
			r.add("stop " + name)
			return nil
		}))
}

func TestGroupStartsInOrderStopsInReverse(t *testing.T) {
	defer goleak.VerifyNone(t)
	var r recorder
	var logs bytes.Buffer
	g := NewGroup(slog.New(slog.NewTextHandler(&logs, nil)), r.fake("etcd", nil, nil), r.fake("api", nil, nil), r.fake("wan", nil, nil))
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := g.Stop(); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), `msg="part stopped"`); n != 3 || strings.Contains(logs.String(), "did not stop") {
		t.Fatalf("log has %d stopped parts, want 3:\n%s", n, logs.String())
	}
	want := []string{"start etcd", "start api", "start wan", "stop wan", "stop api", "stop etcd"}
	if got := r.get(); !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
}

func TestGroupFailedStartStopsWhatStarted(t *testing.T) {
	defer goleak.VerifyNone(t)
	var r recorder
	g := NewGroup(nil, r.fake("etcd", nil, nil), r.fake("api", nil, nil),
		r.fake("wan", errors.New("bind: address already in use"), nil), r.fake("never", nil, nil))
	err := g.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "start wan: bind: address already in use") {
		t.Fatalf("Start: %v, want the wan part named", err)
	}
	// wan's stopping function does not run: its start failed (it cleans up itself).
	want := []string{"start etcd", "start api", "start wan", "stop api", "stop etcd"}
	if got := r.get(); !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
}

// The bug kind of issue 18: the start-up context must not end the parts.
func TestStartContextDoesNotBoundTheParts(t *testing.T) {
	defer goleak.VerifyNone(t)
	alive := make(chan context.Context, 1)
	g := NewGroup(nil, New("loop", services.NewBasicService(nil, func(ctx context.Context) error {
		alive <- ctx
		<-ctx.Done()
		return nil
	}, nil)))
	sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	if err := g.Start(sctx); err != nil {
		t.Fatal(err)
	}
	cancel() // as a start-up timeout would, one minute later
	runCtx := <-alive
	if runCtx.Err() != nil {
		t.Fatalf("the running part's context ended with the start-up context: %v", runCtx.Err())
	}
	if err := g.Stop(); err != nil {
		t.Fatal(err)
	}
	if runCtx.Err() == nil {
		t.Fatal("Stop did not end the part's context")
	}
}

func TestRunStopsEverythingWhenAPartFails(t *testing.T) {
	defer goleak.VerifyNone(t)
	var r recorder
	fail := make(chan error, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- Run(context.Background(), nil, time.Minute, r.fake("etcd", nil, fail), r.fake("api", nil, nil), r.fake("wan", nil, nil))
	}()
	waitEvents(t, &r, 3)
	fail <- errors.New("etcd server stopped")
	err := <-errc
	if err == nil || err.Error() != "etcd: etcd server stopped" {
		t.Fatalf("Run: %v, want the failed part and its error", err)
	}
	want := []string{"start etcd", "start api", "start wan", "stop etcd", "stop wan", "stop api"}
	if got := r.get(); !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v (the failed part stops at once, the rest in reverse)", got, want)
	}
}

func TestRunCleanStopOnContext(t *testing.T) {
	defer goleak.VerifyNone(t)
	var r recorder
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- Run(ctx, nil, 0, r.fake("a", nil, nil), Loop("b", func(context.Context) {})) }()
	waitEvents(t, &r, 1)
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("Run after cancel: %v, want nil (a Loop that returns early idles)", err)
	}
	if got, want := r.get(), []string{"start a", "stop a"}; !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
}

func waitEvents(t *testing.T, r *recorder, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(r.get()) < n {
		if time.Now().After(deadline) {
			t.Fatal(fmt.Sprintf("only %v after 10s", r.get()))
		}
		time.Sleep(time.Millisecond)
	}
}

// TestStartTimeoutKeepsThePartsReason: a part still starting when the
// start-up deadline ends is stopped, and the error is its own account of why
// it was not ready, not the bare deadline.
func TestStartTimeoutKeepsThePartsReason(t *testing.T) {
	slow := New("etcd", services.NewBasicService(func(ctx context.Context) error {
		<-ctx.Done()
		return fmt.Errorf("etcd member c1 not ready (does a quorum of --initial-cluster run?): %w", ctx.Err())
	}, func(ctx context.Context) error { <-ctx.Done(); return nil }, nil))
	g := NewGroup(slog.New(slog.NewTextHandler(io.Discard, nil)), slow)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err := g.Start(ctx)
	if err == nil || !strings.Contains(err.Error(), "start etcd: etcd member c1 not ready (does a quorum") {
		t.Fatalf("Start: %v; want the part's own reason", err)
	}
}
