package pki

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"log/slog"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"apiary.dev/apiary/internal/testutil"
)

// recorder is a slog.Handler keeping every record's level and text.
type recorder struct {
	mu   sync.Mutex
	recs []string
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *recorder) WithGroup(string) slog.Handler            { return r }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", rec.Level, rec.Message)
	rec.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
	r.mu.Lock()
	r.recs = append(r.recs, b.String())
	r.mu.Unlock()
	return nil
}

func (r *recorder) count(prefix string) (n int, all []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.recs {
		if strings.HasPrefix(s, prefix) {
			n++
			all = append(all, s)
		}
	}
	return n, all
}

func write(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestReloadFailureKeepsOldAndLogsOnce: files that change into something
// that does not load leave the loaded material in use and are logged once
// however many polls see them; other bad contents are logged once more;
// good files then load.
func TestReloadFailureKeepsOldAndLogsOnce(t *testing.T) {
	dir := t.TempDir()
	ca, caKey, err := CreateCA(CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := CreateCert(ca, caKey, CertOptions{Role: RoleAgent, Region: "eu-west", ID: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	caF, certF, keyF := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	write(t, caF, ca)
	write(t, certF, cert)
	write(t, keyF, key)
	rec := &recorder{}
	r, err := NewReloader(ReloaderConfig{CAFile: caF, CertFile: certF, KeyFile: keyF, Interval: 5 * time.Millisecond, Logger: slog.New(rec)})
	if err != nil {
		t.Fatal(err)
	}
	leaf := r.cur.Load().cert.Leaf.Raw
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	waitPolls := func(n int64) {
		from := r.polls.Load()
		testutil.Eventually(t, 10*time.Second, fmt.Sprintf("%d more polls", n), func() error {
			if got := r.polls.Load() - from; got < n {
				return fmt.Errorf("%d polls", got)
			}
			return nil
		})
	}
	waitWarns := func(want int) {
		testutil.Eventually(t, 10*time.Second, fmt.Sprintf("%d WARN records", want), func() error {
			if n, all := rec.count("WARN"); n < want {
				return fmt.Errorf("%d WARN records: %q", n, all)
			}
			return nil
		})
	}

	write(t, certF, []byte("not a certificate"))
	waitWarns(1)
	waitPolls(20)
	n, all := rec.count("WARN")
	if n != 1 || !strings.Contains(all[0], "--tls-cert "+certF) || !strings.Contains(all[0], "identity=spiffe://apiary/eu-west/agent/n1") {
		t.Fatalf("after 20 failing polls: %q; want one WARN naming --tls-cert %s and the identity kept", all, certF)
	}
	if r.Generation() != 1 || !bytes.Equal(r.cur.Load().cert.Leaf.Raw, leaf) {
		t.Fatalf("generation %d; the failed reload replaced the material", r.Generation())
	}
	if err := r.Reload(); err == nil || !strings.Contains(err.Error(), "--tls-cert") {
		t.Fatalf("Reload() = %v; want the --tls-cert error", err)
	}

	// A key from another certificate: other bytes, another failure, one more line.
	_, key2, err := CreateCert(ca, caKey, CertOptions{Role: RoleAgent, Region: "eu-west", ID: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	write(t, certF, cert)
	write(t, keyF, key2)
	waitWarns(2)
	waitPolls(20)
	if n, all := rec.count("WARN"); n != 2 || !strings.Contains(all[1], "private key does not match public key") {
		t.Fatalf("WARN records %q; want a second one, for the mismatched key", all)
	}

	cert3, key3, err := CreateCert(ca, caKey, CertOptions{Role: RoleAgent, Region: "eu-west", ID: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	write(t, certF, cert3)
	write(t, keyF, key3)
	testutil.Eventually(t, 10*time.Second, "the good files load", func() error {
		if g := r.Generation(); g != 2 {
			return fmt.Errorf("generation %d", g)
		}
		return nil
	})
	if n, all := rec.count("INFO TLS certificate and CA bundle reloaded"); n != 1 || !strings.Contains(all[0], "generation=2") {
		t.Fatalf("INFO records %q; want one reload at generation 2", all)
	}
	if bytes.Equal(r.cur.Load().cert.Leaf.Raw, leaf) {
		t.Fatal("still the first certificate")
	}
}

func TestFailLogOncePerContent(t *testing.T) {
	a, b := sha256.Sum256([]byte("a")), sha256.Sum256([]byte("b"))
	var f failLog
	got := []bool{f.failed(a), f.failed(a), f.failed(a), f.failed(a), f.failed(b), f.failed(b), f.failed(b)}
	want := []bool{false, true, false, false, false, true, false}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("logs at %v; want %v (second failing poll of each content, once)", got, want)
	}
	f = failLog{} // a poll that loads or finds nothing changed
	if f.failed(b) || !f.failed(b) {
		t.Fatal("after a good poll the same failure must be logged again, at its second poll")
	}
}

// TestVerifyServerChecksIdentity: a server certificate that verifies for
// the dialed Apiary name but carries another role's or region's identity
// (a hand-made certificate with a borrowed DNS name) is refused.
func TestVerifyServerChecksIdentity(t *testing.T) {
	caPEM, caKeyPEM, err := CreateCA(CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ca, caKey, err := parseCA(caPEM, caKeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	borrowed := func(dns string, id Identity) *x509.Certificate {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: dns},
			NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			DNSNames: []string{dns}, URIs: []*url.URL{id.URI()}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
		if err != nil {
			t.Fatal(err)
		}
		c, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	r := &Reloader{}
	r.cur.Store(&material{pool: pool})
	for _, tc := range []struct {
		name, dial string
		cert       *x509.Certificate
		want       string
	}{
		{"a router's certificate named as a region", "region.eu-west.apiary",
			borrowed("region.eu-west.apiary", Identity{Role: RoleRouter, Region: GlobalRegion, ID: "r1"}),
			"presented spiffe://apiary/global/router/r1: not the region of region eu-west"},
		{"another region's certificate", "region.eu-west.apiary",
			borrowed("region.eu-west.apiary", Identity{Role: RoleRegion, Region: "us-east", ID: "c1"}),
			"presented spiffe://apiary/us-east/region/c1"},
		{"another coordinator", "c2.region.eu-west.apiary",
			borrowed("c2.region.eu-west.apiary", Identity{Role: RoleRegion, Region: "eu-west", ID: "c1"}),
			"presented spiffe://apiary/eu-west/region/c1"},
		{"a name outside the certificate", "region.eu-west.apiary",
			borrowed("other.example.com", Identity{Role: RoleRegion, Region: "eu-west", ID: "c1"}),
			"certificate is valid for other.example.com, not region.eu-west.apiary"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := r.verifyServer(tls.ConnectionState{PeerCertificates: []*x509.Certificate{tc.cert}}, tc.dial)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("verifyServer = %v; want an error containing %q", err, tc.want)
			}
		})
	}
	good := borrowed("c1.region.eu-west.apiary", Identity{Role: RoleRegion, Region: "eu-west", ID: "c1"})
	for _, name := range []string{"c1.region.eu-west.apiary", ""} {
		if err := r.verifyServer(tls.ConnectionState{PeerCertificates: []*x509.Certificate{good}, ServerName: "c1.region.eu-west.apiary"}, name); err != nil {
			t.Errorf("verifyServer(%q) of the right server: %v", name, err)
		}
	}
}
