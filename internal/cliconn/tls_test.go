package cliconn

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"apiary.dev/apiary/internal/pki"
	"apiary.dev/apiary/internal/testutil"
)

func TestResolveTLS(t *testing.T) {
	t.Setenv(EnvCACert, "")
	t.Setenv(EnvClientCert, "")
	t.Setenv(EnvClientKey, "")
	if f, err := ResolveTLS(TLSFiles{}); err != nil || !f.Empty() {
		t.Fatalf("nothing given: %+v, %v", f, err)
	}
	t.Setenv(EnvCACert, "env-ca")
	t.Setenv(EnvClientCert, "env-cert")
	t.Setenv(EnvClientKey, "env-key")
	if f, err := ResolveTLS(TLSFiles{Cert: "flag-cert"}); err != nil || f != (TLSFiles{CA: "env-ca", Cert: "flag-cert", Key: "env-key"}) {
		t.Fatalf("flag over env: %+v, %v", f, err)
	}
	t.Setenv(EnvClientKey, "")
	_, err := ResolveTLS(TLSFiles{})
	if err == nil || !strings.Contains(err.Error(), "--tls-key (or $APIARY_CLIENT_KEY): required with --tls-ca and --tls-cert") {
		t.Fatalf("two of three: %v", err)
	}
}

// testPKI is a CA whose certificates are written to dir.
type testPKI struct {
	dir       string
	ca, caKey []byte
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	ca, key, err := pki.CreateCA(pki.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p := &testPKI{dir: t.TempDir(), ca: ca, caKey: key}
	if err := os.WriteFile(filepath.Join(p.dir, "ca.pem"), ca, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *testPKI) reloader(t *testing.T, opts pki.CertOptions) *pki.Reloader {
	t.Helper()
	cert, key, err := pki.CreateCert(p.ca, p.caKey, opts)
	if err != nil {
		t.Fatal(err)
	}
	name := opts.Role + "-" + opts.ID
	cf, kf := filepath.Join(p.dir, name+".pem"), filepath.Join(p.dir, name+"-key.pem")
	if err := os.WriteFile(cf, cert, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kf, key, 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := TLSFiles{CA: filepath.Join(p.dir, "ca.pem"), Cert: cf, Key: kf}.Load()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// serve runs a health server on a fresh port, with mutual TLS as r or
// plaintext when r is nil.
func serve(t *testing.T, r *pki.Reloader) string {
	t.Helper()
	l := testutil.Listen(t)
	var opts []grpc.ServerOption
	if r != nil {
		opts = append(opts, pki.ServerCredentials(r))
	}
	s := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(s, servingHealth{})
	go s.Serve(l)
	t.Cleanup(s.Stop)
	return l.Addr().String()
}

type servingHealth struct {
	healthpb.UnimplementedHealthServer
}

func (servingHealth) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func check(t *testing.T, addr string, r *pki.Reloader, serverName string) error {
	t.Helper()
	cc, err := DialTLS(addr, r, serverName)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return Retry(ctx, 0, func(ctx context.Context) error {
		_, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	})
}

// TestTLSMismatchIsToldNotRetried: a plaintext call to a TLS server, a TLS
// call to a plaintext server and a TLS call whose handshake the server
// refuses each fail at once (no retries for the whole budget) with a
// TLSError of the right kind, decided by probing the server; a matching
// call succeeds, over a list of addresses too; a refused address is still
// "nothing answers" (retried, RetryError.Refused).
func TestTLSMismatchIsToldNotRetried(t *testing.T) {
	p := newTestPKI(t)
	server := p.reloader(t, pki.CertOptions{Role: pki.RoleRegion, Region: "eu-west", ID: "c1"})
	client := p.reloader(t, pki.CertOptions{Role: pki.RoleClient, ID: "cli"})
	tlsAddr, plainAddr := serve(t, server), serve(t, nil)

	if err := check(t, tlsAddr, client, ""); err != nil {
		t.Fatalf("TLS client, TLS server, host check: %v", err)
	}
	if err := check(t, tlsAddr+","+tlsAddr, client, pki.RegionServerName("eu-west")); err != nil {
		t.Fatalf("TLS client, TLS server, list of addresses, region name: %v", err)
	}
	if err := check(t, plainAddr, nil, ""); err != nil {
		t.Fatalf("plaintext both ways: %v", err)
	}

	otherPKI := newTestPKI(t)
	other := otherPKI.reloader(t, pki.CertOptions{Role: pki.RoleClient, ID: "cli"})
	// A client of another CA that trusts the server's CA too: its side of
	// the handshake passes, the server refuses its certificate.
	both := filepath.Join(otherPKI.dir, "both.pem")
	if err := os.WriteFile(both, append(append([]byte{}, otherPKI.ca...), p.ca...), 0o644); err != nil {
		t.Fatal(err)
	}
	refusedByServer, err := TLSFiles{CA: both, Cert: filepath.Join(otherPKI.dir, "client-cli.pem"), Key: filepath.Join(otherPKI.dir, "client-cli-key.pem")}.Load()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name       string
		addr       string
		r          *pki.Reloader
		serverName string
		kind       TLSErrorKind
		text       string
	}{
		{"plaintext to TLS", tlsAddr, nil, "", TLSRequired, "requires TLS: pass --tls-ca/--tls-cert/--tls-key or set APIARY_CACERT/APIARY_CLIENT_CERT/APIARY_CLIENT_KEY"},
		{"TLS to plaintext", plainAddr, client, "", TLSNotServed, "does not speak TLS"},
		{"client of another CA", tlsAddr, other, "", TLSHandshake, "TLS handshake with the server at " + tlsAddr + " failed"},
		{"server of another name", tlsAddr, client, pki.RegionServerName("us-east"), TLSHandshake, "us-east"},
		{"client certificate the server does not trust", tlsAddr, refusedByServer, "", TLSHandshake, "remote error: tls"},
	} {
		start := time.Now()
		err := check(t, tc.addr, tc.r, tc.serverName)
		var te *TLSError
		if !errors.As(err, &te) || te.Kind != tc.kind || te.Addr != tc.addr || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("%s: %v; want a TLSError of kind %d at %s saying %q", tc.name, err, tc.kind, tc.addr, tc.text)
			continue
		}
		t.Logf("%s: %v", tc.name, err)
		if status.Code(err) != codes.Unavailable || !NotConnected(err) || Retryable(err) {
			t.Errorf("%s: code %s, NotConnected %v, Retryable %v; want UNAVAILABLE, true, false", tc.name, status.Code(err), NotConnected(err), Retryable(err))
		}
		if d := time.Since(start); d > RefusedBudget {
			t.Errorf("%s: took %s: retried instead of telling at once", tc.name, d)
		}
	}

	// Nothing listening: retried for the refused budget, not a TLSError.
	err = check(t, closedAddr(t), client, "")
	var re *RetryError
	var te *TLSError
	if !errors.As(err, &re) || !re.Refused || errors.As(err, &te) {
		t.Errorf("closed address: %v; want a refused RetryError", err)
	}
}
