package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"apiary.dev/apiary/internal/jobspec"
	"apiary.dev/apiary/internal/lifecycle"
	"apiary.dev/apiary/internal/pki"
	"apiary.dev/apiary/internal/telemetry"
	"apiary.dev/apiary/placement"
	"apiary.dev/apiary/placement/sim"
	"apiary.dev/apiary/regional"
	"apiary.dev/apiary/regional/nodehealth"
	"apiary.dev/apiary/regional/scheduler"
	"apiary.dev/apiary/shards"
)

func init() { register(newRegionCmd) }

// regionStartTimeout bounds a coordinator's start-up (etcd waits for a
// quorum of --initial-cluster); it does not bound the running parts.
const regionStartTimeout = 60 * time.Second

// readWorkload reads the task list CSV --gpu-workload names (the Alibaba GPU
// trace's pod format) and measures its GPU task mix for the fragmentation
// policy, one class per GPU request shape (placement.WorkloadByGPUShape). A
// malformed row is an error naming its line; a file without GPU tasks is an
// error.
func readWorkload(path string) ([]placement.WorkloadClass, error) {
	tasks, err := readTraceFile("--gpu-workload", path, sim.ReadTasks)
	if err != nil {
		return nil, err
	}
	wl := placement.WorkloadByGPUShape(tasks)
	if len(wl) == 0 {
		return nil, fmt.Errorf("--gpu-workload: %s: no GPU tasks (num_gpu > 0) to measure a mix from", path)
	}
	return wl, nil
}

func newRegionCmd() *cobra.Command {
	var (
		cfg          regional.Config
		labels       []string
		policy       string
		workloadPath string
		logFormat    string
		ready        string
		debugAddr    string
		tel          telemetryFlags
		etcdOps      etcdOpsFlags
		tlsf         serverTLSFlags
		gossipf      gossipFlags
		schedule     bool
	)
	cmd := &cobra.Command{
		Use:   "region",
		Short: "Run a regional coordinator (embedded etcd member or etcd client + gRPC API + scheduler)",
		Long: `Run one coordinator of a region. All regional state lives in the region's etcd:
a region restarted from the same data dirs loses nothing.

A region has two tiers. The consensus tier is 1, 3 or 5 coordinators that each
embed one etcd member; together they are the region's etcd cluster. Start a
3-member region by giving every member the same --initial-cluster
(name=peerURL,...). The scheduling tier is every coordinator: each one serves
the API and owns about 1/n of the region's shards (n = the live
coordinators), so more coordinators spread the scheduling work. To add
coordinators without adding etcd members (raft gets slower with every member,
and needs a majority of them), start them with --etcd-endpoints, the members'
client URLs: such a coordinator embeds no member, takes its share of the shards
like any other, and can be started and stopped freely. Its --data-dir holds
only its gossip keyrings; it must not be a member's data dir. It needs the
members running: when it cannot reach a quorum of them, its shards move to the
coordinators that can (after --owner-lease-ttl), and it keeps running and takes
a share again when etcd answers. With TLS it dials the members with its own
region certificate (the members accept only certificates of their region).
--etcd-endpoints cannot be combined with --etcd-client-url, --etcd-peer-url,
--initial-cluster, --initial-cluster-state, --etcd-election-ms,
--etcd-heartbeat-ms, --etcd-snapshot-count, --etcd-snapshot-catchup-entries
or the --etcd-quota-mib,
--etcd-compaction-retention and --etcd-defrag-* flags, which configure a
member.

The state's size: etcd's backend quota (--etcd-quota-mib, default 4096),
periodic compaction (--etcd-compaction-retention, default 1h) and the
defragmentation of this coordinator's own member (--etcd-defrag-interval,
default 1h, 0: never; only when the free pages pass both
--etcd-defrag-min-free-percent and --etcd-defrag-min-free-mib, never while
another member defragments or does not answer). 'apiary region snapshot
save' and 'restore' back the state up and bring it back (README.md, "Region
operations").

With --tls-ca, --tls-cert and --tls-key (a region certificate of --region:
apiary tls cert create --role region --region R --id ID), the API serves
mutual TLS and checks every caller's role, and the embedded etcd member's
client and peer URLs are https (default https://127.0.0.1:2379 and :2380)
with the same certificate, open to this region's coordinators only. Without
TLS the coordinator refuses to start unless --insecure-dev says so.

With --acl (Nomad's acl { enabled = true }), every API call also needs an
ACL token ($APIARY_TOKEN) whose policies grant it, per namespace for jobs,
and a node registers only with an agent join token of the region. Start
every coordinator of a region with it, then make the first management token
with apiary acl bootstrap.`,
		Example: `  apiary region --id c1 --region eu-west --jurisdiction eu --data-dir /var/lib/apiary/c1 \
    --tls-ca apiary-ca.pem --tls-cert eu-west-region-c1.pem --tls-key eu-west-region-c1-key.pem
  apiary region --insecure-dev --id c1 --region eu-west --data-dir d1 --listen 127.0.0.1:7071 \
    --etcd-client-url http://127.0.0.1:2379 --etcd-peer-url http://127.0.0.1:2380 \
    --initial-cluster c1=http://127.0.0.1:2380,c2=http://127.0.0.1:2382,c3=http://127.0.0.1:2384
  # a fourth coordinator of that region, in the scheduling tier only (no etcd member):
  apiary region --insecure-dev --id c4 --region eu-west --data-dir d4 --listen 127.0.0.1:7074 \
    --etcd-endpoints http://127.0.0.1:2379,http://127.0.0.1:2381,http://127.0.0.1:2383`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := parseLabels(labels)
			if err != nil {
				return withCode(exitInvalid, err)
			}
			cfg.Labels = l
			cfg.APIOnly = !schedule
			if cfg.FailoverGrace < 0 {
				return withCode(exitInvalid, fmt.Errorf("--failover-grace: must be >= 0 (0: no grace), got %s", cfg.FailoverGrace))
			}
			if cfg.FailoverGrace == 0 {
				cfg.FailoverGrace = -1 // no grace; 0 means the default in regional.Config
			}
			if cfg.DefaultLostAfter <= 0 {
				return withCode(exitInvalid, fmt.Errorf("--default-lost-after: must be > 0, got %s", cfg.DefaultLostAfter))
			}
			if a := cfg.FailoverAfter; a != 0 && (a < jobspec.MinFailoverAfter || a > jobspec.MaxFailoverAfter) {
				return withCode(exitInvalid, fmt.Errorf("--failover-after: must be between 1s and 24h, or 0 (off unless a job asks), got %s", a))
			}
			for _, p := range cfg.FailoverPeers {
				if p == "" || p == cfg.Region {
					return withCode(exitInvalid, fmt.Errorf("--failover-peers: %q is not another region's name", p))
				}
			}
			// regional.Config reads 0 as "the default"; on the command
			// line the defaults are spelled out, so 0 is a mistake.
			for _, q := range []struct {
				flag string
				v    time.Duration
			}{{"--quarantine-window", cfg.Quarantine.Window}, {"--quarantine-probe-after", cfg.Quarantine.ProbeAfter},
				{"--quarantine-max-probe-after", cfg.Quarantine.MaxProbeAfter}} {
				if q.v <= 0 {
					return withCode(exitInvalid, fmt.Errorf("%s: must be > 0, got %s", q.flag, q.v))
				}
			}
			if !(cfg.Quarantine.MaxShare > 0) {
				return withCode(exitInvalid, fmt.Errorf("--quarantine-max-share: must be > 0 and at most 1, got %g (--no-auto-quarantine turns automatic quarantine off)", cfg.Quarantine.MaxShare))
			}
			cfg.SchedulerPolicy = placement.Policy(policy)
			switch cfg.SchedulerPolicy {
			case placement.PolicyBinpack, placement.PolicySpread, placement.PolicyFragmentation:
			default:
				return withCode(exitInvalid, fmt.Errorf("--scheduler: must be binpack, spread or fragmentation, got %q", policy))
			}
			cfg.Logger, err = newLogger(logFormat)
			if err != nil {
				return withCode(exitInvalid, err)
			}
			if workloadPath != "" {
				if cfg.Workload, err = readWorkload(workloadPath); err != nil {
					return withCode(exitInvalid, err)
				}
				cfg.Logger.Info("GPU task mix for the fragmentation policy", "file", workloadPath, "classes", len(cfg.Workload))
			}
			if cfg.ID == "" {
				cfg.ID = cfg.Region + "-1"
			}
			if err := regionEtcdEndpoints(cmd, &cfg); err != nil {
				return err
			}
			// Every address flag, before anything binds or dials one.
			if err := checkRegionAddrs(&cfg, tel.metricsAddr, debugAddr); err != nil {
				return err
			}
			if debugAddr != "" {
				if err := serveDebug(debugAddr); err != nil {
					return withCode(exitInvalid, err)
				}
			}
			if err := etcdOps.apply(&cfg.Etcd); err != nil {
				return err
			}
			if err := regionTLS(cmd, &tlsf, &cfg); err != nil {
				return err
			}
			if cfg.GossipKey, err = gossipf.resolve(cmd); err != nil {
				return err
			}
			cfg.GossipKeyringFile = gossipf.file
			tp, stopTracing, err := tel.setup("apiary-region", cfg.ID)
			if err != nil {
				return withCode(exitInvalid, err)
			}
			defer stopTracing()
			cfg.TracerProvider, cfg.MetricsAddr = tp, tel.metricsAddr
			c, err := regional.New(cfg)
			if err != nil {
				return withCode(exitInvalid, err)
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			// The coordinator's parts, started in this order and stopped in
			// reverse (regional.Coordinator.Parts), then the ready file. The
			// 60 s bound covers the start-up only (etcd waits for a quorum);
			// a part that fails later stops the process with exit 3.
			parts := append(c.Parts(), c.Ready(func() error {
				if ready == "" {
					return nil
				}
				return os.WriteFile(ready, []byte(c.Addr()+"\n"), 0o644)
			}))
			if err := lifecycle.Run(ctx, cfg.Logger, regionStartTimeout, parts...); err != nil {
				return withCode(exitUnavailable, err)
			}
			cfg.Logger.Info("coordinator stopped")
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.ID, "id", "", "coordinator id and etcd member name (default <region>-1)")
	f.StringVar(&cfg.Region, "region", "local", "region name")
	f.StringVar(&cfg.Jurisdiction, "jurisdiction", "", "jurisdiction of the region (e.g. eu)")
	f.StringSliceVar(&labels, "label", nil, "region label k=v (repeatable)")
	f.IntVar(&cfg.ShardCount, "shards", 256, "virtual shards (fixed at region creation)")
	f.StringVar(&cfg.APIAddr, "listen", "127.0.0.1:7070", "gRPC API listen address")
	f.StringVar(&cfg.AdvertiseAddr, "advertise", "", "API address host:port that routers, other coordinators and other regions dial (default: --listen; required when --listen is 0.0.0.0 or [::], as in a container)")
	f.StringVar(&cfg.Etcd.DataDir, "data-dir", "apiary-data", "data directory: the etcd member's data and the gossip keyrings (with --etcd-endpoints: the keyrings only; it must not hold a member's data)")
	f.StringSliceVar(&cfg.Etcd.Endpoints, "etcd-endpoints", nil, "comma-separated client URLs of the region's etcd members (their --etcd-client-url; https:// with TLS): run this coordinator without an embedded member, as a client of those (the scheduling tier grows apart from the consensus tier; see above)")
	f.StringVar(&cfg.Etcd.ClientURL, "etcd-client-url", "http://127.0.0.1:2379", "etcd client URL (listen and advertise); with TLS it must be https://, and the default becomes https://127.0.0.1:2379")
	f.StringVar(&cfg.Etcd.PeerURL, "etcd-peer-url", "http://127.0.0.1:2380", "etcd peer URL (listen and advertise); with TLS it must be https://, and the default becomes https://127.0.0.1:2380")
	f.StringVar(&cfg.Etcd.ListenClientURL, "etcd-listen-client-url", "", "bind the etcd client listener here instead of --etcd-client-url, which is then only advertised (an IP address, e.g. https://0.0.0.0:2379: etcd binds no host name; for a member others reach by name, as in a StatefulSet)")
	f.StringVar(&cfg.Etcd.ListenPeerURL, "etcd-listen-peer-url", "", "bind the etcd peer listener here instead of --etcd-peer-url, which is then only advertised (an IP address, e.g. https://0.0.0.0:2380)")
	f.StringVar(&cfg.Etcd.InitialCluster, "initial-cluster", "", "name=peerURL,... of every member (default: this member alone)")
	f.StringVar(&cfg.Etcd.ClusterState, "initial-cluster-state", "new", "new or existing")
	f.UintVar(&cfg.Etcd.ElectionMs, "etcd-election-ms", 500, "etcd election timeout (ms)")
	f.UintVar(&cfg.Etcd.HeartbeatMs, "etcd-heartbeat-ms", 50, "etcd heartbeat interval (ms)")
	f.Uint64Var(&cfg.Etcd.SnapshotCount, "etcd-snapshot-count", 10000, "applied raft entries between two snapshots of the member (etcd's --snapshot-count); the member keeps its raft log in memory since the last snapshot plus --etcd-snapshot-catchup-entries, so under a high task rate fewer entries mean a smaller heap and more frequent snapshots")
	f.Uint64Var(&cfg.Etcd.SnapshotCatchUpEntries, "etcd-snapshot-catchup-entries", 5000, "raft entries the member keeps after a snapshot for a follower that lags (etcd's --snapshot-catchup-entries); a follower further behind is sent the whole database")
	etcdOps.add(cmd)
	f.DurationVar(&cfg.NodeLeaseTTL, "node-lease-ttl", 2*time.Second, "node lease TTL (whole seconds, >= 1s)")
	f.Float64Var(&cfg.MaxHeartbeatsPerSecond, "max-heartbeats-per-second", regional.DefaultMaxHeartbeatsPerSecond, "the region-wide heartbeat rate node leases are sized for, as Nomad's max_heartbeats_per_second: once the fleet is larger than this rate x 0.5 s, a node that registers heartbeats every nodes / rate seconds with a lease of 4 such intervals (10,000 nodes at 2,000/s: every 5 s, a 20 s lease)")
	f.DurationVar(&cfg.OwnerLeaseTTL, "owner-lease-ttl", 2*time.Second, "the coordinator's session lease TTL, which holds its member key and its shard claims (whole seconds, >= 1s)")
	f.Float64Var(&cfg.LocalityWeight, "locality-weight", 1, "weight of data locality in placement scores, against resource fit's 1: a task with datasets goes to the node holding the most of its input bytes unless that node's fit is worse by more than this weight (the score is in [0, 1] per stage); a negative weight turns locality off")
	f.IntVar(&cfg.MaxPreemptions, "max-preemptions", scheduler.DefaultMaxPreemptions, "preemptors each shard owner commits per scheduling round: a pending task that fits nowhere stops running tasks of lower priority (by at least 10) to make room (docs/architecture.md, \"Preemption\"); -1 turns preemption off")
	f.DurationVar(&cfg.ShardSettle, "shard-settle", shards.DefaultSettle, "how long a coordinator that joins must stay live before shards move to it (a flapping member moves nothing)")
	f.BoolVar(&schedule, "schedule", true, "own a share of the region's shards and schedule them; false: serve the API (and the etcd member) only, owning no shard")
	f.DurationVar(&cfg.SuspectAfter, "suspect-after", 300*time.Millisecond, "take the shards over when the owner's API refuses connections this long (negative: never; with --lan-addr, a failed LAN member still counts)")
	f.StringVar(&cfg.LANAddr, "lan-addr", "", "host:port (UDP and TCP; port 0 picks one) of this coordinator's member of the region's serf LAN pool: peers are found through etcd, agents are told it when they register, and an agent whose member fails has its node epoch ended at once (empty: no LAN pool, leases only)")
	f.DurationVar(&cfg.FailoverGrace, "failover-grace", regional.DefaultFailoverGrace, "for this long after the coordinator starts, as shard owner it replaces no task of a lost node epoch (nor charges its loss), so agents cut off by an outage of the region can reconnect and keep them (0: no grace)")
	f.DurationVar(&cfg.DefaultLostAfter, "default-lost-after", regional.DefaultLostAfter, "how long the tasks of a job with disconnect.replace: false and no lost_after of its own stay on a lost node before they are replaced (keep it equal to the agents' --disconnect-grace)")
	f.DurationVar(&cfg.JobRetention, "job-retention", 24*time.Hour, "keep finished jobs this long, then delete them (negative: forever)")
	f.DurationVar(&cfg.FailoverAfter, "failover-after", 0, "cross-region failover of accepted jobs: how long this region must be down before a standby region runs its jobs that leave failover.after unset; when set (1s..24h), jobs without a failover block fail over too (0: only jobs with one, after 30s). docs/architecture.md, \"Failover of accepted jobs\"")
	f.StringSliceVar(&cfg.FailoverPeers, "failover-peers", nil, "regions this region's jobs may fail over to (comma-separated; empty: every region the sovereignty policy and the job's region selector allow)")
	qd := nodehealth.DefaultConfig()
	f.BoolVar(&cfg.Quarantine.Off, "no-auto-quarantine", false, "never quarantine a node automatically (outcomes are still counted and shown in node list)")
	f.DurationVar(&cfg.Quarantine.Window, "quarantine-window", qd.Window, "how far back attempt outcomes count toward a node's and the region's failure rates")
	f.DurationVar(&cfg.Quarantine.ProbeAfter, "quarantine-probe-after", qd.ProbeAfter, "how long an automatically quarantined node waits for its first canary (doubles with each failed canary, up to --quarantine-max-probe-after)")
	f.DurationVar(&cfg.Quarantine.MaxProbeAfter, "quarantine-max-probe-after", qd.MaxProbeAfter, "longest wait between canaries of a quarantined node")
	f.Float64Var(&cfg.Quarantine.MaxShare, "quarantine-max-share", qd.MaxShare, "largest share of the region's live nodes quarantined automatically at once (at least 1 node, never the last one)")
	f.StringVar(&policy, "scheduler", "binpack", "default placement policy: binpack, spread or fragmentation")
	f.StringVar(&workloadPath, "gpu-workload", "", "task list CSV of the expected GPU task mix for the fragmentation policy (columns name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec, as in the Alibaba GPU trace; default: the trace's own mix)")
	f.StringVar(&logFormat, "log-format", "text", "log format: text or json")
	f.StringVar(&debugAddr, "debug-addr", "", "serve Go pprof at http://ADDR/debug/pprof/ (empty: off)")
	f.StringVar(&ready, "ready-file", "", "write the API address to this file once serving")
	f.BoolVar(&cfg.ACL, "acl", false, "enforce ACL tokens (Nomad's acl { enabled = true }): every API call needs a token ($APIARY_TOKEN) whose policies grant it, per namespace for jobs, and nodes register only with an agent join token of this region; start every coordinator of the region with it, then run 'apiary acl bootstrap' (off: tokens are ignored and the ACL API answers FAILED_PRECONDITION)")
	tel.add(cmd)
	tlsf.add(cmd)
	gossipf.add(cmd, "where serf keeps the LAN pool's gossip keyring (the WAN pool's: this path + \".wan\"), rewritten by every 'apiary keyring' change so that it survives restarts; loaded instead of --gossip-key when it exists (default <data-dir>/"+regional.DefaultGossipKeyringFile+")")
	regionFederationHook(cmd, &cfg) // regionlist.go: --wan-*, --policy, --max-pending; `region list`
	return cmd
}

// memberFlags are the flags that configure an embedded etcd member, which
// --etcd-endpoints (no member) refuses.
var memberFlags = []string{"etcd-client-url", "etcd-peer-url", "initial-cluster", "initial-cluster-state", "etcd-election-ms", "etcd-heartbeat-ms",
	"etcd-snapshot-count", "etcd-snapshot-catchup-entries", "etcd-quota-mib", "etcd-compaction-retention", "etcd-defrag-interval", "etcd-defrag-min-free-percent", "etcd-defrag-min-free-mib"}

// etcdOpsFlags are the embedded member's state-size settings: quota,
// compaction and defragmentation (regional.EtcdConfig; README.md, "Region
// operations").
type etcdOpsFlags struct {
	quotaMiB       int64
	retention      string
	defragInterval time.Duration
	defragPercent  float64
	defragMiB      int64
}

func (e *etcdOpsFlags) add(cmd *cobra.Command) {
	f := cmd.Flags()
	f.Int64Var(&e.quotaMiB, "etcd-quota-mib", regional.DefaultQuotaBytes>>20, "etcd backend quota (MiB; etcd's --quota-backend-bytes): past it etcd refuses every write until the state shrinks (compaction, defragmentation) and the NOSPACE alarm is disarmed")
	f.StringVar(&e.retention, "etcd-compaction-retention", "1h", "etcd periodic auto-compaction: keep this much revision history (a duration, e.g. 1h or 30m; etcd's --auto-compaction-retention)")
	f.DurationVar(&e.defragInterval, "etcd-defrag-interval", regional.DefaultDefragInterval, "defragment this coordinator's own etcd member at most this often, when its free pages pass both --etcd-defrag-min-free-percent and --etcd-defrag-min-free-mib, never while another member defragments or does not answer (0: never)")
	f.Float64Var(&e.defragPercent, "etcd-defrag-min-free-percent", 100*regional.DefaultDefragMinFreeFraction, "defragment only when at least this percentage of the etcd backend file is free pages")
	f.Int64Var(&e.defragMiB, "etcd-defrag-min-free-mib", regional.DefaultDefragMinFreeBytes>>20, "defragment only when at least this much of the etcd backend file is free pages (MiB)")
}

// apply checks the flags (exit 2 naming the flag and the rule) and sets
// them on c.
func (e *etcdOpsFlags) apply(c *regional.EtcdConfig) error {
	switch {
	case e.quotaMiB < 64 || e.quotaMiB > 8<<10:
		return withCode(exitInvalid, fmt.Errorf("--etcd-quota-mib: must be 64..8192 (etcd suggests at most 8 GiB), got %d", e.quotaMiB))
	case e.defragInterval < 0:
		return withCode(exitInvalid, fmt.Errorf("--etcd-defrag-interval: must be >= 0 (0: never), got %s", e.defragInterval))
	case !(e.defragPercent > 0 && e.defragPercent <= 100):
		return withCode(exitInvalid, fmt.Errorf("--etcd-defrag-min-free-percent: must be > 0 and <= 100, got %g", e.defragPercent))
	case e.defragMiB < 0:
		return withCode(exitInvalid, fmt.Errorf("--etcd-defrag-min-free-mib: must be >= 0, got %d", e.defragMiB))
	}
	if d, err := time.ParseDuration(e.retention); err != nil || d <= 0 {
		return withCode(exitInvalid, fmt.Errorf("--etcd-compaction-retention: must be a duration > 0 such as 1h or 30m, got %q", e.retention))
	}
	c.QuotaBytes = e.quotaMiB << 20
	c.CompactionRetention = e.retention
	c.DefragInterval = e.defragInterval
	if c.DefragInterval == 0 {
		c.DefragInterval = -1 // never; 0 means the default in regional.EtcdConfig
	}
	c.DefragMinFreeFraction = e.defragPercent / 100
	c.DefragMinFreeBytes = e.defragMiB << 20
	if c.DefragMinFreeBytes == 0 {
		c.DefragMinFreeBytes = 1 // any; 0 means the default
	}
	return nil
}

// regionEtcdEndpoints applies --etcd-endpoints to cfg: refused (exit 2,
// naming every flag) together with a flag of memberFlags given on the
// command line; otherwise the member's URLs and cluster state, which have
// defaults, are cleared, so that cfg configures a client-only coordinator
// (regional.EtcdConfig.Endpoints, which regional.Config checks further).
func regionEtcdEndpoints(cmd *cobra.Command, cfg *regional.Config) error {
	if len(cfg.Etcd.Endpoints) == 0 {
		return nil
	}
	var given []string
	for _, f := range memberFlags {
		if cmd.Flags().Changed(f) {
			given = append(given, "--"+f)
		}
	}
	if len(given) > 0 {
		return withCode(exitInvalid, fmt.Errorf("%s: not with --etcd-endpoints: a coordinator with --etcd-endpoints embeds no etcd member "+
			"(it is a client of the members at %s), and these flags configure a member; give one or the other",
			strings.Join(given, ", "), strings.Join(cfg.Etcd.Endpoints, ",")))
	}
	cfg.Etcd.ClientURL, cfg.Etcd.PeerURL, cfg.Etcd.ClusterState = "", "", ""
	return nil
}

// regionTLS applies the TLS flags to cfg: with the three files, the
// region certificate (of cfg.Region) for the API and the dials to other
// coordinators, the same files for etcd, and https:// etcd URLs (the
// defaults become https; an http:// URL given explicitly is refused, exit
// 2 naming the flag; --etcd-endpoints must be https:// too, which
// regional.Config checks); with --insecure-dev, plaintext, logged at WARN.
func regionTLS(cmd *cobra.Command, tlsf *serverTLSFlags, cfg *regional.Config) error {
	etcdAt := cfg.Etcd.ClientURL + ", " + cfg.Etcd.PeerURL
	if cfg.Etcd.ClientOnly() {
		etcdAt = strings.Join(cfg.Etcd.Endpoints, ", ")
	}
	r, err := tlsf.load("region", pki.RoleRegion, cfg.Region, cfg.Logger, fmt.Sprintf("any process that can reach the API (%s) "+
		"can submit, read and cancel every job, register as a node and report for any task, and any that can reach etcd (%s) "+
		"can read and write all of the region's state", cfg.APIAddr, etcdAt))
	if err != nil || r == nil {
		return err
	}
	cfg.TLS = r
	cfg.Etcd.TLS = regional.EtcdTLS{CAFile: tlsf.files.CA, CertFile: tlsf.files.Cert, KeyFile: tlsf.files.Key}
	if cfg.Etcd.ClientOnly() {
		return nil // no member URLs; the client dials with cfg.TLS
	}
	for _, u := range []struct {
		flag string
		url  *string
	}{{"etcd-client-url", &cfg.Etcd.ClientURL}, {"etcd-peer-url", &cfg.Etcd.PeerURL}} {
		if !cmd.Flags().Changed(u.flag) {
			*u.url = "https://" + strings.TrimPrefix(*u.url, "http://")
		} else if strings.HasPrefix(*u.url, "http://") {
			return withCode(exitInvalid, fmt.Errorf("--%s %s: with TLS etcd serves mutual TLS only: give an https:// URL", u.flag, *u.url))
		}
	}
	return nil
}

func parseLabels(kvs []string) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--label: %q must be key=value", kv)
		}
		out[k] = v
	}
	return out, nil
}

// newLogger logs to stderr in format, with trace and span ids on the lines
// that belong to a job.
func newLogger(format string) (*slog.Logger, error) {
	return telemetry.NewLogger(format, os.Stderr)
}

// checkAdvertise refuses an API address that others could not dial: an
// --advertise that is no host:port with a port, or one that is itself
// unspecified, and a --listen on 0.0.0.0 or [::] without --advertise (the
// member record and the WAN tags would publish 0.0.0.0).
func checkAdvertise(listen, advertise string) error {
	if advertise != "" {
		host, port, err := net.SplitHostPort(advertise)
		if err != nil || host == "" {
			return fmt.Errorf("--advertise: %q is not a host:port others can dial (got host %q, port %q)", advertise, host, port)
		}
		if err := checkPort("advertise", advertise, port, dialPort); err != nil {
			return err
		}
		if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
			return fmt.Errorf("--advertise: %s is the unspecified address; give the name or address others reach this coordinator at", advertise)
		}
		return nil
	}
	if host, _, err := net.SplitHostPort(listen); err == nil {
		if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
			return fmt.Errorf("--listen %s: listens on every address, so others need to be told which to dial: give --advertise HOST:PORT", listen)
		}
	}
	return nil
}
