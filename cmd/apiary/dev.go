package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"apiary.dev/apiary/agent"
	"apiary.dev/apiary/internal/acl"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/federation"
	"apiary.dev/apiary/internal/sovereignty"
	"apiary.dev/apiary/internal/telemetry"
	"apiary.dev/apiary/regional"
)

func init() { register(newDevCmd) }

// devReady is the --ready-file document.
type devReady struct {
	GlobalAddr string          `json:"global_addr"`
	Regions    []devReadyEntry `json:"regions"`
	// AgentCPUMillis and AgentMemoryMB are the capacity each agent offers.
	AgentCPUMillis int64 `json:"agent_cpu_millis"`
	AgentMemoryMB  int64 `json:"agent_memory_mb"`
	// TLS is the client certificate's files with --tls (absent without).
	TLS *devReadyTLS `json:"tls,omitempty"`
	// ACLTokenFile holds the management token's secret with --tls, which
	// runs the regions with ACLs (absent without).
	ACLTokenFile string `json:"acl_token_file,omitempty"`
}

// devReadyTLS names the files a client passes as --tls-ca, --tls-cert and
// --tls-key (or APIARY_CACERT, APIARY_CLIENT_CERT, APIARY_CLIENT_KEY).
type devReadyTLS struct {
	CA   string `json:"ca"`
	Cert string `json:"cert"`
	Key  string `json:"key"`
}

type devReadyEntry struct {
	Name string `json:"name"`
	Addr string `json:"addr"`
}

func newDevCmd() *cobra.Command {
	var (
		regions     []string
		agents      int
		coords      int
		dataDir     string
		readyFile   string
		agentCPU    int64
		agentMemory int64
		policyPath  string
		maxPending  string
		tlsOn       bool
	)
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run a whole federation on loopback: a global router, regions, coordinators and agents as subprocesses",
		Long: `Run Apiary on this machine for development: one global router and every
region's coordinators (embedded etcd) and agents are real subprocesses of this
binary on loopback ports, with data under --data-dir (a temp dir by default,
removed on exit). The coordinators and the router form a serf WAN pool; the
router applies the sovereignty policy (--policy, default: the built-in copy of
deploy/policy.yaml). Every process listens on 127.0.0.1 on a port from
20000-31999, below Linux's ephemeral port range. The agents share this host:
each offers an equal share of its CPUs and memory (1/N of each with N agents
in all) unless --agent-cpu-millis or --agent-memory-mb set it. Point clients
at the router's address (printed, and global_addr in --ready-file). Ctrl-C or
SIGTERM stops everything.

Without --tls every process runs with --insecure-dev (plaintext: anything on
this machine can call them) and without ACLs. With --tls, a CA and a
certificate per process are made under --data-dir/tls, the serf pools are
encrypted with a fresh gossip key, every process runs with mutual TLS (etcd
included), and the client certificate's files are printed as export lines
for APIARY_CACERT, APIARY_CLIENT_CERT and APIARY_CLIENT_KEY (and written to
"tls" in --ready-file). --tls also turns ACLs on: the regions run with --acl,
the ACL system is bootstrapped through the router, every agent joins with a
join token of its own (bound to its node id), and the management token is
printed as an export line for APIARY_TOKEN and written to
--data-dir/acl/management.token (mode 0600; "acl_token_file" in
--ready-file).`,
		Example: `  apiary dev --ready-file /tmp/apiary.json
  apiary dev --tls --data-dir /tmp/apiary-dev
  apiary dev --regions eu-west:eu --agents-per-region 4 --coordinators-per-region 3`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if agents < 0 || agents > 64 {
				return withCode(exitInvalid, fmt.Errorf("--agents-per-region: must be in 0..64, got %d", agents))
			}
			if coords != 1 && coords != 3 && coords != 5 {
				return withCode(exitInvalid, fmt.Errorf("--coordinators-per-region: must be 1, 3 or 5, got %d", coords))
			}
			if len(regions) == 0 {
				return withCode(exitInvalid, fmt.Errorf("--regions: at least one region is required"))
			}
			if agentCPU < 0 || agentMemory < 0 {
				return withCode(exitInvalid, fmt.Errorf("--agent-cpu-millis and --agent-memory-mb: must be >= 0 (0: an equal share of this host), got %d and %d", agentCPU, agentMemory))
			}
			if n := int64(agents * len(regions)); n > 0 && (agentCPU == 0 || agentMemory == 0) {
				host, err := agent.HostCapacity()
				if err != nil && agentMemory == 0 {
					return withCode(exitInvalid, fmt.Errorf("--agent-memory-mb: not given and this host's memory not detected: %w", err))
				}
				if agentCPU == 0 {
					agentCPU = max(host.CPUMillis/n, 1)
				}
				if agentMemory == 0 {
					agentMemory = max(host.MemoryMB/n, 1)
				}
			}
			bin, err := os.Executable()
			if err != nil {
				return err
			}
			tmp := dataDir == ""
			if tmp {
				if dataDir, err = os.MkdirTemp("", "apiary-dev-"); err != nil {
					return err
				}
				defer os.RemoveAll(dataDir)
			}
			if _, err := regional.ParseBacklogBounds(maxPending); err != nil {
				return withCode(exitInvalid, fmt.Errorf("--%w", err))
			}
			if readyFile != "" {
				// A ready file left by an earlier run would point a script
				// that waits for it at addresses nothing serves any more.
				if err := os.Remove(readyFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
					return fmt.Errorf("--ready-file: %w", err)
				}
				defer os.Remove(readyFile)
			}
			if err := os.MkdirAll(dataDir, 0o755); err != nil {
				return err
			}
			// Absolute: the certificate paths printed for the CLI hold
			// from any directory.
			if dataDir, err = filepath.Abs(dataDir); err != nil {
				return err
			}
			if policyPath == "" {
				policyPath = filepath.Join(dataDir, "policy.yaml")
				if err := os.WriteFile(policyPath, []byte(sovereignty.DefaultYAML), 0o644); err != nil {
					return err
				}
			} else if _, err := sovereignty.Load(policyPath); err != nil {
				return withCode(exitInvalid, fmt.Errorf("--policy: %w", err))
			} else if policyPath, err = filepath.Abs(policyPath); err != nil {
				return err
			}
			opts := devcluster.Options{Binary: bin, Dir: dataDir, Global: &devcluster.GlobalSpec{PolicyFile: policyPath}, TLS: tlsOn, ACL: tlsOn}
			if tlsOn {
				// With TLS the serf pools are encrypted too (one key for
				// this dev cluster's processes, never printed).
				key, err := federation.GenerateGossipKey()
				if err != nil {
					return withCode(exitUnavailable, fmt.Errorf("gossip key: %w", err))
				}
				opts.GossipKey = key
			}
			// Every process appends its spans to one file (apiary trace reads it).
			traceFile := filepath.Join(dataDir, "traces.jsonl")
			opts.ExtraEnv = append(opts.ExtraEnv, telemetry.EnvTraceFile+"="+traceFile)
			for i, r := range regions {
				name, jur, _ := strings.Cut(r, ":")
				if !regionNameRE.MatchString(name) {
					return withCode(exitInvalid, fmt.Errorf("--regions[%d]: %q must be name[:jurisdiction] with name of [a-z0-9-]", i, r))
				}
				rs := devcluster.RegionSpec{Name: name, Jurisdiction: jur, Coordinators: coords,
					Labels: map[string]string{"jurisdiction": jur, "tier": "standard"}}
				if maxPending != "" {
					rs.ExtraArgs = append(rs.ExtraArgs, "--max-pending", maxPending)
				}
				for a := 0; a < agents; a++ {
					class := "cloud"
					if a%2 == 1 {
						class = "edge"
					}
					rs.Agents = append(rs.Agents, devcluster.AgentSpec{
						ID: fmt.Sprintf("%s-n%d", name, a+1),
						Labels: map[string]string{"zone": fmt.Sprintf("%s-%c", name, 'a'+a%3), "class": class,
							"arch": runtime.GOARCH, "disk": "ssd"},
						CPUMillis: agentCPU, MemoryMiB: agentMemory,
					})
				}
				opts.Regions = append(opts.Regions, rs)
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()
			fmt.Fprintf(os.Stderr, "starting %d region(s) under %s ...\n", len(opts.Regions), dataDir)
			cl, err := devcluster.Start(sctx, opts)
			if err != nil {
				return withCode(exitUnavailable, err)
			}
			defer cl.Stop()
			ready := devReady{GlobalAddr: cl.GlobalAddr, AgentCPUMillis: agentCPU, AgentMemoryMB: agentMemory}
			if cl.TLS() {
				f := cl.ClientTLS()
				ready.TLS = &devReadyTLS{CA: f.CA, Cert: f.Cert, Key: f.Key}
			}
			ready.ACLTokenFile = cl.ManagementTokenFile()
			fmt.Fprintf(os.Stderr, "global router  api %s  wan %s  policy %s  log %s\n", cl.GlobalAddr, cl.GlobalWAN, policyPath, cl.Global.LogPath)
			for _, r := range cl.Regions {
				ready.Regions = append(ready.Regions, devReadyEntry{Name: r.Spec.Name, Addr: r.Addr()})
				fmt.Fprintf(os.Stderr, "region %-10s jurisdiction %-4s api %s  agents %d  logs %s/%s-*.log\n",
					r.Spec.Name, r.Spec.Jurisdiction, r.Addr(), len(r.Agents), dataDir, r.Spec.Name)
			}
			if n := agents * len(regions); n > 0 {
				fmt.Fprintf(os.Stderr, "each of the %d agents offers %d millicores and %d MiB (--agent-cpu-millis, --agent-memory-mb; default: 1/%d of this host)\n",
					n, agentCPU, agentMemory, n)
			}
			if readyFile != "" {
				b, _ := json.MarshalIndent(ready, "", "  ")
				if err := os.MkdirAll(filepath.Dir(readyFile), 0o755); err != nil {
					return err
				}
				if err := writeFileAtomic(readyFile, append(b, '\n')); err != nil {
					return err
				}
			}
			fmt.Fprintf(os.Stderr, "spans of every process go to %s; export %s=%s, then apiary trace JOB_ID\n", traceFile, telemetry.EnvTraceFile, traceFile)
			if cl.TLS() {
				f := cl.ClientTLS()
				fmt.Fprintf(os.Stderr, "mutual TLS on every process (certificates in %s); the CLI needs the client certificate:\n", cl.PKI().Dir)
				for _, e := range devcluster.Env(f) {
					fmt.Fprintf(os.Stderr, "  export %s\n", e)
				}
				if cl.ACL() {
					fmt.Fprintf(os.Stderr, "ACLs on in every region (agents joined with join tokens); the management token (also in %s):\n", cl.ManagementTokenFile())
					fmt.Fprintf(os.Stderr, "  export %s=%s\n", acl.EnvToken, cl.ManagementToken())
				}
			} else {
				fmt.Fprintln(os.Stderr, "every process runs WITHOUT TLS (--insecure-dev): anything on this machine can call them; apiary dev --tls runs them with mutual TLS")
			}
			fmt.Fprintf(os.Stderr, "ready; try: APIARY_ADDR=%s apiary job run examples/hello.yaml --wait\n", cl.GlobalAddr)
			<-ctx.Done()
			fmt.Fprintln(os.Stderr, "stopping ...")
			return nil
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&regions, "regions", []string{"eu-west:eu", "us-east:us"}, "regions as name:jurisdiction")
	f.IntVar(&agents, "agents-per-region", 2, "agents per region")
	f.IntVar(&coords, "coordinators-per-region", 1, "coordinators (etcd members) per region: 1, 3 or 5")
	f.StringVar(&dataDir, "data-dir", "", "data directory (default: a temp dir removed on exit)")
	f.StringVar(&readyFile, "ready-file", "", `write {"global_addr", "regions":[{"name","addr"}]} here once every part answers`)
	f.Int64Var(&agentCPU, "agent-cpu-millis", 0, "CPU capacity of each dev agent in millicores (0: this host's CPUs x 1000 / the number of agents)")
	f.Int64Var(&agentMemory, "agent-memory-mb", 0, "memory capacity of each dev agent in MiB (0: this host's MemTotal / the number of agents)")
	f.StringVar(&policyPath, "policy", "", "sovereignty policy file for the router and coordinators (default: built-in copy of deploy/policy.yaml)")
	f.StringVar(&maxPending, "max-pending", "", "backlog bound per priority class of every region (see apiary region --max-pending)")
	f.BoolVar(&tlsOn, "tls", false, "run every process with mutual TLS and the regions with ACLs: certificates made under --data-dir/tls, the management token in --data-dir/acl; export lines for the CLI are printed (default: --insecure-dev, plaintext, no ACLs)")
	return cmd
}

func writeFileAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

var regionNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
