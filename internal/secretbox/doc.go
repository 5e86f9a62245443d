// Package secretbox seals short secret values (a job's secret_env) with
// AES-256-GCM under one key of a keyring, and opens them with any key of it.
//
// A sealed value is one printable string:
//
//	apiary-sealed:v1:<key id>:<base64url(nonce || ciphertext || tag)>
//
// The key id (KeyID) is the first 8 hex digits of the SHA-256 of the key's
// standard base64 form, the same fingerprint `apiary keyring` logs, so an
// operator can tell which gossip key a stored value depends on. The AES key
// is not the keyring key itself: it is derived from it with HKDF-SHA256
// (RFC 5869) under a fixed label, so that the gossip key and the sealing key
// are never used for two purposes. The version, the key id and the
// caller's context (its aad: in Apiary the job id, group and variable name)
// are authenticated with the value, so a value moved to another job or
// variable, a changed key id or a flipped bit does not open. The idea is
// Nomad's and Vault's keyring: values sealed under the key in use, opened
// by any installed key, rotated by re-sealing before a key is removed.
//
// It owns the format and the cryptography only. It must not touch: where
// the keys come from (regional reads its serf LAN keyring), where sealed
// values are stored (etcd, by regional), logging or any I/O; it keeps no
// state.
package secretbox
