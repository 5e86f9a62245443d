package regional

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"time"
)

// etcdWaitReport is how often a member that is not ready yet says why.
const etcdWaitReport = 5 * time.Second

// peerURLs are the peer URLs of the other members of an initial cluster
// "name=url,name=url" (own: the member's own name), by name.
func peerURLs(initialCluster, own string) map[string]string {
	out := map[string]string{}
	for _, part := range strings.Split(initialCluster, ",") {
		name, u, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || name == own {
			continue
		}
		out[name] = u
	}
	return out
}

// probePeer says why an etcd peer URL may keep this member from its
// quorum: nil when a TCP connection (and, for https, a TLS handshake in
// which the peer presents a certificate for allowedHost) succeeds, else
// an error a person can act on: nothing listens, the peer's certificate
// is of another region (allowedHost is region.<R>.apiary), or the peer
// refused this member's certificate. clientTLS is the member's own
// client configuration (nil for http peers).
func probePeer(ctx context.Context, peerURL string, clientTLS *tls.Config, allowedHost string) error {
	u, err := url.Parse(peerURL)
	if err != nil {
		return fmt.Errorf("bad peer URL %q: %w", peerURL, err)
	}
	d := &net.Dialer{Timeout: 2 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return fmt.Errorf("cannot connect: %w", err)
	}
	defer conn.Close()
	if u.Scheme != "https" || clientTLS == nil {
		return nil
	}
	cfg := clientTLS.Clone()
	// A diagnosis, not a connection to use: the peer's certificate is
	// looked at below (is it for allowedHost, the name etcd's peers
	// check?), and no data is sent.
	cfg.InsecureSkipVerify = true
	cfg.VerifyPeerCertificate, cfg.VerifyConnection = nil, nil
	cfg.ServerName = ""
	tc := tls.Client(conn, cfg)
	_ = tc.SetDeadline(time.Now().Add(2 * time.Second))
	if err := tc.HandshakeContext(ctx); err != nil {
		return fmt.Errorf("TLS handshake failed (%w): the peer may have refused this member's certificate; "+
			"etcd peers accept only certificates of %s, so a member of another region or of another CA is refused", err, allowedHost)
	}
	// TLS 1.3: a refused client certificate shows on the first read.
	_ = tc.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := tc.Read(make([]byte, 1)); err != nil {
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			return fmt.Errorf("the peer closed the connection after the handshake (%w): it refused this member's certificate; "+
				"etcd peers accept only certificates of %s (is the peer a member of another region?)", err, allowedHost)
		}
	}
	certs := tc.ConnectionState().PeerCertificates
	if len(certs) == 0 {
		return errors.New("the peer sent no certificate")
	}
	if allowedHost != "" {
		if err := certs[0].VerifyHostname(allowedHost); err != nil {
			return fmt.Errorf("the peer's certificate is not for %s (it names %s): it belongs to another region, "+
				"whose etcd this member cannot join", allowedHost, strings.Join(certs[0].DNSNames, ", "))
		}
	}
	return nil
}

// reportEtcdWait logs, every etcdWaitReport until ready is closed or ctx
// ends, that member name is not ready and what each peer of
// initialCluster looks like from here (probePeer), so a member that
// cannot reach its quorum (peers down, another region's etcd, a
// certificate the peers refuse) says so instead of waiting silently.
func reportEtcdWait(ctx context.Context, ready <-chan struct{}, name, initialCluster string, clientTLS *tls.Config,
	allowedHost string, log *slog.Logger) {
	peers := peerURLs(initialCluster, name)
	if len(peers) == 0 {
		return
	}
	start := time.Now()
	t := time.NewTicker(etcdWaitReport)
	defer t.Stop()
	for {
		select {
		case <-ready:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var problems []string
		for pn, pu := range peers {
			if err := probePeer(ctx, pu, clientTLS, allowedHost); err != nil {
				problems = append(problems, fmt.Sprintf("%s (%s): %v", pn, pu, err))
			}
		}
		select {
		case <-ready:
			return
		default:
		}
		msg := "etcd member not ready: waiting for a quorum of --initial-cluster"
		if len(problems) == 0 {
			log.Warn(msg, "member", name, "waited", time.Since(start).Round(time.Second).String(),
				"peers", "all reachable; they may not have this member in their cluster yet (etcd member add) or be starting")
			continue
		}
		log.Warn(msg, "member", name, "waited", time.Since(start).Round(time.Second).String(), "peer_problems", strings.Join(problems, "; "))
	}
}
