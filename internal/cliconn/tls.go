package cliconn

// The client's mutual-TLS files (flags or environment), and telling a
// connection refused for its TLS settings from a server that is not there.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"apiary.dev/apiary/internal/pki"
)

// Environment variables of the client's TLS files, read when the matching
// flag (--tls-ca, --tls-cert, --tls-key) is not given (Nomad's NOMAD_CACERT
// habit).
const (
	EnvCACert     = "APIARY_CACERT"
	EnvClientCert = "APIARY_CLIENT_CERT"
	EnvClientKey  = "APIARY_CLIENT_KEY"
	// EnvTLSServerName is read when --tls-server-name is not given
	// (Nomad's NOMAD_TLS_SERVER_NAME).
	EnvTLSServerName = "APIARY_TLS_SERVER_NAME"
)

// TLSHint is what a user is told to do to give the CLI its certificate.
const TLSHint = "pass --tls-ca/--tls-cert/--tls-key or set " + EnvCACert + "/" + EnvClientCert + "/" + EnvClientKey

// TLSFiles are the paths of a client's CA bundle, certificate and key.
type TLSFiles struct {
	CA, Cert, Key string
}

// Empty reports whether no file is named.
func (f TLSFiles) Empty() bool { return f == TLSFiles{} }

// ResolveTLS takes each file from its flag when set (non-empty), else from
// its environment variable. It returns the zero TLSFiles (plaintext) when
// none is named anywhere, and an error naming what is missing when some but
// not all three are, e.g. `--tls-key (or $APIARY_CLIENT_KEY): required
// with --tls-ca and --tls-cert`.
func ResolveTLS(flags TLSFiles) (TLSFiles, error) {
	pick := func(flag, env string) string {
		if flag != "" {
			return flag
		}
		return os.Getenv(env)
	}
	f := TLSFiles{CA: pick(flags.CA, EnvCACert), Cert: pick(flags.Cert, EnvClientCert), Key: pick(flags.Key, EnvClientKey)}
	if f.Empty() {
		return f, nil
	}
	var have, missing []string
	for _, x := range []struct{ v, flag, env string }{
		{f.CA, "--tls-ca", EnvCACert}, {f.Cert, "--tls-cert", EnvClientCert}, {f.Key, "--tls-key", EnvClientKey},
	} {
		if x.v == "" {
			missing = append(missing, fmt.Sprintf("%s (or $%s)", x.flag, x.env))
		} else {
			have = append(have, x.flag)
		}
	}
	if len(missing) > 0 {
		return TLSFiles{}, fmt.Errorf("%s: required with %s (give all three TLS files or none)",
			strings.Join(missing, " and "), strings.Join(have, " and "))
	}
	return f, nil
}

// Load reads the files into a Reloader (no role or region required: any
// certificate of the CA). The error names the flag of the file at fault.
// The CLI does not follow changes (it does not run long); call Start for
// that.
func (f TLSFiles) Load() (*pki.Reloader, error) {
	return pki.NewReloader(pki.ReloaderConfig{CAFile: f.CA, CertFile: f.Cert, KeyFile: f.Key})
}

// TLSErrorKind says why a connection's TLS settings were refused.
type TLSErrorKind int

const (
	// TLSRequired: the connection was plaintext and the server speaks TLS.
	TLSRequired TLSErrorKind = iota + 1
	// TLSNotServed: the connection was TLS and the server speaks
	// plaintext (a process started with --insecure-dev).
	TLSNotServed
	// TLSHandshake: both sides speak TLS and the handshake failed (the
	// server's certificate is not trusted or not of the expected name, or
	// the server refused the client certificate: expired, of another CA).
	TLSHandshake
)

// TLSError is the error of a unary call that reached no server because of
// the connection's TLS settings, decided by probing the address (see
// DialTLS), not from the error's text. Its gRPC status is the call's
// (UNAVAILABLE: nothing was sent); NotConnected holds for it and Retryable
// does not.
type TLSError struct {
	Kind TLSErrorKind
	// Addr is the address probed (host:port).
	Addr string
	err  error // the call's
	// why the probe's own handshake failed (TLSHandshake): the server's
	// alert or the verification error, which the call's error may not say.
	why error
}

func (e *TLSError) Error() string {
	switch e.Kind {
	case TLSRequired:
		return fmt.Sprintf("the server at %s requires TLS: %s", e.Addr, TLSHint)
	case TLSNotServed:
		return fmt.Sprintf("the server at %s does not speak TLS (started with --insecure-dev?): drop the TLS files "+
			"(--tls-ca/--tls-cert/--tls-key, $%s/$%s/$%s) to reach it in plaintext", e.Addr, EnvCACert, EnvClientCert, EnvClientKey)
	}
	why := status.Convert(e.err).Message()
	if e.why != nil {
		why = e.why.Error()
	}
	return fmt.Sprintf("TLS handshake with the server at %s failed: %s", e.Addr, why)
}

// Unwrap returns the call's error (NotConnected and status.Code see it).
func (e *TLSError) Unwrap() error { return e.err }

// GRPCStatus is the call's status.
func (e *TLSError) GRPCStatus() *status.Status { return status.Convert(e.err) }

// probeTimeout bounds the TLS probes of a failed call's addresses (all
// probed at once).
const probeTimeout = time.Second

// tlsProber probes the addresses of a connection whose unary call reached
// no server, to tell a TLS mismatch from a server that is not there.
type tlsProber struct {
	addrs      []string
	r          *pki.Reloader // nil: the connection is plaintext
	serverName string
}

func (p tlsProber) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if err == nil || !NotConnected(err) {
		return err
	}
	// Probe every address at once, within probeTimeout in all (even if
	// the call's own context has ended: the verdict is what the user
	// needs), and report the first address, in order, with a verdict.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), probeTimeout)
	defer cancel()
	verdicts := make([]*TLSError, len(p.addrs))
	var wg sync.WaitGroup
	for i, a := range p.addrs {
		wg.Go(func() { verdicts[i] = p.probe(pctx, a, err) })
	}
	wg.Wait()
	for _, v := range verdicts {
		if v != nil {
			return v
		}
	}
	return err
}

// probe is the verdict on one address for a call that failed with err:
// a *TLSError, or nil when the address shows no TLS problem (nothing
// listens, or the handshake works: the call failed for another reason).
func (p tlsProber) probe(ctx context.Context, addr string, err error) *TLSError {
	kind := ProbeTLS(ctx, addr)
	switch {
	case kind == SpeaksTLS && p.r == nil:
		return &TLSError{Kind: TLSRequired, Addr: addr, err: err}
	case kind == SpeaksPlain && p.r != nil:
		return &TLSError{Kind: TLSNotServed, Addr: addr, err: err}
	case kind == SpeaksTLS:
		if hsErr := p.handshake(ctx, addr); hsErr != nil {
			return &TLSError{Kind: TLSHandshake, Addr: addr, err: err, why: hsErr}
		}
	}
	return nil
}

// Speaks is what a probed address answered (ProbeTLS).
type Speaks int

const (
	SpeaksNothing Speaks = iota // no connection, or closed without a word
	SpeaksTLS                   // a TLS server (it sent its certificate)
	SpeaksPlain                 // something that is not TLS
)

// ProbeTLS opens a TLS connection to addr (host:port) without verifying
// anything and without a client certificate, only to learn whether a TLS
// server answers there (bounded by ctx; DialTLS's calls probe within one
// second): it did if it sent a certificate (TLS 1.3 lets the client
// finish its side of the handshake before the server refuses the missing
// client certificate); it did not if the first bytes it sent are not a TLS
// record (a plaintext gRPC server sends its HTTP/2 settings first).
func ProbeTLS(ctx context.Context, addr string) Speaks {
	sawCert := false
	d := tls.Dialer{NetDialer: &net.Dialer{}, Config: &tls.Config{
		InsecureSkipVerify: true, // a probe: nothing is sent over this connection
		MinVersion:         tls.VersionTLS12,
		VerifyConnection: func(cs tls.ConnectionState) error {
			sawCert = len(cs.PeerCertificates) > 0
			return nil
		},
	}}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err == nil {
		conn.Close()
	}
	var rhe tls.RecordHeaderError
	switch {
	case sawCert:
		return SpeaksTLS
	case errors.As(err, &rhe):
		return SpeaksPlain
	}
	return SpeaksNothing
}

// handshake makes the connection's own TLS handshake with addr (its
// certificate, its verification of the server) and waits briefly for the
// server's verdict on the client certificate, which TLS 1.3 sends after
// the client's side is done: an alert (refused) or the server's first
// HTTP/2 frame (accepted). It returns why the handshake failed, or nil
// when it did not (the call failed for another reason, to be retried).
func (p tlsProber) handshake(ctx context.Context, addr string) error {
	name := p.serverName
	if name == "" {
		if h, _, err := net.SplitHostPort(addr); err == nil {
			name = h
		}
	}
	d := tls.Dialer{NetDialer: &net.Dialer{}, Config: p.r.ClientTLSConfig(name)}
	d.Config.NextProtos = []string{"h2"}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, context.DeadlineExceeded) {
			return nil
		}
		return err
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	_ = conn.SetReadDeadline(deadline)
	var b [1]byte
	if _, err := conn.Read(b[:]); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, io.EOF) {
			return nil // no word from the server: not a refusal
		}
		return err
	}
	return nil
}
