package acl

import (
	"context"
	"slices"
	"sort"
	"time"

	"google.golang.org/protobuf/proto"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

// ACL is one token's compiled grants: the decision "may this token do
// that", made without I/O (Nomad's acl.ACL). Build it with Compile; a nil
// *ACL denies everything.
//
//   - A management token may do everything.
//   - A client token holds the union of the grants of its policies (the
//     ones Compile is given whose names the token lists): a capability on a
//     namespace is granted when any of them grants it on that namespace or
//     on "*" (unlike Nomad, where the most specific rule wins: here rules
//     only add). Without a policy it may do nothing.
//   - An agent (join) token grants nothing on the API.
type ACL struct {
	token      *apiaryv1.ACLToken // no secret
	management bool
	ns         map[string]capSet // by namespace name, "*" included
	node       string            // NodeNone, NodeRead, NodeWrite
	operator   bool
}

// capSet is a set of namespace capabilities.
type capSet uint8

func capBit(c string) capSet {
	switch c {
	case CapSubmit:
		return 1
	case CapRead:
		return 2
	case CapCancel:
		return 4
	}
	return 0
}

// Compile returns the grants of token given policies (the token's own, as
// stored; any other policy in the list is ignored, and a policy the token
// names that is missing grants nothing, as when it was deleted). The token
// is kept without its secret (Token). A nil token gives an ACL that denies
// everything.
func Compile(token *apiaryv1.ACLToken, policies []*apiaryv1.ACLPolicy) *ACL {
	if token == nil {
		return nil
	}
	t := proto.Clone(token).(*apiaryv1.ACLToken)
	t.SecretId = ""
	a := &ACL{token: t}
	switch t.GetType() {
	case TypeManagement:
		a.management = true
		return a
	case TypeClient:
	default: // agent tokens (and anything else) grant nothing
		return a
	}
	for _, p := range policies {
		if p == nil || !slices.Contains(t.GetPolicies(), p.GetName()) {
			continue
		}
		for _, r := range p.GetNamespaces() {
			var s capSet
			for _, c := range r.GetCapabilities() {
				s |= capBit(c)
			}
			if s == 0 {
				continue
			}
			if a.ns == nil {
				a.ns = map[string]capSet{}
			}
			a.ns[r.GetName()] |= s
		}
		switch p.GetNode() {
		case NodeWrite:
			a.node = NodeWrite
		case NodeRead:
			if a.node == NodeNone {
				a.node = NodeRead
			}
		}
		a.operator = a.operator || p.GetOperator()
	}
	return a
}

// IsManagement reports whether the token is a management token.
func (a *ACL) IsManagement() bool { return a != nil && a.management }

// AllowNamespace reports whether the token may use capability (CapSubmit,
// CapRead, CapCancel) on namespace ns ("" means DefaultNamespace).
func (a *ACL) AllowNamespace(ns, capability string) bool {
	if a == nil {
		return false
	}
	if a.management {
		return true
	}
	b := capBit(capability)
	if b == 0 {
		return false
	}
	return (a.ns[OrDefault(ns)]|a.ns[Wildcard])&b != 0
}

// ReadableNamespaces returns the namespaces the token may read: all is
// true when it may read every namespace (management, or a "*" rule with
// read); otherwise names lists them, sorted (empty: none).
func (a *ACL) ReadableNamespaces() (names []string, all bool) {
	if a == nil {
		return nil, false
	}
	if a.management || a.ns[Wildcard]&capBit(CapRead) != 0 {
		return nil, true
	}
	for n, s := range a.ns {
		if s&capBit(CapRead) != 0 {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names, false
}

// AllowNode reports whether the token may read nodes (write false:
// ListNodes, GetRegionInfo, ListShards, ListRegions) or change them (write true:
// drain, eligibility, quarantine, release).
func (a *ACL) AllowNode(write bool) bool {
	if a == nil {
		return false
	}
	if a.management {
		return true
	}
	if write {
		return a.node == NodeWrite
	}
	return a.node == NodeRead || a.node == NodeWrite
}

// AllowOperator reports whether the token may use operator calls (gossip
// keyring rotation).
func (a *ACL) AllowOperator() bool { return a != nil && (a.management || a.operator) }

// Token returns the token the ACL was compiled from, without its secret
// (a copy; nil for a nil ACL).
func (a *ACL) Token() *apiaryv1.ACLToken {
	if a == nil {
		return nil
	}
	return proto.Clone(a.token).(*apiaryv1.ACLToken)
}

// AccessorID is the token's public id ("" for a nil ACL): what logs name.
func (a *ACL) AccessorID() string {
	if a == nil {
		return ""
	}
	return a.token.GetAccessorId()
}

// Expired reports whether the token has expired at now (a token with no
// expiration time never does).
func (a *ACL) Expired(now time.Time) bool {
	if a == nil {
		return false
	}
	e := a.token.GetExpirationTimeMs()
	return e > 0 && now.UnixMilli() >= e
}

type ctxKey struct{}

// NewContext returns ctx carrying a (a server resolves the caller's token
// once, in an interceptor, and its handlers read it with FromContext).
func NewContext(ctx context.Context, a *ACL) context.Context {
	return context.WithValue(ctx, ctxKey{}, a)
}

// FromContext returns the ACL NewContext put on ctx; ok is false when
// there is none.
func FromContext(ctx context.Context) (a *ACL, ok bool) {
	a, ok = ctx.Value(ctxKey{}).(*ACL)
	return a, ok
}
