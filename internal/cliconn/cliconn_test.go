package cliconn

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"apiary.dev/apiary/internal/testutil"
)

func TestResolveAddr(t *testing.T) {
	t.Setenv(EnvAddr, "")
	if got := ResolveAddr("", false); got != DefaultAddr {
		t.Fatalf("default: %q", got)
	}
	t.Setenv(EnvAddr, "env:1")
	if got := ResolveAddr("", false); got != "env:1" {
		t.Fatalf("env: %q", got)
	}
	if got := ResolveAddr("flag:2", true); got != "flag:2" {
		t.Fatalf("flag: %q", got)
	}
}

func TestIDs(t *testing.T) {
	if ClientID() != ClientID() || len(ClientID()) != 20 {
		t.Fatalf("client id not stable: %q", ClientID())
	}
	if a, b := NewRequestID(), NewRequestID(); a == b || len(a) != 32 {
		t.Fatalf("request ids %q %q", a, b)
	}
}

func TestRetry(t *testing.T) {
	// Retries UNAVAILABLE until success.
	n := 0
	err := Retry(context.Background(), 0, func(context.Context) error {
		n++
		if n < 3 {
			return status.Error(codes.Unavailable, "down")
		}
		return nil
	})
	if err != nil || n != 3 {
		t.Fatalf("err %v after %d calls", err, n)
	}
	// Does not retry INVALID_ARGUMENT.
	n = 0
	err = Retry(context.Background(), 0, func(context.Context) error { n++; return status.Error(codes.InvalidArgument, "bad") })
	if status.Code(err) != codes.InvalidArgument || n != 1 {
		t.Fatalf("err %v after %d calls", err, n)
	}
	// Gives up at the deadline, keeping the UNAVAILABLE code.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = Retry(ctx, 0, func(context.Context) error { return status.Error(codes.Unavailable, "down") })
	var re *RetryError
	if !errors.As(err, &re) || status.Code(err) != codes.Unavailable || re.Attempts < 2 {
		t.Fatalf("err %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("took %v", d)
	}
	// A per-call timeout is retried within the overall deadline.
	n = 0
	err = Retry(context.Background(), 20*time.Millisecond, func(ctx context.Context) error {
		n++
		if n == 1 {
			<-ctx.Done()
			return status.FromContextError(ctx.Err()).Err()
		}
		return nil
	})
	if err != nil || n != 2 {
		t.Fatalf("per-call timeout: err %v after %d calls", err, n)
	}
}

func TestBackoff(t *testing.T) {
	b := Backoff{Initial: 100 * time.Millisecond, Max: time.Second}
	for n := 0; n < 40; n++ {
		w := b.Wait(n)
		if w < 50*time.Millisecond || w > time.Second {
			t.Fatalf("wait %d = %v", n, w)
		}
	}
}

func TestSplitAddrs(t *testing.T) {
	got, err := SplitAddrs(" 127.0.0.1:7070, [::1]:7071 ,")
	if err != nil || len(got) != 2 || got[1] != "[::1]:7071" {
		t.Fatalf("%v %v", got, err)
	}
	for _, bad := range []string{"", "notanaddr", "host:0", "host:99999", ":7070", "a:1,b"} {
		if _, err := SplitAddrs(bad); err == nil {
			t.Fatalf("%q accepted", bad)
		}
	}
}

// refusedErr makes a real call to an address nobody listens on and returns
// gRPC's error for it.
func refusedErr(t *testing.T, addr string) error {
	t.Helper()
	cc, err := Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		t.Fatal("call to a closed port succeeded")
	}
	return err
}

// closedAddr is a loopback address reserved for this test that nobody
// listens on.
func closedAddr(t *testing.T) string { return testutil.FreeAddr(t) }

// unavailableServer is a real gRPC server that answers every health check
// with UNAVAILABLE and msg (a coordinator electing a leader, or a router
// relaying a region's connection error).
type unavailableServer struct {
	healthpb.UnimplementedHealthServer
	msg string
}

func (s unavailableServer) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	return nil, status.Error(codes.Unavailable, s.msg)
}

func TestNotConnected(t *testing.T) {
	// Connection refused on one and on every address of a list.
	for _, addr := range []string{closedAddr(t), closedAddr(t) + "," + closedAddr(t)} {
		if err := refusedErr(t, addr); !NotConnected(err) || !Retryable(err) {
			t.Errorf("%s: %v: NotConnected %v, Retryable %v", addr, err, NotConnected(err), Retryable(err))
		}
	}
	// A listener that accepts and closes at once: not a gRPC server.
	l := testutil.Listen(t)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	if err := refusedErr(t, l.Addr().String()); !NotConnected(err) {
		t.Errorf("accept-and-close: %v: not NotConnected", err)
	}
	// A server that answered UNAVAILABLE was reached, whatever its message
	// says (a router relays a region's dial error as is).
	refused := refusedErr(t, closedAddr(t))
	for _, msg := range []string{"etcd has no leader; retry", status.Convert(refused).Message()} {
		l2 := testutil.Listen(t)
		s := grpc.NewServer()
		healthpb.RegisterHealthServer(s, unavailableServer{msg: msg})
		go s.Serve(l2)
		defer s.Stop()
		if err := refusedErr(t, l2.Addr().String()); status.Code(err) != codes.Unavailable || NotConnected(err) ||
			status.Convert(err).Message() != msg {
			t.Errorf("server's UNAVAILABLE %q: %v: NotConnected %v", msg, err, NotConnected(err))
		}
	}
	for _, err := range []error{status.Error(codes.ResourceExhausted, "backlog: at its bound"), status.Error(codes.DeadlineExceeded, "x"),
		errors.New("connection refused"), nil} {
		if NotConnected(err) {
			t.Errorf("%v: NotConnected", err)
		}
	}
	// Wrapped in a RetryError, the last error is what counts.
	if !NotConnected(&RetryError{Attempts: 2, Last: refusedErr(t, closedAddr(t))}) {
		t.Error("RetryError of a refused call: not NotConnected")
	}
}

func TestRetryGivesUpEarlyWhenNothingAnswers(t *testing.T) {
	addr := closedAddr(t)
	cc, err := Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	calls := 0
	err = Retry(ctx, 0, func(ctx context.Context) error {
		calls++
		_, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	})
	took := time.Since(start)
	var re *RetryError
	if !errors.As(err, &re) || !re.Refused || status.Code(err) != codes.Unavailable || calls < 2 {
		t.Fatalf("err %v after %d calls", err, calls)
	}
	if took > RefusedBudget+500*time.Millisecond {
		t.Fatalf("gave up after %v with a 30 s deadline; want about %v", took, RefusedBudget)
	}
	if !strings.Contains(err.Error(), "no server answered") {
		t.Fatalf("message: %v", err)
	}

	// Once a server has answered, refusals are retried until the deadline
	// (a coordinator restarting), not cut short.
	ctx2, cancel2 := context.WithTimeout(context.Background(), RefusedBudget+time.Second)
	defer cancel2()
	calls = 0
	start = time.Now()
	err = Retry(ctx2, 0, func(ctx context.Context) error {
		calls++
		if calls == 1 {
			return status.Error(codes.Unavailable, "electing a leader")
		}
		_, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	})
	if !errors.As(err, &re) || re.Refused || time.Since(start) < RefusedBudget+900*time.Millisecond {
		t.Fatalf("after an answer: err %v after %v", err, time.Since(start))
	}
}
