// Package acl is Apiary's ACL vocabulary, shared by both tiers: how a token
// travels (gRPC metadata "x-apiary-token", $APIARY_TOKEN in the CLI), token
// types, policies and their capabilities, namespace names, secret hashing,
// and the pure decision "may this token do that" (Nomad's ACL system:
// management and client tokens, policies granting per-namespace
// capabilities; https://developer.hashicorp.com/nomad/docs/secure/acl).
//
// It owns no storage and no servers: a region keeps tokens and policies in
// its etcd (regional/aclstore) and enforces them; the router only forwards
// the caller's token (ForwardToken), never adds or widens one. It must not
// import anything of ours but internal/ids.
package acl
