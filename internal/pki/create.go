package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"strings"
	"time"
)

// Default validities, in days.
const (
	DefaultCADays   = 5 * 365 // 5 years, as `nomad tls ca create`
	DefaultCertDays = 365     // 1 year, as `nomad tls cert create`
)

// backdate is how far before now a certificate becomes valid, so that a
// peer whose clock is a little behind accepts it at once.
const backdate = time.Minute

// CAOptions configures CreateCA.
type CAOptions struct {
	// Days is the validity from now, in days; 0 means DefaultCADays.
	Days int
	// NotBefore and NotAfter, when NotAfter is set, replace Days (tests
	// make expired CAs with them). NotBefore zero means now - 1 minute.
	NotBefore, NotAfter time.Time
}

// CreateCA makes a self-signed ECDSA P-256 CA, CommonName "Apiary CA
// <16 random hex digits>", KeyUsage CertSign|CRLSign, IsCA with MaxPathLen
// 0 (it signs leaves only). It returns the certificate and its private key
// (SEC1 "EC PRIVATE KEY"), PEM-encoded. Errors name the flag (--days).
func CreateCA(opts CAOptions) (certPEM, keyPEM []byte, err error) {
	notBefore, notAfter, err := validity(opts.Days, DefaultCADays, opts.NotBefore, opts.NotAfter)
	if err != nil {
		return nil, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	suffix := make([]byte, 8)
	if _, err := rand.Read(suffix); err != nil {
		return nil, nil, err
	}
	serial, err := newSerial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "Apiary CA " + hex.EncodeToString(suffix), Organization: []string{"Apiary"}},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, fmt.Errorf("creating the CA certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pemBlock("CERTIFICATE", der), pemBlock("EC PRIVATE KEY", keyDER), nil
}

// CertOptions configures CreateCert. Field errors name the flag of `apiary
// tls cert create` that sets the field.
type CertOptions struct {
	// Role is one of RoleRegion, RoleRouter, RoleAgent, RoleClient (--role).
	Role string
	// Region (--region) is required for region and agent certificates, and
	// may not be "global" for them; it is GlobalRegion for a router (empty
	// means that) and for a client when empty.
	Region string
	// ID (--id): the coordinator id (region), the node id (agent), the
	// router's name (router), free for a client (default DefaultClientID).
	// A DNS label: 1-63 of [a-z0-9-], not starting or ending with '-'.
	ID string
	// DNSNames (--dns) and IPs (--ip) are added to the SANs. Names under
	// .apiary are refused: they are made from role, region and id.
	DNSNames []string
	IPs      []string
	// Days is the validity from now, in days; 0 means DefaultCertDays.
	Days int
	// NotBefore and NotAfter, when NotAfter is set, replace Days (tests
	// make expired certificates with them). NotBefore zero means now - 1
	// minute.
	NotBefore, NotAfter time.Time
}

// Identity applies the defaults (router region "global", client region
// "global" and id "cli") and returns the identity the certificate will
// carry, or an error naming the flag and the rule, e.g.
// `--role: must be one of region, router, agent, client (got "x")`.
func (o CertOptions) Identity() (Identity, error) {
	id := Identity{Role: o.Role, Region: o.Region, ID: o.ID}
	switch o.Role {
	case RoleRouter:
		if id.Region == "" {
			id.Region = GlobalRegion
		}
	case RoleClient:
		if id.Region == "" {
			id.Region = GlobalRegion
		}
		if id.ID == "" {
			id.ID = DefaultClientID
		}
	}
	if err := id.check("--"); err != nil {
		return Identity{}, err
	}
	return id, nil
}

// isServer reports whether certificates of role serve TLS (ServerAuth,
// localhost and loopback SANs).
func isServer(role string) bool { return role == RoleRegion || role == RoleRouter }

// CreateCert makes a leaf certificate for opts' identity, signed by the CA
// (caCertPEM: the first CERTIFICATE block is the signer; caKeyPEM: its
// EC PRIVATE KEY or PKCS#8 PRIVATE KEY). The leaf has a new ECDSA P-256 key,
// CommonName <role>.<region>.apiary, KeyUsage DigitalSignature and these
// SANs: DNS <role>.<region>.apiary and <id>.<role>.<region>.apiary; for
// region and router also DNS localhost and IPs 127.0.0.1 and ::1; the extra
// DNSNames and IPs; and the URI spiffe://apiary/<region>/<role>/<id>.
// ExtKeyUsage is ServerAuth+ClientAuth for region and router, ClientAuth for
// agent and client. It returns certificate and key (SEC1), PEM-encoded.
//
// Errors name the flag and the rule: --role, --region, --id, --dns, --ip,
// --days (also when the leaf would outlive the CA), --ca (not a CA, expired),
// --ca-key (unreadable, or not the CA's key).
func CreateCert(caCertPEM, caKeyPEM []byte, opts CertOptions) (certPEM, keyPEM []byte, err error) {
	id, err := opts.Identity()
	if err != nil {
		return nil, nil, err
	}
	dnsNames := []string{id.ServerName(), id.ID + "." + id.ServerName()}
	var ips []net.IP
	if isServer(id.Role) {
		dnsNames = append(dnsNames, "localhost")
		ips = append(ips, net.IPv4(127, 0, 0, 1).To4(), net.IPv6loopback)
	}
	for _, n := range opts.DNSNames {
		n = strings.ToLower(strings.TrimSuffix(n, "."))
		if err := checkDNSName(n); err != nil {
			return nil, nil, err
		}
		if !contains(dnsNames, n) {
			dnsNames = append(dnsNames, n)
		}
	}
	for _, s := range opts.IPs {
		ip := net.ParseIP(s)
		if ip == nil {
			return nil, nil, fmt.Errorf("--ip: %q is not an IP address", s)
		}
		if v4 := ip.To4(); v4 != nil {
			ip = v4
		}
		dup := false
		for _, x := range ips {
			dup = dup || x.Equal(ip)
		}
		if !dup {
			ips = append(ips, ip)
		}
	}
	notBefore, notAfter, err := validity(opts.Days, DefaultCertDays, opts.NotBefore, opts.NotAfter)
	if err != nil {
		return nil, nil, err
	}
	ca, caKey, err := parseCA(caCertPEM, caKeyPEM)
	if err != nil {
		return nil, nil, err
	}
	if notAfter.After(ca.NotAfter) {
		return nil, nil, fmt.Errorf("--days: the certificate (until %s) would outlive its CA %q (until %s); give fewer days or make a new CA",
			notAfter.UTC().Format(time.DateOnly), ca.Subject.CommonName, ca.NotAfter.UTC().Format(time.DateOnly))
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := newSerial()
	if err != nil {
		return nil, nil, err
	}
	eku := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if isServer(id.Role) {
		eku = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: id.ServerName(), Organization: []string{"Apiary"}, OrganizationalUnit: []string{id.Role}},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           eku,
		BasicConstraintsValid: true,
		DNSNames:              dnsNames,
		IPAddresses:           ips,
		URIs:                  []*url.URL{id.URI()},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("signing the certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pemBlock("CERTIFICATE", der), pemBlock("EC PRIVATE KEY", keyDER), nil
}

// checkDNSName validates an extra --dns name (lowercased already).
func checkDNSName(n string) error {
	if n == "" || len(n) > 253 {
		return fmt.Errorf("--dns: %q is not a DNS name (1-253 characters)", n)
	}
	for _, label := range strings.Split(n, ".") {
		if !idRE.MatchString(label) {
			return fmt.Errorf("--dns: %q is not a DNS name: each dot-separated label is 1-63 letters, digits or '-', not starting or ending with '-'", n)
		}
	}
	if n == Domain || strings.HasSuffix(n, "."+Domain) {
		return fmt.Errorf("--dns: %q: names under .%s are made from --role, --region and --id, never given", n, Domain)
	}
	return nil
}

// validity returns the validity window: [notBefore, notAfter] if notAfter is
// set (notBefore zero: now - backdate), else [now - backdate, now + days].
func validity(days, defaultDays int, notBefore, notAfter time.Time) (time.Time, time.Time, error) {
	now := time.Now()
	if notBefore.IsZero() {
		notBefore = now.Add(-backdate)
	}
	if !notAfter.IsZero() {
		if !notAfter.After(notBefore) {
			return time.Time{}, time.Time{}, fmt.Errorf("--days: the validity ends (%s) before it starts (%s)", notAfter, notBefore)
		}
		return notBefore, notAfter, nil
	}
	switch {
	case days < 0:
		return time.Time{}, time.Time{}, fmt.Errorf("--days: must be > 0 (got %d)", days)
	case days == 0:
		days = defaultDays
	case days > 100*365:
		return time.Time{}, time.Time{}, fmt.Errorf("--days: must be at most %d (100 years; got %d)", 100*365, days)
	}
	return notBefore, now.Add(time.Duration(days) * 24 * time.Hour), nil
}

// parseCA reads the signer: the first certificate of caCertPEM and its key.
func parseCA(caCertPEM, caKeyPEM []byte) (*x509.Certificate, crypto.Signer, error) {
	certs, err := parseCerts(caCertPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("--ca: %w", err)
	}
	ca := certs[0]
	if !ca.IsCA || !ca.BasicConstraintsValid || ca.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, nil, fmt.Errorf("--ca: %q is not a CA certificate (it cannot sign certificates)", ca.Subject.CommonName)
	}
	if time.Now().After(ca.NotAfter) {
		return nil, nil, fmt.Errorf("--ca: CA %q expired on %s", ca.Subject.CommonName, ca.NotAfter.UTC().Format(time.RFC3339))
	}
	key, err := parseKey(caKeyPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("--ca-key: %w", err)
	}
	type equaler interface{ Equal(crypto.PublicKey) bool }
	if pub, ok := key.Public().(equaler); !ok || !pub.Equal(ca.PublicKey) {
		return nil, nil, fmt.Errorf("--ca-key: not the key of CA %q (--ca)", ca.Subject.CommonName)
	}
	return ca, key, nil
}

// parseCerts reads every CERTIFICATE block; other blocks are ignored. It is
// an error when there is none or one does not parse.
func parseCerts(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", len(out)+1, err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM CERTIFICATE block")
	}
	return out, nil
}

// parseKey reads the first private key block: EC PRIVATE KEY (SEC1) or
// PRIVATE KEY (PKCS#8).
func parseKey(data []byte) (crypto.Signer, error) {
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return nil, errors.New("no PEM EC PRIVATE KEY or PRIVATE KEY block")
		}
		switch b.Type {
		case "EC PRIVATE KEY":
			return x509.ParseECPrivateKey(b.Bytes)
		case "PRIVATE KEY":
			k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
			if err != nil {
				return nil, err
			}
			s, ok := k.(crypto.Signer)
			if !ok {
				return nil, fmt.Errorf("unsupported private key type %T", k)
			}
			return s, nil
		}
	}
}

// newSerial returns a random positive serial number below 2^127.
func newSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	return n.Add(n, big.NewInt(1)), nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}
