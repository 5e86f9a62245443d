package regional_test

// Issue 19 (security review): the embedded etcd member serves only TLS
// material the coordinator's Reloader accepted, never files it refused.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"apiary.dev/apiary/internal/cliconn"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/pki"
	"apiary.dev/apiary/internal/testutil"
	"apiary.dev/apiary/regional"
	"apiary.dev/apiary/regional/store"
)

// etcdLeaf is the leaf certificate the etcd client URL ep serves, read
// from a TLS handshake presenting probe's certificate.
func etcdLeaf(ep string, probe tls.Certificate) (*x509.Certificate, error) {
	u, err := url.Parse(ep)
	if err != nil {
		return nil, err
	}
	d := &net.Dialer{Timeout: 2 * time.Second}
	// The leaf is what is looked at, so no verification: a refused
	// certificate served here must be seen, not fail the handshake.
	conn, err := tls.DialWithDialer(d, "tcp", u.Host, &tls.Config{Certificates: []tls.Certificate{probe},
		InsecureSkipVerify: true, MinVersion: tls.VersionTLS12})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	certs := conn.ConnectionState().PeerCertificates
	if len(certs) == 0 {
		return nil, fmt.Errorf("%s sent no certificate", ep)
	}
	return certs[0], nil
}

// leafOf parses the first certificate of a PEM file.
func leafOf(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// argOf is the value of flag in a process's arguments.
func argOf(t *testing.T, p *devcluster.Proc, flag string) string {
	t.Helper()
	for i, a := range p.Args {
		if a == flag && i+1 < len(p.Args) {
			return p.Args[i+1]
		}
	}
	t.Fatalf("%s: no %s in %q", p.Name, flag, p.Args)
	return ""
}

// TestEtcdTLSServesOnlyAcceptedCertificates: with TLS, a coordinator whose
// --tls-cert/--tls-key are overwritten with certificates its Reloader
// refuses (a region certificate of another region, an expired one of its
// own region and id) keeps serving its accepted certificate on etcd's
// client URL, not only on its API; the copies etcd reads stay private
// (0700 directory, 0600 files) and unchanged. A valid rotation (a fresh
// certificate of the same region and id, same CA) does reach etcd, and an
// etcd client still works with it.
func TestEtcdTLSServesOnlyAcceptedCertificates(t *testing.T) {
	cl, r := tlsCluster(t, devcluster.RegionSpec{Name: "eu-west", Jurisdiction: "eu", NoLAN: true}, false)
	p := cl.PKI()
	coord := r.Coords[0]
	files, err := p.Cert(pki.RoleRegion, r.Spec.Name, coord.Name)
	if err != nil {
		t.Fatal(err)
	}
	if got := argOf(t, coord, "--tls-cert"); got != files.Cert {
		t.Fatalf("coordinator's --tls-cert is %s, want %s", got, files.Cert)
	}
	probeFiles, err := p.Cert(pki.RoleRegion, r.Spec.Name, "etcd-probe")
	if err != nil {
		t.Fatal(err)
	}
	probe, err := tls.LoadX509KeyPair(probeFiles.Cert, probeFiles.Key)
	if err != nil {
		t.Fatal(err)
	}
	ep := r.EtcdEndpoints[0]
	serves := func(want *x509.Certificate) error {
		got, err := etcdLeaf(ep, probe)
		if err != nil {
			return err
		}
		if !bytes.Equal(got.Raw, want.Raw) {
			return fmt.Errorf("etcd %s serves %v (serial %s), want %v (serial %s)", ep, got.URIs, got.SerialNumber, want.URIs, want.SerialNumber)
		}
		return nil
	}
	orig := leafOf(t, files.Cert)
	if err := serves(orig); err != nil {
		t.Fatalf("before any change: %v", err)
	}

	// The copies etcd reads: private, and what the coordinator accepted.
	dir := filepath.Join(argOf(t, coord, "--data-dir"), regional.EtcdTLSDir)
	modes := map[string]os.FileMode{dir: 0o700}
	for _, f := range []string{"ca.pem", "cert.pem", "key.pem"} {
		modes[filepath.Join(dir, f)] = 0o600
	}
	for path, want := range modes {
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := st.Mode().Perm(); got != want {
			t.Errorf("%s: mode %o, want %o", path, got, want)
		}
	}
	copyCert := filepath.Join(dir, "cert.pem")
	if !bytes.Equal(leafOf(t, copyCert).Raw, orig.Raw) {
		t.Fatalf("%s is not the coordinator's certificate", copyCert)
	}

	refusals := func() int {
		b, err := os.ReadFile(coord.LogPath)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Count(string(b), "TLS files changed but do not load")
	}
	overwrite := func(with cliconn.TLSFiles) {
		t.Helper()
		for _, f := range [][2]string{{with.Key, files.Key}, {with.Cert, files.Cert}} {
			b, err := os.ReadFile(f[0])
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(f[1], b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}

	usRegion, err := p.Cert(pki.RoleRegion, "us-east", "us-east-c1")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	expired, err := p.Issue(pki.CertOptions{Role: pki.RoleRegion, Region: r.Spec.Name, ID: coord.Name,
		NotBefore: now.Add(-48 * time.Hour), NotAfter: now.Add(-24 * time.Hour)}, "eu-west-region-expired")
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct {
		name  string
		files cliconn.TLSFiles
	}{{"a region certificate of us-east", usRegion}, {"an expired certificate of the coordinator's own region and id", expired}} {
		before := refusals()
		overwrite(bad.files)
		testutil.Eventually(t, 15*time.Second, "the coordinator logs the refusal of "+bad.name, func() error {
			if n := refusals(); n <= before {
				return fmt.Errorf("%d refusals logged", n)
			}
			return nil
		})
		// etcd re-reads its files at every handshake: look at several,
		// over a few of the coordinator's copy polls.
		for i := 0; i < 5; i++ {
			if err := serves(orig); err != nil {
				t.Fatalf("with %s in --tls-cert: %v", bad.name, err)
			}
			time.Sleep(regional.EtcdTLSPoll)
		}
		if !bytes.Equal(leafOf(t, copyCert).Raw, orig.Raw) {
			t.Fatalf("with %s in --tls-cert, %s changed", bad.name, copyCert)
		}
	}

	// A valid rotation: a fresh certificate of the same region and id.
	rotated, err := p.Issue(pki.CertOptions{Role: pki.RoleRegion, Region: r.Spec.Name, ID: coord.Name}, "eu-west-region-rotated")
	if err != nil {
		t.Fatal(err)
	}
	fresh := leafOf(t, rotated.Cert)
	overwrite(rotated)
	testutil.Eventually(t, 15*time.Second, "etcd serves the rotated certificate", func() error { return serves(fresh) })
	if b, _ := os.ReadFile(coord.LogPath); !strings.Contains(string(b), "etcd serves the reloaded TLS certificate") {
		t.Error("the coordinator did not log etcd's new certificate")
	}
	cfg, err := devcluster.TLSConfig(probeFiles)
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, TLS: cfg, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cli.Get(cctx, store.Root, clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
		t.Fatalf("etcd with the rotated certificate: %v", err)
	}
}
