package cliconn

// The client's ACL token (Nomad's NOMAD_TOKEN habit): read from --token or
// $APIARY_TOKEN, sent with every call as gRPC metadata (internal/acl), and
// never over a plaintext connection to an address that is not loopback.

import (
	"context"
	"fmt"
	"net"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"apiary.dev/apiary/internal/acl"
)

// TokenHint is what a user refused for a missing or unknown token is told.
const TokenHint = "with ACLs on, every call needs a token: pass --token or set $" + acl.EnvToken + " to an ACL token's secret (`apiary acl bootstrap` makes the first one; " +
	"`apiary acl token create` the others)"

// ResolveToken returns the token secret of the --token flag when set
// (non-empty), else $APIARY_TOKEN, else "" (no token is sent).
func ResolveToken(flag string) string {
	if flag != "" {
		return flag
	}
	return os.Getenv(acl.EnvToken)
}

// WithToken is the dial option that sends secret as the ACL token
// (metadata "x-apiary-token") with every call of the connection, unary and
// streaming; an empty secret sends nothing. The token goes only where it
// cannot be read on the way: over TLS (any address), or plaintext to a
// loopback address. A call over a plaintext connection to any other
// address fails before anything is sent, with UNAUTHENTICATED and a
// message that says why (the check is made per call, on the address the
// call's connection really reached).
func WithToken(secret string) grpc.DialOption {
	if secret == "" {
		return grpc.EmptyDialOption{}
	}
	return grpc.WithPerRPCCredentials(tokenCreds{secret: secret})
}

// tokenCreds is the per-call credential of WithToken.
type tokenCreds struct{ secret string }

// GetRequestMetadata returns the token's metadata, or an error when the
// call's connection is plaintext and its peer is not loopback.
func (c tokenCreds) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	if err := TokenAllowed(ctx); err != nil {
		return nil, err
	}
	return map[string]string{acl.MetadataKey: c.secret}, nil
}

// RequireTransportSecurity is false: plaintext to loopback is allowed
// (apiary dev without --tls); GetRequestMetadata refuses the rest.
func (tokenCreds) RequireTransportSecurity() bool { return false }

// TokenAllowed decides, for the context gRPC gives a per-call credential
// (credentials.RequestInfo and the connection's peer), whether a token may
// be sent: yes over a connection with privacy and integrity (TLS), or to a
// loopback address; otherwise UNAUTHENTICATED naming the address.
func TokenAllowed(ctx context.Context) error {
	if ri, ok := credentials.RequestInfoFromContext(ctx); ok && credentials.CheckSecurityLevel(ri.AuthInfo, credentials.PrivacyAndIntegrity) == nil {
		return nil
	}
	addr := "an unknown address"
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		addr = p.Addr.String()
		if isLoopback(p.Addr) {
			return nil
		}
	}
	return status.Error(codes.Unauthenticated, fmt.Sprintf("%s (--token or $%s) over a plaintext connection to %s, "+
		"where anyone on the way could read it: reach the server with TLS (%s), or unset the token", TokenRefusedPrefix, acl.EnvToken, addr, TLSHint))
}

func isLoopback(a net.Addr) bool {
	var ip net.IP
	switch x := a.(type) {
	case *net.TCPAddr:
		ip = x.IP
	default:
		host, _, err := net.SplitHostPort(a.String())
		if err != nil {
			return false
		}
		ip = net.ParseIP(host)
	}
	return ip != nil && ip.IsLoopback()
}

// TokenRefusedPrefix starts the message of a call refused by WithToken's
// plaintext check (TokenAllowed), so that a command can tell it from a
// server's refusal of the token.
const TokenRefusedPrefix = "refusing to send the ACL token"

// CheckTokenTransport is the check WithToken makes per call, made before
// dialing on what the addresses say: with a token to send (token != "")
// over a plaintext connection (!tls), every address must be a loopback IP
// or "localhost". Host names that resolve elsewhere are caught per call.
// The error names the first address at fault.
func CheckTokenTransport(addrs []string, token string, tls bool) error {
	if token == "" || tls {
		return nil
	}
	for _, a := range addrs {
		host, _, err := net.SplitHostPort(a)
		if err != nil {
			return fmt.Errorf("address %q: must be host:port", a)
		}
		if host == "localhost" {
			continue
		}
		if ip := net.ParseIP(host); ip != nil && !ip.IsLoopback() {
			return fmt.Errorf("%s (--token or $%s) over a plaintext connection to %s, where anyone on the way could read it: "+
				"reach the server with TLS (%s), or unset the token", TokenRefusedPrefix, acl.EnvToken, a, TLSHint)
		}
	}
	return nil
}
