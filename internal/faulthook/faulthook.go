package faulthook

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// DefaultPoll is how often an open stream checks the file.
const DefaultPoll = 20 * time.Millisecond

// File is a partition switch: active while the file at its path exists.
// Its methods are safe for concurrent use.
type File struct {
	path string
	poll time.Duration
}

// New returns the switch for path (absolute or relative to the process's
// working directory; it need not exist yet). poll is how often an open
// stream checks it (0: DefaultPoll). An empty path is an error.
func New(path string, poll time.Duration) (*File, error) {
	if path == "" {
		return nil, errors.New("fault-file: path must not be empty")
	}
	if poll <= 0 {
		poll = DefaultPoll
	}
	return &File{path: path, poll: poll}, nil
}

// Path is the file's path.
func (f *File) Path() string { return f.path }

// Active reports whether the partition is on: the file exists (any stat
// error other than "does not exist" counts as on, so that a file that
// cannot be checked never lets traffic through by accident).
func (f *File) Active() bool {
	_, err := os.Stat(f.path)
	return err == nil || !errors.Is(err, os.ErrNotExist)
}

// err is the status every cut call returns.
func (f *File) err(method string) error {
	return status.Error(codes.Unavailable, fmt.Sprintf("faulthook: %s cut: partitioned while %s exists", method, f.path))
}

// DialOptions are the client interceptors (unary and stream) to pass to
// grpc.NewClient. They add no transport credentials.
func (f *File) DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(f.unary),
		grpc.WithChainStreamInterceptor(f.stream),
	}
}

// unary fails the call while the partition is on; it is not sent.
func (f *File) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if f.Active() {
		return f.err(method)
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// stream fails the opening while the partition is on; an opened stream is
// watched until it ends and cancelled as soon as the partition starts.
func (f *File) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string,
	streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if f.Active() {
		return nil, f.err(method)
	}
	sctx, cancel := context.WithCancel(ctx)
	cs, err := streamer(sctx, desc, cc, method, opts...)
	if err != nil {
		cancel()
		return nil, err
	}
	w := &cutStream{ClientStream: cs, f: f, method: method, cancel: cancel}
	go w.watch(sctx)
	return w, nil
}

// cutStream is an open stream under watch.
type cutStream struct {
	grpc.ClientStream
	f      *File
	method string
	cancel context.CancelFunc

	mu  sync.Mutex
	cut bool
}

// watch cancels the stream when the partition starts; it returns when the
// stream's context ends (the caller's, or cancel on the stream's end).
func (s *cutStream) watch(ctx context.Context) {
	t := time.NewTicker(s.f.poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if s.f.Active() {
			s.mu.Lock()
			s.cut = true
			s.mu.Unlock()
			s.cancel()
			return
		}
	}
}

func (s *cutStream) isCut() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cut
}

// RecvMsg receives; an error ends the stream (and the watch). The error of
// a stream cut by the partition is UNAVAILABLE (a cancellation would say
// the caller gave up).
func (s *cutStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err == nil {
		return nil
	}
	s.cancel()
	if s.isCut() {
		return s.f.err(s.method)
	}
	return err
}

// SendMsg sends unless the stream was cut. Its errors do not end the watch:
// the stream's status comes from RecvMsg.
func (s *cutStream) SendMsg(m any) error {
	if s.isCut() {
		return s.f.err(s.method)
	}
	err := s.ClientStream.SendMsg(m)
	if err != nil && s.isCut() {
		return s.f.err(s.method)
	}
	return err
}
