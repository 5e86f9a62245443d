// Package pki owns Apiary's certificates and what they mean: it creates the
// ECDSA CA and the leaf certificates of `apiary tls` (Nomad's `nomad tls`
// habit), reads a certificate's identity (role, region and id, carried in
// a URI SAN spiffe://apiary/<region>/<role>/<id>), builds the mutual-TLS
// configurations of servers and clients, and reloads certificate, key and CA
// bundle when their files change.
//
// Roles. region: a coordinator (serves and dials; ServerAuth+ClientAuth);
// router: a global router (region "global"; ServerAuth+ClientAuth); agent: a
// node agent, its id is the node id (ClientAuth only: agents dial their
// region and serve no TLS gRPC); client: the CLI or an API user (region
// "global" unless scoped, id "cli" by default; ClientAuth only).
//
// Names. Every leaf carries the DNS SANs <role>.<region>.apiary (Nomad's
// server.global.nomad shape) and <id>.<role>.<region>.apiary; servers also
// carry localhost, 127.0.0.1 and ::1. A client dialing a region verifies
// the name region.<region>.apiary (RegionServerName), the router
// router.global.apiary (RouterServerName).
//
// It must not know gRPC services, Apiary's API or regional state: what a
// role may call is the servers' business (they read PeerIdentity). Only
// grpc.go imports grpc, for credentials and the peer's identity.
package pki
