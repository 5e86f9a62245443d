package agent

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/grafana/dskit/backoff"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/pki"
)

// registerOnly is a coordinator that answers RegisterNode only.
type registerOnly struct {
	apiaryv1.UnimplementedAgentServiceServer
}

func (registerOnly) RegisterNode(context.Context, *apiaryv1.RegisterNodeRequest) (*apiaryv1.RegisterNodeResponse, error) {
	return &apiaryv1.RegisterNodeResponse{NodeEpoch: 7, Region: "eu-west"}, nil
}

// serveAgentAPI serves registerOnly on a 127.0.0.1 port (with TLS as r's
// certificate, or plaintext when r is nil) until the test ends.
func serveAgentAPI(t *testing.T, r *pki.Reloader) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var opts []grpc.ServerOption
	if r != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(r.ServerTLSConfig())))
	}
	srv := grpc.NewServer(opts...)
	apiaryv1.RegisterAgentServiceServer(srv, registerOnly{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

func reloader(t *testing.T, p *devcluster.PKI, role, id string) *pki.Reloader {
	t.Helper()
	f, err := p.Cert(role, "eu-west", id)
	if err != nil {
		t.Fatal(err)
	}
	r, err := f.Load()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestRegisterExplainsTLSMismatch runs register against real gRPC servers
// on 127.0.0.1: a plaintext agent against a TLS coordinator, a TLS agent
// against a plaintext one, and a TLS agent with a certificate of another
// region (us-east against eu-west) each log once, at ERROR (over several
// failed attempts), what to change; a TLS agent whose certificate the
// coordinator refuses (another CA) and an address where nothing listens
// get no such hint; each distinct failure is logged once at WARN, its
// repeats at DEBUG; matching settings register.
func TestRegisterExplainsTLSMismatch(t *testing.T) {
	p, err := devcluster.NewPKI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	otherCA, err := devcluster.NewPKI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tlsAddr := serveAgentAPI(t, reloader(t, p, pki.RoleRegion, "c1"))
	plainAddr := serveAgentAPI(t, nil)
	deadLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := deadLis.Addr().String()
	deadLis.Close()
	asAgent := pki.DialOption(reloader(t, p, pki.RoleAgent, "n1"), pki.RegionServerName("eu-west"))
	asStranger := pki.DialOption(reloader(t, otherCA, pki.RoleAgent, "n1"), pki.RegionServerName("eu-west"))
	usEast, err := p.Cert(pki.RoleAgent, "us-east", "n1")
	if err != nil {
		t.Fatal(err)
	}
	usEastR, err := usEast.Load()
	if err != nil {
		t.Fatal(err)
	}
	asForeign := pki.DialOption(usEastR, pki.RegionServerName("us-east")) // as `apiary agent` dials with a us-east certificate
	plain := grpc.WithTransportCredentials(insecure.NewCredentials())

	requires := "the coordinator at " + tlsAddr + " requires TLS: start the agent with --tls-ca/--tls-cert/--tls-key"
	notServed := "the coordinator at " + plainAddr + " does not speak TLS (started with --insecure-dev?)"
	otherRegion := "this agent's certificate is for region us-east; the coordinator at " + tlsAddr + " serves region eu-west: " +
		"use an agent certificate of eu-west or point --addr at us-east's coordinators"
	for _, tc := range []struct {
		name      string
		addr      string
		dial      grpc.DialOption
		want      string // logged exactly once ("" : registers)
		notWanted []string
	}{
		{"plaintext agent, TLS coordinator", tlsAddr, plain, requires, []string{"does not speak TLS"}},
		{"TLS agent, plaintext coordinator", plainAddr, asAgent, notServed, []string{"requires TLS"}},
		{"TLS agent of another CA, TLS coordinator", tlsAddr, asStranger, "", []string{"requires TLS", "does not speak TLS", "serves region"}},
		{"TLS agent of another region, TLS coordinator", tlsAddr, asForeign, otherRegion, []string{"requires TLS", "does not speak TLS"}},
		{"nothing listens", deadAddr, plain, "", []string{"requires TLS", "does not speak TLS"}},
		{"TLS agent, TLS coordinator", tlsAddr, asAgent, "", nil},
		{"plaintext agent, plaintext coordinator", plainAddr, plain, "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			coords, err := newCoordinators([]string{tc.addr}, 20*time.Millisecond, 100*time.Millisecond, []grpc.DialOption{tc.dial})
			if err != nil {
				t.Fatal(err)
			}
			defer coords.close()
			var buf bytes.Buffer
			log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
			registers := tc.want == "" && tc.notWanted == nil
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
			defer cancel()
			sess, err := register(ctx, coords, &apiaryv1.RegisterNodeRequest{NodeId: "n1"}, time.Second,
				backoff.Config{MinBackoff: 50 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}, log, nil)
			out := buf.String()
			if registers {
				if err != nil || sess.epoch != 7 {
					t.Fatalf("register: %v; want epoch 7\n%s", err, out)
				}
				return
			}
			if err == nil {
				t.Fatalf("register succeeded; want it to keep failing\n%s", out)
			}
			if n := strings.Count(out, "register failed"); n < 3 {
				t.Fatalf("%d failed attempts in 3 s, want >= 3 (the hint must be logged once over several)\n%s", n, out)
			}
			// Each distinct failure is said once at WARN, then at DEBUG.
			warned := map[string]bool{}
			for _, line := range strings.Split(out, "\n") {
				if _, err, ok := strings.Cut(line, `level=WARN msg="register failed" `); ok {
					if warned[err] {
						t.Errorf("the same failure WARNed twice: %s\n%s", err, out)
					}
					warned[err] = true
				}
			}
			if len(warned) == 0 {
				t.Errorf("no WARN of the failure:\n%s", out)
			}
			if tc.want != "" {
				if n := strings.Count(out, tc.want); n != 1 || !strings.Contains(out, "level=ERROR msg=\""+tc.want) {
					t.Errorf("want one ERROR %q, got %d:\n%s", tc.want, n, out)
				}
			}
			for _, s := range tc.notWanted {
				if strings.Contains(out, s) {
					t.Errorf("log says %q:\n%s", s, out)
				}
			}
		})
	}
}

// TestDialedRegion: the region the agent dialed a coordinator as is read
// from crypto/x509's name error and from pki's identity error, never from
// the names the certificate is valid for.
func TestDialedRegion(t *testing.T) {
	for _, tc := range []struct{ msg, want string }{
		{`connection error: desc = "transport: authentication handshake failed: pki: server certificate: x509: certificate is valid for region.eu-west.apiary, localhost, not region.us-east.apiary"`, "us-east"},
		{`authentication handshake failed: pki: server region.us-east.apiary presented spiffe://apiary/eu-west/region/c1: not the region of region us-east it was dialed as`, "us-east"},
		{`x509: certificate is valid for region.eu-west.apiary, localhost, not localhost.example`, ""},
		{`x509: certificate signed by unknown authority`, ""},
	} {
		got := ""
		if m := dialedRegion.FindStringSubmatch(tc.msg); m != nil {
			got = m[1]
		}
		if got != tc.want {
			t.Errorf("dialedRegion(%q) = %q, want %q", tc.msg, got, tc.want)
		}
	}
}
