// Package cliconn is how client commands (apiary job, node, region list,
// trace ...) reach the Apiary API: where the address comes from, dialing, the
// client identity used for idempotent submission, and retrying calls that
// failed because the server was unavailable.
//
// With mutual TLS (the --tls-ca/--tls-cert/--tls-key flags or
// $APIARY_CACERT, $APIARY_CLIENT_CERT, $APIARY_CLIENT_KEY; see ResolveTLS and
// DialTLS), the connection presents the client certificate; without, it is
// plaintext, and a call that a TLS server refused at the handshake fails
// with a *TLSError that says so (tls.go). An ACL token (--token or
// $APIARY_TOKEN; ResolveToken, WithToken in token.go) goes with every
// call, never over plaintext to an address that is not loopback.
//
// It owns no state and serves nothing; it must not know about jobs, regions or
// exit codes (the commands map errors to exit codes themselves).
package cliconn

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/user"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/status"

	"apiary.dev/apiary/internal/pki"
	"apiary.dev/apiary/internal/telemetry"
)

// EnvAddr names the environment variable that holds the API address.
const EnvAddr = "APIARY_ADDR"

// DefaultAddr is the address used when neither --addr nor APIARY_ADDR is set.
const DefaultAddr = "127.0.0.1:7070"

// MaxRecvBytes bounds one response (logs of a large job can be big).
const MaxRecvBytes = 64 << 20

// ResolveAddr picks the API address: the flag if it was set, else
// $APIARY_ADDR, else DefaultAddr.
func ResolveAddr(flag string, flagSet bool) string {
	if flagSet && flag != "" {
		return flag
	}
	if v := os.Getenv(EnvAddr); v != "" {
		return v
	}
	if flag != "" {
		return flag
	}
	return DefaultAddr
}

// Dial returns a client connection to addr. It does not block: the first RPC
// connects, and a refused connection fails that RPC with UNAVAILABLE.
//
// When tracing is on (telemetry.Setup found OTEL_* or a span file), job
// calls carry the caller's trace context (otelgrpc). A unary call that
// reached no server fails with an error that NotConnected recognises.
//
// addr may be a comma-separated list of host:port (the coordinators of a
// region): calls are balanced round robin over the ones that answer, so a
// dead coordinator is skipped. A malformed address is an error at once.
//
// The connection is plaintext: a unary call that reached no server because
// the server at one of the addresses speaks TLS fails with a *TLSError
// (Kind TLSRequired). DialTLS dials with mutual TLS.
func Dial(addr string) (*grpc.ClientConn, error) { return DialTLS(addr, nil, "") }

// DialTLS is Dial with mutual TLS as r's certificate, verifying each server
// as serverName (pki.RegionServerName(region) for a region's coordinators,
// pki.RouterServerName for a router; "": the host of each address, which
// the server's certificate must carry, as region and router certificates
// carry localhost, 127.0.0.1 and ::1). A nil r dials plaintext (Dial).
//
// A unary call that reached no server fails, besides NotConnected, with a
// *TLSError when the server's side of the handshake tells why: a TLS
// server refused a plaintext connection (TLSRequired), a plaintext server
// answered a TLS one (TLSNotServed), or the TLS handshake itself failed
// (TLSHandshake: certificate not trusted, expired, of the wrong name or
// refused by the server). Such errors are not Retryable.
//
// extra are added to the connection's dial options, e.g. WithToken (the
// caller's ACL token on every call).
func DialTLS(addr string, r *pki.Reloader, serverName string, extra ...grpc.DialOption) (*grpc.ClientConn, error) {
	addrs, err := SplitAddrs(addr)
	if err != nil {
		return nil, err
	}
	creds := insecure.NewCredentials()
	if r != nil {
		creds = pki.TransportCredentials(r, serverName)
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxRecvBytes)),
		grpc.WithResolvers(staticBuilder{}),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`),
		// Outermost first: the TLS probe sees the error NotConnected marked.
		grpc.WithChainUnaryInterceptor(tlsProber{addrs: addrs, r: r, serverName: serverName}.intercept),
		NotConnectedInterceptor(),
	}
	if h := telemetry.GRPCClientHandler(nil); h != nil {
		opts = append(opts, grpc.WithStatsHandler(h))
	}
	opts = append(opts, extra...)
	return grpc.NewClient("static:///"+strings.Join(addrs, ","), opts...)
}

// SplitAddrs parses a comma-separated list of host:port addresses.
func SplitAddrs(list string) ([]string, error) {
	var out []string
	for _, a := range strings.Split(list, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		host, port, err := net.SplitHostPort(a)
		if err != nil || host == "" {
			return nil, fmt.Errorf("address %q: must be host:port (a comma-separated list for several coordinators)", a)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("address %q: port must be 1..65535", a)
		}
		out = append(out, a)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("address: none given")
	}
	return out, nil
}

// staticBuilder resolves "static:///a:1,b:2" to those addresses.
type staticBuilder struct{}

func (staticBuilder) Scheme() string { return "static" }

func (staticBuilder) Build(t resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	var addrs []resolver.Address
	for _, a := range strings.Split(t.Endpoint(), ",") {
		// ServerName: each address is its own authority (a TLS client
		// with no server name of its own verifies the address's host),
		// not the whole list.
		addrs = append(addrs, resolver.Address{Addr: a, ServerName: a})
	}
	return nopResolver{}, cc.UpdateState(resolver.State{Addresses: addrs})
}

type nopResolver struct{}

func (nopResolver) ResolveNow(resolver.ResolveNowOptions) {}
func (nopResolver) Close()                                {}

// ClientID identifies this host and user, stably across invocations, so that a
// region can deduplicate retried submissions: "cli-" and 16 hex digits of a
// hash of the host name and the user id.
func ClientID() string {
	host, _ := os.Hostname()
	uid := strconv.Itoa(os.Getuid())
	if u, err := user.Current(); err == nil {
		uid = u.Uid + ":" + u.Username
	}
	sum := sha256.Sum256([]byte("apiary-cli\x00" + host + "\x00" + uid))
	return "cli-" + hex.EncodeToString(sum[:8])
}

// NewRequestID returns a fresh random request id (32 hex digits). A command
// makes one per submission and reuses it for every retry of that submission.
func NewRequestID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return hex.EncodeToString(b[:])
}

// Retryable reports whether a call that failed with err may be retried as is:
// the server was unreachable (UNAVAILABLE) or shed load (RESOURCE_EXHAUSTED).
// A *TLSError is not: the server refuses this connection's TLS settings.
func Retryable(err error) bool {
	var te *TLSError
	if errors.As(err, &te) {
		return false
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.ResourceExhausted:
		return true
	}
	return false
}

// NotConnected reports whether a unary call made on a connection from Dial
// failed with UNAVAILABLE without reaching any server: no connection to any
// of the addresses could be opened (refused, unknown host, unreachable
// network), or what answered closed the connection before speaking HTTP/2
// (not an apiary API). Such a call was not sent. The test is whether the
// call got a transport (grpc.Peer), not the message's text: an UNAVAILABLE
// that a server sent, even one relaying "connection refused" from a region
// behind it, or a coordinator electing a leader, is not NotConnected; nor is
// RESOURCE_EXHAUSTED (overloaded).
func NotConnected(err error) bool {
	var nc *notConnectedError
	return errors.As(err, &nc)
}

// notConnectedError marks an UNAVAILABLE call that got no transport. It
// keeps the gRPC status and message of the error it wraps.
type notConnectedError struct{ err error }

func (e *notConnectedError) Error() string              { return e.err.Error() }
func (e *notConnectedError) Unwrap() error              { return e.err }
func (e *notConnectedError) GRPCStatus() *status.Status { return status.Convert(e.err) }

// NotConnectedInterceptor is the dial option that makes NotConnected work
// on a connection not made by Dial (the router's pooled connections to
// coordinators use it to tell "nothing was sent" from "the outcome is
// unknown" without reading error texts).
func NotConnectedInterceptor() grpc.DialOption {
	return grpc.WithChainUnaryInterceptor(markNotConnected)
}

// markNotConnected is the unary interceptor that marks calls that reached no
// server (see NotConnected).
func markNotConnected(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	var p peer.Peer
	err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Peer(&p))...)
	if err != nil && p.Addr == nil && status.Code(err) == codes.Unavailable {
		return &notConnectedError{err: err}
	}
	return err
}

// RefusedBudget is how long Retry keeps retrying calls that reach no server
// (NotConnected) while no server has answered any call yet: a wrong address
// fails after about this long instead of after the whole deadline. Once a
// server has answered, the whole deadline applies (a coordinator restarting
// or handing over leadership may refuse connections for a while).
const RefusedBudget = 1500 * time.Millisecond

// Backoff is the retry schedule: exponential from Initial to Max, each wait
// drawn with full jitter from [wait/2, wait].
type Backoff struct {
	Initial, Max time.Duration
}

// DefaultBackoff starts at 100 ms and caps at 2 s.
var DefaultBackoff = Backoff{Initial: 100 * time.Millisecond, Max: 2 * time.Second}

// Wait returns the pause before retry n (0 for the first retry).
func (b Backoff) Wait(n int) time.Duration {
	d := float64(b.Initial) * math.Pow(2, float64(min(n, 30)))
	if d > float64(b.Max) {
		d = float64(b.Max)
	}
	return time.Duration(d/2 + mrand.Float64()*d/2)
}

// RetryError is returned by Retry when it gave up on a retryable error.
type RetryError struct {
	Attempts int
	Last     error
	// Refused: no server answered any attempt (every one was NotConnected)
	// and Retry gave up after RefusedBudget, before the deadline.
	Refused bool
	// Took is the time from the first attempt to giving up.
	Took time.Duration
}

func (e *RetryError) Error() string {
	if e.Refused {
		return fmt.Sprintf("no server answered %d attempts in %s: %v", e.Attempts, e.Took.Round(100*time.Millisecond),
			status.Convert(e.Last).Message())
	}
	return fmt.Sprintf("gave up after %d attempts: %v", e.Attempts, status.Convert(e.Last).Message())
}

// Unwrap returns the last error, so status.Code and errors.As see it.
func (e *RetryError) Unwrap() error { return e.Last }

// GRPCStatus is the last error's status.
func (e *RetryError) GRPCStatus() *status.Status { return status.Convert(e.Last) }

// Retry calls fn until it succeeds, fails with an error that is not
// Retryable, or ctx ends. Each call gets ctx, bounded to perCall when perCall
// is positive. When ctx ends while retrying, Retry returns a *RetryError
// holding the last call's error (whose code is that of the failure, e.g.
// UNAVAILABLE, not the deadline). While no call has reached a server
// (NotConnected: every address refused), it gives up after RefusedBudget
// with a *RetryError whose Refused is set.
func Retry(ctx context.Context, perCall time.Duration, fn func(ctx context.Context) error) error {
	var last error
	start := time.Now()
	answered := false // some call reached a server
	for n := 0; ; n++ {
		cctx, cancel := ctx, context.CancelFunc(func() {})
		if perCall > 0 {
			cctx, cancel = context.WithTimeout(ctx, perCall)
		}
		err := fn(cctx)
		cancel()
		if err == nil {
			return nil
		}
		// A per-call timeout while the overall deadline still runs is
		// retryable too; the overall deadline is not.
		perCallTimeout := status.Code(err) == codes.DeadlineExceeded && ctx.Err() == nil && perCall > 0
		if !Retryable(err) && !perCallTimeout {
			if last != nil && ctx.Err() != nil {
				// The deadline cut a retry short: report why we were retrying.
				return &RetryError{Attempts: n + 1, Last: last, Took: time.Since(start)}
			}
			return err
		}
		last = err
		wait := DefaultBackoff.Wait(n)
		if !NotConnected(err) {
			answered = true
		} else if !answered && time.Since(start)+wait > RefusedBudget {
			return &RetryError{Attempts: n + 1, Last: last, Refused: true, Took: time.Since(start)}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return &RetryError{Attempts: n + 1, Last: last, Took: time.Since(start)}
		case <-t.C:
		}
	}
}
