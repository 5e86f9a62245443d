package acl

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"

	"github.com/google/uuid"
)

// Token types (Nomad's "management" and "client" tokens, plus Apiary's
// agent join tokens).
const (
	// TypeManagement may do everything, in every namespace.
	TypeManagement = "management"
	// TypeClient holds the union of its policies' grants, nothing else.
	TypeClient = "client"
	// TypeAgent is a join token: it lets one node register in one region
	// (RegisterNodeRequest.join_token) and grants nothing on the API.
	TypeAgent = "agent"
)

// TokenTypes lists the token types in the order messages name them.
var TokenTypes = []string{TypeClient, TypeManagement, TypeAgent}

// Namespace capabilities (ACLNamespaceRule.capabilities).
const (
	// CapSubmit: SubmitJob in the namespace.
	CapSubmit = "submit"
	// CapRead: GetJob, ListJobs, WatchJob, GetJobLogs, GetJobTrace.
	CapRead = "read"
	// CapCancel: CancelJob.
	CapCancel = "cancel"
)

// Capabilities lists every namespace capability, in the order messages
// name them.
var Capabilities = []string{CapSubmit, CapRead, CapCancel}

// Node levels (ACLPolicy.node).
const (
	// NodeNone grants nothing on nodes.
	NodeNone = ""
	// NodeRead: ListNodes, GetRegionInfo, ListShards, ListRegions.
	NodeRead = "read"
	// NodeWrite: read, plus drain, eligibility, quarantine and release.
	NodeWrite = "write"
)

// Wildcard is the namespace rule name that matches every namespace.
const Wildcard = "*"

// DefaultNamespace is the namespace of a job whose spec names none.
const DefaultNamespace = "default"

// FieldError is one broken rule of an ACL object: Field is its path
// ("namespace", "namespaces[1].capabilities[0]"), Rule what is wrong.
type FieldError struct {
	Field string
	Rule  string
}

func (e *FieldError) Error() string {
	if e.Field == "" {
		return e.Rule
	}
	return e.Field + ": " + e.Rule
}

func fieldErr(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Rule: fmt.Sprintf(format, args...)}
}

var namespaceRE = regexp.MustCompile(`^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$`)

// namespaceRule is the rule text of a namespace name.
const namespaceRule = "must be 1-63 characters of a-z, 0-9 and '-', starting with a letter and not ending with '-'"

// ValidateNamespace checks a namespace name: 1-63 characters of [a-z0-9-],
// starting with a letter and not ending with '-' (Nomad's namespaces are
// looser; these are DNS labels, RFC 1123, so a namespace can name a host
// or a certificate). The empty name
// is refused here: callers map "" to DefaultNamespace first where it means
// the default. The error is a *FieldError of field "namespace".
func ValidateNamespace(ns string) error {
	if namespaceRE.MatchString(ns) {
		return nil
	}
	return fieldErr("namespace", "%s (got %q)", namespaceRule, ns)
}

// OrDefault returns ns, or DefaultNamespace when ns is empty.
func OrDefault(ns string) string {
	if ns == "" {
		return DefaultNamespace
	}
	return ns
}

// HashSecret returns the hex SHA-256 of a token's secret id: the only form
// in which a secret is stored (64 lower-case hex digits).
func HashSecret(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// NewID returns a random UUID (version 4) in its canonical lower-case
// 36-character form: a new token's accessor or secret id.
func NewID() string { return uuid.NewString() }

// ValidateID checks that s is a UUID in canonical form (36 characters,
// lower-case hex and dashes), as NewID makes them; the error is a
// *FieldError naming field.
func ValidateID(field, s string) error {
	u, err := uuid.Parse(s)
	if err != nil || u.String() != s {
		return fieldErr(field, "must be a UUID in canonical lower-case form such as 4f6c1b2e-7d0a-4c3e-9b8f-2a1d5e6f7a8b (got %q)", s)
	}
	return nil
}

// Reasons a call is refused by the ACL layer: the reason label of a
// server's denial counter (apiary_acl_denials_total) and the "reason"
// attribute of its log line.
const (
	// ReasonNoToken: the call carries no token. codes.Unauthenticated.
	ReasonNoToken = "no_token"
	// ReasonUnknownToken: no token has that secret (never made, or
	// revoked). codes.Unauthenticated.
	ReasonUnknownToken = "unknown_token"
	// ReasonExpiredToken: the token's expiration time has passed.
	// codes.Unauthenticated.
	ReasonExpiredToken = "expired_token"
	// ReasonPermission: the token lacks the capability the call needs
	// (in the namespace, on nodes, operator, management).
	// codes.PermissionDenied.
	ReasonPermission = "permission"
	// ReasonJoinToken: a node's registration was refused for its join
	// token (not an agent token, another region's, bound to another node,
	// or the node is bound to another token). codes.PermissionDenied.
	ReasonJoinToken = "join_token"
)
