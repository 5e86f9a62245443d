package agent

// Telling a registration that failed for the agent's TLS settings (a
// plaintext agent against a TLS coordinator, or the reverse) from a
// coordinator that is not there, so the agent says what to change instead
// of looping on "error reading server preface: EOF".

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"regexp"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"apiary.dev/apiary/internal/cliconn"
	"apiary.dev/apiary/internal/pki"
)

// tlsProbeTimeout bounds the probe of a coordinator after a registration
// that reached no server.
const tlsProbeTimeout = time.Second

// tlsMismatch explains a RegisterNode call to addr that failed with err
// and got no transport (p: the call's peer, empty then): it probes addr
// (cliconn.ProbeTLS, within tlsProbeTimeout) and returns, when the
// coordinator speaks TLS and the agent's connection failed without a TLS
// error (so the agent dials in plaintext), "the coordinator at ADDR
// requires TLS: start the agent with --tls-ca/--tls-cert/--tls-key"; when
// the coordinator speaks plaintext and the failure is the agent's TLS
// handshake, that the coordinator does not speak TLS. Otherwise (nothing
// listens, a TLS handshake refused for the certificate, an answer from
// the server) it returns "". A TLS agent whose handshake failed because
// the coordinator holds a certificate of another region gets
// regionMismatch's hint. Which side the agent is on is read from the error
// gRPC gives (TLS failures say "tls:", "x509:" or "authentication
// handshake failed"); the coordinator's side is probed, not guessed.
func tlsMismatch(ctx context.Context, addr string, err error, p *peer.Peer) string {
	if status.Code(err) != codes.Unavailable || p.Addr != nil || ctx.Err() != nil {
		return ""
	}
	msg := status.Convert(err).Message()
	agentTLS := strings.Contains(msg, "tls:") || strings.Contains(msg, "x509:") ||
		strings.Contains(msg, "authentication handshake failed")
	pctx, cancel := context.WithTimeout(ctx, tlsProbeTimeout)
	defer cancel()
	if agentTLS {
		if why := regionMismatch(pctx, addr, msg); why != "" {
			return why
		}
	}
	switch cliconn.ProbeTLS(pctx, addr) {
	case cliconn.SpeaksTLS:
		if !agentTLS {
			return fmt.Sprintf("the coordinator at %s requires TLS: start the agent with --tls-ca/--tls-cert/--tls-key", addr)
		}
	case cliconn.SpeaksPlain:
		if agentTLS {
			return fmt.Sprintf("the coordinator at %s does not speak TLS (started with --insecure-dev?): "+
				"start the agent with --insecure-dev instead of --tls-ca/--tls-cert/--tls-key, or the coordinator with TLS", addr)
		}
	}
	return ""
}

// dialedRegion finds, in the error of a handshake that failed to verify
// the coordinator's certificate, the region the agent dialed it as (its own
// certificate's region; pki.RegionServerName): crypto/x509's "certificate
// is valid for ..., not region.R.apiary", or pki's "server
// region.R.apiary presented ...".
var dialedRegion = regexp.MustCompile(`(?:not |pki: server )` + regexp.QuoteMeta(pki.RoleRegion) + `\.([a-z0-9-]+)\.` +
	regexp.QuoteMeta(pki.Domain) + `\b`)

// regionMismatch explains a TLS handshake with addr that failed (msg: the
// gRPC error's message) because the coordinator serves another region than
// the agent's certificate is of: it reads the region the agent dialed as
// from msg (dialedRegion), probes addr for its certificate (serverIdentity,
// within ctx) and, when that is a region certificate of another region,
// returns "this agent's certificate is for region A; the coordinator at
// ADDR serves region B: use an agent certificate of B or point --addr at
// A's coordinators". Otherwise (another failure, a probe that learns
// nothing) it returns "".
func regionMismatch(ctx context.Context, addr, msg string) string {
	m := dialedRegion.FindStringSubmatch(msg)
	if m == nil {
		return ""
	}
	want := m[1]
	got, err := serverIdentity(ctx, addr)
	if err != nil || got.Role != pki.RoleRegion || got.Region == want {
		return ""
	}
	return fmt.Sprintf("this agent's certificate is for region %s; the coordinator at %s serves region %s: "+
		"use an agent certificate of %s or point --addr at %s's coordinators", want, addr, got.Region, got.Region, want)
}

// serverIdentity returns the Apiary identity (pki.IdentityOf) of the
// certificate the TLS server at addr presents, read without verifying it
// and without a client certificate (TLS 1.3 sends the server's certificate
// before the client's; a probe: nothing is sent over the connection).
func serverIdentity(ctx context.Context, addr string) (pki.Identity, error) {
	var leaf *x509.Certificate
	d := tls.Dialer{NetDialer: &net.Dialer{}, Config: &tls.Config{
		InsecureSkipVerify: true, // only the certificate's identity is read
		MinVersion:         tls.VersionTLS12,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) > 0 {
				leaf = cs.PeerCertificates[0]
			}
			return nil
		},
	}}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err == nil {
		conn.Close()
	}
	if leaf == nil {
		return pki.Identity{}, fmt.Errorf("no certificate from %s: %v", addr, err)
	}
	return pki.IdentityOf(leaf)
}
