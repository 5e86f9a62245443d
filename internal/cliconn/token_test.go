package cliconn

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"apiary.dev/apiary/internal/acl"
	"apiary.dev/apiary/internal/pki"
	"apiary.dev/apiary/internal/testutil"
)

// tokenHealth is a health server that records the token of every call
// (unary Check and streaming Watch).
type tokenHealth struct {
	healthpb.UnimplementedHealthServer
	mu     sync.Mutex
	tokens []string // one per call: the token, or "" for none
}

func (h *tokenHealth) record(ctx context.Context) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.tokens = append(h.tokens, acl.FromIncoming(ctx))
}

func (h *tokenHealth) seen() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.tokens...)
}

func (h *tokenHealth) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	h.record(ctx)
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func (h *tokenHealth) Watch(_ *healthpb.HealthCheckRequest, s grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error {
	h.record(s.Context())
	return s.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING})
}

// serveTokens runs a tokenHealth on a loopback port (TLS as r, or
// plaintext when r is nil).
func serveTokens(t *testing.T, r *pki.Reloader) (string, *tokenHealth) {
	t.Helper()
	l := testutil.Listen(t)
	var opts []grpc.ServerOption
	if r != nil {
		opts = append(opts, pki.ServerCredentials(r))
	}
	s := grpc.NewServer(opts...)
	h := &tokenHealth{}
	healthpb.RegisterHealthServer(s, h)
	go s.Serve(l)
	t.Cleanup(s.Stop)
	return l.Addr().String(), h
}

// unaryAndStream makes one Check and one Watch (first message) on cc.
func unaryAndStream(cc *grpc.ClientConn) (unary, stream error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := healthpb.NewHealthClient(cc)
	_, unary = c.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	w, err := c.Watch(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err == nil {
		_, err = w.Recv()
	}
	return unary, err
}

// farConn is a connection that says its peer is far (not loopback),
// while it really goes to a loopback server: what a plaintext connection
// to another host looks like to the client.
type farConn struct {
	net.Conn
	far net.Addr
}

func (c farConn) RemoteAddr() net.Addr { return c.far }

// TestTokenSentOnlyWhereItCannotBeRead: the token goes with every unary
// and streaming call over plaintext to loopback and over TLS; over a
// plaintext connection whose peer is not loopback no call is sent at all
// (the server sees nothing) and the call fails with UNAUTHENTICATED
// saying why; without a token nothing is sent as a token.
func TestTokenSentOnlyWhereItCannotBeRead(t *testing.T) {
	const secret = "5d0c4b8e-3f1a-4e2b-9c7d-0a1b2c3d4e5f"

	plainAddr, plain := serveTokens(t, nil)
	cc, err := DialTLS(plainAddr, nil, "", WithToken(secret))
	if err != nil {
		t.Fatal(err)
	}
	if u, s := unaryAndStream(cc); u != nil || s != nil {
		t.Fatalf("plaintext to loopback: unary %v, stream %v", u, s)
	}
	cc.Close()
	if got := plain.seen(); len(got) != 2 || got[0] != secret || got[1] != secret {
		t.Fatalf("plaintext to loopback: the server saw tokens %q, want the secret on both calls", got)
	}

	p := newTestPKI(t)
	tlsAddr, overTLS := serveTokens(t, p.reloader(t, pki.CertOptions{Role: pki.RoleRouter, Region: pki.GlobalRegion, ID: "g1"}))
	cc, err = DialTLS(tlsAddr, p.reloader(t, pki.CertOptions{Role: pki.RoleClient, ID: "cli"}), "", WithToken(secret))
	if err != nil {
		t.Fatal(err)
	}
	if u, s := unaryAndStream(cc); u != nil || s != nil {
		t.Fatalf("TLS: unary %v, stream %v", u, s)
	}
	cc.Close()
	if got := overTLS.seen(); len(got) != 2 || got[0] != secret || got[1] != secret {
		t.Fatalf("TLS: the server saw tokens %q, want the secret on both calls", got)
	}

	// Plaintext to a far address (the connection is made to the loopback
	// server, but reports a far peer, as a real one would).
	farAddr, far := serveTokens(t, nil)
	const farPeer = "192.0.2.7:7070" // TEST-NET-1
	dialer := grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", farAddr)
		if err != nil {
			return nil, err
		}
		ra, _ := net.ResolveTCPAddr("tcp", farPeer)
		return farConn{Conn: c, far: ra}, nil
	})
	cc, err = DialTLS(farPeer, nil, "", WithToken(secret), dialer)
	if err != nil {
		t.Fatal(err)
	}
	u, s := unaryAndStream(cc)
	cc.Close()
	for name, err := range map[string]error{"unary": u, "stream": s} {
		if status.Code(err) != codes.Unauthenticated || !strings.HasPrefix(status.Convert(err).Message(), TokenRefusedPrefix) ||
			!strings.Contains(err.Error(), farPeer) {
			t.Errorf("plaintext to %s, %s call: %v; want UNAUTHENTICATED %q naming the address", farPeer, name, err, TokenRefusedPrefix)
		}
	}
	if got := far.seen(); len(got) != 0 {
		t.Fatalf("plaintext to a far address: the server got %d calls (%q); want none", len(got), got)
	}
	// The same connection without a token works: the check is the token's.
	cc, err = DialTLS(farPeer, nil, "", WithToken(""), dialer)
	if err != nil {
		t.Fatal(err)
	}
	if u, s := unaryAndStream(cc); u != nil || s != nil {
		t.Fatalf("plaintext to a far address without a token: unary %v, stream %v", u, s)
	}
	cc.Close()
	if got := far.seen(); len(got) != 2 || got[0] != "" || got[1] != "" {
		t.Fatalf("without a token the server saw %q, want two calls without one", got)
	}
}

// TestTokenAllowed is the per-call decision on its own: TLS anywhere,
// plaintext to loopback only.
func TestTokenAllowed(t *testing.T) {
	tlsInfo := credentials.TLSInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}}
	plainInfo := credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}
	for _, tc := range []struct {
		peer  string
		info  credentials.AuthInfo
		allow bool
	}{
		{"127.0.0.1:7070", nil, true},
		{"[::1]:7070", nil, true},
		{"127.0.0.2:7070", nil, true},
		{"10.1.2.3:7070", nil, false},
		{"[2001:db8::1]:7070", nil, false},
		{"10.1.2.3:7070", tlsInfo, true},
		{"10.1.2.3:7070", plainAuth{plainInfo}, false},
	} {
		ra, err := net.ResolveTCPAddr("tcp", tc.peer)
		if err != nil {
			t.Fatal(err)
		}
		ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: ra, AuthInfo: tc.info})
		ctx = credentials.NewContextWithRequestInfo(ctx, credentials.RequestInfo{AuthInfo: tc.info})
		err = TokenAllowed(ctx)
		if (err == nil) != tc.allow {
			t.Errorf("peer %s, auth %v: %v; want allowed %v", tc.peer, tc.info, err, tc.allow)
		}
		if err != nil && (status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), tc.peer)) {
			t.Errorf("peer %s: %v; want UNAUTHENTICATED naming the peer", tc.peer, err)
		}
	}
	// No peer known: refused (never sent blind).
	if err := TokenAllowed(context.Background()); err == nil {
		t.Error("no peer and no TLS: allowed")
	}
}

// plainAuth is the AuthInfo of a connection without security.
type plainAuth struct{ credentials.CommonAuthInfo }

func (plainAuth) AuthType() string { return "insecure" }

// TestCheckTokenTransport: the check made before dialing.
func TestCheckTokenTransport(t *testing.T) {
	for _, tc := range []struct {
		addrs []string
		token string
		tls   bool
		bad   string // address named in the error; "" for none
	}{
		{[]string{"10.0.0.5:7070"}, "", false, ""},
		{[]string{"10.0.0.5:7070"}, "s", true, ""},
		{[]string{"127.0.0.1:7070", "localhost:7071", "[::1]:7072"}, "s", false, ""},
		{[]string{"127.0.0.1:7070", "10.0.0.5:7070"}, "s", false, "10.0.0.5:7070"},
		{[]string{"coordinator.example:7070"}, "s", false, ""}, // a name: decided per call
	} {
		err := CheckTokenTransport(tc.addrs, tc.token, tc.tls)
		switch {
		case tc.bad == "" && err != nil:
			t.Errorf("%v token %q tls %v: %v", tc.addrs, tc.token, tc.tls, err)
		case tc.bad != "" && (err == nil || !strings.HasPrefix(err.Error(), TokenRefusedPrefix) || !strings.Contains(err.Error(), tc.bad)):
			t.Errorf("%v token %q tls %v: %v; want a refusal naming %s", tc.addrs, tc.token, tc.tls, err, tc.bad)
		}
	}
}

// TestResolveToken: the flag, else $APIARY_TOKEN.
func TestResolveToken(t *testing.T) {
	t.Setenv(acl.EnvToken, "from-env")
	if got := ResolveToken("from-flag"); got != "from-flag" {
		t.Errorf("flag: %q", got)
	}
	if got := ResolveToken(""); got != "from-env" {
		t.Errorf("env: %q", got)
	}
	t.Setenv(acl.EnvToken, "")
	if got := ResolveToken(""); got != "" {
		t.Errorf("none: %q", got)
	}
}
