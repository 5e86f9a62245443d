package regional_test

// Issue 19, phase 1 (mutual TLS on every hop and on etcd, role checks): the
// issue's attacker probes against a real region run with TLS, each refused
// and leaving the real job and etcd unchanged; certificates of another
// region, expired or untrusted refused; processes that would run without
// TLS by accident refuse to start; a job end to end with TLS.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/cliconn"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/pki"
	"apiary.dev/apiary/internal/testutil"
	"apiary.dev/apiary/regional/store"
)

// tlsCluster starts one region (Options.TLS: every process with its own
// certificate, etcd on https), with a global router when global is set,
// and stops it at test end.
func tlsCluster(t *testing.T, rs devcluster.RegionSpec, global bool) (*devcluster.Cluster, *devcluster.Region) {
	t.Helper()
	if rs.Name == "" {
		rs.Name, rs.Jurisdiction = "eu-west", "eu"
	}
	rs.ExtraArgs = append(rs.ExtraArgs, "--node-lease-ttl", "1s")
	bin := testutil.Binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	opts := devcluster.Options{Binary: bin, Dir: t.TempDir(), Regions: []devcluster.RegionSpec{rs}, TLS: true}
	if global {
		opts.Global = &devcluster.GlobalSpec{}
	}
	cl := startCluster(t, ctx, opts)
	return cl, cl.Regions[0]
}

// clientsOver dials the region's coordinators with mutual TLS as files'
// certificate (any role), verifying region.<name>.apiary.
func clientsOver(t *testing.T, r *devcluster.Region, files cliconn.TLSFiles) clients {
	t.Helper()
	rel, err := pki.NewReloader(pki.ReloaderConfig{CAFile: files.CA, CertFile: files.Cert, KeyFile: files.Key})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := cliconn.DialTLS(r.Addr(), rel, pki.RegionServerName(r.Spec.Name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return clients{conn, apiaryv1.NewJobServiceClient(conn), apiaryv1.NewAgentServiceClient(conn), apiaryv1.NewAdminServiceClient(conn)}
}

// clientsRawTLS dials addr with a hand-made TLS configuration (what a
// Reloader would refuse to load: an expired certificate, none at all).
func clientsRawTLS(t *testing.T, addr string, cfg *tls.Config) clients {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return clients{conn, apiaryv1.NewJobServiceClient(conn), apiaryv1.NewAgentServiceClient(conn), apiaryv1.NewAdminServiceClient(conn)}
}

// caPool reads a CA bundle.
func caPool(t *testing.T, path string) *x509.CertPool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		t.Fatalf("%s: no certificate", path)
	}
	return p
}

// etcdOf is an etcd client of the region's members over https, as its
// first coordinator (only region certificates of the region get in).
func etcdOf(t *testing.T, cl *devcluster.Cluster, r *devcluster.Region) *clientv3.Client {
	t.Helper()
	cli, err := cl.EtcdClient(r)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// kvSig is what "unchanged" compares of one key.
type kvSig struct {
	create, mod int64
	value       string
}

// etcdSnapshot reads the region's state: every key under /apiary/ but the
// coordinators' own (member records and the owner election, kept under
// their session leases), with create and mod revisions and value.
func etcdSnapshot(t *testing.T, cli *clientv3.Client) map[string]kvSig {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, store.Root, clientv3.WithPrefix())
	if err != nil {
		t.Fatalf("etcd read with the region's certificate: %v", err)
	}
	out := map[string]kvSig{}
	for _, kv := range resp.Kvs {
		k := string(kv.Key)
		if strings.HasPrefix(k, store.PrefMembers) || strings.HasPrefix(k, store.PrefShards+"/") {
			continue
		}
		out[k] = sig(kv)
	}
	return out
}

func sig(kv *mvccpb.KeyValue) kvSig {
	return kvSig{create: kv.CreateRevision, mod: kv.ModRevision, value: string(kv.Value)}
}

// sameEtcd fails the test naming every key added, removed or changed.
func sameEtcd(t *testing.T, what string, before, after map[string]kvSig) {
	t.Helper()
	var diffs []string
	for k, b := range before {
		a, ok := after[k]
		switch {
		case !ok:
			diffs = append(diffs, "deleted "+k)
		case a != b:
			diffs = append(diffs, fmt.Sprintf("changed %s (mod %d -> %d, value %s -> %s)", k, b.mod, a.mod, b.value, a.value))
		}
	}
	for k := range after {
		if _, ok := before[k]; !ok {
			diffs = append(diffs, "added "+k)
		}
	}
	if len(diffs) > 0 {
		t.Errorf("%s changed etcd:\n  %s", what, strings.Join(diffs, "\n  "))
	}
}

// settleUsage waits until every node's usage record carries its current
// epoch: the scheduler rewrites a node's usage record registered with none
// at a later round (syncUsage), a write of its own that a probe must not
// be blamed for.
func settleUsage(t *testing.T, cli *clientv3.Client, epochs map[string]int64) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, "usage records synced", func() error {
		for id, epoch := range epochs {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			resp, err := cli.Get(ctx, store.KeyNodeUsage(id))
			cancel()
			if err != nil {
				return err
			}
			var u struct{ Epoch int64 }
			if len(resp.Kvs) == 0 || json.Unmarshal(resp.Kvs[0].Value, &u) != nil || u.Epoch != epoch {
				return fmt.Errorf("node %s's usage record is not of epoch %d yet", id, epoch)
			}
		}
		return nil
	})
}

// refused asserts err is a refusal by the authorization gate or the TLS
// layer: code is what the call must fail with.
func refused(t *testing.T, what string, err error, code codes.Code, text string) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), text) {
		t.Errorf("%s: %v; want %s containing %q", what, err, code, text)
	}
}

// nodeEpochs is ListNodes' epoch per node id.
func nodeEpochs(t *testing.T, c clients) map[string]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.admin.ListNodes(ctx, &apiaryv1.ListNodesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, n := range resp.GetNodes() {
		out[n.GetId()] = n.GetEpoch()
	}
	return out
}

// firstCoordLog is the region's first coordinator's log.
func firstCoordLog(t *testing.T, r *devcluster.Region) string {
	t.Helper()
	b, err := os.ReadFile(r.Coords[0].LogPath)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestSecurityProbes runs the issue's five attacker probes (and other
// certificates that must not get in) against a one-member region with two
// real agents, all with mutual TLS, while a real task runs on one of them
// (the victim). Every probe is refused and leaves etcd unchanged (every key
// under /apiary/ but the coordinators' leases: same create and mod
// revision, same value); the victim keeps its epoch, and when the task is
// let finish its real result is the one that counts.
func TestSecurityProbes(t *testing.T) {
	cl, r := tlsCluster(t, devcluster.RegionSpec{Agents: twoAgents()}, false)
	c := dial(t, r) // the cluster's client certificate
	if err := r.WaitNodes(t.Context(), 2); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	id := submit(t, c, spec(t, gatedJob(dir, 1, "")))
	victim := waitAttemptRunning(t, c, id, 0, 1, 30*time.Second).GetNodeId()
	other := map[string]string{"n1": "n2", "n2": "n1"}[victim]
	epochs := nodeEpochs(t, c)
	etcd := etcdOf(t, cl, r)
	settleUsage(t, etcd, epochs)
	before := etcdSnapshot(t, etcd)
	aliveKey := store.KeyNodeAlive(victim)
	if _, ok := before[aliveKey]; !ok {
		t.Fatalf("no %s in etcd: %v", aliveKey, before)
	}
	ctx := t.Context()
	call := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 10*time.Second) }
	huge := &apiaryv1.Resources{CpuMillis: 1 << 29, MemoryMb: 1 << 39} // within RegisterNode's bounds
	p := cl.PKI()
	otherAgent, err := p.Cert(pki.RoleAgent, r.Spec.Name, other)
	if err != nil {
		t.Fatal(err)
	}
	asOther := clientsOver(t, r, otherAgent)
	asClient := c
	check := func(what string) {
		t.Helper()
		sameEtcd(t, what, before, etcdSnapshot(t, etcd))
	}

	// (a) A rogue RegisterNode: with a client certificate (wrong role),
	// over plaintext, and over TLS without a certificate.
	t.Run("RogueRegisterNode", func(t *testing.T) {
		cctx, cancel := call()
		defer cancel()
		_, err := asClient.agent.RegisterNode(cctx, &apiaryv1.RegisterNodeRequest{NodeId: "rogue", Capacity: huge})
		refused(t, "RegisterNode as a client certificate", err, codes.PermissionDenied, "a client certificate cannot call AgentService")

		plain, err := cliconn.Dial(r.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer plain.Close()
		_, err = apiaryv1.NewAgentServiceClient(plain).RegisterNode(cctx, &apiaryv1.RegisterNodeRequest{NodeId: "rogue", Capacity: huge})
		var te *cliconn.TLSError
		if !errors.As(err, &te) || te.Kind != cliconn.TLSRequired || status.Code(err) != codes.Unavailable {
			t.Errorf("RegisterNode over plaintext: %v; want UNAVAILABLE, a TLSError of kind TLSRequired (the TLS server closed the connection)", err)
		}
		// TLS that trusts the region but presents no certificate: the
		// server ends the handshake (it requires one), so nothing reaches
		// the API.
		noCert := clientsRawTLS(t, r.APIAddrs[0], &tls.Config{RootCAs: caPool(t, p.CAFile()), ServerName: pki.RegionServerName(r.Spec.Name),
			MinVersion: tls.VersionTLS13})
		_, err = noCert.agent.RegisterNode(cctx, &apiaryv1.RegisterNodeRequest{NodeId: "rogue", Capacity: huge})
		refused(t, "RegisterNode over TLS without a certificate", err, codes.Unavailable, "")
		check("a rogue RegisterNode")
	})

	// (b) RegisterNode with the victim's id over the other agent's
	// certificate (and a heartbeat and a deregistration for it): refused,
	// and the victim's epoch goes on.
	t.Run("RegisterNodeWithAnotherNodesID", func(t *testing.T) {
		cctx, cancel := call()
		defer cancel()
		_, err := asOther.agent.RegisterNode(cctx, &apiaryv1.RegisterNodeRequest{NodeId: victim, Capacity: huge})
		refused(t, "RegisterNode "+victim+" as "+other, err, codes.PermissionDenied,
			fmt.Sprintf("agent certificate of node %s cannot act for node %s", other, victim))
		_, err = asOther.agent.Heartbeat(cctx, &apiaryv1.HeartbeatRequest{NodeId: victim, NodeEpoch: epochs[victim]})
		refused(t, "Heartbeat "+victim+" as "+other, err, codes.PermissionDenied, "cannot act for node "+victim)
		_, err = asOther.agent.Deregister(cctx, &apiaryv1.DeregisterRequest{NodeId: victim, NodeEpoch: epochs[victim]})
		refused(t, "Deregister "+victim+" as "+other, err, codes.PermissionDenied, "cannot act for node "+victim)
		check("RegisterNode with another node's id")
		if got := nodeEpochs(t, c)[victim]; got != epochs[victim] {
			t.Errorf("victim %s's epoch went from %d to %d", victim, epochs[victim], got)
		}
		if !strings.Contains(firstCoordLog(t, r), "reason=node_mismatch") {
			t.Error("the coordinator logged no node_mismatch denial")
		}
	})

	// (c) ReportTaskStatus for the victim's task with the other agent's
	// certificate: as the victim (refused by the gate), and as itself with
	// its own epoch (the gate lets it through; the region rejects a report
	// from a node that does not run the attempt).
	t.Run("ForgedReport", func(t *testing.T) {
		cctx, cancel := call()
		defer cancel()
		forged := &apiaryv1.ReportTaskStatusRequest{NodeId: victim, NodeEpoch: epochs[victim], JobId: id, TaskIndex: 0, Attempt: 1,
			Kind: apiaryv1.ReportKind_REPORT_KIND_EXITED, ExitCode: 0, StdoutTail: "forged output", EndTimeMs: time.Now().UnixMilli()}
		_, err := asOther.agent.ReportTaskStatus(cctx, forged)
		refused(t, "ReportTaskStatus for "+victim+" as "+other, err, codes.PermissionDenied, "cannot act for node "+victim)
		forged.NodeId, forged.NodeEpoch = other, epochs[other]
		resp, err := asOther.agent.ReportTaskStatus(cctx, forged)
		if err == nil && resp.GetAccepted() {
			t.Errorf("a report of %s's attempt by %s (its own id and epoch) was accepted", victim, other)
		}
		check("a forged ReportTaskStatus")
		if tk := waitAttemptRunning(t, c, id, 0, 1, time.Second); tk.GetNodeId() != victim {
			t.Errorf("task moved to %s", tk.GetNodeId())
		}
	})

	// (d) CancelJob and GetJobLogs with an agent certificate.
	t.Run("JobAPIWithAgentCertificate", func(t *testing.T) {
		cctx, cancel := call()
		defer cancel()
		_, err := asOther.jobs.CancelJob(cctx, &apiaryv1.CancelJobRequest{JobId: id})
		refused(t, "CancelJob as an agent", err, codes.PermissionDenied, "an agent certificate cannot call JobService")
		_, err = asOther.jobs.GetJobLogs(cctx, &apiaryv1.GetJobLogsRequest{JobId: id, TaskIndex: -1})
		refused(t, "GetJobLogs as an agent", err, codes.PermissionDenied, "an agent certificate cannot call JobService")
		_, err = asOther.admin.ListNodes(cctx, &apiaryv1.ListNodesRequest{})
		refused(t, "ListNodes as an agent", err, codes.PermissionDenied, "an agent certificate cannot call AdminService")
		check("CancelJob and GetJobLogs as an agent")
	})

	// (e) etcd's client port: plaintext, TLS without a certificate, and
	// TLS with certificates of the CA that are not this region's
	// coordinators' (an agent's, a client's, another region's
	// coordinator's) read nothing and delete nothing.
	t.Run("EtcdClientPort", func(t *testing.T) {
		var plainEPs []string
		for _, ep := range r.EtcdEndpoints {
			if !strings.HasPrefix(ep, "https://") {
				t.Fatalf("etcd endpoint %s is not https", ep)
			}
			plainEPs = append(plainEPs, "http://"+strings.TrimPrefix(ep, "https://"))
		}
		usRegion, err := p.Cert(pki.RoleRegion, "us-east", "us-east-c1")
		if err != nil {
			t.Fatal(err)
		}
		tries := []struct {
			name string
			eps  []string
			cfg  *tls.Config
		}{
			{"plaintext", plainEPs, nil},
			{"TLS without a certificate", r.EtcdEndpoints, &tls.Config{RootCAs: caPool(t, p.CAFile())}},
		}
		for _, f := range []struct {
			name  string
			files cliconn.TLSFiles
		}{{"an agent certificate", otherAgent}, {"the client certificate", cl.ClientTLS()}, {"a region certificate of us-east", usRegion}} {
			cfg, err := devcluster.TLSConfig(f.files)
			if err != nil {
				t.Fatal(err)
			}
			tries = append(tries, struct {
				name string
				eps  []string
				cfg  *tls.Config
			}{f.name, r.EtcdEndpoints, cfg})
		}
		for _, try := range tries {
			cli, err := clientv3.New(clientv3.Config{Endpoints: try.eps, TLS: try.cfg, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
			if err != nil {
				continue // refused at once: as good
			}
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			resp, err := cli.Get(cctx, store.Root, clientv3.WithPrefix())
			if err == nil {
				t.Errorf("etcd %s: read %d keys", try.name, len(resp.Kvs))
			}
			if _, err := cli.Delete(cctx, aliveKey); err == nil {
				t.Errorf("etcd %s: deleted %s", try.name, aliveKey)
			}
			cancel()
			cli.Close()
		}
		check("etcd's client port without a coordinator's certificate")
	})

	// Certificates that no server accepts: a region certificate of
	// another region (same CA), an expired client certificate, one of
	// another CA.
	t.Run("OtherRegionExpiredUntrusted", func(t *testing.T) {
		cctx, cancel := call()
		defer cancel()
		usRegion, err := p.Cert(pki.RoleRegion, "us-east", "us-east-c1")
		if err != nil {
			t.Fatal(err)
		}
		asUS := clientsOver(t, r, usRegion)
		_, err = asUS.jobs.ListJobs(cctx, &apiaryv1.ListJobsRequest{})
		refused(t, "ListJobs as a region certificate of us-east", err, codes.PermissionDenied,
			"a region certificate of region us-east cannot act in region eu-west")
		_, err = asUS.jobs.CancelJob(cctx, &apiaryv1.CancelJobRequest{JobId: id})
		refused(t, "CancelJob as us-east", err, codes.PermissionDenied, "region us-east cannot act in region eu-west")
		_, err = asUS.agent.RegisterNode(cctx, &apiaryv1.RegisterNodeRequest{NodeId: "rogue", Capacity: huge})
		refused(t, "RegisterNode as us-east", err, codes.PermissionDenied, "region us-east cannot act in region eu-west")

		// An agent certificate of another region cannot act as a node
		// here, even under its own id.
		usAgent, err := p.Cert(pki.RoleAgent, "us-east", "rogue")
		if err != nil {
			t.Fatal(err)
		}
		_, err = clientsOver(t, r, usAgent).agent.RegisterNode(cctx, &apiaryv1.RegisterNodeRequest{NodeId: "rogue", Capacity: huge})
		refused(t, "RegisterNode as an agent of us-east", err, codes.PermissionDenied, "agent certificate of region us-east")

		now := time.Now()
		expired, err := p.Issue(pki.CertOptions{Role: pki.RoleClient, ID: "expired", NotBefore: now.Add(-48 * time.Hour), NotAfter: now.Add(-24 * time.Hour)},
			"global-client-expired")
		if err != nil {
			t.Fatal(err)
		}
		other, err := devcluster.NewPKI(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		untrusted, err := other.Cert(pki.RoleClient, "", "cli")
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range []struct {
			name  string
			files cliconn.TLSFiles
		}{{"an expired client certificate", expired}, {"a client certificate of another CA", untrusted}} {
			pair, err := tls.LoadX509KeyPair(f.files.Cert, f.files.Key)
			if err != nil {
				t.Fatal(err)
			}
			cs := clientsRawTLS(t, r.APIAddrs[0], &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: caPool(t, p.CAFile()),
				ServerName: pki.RegionServerName(r.Spec.Name), MinVersion: tls.VersionTLS13})
			_, err = cs.jobs.ListJobs(cctx, &apiaryv1.ListJobsRequest{})
			refused(t, "ListJobs with "+f.name, err, codes.Unavailable, "")
			_, err = cs.agent.RegisterNode(cctx, &apiaryv1.RegisterNodeRequest{NodeId: "rogue", Capacity: huge})
			refused(t, "RegisterNode with "+f.name, err, codes.Unavailable, "")
		}
		check("certificates of another region, expired or untrusted")
	})

	// The real task, let finish, completes once, on attempt 1, with its
	// own result; the victim never lost its epoch.
	openGate(t, dir)
	checkOnce(t, c, id, dir, 1)
	for _, tk := range logs(t, c, id) {
		for _, a := range tk.GetAttempts() {
			if strings.Contains(a.GetStdoutTail(), "forged") {
				t.Errorf("attempt %d's recorded output is the forged one: %q", a.GetAttempt(), a.GetStdoutTail())
			}
		}
	}
	if got := nodeEpochs(t, c)[victim]; got != epochs[victim] {
		t.Errorf("victim %s's epoch went from %d to %d", victim, epochs[victim], got)
	}
}

// runBin runs the apiary binary with env added (APIARY_* of the test's
// own environment removed) and returns its exit code and output.
func runBin(t *testing.T, env []string, args ...string) cliRun {
	t.Helper()
	cmd := exec.Command(testutil.Binary(t), args...)
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "APIARY_") {
			cmd.Env = append(cmd.Env, e)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	err := cmd.Run()
	res := cliRun{stdout: out.String(), stderr: errb.String(), took: time.Since(start)}
	if ee, ok := err.(*exec.ExitError); ok {
		res.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("apiary %v: %v", args, err)
	}
	return res
}

// TestSecurityStartRefusals: a server process that would run without TLS
// by accident, or with a certificate that is not its own, refuses to start
// with exit 2 and says which flags to give; --insecure-dev runs plaintext
// and says so at WARN.
func TestSecurityStartRefusals(t *testing.T) {
	dir := t.TempDir()
	p, err := devcluster.NewPKI(filepath.Join(dir, "tls"))
	if err != nil {
		t.Fatal(err)
	}
	cert := func(role, region, id string) []string {
		f, err := p.Cert(role, region, id)
		if err != nil {
			t.Fatal(err)
		}
		return devcluster.Args(f)
	}
	region := func(extra ...string) []string {
		return append([]string{"region", "--id", "c1", "--region", "eu-west", "--data-dir", filepath.Join(dir, "d"),
			"--listen", testutil.FreeAddr(t), "--etcd-client-url", "http://" + testutil.FreeAddr(t),
			"--etcd-peer-url", "http://" + testutil.FreeAddr(t)}, extra...)
	}
	regionTLS := func(extra ...string) []string {
		return append([]string{"region", "--id", "c1", "--region", "eu-west", "--data-dir", filepath.Join(dir, "d"),
			"--listen", testutil.FreeAddr(t)}, extra...)
	}
	agentCert := cert(pki.RoleAgent, "eu-west", "n1")
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"region without TLS or --insecure-dev", region(), []string{"--tls-ca, --tls-cert and --tls-key", "apiary tls ca create", "--insecure-dev", `README, "TLS"`}},
		{"global without TLS or --insecure-dev", []string{"global", "--listen", testutil.FreeAddr(t), "--wan-bind", testutil.FreeAddr(t)},
			[]string{"apiary global: no TLS", "--role router", "--insecure-dev"}},
		{"agent without TLS or --insecure-dev", []string{"agent", "--addr", testutil.FreeAddr(t), "--node-id", "n1", "--data-dir", filepath.Join(dir, "a")},
			[]string{"apiary agent: no TLS", "--role agent", "--insecure-dev"}},
		{"region with an agent certificate", regionTLS(cert(pki.RoleAgent, "eu-west", "n1")...),
			[]string{"--tls-cert", "is an agent certificate", "needs a region certificate"}},
		{"region with another region's certificate", regionTLS(cert(pki.RoleRegion, "us-east", "c1")...),
			[]string{"--tls-cert", `is for region "us-east"`, `this process is in region "eu-west"`}},
		{"region with TLS and an http etcd client URL", regionTLS(append(cert(pki.RoleRegion, "eu-west", "c1"),
			"--etcd-client-url", "http://"+testutil.FreeAddr(t))...), []string{"--etcd-client-url http://", "https://"}},
		{"region with TLS and an http initial cluster", regionTLS(append(cert(pki.RoleRegion, "eu-west", "c1"),
			"--initial-cluster", "c1=http://127.0.0.1:2380")...), []string{"--initial-cluster", "https://"}},
		{"region with TLS and --insecure-dev", region(append(cert(pki.RoleRegion, "eu-west", "c1"), "--insecure-dev")...),
			[]string{"--insecure-dev and --tls-ca/--tls-cert/--tls-key"}},
		{"region with two of the three TLS files", region("--tls-ca", p.CAFile(), "--tls-cert", agentCert[3]),
			[]string{"--tls-key: required"}},
		{"agent whose --node-id is not its certificate's", append([]string{"agent", "--addr", testutil.FreeAddr(t), "--node-id", "n2",
			"--data-dir", filepath.Join(dir, "a")}, agentCert...), []string{"--node-id n2", "is of node n1"}},
	} {
		res := runBin(t, nil, tc.args...)
		if res.code != 2 {
			t.Errorf("%s: exit %d, want 2\n%s", tc.name, res.code, res.stderr)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(res.stderr, w) {
				t.Errorf("%s: stderr does not say %q:\n%s", tc.name, w, res.stderr)
			}
		}
	}

	// --insecure-dev starts, and warns.
	ready := filepath.Join(dir, "ready")
	cmd := exec.Command(testutil.Binary(t), region("--insecure-dev", "--ready-file", ready)...)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	testutil.Eventually(t, 30*time.Second, "coordinator with --insecure-dev ready", func() error {
		_, err := os.Stat(ready)
		return err
	})
	_ = cmd.Process.Signal(os.Interrupt)
	_ = cmd.Wait()
	if !strings.Contains(errb.String(), "level=WARN") || !strings.Contains(errb.String(), "running WITHOUT TLS (--insecure-dev): any process that can reach the API") {
		t.Errorf("no WARN about running without TLS:\n%s", errb.String())
	}
}

// TestSecurityJobEndToEndTLS: with mutual TLS everywhere (a global router,
// a three-member region whose etcd peers talk https, one agent), the CLI
// given the client certificate through APIARY_CACERT/APIARY_CLIENT_CERT/
// APIARY_CLIENT_KEY runs a job through the router and straight at the
// region; without it, it exits 3 saying the server requires TLS; a
// coordinator asks its peers for a job's spans over mutual TLS; the router
// refuses an agent certificate.
func TestSecurityJobEndToEndTLS(t *testing.T) {
	cl, r := tlsCluster(t, devcluster.RegionSpec{Coordinators: 3, Agents: []devcluster.AgentSpec{{ID: "n1"}}}, true)
	env := cl.ClientEnv()
	c := dial(t, r)
	id := submit(t, c, spec(t, "name: traced\ntasks:\n  - name: t\n    command: \"true\"\n"))
	waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 30*time.Second)
	for i, addr := range r.APIAddrs {
		one := clientsOver(t, &devcluster.Region{Spec: r.Spec, APIAddrs: []string{addr}}, cl.ClientTLS())
		tctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		tr, err := one.jobs.GetJobTrace(tctx, &apiaryv1.GetJobTraceRequest{JobId: id})
		cancel()
		if err != nil || len(tr.GetUnavailable()) > 0 || len(tr.GetSpansJsonl()) == 0 {
			t.Errorf("GetJobTrace at coordinator %d (asks its 2 peers over mutual TLS): %v, unavailable %q, %d bytes of spans",
				i, err, tr.GetUnavailable(), len(tr.GetSpansJsonl()))
		}
	}
	for _, addr := range []string{cl.GlobalAddr, r.Addr()} {
		res := runBin(t, env, "job", "run", "../examples/hello.yaml", "--wait", "--addr", addr)
		if res.code != 0 || !strings.Contains(res.stdout+res.stderr, "COMPLETE") {
			t.Fatalf("job run via %s: exit %d\n%s\n%s", addr, res.code, res.stdout, res.stderr)
		}
	}
	res := runBin(t, env, "region", "status", "--addr", r.Addr())
	if res.code != 0 || !strings.Contains(res.stdout, "answers") {
		t.Errorf("region status: exit %d\n%s\n%s", res.code, res.stdout, res.stderr)
	}
	for _, addr := range []string{cl.GlobalAddr, r.Addr()} {
		res := runBin(t, nil, "job", "list", "--addr", addr)
		first, _, _ := strings.Cut(addr, ",") // the error names the address probed
		want := "the server at " + first + " requires TLS: pass --tls-ca/--tls-cert/--tls-key or set APIARY_CACERT/APIARY_CLIENT_CERT/APIARY_CLIENT_KEY"
		if res.code != 3 || !strings.Contains(res.stderr, want) {
			t.Errorf("job list via %s without a certificate: exit %d, want 3 and %q:\n%s", addr, res.code, want, res.stderr)
		}
		if res.took > 5*time.Second {
			t.Errorf("job list via %s without a certificate took %s", addr, res.took)
		}
	}
	// Two of three files: exit 2 naming the missing one.
	res = runBin(t, env[:2], "job", "list", "--addr", cl.GlobalAddr)
	if res.code != 2 || !strings.Contains(res.stderr, "--tls-key (or $APIARY_CLIENT_KEY): required") {
		t.Errorf("two TLS files of three: exit %d\n%s", res.code, res.stderr)
	}

	agentFiles, err := cl.PKI().Cert(pki.RoleAgent, r.Spec.Name, "n1")
	if err != nil {
		t.Fatal(err)
	}
	rel, err := pki.NewReloader(pki.ReloaderConfig{CAFile: agentFiles.CA, CertFile: agentFiles.Cert, KeyFile: agentFiles.Key})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := cliconn.DialTLS(cl.GlobalAddr, rel, pki.RouterServerName)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err = apiaryv1.NewJobServiceClient(conn).ListJobs(ctx, &apiaryv1.ListJobsRequest{})
	refused(t, "the router's ListJobs as an agent", err, codes.PermissionDenied, "an agent certificate cannot call JobService")
	// The router registers no AgentService: gRPC answers before any
	// interceptor runs.
	_, err = apiaryv1.NewAgentServiceClient(conn).RegisterNode(ctx, &apiaryv1.RegisterNodeRequest{NodeId: "n1"})
	refused(t, "the router's RegisterNode", err, codes.Unimplemented, "unknown service apiary.v1.AgentService")
}
