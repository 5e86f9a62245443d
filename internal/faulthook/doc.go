// Package faulthook injects a network partition into a process's gRPC
// client connections, for fault tests on real processes without root or
// network namespaces: while a named file exists, every unary call fails
// with UNAVAILABLE before it is sent, every new stream fails to open, and
// every open stream is cut (its next receive fails with UNAVAILABLE within
// a poll interval). Removing the file heals the partition. The load-test
// harness's partition-agent scenario (loadtest/) creates and removes the
// file of one agent, installed with `apiary agent --fault-file PATH`.
//
// It owns only the interceptors and the file check. It cuts gRPC alone:
// other traffic of the process (an agent's serf LAN member, its metrics
// endpoint) is untouched, so a partitioned agent's serf member keeps
// gossiping and the coordinators learn of the cut from its lease, not from
// serf. It must not import anything of Apiary's outside internal/ (it knows
// no service or message) and must never be installed unless asked for.
//
// The idea of failing calls on the client side while a marker exists is
// the "fault injection filter" of Envoy and gRPC's xDS fault injection
// (abort with a status), reduced to an on/off switch that an external
// harness can flip without an API.
package faulthook
