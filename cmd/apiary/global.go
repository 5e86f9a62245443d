package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"apiary.dev/apiary/global/registry"
	"apiary.dev/apiary/global/router"
	"apiary.dev/apiary/internal/authz"
	"apiary.dev/apiary/internal/federation"
	"apiary.dev/apiary/internal/lifecycle"
	"apiary.dev/apiary/internal/pki"
	"apiary.dev/apiary/internal/sovereignty"
	"apiary.dev/apiary/internal/telemetry"
)

func init() { register(newGlobalCmd) }

func newGlobalCmd() *cobra.Command {
	var (
		listen, wanBind, wanAdvertise, name string
		wanJoin                             []string
		policyPath, ready, logFormat        string
		tel                                 telemetryFlags
		tlsf                                serverTLSFlags
		gossipf                             gossipFlags
	)
	cmd := &cobra.Command{
		Use:   "global",
		Short: "Run a global router: JobService in front of every region (stateless)",
		Long: `Run a global router. It joins the serf WAN pool that the regional
coordinators join (--wan-join), keeps a live view of the regions (up while one
coordinator is alive and answers), reads the sovereignty policy (--policy) and
serves JobService: a submission goes to the best eligible region; a job no
region may run is refused with a reason per region; status, cancel, watch and
logs go to the region in the job id; list fans out. Any number of routers may
run; they keep no state.

ACL tokens (regions started with --acl): the router checks no token and holds
none; every call it forwards carries the caller's token ($APIARY_TOKEN), which
the regions check. It serves ACLService too: a bootstrap, a token or a policy
goes to every region with the same ids, so one token works everywhere (a
token is made in every region or in none).

With --tls-ca, --tls-cert and --tls-key (a router certificate: apiary tls
cert create --role router --id NAME), the API serves mutual TLS to client
certificates only, and the router reaches each region's coordinators with
its certificate, verifying region.<region>.apiary. Without TLS it refuses to
start unless --insecure-dev says so.`,
		Example: `  apiary global --policy deploy/policy.yaml --wan-join 10.0.0.5:7946 --listen 0.0.0.0:7070 \
    --tls-ca apiary-ca.pem --tls-cert global-router-global-1.pem --tls-key global-router-global-1-key.pem`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(logFormat)
			if err != nil {
				return withCode(exitInvalid, err)
			}
			// Every address flag, before anything binds or dials one.
			if err := checkAddrFlags(addrFlag{"listen", listen, listenPort}, addrFlag{"wan-bind", wanBind, listenPort},
				addrFlag{"wan-advertise", wanAdvertise, dialPort}, addrFlag{"metrics-addr", tel.metricsAddr, listenPort}); err != nil {
				return err
			}
			if err := checkJoinList("wan-join", wanJoin); err != nil {
				return withCode(exitInvalid, err)
			}
			tlsR, err := tlsf.load("global", pki.RoleRouter, pki.GlobalRegion, log, fmt.Sprintf(
				"any process that can reach the API (%s) can submit, read and cancel every job of every region", listen))
			if err != nil {
				return err
			}
			gossipKey, err := gossipf.resolve(cmd)
			if err != nil {
				return err
			}
			var pol *sovereignty.Policy
			if policyPath != "" {
				if pol, err = sovereignty.Load(policyPath); err != nil {
					return withCode(exitInvalid, fmt.Errorf("--policy: %w", err))
				}
			} else {
				log.Warn("no --policy: a job's jurisdiction must equal its region's, nothing more")
			}
			lis, err := net.Listen("tcp", listen)
			if err != nil {
				// The address is well formed (checked above): taken, or
				// not this host's, which a restart may cure (exit 3).
				return withCode(exitUnavailable, fmt.Errorf("--listen: %w", err))
			}
			if name == "" {
				host, _ := os.Hostname()
				name = fmt.Sprintf("global.%s.%s", host, lis.Addr()) // no '/': memberlist reads "name/addr"
			}
			defer lis.Close()
			reg, err := registry.Open(registry.Config{Name: name, Bind: wanBind, Advertise: wanAdvertise, Join: wanJoin,
				Logger: log.With("component", "wan"), TLS: tlsR,
				Gossip: federation.Gossip{Key: gossipKey, KeyringFile: gossipf.file}})
			if err != nil {
				return withCode(exitInvalid, err)
			}
			if tlsR != nil && !reg.GossipEncrypted() {
				log.Warn("gossip is unencrypted: TLS is on but the serf WAN pool runs without a key, so anyone who can reach " +
					"--wan-bind can join it and announce a region; give every router and coordinator --gossip-key (README, \"Gossip encryption\")")
			}
			tp, stopTracing, err := tel.setup("apiary-global", name)
			if err != nil {
				return withCode(exitInvalid, err)
			}
			defer stopTracing()
			metrics := telemetry.NewRegistry()
			serfMembers := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "apiary_serf_members",
				Help: "serf pool members by pool (wan) and state (alive, leaving, left, failed)."}, []string{"pool", "state"})
			metrics.MustRegister(serfMembers)
			rt, err := router.New(router.Config{View: reg, Policy: pol, Logger: log, Tracer: tp, Metrics: metrics})
			if err != nil {
				return err
			}
			sopts := []grpc.ServerOption{grpc.MaxRecvMsgSize(16 << 20)}
			if tlsR != nil {
				// Mutual TLS, and the authorization gate first in the
				// chain: the router serves client certificates only.
				pol := authz.Policy{Role: pki.RoleRouter, Region: pki.GlobalRegion, Logger: log, Registerer: metrics}
				if err := pol.Validate(); err != nil {
					return withCode(exitInvalid, err)
				}
				sopts = append(sopts, pki.ServerCredentials(tlsR),
					grpc.ChainUnaryInterceptor(pol.UnaryInterceptor()), grpc.ChainStreamInterceptor(pol.StreamInterceptor()))
			}
			if h := telemetry.GRPCServerHandler(tp); h != nil {
				sopts = append(sopts, grpc.StatsHandler(h))
			}
			srv := grpc.NewServer(sopts...)
			hs := health.NewServer()
			healthpb.RegisterHealthServer(srv, hs)
			rt.Register(srv) // JobService, AdminService and ACLService (global/router)

			// The router's parts, started in this order and stopped in
			// reverse (internal/lifecycle); a part that fails stops the
			// process with exit 3.
			var parts []lifecycle.Part
			if tlsR != nil {
				// Follows the certificate files; new connections (served
				// and dialed) use what it loaded.
				parts = append(parts, lifecycle.Loop("tls", tlsR.Run))
			}
			parts = append(parts,
				// The WAN member: joins (retried for as long as the router
				// runs), probes coordinators, leaves the pool on stop.
				lifecycle.New("registry", reg.Service()),
				lifecycle.Loop("serf-metrics", func(ctx context.Context) {
					t := time.NewTicker(2 * time.Second)
					defer t.Stop()
					for {
						serfMembers.Reset()
						for state, n := range federation.MemberCounts(reg.Serf()) {
							serfMembers.WithLabelValues("wan", state).Set(float64(n))
						}
						select {
						case <-ctx.Done():
							return
						case <-t.C:
						}
					}
				}),
			)
			if tel.metricsAddr != "" {
				var ms *telemetry.Server
				parts = append(parts, lifecycle.Idle("metrics", func(context.Context) (err error) {
					ms, err = telemetry.Serve(tel.metricsAddr, metrics, true)
					return err
				}, func() error { return ms.Close() }))
			}
			parts = append(parts,
				lifecycle.GRPC("api", srv, lis, 2*time.Second),
				lifecycle.Idle("ready", func(context.Context) error {
					log.Info("global router serving", "api", lis.Addr().String(), "wan", reg.WANAddr(), "join", wanJoin, "policy", policyPath)
					if ready == "" {
						return nil
					}
					b := fmt.Sprintf("{\"api\": %q, \"wan\": %q}\n", lis.Addr().String(), reg.WANAddr())
					return writeFileAtomic(ready, []byte(b))
				}, nil),
			)
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if err := lifecycle.Run(ctx, log, 0, parts...); err != nil {
				return withCode(exitUnavailable, err)
			}
			log.Info("global router stopped")
			return nil
		},
	}
	f := cmd.Flags()
	tel.add(cmd)
	f.StringVar(&listen, "listen", "127.0.0.1:7070", "gRPC API listen address (JobService, AdminService, ACLService)")
	f.StringVar(&wanBind, "wan-bind", "127.0.0.1:7946", "serf WAN pool listen host:port (port 0 picks one)")
	f.StringVar(&wanAdvertise, "wan-advertise", "", "serf WAN address others reach this router at (default --wan-bind)")
	f.StringSliceVar(&wanJoin, "wan-join", nil, "WAN pool members to join (coordinators or other routers), host:port; retried every second")
	f.StringVar(&name, "name", "", "unique member name in the WAN pool (default global.<host>.<listen>)")
	f.StringVar(&policyPath, "policy", "", "sovereignty policy file (strict YAML; see deploy/policy.yaml)")
	f.StringVar(&ready, "ready-file", "", `write {"api": ADDR, "wan": ADDR} here once serving`)
	f.StringVar(&logFormat, "log-format", "text", "log format: text or json")
	tlsf.add(cmd)
	gossipf.add(cmd, "where serf keeps the WAN member's gossip keyring, rewritten by every 'apiary keyring' change so that it survives restarts; loaded instead of --gossip-key when it exists (default: none, a rotation lasts until the router stops)")
	return cmd
}
