package cliconn

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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
