package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"apiary.dev/apiary/internal/cliconn"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/sovereignty"
	"apiary.dev/apiary/internal/testutil"
)

// TestHealthCommand runs `apiary health` as a container's health check
// would, against real processes with mutual TLS on: a coordinator and the
// router over gRPC with the deployment's own certificates, an agent's
// /healthz, and what is down or mistyped.
func TestHealthCommand(t *testing.T) {
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(pol, []byte(sovereignty.DefaultYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	metrics := testutil.FreeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, err := devcluster.Start(ctx, devcluster.Options{Binary: testutil.Binary(t), Dir: dir, TLS: true, Global: &devcluster.GlobalSpec{PolicyFile: pol},
		Regions: []devcluster.RegionSpec{{Name: "eu-west", Jurisdiction: "eu", NoLAN: true,
			Agents: []devcluster.AgentSpec{{ID: "n1", CPUMillis: 1000, MemoryMiB: 1024, ExtraArgs: []string{"--metrics-addr", metrics}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Stop)
	region := cl.Regions[0]
	// A container uses its own certificate: the coordinator's checks
	// itself, the router's checks the router.
	coordCert, err := cl.PKI().Cert("region", "eu-west", "c1")
	if err != nil {
		t.Fatal(err)
	}
	routerCert, err := cl.PKI().Cert("router", "", "r1")
	if err != nil {
		t.Fatal(err)
	}
	tlsArgs := func(f cliconn.TLSFiles) []string {
		return []string{"--tls-ca", f.CA, "--tls-cert", f.Cert, "--tls-key", f.Key}
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
		out  string
	}{
		{"coordinator, its own certificate", append([]string{"health", "--addr", region.APIAddrs[0], "--tls-server-name", "region.eu-west.apiary"},
			tlsArgs(coordCert)...), 0, "SERVING"},
		{"router, its own certificate", append([]string{"health", "--addr", cl.GlobalAddr, "--tls-server-name", "router.global.apiary"},
			tlsArgs(routerCert)...), 0, "SERVING"},
		{"agent /healthz", []string{"health", "--http", "http://" + metrics + "/healthz"}, 0, "ok"},
		{"no such health service", append([]string{"health", "--addr", region.APIAddrs[0], "--tls-server-name", "region.eu-west.apiary", "--service", "bogus"},
			tlsArgs(coordCert)...), exitJobFailed, "unknown service"},
		{"nothing listening", []string{"health", "--addr", closedAddr(t), "--timeout", "1s"}, exitUnavailable, "health of"},
		{"plaintext to a TLS server", []string{"health", "--addr", region.APIAddrs[0], "--timeout", "1s"}, exitUnavailable, ""},
		{"agent: nothing listening", []string{"health", "--http", "http://" + closedAddr(t) + "/healthz"}, exitUnavailable, "health of"},
		{"agent: not 200", []string{"health", "--http", "http://" + metrics + "/no-such-page"}, exitJobFailed, "404"},
		{"not a URL", []string{"health", "--http", "127.0.0.1:1/healthz"}, exitInvalid, "--http"},
		{"both", []string{"health", "--http", "http://" + metrics + "/healthz", "--addr", region.APIAddrs[0]}, exitInvalid, "give one"},
		// A list passes only when every address serves: one that does not
		// answer fails it (exit 3), naming that address.
		{"a list with one address down", append([]string{"health", "--addr", region.APIAddrs[0] + "," + closedAddr(t), "--timeout", "1s",
			"--tls-server-name", "region.eu-west.apiary"}, tlsArgs(coordCert)...), exitUnavailable, "1 of 2 addresses not serving"},
		{"a list, every address serving", append([]string{"health", "--addr", region.APIAddrs[0] + "," + region.APIAddrs[0],
			"--tls-server-name", "region.eu-west.apiary"}, tlsArgs(coordCert)...), 0, region.APIAddrs[0] + ": SERVING\n" + region.APIAddrs[0] + ": SERVING"},
		{"a malformed list", []string{"health", "--addr", region.APIAddrs[0] + ",eu-west-2"}, exitInvalid, "--addr"},
		{"TLS flags with an http:// URL", []string{"health", "--http", "http://" + metrics + "/healthz", "--tls-ca", coordCert.CA}, exitInvalid,
			"--tls-ca: given with --http http://"},
		{"--service with --http", []string{"health", "--http", "http://" + metrics + "/healthz", "--service", "x"}, exitInvalid, "not with --http"},
	} {
		r := runCLI(t, nil, tc.args...)
		if r.code != tc.code || !strings.Contains(r.stdout+r.stderr, tc.out) {
			t.Errorf("%s: exit %d, out %q, err %q; want exit %d with %q", tc.name, r.code, r.stdout, r.stderr, tc.code, tc.out)
		}
		if tc.code == exitUnavailable && r.took > 10*time.Second {
			t.Errorf("%s took %v; a health check must give up within its --timeout", tc.name, r.took)
		}
	}
}

func TestVersionCommand(t *testing.T) {
	r := runCLI(t, nil, "version")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "apiary ") || !strings.Contains(r.stdout, runtime.Version()) {
		t.Errorf("version: exit %d, %q; want \"apiary VERSION (commit ..., %s ...)\"", r.code, r.stdout, runtime.Version())
	}
	r = runCLI(t, nil, "version", "-o", "json")
	var in struct {
		Version   string `json:"version"`
		GoVersion string `json:"go_version"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &in); err != nil || in.Version == "" || in.GoVersion != runtime.Version() {
		t.Errorf("version -o json: %q (%v); want version and go_version", r.stdout, err)
	}
	if r := runCLI(t, nil, "version", "-o", "yaml"); r.code != exitInvalid {
		t.Errorf("version -o yaml: exit %d; want %d", r.code, exitInvalid)
	}
}

func TestCheckAdvertise(t *testing.T) {
	for _, tc := range []struct {
		listen, advertise, err string
	}{
		{"127.0.0.1:7070", "", ""},
		{"0.0.0.0:7070", "eu-west-1:7070", ""},
		{"[::]:7070", "10.0.0.5:7070", ""},
		{"0.0.0.0:7070", "", "give --advertise"},
		{":7070", "", "give --advertise"},
		{"[::]:7070", "", "give --advertise"},
		{"0.0.0.0:7070", "0.0.0.0:7070", "unspecified"},
		{"0.0.0.0:7070", "eu-west-1", "not a host:port"},
		{"0.0.0.0:7070", "eu-west-1:0", "port of \"eu-west-1:0\" must be a number 1..65535"},
		{"0.0.0.0:7070", "eu-west-1:abc", "port of \"eu-west-1:abc\" must be a number 1..65535"},
		{"0.0.0.0:7070", "eu-west-1:70000", "must be a number 1..65535, got \"70000\""},
		{"0.0.0.0:7070", ":7070", "not a host:port"},
	} {
		err := checkAdvertise(tc.listen, tc.advertise)
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("checkAdvertise(%q, %q) = %v; want %q", tc.listen, tc.advertise, err, tc.err)
		}
	}
}
