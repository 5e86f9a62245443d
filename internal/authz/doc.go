// Package authz decides who may call which gRPC method of an Apiary server,
// from the caller's verified mutual-TLS identity (pki.PeerIdentity: role,
// region, id), and enforces it as gRPC server interceptors, unary and
// stream. It owns:
//
//   - the method table (table.go): every RPC of api/apiary/v1 and of
//     grpc.health.v1.Health, each with the access rule it falls under. A
//     method not in the table is refused (deny by default), and a test walks
//     the generated file descriptors so that a new RPC without a rule fails
//     it;
//   - the decision (Policy.Authorize): the server's own role (region or
//     router) and region, the caller's identity, the method and, for
//     AgentService, the node_id of each request message, which must be the
//     agent certificate's id;
//   - what a denial looks like: codes.Unauthenticated without a verified
//     client certificate, codes.PermissionDenied otherwise, a WARN log line
//     (method, identity, peer address, reason; never a request's contents)
//     and the counter apiary_authz_denials_total{service,reason}.
//
// It must not know regional state or etcd, hold tokens or namespaces (the
// job API's ACLs are the region's business, checked after this gate), read
// certificates itself (internal/pki does), or make calls of its own: a
// decision is a pure function of the policy, the identity, the method and
// the request message.
package authz
