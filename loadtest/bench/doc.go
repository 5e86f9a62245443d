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
//   - Failover: SIGKILL of the scheduling coordinator (GetRegionInfo) of a
//     3-member region under a steady trickle of jobs; time from the kill to
//     the first task dispatch (plan commit) made under the successor's epoch.
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
// cmd/apiary-bench runs them and writes per-trial CSV rows and a summary.
// The package owns measurement only: it must not change regional state
// except through the public API (SubmitJob, CancelJob) and process
// signals, and it never writes to etcd. Its serf observer publishes
// role=observer, which coordinators and agents ignore.
package bench
