// Package bench is the regional load-test harness behind `make bench`: it
// starts real regions and agents (internal/devcluster, the apiary binary as
// subprocesses on loopback), drives them through the public gRPC API, and
// observes task state from the outside through an etcd watch on the
// region's keyspace (read only), so that every timestamp is taken by the
// harness, not reported by the system under test.
//
// Three benchmarks (issue 2, "Measure and report"):
//
//   - Drain: 20 jobs x 100 tasks of /bin/true submitted to a 3-member region
//     before any agent exists, then 8 agents x 32 slots start; time until all
//     2,000 tasks are COMPLETE.
//   - Submit: SubmitJob throughput and latency, single-task jobs, N
//     concurrent clients, 1- and 3-member regions, no agents.
//   - Failover: SIGKILL of one of the three shard owners of a settled region
//     (every shard on its rendezvous owner, shards.Desired) under a steady
//     trickle of jobs, odd trials the etcd leader's host, even ones a
//     follower's: time until its owner keys are deleted, until a survivor
//     dispatches a task of one of its former shards, and the longest gap
//     between the survivors' own dispatches around the kill against a
//     window before it; the floor is --suspect-after plus a revoke and two
//     puts timed through a survivor's member (failover.go).
//
// And the sharded-ownership run, `make bench-shards` (shards.go): the
// failover above and DrainOwners, the drain with 3 shard owners against 1
// (the other two coordinators with --schedule=false), alternating, with
// every coordinator's plan counters read from its /metrics.
//
// And three of the region's serf LAN pool (issue 20, lan.go):
//
//   - AgentFail: SIGKILL of the agent running a task, with and without the
//     pool, default 2 s node lease; time until the task runs as attempt 2
//     elsewhere, against serf's detection alone (the harness's own observer
//     member of the pool) as the floor.
//   - SerfCPU: 50 agent members and a coordinator member in one pool, in
//     this process; CPU per agent per minute (getrusage).
//   - OwnerDetect: the shard owner of a 3-member region killed or paused;
//     time until it is deposed, with the TCP probe, the pool, or both.
//
// And one of per-node failure attribution (issue 11, badnode.go, not in
// the default set): BadNode, 4 agents x 1000 m and 3 jobs x 20 tasks of
// `sleep 1` submitted at once, one agent bad (a `sleep` first in its PATH
// that exits 75 or 1, or its work dir broken) against a healthy control, a
// fresh region per trial; failed tasks and jobs, whether and how soon the
// bad node is quarantined, the attempts it absorbed before, and the wall
// time over the control's (with the harness spawning the sleeps itself as
// a floor).
//
// And two of placement (issue 13, not in the default set, `make
// bench-placement`): Preempt (preempt.go), an urgent task's submission to
// RUNNING in a full region, where it must preempt a batch task, against
// the same region with one slot free, trials alternated, with 1 and 3
// coordinators; and Locality (locality.go), the input bytes stage-2 tasks
// of a generated two-stage workload would fetch (their fetch_bytes) with
// the data-locality score on and off (`region --locality-weight -1`), a
// fresh region per run, runs alternated.
//
// And one of end-to-end control-plane throughput (issue 16, throughput.go,
// not in the default set, -only throughput): Throughput, a fresh 3-member
// region (--node-lease-ttl 10s) with 1,000 simulated agents x 32 slots in
// the harness process (loadtest.RunFleet, noop executor; each agent starts
// at the coordinator its node id hashes to), closed-loop clients submitting
// 100-task jobs while the tasks submitted and not yet finished stay under a
// bound (a backlog the scheduler never runs out of, checked: pending tasks
// after every revision), 10 s warm-up, then 60 s measured in 5 s
// intervals. Tasks created PENDING and then written COMPLETE are counted by
// the watch over etcd revision ranges read at the intervals' ends; writes
// per task are every watch event under /apiary/ in the window over those
// tasks. After the load, with the fleet stopped and the region quiet, the
// same members' batched-write ceiling: 16 goroutines of Txns of 100 puts
// of 300 B for 10 s; the ratio is tasks/s x writes per task / ceiling. The
// coordinators' CPU and RSS and the harness's own (getrusage) are reported
// apart.
//
// And two of state size (issue 16, million.go and drainnoop.go, not in
// the default set, -only million,drain-noop): Million, a 3-member region
// with --job-retention=-1s filled through SubmitJob with jobs of 1,000
// tasks, run by 200 simulated agents x 64 slots (loadtest.RunFleet, noop
// executor), to 10k, 100k and 1M task records (-million-top); at each, the
// fill paused and every job finished, the coordinators' memory, the etcd
// backend size, 200 serial etcd puts as the floor, 10 s of closed-loop
// single-task submissions with the delta of the coordinators' etcd Txn
// histogram over them, their idle CPU, and at the top a SIGKILL of a
// follower's host among the shard owners (first dispatch in its shards).
// DrainNoop, the drain above with exec agents against agents started with
// `--executor noop`, rounds alternated, against SpawnFloor (2,000 spawns,
// 32 at once) in the same round.
//
// And one of fleet scale (issue 16, fleetscale.go, not in the default
// set, -only fleet10k): FleetScale, 10,000 simulated agents (`apiary
// loadtest fleet`, one subprocess, noop executor) on a 3-member region
// without a LAN pool, --node-lease-ttl 30s: the ramp until every agent
// registered; a 60 s steady state (heartbeats answered, each coordinator's,
// the fleet's and the harness's CPU and RSS); ListNodes and GetRegionInfo
// at that size; then rounds of two storms. Restart: every coordinator
// SIGKILLed, down past the lease, restarted (etcd renews every lease on a
// new leader, so epochs survive; time until heartbeats are back).
// Re-registration: the fleet SIGSTOPped, the coordinators killed and
// restarted, every lease left to expire, then SIGCONT (time until every
// node is READY on a new epoch, by a watch of the node keys). The floor,
// before the fleet and in each such storm: the etcd operations of one
// registration and one heartbeat done by the harness on fake nodes.
//
// cmd/apiary-bench runs them and writes per-trial CSV rows and a summary.
// The package owns measurement only: it must not change regional state
// except through the public API (SubmitJob, CancelJob, and the
// AgentService of the agents it runs), process signals and coordinator
// restarts with added flags (devcluster.Proc.Args), and it never writes to
// the region's keyspace: its only etcd writes are the failover floor's, a
// lease and three keys under /apiary-bench/floor/, deleted at once, and
// the throughput ceiling's, Txns of puts over at most 1,000 keys per
// goroutine under /apiary-bench/ceiling/, deleted after each run, and
// Million's floor, 200 serial puts of one key each under
// /apiary-bench/floor/, deleted after each checkpoint, and FleetScale's
// floor, a lease and three keys per fake node under
// /apiary-bench/floor/fleet/, revoked and deleted after each floor. Its serf
// observer publishes role=observer, which coordinators and agents ignore.
package bench
