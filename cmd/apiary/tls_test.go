package main

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"apiary.dev/apiary/internal/pki"
	"apiary.dev/apiary/internal/testutil"
)

// runBin runs the built apiary binary with args and returns exit code,
// stdout and stderr.
func runBin(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(testutil.Binary(t), args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), out.String(), errb.String()
	} else if err != nil {
		t.Fatalf("running apiary %v: %v", args, err)
	}
	return 0, out.String(), errb.String()
}

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		t.Fatalf("%s: no CERTIFICATE block", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func fileMode(t *testing.T, path string) os.FileMode {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Mode().Perm()
}

// TestTLSCreateCAAndCerts runs `apiary tls ca create` and `apiary tls cert
// create` for every role as an operator does, and checks the files, their
// modes, what the certificates say, that the files load as a process's TLS
// material, and that nothing is overwritten.
func TestTLSCreateCAAndCerts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	code, out, errOut := runBin(t, "tls", "ca", "create", "--dir", dir)
	caPath, caKeyPath := filepath.Join(dir, "apiary-ca.pem"), filepath.Join(dir, "apiary-ca-key.pem")
	if code != 0 || !strings.Contains(out, caPath) || !strings.Contains(out, caKeyPath) {
		t.Fatalf("ca create: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	if m := fileMode(t, caKeyPath); m != 0o600 {
		t.Errorf("CA key mode %o; want 600", m)
	}
	if m := fileMode(t, dir); m != 0o700 {
		t.Errorf("made --dir with mode %o; want 700", m)
	}
	ca := readCert(t, caPath)
	if !ca.IsCA || !strings.HasPrefix(ca.Subject.CommonName, "Apiary CA ") {
		t.Fatalf("CA: IsCA %v CN %q", ca.IsCA, ca.Subject.CommonName)
	}
	caBytes, _ := os.ReadFile(caPath)
	code, _, errOut = runBin(t, "tls", "ca", "create", "--dir", dir)
	if code != 2 || !strings.Contains(errOut, caPath+" exists; refusing to overwrite it") {
		t.Fatalf("second ca create: exit %d, stderr %q; want 2 naming %s", code, errOut, caPath)
	}
	if again, _ := os.ReadFile(caPath); !bytes.Equal(again, caBytes) {
		t.Fatal("the refused ca create changed the CA file")
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)

	for _, tc := range []struct {
		args   []string
		file   string
		id     pki.Identity
		server bool
		dns    string
	}{
		{[]string{"--role", "region", "--region", "eu-west", "--id", "eu-west-1", "--dns", "coord1.example.com", "--ip", "10.1.2.3"},
			"eu-west-region-eu-west-1", pki.Identity{Role: "region", Region: "eu-west", ID: "eu-west-1"}, true, "coord1.example.com"},
		{[]string{"--role", "router", "--id", "global-1", "--days", "30"},
			"global-router-global-1", pki.Identity{Role: "router", Region: "global", ID: "global-1"}, true, "router.global.apiary"},
		{[]string{"--role", "agent", "--region", "eu-west", "--id", "n1"},
			"eu-west-agent-n1", pki.Identity{Role: "agent", Region: "eu-west", ID: "n1"}, false, "n1.agent.eu-west.apiary"},
		{[]string{"--role", "client"},
			"global-client-cli", pki.Identity{Role: "client", Region: "global", ID: "cli"}, false, "client.global.apiary"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			args := append([]string{"tls", "cert", "create", "--dir", dir}, tc.args...)
			code, out, errOut := runBin(t, args...)
			certPath, keyPath := filepath.Join(dir, tc.file+".pem"), filepath.Join(dir, tc.file+"-key.pem")
			if code != 0 {
				t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
			}
			for _, want := range []string{certPath, keyPath, "Identity: " + tc.id.String()} {
				if !strings.Contains(out, want) {
					t.Errorf("stdout lacks %q:\n%s", want, out)
				}
			}
			if tc.server != strings.Contains(errOut, "WARNING") {
				t.Errorf("server role %v, stderr %q: want the authority warning for region and router only", tc.server, errOut)
			}
			if m := fileMode(t, keyPath); m != 0o600 {
				t.Errorf("key mode %o; want 600", m)
			}
			leaf := readCert(t, certPath)
			if got, err := pki.IdentityOf(leaf); err != nil || got != tc.id {
				t.Errorf("identity %+v, %v; want %+v", got, err, tc.id)
			}
			if err := leaf.VerifyHostname(tc.dns); err != nil {
				t.Errorf("VerifyHostname(%s): %v", tc.dns, err)
			}
			_, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
			if tc.server != (err == nil) {
				t.Errorf("server role %v, ServerAuth verification: %v", tc.server, err)
			}
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
				t.Errorf("ClientAuth verification: %v", err)
			}
			r, err := pki.NewReloader(pki.ReloaderConfig{CAFile: caPath, CertFile: certPath, KeyFile: keyPath, Role: tc.id.Role, Region: tc.id.Region})
			if err != nil || r.Identity() != tc.id {
				t.Errorf("the files do not load as TLS material: %v", err)
			}

			before, _ := os.ReadFile(certPath)
			code, _, errOut = runBin(t, args...)
			if code != 2 || !strings.Contains(errOut, certPath+" exists; refusing to overwrite it") {
				t.Errorf("second cert create: exit %d, stderr %q; want 2 naming %s", code, errOut, certPath)
			}
			if after, _ := os.ReadFile(certPath); !bytes.Equal(before, after) {
				t.Error("the refused cert create changed the certificate")
			}
		})
	}
	if ip := readCert(t, filepath.Join(dir, "eu-west-region-eu-west-1.pem")).IPAddresses; len(ip) != 3 || ip[2].String() != "10.1.2.3" {
		t.Errorf("region certificate IPs %v; want 127.0.0.1, ::1, 10.1.2.3", ip)
	}
}

// TestTLSBadInput: each bad flag exits 2 naming the flag, and writes nothing.
func TestTLSBadInput(t *testing.T) {
	dir := t.TempDir()
	if code, _, errOut := runBin(t, "tls", "ca", "create", "--dir", dir); code != 0 {
		t.Fatalf("ca create: exit %d: %s", code, errOut)
	}
	otherDir := t.TempDir()
	if code, _, errOut := runBin(t, "tls", "ca", "create", "--dir", otherDir); code != 0 {
		t.Fatalf("ca create: exit %d: %s", code, errOut)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"ca", "create", "--dir", t.TempDir(), "--days", "0"}, "--days: must be > 0 (got 0)"},
		{[]string{"cert", "create", "--role", "x"}, `--role: must be one of region, router, agent, client (got "x")`},
		{[]string{"cert", "create"}, `--role: must be one of region, router, agent, client (got "")`},
		{[]string{"cert", "create", "--role", "agent", "--id", "n1"}, "--region: required for an agent certificate"},
		{[]string{"cert", "create", "--role", "agent", "--region", "eu-west"}, "--id: required for an agent certificate (the agent's --node-id)"},
		{[]string{"cert", "create", "--role", "agent", "--region", "eu-west", "--id", "Node_1"}, `--id: must be 1-63 lowercase letters, digits or '-'`},
		{[]string{"cert", "create", "--role", "region", "--region", "global", "--id", "c1"}, `--region: "global" names the router tier`},
		{[]string{"cert", "create", "--role", "router", "--region", "eu", "--id", "r1"}, `--region: a router certificate is for region "global"`},
		{[]string{"cert", "create", "--role", "client", "--ip", "1.2.3"}, `--ip: "1.2.3" is not an IP address`},
		{[]string{"cert", "create", "--role", "client", "--dns", "a..b"}, `--dns: "a..b" is not a DNS name`},
		{[]string{"cert", "create", "--role", "client", "--days", "-5"}, "--days: must be > 0 (got -5)"},
		{[]string{"cert", "create", "--role", "client", "--days", "4000"}, "--days: the certificate"},
		{[]string{"cert", "create", "--role", "client", "--ca", filepath.Join(dir, "nope.pem")}, "--ca: open " + filepath.Join(dir, "nope.pem")},
		{[]string{"cert", "create", "--role", "client", "--ca-key", filepath.Join(otherDir, "apiary-ca-key.pem")}, "--ca-key: not the key of CA"},
		{[]string{"cert", "create", "--role", "client", "--ca", filepath.Join(dir, "apiary-ca-key.pem")}, "--ca: no PEM CERTIFICATE block"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			args := append([]string{"tls"}, tc.args...)
			if tc.args[0] == "cert" {
				args = append(args, "--dir", dir)
			}
			code, out, errOut := runBin(t, args...)
			if code != 2 || !strings.Contains(errOut, tc.want) {
				t.Fatalf("exit %d, stderr %q; want 2 and %q\nstdout: %s", code, errOut, tc.want, out)
			}
			ents, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			if len(ents) != 2 {
				var names []string
				for _, e := range ents {
					names = append(names, e.Name())
				}
				t.Fatalf("the refused command wrote files: %v", names)
			}
		})
	}
}
