package telemetry

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// NewRegistry returns a registry with the Go runtime and process collectors.
// Each process (and each in-process test component) has its own.
func NewRegistry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return r
}

// latencyBuckets span 1 ms to about 5 minutes.
var latencyBuckets = prometheus.ExponentialBucketsRange(0.001, 300, 20)

// etcdBuckets span 0.5 ms to about 8 s.
var etcdBuckets = prometheus.ExponentialBuckets(0.0005, 2, 15)

// RegionMetrics are a regional coordinator's metrics. The scheduler gauges
// (pending per shard, tasks per state) count the shards the coordinator
// owns; the node gauges, the whole region as its cache sees it.
type RegionMetrics struct {
	Submissions   *prometheus.CounterVec // outcome: accepted, deduplicated
	Refusals      *prometheus.CounterVec // reason
	Placements    prometheus.Counter
	PlanConflicts prometheus.Counter
	Requeues      prometheus.Counter
	Unplaced      prometheus.Counter
	PendingTasks  *prometheus.GaugeVec // shard
	Tasks         *prometheus.GaugeVec // state
	Nodes         *prometheus.GaugeVec // state: ready, lost
	Quarantined   prometheus.Gauge     // the region's nodes under quarantine
	// QuarantineEvents counts automatic quarantine decisions, by event:
	// quarantined, refused (the share guard), released, requarantined (a
	// canary failed).
	QuarantineEvents *prometheus.CounterVec
	LeaseExpiries    prometheus.Counter
	Reclaims         prometheus.Counter
	Reports          *prometheus.CounterVec // kind, result: accepted, rejected
	Retries          prometheus.Counter
	TaskOutcomes     *prometheus.CounterVec // outcome of committed attempts
	ToDispatch       prometheus.Histogram
	ToComplete       prometheus.Histogram
	EtcdTxn          *prometheus.HistogramVec // result: ok, error
	Owner            prometheus.Gauge
	OwnerEpoch       prometheus.Gauge
	ShardsOwned      prometheus.Gauge
	// ShardMoves counts this coordinator's shard claims, hand-backs and
	// losses (a lapsed or revoked lease), by kind.
	ShardMoves *prometheus.CounterVec
	// NodeConflicts counts plan writes whose compares failed, by node;
	// RoundConflicts is the failed writes per scheduling round.
	NodeConflicts  *prometheus.CounterVec
	RoundConflicts prometheus.Histogram
	// ReservedNodes is the nodes a placement round left to the owner they
	// prefer (regional/scheduler, homenodes.go).
	ReservedNodes prometheus.Histogram
	// FencedWrites counts writes refused because a shard's owner key had
	// moved on (the shards are dropped).
	FencedWrites prometheus.Counter
	SerfMembers  *prometheus.GaugeVec   // pool, state
	Adoptions    *prometheus.CounterVec // result: adopted, refused
	Drains       *prometheus.CounterVec // by: operator, agent; and deregister
	// NodeRegistrations counts RegisterNode answers, by outcome: new_epoch,
	// kept (a retry of a committed registration, its registration_id
	// matching the live epoch: the epoch is kept).
	NodeRegistrations *prometheus.CounterVec
	// Preemptions counts preemption events, by event: reserved (a
	// preemptor's Txn marked its victims and reserved their node), victim
	// (one attempt marked preempted), placed (a preemptor placed in its
	// reservation), expired (its victims did not stop in time), lost (the
	// node epoch ended), taken (the room was gone when they had stopped).
	Preemptions *prometheus.CounterVec
}

// NewRegionMetrics registers a coordinator's metrics on reg.
func NewRegionMetrics(reg prometheus.Registerer) *RegionMetrics {
	f := factory{reg}
	return &RegionMetrics{
		Submissions: f.counterVec("apiary_job_submissions_total", "Job submissions committed, by outcome (accepted, deduplicated).", "outcome"),
		Refusals:    f.counterVec("apiary_job_refusals_total", "Job submissions refused, by reason (invalid, jurisdiction, region_selector, request_id_reused, unavailable, ...).", "reason"),
		Placements:  f.counter("apiary_placements_total", "Task placements committed (each one is a dispatch of an attempt)."),
		PlanConflicts: f.counter("apiary_plan_conflicts_total",
			"Plan transactions whose compares failed (another writer changed a task or node first)."),
		Requeues: f.counter("apiary_plan_requeues_total", "Tasks of a conflicting plan returned to the queue to be placed again."),
		Unplaced: f.counter("apiary_placement_unplaced_total", "Tasks that a placement pass could not place anywhere."),
		Preemptions: f.counterVec("apiary_preemptions_total",
			"Preemption events, by event: reserved (a preemption committed), victim (an attempt marked preempted), placed (the preemptor placed in its reservation), expired, lost, taken (the reservation ended without it).", "event"),
		PendingTasks: f.gaugeVec("apiary_pending_tasks", "PENDING tasks per shard (of the shards this coordinator owns).", "shard"),
		Tasks:        f.gaugeVec("apiary_tasks", "Tasks of the shards this coordinator owns, by state.", "state"),
		Nodes:        f.gaugeVec("apiary_nodes", "Nodes of the region, by state (ready, lost).", "state"),
		Quarantined:  f.gauge("apiary_nodes_quarantined", "Nodes of the region under quarantine (an operator's or automatic), ready or not: no new placements but a due canary."),
		QuarantineEvents: f.counterVec("apiary_node_quarantine_events_total",
			"Automatic quarantine decisions committed with reports, by event: quarantined, refused (the share guard kept an outlier out of quarantine), released (a canary succeeded), requarantined (a canary failed).", "event"),
		LeaseExpiries: f.counter("apiary_node_lease_expiries_total", "Node epochs whose lease was seen gone (expired or revoked) with tasks on them."),
		Reclaims:      f.counter("apiary_task_reclaims_total", "Active tasks reclaimed from lost node epochs."),
		Reports:       f.counterVec("apiary_task_reports_total", "Agent reports, by kind and result (accepted, rejected).", "kind", "result"),
		Retries:       f.counter("apiary_task_retries_total", "Attempts that ended and sent their task back to PENDING for another attempt."),
		TaskOutcomes:  f.counterVec("apiary_task_attempt_outcomes_total", "Committed attempt outcomes (complete, failed, retry, lost, refused, cancelled, ...).", "outcome"),
		ToDispatch: f.histogram("apiary_task_submit_to_dispatch_seconds",
			"Time from a job's submission to the first dispatch of each of its tasks.", latencyBuckets),
		ToComplete: f.histogram("apiary_task_submit_to_complete_seconds",
			"Time from a job's submission to the completion of each of its tasks.", latencyBuckets),
		EtcdTxn:     f.histogramVec("apiary_etcd_txn_duration_seconds", "etcd transaction latency per attempt, by result (ok, error).", etcdBuckets, "result"),
		Owner:       f.gauge("apiary_shard_owner", "1 while this coordinator owns at least one shard."),
		OwnerEpoch:  f.gauge("apiary_shard_owner_epoch", "The highest fencing epoch of the shards this coordinator owns (0 when it owns none)."),
		ShardsOwned: f.gauge("apiary_shards_owned", "Shards this coordinator owns."),
		ShardMoves: f.counterVec("apiary_shard_moves_total",
			"Shard ownership changes of this coordinator, by kind (claim, hand_back, lost).", "kind"),
		NodeConflicts: f.counterVec("apiary_plan_node_conflicts_total",
			"Plan writes onto a node whose compares failed (its usage, epoch or a task changed first: often another shard owner's plan), by node.", "node"),
		RoundConflicts: f.histogram("apiary_plan_conflicts_per_round",
			"Writes of one scheduling round whose compares failed.", []float64{0, 1, 2, 5, 10, 20, 50, 100, 200}),
		ReservedNodes: f.histogram("apiary_plan_reserved_nodes",
			"Nodes a placement round left to another shard owner (the owner they prefer has a backlog).", []float64{0, 1, 2, 5, 10, 20, 50, 100, 1000, 10000}),
		FencedWrites: f.counter("apiary_fenced_writes_total",
			"Scheduler writes refused because a shard's owner key had moved to another coordinator (the shard is dropped)."),
		SerfMembers: f.gaugeVec("apiary_serf_members", "serf pool members by pool (lan, wan) and state (alive, suspect, failed, left).", "pool", "state"),
		Adoptions: f.counterVec("apiary_attempt_adoptions_total",
			"Attempts an agent asked to carry over from an ended node epoch after a disconnect, by result (adopted, refused).", "result"),
		NodeRegistrations: f.counterVec("apiary_node_registrations_total",
			"Node registrations answered, by outcome (new_epoch; kept: a retried registration whose registration_id matched the live epoch, which is kept).", "outcome"),
		Drains: f.counterVec("apiary_node_drains_total",
			"Node drain decisions, by kind (operator: DrainNode; agent: an agent's shutdown drain; deregister: a clean leave ending the epoch; cancel).", "kind"),
	}
}

// ShardLabel formats a shard number for the shard label.
func ShardLabel(s int) string { return strconv.Itoa(s) }

// AgentMetrics are a node agent's metrics.
type AgentMetrics struct {
	Attempts        *prometheus.CounterVec // outcome: exited, failed, timed_out, cancelled, abandoned, start_failed, refused
	AttemptDuration prometheus.Histogram
	Registrations   prometheus.Counter
	Epoch           prometheus.Gauge
	// StaleKills counts attempts the agent killed on its own, by reason:
	// not_adopted and report_rejected (never reported: their task is
	// someone else's), disconnect_grace (lost_after passed without contact;
	// reported LOST once a coordinator answers).
	StaleKills   *prometheus.CounterVec
	Disconnected prometheus.Gauge
	Drained      prometheus.Counter
}

// NewAgentMetrics registers an agent's metrics on reg; running and free
// read the agent's ledger at scrape time (running attempts; free capacity
// by resource: cpu_millis, memory_mb, gpus).
func NewAgentMetrics(reg prometheus.Registerer, running func() float64, free func() map[string]float64, capacity map[string]float64) *AgentMetrics {
	f := factory{reg}
	m := &AgentMetrics{
		Attempts:        f.counterVec("apiary_agent_attempts_total", "Attempts ended on this node, by outcome.", "outcome"),
		AttemptDuration: f.histogram("apiary_agent_attempt_duration_seconds", "Wall time of attempts' processes.", latencyBuckets),
		Registrations:   f.counter("apiary_agent_registrations_total", "Node registrations (each one is a new node epoch)."),
		Epoch:           f.gauge("apiary_agent_node_epoch", "Current node epoch (0 while unregistered)."),
		StaleKills: f.counterVec("apiary_agent_stale_attempt_kills_total",
			"Attempts the agent killed on its own, by reason (not_adopted, report_rejected, registration_refused: never reported; disconnect_grace: reported LOST once a coordinator answers).", "reason"),
		Disconnected: f.gauge("apiary_agent_disconnected", "1 while no coordinator has answered for a whole lease TTL (attempts keep running up to their lost_after)."),
		Drained:      f.counter("apiary_agent_drained_attempts_total", "Attempts stopped by a drain and handed back (DRAINED)."),
	}
	if running != nil {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "apiary_agent_running_tasks",
			Help: "Attempts holding resources on this node."}, running))
	}
	if free != nil {
		reg.MustRegister(&freeCollector{free: free, capacity: capacity,
			freeDesc: prometheus.NewDesc("apiary_agent_free_capacity", "Capacity not held by running attempts, by resource (cpu_millis, memory_mb, gpus).", []string{"resource"}, nil),
			capDesc:  prometheus.NewDesc("apiary_agent_capacity", "Capacity the node offers, by resource.", []string{"resource"}, nil)})
	}
	return m
}

// RegisterTaskUsage registers an agent's metrics of its tasks' usage, read
// from the attempts' cgroups at scrape time by usage (ok false: the agent
// runs without cgroups, and only apiary_agent_cgroup_version, 0, is
// exported):
//
//   - apiary_agent_task_cpu_seconds_total (counter): CPU time of every
//     attempt's processes since the agent started, finished attempts
//     included;
//   - apiary_agent_task_memory_bytes (gauge): memory charged to the cgroups
//     of running attempts now, page cache included;
//   - apiary_agent_cgroup_version (gauge): 1 or 2, 0 without cgroups.
func RegisterTaskUsage(reg prometheus.Registerer, usage func() (cpuSeconds, memoryBytes float64, version int, ok bool)) {
	reg.MustRegister(&usageCollector{usage: usage,
		cpu:     prometheus.NewDesc("apiary_agent_task_cpu_seconds_total", "CPU time used by attempts' processes (their cgroups), finished attempts included.", nil, nil),
		mem:     prometheus.NewDesc("apiary_agent_task_memory_bytes", "Memory charged to running attempts' cgroups, page cache included.", nil, nil),
		version: prometheus.NewDesc("apiary_agent_cgroup_version", "cgroup version that contains attempts (1 or 2; 0: none).", nil, nil)})
}

type usageCollector struct {
	usage             func() (float64, float64, int, bool)
	cpu, mem, version *prometheus.Desc
}

func (c *usageCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.cpu
	ch <- c.mem
	ch <- c.version
}

func (c *usageCollector) Collect(ch chan<- prometheus.Metric) {
	cpu, mem, version, ok := c.usage()
	ch <- prometheus.MustNewConstMetric(c.version, prometheus.GaugeValue, float64(version))
	if ok {
		ch <- prometheus.MustNewConstMetric(c.cpu, prometheus.CounterValue, cpu)
		ch <- prometheus.MustNewConstMetric(c.mem, prometheus.GaugeValue, mem)
	}
}

type freeCollector struct {
	free              func() map[string]float64
	capacity          map[string]float64
	freeDesc, capDesc *prometheus.Desc
}

func (c *freeCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.freeDesc; ch <- c.capDesc }

func (c *freeCollector) Collect(ch chan<- prometheus.Metric) {
	for k, v := range c.free() {
		ch <- prometheus.MustNewConstMetric(c.freeDesc, prometheus.GaugeValue, v, k)
	}
	for k, v := range c.capacity {
		ch <- prometheus.MustNewConstMetric(c.capDesc, prometheus.GaugeValue, v, k)
	}
}

type factory struct{ reg prometheus.Registerer }

func (f factory) counter(name, help string) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	f.reg.MustRegister(c)
	return c
}

func (f factory) counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	f.reg.MustRegister(c)
	return c
}

func (f factory) gauge(name, help string) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	f.reg.MustRegister(g)
	return g
}

func (f factory) gaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
	f.reg.MustRegister(g)
	return g
}

func (f factory) histogram(name, help string, buckets []float64) prometheus.Histogram {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
	f.reg.MustRegister(h)
	return h
}

func (f factory) histogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
	f.reg.MustRegister(h)
	return h
}

// Server serves /metrics (and, when asked, /debug/pprof/).
type Server struct {
	srv *http.Server
	lis net.Listener
}

// Serve starts an HTTP server on addr with /metrics from g, /healthz (200
// "ok" while the process serves) and, if pprof,
// Go's profiling handlers under /debug/pprof/.
func Serve(addr string, g prometheus.Gatherer, withPprof bool) (*Server, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	// /healthz: the process is up and serving this endpoint (apiary health
	// --http), whatever the state of its region or federation. It is the
	// liveness check of every deployment (deploy/k8s livenessProbe and
	// startupProbe), which restarts the container when it fails: it must
	// never depend on etcd, a quorum or a peer, or kubelet would restart
	// healthy members of a region that lost its quorum. Readiness is the
	// gRPC health service.
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	if withPprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	s := &Server{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}, lis: lis}
	go func() { _ = s.srv.Serve(lis) }()
	return s, nil
}

// Addr is the listen address.
func (s *Server) Addr() string { return s.lis.Addr().String() }

// Close stops the server.
func (s *Server) Close() error {
	if s == nil {
		return nil
	}
	return s.srv.Close()
}

// RegisterCounterVec registers cv on reg and returns it, or, when reg
// already holds a collector of the same description (a server or owner
// term built again on one registry), that CounterVec, so that both count
// into one series. Any other registration failure returns cv unregistered
// and the error; the caller decides whether to count anyway or not.
func RegisterCounterVec(reg prometheus.Registerer, cv *prometheus.CounterVec) (*prometheus.CounterVec, error) {
	err := reg.Register(cv)
	if err == nil {
		return cv, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
			return existing, nil
		}
	}
	return cv, err
}
