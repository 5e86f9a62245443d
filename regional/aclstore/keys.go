package aclstore

import (
	"encoding/json"
	"strings"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

// The ACL keyspace (see doc.go). This file is the only place in the
// package that spells a key.
const (
	// Prefix is every ACL key's prefix.
	Prefix       = "/apiary/acl/"
	keyBootstrap = Prefix + "bootstrap"
	prefTokens   = Prefix + "tokens/"
	prefSecrets  = Prefix + "secrets/"
	prefPolicies = Prefix + "policies/"
	prefNodes    = Prefix + "nodes/"
)

func keyToken(accessor string) string { return prefTokens + accessor }
func keySecret(hash string) string    { return prefSecrets + hash }
func keyPolicy(name string) string    { return prefPolicies + name }
func keyNode(nodeID string) string    { return prefNodes + nodeID }

// keyKind says which of the ACL keys key is and its last element; ok is
// false for anything else.
func keyKind(key string) (kind, id string, ok bool) {
	if key == keyBootstrap {
		return "bootstrap", "", true
	}
	for _, p := range []struct{ prefix, kind string }{{prefTokens, "token"}, {prefSecrets, "secret"}, {prefPolicies, "policy"}, {prefNodes, "node"}} {
		if rest, found := strings.CutPrefix(key, p.prefix); found && rest != "" && !strings.Contains(rest, "/") {
			return p.kind, rest, true
		}
	}
	return "", "", false
}

// tokenRecord is /apiary/acl/tokens/<accessor>: a token as stored, with
// the SHA-256 of its secret instead of the secret.
type tokenRecord struct {
	Accessor   string   `json:"accessor"`
	SecretHash string   `json:"secret_hash"`
	Name       string   `json:"name,omitempty"`
	Type       string   `json:"type"`
	Policies   []string `json:"policies,omitempty"`
	// Region and NodeID: agent tokens (the region the node may join, the
	// node the token is bound to; empty while unbound).
	Region   string `json:"region,omitempty"`
	NodeID   string `json:"node_id,omitempty"`
	CreateMs int64  `json:"create_ms"`
	// ExpireMs is Unix ms; 0: never.
	ExpireMs int64 `json:"expire_ms,omitempty"`
}

// proto renders the record without a secret.
func (r *tokenRecord) proto() *apiaryv1.ACLToken {
	return &apiaryv1.ACLToken{AccessorId: r.Accessor, Name: r.Name, Type: r.Type, Policies: append([]string(nil), r.Policies...),
		Region: r.Region, NodeId: r.NodeID, CreateTimeMs: r.CreateMs, ExpirationTimeMs: r.ExpireMs}
}

// bootstrapRecord is /apiary/acl/bootstrap.
type bootstrapRecord struct {
	Accessor   string `json:"accessor"`
	SecretHash string `json:"secret_hash"`
	AtMs       int64  `json:"at_ms"`
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}
