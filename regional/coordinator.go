package regional

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/grafana/dskit/services"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/authz"
	"apiary.dev/apiary/internal/lifecycle"
	"apiary.dev/apiary/internal/pki"
	"apiary.dev/apiary/internal/sovereignty"
	"apiary.dev/apiary/internal/telemetry"
	"apiary.dev/apiary/placement"
	"apiary.dev/apiary/regional/aclstore"
	"apiary.dev/apiary/regional/failover"
	"apiary.dev/apiary/regional/nodehealth"
	"apiary.dev/apiary/regional/scheduler"
	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/shards"
)

// Config configures one regional coordinator.
type Config struct {
	// ID names the coordinator and its etcd member ([a-z0-9-], 1..63).
	ID string
	// Region is the region name ([a-z0-9-], 1..63); Jurisdiction (e.g. "eu")
	// and Labels describe it to the global tier.
	Region       string
	Jurisdiction string
	Labels       map[string]string
	// ShardCount is S, fixed when the region is created (default 256).
	ShardCount int
	// APIAddr is the gRPC listen address (host:port; port 0 picks one).
	APIAddr string
	// AdvertiseAddr is the API address other processes dial (host:port,
	// published in the member record and the WAN tags): --advertise, for a
	// coordinator that listens on 0.0.0.0 or behind a container's network
	// ("": the listener's address).
	AdvertiseAddr string
	Etcd          EtcdConfig
	// NodeLeaseTTL is the node lease (whole seconds, at least 1; default 2 s).
	NodeLeaseTTL time.Duration
	// MaxHeartbeatsPerSecond is the region-wide heartbeat rate that node
	// leases are sized for (heartbeats.go; default
	// DefaultMaxHeartbeatsPerSecond): a fleet larger than 0.5 s × this
	// rate heartbeats less often, with longer leases.
	MaxHeartbeatsPerSecond float64
	// OwnerLeaseTTL is the coordinator's session lease, which holds its
	// member key and its shard claims (default 2 s: a 1 s lease can lapse
	// on the client side during an etcd leader election, which churns
	// ownership; crashes are taken over on suspicion anyway).
	OwnerLeaseTTL time.Duration
	// APIOnly makes a coordinator that owns no shards (`apiary region
	// --schedule=false`): it serves the API (and its etcd member, if it
	// embeds one) and follows the region like the others, but stays out of
	// the shard assignment. For a region whose scheduling is to run on
	// other hosts, and for benchmarks of one owner against several.
	APIOnly bool
	// LocalityWeight is the weight of data locality in placement scores
	// (placement.Weights.Locality; `apiary region --locality-weight`): 0
	// means the default, 1, equal to resource fit; negative turns locality
	// off (for measuring what it saves).
	LocalityWeight float64
	// MaxPreemptions bounds the preemptors each shard owner commits per
	// scheduling round (`apiary region --max-preemptions`; 0: the default,
	// scheduler.DefaultMaxPreemptions = 8; negative: preemption off).
	MaxPreemptions int
	// ShardSettle is how long a coordinator that joins must stay in the
	// live set before shards move to it (default shards.DefaultSettle;
	// shards.ReconcilerConfig.Settle).
	ShardSettle time.Duration
	// SuspectAfter: a follower that cannot reach the owner's API this long
	// (connection refused) revokes the owner's lease (default 300 ms; 0 keeps
	// the default, negative disables this probe). With LANAddr, a follower
	// also revokes it when the owner's LAN member fails (suspicion.go).
	SuspectAfter time.Duration
	// DefaultLostAfter is how long the attempts of a job with
	// disconnect.replace: false and no lost_after of its own stay on a lost
	// node before they are replaced (default 5 min, like the agent's
	// --disconnect-grace, which keeps them running that long; keep the two
	// alike).
	DefaultLostAfter time.Duration
	// FailoverGrace: for this long after the coordinator started, as shard
	// owner it replaces no attempt of a lost node epoch (but those that
	// left cleanly): after an outage of the region (etcd down with the
	// coordinators) the node leases lapse although the agents kept running,
	// and the agents need this long to reconnect, register again and have
	// their attempts adopted. A coordinator that has run longer owns with no
	// grace: etcd kept the leases while it ran; so does one that started
	// into a running region (its shards had live owners when it started).
	// Default 10 s; negative: no grace.
	FailoverGrace time.Duration
	// JobRetention is how long a finished job is kept before its records are
	// deleted (default 24 h; negative keeps jobs forever).
	JobRetention time.Duration
	// FailoverAfter is the region's --failover-after: how long a home
	// region must be down before a standby activates a failover job that
	// leaves failover.after unset, and, when > 0, failover for jobs
	// without a failover block. FailoverPeers (--failover-peers) narrows
	// the regions its jobs may fail over to (empty: every eligible one).
	// docs/architecture.md, "Failover of accepted jobs".
	FailoverAfter time.Duration
	FailoverPeers []string
	// Quarantine is the per-node failure attribution and automatic
	// quarantine policy (docs/architecture.md, "Bad nodes"); zero fields
	// take nodehealth.DefaultConfig's values.
	Quarantine nodehealth.Config
	// Placer overrides the placement engine (tests).
	Placer placement.Placer
	// SchedulerPolicy is the region's default scoring policy.
	SchedulerPolicy placement.Policy
	// Workload is the expected task mix of the fragmentation policy
	// (placement.Options.Workload); nil means placement.DefaultWorkload.
	Workload []placement.WorkloadClass
	Logger   *slog.Logger
	// Policy is the federation's sovereignty policy, re-checked before a
	// submission is accepted (nil: a job's jurisdiction must equal the
	// region's). See internal/sovereignty.
	Policy *sovereignty.Policy
	// Backlog bounds pending tasks per priority class (admission.go).
	Backlog BacklogBounds
	// WAN makes the coordinator a member of the federation's serf WAN pool
	// (wan.go); off when empty.
	WAN WANConfig
	// LANAddr is the host:port (UDP and TCP) of the coordinator's member
	// of the region's serf LAN pool (lan.go); port 0 picks a free one. ""
	// runs no pool: agents then learn of nothing but lease expiry.
	LANAddr string
	// TracerProvider makes the job lifecycle spans (accept, place, dispatch,
	// complete/fail/retry, reclaim) and the gRPC server spans. Default:
	// tracing off (a no-op provider).
	TracerProvider trace.TracerProvider
	// Registry receives the coordinator's metrics (default: a new one).
	Registry *prometheus.Registry
	// MetricsAddr, if set, serves /metrics (and /debug/pprof/) over HTTP.
	MetricsAddr string
	// TLS, when set, is the coordinator's certificate: the API serves
	// mutual TLS with it (pki.ServerCredentials) behind the authorization
	// gate (authz.Policy{Role: region, Region}, the first interceptor), the
	// coordinator dials the region's other coordinators with it (verifying
	// pki.RegionServerName(Region)), and it is reloaded when its files
	// change (the "tls" part). Its identity must be a region certificate
	// of Region (New fails otherwise), and Etcd.TLS must be set too. Nil:
	// plaintext and no authorization (`apiary region --insecure-dev`).
	TLS *pki.Reloader
	// ACL turns Apiary's ACL system on (`apiary region --acl`; Nomad's
	// `acl { enabled = true }`): every API call but AgentService's (whose
	// certificate is its identity) needs a token (gRPC metadata
	// "x-apiary-token") whose policies grant what it does, per namespace
	// for jobs; RegisterNode needs an agent join token of the region,
	// bound to the node at its first registration; the region's own
	// coordinators pass as management, a router without a token only for
	// its bookkeeping calls. Tokens and policies live in etcd under
	// /apiary/acl/ (regional/aclstore; ACLService manages them, starting
	// with BootstrapACL). Off: tokens are ignored and ACLService answers
	// FAILED_PRECONDITION. Works with or without TLS (without, tokens
	// cross the network in plaintext). See acl.go and docs/security.md.
	ACL bool
	// GossipKey, when set, encrypts both serf pools, LAN and WAN, with a
	// keyring (keyring.go; 16, 24 or 32 bytes, `apiary keygen`): every
	// member of a pool needs a key of its keyring to join it or read its
	// tags. Nil: plain text, unless a keyring file exists (then it is used),
	// logged at WARN when TLS is set.
	GossipKey []byte
	// GossipKeyringFile is where serf keeps the LAN member's keyring (the
	// WAN member's is the same path with ".wan" appended), rewritten after
	// every keyring change so that a rotation survives a restart; a file
	// that exists at start is loaded instead of GossipKey. Default
	// <Etcd.DataDir>/gossip.keyring (GossipKeyringFiles).
	GossipKeyringFile string
}

// DefaultFailoverGrace is Config.FailoverGrace's default.
const DefaultFailoverGrace = 10 * time.Second

// DefaultLostAfter is Config.DefaultLostAfter's default.
const DefaultLostAfter = 5 * time.Minute

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

func (c *Config) validate() error {
	if !nameRE.MatchString(c.ID) {
		return fmt.Errorf("id: must match %s, got %q", nameRE, c.ID)
	}
	if !nameRE.MatchString(c.Region) {
		return fmt.Errorf("region: must match %s, got %q", nameRE, c.Region)
	}
	if c.ShardCount == 0 {
		c.ShardCount = shards.DefaultCount
	}
	if err := shards.Validate(c.ShardCount); err != nil {
		return err
	}
	if c.NodeLeaseTTL == 0 {
		c.NodeLeaseTTL = 2 * time.Second
	}
	if c.NodeLeaseTTL < time.Second {
		return fmt.Errorf("node-lease-ttl: must be at least 1s, got %s", c.NodeLeaseTTL)
	}
	if c.MaxHeartbeatsPerSecond == 0 {
		c.MaxHeartbeatsPerSecond = DefaultMaxHeartbeatsPerSecond
	}
	if !(c.MaxHeartbeatsPerSecond >= 1) || math.IsInf(c.MaxHeartbeatsPerSecond, 0) {
		return fmt.Errorf("max-heartbeats-per-second: must be a number >= 1, got %v", c.MaxHeartbeatsPerSecond)
	}
	if c.OwnerLeaseTTL == 0 {
		c.OwnerLeaseTTL = 2 * time.Second
	}
	if c.OwnerLeaseTTL < time.Second {
		return fmt.Errorf("owner-lease-ttl: must be at least 1s (whole seconds), got %s", c.OwnerLeaseTTL)
	}
	if c.ShardSettle < 0 {
		return fmt.Errorf("shard-settle: must be >= 0, got %s", c.ShardSettle)
	}
	if c.JobRetention == 0 {
		c.JobRetention = 24 * time.Hour
	}
	if c.DefaultLostAfter == 0 {
		c.DefaultLostAfter = DefaultLostAfter
	}
	if c.FailoverGrace == 0 {
		c.FailoverGrace = DefaultFailoverGrace
	}
	if err := c.Quarantine.Validate(); err != nil {
		return err
	}
	c.Quarantine = c.Quarantine.WithDefaults()
	if c.DefaultLostAfter < 0 {
		return fmt.Errorf("default-lost-after: must be > 0, got %s", c.DefaultLostAfter)
	}
	if c.SuspectAfter == 0 {
		c.SuspectAfter = 300 * time.Millisecond
	}
	if c.Etcd.Name == "" {
		c.Etcd.Name = c.ID
	}
	if err := c.validateTLS(); err != nil {
		return err
	}
	if err := c.validateGossip(); err != nil {
		return err
	}
	if c.Etcd.DataDir == "" {
		if c.Etcd.ClientOnly() {
			return errors.New("data-dir: must be set, also with --etcd-endpoints (no etcd data there, but the gossip keyrings)")
		}
		return errors.New("data-dir: must be set")
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if c.SchedulerPolicy == "" {
		c.SchedulerPolicy = placement.PolicyBinpack
	}
	if c.Registry == nil {
		c.Registry = telemetry.NewRegistry()
	}
	return nil
}

// validateTLS checks that TLS and Etcd.TLS are given together (a
// client-only coordinator, Etcd.Endpoints, needs no Etcd.TLS: its client
// uses TLS itself), that the certificate is a region certificate of this
// region, and that the etcd URLs' schemes match (https with TLS, http
// without; with Etcd.Endpoints, the endpoints', and no member URL or
// cluster: EtcdConfig.checkClientOnly). Errors name the flag.
func (c *Config) validateTLS() error {
	etcdTLS := c.Etcd.TLS.CertFile != "" || c.Etcd.TLS.KeyFile != "" || c.Etcd.TLS.CAFile != ""
	if c.TLS == nil {
		if etcdTLS {
			return errors.New("etcd TLS files given without the coordinator's TLS (--tls-ca, --tls-cert, --tls-key)")
		}
		return c.Etcd.checkSchemes("http")
	}
	if !c.Etcd.ClientOnly() && (!etcdTLS || c.Etcd.TLS.CertFile == "" || c.Etcd.TLS.KeyFile == "" || c.Etcd.TLS.CAFile == "") {
		return errors.New("TLS: the embedded etcd member needs the same files (Etcd.TLS: CA, certificate and key)")
	}
	id := c.TLS.Identity()
	if id.Role != pki.RoleRegion {
		return fmt.Errorf("--tls-cert: a coordinator needs a region certificate (apiary tls cert create --role region --region %s --id %s), "+
			"not one of role %s (%s)", c.Region, c.ID, id.Role, id)
	}
	if id.Region != c.Region {
		return fmt.Errorf("--tls-cert: the certificate is of region %s (%s), this coordinator's --region is %s", id.Region, id, c.Region)
	}
	if err := (authz.Policy{Role: pki.RoleRegion, Region: c.Region}).Validate(); err != nil {
		return err
	}
	if c.Etcd.TLS.AllowedHostname == "" {
		c.Etcd.TLS.AllowedHostname = pki.RegionServerName(c.Region)
	}
	return c.Etcd.checkSchemes("https")
}

// Coordinator is one `apiary region` process: an embedded etcd member, the
// gRPC API, and (while it owns the shards) the scheduling loop.
type Coordinator struct {
	cfg Config
	log *slog.Logger
	// refusedLogged: when each node's last share-guard refusal was logged
	// (health.go logs one per node per minute).
	refusedLogged struct {
		sync.Mutex
		at map[string]time.Time
	}
	etcd *embed.Etcd
	cli  *clientv3.Client
	// watchCli carries the per-request watches (an agent's assignment
	// stream, WatchJob): a gRPC client over loopback to the member's own
	// client URL (c.cli itself for a client-only coordinator). Not the
	// in-process client: its watch stream, shared by every watch of c.cli,
	// deadlocks under a storm of watch cancellations (etcd issues 18879
	// and 20716: hundreds of agents leaving at once froze the scheduling
	// loop's watch for good), which real gRPC's flow control does not.
	watchCli *clientv3.Client
	// assignHub fans the region's assignment puts out to this
	// coordinator's assignment streams (assignhub.go; "assignments" part).
	assignHub *assignHub
	grpc      *grpc.Server
	health    *health.Server
	lis       net.Listener
	meta      store.MetaRecord

	// etcdTLS: the copies of the accepted TLS material etcd reads (etcd part)
	etcdTLS etcdTLSCopy

	submits *groupCommit[*submitItem]
	reports *groupCommit[*reportItem]
	specs   store.SpecCache
	// jobs is the job index the scheduling loop's cache keeps; ListJobs
	// pages through it.
	jobs *scheduler.JobIndex
	// nodes is the node index the same cache keeps (the capacity
	// summary's nodes).
	nodes *scheduler.NodeIndex

	capState capacityState
	// acls is the ACL store and cache (Config.ACL; set by the "acl" part)
	// and aclDenials apiary_acl_denials_total{reason}.
	acls       *aclstore.Store
	aclDenials *prometheus.CounterVec
	wan        wanMember
	// fo is the failover manager (regional/failover; set by the "api"
	// part, run by the "failover" part).
	fo    *failover.Manager
	lan   lanMember
	beats beatLog // last heartbeat per node (LAN fast reclaim's evidence)
	// born is when New ran: the failover grace counts from it.
	born time.Time

	tracer     trace.Tracer
	tracing    bool // spans are recorded (attributes worth computing)
	metrics    *telemetry.RegionMetrics
	metricsSrv *telemetry.Server

	// Sharded ownership (ownership.go): the member session, the loop's
	// shard set and the current reconciler.
	sessions   *sessionBox
	members    *memberFeed
	shardSet   *scheduler.ShardSet
	reconciler atomic.Pointer[shards.Reconciler]
	shardStats atomic.Pointer[[]scheduler.ShardStat] // from the loop, for ListShards
	// noGrace: the coordinator started into a running region (its shards
	// had live owners), so it owns with no failover grace.
	noGrace atomic.Bool

	crash  atomic.Bool // Kill: stop as a crash would (no leave, no resign)
	group  *lifecycle.Group
	done   chan struct{}
	doneMu sync.Once
}

// New validates cfg. Start brings the coordinator up.
func New(cfg Config) (*Coordinator, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Coordinator{born: time.Now(), cfg: cfg, jobs: scheduler.NewJobIndex(), nodes: scheduler.NewNodeIndex(), log: cfg.Logger.With("coordinator", cfg.ID, "region", cfg.Region),
		tracer: telemetry.Tracer(telemetry.OrNoop(cfg.TracerProvider)), tracing: telemetry.IsEnabled(cfg.TracerProvider),
		metrics:  telemetry.NewRegionMetrics(cfg.Registry),
		capState: capacityState{extra: map[string]localJob{}},
		sessions: newSessionBox(), members: newMemberFeed(), shardSet: scheduler.NewShardSet(),
		done: make(chan struct{})}
	if cfg.ACL {
		c.aclDenials = aclDenialCounter(cfg.Registry, c.log)
	}
	c.submits = newGroupCommit(2, 256, c.flushSubmits)
	c.reports = newPartitionedCommit(2, 512, func(it *reportItem) string { return it.req.GetNodeId() }, c.flushReports)
	c.assignHub = newAssignHub()
	return c, nil
}

// Addr is the gRPC API address (valid after Start).
func (c *Coordinator) Addr() string { return c.lis.Addr().String() }

// AdvertisedAddr is the API address other processes dial: --advertise, else
// the listener's address (Addr).
func (c *Coordinator) AdvertisedAddr() string {
	if c.cfg.AdvertiseAddr != "" {
		return c.cfg.AdvertiseAddr
	}
	return c.Addr()
}

// Client is the coordinator's etcd client (valid after Start).
func (c *Coordinator) Client() *clientv3.Client { return c.cli }

// MetricsAddr is the /metrics address ("" when not serving).
func (c *Coordinator) MetricsAddr() string {
	if c.metricsSrv == nil {
		return ""
	}
	return c.metricsSrv.Addr()
}

// Etcd is the embedded member (valid after Start); nil for a client-only
// coordinator (Config.Etcd.Endpoints).
func (c *Coordinator) Etcd() *embed.Etcd { return c.etcd }

// Parts returns the coordinator's long-running parts in start order; they
// stop in reverse (internal/lifecycle). This list is the one place that
// orders them:
//
//   - etcd: the embedded member, its client and the region meta; a member
//     that stops serving (error, removed, hard stop) fails the process.
//     It also runs the member's defragmentation loop (defrag.go).
//   - metrics: /metrics and /debug/pprof/ over HTTP (with MetricsAddr).
//   - acl: the ACL store's cache of /apiary/acl/ (with Config.ACL): loaded
//     before the API serves, then kept by a watch (acl.go).
//   - group-commit: the submission and report batch workers; they stop
//     after the API that feeds them, flushing what is queued.
//   - assignments: one watch of every assignment, fanned out to this
//     coordinator's assignment streams (assignhub.go); streams opened
//     while it re-establishes its watch are refused UNAVAILABLE.
//   - api: the gRPC listener and server; a Serve error fails the process.
//   - lan: the serf LAN member (with LANAddr): joins the peers named in
//     the member records, ends the epochs of failed agents (lan.go); it
//     leaves the pool after the owner has resigned.
//   - members: /apiary/members/<id> (API and LAN addresses) under the
//     coordinator's session lease, which also holds its shard claims
//     (ownership.go); revoked on a graceful stop, handing its shards over.
//   - capacity: the capacity and backlog summary (first read on start).
//   - suspicion: revokes the lease of a peer coordinator whose API refuses
//     connections or whose LAN member failed (its shards move).
//   - owner: the shard reconciler (claims and hand-backs) and the
//     scheduling loop of the owned shards (ownership.go).
//   - wan: the serf WAN member (with WAN enabled); it joins in the
//     background for as long as the process runs, and leaves the pool first
//     on stop.
//
// With TLS, a first part "tls" follows the certificate files (pki.Reloader's
// Run): reloaded material applies to every new connection of the API and
// of the coordinator's own dials, and the etcd part copies it for etcd
// (EtcdTLS: etcd reads only what the Reloader accepted; the certificate
// at each handshake, the CA bundle at start).
//
// A Coordinator runs once: call Parts once, or use Start and Stop.
func (c *Coordinator) Parts() []lifecycle.Part {
	var parts []lifecycle.Part
	if c.cfg.TLS != nil {
		parts = append(parts, lifecycle.Loop("tls", c.cfg.TLS.Run))
	}
	parts = append(parts,
		lifecycle.New("etcd", services.NewBasicService(c.startEtcdPart, c.runEtcdPart, c.stopEtcdPart)),
	)
	if c.cfg.MetricsAddr != "" {
		parts = append(parts, lifecycle.Idle("metrics", c.startMetrics, c.stopMetrics))
	}
	if c.cfg.ACL {
		parts = append(parts, lifecycle.New("acl", services.NewBasicService(c.startACL, c.runACL, nil)))
	}
	parts = append(parts,
		lifecycle.New("group-commit", services.NewBasicService(nil, c.runGroupCommit, nil)),
		lifecycle.Loop("assignments", c.runAssignHub),
		lifecycle.New("api", services.NewBasicService(c.listenAPI, c.serveAPI, nil)),
	)
	if c.cfg.LANAddr != "" {
		parts = append(parts, lifecycle.New("lan", services.NewBasicService(c.startLAN, c.runLAN, c.stopLANPart)))
	}
	parts = append(parts,
		lifecycle.New("members", services.NewBasicService(c.checkMemberID, func(ctx context.Context) error { c.memberLoop(ctx); return nil }, nil)),
		lifecycle.New("capacity", services.NewBasicService(func(ctx context.Context) error {
			c.refreshCapacity(ctx)
			return nil
		}, func(ctx context.Context) error { c.capacityLoop(ctx); return nil }, nil)),
		lifecycle.Loop("suspicion", c.suspicionLoop),
		lifecycle.Loop("owner", c.runOwner),
	)
	if c.cfg.WAN.enabled() {
		parts = append(parts, lifecycle.New("wan", services.NewBasicService(c.startWAN, c.runWAN, c.stopWANPart)),
			lifecycle.Loop("failover", func(ctx context.Context) { c.fo.Run(ctx) }))
	}
	return parts
}

// Start runs Parts in order and returns once the API serves and every loop
// runs. ctx bounds the start-up only (the parts run until Stop). On failure
// it stops every part that started and returns an error naming the part.
// Use Failed to learn of a part that fails later.
func (c *Coordinator) Start(ctx context.Context) error {
	c.group = lifecycle.NewGroup(c.log, c.Parts()...)
	if err := c.group.Start(ctx); err != nil {
		c.doneMu.Do(func() { close(c.done) })
		return err
	}
	c.logStarted()
	return nil
}

// logStarted logs the coordinator's addresses (after its parts run).
func (c *Coordinator) logStarted() {
	tlsID := "off (plaintext, --insecure-dev)"
	if c.cfg.TLS != nil {
		tlsID = c.cfg.TLS.Identity().String()
	}
	c.log.Info("coordinator started", "api", c.Addr(), "advertise", c.AdvertisedAddr(), "etcd_client", c.cfg.Etcd.ClientURL, "shards", c.meta.ShardCount, "tls", tlsID, "acl", c.cfg.ACL)
}

// Ready is a last part for Parts' list: it logs "coordinator started" and
// calls then (e.g. to write a ready file; nil: nothing), failing the start
// if then fails.
func (c *Coordinator) Ready(then func() error) lifecycle.Part {
	return lifecycle.Idle("ready", func(context.Context) error {
		c.logStarted()
		if then == nil {
			return nil
		}
		return then()
	}, nil)
}

// Failed is closed when a part fails after Start (see Err); nil before Start.
func (c *Coordinator) Failed() <-chan struct{} {
	if c.group == nil {
		return nil
	}
	return c.group.Failed()
}

// Err names the part that failed after Start and why, or is nil.
func (c *Coordinator) Err() error {
	if c.group == nil {
		return nil
	}
	return c.group.Err()
}

// startEtcdPart starts the member, makes its client and initialises or
// checks the region meta; with Etcd.Endpoints it only makes the client
// (startEtcdClient). It cleans up itself on failure.
func (c *Coordinator) startEtcdPart(ctx context.Context) error {
	if c.cfg.Etcd.ClientOnly() {
		return c.startEtcdClient(ctx)
	}
	ecfg := c.cfg.Etcd
	if c.cfg.TLS != nil {
		// etcd reads copies of what the Reloader accepted (EtcdTLS).
		c.etcdTLS.dir = filepath.Join(ecfg.DataDir, EtcdTLSDir)
		if err := c.etcdTLS.write(c.cfg.TLS); err != nil {
			return err
		}
		ecfg.TLS = c.etcdTLS.files(ecfg.TLS)
	}
	e, err := startEtcd(ctx, ecfg, c.log)
	if err != nil {
		return err
	}
	c.etcd = e
	c.cli = v3client.New(e.Server)
	wcfg := c.etcdClientConfig()
	wcfg.Endpoints, wcfg.TLS = []string{ecfg.ClientURL}, c.etcdClientTLS()
	if c.watchCli, err = clientv3.New(wcfg); err != nil {
		c.closeEtcd()
		return fmt.Errorf("etcd watch client for %s: %w", ecfg.ClientURL, err)
	}
	if err := c.initMeta(ctx); err != nil {
		c.closeEtcd()
		return err
	}
	return nil
}

// runEtcdPart fails when the member stops serving on its own. With TLS it
// rewrites etcd's copies of the certificate after each reload (EtcdTLS).
// With Etcd.Endpoints it never fails: see runEtcdClient.
func (c *Coordinator) runEtcdPart(ctx context.Context) error {
	if c.cfg.Etcd.ClientOnly() {
		return c.runEtcdClient(ctx)
	}
	var reloads <-chan time.Time
	if c.cfg.TLS != nil {
		t := time.NewTicker(EtcdTLSPoll)
		defer t.Stop()
		reloads = t.C
	}
	// The member's defragmentation loop (defrag.go) runs as long as this part.
	if d := newDefragger(c.cfg.Etcd, c.etcd.Server, c.cli, c.etcdClientTLS(), c.cfg.Registry, c.log); d != nil {
		dctx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Go(func() { d.run(dctx) })
		defer wg.Wait()
		defer stop()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-c.etcd.Err():
			return fmt.Errorf("etcd member %s: %w", c.cfg.Etcd.Name, err)
		case <-c.etcd.Server.StopNotify():
			return fmt.Errorf("etcd member %s stopped serving", c.cfg.Etcd.Name)
		case <-reloads:
			c.etcdTLS.follow(c.cfg.TLS, c.log)
		}
	}
}

// stopEtcdPart closes the client and the member (stopped hard on Kill);
// a client-only coordinator has only its client to close.
func (c *Coordinator) stopEtcdPart(error) error {
	if c.crash.Load() && c.etcd != nil {
		c.etcd.Server.HardStop()
	}
	c.closeEtcd()
	return nil
}

func (c *Coordinator) startMetrics(context.Context) error {
	var err error
	c.metricsSrv, err = telemetry.Serve(c.cfg.MetricsAddr, c.cfg.Registry, true)
	return err
}

func (c *Coordinator) stopMetrics() error { return c.metricsSrv.Close() }

// runGroupCommit runs the submission and report workers until ctx ends,
// then lets them flush what is queued.
func (c *Coordinator) runGroupCommit(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() { c.submits.run(ctx) })
	wg.Go(func() { c.reports.run(ctx) })
	wg.Wait()
	return nil
}

// listenAPI opens the gRPC listener and registers the services.
func (c *Coordinator) listenAPI(context.Context) error {
	lis, err := net.Listen("tcp", c.cfg.APIAddr)
	if err != nil {
		return fmt.Errorf("--listen %s: %w", c.cfg.APIAddr, err)
	}
	c.lis = lis
	sopts := []grpc.ServerOption{grpc.MaxRecvMsgSize(16 << 20)}
	if c.cfg.TLS != nil {
		// Mutual TLS, and the authorization gate first in the chain: a
		// call it refuses reaches no handler.
		pol := authz.Policy{Region: c.cfg.Region, Role: pki.RoleRegion, Logger: c.log, Registerer: c.cfg.Registry}
		sopts = append(sopts, pki.ServerCredentials(c.cfg.TLS),
			grpc.ChainUnaryInterceptor(pol.UnaryInterceptor()), grpc.ChainStreamInterceptor(pol.StreamInterceptor()))
	}
	if unary, stream := c.aclInterceptors(); unary != nil {
		// ACLs after the gate: the caller's token, per call (acl.go).
		sopts = append(sopts, grpc.ChainUnaryInterceptor(unary), grpc.ChainStreamInterceptor(stream))
	}
	if h := telemetry.GRPCServerHandler(c.cfg.TracerProvider); h != nil {
		sopts = append(sopts, grpc.StatsHandler(h))
	}
	c.grpc = grpc.NewServer(sopts...)
	c.health = health.NewServer()
	// Not serving until the region's etcd answers a read (setServing).
	c.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(c.grpc, c.health)
	apiaryv1.RegisterJobServiceServer(c.grpc, &jobServer{c: c})
	apiaryv1.RegisterAgentServiceServer(c.grpc, &agentServer{c: c})
	apiaryv1.RegisterAdminServiceServer(c.grpc, &adminServer{c: c})
	apiaryv1.RegisterACLServiceServer(c.grpc, c.aclServer())
	c.fo = c.newFailover()
	apiaryv1.RegisterFailoverServiceServer(c.grpc, c.fo.Server())
	return nil
}

// serveAPI serves until ctx ends (then stops gracefully, within 500 ms) or
// Serve fails.
func (c *Coordinator) serveAPI(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- c.grpc.Serve(c.lis) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve %s: %w (the gRPC server stopped)", c.lis.Addr(), err)
	case <-ctx.Done():
	}
	if c.crash.Load() {
		c.grpc.Stop()
	} else {
		stopped := make(chan struct{})
		go func() { c.grpc.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(500 * time.Millisecond):
			c.grpc.Stop()
			<-stopped
		}
	}
	<-errc
	return nil
}

// initMeta writes /apiary/meta on first start and checks it on later ones:
// the region name and shard count are fixed at creation.
func (c *Coordinator) initMeta(ctx context.Context) error {
	want := store.MetaRecord{Region: c.cfg.Region, Jurisdiction: c.cfg.Jurisdiction, Labels: c.cfg.Labels, ShardCount: c.cfg.ShardCount}
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := c.cli.Txn(cctx).If(clientv3.Compare(clientv3.CreateRevision(store.KeyMeta), "=", 0)).
			Then(clientv3.OpPut(store.KeyMeta, store.MustJSON(want))).Else(clientv3.OpGet(store.KeyMeta)).Commit()
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("init region meta: %w", err)
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if resp.Succeeded {
			c.meta = want
			return nil
		}
		var got store.MetaRecord
		if err := json.Unmarshal(resp.Responses[0].GetResponseRange().Kvs[0].Value, &got); err != nil {
			return fmt.Errorf("region meta: %w", err)
		}
		if got.Region != want.Region {
			return fmt.Errorf("region: data dir belongs to region %q, not %q", got.Region, want.Region)
		}
		if got.ShardCount != want.ShardCount && want.ShardCount != shards.DefaultCount {
			return fmt.Errorf("shards: region was created with %d shards; the count is fixed at creation", got.ShardCount)
		}
		if got.Jurisdiction != want.Jurisdiction {
			return fmt.Errorf("jurisdiction: region %s was created in jurisdiction %q, not %q; a region's jurisdiction is fixed at creation: start this coordinator with --jurisdiction %q", got.Region, got.Jurisdiction, want.Jurisdiction, got.Jurisdiction)
		}
		if !maps.Equal(got.Labels, want.Labels) {
			// Labels describe the region to the router; the latest start wins.
			got.Labels = want.Labels
			pctx, cancel := store.EtcdCtx(ctx)
			_, err := c.cli.Put(pctx, store.KeyMeta, store.MustJSON(got))
			cancel()
			if err != nil {
				return fmt.Errorf("update region labels: %w", err)
			}
		}
		c.meta = got
		return nil
	}
}

// Stop shuts the coordinator down gracefully, its parts in reverse order
// (see Parts): leaves the WAN pool, resigns ownership, stops the API, flushes
// the group-commit queues and closes etcd (which hands raft leadership
// over). It waits for every loop, and does nothing before Start or after a
// failed Start (which stopped what it started).
func (c *Coordinator) Stop() {
	if c.group == nil {
		return
	}
	if err := c.group.Stop(); err != nil {
		c.log.Warn("coordinator stopped with errors", "err", err)
	}
	c.doneMu.Do(func() { close(c.done) })
}

// Kill stops the coordinator abruptly, as a crash would (tests): no leave,
// no resign, no graceful API stop, etcd stopped hard.
func (c *Coordinator) Kill() {
	c.crash.Store(true)
	c.Stop()
}

// closeEtcd closes the client (its lease keep-alive loops) and the member
// (none with Etcd.Endpoints).
func (c *Coordinator) closeEtcd() {
	if c.watchCli != nil && c.watchCli != c.cli {
		_ = c.watchCli.Close()
	}
	if c.cli != nil {
		_ = c.cli.Close()
	}
	if c.etcd != nil {
		c.etcd.Close()
	}
}

// Done is closed when Stop has stopped every part (or Start failed).
func (c *Coordinator) Done() <-chan struct{} { return c.done }

// peerDialOption is the transport of the coordinator's own dials to the
// region's other coordinators: mutual TLS as its certificate, verifying
// region.<region>.apiary, or plaintext without TLS.
func (c *Coordinator) peerDialOption() grpc.DialOption {
	if c.cfg.TLS == nil {
		return grpc.WithTransportCredentials(insecure.NewCredentials())
	}
	return pki.DialOption(c.cfg.TLS, pki.RegionServerName(c.cfg.Region))
}

// Commit attempts: a write sent to a member whose raft leader just died
// would otherwise wait out the whole deadline (about 7 s in etcd); a short
// per-attempt deadline and a retry reach the new leader as soon as it is
// elected (about 0.7 s at election 500 ms).
const (
	commitAttemptTimeout = 800 * time.Millisecond
	commitAttempts       = 6
)

// txnRetry runs an etcd Txn with a short deadline per attempt, retrying
// errors (not failed compares). Callers make their Txns safe to repeat: every
// write is guarded by compares that fail once it has been applied.
func (c *Coordinator) txnRetry(ctx context.Context, build func(context.Context) (*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error) {
	var last error
	for i := 0; i < commitAttempts; i++ {
		actx, cancel := context.WithTimeout(ctx, commitAttemptTimeout)
		t0 := time.Now()
		resp, err := build(actx)
		cancel()
		c.observeTxn(t0, err)
		if err == nil {
			return resp, nil
		}
		last = err
		if ctx.Err() != nil {
			break
		}
	}
	return nil, last
}

// observeTxn records one etcd transaction attempt's latency.
func (c *Coordinator) observeTxn(t0 time.Time, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	c.metrics.EtcdTxn.WithLabelValues(result).Observe(time.Since(t0).Seconds())
}
