package main

// Shared plumbing of the client commands (job, node): flags, connection,
// error → exit code mapping and output helpers.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"apiary.dev/apiary/internal/acl"
	"apiary.dev/apiary/internal/cliconn"
	"apiary.dev/apiary/internal/pki"
)

// serverTLSFlags are the transport flags of the server roles (apiary
// region, global and agent): the three TLS files, or --insecure-dev.
type serverTLSFlags struct {
	files       cliconn.TLSFiles
	insecureDev bool
}

func (t *serverTLSFlags) add(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&t.files.CA, "tls-ca", "", "CA bundle that peers' certificates must chain to (mutual TLS; with --tls-cert and --tls-key; see 'apiary tls')")
	f.StringVar(&t.files.Cert, "tls-cert", "", "this process's certificate (apiary tls cert create --role "+tlsRoleOf(cmd.Name())+"); reloaded when the file changes")
	f.StringVar(&t.files.Key, "tls-key", "", "this process's private key; reloaded when the file changes")
	f.BoolVar(&t.insecureDev, "insecure-dev", false, "run WITHOUT TLS (plaintext, no authentication or authorization): for development on one machine only")
}

// tlsRoleOf is the certificate role of a server command.
func tlsRoleOf(cmdName string) string {
	switch cmdName {
	case "region":
		return pki.RoleRegion
	case "global":
		return pki.RoleRouter
	}
	return pki.RoleAgent
}

// load checks the flags and loads the certificate, which must be of role
// (and of region, when not empty). It returns nil with --insecure-dev, after
// logging at WARN what anyone who can reach the process can do (exposure).
// Without either, or with both, or with some but not all of the three
// files, or with files that do not load, it fails with exit 2 naming the
// flags.
func (t *serverTLSFlags) load(cmd string, role, region string, log *slog.Logger, exposure string) (*pki.Reloader, error) {
	if t.insecureDev && !t.files.Empty() {
		return nil, withCode(exitInvalid, errors.New("--insecure-dev and --tls-ca/--tls-cert/--tls-key: give one or the other"))
	}
	if t.insecureDev {
		log.Warn("running WITHOUT TLS (--insecure-dev): " + exposure + "; for development only (see README, \"TLS\")")
		return nil, nil
	}
	if t.files.Empty() {
		return nil, withCode(exitInvalid, fmt.Errorf("apiary %s: no TLS: give --tls-ca, --tls-cert and --tls-key (make them with "+
			"`apiary tls ca create` and `apiary tls cert create --role %s`; README, \"TLS\"), or --insecure-dev to run without TLS "+
			"(development only: anyone who can reach the process can use it)", cmd, role))
	}
	var missing []string
	for _, x := range []struct{ v, flag string }{{t.files.CA, "--tls-ca"}, {t.files.Cert, "--tls-cert"}, {t.files.Key, "--tls-key"}} {
		if x.v == "" {
			missing = append(missing, x.flag)
		}
	}
	if len(missing) > 0 {
		return nil, withCode(exitInvalid, fmt.Errorf("%s: required with the other TLS flags (give --tls-ca, --tls-cert and --tls-key, all three)",
			strings.Join(missing, " and ")))
	}
	r, err := pki.NewReloader(pki.ReloaderConfig{CAFile: t.files.CA, CertFile: t.files.Cert, KeyFile: t.files.Key,
		Role: role, Region: region, Logger: log.With("component", "tls")})
	if err != nil {
		return nil, withCode(exitInvalid, err)
	}
	id := r.Identity()
	log.Info("mutual TLS on", "identity", id.String(), "not_after", r.NotAfter().UTC().Format(time.RFC3339))
	return r, nil
}

// exitInterrupted is the conventional exit code after SIGINT.
const exitInterrupted = 130

// perCallTimeout bounds one unary RPC inside the --timeout budget.
const perCallTimeout = 10 * time.Second

// clientOpts are the persistent flags of a client command tree.
type clientOpts struct {
	addr    string
	timeout time.Duration
	output  string
	// tls are --tls-ca, --tls-cert and --tls-key ($APIARY_CACERT,
	// $APIARY_CLIENT_CERT, $APIARY_CLIENT_KEY when not given).
	tls cliconn.TLSFiles
	// token is --token ($APIARY_TOKEN when not given): the ACL token's
	// secret sent with every call.
	token string
	// serverName is --tls-server-name ($APIARY_TLS_SERVER_NAME): the name
	// the server's certificate must carry, when the command does not know
	// which server it dials.
	serverName string
}

func (o *clientOpts) addFlags(cmd *cobra.Command) {
	f := cmd.PersistentFlags()
	f.StringVar(&o.addr, "addr", "", "API address host:port (default $"+cliconn.EnvAddr+", else "+cliconn.DefaultAddr+")")
	f.DurationVar(&o.timeout, "timeout", 30*time.Second, "how long to keep trying to reach the API before giving up (exit 3)")
	f.StringVarP(&o.output, "output", "o", "text", "output format: text or json")
	f.StringVar(&o.tls.CA, "tls-ca", "", "CA bundle to verify the server with (mutual TLS; default $"+cliconn.EnvCACert+"; none of the three: plaintext)")
	f.StringVar(&o.tls.Cert, "tls-cert", "", "client certificate (apiary tls cert create --role client; default $"+cliconn.EnvClientCert+")")
	f.StringVar(&o.tls.Key, "tls-key", "", "client certificate's key (default $"+cliconn.EnvClientKey+")")
	f.StringVar(&o.serverName, "tls-server-name", "", "name the server's certificate must carry, e.g. router.global.apiary or region.eu-west.apiary "+
		"(its identity is then checked too: role, region); default $"+cliconn.EnvTLSServerName+", else the host of --addr, which any region or router certificate carrying it passes")
	f.StringVar(&o.token, "token", "", "ACL token secret sent with every call (default $"+acl.EnvToken+"; never sent in plaintext to an address that is not loopback)")
}

// dial dials addr (one host:port or a comma-separated list) with the
// command's TLS files, verifying the server's certificate as serverName
// (pki.RegionServerName(region) when the command knows it dials a region's
// coordinators; "": --tls-server-name or $APIARY_TLS_SERVER_NAME, else the
// address's host, as the CLI does not know whether --addr is a router or a
// coordinator, nor of which region), or plaintext
// without them; every call carries the ACL token of --token or
// $APIARY_TOKEN, if any (cliconn.WithToken). Errors (malformed address, TLS
// files missing or unreadable, a token to send in plaintext to an address
// that is not loopback) exit 2.
func (o *clientOpts) dial(addr, serverName string) (*grpc.ClientConn, error) {
	files, err := cliconn.ResolveTLS(o.tls)
	if err != nil {
		return nil, withCode(exitInvalid, err)
	}
	var r *pki.Reloader
	if !files.Empty() {
		if r, err = files.Load(); err != nil {
			return nil, withCode(exitInvalid, fmt.Errorf("%w (the CLI's files come from --tls-ca/--tls-cert/--tls-key or $%s/$%s/$%s)",
				err, cliconn.EnvCACert, cliconn.EnvClientCert, cliconn.EnvClientKey))
		}
	}
	token := cliconn.ResolveToken(o.token)
	if addrs, err := cliconn.SplitAddrs(addr); err == nil {
		if err := cliconn.CheckTokenTransport(addrs, token, r != nil); err != nil {
			return nil, withCode(exitInvalid, err)
		}
	}
	if serverName == "" {
		serverName = o.serverName
		if serverName == "" {
			serverName = os.Getenv(cliconn.EnvTLSServerName)
		}
	}
	cc, err := cliconn.DialTLS(addr, r, serverName, cliconn.WithToken(token))
	if err != nil {
		return nil, withCode(exitInvalid, fmt.Errorf("bad API address %q: %w", addr, err))
	}
	return cc, nil
}

// check validates the flags themselves (exit 2, before any dialing).
func (o *clientOpts) check() error {
	switch o.output {
	case "text", "json":
	default:
		return withCode(exitInvalid, fmt.Errorf("--output must be text or json (got %q)", o.output))
	}
	if o.timeout <= 0 {
		return withCode(exitInvalid, fmt.Errorf("--timeout must be > 0 (got %s)", o.timeout))
	}
	return nil
}

// conn dials the resolved address (see dial). grpc.NewClient does not
// connect yet, so this fails only on a malformed address or bad TLS files
// (exit 2).
func (o *clientOpts) conn(cmd *cobra.Command) (*grpc.ClientConn, string, error) {
	set := false
	if f := cmd.Flag("addr"); f != nil {
		set = f.Changed
	}
	addr := cliconn.ResolveAddr(o.addr, set)
	cc, err := o.dial(addr, "")
	if err != nil {
		return nil, addr, err
	}
	return cc, addr, nil
}

// call runs one unary RPC with retries on UNAVAILABLE within --timeout.
func (o *clientOpts) call(ctx context.Context, fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	return cliconn.Retry(ctx, min(perCallTimeout, o.timeout), fn)
}

// unaryCall is the plumbing of a client subcommand that makes one unary RPC:
// it checks the flags, then runs check (the command's own arguments; may be
// nil), both exit 2 before any dialing; dials; and calls rpc on the client
// that newClient makes, with retries on UNAVAILABLE within --timeout, under a
// context that SIGINT or SIGTERM cancel. A failed call is mapped to an exit
// code and message by rpcError; what names the object for NOT_FOUND.
func unaryCall[C, R any](cmd *cobra.Command, o *clientOpts, check func() error, newClient func(grpc.ClientConnInterface) C,
	what string, rpc func(ctx context.Context, client C) (R, error)) (R, error) {
	var resp R
	if err := o.check(); err != nil {
		return resp, err
	}
	if check != nil {
		if err := check(); err != nil {
			return resp, err
		}
	}
	cc, addr, err := o.conn(cmd)
	if err != nil {
		return resp, err
	}
	defer cc.Close()
	ctx, stop := signalContext(cmd)
	defer stop()
	client := newClient(cc)
	err = o.call(ctx, func(ctx context.Context) error {
		var err error
		resp, err = rpc(ctx, client)
		return err
	})
	if err != nil {
		var zero R
		return zero, rpcError(err, addr, what)
	}
	return resp, nil
}

// print writes m as JSON with --output json, else calls text with w.
func (o *clientOpts) print(w io.Writer, m proto.Message, text func(w io.Writer)) error {
	if o.output == "json" {
		return printJSON(w, m)
	}
	text(w)
	return nil
}

// signalContext is cancelled on SIGINT or SIGTERM.
func signalContext(cmd *cobra.Command) (context.Context, context.CancelFunc) {
	parent := cmd.Context()
	if parent == nil {
		parent = context.Background()
	}
	return signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
}

// rpcError maps a failed RPC to an exit code and a message. what names the
// object for NOT_FOUND ("job eu-1-abc").
func rpcError(err error, addr, what string) error {
	if err == nil {
		return nil
	}
	// The connection's TLS settings were refused (decided by probing the
	// server, see cliconn.TLSError): nothing was sent.
	var te *cliconn.TLSError
	if errors.As(err, &te) {
		return withCode(exitUnavailable, te)
	}
	st := status.Convert(err)
	msg := st.Message()
	switch st.Code() {
	case codes.NotFound:
		if what != "" {
			return withCode(exitInvalid, fmt.Errorf("%s not found", what))
		}
		return withCode(exitInvalid, fmt.Errorf("not found: %s", msg))
	case codes.InvalidArgument:
		return withCode(exitInvalid, fmt.Errorf("rejected by the server: %s", withViolations(msg, st)))
	case codes.AlreadyExists:
		return withCode(exitInvalid, fmt.Errorf("already exists: %s", msg))
	case codes.FailedPrecondition:
		return withCode(exitInvalid, fmt.Errorf("refused: %s", withViolations(msg, st)))
	case codes.OutOfRange:
		return withCode(exitInvalid, fmt.Errorf("out of range: %s", msg))
	case codes.Unauthenticated:
		if strings.HasPrefix(msg, cliconn.TokenRefusedPrefix) {
			return withCode(exitInvalid, errors.New(msg)) // this CLI's own refusal: nothing was sent
		}
		if strings.Contains(msg, acl.EnvToken) { // the region's message says what to set already
			return withCode(exitInvalid, fmt.Errorf("not allowed: %s", msg))
		}
		return withCode(exitInvalid, fmt.Errorf("not allowed: %s\nhint: %s", msg, cliconn.TokenHint))
	case codes.PermissionDenied:
		if strings.Contains(msg, "needs a management token") {
			return withCode(exitInvalid, fmt.Errorf("not allowed: %s\nhint: %s", msg, managementHint))
		}
		return withCode(exitInvalid, fmt.Errorf("not allowed: %s\nhint: %s", msg, permissionHint))
	case codes.Canceled:
		return withCode(exitInterrupted, errors.New("interrupted"))
	case codes.Unimplemented:
		return withCode(exitInvalid, fmt.Errorf("the server at %s does not serve this command (%s); a global router serves job, "+
			"region list and node list/quarantine/release, a region's coordinators serve job, node, region list, region status and region shards", addr, msg))
	case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted:
		var re *cliconn.RetryError
		detail := msg
		if errors.As(err, &re) {
			detail = re.Error()
		}
		if re != nil && re.Refused {
			return withCode(exitUnavailable, fmt.Errorf("the apiary API at %s is unavailable: nothing answers there (%s); "+
				"nothing was sent. Is the address right? It comes from --addr or $%s", addr, detail, cliconn.EnvAddr))
		}
		state := map[codes.Code]string{codes.Unavailable: "is unavailable", codes.DeadlineExceeded: "did not answer in time",
			codes.ResourceExhausted: "is overloaded"}[st.Code()]
		if st.Code() == codes.Unavailable && !cliconn.NotConnected(err) {
			// The server answered, and says what is unavailable behind it
			// (a region that is down, a standby that did not answer):
			// the address is not the problem.
			return withCode(exitUnavailable, fmt.Errorf("the apiary API at %s answered that it cannot do this now: %s; retry later", addr, detail))
		}
		return withCode(exitUnavailable, fmt.Errorf("the apiary API at %s %s: %s (the address comes from --addr or $%s)",
			addr, state, detail, cliconn.EnvAddr))
	}
	return withCode(exitUnavailable, fmt.Errorf("server error at %s (%s): %s", addr, st.Code(), msg))
}

// permissionHint follows a PERMISSION_DENIED answer: the token (or the
// certificate) is known but may not do this.
const permissionHint = "with ACLs on, the token in --token or $" + acl.EnvToken + " may not do this: ask an operator for a policy that grants it " +
	"(`apiary acl policy apply`, then a token with it: `apiary acl token create --policy P`), or use another token"

// managementHint follows a PERMISSION_DENIED answer for a call only a
// management token may make (ACL administration): no policy grants it.
const managementHint = "only a management token may do this (no policy grants it): use the bootstrap token or one made with " +
	"`apiary acl token create --type management`"

// withViolations appends BadRequest / PreconditionFailure details that the
// message does not already say.
func withViolations(msg string, st *status.Status) string {
	var b strings.Builder
	b.WriteString(msg)
	add := func(field, desc string) {
		line := desc
		if field != "" {
			line = field + ": " + desc
		}
		if !strings.Contains(msg, line) {
			b.WriteString("\n  " + line)
		}
	}
	for _, d := range st.Details() {
		switch x := d.(type) {
		case *errdetails.BadRequest:
			for _, v := range x.GetFieldViolations() {
				add(v.GetField(), v.GetDescription())
			}
		case *errdetails.PreconditionFailure:
			for _, v := range x.GetViolations() {
				add(v.GetSubject(), v.GetDescription())
			}
		}
	}
	return b.String()
}

// printJSON writes m as one protojson object, with the proto (snake_case)
// field names that the job file uses too, and every field, zero values
// included (shard 0, task index 0, 0 pending), so that scripts find them.
func printJSON(w io.Writer, m proto.Message) error {
	b, err := protojson.MarshalOptions{Multiline: true, Indent: "  ", UseProtoNames: true, EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}

func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
}

// cell makes a value safe for one tabwriter cell: one line, no tabs, bounded.
func cell(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if s == "" {
		return "-"
	}
	if max > 0 && len(s) > max {
		s = s[:max-3] + "..."
	}
	return s
}

func fmtTime(ms int64) string {
	if ms <= 0 {
		return "-"
	}
	t := time.UnixMilli(ms)
	age := time.Since(t).Round(time.Second)
	if age >= 0 && age < 48*time.Hour {
		return fmt.Sprintf("%s (%s ago)", t.Local().Format("2006-01-02 15:04:05"), age)
	}
	return t.Local().Format("2006-01-02 15:04:05")
}

func fmtLabels(m map[string]string) string {
	if len(m) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + m[k]
	}
	return strings.Join(parts, ",")
}
