// Package agent is Apiary's node agent: the process that runs on every
// worker host, registers the host with its region's coordinators, and runs
// the attempts it is assigned as local subprocesses.
//
// # What it owns
//
//   - The node's session with its region (session.go): RegisterNode creates a
//     node epoch; Heartbeat renews its lease; StreamAssignments delivers the
//     epoch's RUN and CANCEL assignments. The agent talks to any coordinator
//     in its list and moves to the next one when one is unavailable
//     (coordinators.go).
//   - Local admission (ledger.go): its own account of the resources held by
//     running attempts. The coordinator's placement is optimistic and may be
//     stale; the agent is the last word and answers an assignment that does
//     not fit with REPORT_KIND_REFUSED, never running it.
//   - Execution of one attempt (executor.go): a subprocess in its own working
//     directory <DataDir>/work/<jobID>/<index>/<attempt>/ and its own process
//     group, with full stdout/stderr in files there and the last TailBytes of
//     each kept in memory (tail.go); the timeout and cancellation kill the
//     whole process group. The executor is chosen once, behind the
//     Executor interface (executors.go): ProcessExecutor (the default) or
//     NoopExecutor (noop.go), a timer per attempt for measuring the
//     control plane (`--executor noop`, `apiary loadtest fleet`), which
//     goes through the same admission, report and fencing paths.
//   - Containment (cgroup.go, cgroup_attempt.go, cgroup_launch.go): where the
//     host allows it, each attempt runs in a cgroup of its own under the
//     agent's parent cgroup, joined before the process's first instruction,
//     killed as a whole when the attempt ends (setsid escapees included) and
//     read for CPU and memory usage; every task starts at nice +10 from a
//     launcher thread, below the agent. A restarted agent kills its
//     predecessor's attempt cgroups, then sweeps by records (orphans.go).
//   - Resource limits (cgroup_limits.go): an assignment's resources.limits
//     are written into the attempt's cgroup before its process starts
//     (memory limit, swap included; CPU as a CFS quota), and an attempt
//     ended by the cgroup's OOM killer has its report's error say so
//     (memoryLimitError). Without the controller a limit needs, it is not
//     enforced (logged once at start); the task still runs.
//   - Reports (reporter.go, liveness.go): every report is retried with
//     backoff on transport errors until the coordinator accepts or rejects
//     it, with the attempt's current epoch. A rejection of an attempt of the
//     current epoch, while in contact, means the attempt is stale: the agent
//     stops caring about it and kills it if it still runs.
//   - Fencing and liveness on the node side (agent.go, liveness.go):
//     assignments are deduplicated by (job, task index, attempt) and ignored
//     unless they carry the current node epoch. While no coordinator
//     answers, attempts keep running up to their lost_after. When a
//     coordinator answers that the epoch ended, the agent registers again
//     and offers its attempts to the new epoch (AdoptAttempts); those
//     refused are killed and never reported. When the region refuses the
//     registration itself (PERMISSION_DENIED, UNAUTHENTICATED: a revoked
//     join token, a refused certificate), no epoch can adopt them: they are
//     all killed at once, unreported, while the agent keeps registering
//     with backoff. A drain (the heartbeat answer,
//     or the agent's own stop) stops attempts at its deadline and reports
//     them DRAINED; a clean stop then deregisters.
//   - The node's member of its region's serf LAN pool (lan.go): joined
//     after registering, tagged with the node id, epoch and free capacity,
//     left on a clean stop. A join that fails (most often a gossip key
//     missing or not the pool's) is logged at ERROR with its cause.
//
// # What it must not touch
//
// The agent never reads or writes etcd and never decides a task's state: the
// coordinator's task state machine (package regional) is the only authority,
// and a report is only a claim it may reject. The agent does not place work
// (package placement) and does not retry failed attempts itself; a retry is
// a new attempt dispatched by the coordinator. It keeps no state across
// restarts: a restarted agent is a new node epoch.
//
// # Use
//
// In-process (e.g. `apiary dev`, tests): New, then Run until ctx ends (Run
// runs Parts, the agent's long-running parts, through internal/lifecycle); see
// the package Example (example_test.go, compiled with the tests) and
// ExampleLedger for local admission.
//
// As a subprocess: `apiary agent --addr 127.0.0.1:7070 --data-dir DIR`.
package agent
