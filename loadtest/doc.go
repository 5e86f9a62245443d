// Package loadtest is Apiary's load-test harness: open-loop load (each
// submission has an intended send time and its latency is measured from it,
// so coordinated omission is counted), fault scenarios on real processes
// (kill or pause the scheduling coordinator or an agent, kill a region of a
// federation, cut an agent off through its fault hook, take every
// coordinator of a region down; liveness.go), and a verifier that
// reads every job back after a run and checks Apiary's promises: nothing
// accepted is lost, no task has two committed completions, every stale
// attempt's effect carries a lower fencing token than the committed one, and
// no task ran outside its allowed jurisdiction.
//
// Tasks record their effects in an append-only ledger (one line per attempt
// that ran: job, task, attempt, fencing token, node, region), which is the
// harness's view of what really executed. The harness talks to Apiary only
// through its public gRPC API and process signals; it must not read or write
// etcd or import the coordinator's internals. The simulated fleet
// (fleet.go, `apiary loadtest fleet`) runs the real node agent (package
// agent) in-process, thousands of them, with the noop executor.
package loadtest
