package main

// apiary health: a container health check and a probe for scripts. A
// scratch image has no shell and no curl, so Docker's HEALTHCHECK, a
// Kubernetes exec probe and a systemd ExecStartPost all run the binary
// itself.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

func init() { register(newHealthCmd) }

func newHealthCmd() *cobra.Command {
	var o clientOpts
	var httpURL, service string
	cmd := &cobra.Command{
		Use:   "health [--addr HOST:PORT | --http URL]",
		Short: "Check that a coordinator, router or agent is serving (exit 0) or not (exit 1; 3: unreachable)",
		Long: `Check one process, once, within --timeout:

  - a coordinator or router: the gRPC health service (grpc.health.v1) at
    --addr, with the same TLS flags as every client command (with mutual TLS
    on, any certificate of the deployment's CA passes: a container can use
    its own);
  - an agent, or any process started with --metrics-addr: GET --http URL
    (e.g. http://127.0.0.1:9100/healthz), which must answer 200.

Exit 0: serving. Exit 1: the process answered, not serving. Exit 2: bad
flags. Exit 3: no answer within --timeout. Made for container health checks
(Docker's HEALTHCHECK, Kubernetes exec probes), since Apiary's image holds
nothing but the binary.`,
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
				return httpHealth(ctx, cmd.OutOrStdout(), httpURL)
			}
			cc, addr, err := o.conn(cmd)
			if err != nil {
				return err
			}
			defer cc.Close()
			resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: service}, grpc.WaitForReady(true))
			if err != nil {
				if c := status.Code(err); c == codes.NotFound || c == codes.Unimplemented {
					// It answered: it serves no such health service.
					return withCode(exitJobFailed, fmt.Errorf("health of %s: %s", addr, status.Convert(err).Message()))
				}
				return withCode(exitUnavailable, fmt.Errorf("health of %s: %w", addr, err))
			}
			if s := resp.GetStatus(); s != healthpb.HealthCheckResponse_SERVING {
				return withCode(exitJobFailed, fmt.Errorf("%s is %s", addr, s))
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: SERVING\n", addr)
			return nil
		},
	}
	o.addFlags(cmd)
	// A health check answers quickly or not at all: 3 s, not the 30 s of
	// the other client commands.
	tf := cmd.PersistentFlags().Lookup("timeout")
	tf.DefValue = "3s"
	_ = tf.Value.Set("3s")
	cmd.Flags().StringVar(&httpURL, "http", "", "check an HTTP endpoint instead (an agent's --metrics-addr /healthz); 200 is healthy")
	cmd.Flags().StringVar(&service, "service", "", "gRPC health service name to check (default: the server as a whole)")
	return cmd
}

func httpHealth(ctx context.Context, out io.Writer, url string) error {
	if !strings.HasPrefix(url, "http://") && !strings.HasPrefix(url, "https://") {
		return withCode(exitInvalid, fmt.Errorf("--http: %q is not an http:// or https:// URL", url))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return withCode(exitInvalid, fmt.Errorf("--http: %w", err))
	}
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return withCode(exitUnavailable, fmt.Errorf("health of %s: %w", url, err))
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return withCode(exitJobFailed, fmt.Errorf("%s answered %s: %s", url, resp.Status, strings.TrimSpace(string(body))))
	}
	fmt.Fprintf(out, "%s: %s\n", url, strings.TrimSpace(string(body)))
	return nil
}
