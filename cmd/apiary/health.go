package main

// apiary health: a container health check and a probe for scripts. A
// scratch image has no shell and no curl, so Docker's HEALTHCHECK, a
// Kubernetes exec probe and a systemd ExecStartPost all run the binary
// itself.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"apiary.dev/apiary/internal/cliconn"
)

func init() { register(newHealthCmd) }

func newHealthCmd() *cobra.Command {
	var o clientOpts
	var httpURL, service string
	cmd := &cobra.Command{
		Use:   "health [--addr HOST:PORT[,HOST:PORT...] | --http URL]",
		Short: "Check that a coordinator, router or agent is serving (exit 0) or not (exit 1; 3: unreachable)",
		Long: `Check processes, once, within --timeout:

  - a coordinator or router: the gRPC health service (grpc.health.v1) at
    --addr, with the same TLS flags as every client command (with mutual TLS
    on, any certificate of the deployment's CA passes: a container can use
    its own). A coordinator says NOT_SERVING while its region's etcd answers
    none of its reads (a member cut off from its quorum): this is a
    readiness check, which a process that is alive fails.
    A list (A,B,C) checks every address, each on its own connection, and
    passes only when every one serves; each is reported.
  - any process started with --metrics-addr (coordinator, router, agent):
    GET --http URL, e.g. http://127.0.0.1:9100/healthz, which must answer
    200. /healthz answers while the process runs and serves HTTP, whatever
    the state of its region: this is a liveness check (the one for a
    Kubernetes livenessProbe, which restarts the container when it fails).
    An https:// URL is checked with --tls-ca, --tls-cert and --tls-key
    (or their $APIARY_* variables; none: the system's CAs, no client
    certificate) and --tls-server-name; the TLS flags with an http:// URL
    are refused.

Exit 0: serving (every address of a list). Exit 1: answered, not serving
(at least one address of a list, all of which answered). Exit 2: bad flags.
Exit 3: no answer within --timeout (at least one address of a list). Made
for container health checks (Docker's HEALTHCHECK, Kubernetes exec probes),
since Apiary's image holds nothing but the binary.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.check(); err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
			defer cancel()
			if httpURL != "" {
				if cmd.Flag("addr").Changed {
					return withCode(exitInvalid, errors.New("--http and --addr: give one"))
				}
				if cmd.Flag("service").Changed {
					return withCode(exitInvalid, errors.New("--service: names a gRPC health service; not with --http"))
				}
				return httpHealth(ctx, cmd, &o, httpURL)
			}
			return grpcHealth(ctx, cmd, &o, service)
		},
	}
	o.addFlags(cmd)
	// A health check answers quickly or not at all: 3 s, not the 30 s of
	// the other client commands.
	tf := cmd.PersistentFlags().Lookup("timeout")
	tf.DefValue = "3s"
	_ = tf.Value.Set("3s")
	cmd.Flags().StringVar(&httpURL, "http", "", "check an HTTP endpoint instead: a process's --metrics-addr /healthz (liveness); 200 is healthy; https:// uses the --tls-* flags")
	cmd.Flags().StringVar(&service, "service", "", "gRPC health service name to check (default: the server as a whole)")
	return cmd
}

// healthResult is one address's answer: code 0 serving, exitJobFailed
// answered not serving, exitUnavailable no answer.
type healthResult struct {
	addr string
	code int
	err  error
}

// grpcHealth checks every address of --addr (or $APIARY_ADDR), each on a
// connection of its own (one connection to a list would be balanced over
// whichever answer, and pass while any one serves), and passes only when
// all serve. The exit code is the worst answer: 3 if any gave none, else 1
// if any is not serving.
func grpcHealth(ctx context.Context, cmd *cobra.Command, o *clientOpts, service string) error {
	list := cliconn.ResolveAddr(o.addr, cmd.Flag("addr").Changed)
	addrs, err := cliconn.SplitAddrs(list)
	if err != nil {
		return withCode(exitInvalid, fmt.Errorf("--addr: %w", err))
	}
	conns := make([]*grpc.ClientConn, len(addrs))
	for i, a := range addrs {
		if conns[i], err = o.dial(a, ""); err != nil {
			return err
		}
		defer conns[i].Close()
	}
	res := make([]healthResult, len(addrs))
	var wg sync.WaitGroup
	for i, a := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i] = checkOne(ctx, conns[i], a, service)
		}()
	}
	wg.Wait()
	code := exitOK
	var failed []string
	for _, r := range res {
		if r.code == exitOK {
			fmt.Fprintf(cmd.OutOrStdout(), "%s: SERVING\n", r.addr)
			continue
		}
		failed = append(failed, r.err.Error())
		code = max(code, r.code) // exitUnavailable (3) over exitJobFailed (1)
	}
	switch {
	case len(failed) == 0:
		return nil
	case len(addrs) == 1:
		return withCode(code, errors.New(failed[0]))
	default:
		return withCode(code, fmt.Errorf("%d of %d addresses not serving: %s", len(failed), len(addrs), strings.Join(failed, "; ")))
	}
}

func checkOne(ctx context.Context, cc *grpc.ClientConn, addr, service string) healthResult {
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: service}, grpc.WaitForReady(true))
	if err != nil {
		if c := status.Code(err); c == codes.NotFound || c == codes.Unimplemented {
			// It answered: it serves no such health service.
			return healthResult{addr, exitJobFailed, fmt.Errorf("health of %s: %s", addr, status.Convert(err).Message())}
		}
		return healthResult{addr, exitUnavailable, fmt.Errorf("health of %s: %w", addr, err)}
	}
	if s := resp.GetStatus(); s != healthpb.HealthCheckResponse_SERVING {
		return healthResult{addr, exitJobFailed, fmt.Errorf("%s is %s", addr, s)}
	}
	return healthResult{addr, exitOK, nil}
}

// httpHealth GETs raw: 200 passes. An https:// URL is dialed with the
// TLS files of the flags or the environment (none: the system's CAs) and
// --tls-server-name (default: the URL's host); TLS flags given with an
// http:// URL are refused rather than ignored.
func httpHealth(ctx context.Context, cmd *cobra.Command, o *clientOpts, raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return withCode(exitInvalid, fmt.Errorf("--http: %q is not an http:// or https:// URL", raw))
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil // a health check asks the process itself, never a proxy
	if u.Scheme == "http" {
		var given []string
		for _, f := range []string{"tls-ca", "tls-cert", "tls-key", "tls-server-name"} {
			if cmd.Flag(f).Changed {
				given = append(given, "--"+f)
			}
		}
		if len(given) > 0 {
			return withCode(exitInvalid, fmt.Errorf("%s: given with --http %s, which is plaintext: give an https:// URL, or drop them",
				strings.Join(given, ", "), raw))
		}
	} else {
		files, err := cliconn.ResolveTLS(o.tls)
		if err != nil {
			return withCode(exitInvalid, err)
		}
		name := o.serverName
		if name == "" {
			name = os.Getenv(cliconn.EnvTLSServerName)
		}
		if name == "" {
			name = u.Hostname()
		}
		if !files.Empty() {
			r, err := files.Load()
			if err != nil {
				return withCode(exitInvalid, fmt.Errorf("%w (the files come from --tls-ca/--tls-cert/--tls-key or $%s/$%s/$%s)",
					err, cliconn.EnvCACert, cliconn.EnvClientCert, cliconn.EnvClientKey))
			}
			tr.TLSClientConfig = r.ClientTLSConfig(name)
		} else {
			tr.TLSClientConfig = &tls.Config{ServerName: name, MinVersion: tls.VersionTLS12}
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, raw, nil)
	if err != nil {
		return withCode(exitInvalid, fmt.Errorf("--http: %w", err))
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return withCode(exitUnavailable, fmt.Errorf("health of %s: %w", raw, err))
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return withCode(exitJobFailed, fmt.Errorf("%s answered %s: %s", raw, resp.Status, strings.TrimSpace(string(body))))
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", raw, strings.TrimSpace(string(body)))
	return nil
}
