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
// cmd/apiary-bench runs them and writes per-trial CSV rows and a summary.
// The package owns measurement only: it must not change regional state
// except through the public API (SubmitJob) and process signals, and it
// never writes to etcd.
package bench
