package faulthook

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// serve starts a real gRPC server with the health service on loopback and
// returns a client connection through the hook of path.
func serve(t *testing.T, path string) healthpb.HealthClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	f, err := New(path, 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient(lis.Addr().String(),
		append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, f.DialOptions()...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return healthpb.NewHealthClient(cc)
}

// TestUnaryCutWhileFileExists: calls pass, fail with UNAVAILABLE while the
// file exists, and pass again once it is removed.
func TestUnaryCutWhileFileExists(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cut")
	cl := serve(t, path)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cl.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("before the cut: %v", err)
	}
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := cl.Check(ctx, &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("during the cut: want UNAVAILABLE, got %v", err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("after the heal: %v", err)
	}
}

// TestStreamCutWhenFileAppears: an open server stream is cut within a few
// poll intervals of the file appearing (its Recv fails with UNAVAILABLE,
// not CANCELLED), and a new stream cannot open until the file is removed.
func TestStreamCutWhenFileAppears(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cut")
	cl := serve(t, path)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := cl.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil { // the current status
		t.Fatalf("first message: %v", err)
	}
	cutAt := time.Now()
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = st.Recv() // the server sends nothing more: only the cut ends it
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("open stream during the cut: want UNAVAILABLE, got %v", err)
	}
	if d := time.Since(cutAt); d > 2*time.Second {
		t.Fatalf("stream cut after %s, want within a few poll intervals", d)
	}
	if _, err := cl.Watch(ctx, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("new stream during the cut: want UNAVAILABLE, got %v", err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	st, err = cl.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatalf("after the heal: %v", err)
	}
}

func TestNewRefusesEmptyPath(t *testing.T) {
	if _, err := New("", 0); err == nil {
		t.Fatal("empty path accepted")
	}
}
