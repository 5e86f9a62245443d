package pki_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"apiary.dev/apiary/internal/pki"
)

func mustCA(t *testing.T, opts pki.CAOptions) (certPEM, keyPEM []byte) {
	t.Helper()
	c, k, err := pki.CreateCA(opts)
	if err != nil {
		t.Fatal(err)
	}
	return c, k
}

func mustCert(t *testing.T, caPEM, caKeyPEM []byte, opts pki.CertOptions) (certPEM, keyPEM []byte) {
	t.Helper()
	c, k, err := pki.CreateCert(caPEM, caKeyPEM, opts)
	if err != nil {
		t.Fatal(err)
	}
	return c, k
}

func parsePEM(t *testing.T, data []byte) *x509.Certificate {
	t.Helper()
	b, _ := pem.Decode(data)
	if b == nil || b.Type != "CERTIFICATE" {
		t.Fatalf("no CERTIFICATE block in %q", data)
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCreateCA(t *testing.T) {
	certPEM, keyPEM := mustCA(t, pki.CAOptions{})
	ca := parsePEM(t, certPEM)
	if !strings.HasPrefix(ca.Subject.CommonName, "Apiary CA ") || len(ca.Subject.CommonName) <= len("Apiary CA ") {
		t.Errorf("CommonName = %q; want \"Apiary CA <suffix>\"", ca.Subject.CommonName)
	}
	if !ca.IsCA || !ca.BasicConstraintsValid || ca.MaxPathLen != 0 || !ca.MaxPathLenZero {
		t.Errorf("IsCA=%v BasicConstraintsValid=%v MaxPathLen=%d MaxPathLenZero=%v; want a CA with path length 0",
			ca.IsCA, ca.BasicConstraintsValid, ca.MaxPathLen, ca.MaxPathLenZero)
	}
	if ca.KeyUsage != x509.KeyUsageCertSign|x509.KeyUsageCRLSign {
		t.Errorf("KeyUsage = %b; want CertSign|CRLSign", ca.KeyUsage)
	}
	pub, ok := ca.PublicKey.(*ecdsa.PublicKey)
	if !ok || pub.Curve != elliptic.P256() {
		t.Errorf("public key %T; want ECDSA P-256", ca.PublicKey)
	}
	if err := ca.CheckSignatureFrom(ca); err != nil {
		t.Errorf("not self-signed: %v", err)
	}
	life := ca.NotAfter.Sub(time.Now())
	if want := 5 * 365 * 24 * time.Hour; life < want-time.Hour || life > want+time.Hour {
		t.Errorf("valid for %s more; want 5 years", life)
	}
	if b, _ := pem.Decode(keyPEM); b == nil || b.Type != "EC PRIVATE KEY" {
		t.Errorf("key PEM %q; want an EC PRIVATE KEY block", keyPEM)
	}
	other, _ := mustCA(t, pki.CAOptions{Days: 10})
	oca := parsePEM(t, other)
	if oca.Subject.CommonName == ca.Subject.CommonName {
		t.Errorf("two CAs share CommonName %q", ca.Subject.CommonName)
	}
	if life := oca.NotAfter.Sub(time.Now()); life < 10*24*time.Hour-time.Hour || life > 10*24*time.Hour {
		t.Errorf("--days 10: valid for %s more", life)
	}
}

// TestCreateCertRoundTrip: each role's leaf verifies against its CA for
// the usages it has and no other, and carries the names and identity.
func TestCreateCertRoundTrip(t *testing.T) {
	caPEM, caKeyPEM := mustCA(t, pki.CAOptions{})
	pool := x509.NewCertPool()
	pool.AddCert(parsePEM(t, caPEM))
	for _, tc := range []struct {
		opts     pki.CertOptions
		want     pki.Identity
		server   bool
		dns, ips []string
	}{
		{opts: pki.CertOptions{Role: "region", Region: "eu-west", ID: "eu-west-1", DNSNames: []string{"Coord1.Example.com."}, IPs: []string{"10.0.0.7", "127.0.0.1"}},
			want: pki.Identity{Role: "region", Region: "eu-west", ID: "eu-west-1"}, server: true,
			dns: []string{"region.eu-west.apiary", "eu-west-1.region.eu-west.apiary", "localhost", "coord1.example.com"},
			ips: []string{"127.0.0.1", "::1", "10.0.0.7"}},
		{opts: pki.CertOptions{Role: "router", ID: "global-1"},
			want: pki.Identity{Role: "router", Region: "global", ID: "global-1"}, server: true,
			dns: []string{"router.global.apiary", "global-1.router.global.apiary", "localhost"}, ips: []string{"127.0.0.1", "::1"}},
		{opts: pki.CertOptions{Role: "agent", Region: "us-east", ID: "n7", IPs: []string{"fd00::7"}},
			want: pki.Identity{Role: "agent", Region: "us-east", ID: "n7"},
			dns:  []string{"agent.us-east.apiary", "n7.agent.us-east.apiary"}, ips: []string{"fd00::7"}},
		{opts: pki.CertOptions{Role: "client"},
			want: pki.Identity{Role: "client", Region: "global", ID: "cli"},
			dns:  []string{"client.global.apiary", "cli.client.global.apiary"}},
		{opts: pki.CertOptions{Role: "client", Region: "eu-west", ID: "ops", Days: 30},
			want: pki.Identity{Role: "client", Region: "eu-west", ID: "ops"},
			dns:  []string{"client.eu-west.apiary", "ops.client.eu-west.apiary"}},
	} {
		t.Run(tc.want.String(), func(t *testing.T) {
			certPEM, keyPEM := mustCert(t, caPEM, caKeyPEM, tc.opts)
			leaf := parsePEM(t, certPEM)
			if b, _ := pem.Decode(keyPEM); b == nil || b.Type != "EC PRIVATE KEY" {
				t.Fatalf("key PEM %q", keyPEM)
			}
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
				t.Errorf("does not verify for ClientAuth: %v", err)
			}
			_, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
			if tc.server && err != nil {
				t.Errorf("server role does not verify for ServerAuth: %v", err)
			}
			if !tc.server && err == nil {
				t.Errorf("%s certificate verifies for ServerAuth; want ClientAuth only", tc.want.Role)
			}
			if leaf.IsCA {
				t.Error("leaf is a CA")
			}
			if leaf.Subject.CommonName != tc.want.ServerName() {
				t.Errorf("CommonName %q; want %q", leaf.Subject.CommonName, tc.want.ServerName())
			}
			if !slices.Equal(leaf.DNSNames, tc.dns) {
				t.Errorf("DNS SANs %q; want %q", leaf.DNSNames, tc.dns)
			}
			var ips []string
			for _, ip := range leaf.IPAddresses {
				ips = append(ips, ip.String())
			}
			if !slices.Equal(ips, tc.ips) {
				t.Errorf("IP SANs %q; want %q", ips, tc.ips)
			}
			if len(leaf.URIs) != 1 || leaf.URIs[0].String() != "spiffe://apiary/"+tc.want.Region+"/"+tc.want.Role+"/"+tc.want.ID {
				t.Errorf("URI SANs %v; want exactly %s", leaf.URIs, tc.want)
			}
			got, err := pki.IdentityOf(leaf)
			if err != nil || got != tc.want {
				t.Errorf("IdentityOf = %+v, %v; want %+v", got, err, tc.want)
			}
			if err := leaf.VerifyHostname(tc.want.ServerName()); err != nil {
				t.Errorf("VerifyHostname(%s): %v", tc.want.ServerName(), err)
			}
			days := tc.opts.Days
			if days == 0 {
				days = pki.DefaultCertDays
			}
			if life := leaf.NotAfter.Sub(time.Now()); life > time.Duration(days)*24*time.Hour || life < time.Duration(days)*24*time.Hour-time.Hour {
				t.Errorf("valid for %s more; want %d days", life, days)
			}
			if time.Since(leaf.NotBefore) < 0 {
				t.Errorf("NotBefore %s is in the future", leaf.NotBefore)
			}
		})
	}
	if pki.RegionServerName("eu-west") != "region.eu-west.apiary" || pki.RouterServerName != "router.global.apiary" {
		t.Errorf("server names %q %q", pki.RegionServerName("eu-west"), pki.RouterServerName)
	}
}

// TestCreateCertRejectsBadInput: each error names the flag and the rule.
func TestCreateCertRejectsBadInput(t *testing.T) {
	caPEM, caKeyPEM := mustCA(t, pki.CAOptions{})
	otherCA, otherKey := mustCA(t, pki.CAOptions{})
	shortCA, shortKey := mustCA(t, pki.CAOptions{Days: 30})
	expiredCA, expiredKey := mustCA(t, pki.CAOptions{NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour)})
	leafPEM, leafKey := mustCert(t, caPEM, caKeyPEM, pki.CertOptions{Role: "client"})
	agent := func(mod func(*pki.CertOptions)) pki.CertOptions {
		o := pki.CertOptions{Role: "agent", Region: "eu-west", ID: "n1"}
		mod(&o)
		return o
	}
	for _, tc := range []struct {
		name        string
		ca, caKey   []byte
		opts        pki.CertOptions
		want        string
		alsoContain string
	}{
		{name: "unknown role", opts: pki.CertOptions{Role: "x", Region: "eu", ID: "a"},
			want: `--role: must be one of region, router, agent, client (got "x")`},
		{name: "no role", opts: pki.CertOptions{Region: "eu", ID: "a"}, want: `--role: must be one of`},
		{name: "region without region", opts: pki.CertOptions{Role: "region", ID: "c1"}, want: "--region: required for a region certificate"},
		{name: "agent without region", opts: agent(func(o *pki.CertOptions) { o.Region = "" }), want: "--region: required for an agent certificate"},
		{name: "agent in global", opts: agent(func(o *pki.CertOptions) { o.Region = "global" }), want: `--region: "global" names the router tier`},
		{name: "router in a region", opts: pki.CertOptions{Role: "router", Region: "eu", ID: "r1"}, want: `--region: a router certificate is for region "global" (got "eu")`},
		{name: "uppercase region", opts: agent(func(o *pki.CertOptions) { o.Region = "EU" }), want: `--region: must be 1-63 lowercase letters`},
		{name: "agent without id", opts: agent(func(o *pki.CertOptions) { o.ID = "" }), want: "--id: required for an agent certificate (the agent's --node-id)"},
		{name: "region without id", opts: pki.CertOptions{Role: "region", Region: "eu"}, want: "--id: required for a region certificate (the coordinator's --id)"},
		{name: "router without id", opts: pki.CertOptions{Role: "router"}, want: "--id: required for a router certificate"},
		{name: "id with underscore", opts: agent(func(o *pki.CertOptions) { o.ID = "node_1" }), want: `--id: must be 1-63 lowercase letters, digits or '-'`, alsoContain: `"node_1"`},
		{name: "id too long", opts: agent(func(o *pki.CertOptions) { o.ID = strings.Repeat("a", 64) }), want: `--id: must be 1-63`},
		{name: "id with dot", opts: agent(func(o *pki.CertOptions) { o.ID = "a.b" }), want: `--id: must be`},
		{name: "bad dns", opts: agent(func(o *pki.CertOptions) { o.DNSNames = []string{"not a name"} }), want: `--dns: "not a name" is not a DNS name`},
		{name: "empty dns", opts: agent(func(o *pki.CertOptions) { o.DNSNames = []string{""} }), want: `--dns: "" is not a DNS name`},
		{name: "dns under .apiary", opts: pki.CertOptions{Role: "router", ID: "r1", DNSNames: []string{"region.eu-west.apiary"}},
			want: `--dns: "region.eu-west.apiary": names under .apiary are made from --role, --region and --id`},
		{name: "bad ip", opts: agent(func(o *pki.CertOptions) { o.IPs = []string{"300.1.1.1"} }), want: `--ip: "300.1.1.1" is not an IP address`},
		{name: "negative days", opts: agent(func(o *pki.CertOptions) { o.Days = -1 }), want: "--days: must be > 0 (got -1)"},
		{name: "outlives CA", ca: shortCA, caKey: shortKey, opts: agent(func(o *pki.CertOptions) { o.Days = 31 }), want: "--days: the certificate", alsoContain: "would outlive its CA"},
		{name: "CA not PEM", ca: []byte("garbage"), opts: agent(func(*pki.CertOptions) {}), want: "--ca: no PEM CERTIFICATE block"},
		{name: "CA is a leaf", ca: leafPEM, caKey: leafKey, opts: agent(func(*pki.CertOptions) {}), want: `--ca: "client.global.apiary" is not a CA certificate`},
		{name: "CA expired", ca: expiredCA, caKey: expiredKey, opts: agent(func(*pki.CertOptions) {}), want: "--ca: CA", alsoContain: "expired on"},
		{name: "key not PEM", caKey: []byte("garbage"), opts: agent(func(*pki.CertOptions) {}), want: "--ca-key: no PEM EC PRIVATE KEY or PRIVATE KEY block"},
		{name: "key of another CA", caKey: otherKey, opts: agent(func(*pki.CertOptions) {}), want: "--ca-key: not the key of CA"},
		{name: "another CA's cert", ca: otherCA, opts: agent(func(*pki.CertOptions) {}), want: "--ca-key: not the key of CA"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ca, key := caPEM, caKeyPEM
			if tc.ca != nil {
				ca = tc.ca
			}
			if tc.caKey != nil {
				key = tc.caKey
			}
			c, k, err := pki.CreateCert(ca, key, tc.opts)
			if err == nil {
				t.Fatalf("CreateCert(%+v) made a certificate; want an error containing %q", tc.opts, tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.alsoContain) {
				t.Fatalf("error %q; want it to contain %q and %q", err, tc.want, tc.alsoContain)
			}
			if c != nil || k != nil {
				t.Errorf("an error came with a certificate or key")
			}
		})
	}
	if _, _, err := pki.CreateCA(pki.CAOptions{Days: -3}); err == nil || !strings.Contains(err.Error(), "--days: must be > 0 (got -3)") {
		t.Errorf("CreateCA(Days: -3) = %v; want --days error", err)
	}
}

// selfSigned makes a certificate carrying uris, for IdentityOf's refusals.
func selfSigned(t *testing.T, uris ...string) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "hand-made"},
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	for _, s := range uris {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestIdentityOf(t *testing.T) {
	id, err := pki.IdentityOf(selfSigned(t, "https://example.com/x", "spiffe://apiary/eu-west/agent/n1"))
	if want := (pki.Identity{Role: "agent", Region: "eu-west", ID: "n1"}); err != nil || id != want {
		t.Fatalf("IdentityOf = %+v, %v; want %+v", id, err, want)
	}
	if id.String() != "spiffe://apiary/eu-west/agent/n1" {
		t.Errorf("String() = %q", id.String())
	}
	if back, err := pki.ParseIdentity(id.String()); err != nil || back != id {
		t.Errorf("ParseIdentity(String()) = %+v, %v", back, err)
	}
	for uris, want := range map[string]string{
		"":                                "carries no Apiary identity",
		"spiffe://other/eu-west/agent/n1": "carries no Apiary identity",
		"spiffe://apiary/eu-west/agent/n1 spiffe://apiary/eu-west/agent/n2": "carries 2 Apiary identities",
		"spiffe://apiary/eu-west/admin/n1":                                  `role: must be one of region, router, agent, client (got "admin")`,
		"spiffe://apiary/eu-west/agent":                                     "want spiffe://apiary/<region>/<role>/<id>",
		"spiffe://apiary/eu-west/agent/n1/x":                                "want spiffe://apiary/<region>/<role>/<id>",
		"spiffe://apiary/global/agent/n1":                                   `region: "global" names the router tier`,
		"spiffe://apiary/eu-west/router/r1":                                 `region: a router certificate is for region "global"`,
		"spiffe://apiary/eu-west/agent/N1":                                  `id: must be 1-63 lowercase`,
		"spiffe://apiary/eu-west/agent/n1?x=1":                              "want spiffe://apiary/<region>/<role>/<id>",
	} {
		_, err := pki.IdentityOf(selfSigned(t, strings.Fields(uris)...))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("IdentityOf(URIs %q) = %v; want an error containing %q", uris, err, want)
		}
	}
	if _, err := pki.IdentityOf(nil); err == nil {
		t.Error("IdentityOf(nil) = nil error")
	}
}
