package regional

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"apiary.dev/apiary/internal/pki"
	"apiary.dev/apiary/internal/testutil"
)

// writeRegionCert writes a CA-signed region certificate of region for id
// under dir and returns etcd TLS files for it.
func writeRegionCert(t *testing.T, dir string, caCert, caKey []byte, region, id string) EtcdTLS {
	t.Helper()
	cert, key, err := pki.CreateCert(caCert, caKey, pki.CertOptions{Role: pki.RoleRegion, Region: region, ID: id})
	if err != nil {
		t.Fatal(err)
	}
	d := filepath.Join(dir, region+"-"+id)
	if err := os.MkdirAll(d, 0o700); err != nil {
		t.Fatal(err)
	}
	files := EtcdTLS{CAFile: filepath.Join(d, "ca.pem"), CertFile: filepath.Join(d, "cert.pem"), KeyFile: filepath.Join(d, "key.pem"),
		AllowedHostname: pki.RegionServerName(region)}
	for p, b := range map[string][]byte{files.CAFile: caCert, files.CertFile: cert, files.KeyFile: key} {
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return files
}

// A member that cannot reach its quorum says why: a peer of another
// region (its certificate names another region, and it refuses ours), a
// peer where nothing listens; a peer of its own region is fine. This is
// what a coordinator told to join another region's etcd used to do
// silently: wait forever.
func TestProbePeerSaysWhyQuorumIsMissing(t *testing.T) {
	dir := t.TempDir()
	caCert, caKey, err := pki.CreateCA(pki.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	west := writeRegionCert(t, dir, caCert, caKey, "eu-west", "c1")
	peerURL := fmt.Sprintf("https://127.0.0.1:%d", testutil.FreePort(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e, err := startEtcd(ctx, EtcdConfig{Name: "c1", DataDir: filepath.Join(dir, "etcd"),
		ClientURL: fmt.Sprintf("https://127.0.0.1:%d", testutil.FreePort(t)), PeerURL: peerURL, TLS: west}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()

	clientOf := func(f EtcdTLS) *tls.Config {
		info := f.info()
		c, err := info.ClientConfig()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// Another coordinator of eu-west: the peer is fine.
	west2 := writeRegionCert(t, dir, caCert, caKey, "eu-west", "c2")
	if err := probePeer(ctx, peerURL, clientOf(west2), west2.AllowedHostname); err != nil {
		t.Fatalf("own region's peer: %v", err)
	}
	// A coordinator of us-east told to join eu-west's etcd.
	east := writeRegionCert(t, dir, caCert, caKey, "us-east", "c1")
	err = probePeer(ctx, peerURL, clientOf(east), east.AllowedHostname)
	if err == nil || !strings.Contains(err.Error(), "another region") {
		t.Fatalf("another region's peer: got %v, want an error naming another region", err)
	}
	// Nothing listens.
	dead := fmt.Sprintf("https://127.0.0.1:%d", testutil.FreePort(t))
	if err := probePeer(ctx, dead, clientOf(west2), west2.AllowedHostname); err == nil || !strings.Contains(err.Error(), "cannot connect") {
		t.Fatalf("dead peer: got %v, want cannot connect", err)
	}
	if got := peerURLs("c1="+peerURL+", c2="+dead, "c1"); len(got) != 1 || got["c2"] != dead {
		t.Fatalf("peerURLs = %v", got)
	}
}
