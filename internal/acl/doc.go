// Package acl is Apiary's ACL vocabulary, shared by both tiers: how a token
// travels (gRPC metadata "x-apiary-token", $APIARY_TOKEN in the CLI), token
// types, policies and their capabilities, namespace names, secret hashing,
// and the pure decision "may this token do that" (Nomad's ACL system:
// management and client tokens, policies granting per-namespace
// capabilities; https://developer.hashicorp.com/nomad/docs/secure/acl).
//
// Its parts:
//
//   - metadata.go: the token on a call (WithToken, FromIncoming,
//     ForwardToken) and the router's own-call mark (Internal, IsInternal);
//   - names.go: token types, capabilities, node levels, namespace names
//     (ValidateNamespace, DefaultNamespace), HashSecret and NewID;
//   - policy.go: ValidatePolicy and ParsePolicyYAML (the CLI's policy
//     files);
//   - decide.go: Compile (a token and its policies into an *ACL), the
//     decisions (AllowNamespace, ReadableNamespaces, AllowNode,
//     AllowOperator, IsManagement) and the ACL on a call's context
//     (NewContext, FromContext).
//
// It owns no storage and no servers: a region keeps tokens and policies in
// its etcd (regional/aclstore) and enforces them; the router only forwards
// the caller's token (ForwardToken), never adds or widens one. It must not
// import anything of ours but api/ and internal/ids, and does no I/O.
package acl
