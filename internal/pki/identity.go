package pki

import (
	"crypto/x509"
	"fmt"
	"net/url"
	"regexp"
	"strings"

	"apiary.dev/apiary/internal/ids"
)

// Roles a certificate is made for.
const (
	RoleRegion = "region" // a coordinator of a region
	RoleRouter = "router" // a global router; its region is GlobalRegion
	RoleAgent  = "agent"  // a node agent; its id is the node id
	RoleClient = "client" // the CLI or an API user
)

// Roles lists every role, in the order error messages name them.
var Roles = []string{RoleRegion, RoleRouter, RoleAgent, RoleClient}

const (
	// GlobalRegion is the region of router certificates and of client
	// certificates not scoped to one region.
	GlobalRegion = "global"
	// Domain is the DNS suffix of the names a certificate is made with.
	Domain = "apiary"
	// TrustDomain is the host of the identity URI (spiffe://apiary/...).
	TrustDomain = "apiary"
	// DefaultClientID is the id of a client certificate created without one.
	DefaultClientID = "cli"
	// RouterServerName is the name a client verifies when dialing a router.
	RouterServerName = RoleRouter + "." + GlobalRegion + "." + Domain
)

// idRE is the rule for ids: a DNS label of lowercase letters, digits and
// '-', 1-63 characters, not starting or ending with '-'.
var idRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// Identity is who a certificate speaks for: the role, the region (a region
// name, or GlobalRegion for routers and unscoped clients) and the id (the
// node id of an agent, the coordinator id of a region, free for the others).
type Identity struct {
	Role, Region, ID string
}

// URI is the identity as the certificate carries it:
// spiffe://apiary/<region>/<role>/<id>.
func (i Identity) URI() *url.URL {
	return &url.URL{Scheme: "spiffe", Host: TrustDomain, Path: "/" + i.Region + "/" + i.Role + "/" + i.ID}
}

// String is the URI form, spiffe://apiary/<region>/<role>/<id>.
func (i Identity) String() string { return i.URI().String() }

// ServerName is <role>.<region>.apiary, the DNS name every certificate of
// this role and region carries (region.eu-west.apiary).
func (i Identity) ServerName() string { return ServerName(i.Role, i.Region) }

// ServerName returns <role>.<region>.apiary.
func ServerName(role, region string) string { return role + "." + region + "." + Domain }

// RegionServerName is the name a client verifies when dialing a coordinator
// of region: region.<region>.apiary.
func RegionServerName(region string) string { return ServerName(RoleRegion, region) }

// check validates the identity; errors name the field with prefix ("--"
// for flags, "" for a parsed certificate).
func (i Identity) check(prefix string) error {
	if !isRole(i.Role) {
		return fmt.Errorf("%srole: must be one of %s (got %q)", prefix, strings.Join(Roles, ", "), i.Role)
	}
	switch {
	case i.Region == "" && (i.Role == RoleRegion || i.Role == RoleAgent):
		return fmt.Errorf("%sregion: required for a%s %s certificate", prefix, article(i.Role), i.Role)
	case !ids.Region.MatchString(i.Region):
		return fmt.Errorf("%sregion: must be 1-63 lowercase letters, digits or '-', not starting or ending with '-' (got %q)", prefix, i.Region)
	case i.Role == RoleRouter && i.Region != GlobalRegion:
		return fmt.Errorf("%sregion: a router certificate is for region %q (got %q)", prefix, GlobalRegion, i.Region)
	case i.Region == GlobalRegion && (i.Role == RoleRegion || i.Role == RoleAgent):
		return fmt.Errorf("%sregion: %q names the router tier; a%s %s certificate needs its region's name", prefix, GlobalRegion, article(i.Role), i.Role)
	}
	if i.ID == "" {
		return fmt.Errorf("%sid: required for a%s %s certificate%s", prefix, article(i.Role), i.Role, idHint(i.Role))
	}
	if !idRE.MatchString(i.ID) {
		return fmt.Errorf("%sid: must be 1-63 lowercase letters, digits or '-', not starting or ending with '-' (got %q)", prefix, i.ID)
	}
	return nil
}

func idHint(role string) string {
	switch role {
	case RoleAgent:
		return " (the agent's --node-id)"
	case RoleRegion:
		return " (the coordinator's --id)"
	case RoleRouter:
		return " (the router's --name)"
	}
	return ""
}

func article(role string) string {
	if role == RoleAgent {
		return "n"
	}
	return ""
}

func isRole(r string) bool {
	for _, x := range Roles {
		if r == x {
			return true
		}
	}
	return false
}

// ParseIdentity parses spiffe://apiary/<region>/<role>/<id>. The error says
// what is wrong.
func ParseIdentity(s string) (Identity, error) {
	u, err := url.Parse(s)
	if err != nil {
		return Identity{}, fmt.Errorf("identity %q: %w", s, err)
	}
	return identityOfURI(u)
}

func identityOfURI(u *url.URL) (Identity, error) {
	if u.Scheme != "spiffe" || u.Host != TrustDomain || u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return Identity{}, fmt.Errorf("identity %q: want spiffe://%s/<region>/<role>/<id>", u, TrustDomain)
	}
	parts := strings.Split(strings.TrimPrefix(u.Path, "/"), "/")
	if len(parts) != 3 || !strings.HasPrefix(u.Path, "/") {
		return Identity{}, fmt.Errorf("identity %q: want spiffe://%s/<region>/<role>/<id>", u, TrustDomain)
	}
	id := Identity{Region: parts[0], Role: parts[1], ID: parts[2]}
	if err := id.check(""); err != nil {
		return Identity{}, fmt.Errorf("identity %q: %w", u, err)
	}
	return id, nil
}

// IdentityOf reads the identity a certificate carries in its one URI SAN
// spiffe://apiary/<region>/<role>/<id>. It is an error when there is no
// such URI, more than one, or it is malformed (unknown role, bad region or
// id). It does not verify the certificate: call it on a verified chain's
// leaf (PeerIdentity does).
func IdentityOf(cert *x509.Certificate) (Identity, error) {
	if cert == nil {
		return Identity{}, fmt.Errorf("no certificate")
	}
	var found []*url.URL
	for _, u := range cert.URIs {
		if u.Scheme == "spiffe" && u.Host == TrustDomain {
			found = append(found, u)
		}
	}
	switch len(found) {
	case 0:
		return Identity{}, fmt.Errorf("certificate %q carries no Apiary identity (no spiffe://%s/... URI SAN): was it made by `apiary tls cert create`?",
			cert.Subject.CommonName, TrustDomain)
	case 1:
	default:
		return Identity{}, fmt.Errorf("certificate %q carries %d Apiary identities; want one", cert.Subject.CommonName, len(found))
	}
	id, err := identityOfURI(found[0])
	if err != nil {
		return Identity{}, fmt.Errorf("certificate %q: %w", cert.Subject.CommonName, err)
	}
	return id, nil
}

// identityOfName reads role and region, and the id if present, from a name
// <role>.<region>.apiary or <id>.<role>.<region>.apiary; ok is false for
// any other name.
func identityOfName(name string) (id Identity, ok bool) {
	rest, found := strings.CutSuffix(name, "."+Domain)
	if !found {
		return Identity{}, false
	}
	labels := strings.Split(rest, ".")
	switch len(labels) {
	case 2:
		return Identity{Role: labels[0], Region: labels[1]}, isRole(labels[0])
	case 3:
		return Identity{ID: labels[0], Role: labels[1], Region: labels[2]}, isRole(labels[1])
	}
	return Identity{}, false
}
