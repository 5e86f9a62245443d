// Package aclstore is a region's ACL state (Nomad's ACL system: tokens,
// policies, bootstrap; internal/acl has the vocabulary and the decision)
// kept in the region's etcd, a watch cache that resolves a call's token
// without I/O, and the region's ACLService.
//
// # What it owns
//
// The keys under /apiary/acl/ (keys.go), and nothing else of the keyspace:
//
//	/apiary/acl/bootstrap             the bootstrap record: accessor and secret hash of the first management token
//	/apiary/acl/tokens/<accessor>     a token (tokenRecord): type, name, policies, region, bound node, times, secret hash
//	/apiary/acl/secrets/<sha256>      the accessor of the token whose secret hashes to <sha256>
//	/apiary/acl/policies/<name>       a policy (apiaryv1.ACLPolicy, protojson)
//	/apiary/acl/nodes/<nodeID>        the accessor of the agent token bound to the node
//
// A secret is never stored, logged or returned, except once: in the answer
// to the BootstrapACL or CreateACLToken call that made it (or its repeat,
// which names it). Every write of more than one key is one etcd Txn whose
// compares make it safe to repeat and refuse what a concurrent write
// changed.
//
//   - Store: the cache (a range read of /apiary/acl/, then a watch from the
//     next revision; a compacted watch reloads), Resolve (secret to
//     *acl.ACL: a hit costs a SHA-256 and map reads; a miss reads etcd
//     directly before refusing, so a token works on any coordinator as soon
//     as CreateACLToken returned), the token and policy writes, and
//     CheckJoin: the compares and ops a node's epoch-creating Txn includes
//     so that its registration and a revocation of its join token cannot
//     both win.
//   - Server: apiaryv1.ACLServiceServer for a region with ACLs on; Off for
//     one without.
//
// # What it must not touch
//
// It must not spell regional's keys: ending a node's epoch when its agent
// token is revoked goes through Config.EndNodeOps, which regional supplies.
// It does not enforce anything on the API (regional's interceptor does,
// with Resolve and internal/acl's decisions), holds no node or job state,
// and makes no gRPC calls.
package aclstore
