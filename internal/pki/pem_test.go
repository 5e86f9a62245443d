package pki_test

import (
	"bytes"
	"log/slog"
	"os"
	"strings"
	"testing"

	"apiary.dev/apiary/internal/pki"
)

// TestPEMIsTheAcceptedMaterial: PEM returns the bytes that loaded, keeps
// returning them while the files hold material the Reloader refuses (a
// certificate of another region, garbage), and returns the new bytes once
// valid files load, with Generation moving with them. The slices are
// copies.
func TestPEMIsTheAcceptedMaterial(t *testing.T) {
	dir := t.TempDir()
	ca, caKey, err := pki.CreateCA(pki.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	issue := func(region string) (cert, key []byte) {
		t.Helper()
		cert, key, err := pki.CreateCert(ca, caKey, pki.CertOptions{Role: pki.RoleRegion, Region: region, ID: "c1"})
		if err != nil {
			t.Fatal(err)
		}
		return cert, key
	}
	cert1, key1 := issue("eu-west")
	m := writeMaterial(t, dir, "c1", ca, cert1, key1)
	r, err := pki.NewReloader(pki.ReloaderConfig{CAFile: m.ca, CertFile: m.cert, KeyFile: m.key, Role: pki.RoleRegion, Region: "eu-west",
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	want := func(what string, gen uint64, cert, key []byte) {
		t.Helper()
		gotCA, gotCert, gotKey := r.PEM()
		if !bytes.Equal(gotCA, ca) || !bytes.Equal(gotCert, cert) || !bytes.Equal(gotKey, key) {
			t.Fatalf("%s: PEM() is not the expected material (CA equal %v, cert equal %v, key equal %v)", what,
				bytes.Equal(gotCA, ca), bytes.Equal(gotCert, cert), bytes.Equal(gotKey, key))
		}
		if g := r.Generation(); g != gen {
			t.Fatalf("%s: generation %d, want %d", what, g, gen)
		}
	}
	want("after NewReloader", 1, cert1, key1)

	// The caller's slices are its own.
	_, c, k := r.PEM()
	c[0], k[0] = 'X', 'X'
	want("after the caller wrote into the returned slices", 1, cert1, key1)

	// Refused: a region certificate of us-east; then garbage.
	usCert, usKey := issue("us-east")
	writeMaterial(t, dir, "c1", ca, usCert, usKey)
	if err := r.Reload(); err == nil || !strings.Contains(err.Error(), "us-east") {
		t.Fatalf("Reload() of a us-east certificate = %v; want the region refusal", err)
	}
	want("with a us-east certificate in the files", 1, cert1, key1)
	if err := os.WriteFile(m.key, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.Reload(); err == nil {
		t.Fatal("Reload() of a garbage key succeeded")
	}
	want("with a garbage key in the files", 1, cert1, key1)

	// Accepted: a fresh eu-west certificate.
	cert2, key2 := issue("eu-west")
	writeMaterial(t, dir, "c1", ca, cert2, key2)
	if err := r.Reload(); err != nil {
		t.Fatal(err)
	}
	want("after a valid rotation", 2, cert2, key2)
}
