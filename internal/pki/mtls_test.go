package pki_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"apiary.dev/apiary/internal/pki"
	"apiary.dev/apiary/internal/testutil"
)

// material is a CA bundle, certificate and key written to files.
type material struct {
	ca, cert, key string
}

// writeMaterial writes the three PEMs into dir/name-{ca,cert,key}.pem
// (overwriting, as an operator rotating in place does) and returns paths.
func writeMaterial(t *testing.T, dir, name string, ca, cert, key []byte) material {
	t.Helper()
	m := material{ca: filepath.Join(dir, name+"-ca.pem"), cert: filepath.Join(dir, name+"-cert.pem"), key: filepath.Join(dir, name+"-key.pem")}
	for path, b := range map[string][]byte{m.ca: ca, m.cert: cert, m.key: key} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

func newReloader(t *testing.T, m material, role string) *pki.Reloader {
	t.Helper()
	r, err := pki.NewReloader(pki.ReloaderConfig{CAFile: m.ca, CertFile: m.cert, KeyFile: m.key, Role: role,
		Interval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

// healthServer serves grpc health over mTLS with r on 127.0.0.1 and records
// the PeerIdentity of every call that reached it.
type healthServer struct {
	addr string
	mu   sync.Mutex
	seen []pki.Identity
}

func (s *healthServer) calls() []pki.Identity {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]pki.Identity(nil), s.seen...)
}

func startHealthServer(t *testing.T, r *pki.Reloader) *healthServer {
	t.Helper()
	hs := &healthServer{}
	srv := grpc.NewServer(pki.ServerCredentials(r), grpc.UnaryInterceptor(
		func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			id, err := pki.PeerIdentity(ctx)
			if err != nil {
				return nil, status.Error(codes.Unauthenticated, err.Error())
			}
			hs.mu.Lock()
			hs.seen = append(hs.seen, id)
			hs.mu.Unlock()
			return h(ctx, req)
		}))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis := testutil.Listen(t)
	hs.addr = lis.Addr().String()
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return hs
}

// check makes a new connection with opt and calls Health.Check once.
func check(addr string, opt grpc.DialOption) error {
	cc, err := grpc.NewClient(addr, opt)
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return err
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("health status %s", resp.GetStatus())
	}
	return nil
}

// rawClient is a hand-made client config trusting caPEM, with
// certPEM/keyPEM as client certificate unless nil.
func rawClient(t *testing.T, caPEM, certPEM, keyPEM []byte, serverName string) *tls.Config {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("bad CA PEM")
	}
	cfg := &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS13, NextProtos: []string{"h2"}}
	if certPEM != nil {
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		// Always sent: with Certificates, Go's client would withhold a
		// certificate the server's CA list does not name.
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &pair, nil }
	}
	return cfg
}

// tlsRefusal completes a TLS handshake with cfg and reads: a server that
// refused the client certificate (which TLS 1.3 does after the client's
// side of the handshake) answers with an alert, returned as the error.
func tlsRefusal(addr string, cfg *tls.Config) error {
	conn, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = conn.Read(make([]byte, 1))
	return err
}

// TestMTLSHealth: a real grpc health server over mutual TLS on 127.0.0.1
// admits a client with a valid certificate, sees its identity, and refuses
// clients with no certificate, one of another CA, or an expired one; the
// client refuses a server that is not the one it dials.
func TestMTLSHealth(t *testing.T) {
	dir := t.TempDir()
	caPEM, caKey := mustCA(t, pki.CAOptions{})
	srvCert, srvKey := mustCert(t, caPEM, caKey, pki.CertOptions{Role: "region", Region: "eu-west", ID: "eu-west-1"})
	server := newReloader(t, writeMaterial(t, dir, "server", caPEM, srvCert, srvKey), "region")
	hs := startHealthServer(t, server)

	agentCert, agentKey := mustCert(t, caPEM, caKey, pki.CertOptions{Role: "agent", Region: "eu-west", ID: "n1"})
	agent := newReloader(t, writeMaterial(t, dir, "agent", caPEM, agentCert, agentKey), "agent")
	if err := check(hs.addr, pki.DialOption(agent, pki.RegionServerName("eu-west"))); err != nil {
		t.Fatalf("agent with a valid certificate: %v", err)
	}
	want := pki.Identity{Role: "agent", Region: "eu-west", ID: "n1"}
	if got := hs.calls(); len(got) != 1 || got[0] != want {
		t.Fatalf("server saw %v; want [%v]", got, want)
	}
	// By IP, as a dialer that sets no name does: the server carries 127.0.0.1.
	if err := check(hs.addr, pki.DialOption(agent, "")); err != nil {
		t.Fatalf("agent dialing 127.0.0.1 without a server name: %v", err)
	}

	otherCA, otherCAKey := mustCA(t, pki.CAOptions{})
	foreignCert, foreignKey := mustCert(t, otherCA, otherCAKey, pki.CertOptions{Role: "agent", Region: "eu-west", ID: "n1"})
	expiredCert, expiredKey := mustCert(t, caPEM, caKey, pki.CertOptions{Role: "agent", Region: "eu-west", ID: "n1",
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	name := pki.RegionServerName("eu-west")
	for _, tc := range []struct {
		name  string
		cfg   *tls.Config
		alert string // what the server's TLS alert says
	}{
		{"no certificate", rawClient(t, caPEM, nil, nil, name), "remote error: tls: certificate required"},
		{"certificate of another CA", rawClient(t, caPEM, foreignCert, foreignKey, name), "remote error: tls: unknown certificate authority"},
		{"expired certificate", rawClient(t, caPEM, expiredCert, expiredKey, name), "remote error: tls: expired certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(hs.calls())
			err := check(hs.addr, grpc.WithTransportCredentials(credentials.NewTLS(tc.cfg)))
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("call = %v; want UNAVAILABLE", err)
			}
			if n := len(hs.calls()); n != before {
				t.Fatalf("the refused call reached the server's handler (%d calls, was %d)", n, before)
			}
			// Why: the server's alert, read on a plain TLS connection.
			if err := tlsRefusal(hs.addr, tc.cfg); err == nil || !strings.Contains(err.Error(), tc.alert) {
				t.Fatalf("TLS connection: %v; want the server's alert %q", err, tc.alert)
			}
		})
	}

	// The client side: the agent refuses a server it did not dial.
	for _, tc := range []struct{ name, serverName, want string }{
		{"a region dialed as the router", pki.RouterServerName, "not router.global.apiary"},
		{"a region dialed as another region", pki.RegionServerName("us-east"), "certificate is valid for"},
		{"another coordinator of the region", "eu-west-2.region.eu-west.apiary", "certificate is valid for"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := check(hs.addr, pki.DialOption(agent, tc.serverName))
			if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("call = %v; want UNAVAILABLE containing %q", err, tc.want)
			}
		})
	}
	// And a server certificate of another CA.
	foreignSrvCert, foreignSrvKey := mustCert(t, otherCA, otherCAKey, pki.CertOptions{Role: "region", Region: "eu-west", ID: "eu-west-1"})
	impostor := newReloader(t, writeMaterial(t, dir, "impostor", otherCA, foreignSrvCert, foreignSrvKey), "region")
	ihs := startHealthServer(t, impostor)
	if err := check(ihs.addr, pki.DialOption(agent, name)); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "unknown authority") {
		t.Fatalf("agent dialing a server of another CA: %v; want UNAVAILABLE, unknown authority", err)
	}
	if n := len(ihs.calls()); n != 0 {
		t.Fatalf("the impostor served %d calls", n)
	}
}

// TestRotation: overwriting a running server's files with a certificate of a
// new CA and the new CA's bundle takes effect for new connections, without a
// restart; clients of the old CA are refused from then on until their own
// files are rotated, which their Reloader follows too. An open connection
// keeps working.
func TestRotation(t *testing.T) {
	dir := t.TempDir()
	ca1, ca1Key := mustCA(t, pki.CAOptions{})
	s1, s1Key := mustCert(t, ca1, ca1Key, pki.CertOptions{Role: "region", Region: "eu-west", ID: "c1"})
	c1, c1Key := mustCert(t, ca1, ca1Key, pki.CertOptions{Role: "client", ID: "ops"})
	srvFiles := writeMaterial(t, dir, "server", ca1, s1, s1Key)
	server := newReloader(t, srvFiles, "region")
	hs := startHealthServer(t, server)
	cliFiles := writeMaterial(t, dir, "client", ca1, c1, c1Key)
	client := newReloader(t, cliFiles, "client")
	name := pki.RegionServerName("eu-west")
	if err := check(hs.addr, pki.DialOption(client, name)); err != nil {
		t.Fatalf("before rotation: %v", err)
	}
	open, err := grpc.NewClient(hs.addr, pki.DialOption(client, name))
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	if _, err := healthpb.NewHealthClient(open).Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}

	ca2, ca2Key := mustCA(t, pki.CAOptions{})
	s2, s2Key := mustCert(t, ca2, ca2Key, pki.CertOptions{Role: "region", Region: "eu-west", ID: "c1"})
	c2, c2Key := mustCert(t, ca2, ca2Key, pki.CertOptions{Role: "client", ID: "ops2"})
	writeMaterial(t, dir, "server", ca2, s2, s2Key) // in place, file by file
	newClient := newReloader(t, writeMaterial(t, dir, "client2", ca2, c2, c2Key), "client")
	testutil.Eventually(t, 10*time.Second, "a client of the new CA connects to the rotated server", func() error {
		return check(hs.addr, pki.DialOption(newClient, name))
	})
	if g := server.Generation(); g != 2 {
		t.Errorf("server generation %d after one rotation; want 2", g)
	}
	if got := hs.calls(); got[len(got)-1].ID != "ops2" {
		t.Errorf("server saw %v last; want client ops2", got[len(got)-1])
	}
	if err := check(hs.addr, pki.DialOption(client, name)); status.Code(err) != codes.Unavailable {
		t.Fatalf("a client of the old CA on a new connection: %v; want UNAVAILABLE", err)
	}
	if _, err := healthpb.NewHealthClient(open).Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("the connection opened before the rotation: %v", err)
	}

	c1New, c1NewKey := mustCert(t, ca2, ca2Key, pki.CertOptions{Role: "client", ID: "ops"})
	writeMaterial(t, dir, "client", ca2, c1New, c1NewKey)
	testutil.Eventually(t, 10*time.Second, "the old client, its files rotated, connects again", func() error {
		return check(hs.addr, pki.DialOption(client, name))
	})
	if id := client.Identity(); id.ID != "ops" || client.Generation() != 2 {
		t.Errorf("client reloader: identity %v generation %d; want ops, 2", id, client.Generation())
	}
}

// TestNewReloaderRejects: material that cannot serve is refused at start,
// naming the flag of the file at fault.
func TestNewReloaderRejects(t *testing.T) {
	dir := t.TempDir()
	ca, caKey := mustCA(t, pki.CAOptions{})
	other, otherKey := mustCA(t, pki.CAOptions{})
	cert, key := mustCert(t, ca, caKey, pki.CertOptions{Role: "agent", Region: "eu-west", ID: "n1"})
	_, key2 := mustCert(t, ca, caKey, pki.CertOptions{Role: "agent", Region: "eu-west", ID: "n2"})
	foreign, foreignKey := mustCert(t, other, otherKey, pki.CertOptions{Role: "agent", Region: "eu-west", ID: "n1"})
	expired, expiredKey := mustCert(t, ca, caKey, pki.CertOptions{Role: "agent", Region: "eu-west", ID: "n1",
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	good := writeMaterial(t, dir, "good", ca, cert, key)
	for _, tc := range []struct {
		name string
		cfg  pki.ReloaderConfig
		want string
	}{
		{"no CA file", pki.ReloaderConfig{CertFile: good.cert, KeyFile: good.key}, "--tls-ca: required"},
		{"no cert file", pki.ReloaderConfig{CAFile: good.ca, KeyFile: good.key}, "--tls-cert: required"},
		{"no key file", pki.ReloaderConfig{CAFile: good.ca, CertFile: good.cert}, "--tls-key: required"},
		{"missing CA file", pki.ReloaderConfig{CAFile: filepath.Join(dir, "nope.pem"), CertFile: good.cert, KeyFile: good.key}, "--tls-ca " + filepath.Join(dir, "nope.pem") + ": open"},
		{"CA file without certificates", func() pki.ReloaderConfig {
			m := writeMaterial(t, dir, "keyasca", caKey, cert, key)
			return pki.ReloaderConfig{CAFile: m.ca, CertFile: m.cert, KeyFile: m.key}
		}(), "no PEM CERTIFICATE block"},
		{"key of another certificate", func() pki.ReloaderConfig {
			m := writeMaterial(t, dir, "mismatch", ca, cert, key2)
			return pki.ReloaderConfig{CAFile: m.ca, CertFile: m.cert, KeyFile: m.key}
		}(), "--tls-key"},
		{"certificate of another CA", func() pki.ReloaderConfig {
			m := writeMaterial(t, dir, "foreign", ca, foreign, foreignKey)
			return pki.ReloaderConfig{CAFile: m.ca, CertFile: m.cert, KeyFile: m.key}
		}(), "not usable with the CAs of --tls-ca"},
		{"expired certificate", func() pki.ReloaderConfig {
			m := writeMaterial(t, dir, "expired", ca, expired, expiredKey)
			return pki.ReloaderConfig{CAFile: m.ca, CertFile: m.cert, KeyFile: m.key}
		}(), "expired"},
		{"wrong role", pki.ReloaderConfig{CAFile: good.ca, CertFile: good.cert, KeyFile: good.key, Role: "region"},
			"is an agent certificate (spiffe://apiary/eu-west/agent/n1); this process needs a region certificate"},
		{"wrong region", pki.ReloaderConfig{CAFile: good.ca, CertFile: good.cert, KeyFile: good.key, Region: "us-east"},
			`is for region "eu-west"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := pki.NewReloader(tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("NewReloader = %v; want an error containing %q", err, tc.want)
			}
		})
	}
	r, err := pki.NewReloader(pki.ReloaderConfig{CAFile: good.ca, CertFile: good.cert, KeyFile: good.key, Role: "agent", Region: "eu-west"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Identity() != (pki.Identity{Role: "agent", Region: "eu-west", ID: "n1"}) || r.Generation() != 1 {
		t.Fatalf("identity %v generation %d", r.Identity(), r.Generation())
	}
}
