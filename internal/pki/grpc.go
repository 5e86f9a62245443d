package pki

// The one file that knows grpc: transport credentials from a Reloader, and
// the verified identity of the peer of a call.

import (
	"context"
	"errors"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// ErrNoPeerIdentity is wrapped by PeerIdentity's errors: the call did not
// come over mutual TLS with a verified client certificate. Servers answer
// it with codes.Unauthenticated.
var ErrNoPeerIdentity = errors.New("no verified client certificate")

// PeerIdentity returns the identity of the client of a gRPC call on a
// server that uses ServerCredentials: the Apiary identity URI of the leaf of
// the chain the TLS handshake verified (credentials.TLSInfo's
// VerifiedChains). The error wraps ErrNoPeerIdentity when there is no peer,
// the transport is not TLS or nothing was verified, and says what is wrong
// when the certificate carries no (or a malformed) identity. It is meant
// for the server side: a client's view of its server has no verified
// chains (ClientTLSConfig verifies in VerifyConnection).
func PeerIdentity(ctx context.Context) (Identity, error) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.AuthInfo == nil {
		return Identity{}, fmt.Errorf("%w: no TLS peer on the call", ErrNoPeerIdentity)
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return Identity{}, fmt.Errorf("%w: the connection is %s, not TLS", ErrNoPeerIdentity, p.AuthInfo.AuthType())
	}
	if len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return Identity{}, fmt.Errorf("%w: the TLS handshake verified no client certificate", ErrNoPeerIdentity)
	}
	return IdentityOf(info.State.VerifiedChains[0][0])
}

// ServerCredentials is the grpc.ServerOption serving mutual TLS with r's
// ServerTLSConfig (client certificate required, reloads followed).
func ServerCredentials(r *Reloader) grpc.ServerOption {
	return grpc.Creds(credentials.NewTLS(r.ServerTLSConfig()))
}

// TransportCredentials are r's client credentials for serverName (see
// ClientTLSConfig), for callers that build their own dial options. An
// empty serverName means the host of each connection's authority (the
// dial target's host, an IP address included).
func TransportCredentials(r *Reloader, serverName string) credentials.TransportCredentials {
	return &clientCreds{TransportCredentials: credentials.NewTLS(r.ClientTLSConfig(serverName)), r: r, serverName: serverName}
}

// clientCreds verifies the server as the authority's host when no server
// name was given: a VerifyConnection cannot see the name grpc sets on its
// copy of the config, and TLS sends no SNI for an IP address.
type clientCreds struct {
	credentials.TransportCredentials
	r          *Reloader
	serverName string
}

func (c *clientCreds) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if c.serverName != "" {
		return c.TransportCredentials.ClientHandshake(ctx, authority, conn)
	}
	host, _, err := net.SplitHostPort(authority)
	if err != nil {
		host = authority
	}
	return credentials.NewTLS(c.r.ClientTLSConfig(host)).ClientHandshake(ctx, authority, conn)
}

func (c *clientCreds) Clone() credentials.TransportCredentials {
	return TransportCredentials(c.r, c.serverName)
}

func (c *clientCreds) OverrideServerName(name string) error {
	c.serverName = name
	c.TransportCredentials = credentials.NewTLS(c.r.ClientTLSConfig(name))
	return nil
}

// DialOption is the grpc.DialOption dialing with mutual TLS as r's
// certificate, verifying the server as serverName (RegionServerName(region)
// for a region's coordinators, RouterServerName for a router; empty: the
// dial target's host). A non-empty serverName also becomes the
// connection's :authority, so do not combine it with a different
// grpc.WithAuthority.
func DialOption(r *Reloader, serverName string) grpc.DialOption {
	return grpc.WithTransportCredentials(TransportCredentials(r, serverName))
}
