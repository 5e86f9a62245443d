package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/pki"
	"apiary.dev/apiary/internal/testutil"
)

// TestHealthProbesUnderQuorumLoss is what the deployment files' probes
// rely on (deploy/k8s: readiness asks gRPC health, liveness /healthz): a
// three-member region whose two other members die is alive but cannot
// commit. Its gRPC health says NOT_SERVING (exit 1: a readiness probe takes
// it out of its Service), while /healthz keeps answering 200 (a liveness
// probe restarts nothing: a restart would not bring the quorum back, and
// would take the member's state offline while it reloads). A list of the
// three addresses passes while all serve and fails, naming the dead one,
// as soon as one does not.
func TestHealthProbesUnderQuorumLoss(t *testing.T) {
	dir := t.TempDir()
	type member struct {
		id, api, metrics, client, peer, ready string
		p                                     *proc
	}
	var ms []*member
	var cluster []string
	for i := 1; i <= 3; i++ {
		m := &member{id: fmt.Sprintf("c%d", i), api: testutil.FreeAddr(t), metrics: testutil.FreeAddr(t),
			client: "http://" + testutil.FreeAddr(t), peer: "http://" + testutil.FreeAddr(t)}
		m.ready = filepath.Join(dir, m.id+".ready")
		cluster = append(cluster, m.id+"="+m.peer)
		ms = append(ms, m)
	}
	for _, m := range ms {
		m.p = startProc(t, "region", "--insecure-dev", "--id", m.id, "--region", "eu-west", "--jurisdiction", "eu", "--shards", "16",
			"--data-dir", filepath.Join(dir, m.id), "--listen", m.api, "--metrics-addr", m.metrics,
			"--etcd-client-url", m.client, "--etcd-peer-url", m.peer, "--initial-cluster", strings.Join(cluster, ","),
			"--ready-file", m.ready)
	}
	for _, m := range ms {
		waitFile(t, m.p, m.ready)
	}
	all := ms[0].api + "," + ms[1].api + "," + ms[2].api
	testutil.Eventually(t, 20*time.Second, "every member serving", func() error {
		if r := runCLI(t, nil, "health", "--addr", all); r.code != 0 || strings.Count(r.stdout, ": SERVING\n") != 3 {
			return fmt.Errorf("exit %d, out %q, err %q; want exit 0 and three SERVING lines", r.code, r.stdout, r.stderr)
		}
		return nil
	})

	ms[2].p.cmd.Process.Kill()
	ms[2].p.exit(t, 10*time.Second)
	r := runCLI(t, nil, "health", "--addr", all, "--timeout", "1s")
	if r.code != exitUnavailable || !strings.Contains(r.stderr, "1 of 3 addresses not serving") || !strings.Contains(r.stderr, ms[2].api) ||
		!strings.Contains(r.stdout, ms[0].api+": SERVING") {
		t.Fatalf("a list with one member dead: exit %d, out %q, err %q; want exit %d naming %s", r.code, r.stdout, r.stderr, exitUnavailable, ms[2].api)
	}

	ms[1].p.cmd.Process.Kill()
	ms[1].p.exit(t, 10*time.Second)
	testutil.Eventually(t, 30*time.Second, "the member alone says NOT_SERVING", func() error {
		if r := runCLI(t, nil, "health", "--addr", ms[0].api); r.code != exitJobFailed || !strings.Contains(r.stderr, "NOT_SERVING") {
			return fmt.Errorf("exit %d, out %q, err %q; want exit %d (answered, NOT_SERVING)", r.code, r.stdout, r.stderr, exitJobFailed)
		}
		return nil
	})
	// Alive all along: /healthz answers while the quorum is gone.
	for i := 0; i < 3; i++ {
		if r := runCLI(t, nil, "health", "--http", "http://"+ms[0].metrics+"/healthz"); r.code != 0 || !strings.Contains(r.stdout, "ok") {
			t.Fatalf("liveness of a member without a quorum: exit %d, out %q, err %q; want exit 0 (the process is alive)", r.code, r.stdout, r.stderr)
		}
		time.Sleep(500 * time.Millisecond)
	}
	select {
	case err := <-ms[0].p.done:
		t.Fatalf("the member without a quorum exited (%v):\n%s", err, ms[0].p.out.String())
	default:
	}
}

// TestHealthHTTPSUsesTLSFlags: `health --http https://...` verifies the
// server with --tls-ca and --tls-server-name and presents --tls-cert (an
// endpoint behind a TLS proxy that requires client certificates; Apiary's
// own /healthz is plain HTTP). The server here is a Go TLS server with the
// deployment CA's router certificate, requiring a client certificate of
// that CA.
func TestHealthHTTPSUsesTLSFlags(t *testing.T) {
	ca, err := devcluster.NewPKI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	srvFiles, err := ca.Issue(pki.CertOptions{Role: pki.RoleRouter, ID: "r1", IPs: []string{"127.0.0.1"}}, "router")
	if err != nil {
		t.Fatal(err)
	}
	client, err := ca.Cert("client", "", "probe")
	if err != nil {
		t.Fatal(err)
	}
	r, err := srvFiles.Load()
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/healthz" || len(req.TLS.PeerCertificates) == 0 {
			http.NotFound(w, req)
			return
		}
		fmt.Fprintln(w, "ok")
	}))
	srv.TLS = r.ServerTLSConfig()
	srv.StartTLS()
	defer srv.Close()
	url := srv.URL + "/healthz"
	tlsArgs := []string{"--tls-ca", client.CA, "--tls-cert", client.Cert, "--tls-key", client.Key}
	for _, tc := range []struct {
		name string
		args []string
		code int
		out  string
	}{
		{"the CA, a client certificate, the URL's host", append([]string{"health", "--http", url}, tlsArgs...), 0, "ok"},
		{"--tls-server-name the certificate carries", append([]string{"health", "--http", url, "--tls-server-name", "router.global.apiary"}, tlsArgs...), 0, "ok"},
		{"--tls-server-name it does not carry", append([]string{"health", "--http", url, "--tls-server-name", "region.eu-west.apiary"}, tlsArgs...),
			exitUnavailable, "health of " + url},
		{"no TLS files: the system's CAs do not know this one", []string{"health", "--http", url}, exitUnavailable, "certificate"},
		{"the CA without a client certificate", []string{"health", "--http", url, "--tls-ca", client.CA}, exitInvalid, "--tls-cert"},
		{"the files from the environment", nil, 0, "ok"},
	} {
		var env []string
		args := tc.args
		if args == nil {
			args = []string{"health", "--http", url}
			env = []string{"APIARY_CACERT=" + client.CA, "APIARY_CLIENT_CERT=" + client.Cert, "APIARY_CLIENT_KEY=" + client.Key}
		}
		res := runCLI(t, env, args...)
		if res.code != tc.code || !strings.Contains(res.stdout+res.stderr, tc.out) {
			t.Errorf("%s: exit %d, out %q, err %q; want exit %d with %q", tc.name, res.code, res.stdout, res.stderr, tc.code, tc.out)
		}
	}
}
