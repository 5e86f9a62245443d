package agent

// Telling a registration that failed for the agent's TLS settings (a
// plaintext agent against a TLS coordinator, or the reverse) from a
// coordinator that is not there, so the agent says what to change instead
// of looping on "error reading server preface: EOF".

import (
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"apiary.dev/apiary/internal/cliconn"
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
// the server) it returns "". Which side the agent is on is read from the
// error gRPC gives (TLS failures say "tls:", "x509:" or "authentication
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
