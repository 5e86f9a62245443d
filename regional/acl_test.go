package regional_test

// Issue 19, items 4 and 5 on the region: ACL tokens, policies and
// namespaces (Nomad's ACL system) and agent join tokens, against real
// regions (apiary region --acl), with mutual TLS and without.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/acl"
	"apiary.dev/apiary/internal/cliconn"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/pki"
	"apiary.dev/apiary/internal/testutil"
)

// aclClients are the region's services as one token (and one
// certificate) sees them.
type aclClients struct {
	clients
	acl apiaryv1.ACLServiceClient
}

// asToken dials the region's coordinators with the cluster's client
// certificate (with TLS) and secret as the ACL token ("": none).
func asToken(t *testing.T, cl *devcluster.Cluster, r *devcluster.Region, secret string) aclClients {
	t.Helper()
	var rel *pki.Reloader
	name := ""
	if cl.TLS() {
		files := cl.ClientTLS()
		var err error
		if rel, err = pki.NewReloader(pki.ReloaderConfig{CAFile: files.CA, CertFile: files.Cert, KeyFile: files.Key}); err != nil {
			t.Fatal(err)
		}
		name = pki.RegionServerName(r.Spec.Name)
	}
	conn, err := cliconn.DialTLS(r.Addr(), rel, name, cliconn.WithToken(secret))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return aclClients{clients{conn, apiaryv1.NewJobServiceClient(conn), apiaryv1.NewAgentServiceClient(conn), apiaryv1.NewAdminServiceClient(conn)},
		apiaryv1.NewACLServiceClient(conn)}
}

// callCtx is a 10 s call context of the test.
func callCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// mkToken makes a token with the management client m.
func mkToken(t *testing.T, m aclClients, req *apiaryv1.CreateACLTokenRequest) *apiaryv1.ACLToken {
	t.Helper()
	resp, err := m.acl.CreateACLToken(callCtx(t), req)
	if err != nil {
		t.Fatalf("create token %v: %v", req, err)
	}
	return resp.GetToken()
}

// applyPolicy applies a policy file with the management client m.
func applyPolicy(t *testing.T, m aclClients, name, yaml string) {
	t.Helper()
	p, err := acl.ParsePolicyYAML(name, []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.acl.ApplyACLPolicy(callCtx(t), &apiaryv1.ApplyACLPolicyRequest{Policy: p}); err != nil {
		t.Fatal(err)
	}
}

// submitAs submits spec with c and returns the job id (fails the test on
// an error).
func submitAs(t *testing.T, c aclClients, s *apiaryv1.JobSpec, clientID, requestID string) string {
	t.Helper()
	resp, err := c.jobs.SubmitJob(callCtx(t), &apiaryv1.SubmitJobRequest{Spec: s, ClientId: clientID, RequestId: requestID})
	if err != nil {
		t.Fatalf("submit: %v", err)
	}
	return resp.GetJobId()
}

// nsSpec is a one-task job in namespace ns running command.
func nsSpec(t *testing.T, ns, command string) *apiaryv1.JobSpec {
	return spec(t, fmt.Sprintf("name: j\nnamespace: %s\ntasks:\n  - name: t\n    command: %q\n", ns, command))
}

// TestACLRegion runs a region with mutual TLS and ACLs (devcluster
// Options.ACL: bootstrapped, two agents with join tokens bound to their
// node ids) through the cases: bootstrap once; no, unknown and
// expired tokens; namespace isolation of every job call, with etcd
// unchanged by the refused ones; list filters; node and operator
// capabilities; a router certificate's own calls; join tokens binding at
// first registration; a revoked agent token fencing its node at once (its
// running task re-placed on the other node, the agent unable to
// register); denial logs with the accessor and never a secret; the
// denial counter.
func TestACLRegion(t *testing.T) {
	metrics := testutil.FreeAddr(t)
	bin := testutil.Binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cl := startCluster(t, ctx, devcluster.Options{Binary: bin, Dir: t.TempDir(), TLS: true, ACL: true,
		Regions: []devcluster.RegionSpec{{Name: "eu-west", Jurisdiction: "eu", Agents: twoAgents(),
			ExtraArgs: []string{"--node-lease-ttl", "1s", "--failover-grace", "0s", "--metrics-addr", metrics}}}})
	r := cl.Regions[0]
	mgmtSecret := cl.ManagementToken()
	m := asToken(t, cl, r, mgmtSecret)
	self, err := m.acl.GetACLSelf(callCtx(t), &apiaryv1.GetACLSelfRequest{})
	if err != nil || self.GetToken().GetType() != acl.TypeManagement || self.GetToken().GetSecretId() != "" {
		t.Fatalf("GetACLSelf as management: %v, %v", self, err)
	}
	mgmtAccessor := self.GetToken().GetAccessorId()

	applyPolicy(t, m, "team-a", "namespaces:\n  - name: a\n    capabilities: [submit, read, cancel]\n")
	applyPolicy(t, m, "team-b", "namespaces:\n  - name: b\n    capabilities: [submit, read, cancel]\n")
	applyPolicy(t, m, "nodes-read", "node: read\n")
	ta := mkToken(t, m, &apiaryv1.CreateACLTokenRequest{Name: "team a", Policies: []string{"team-a"}})
	tb := mkToken(t, m, &apiaryv1.CreateACLTokenRequest{Name: "team b", Policies: []string{"team-b"}})
	tn := mkToken(t, m, &apiaryv1.CreateACLTokenRequest{Name: "node reader", Policies: []string{"nodes-read"}})
	a, b, n := asToken(t, cl, r, ta.GetSecretId()), asToken(t, cl, r, tb.GetSecretId()), asToken(t, cl, r, tn.GetSecretId())
	secrets := []string{mgmtSecret, ta.GetSecretId(), tb.GetSecretId(), tn.GetSecretId()}

	t.Run("BootstrapOnce", func(t *testing.T) {
		_, err := m.acl.BootstrapACL(callCtx(t), &apiaryv1.BootstrapACLRequest{})
		refused(t, "a second bootstrap", err, codes.AlreadyExists, "bootstrapped already")
		resp, err := asToken(t, cl, r, "").acl.BootstrapACL(callCtx(t), &apiaryv1.BootstrapACLRequest{AccessorId: mgmtAccessor, SecretId: mgmtSecret})
		if err != nil || resp.GetToken().GetAccessorId() != mgmtAccessor {
			t.Errorf("a repeat with the same ids (no token): %v, %v", resp, err)
		}
	})

	t.Run("NoUnknownExpiredToken", func(t *testing.T) {
		ttl := mkToken(t, m, &apiaryv1.CreateACLTokenRequest{Policies: []string{"team-a"}, TtlMs: 1500})
		secrets = append(secrets, ttl.GetSecretId())
		e := asToken(t, cl, r, ttl.GetSecretId())
		if _, err := e.jobs.ListJobs(callCtx(t), &apiaryv1.ListJobsRequest{}); err != nil {
			t.Errorf("ListJobs with a fresh token of 1.5 s: %v", err)
		}
		for name, c := range map[string]aclClients{"no token": asToken(t, cl, r, ""), "an unknown token": asToken(t, cl, r, acl.NewID())} {
			_, err := c.jobs.ListJobs(callCtx(t), &apiaryv1.ListJobsRequest{})
			refused(t, "ListJobs with "+name, err, codes.Unauthenticated, "set APIARY_TOKEN")
			_, err = c.admin.ListNodes(callCtx(t), &apiaryv1.ListNodesRequest{})
			refused(t, "ListNodes with "+name, err, codes.Unauthenticated, "set APIARY_TOKEN")
			_, err = c.acl.GetACLSelf(callCtx(t), &apiaryv1.GetACLSelfRequest{})
			refused(t, "GetACLSelf with "+name, err, codes.Unauthenticated, "set APIARY_TOKEN")
		}
		testutil.Eventually(t, 10*time.Second, "the 1.5 s token expired", func() error {
			_, err := e.jobs.ListJobs(callCtx(t), &apiaryv1.ListJobsRequest{})
			if status.Code(err) != codes.Unauthenticated {
				return fmt.Errorf("ListJobs: %v", err)
			}
			if !strings.Contains(err.Error(), "ACL token "+ttl.GetAccessorId()+" expired at") || !strings.Contains(err.Error(), "set APIARY_TOKEN") {
				t.Errorf("expired token: %v", err)
			}
			return nil
		})
	})

	// The job of team b: running (gated) in namespace b, on a node of its
	// own; team a's job: done, in namespace a; management's: default.
	dir := t.TempDir()
	bs := spec(t, gatedJob(dir, 1, "namespace: b\nmax_attempts: 3"))
	jb := submitAs(t, b, bs, "team", "r1")
	victim := waitAttemptRunning(t, b.clients, jb, 0, 1, 30*time.Second).GetNodeId()
	ja := submitAs(t, a, nsSpec(t, "a", "true"), "", "")
	waitState(t, a.clients, ja, apiaryv1.JobState_JOB_STATE_COMPLETE, 30*time.Second)
	jd := submitAs(t, m, nsSpec(t, "default", "true"), "", "")
	waitState(t, m.clients, jd, apiaryv1.JobState_JOB_STATE_COMPLETE, 30*time.Second)
	if j, _ := getJob(b.clients, jb); j.GetSpec().GetNamespace() != "b" {
		t.Errorf("job %s's spec.namespace = %q, want b", jb, j.GetSpec().GetNamespace())
	}
	if j, _ := getJob(m.clients, jd); j.GetSpec().GetNamespace() != "default" {
		t.Errorf("job %s's spec.namespace = %q, want default", jd, j.GetSpec().GetNamespace())
	}

	t.Run("NamespaceIsolation", func(t *testing.T) {
		etcd := etcdOf(t, cl, r)
		settleUsage(t, etcd, nodeEpochs(t, m.clients))
		before := etcdSnapshot(t, etcd)
		denied := func(what string, err error, capability, ns string) {
			t.Helper()
			refused(t, what, err, codes.PermissionDenied, fmt.Sprintf("needs capability %q on namespace %q; ACL token %s", capability, ns, ta.GetAccessorId()))
		}
		_, err := a.jobs.GetJob(callCtx(t), &apiaryv1.GetJobRequest{JobId: jb})
		denied("GetJob of b's job as a", err, "read", "b")
		_, err = a.jobs.CancelJob(callCtx(t), &apiaryv1.CancelJobRequest{JobId: jb})
		denied("CancelJob of b's job as a", err, "cancel", "b")
		_, err = a.jobs.GetJobLogs(callCtx(t), &apiaryv1.GetJobLogsRequest{JobId: jb, TaskIndex: -1})
		denied("GetJobLogs of b's job as a", err, "read", "b")
		_, err = a.jobs.GetJobTrace(callCtx(t), &apiaryv1.GetJobTraceRequest{JobId: jb})
		denied("GetJobTrace of b's job as a", err, "read", "b")
		w, err := a.jobs.WatchJob(callCtx(t), &apiaryv1.WatchJobRequest{JobId: jb})
		if err == nil {
			_, err = w.Recv()
		}
		denied("WatchJob of b's job as a", err, "read", "b")
		_, err = a.jobs.ListJobs(callCtx(t), &apiaryv1.ListJobsRequest{Namespace: "b"})
		denied("ListJobs of namespace b as a", err, "read", "b")
		_, err = a.jobs.SubmitJob(callCtx(t), &apiaryv1.SubmitJobRequest{Spec: bs, ClientId: "team", RequestId: "r1"})
		denied("SubmitJob into b as a (b's own request id and payload)", err, "submit", "b")
		// The same request id with a's own payload: ALREADY_EXISTS, which
		// must not name b's job.
		_, err = a.jobs.SubmitJob(callCtx(t), &apiaryv1.SubmitJobRequest{Spec: nsSpec(t, "a", "true"), ClientId: "team", RequestId: "r1"})
		refused(t, "SubmitJob into a with b's request id", err, codes.AlreadyExists, "already used for another job with a different payload")
		if err != nil && strings.Contains(err.Error(), jb) {
			t.Errorf("the dedup answer names b's job: %v", err)
		}
		_, err = n.jobs.GetJob(callCtx(t), &apiaryv1.GetJobRequest{JobId: jb})
		refused(t, "GetJob as a node reader", err, codes.PermissionDenied, `needs capability "read" on namespace "b"`)
		sameEtcd(t, "refused job calls", before, etcdSnapshot(t, etcd))
		if j, err := getJob(b.clients, jb); err != nil || j.GetCancelRequested() || j.GetState() != apiaryv1.JobState_JOB_STATE_RUNNING {
			t.Errorf("b's job after a's attempts: %v, %v", j.GetState(), err)
		}
	})

	t.Run("ListJobsFiltered", func(t *testing.T) {
		ids := func(c aclClients, req *apiaryv1.ListJobsRequest) []string {
			t.Helper()
			resp, err := c.jobs.ListJobs(callCtx(t), req)
			if err != nil {
				t.Fatalf("ListJobs %v: %v", req, err)
			}
			var out []string
			for _, j := range resp.GetJobs() {
				out = append(out, j.GetId())
			}
			return out
		}
		for _, tc := range []struct {
			name string
			c    aclClients
			req  *apiaryv1.ListJobsRequest
			want []string
		}{
			{"a, all it may read", a, &apiaryv1.ListJobsRequest{}, []string{ja}},
			{"a, namespace a", a, &apiaryv1.ListJobsRequest{Namespace: "a"}, []string{ja}},
			{"b", b, &apiaryv1.ListJobsRequest{}, []string{jb}},
			{"node reader (no namespace)", n, &apiaryv1.ListJobsRequest{}, nil},
			{"management, namespace a", m, &apiaryv1.ListJobsRequest{Namespace: "a"}, []string{ja}},
			{"management, namespace default", m, &apiaryv1.ListJobsRequest{Namespace: "default"}, []string{jd}},
		} {
			if got := ids(tc.c, tc.req); strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
			}
		}
		if got := ids(m, &apiaryv1.ListJobsRequest{}); len(got) != 3 {
			t.Errorf("management lists %v, want all 3 jobs", got)
		}
		_, err := m.jobs.ListJobs(callCtx(t), &apiaryv1.ListJobsRequest{Namespace: "Bad_NS"})
		refused(t, "ListJobs of an invalid namespace", err, codes.InvalidArgument, "namespace: must be 1-63 characters")
	})

	t.Run("NodeAndOperatorCapabilities", func(t *testing.T) {
		if _, err := n.admin.ListNodes(callCtx(t), &apiaryv1.ListNodesRequest{}); err != nil {
			t.Errorf("ListNodes with node read: %v", err)
		}
		if _, err := n.admin.GetRegionInfo(callCtx(t), &apiaryv1.GetRegionInfoRequest{}); err != nil {
			t.Errorf("GetRegionInfo with node read: %v", err)
		}
		_, err := a.admin.ListNodes(callCtx(t), &apiaryv1.ListNodesRequest{})
		refused(t, "ListNodes without node read", err, codes.PermissionDenied, `AdminService/ListNodes needs node "read"; ACL token `+ta.GetAccessorId())
		_, err = n.admin.DrainNode(callCtx(t), &apiaryv1.DrainNodeRequest{NodeId: victim})
		refused(t, "DrainNode with node read", err, codes.PermissionDenied, `AdminService/DrainNode needs node "write"`)
		_, err = n.admin.QuarantineNode(callCtx(t), &apiaryv1.QuarantineNodeRequest{NodeId: victim, Reason: "x"})
		refused(t, "QuarantineNode with node read", err, codes.PermissionDenied, `needs node "write"`)
		_, err = n.admin.GossipKeyring(callCtx(t), &apiaryv1.GossipKeyringRequest{Op: apiaryv1.GossipKeyringOp_GOSSIP_KEYRING_OP_LIST})
		refused(t, "GossipKeyring without operator", err, codes.PermissionDenied, "AdminService/GossipKeyring needs operator")
		_, err = m.admin.GossipKeyring(callCtx(t), &apiaryv1.GossipKeyringRequest{Op: apiaryv1.GossipKeyringOp_GOSSIP_KEYRING_OP_LIST})
		if c := status.Code(err); c == codes.PermissionDenied || c == codes.Unauthenticated {
			t.Errorf("GossipKeyring as management: %v", err)
		}
		// A snapshot holds everything: management only, even for an
		// operator or node reader (the refusal comes with the first Recv).
		snap := func(c aclClients) error {
			st, err := c.admin.SaveSnapshot(callCtx(t), &apiaryv1.SaveSnapshotRequest{})
			if err == nil {
				_, err = st.Recv()
			}
			return err
		}
		refused(t, "SaveSnapshot with node read", snap(n), codes.PermissionDenied, "AdminService/SaveSnapshot needs a management token")
		if err := snap(m); err != nil {
			t.Errorf("SaveSnapshot as management: %v", err)
		}
		_, err = n.acl.ListACLTokens(callCtx(t), &apiaryv1.ListACLTokensRequest{})
		refused(t, "ListACLTokens as a client token", err, codes.PermissionDenied, "ACLService/ListACLTokens needs a management token")
		if nodes := nodeEpochs(t, n.clients); len(nodes) != 2 {
			t.Errorf("nodes %v", nodes)
		}
	})

	t.Run("RouterCertificate", func(t *testing.T) {
		files, err := cl.PKI().Cert(pki.RoleRouter, pki.GlobalRegion, "r1")
		if err != nil {
			t.Fatal(err)
		}
		rt := clientsOver(t, r, files)
		if _, err := rt.admin.ListRegions(acl.Internal(callCtx(t)), &apiaryv1.ListRegionsRequest{}); err != nil {
			t.Errorf("a router's own ListRegions: %v", err)
		}
		if _, err := rt.jobs.LookupRequest(callCtx(t), &apiaryv1.LookupRequestRequest{ClientId: "team", RequestId: "r1"}); err != nil {
			t.Errorf("a router's LookupRequest: %v", err)
		}
		_, err = rt.admin.ListRegions(callCtx(t), &apiaryv1.ListRegionsRequest{})
		refused(t, "a router's ListRegions not marked internal, no token", err, codes.Unauthenticated, "set APIARY_TOKEN")
		_, err = rt.jobs.ListJobs(acl.Internal(callCtx(t)), &apiaryv1.ListJobsRequest{})
		refused(t, "a router's ListJobs marked internal, no token", err, codes.Unauthenticated, "set APIARY_TOKEN")
		// A caller's token forwarded by the router is judged as the caller's.
		_, err = rt.jobs.GetJob(acl.WithToken(callCtx(t), ta.GetSecretId()), &apiaryv1.GetJobRequest{JobId: jb})
		refused(t, "a's token through a router certificate", err, codes.PermissionDenied, `needs capability "read" on namespace "b"`)
	})

	t.Run("JoinTokens", func(t *testing.T) {
		agentAs := func(id string) clients {
			files, err := cl.PKI().Cert(pki.RoleAgent, r.Spec.Name, id)
			if err != nil {
				t.Fatal(err)
			}
			return clientsOver(t, r, files)
		}
		n9, n8 := agentAs("n9"), agentAs("n8")
		tiny := &apiaryv1.Resources{CpuMillis: 1, MemoryMb: 1}
		reg := func(c clients, node, secret string) (*apiaryv1.RegisterNodeResponse, error) {
			return c.agent.RegisterNode(callCtx(t), &apiaryv1.RegisterNodeRequest{NodeId: node, Capacity: tiny, JoinToken: secret})
		}
		j := mkToken(t, m, &apiaryv1.CreateACLTokenRequest{Name: "n9", Type: acl.TypeAgent, Region: r.Spec.Name})
		j2 := mkToken(t, m, &apiaryv1.CreateACLTokenRequest{Name: "other", Type: acl.TypeAgent, Region: r.Spec.Name})
		secrets = append(secrets, j.GetSecretId(), j2.GetSecretId())
		_, err := reg(n9, "n9", "")
		refused(t, "RegisterNode without a join token", err, codes.Unauthenticated, "join_token: required: region eu-west runs with ACLs on")
		_, err = reg(n9, "n9", ta.GetSecretId())
		refused(t, "RegisterNode with a client token", err, codes.PermissionDenied, "is a client token, not an agent token")
		first, err := reg(n9, "n9", j.GetSecretId())
		if err != nil {
			t.Fatalf("n9's first registration with its join token: %v", err)
		}
		ts, err := m.acl.ListACLTokens(callCtx(t), &apiaryv1.ListACLTokensRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, tk := range ts.GetTokens() {
			if tk.GetSecretId() != "" {
				t.Errorf("ListACLTokens shows a secret for %s", tk.GetAccessorId())
			}
			if tk.GetAccessorId() == j.GetAccessorId() && tk.GetNodeId() != "n9" {
				t.Errorf("the join token is bound to %q after n9 registered with it", tk.GetNodeId())
			}
		}
		_, err = reg(n8, "n8", j.GetSecretId())
		refused(t, "n8 with n9's token", err, codes.PermissionDenied, "is bound to node n9; node n8 needs a token of its own")
		_, err = reg(n9, "n9", j2.GetSecretId())
		refused(t, "n9 with another token", err, codes.PermissionDenied, "node n9 is bound to another join token ("+j.GetAccessorId()+")")
		if got := nodeEpochs(t, m.clients)["n9"]; got != first.GetNodeEpoch() {
			t.Errorf("a refused registration changed n9's epoch: %d -> %d", first.GetNodeEpoch(), got)
		}
		rv, err := m.acl.RevokeACLToken(callCtx(t), &apiaryv1.RevokeACLTokenRequest{AccessorId: j.GetAccessorId()})
		if err != nil || rv.GetEndedNodeId() != "n9" {
			t.Fatalf("revoke n9's token: %v, %v", rv, err)
		}
		_, err = n9.agent.Heartbeat(callCtx(t), &apiaryv1.HeartbeatRequest{NodeId: "n9", NodeEpoch: first.GetNodeEpoch()})
		refused(t, "n9's heartbeat after its token was revoked", err, codes.FailedPrecondition, "re-register")
		_, err = reg(n9, "n9", j.GetSecretId())
		refused(t, "n9 with its revoked token", err, codes.Unauthenticated, "join_token: no such token")
	})

	// The real agent running team b's task loses its join token: its epoch
	// ends in the revocation's Txn (its next heartbeat fails), the task is
	// re-placed on the other node, and the agent cannot register again.
	t.Run("RevokedAgentIsFenced", func(t *testing.T) {
		other := map[string]string{"n1": "n2", "n2": "n1"}[victim]
		epochs := nodeEpochs(t, m.clients)
		ts, err := m.acl.ListACLTokens(callCtx(t), &apiaryv1.ListACLTokensRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var accessor string
		for _, tk := range ts.GetTokens() {
			if tk.GetType() == acl.TypeAgent && tk.GetNodeId() == victim {
				accessor = tk.GetAccessorId()
			}
		}
		if accessor == "" {
			t.Fatalf("no agent token bound to %s in %v", victim, ts.GetTokens())
		}
		files, err := cl.PKI().Cert(pki.RoleAgent, r.Spec.Name, victim)
		if err != nil {
			t.Fatal(err)
		}
		asVictim := clientsOver(t, r, files)
		revoked := time.Now()
		rv, err := m.acl.RevokeACLToken(callCtx(t), &apiaryv1.RevokeACLTokenRequest{AccessorId: accessor})
		if err != nil || rv.GetEndedNodeId() != victim {
			t.Fatalf("revoke %s's token: %v, %v", victim, rv, err)
		}
		_, err = asVictim.agent.Heartbeat(callCtx(t), &apiaryv1.HeartbeatRequest{NodeId: victim, NodeEpoch: epochs[victim]})
		refused(t, victim+"'s heartbeat right after the revocation", err, codes.FailedPrecondition, "re-register")
		// The epoch ended in the revocation's Txn: the owner sees the node
		// lost at once (no lease to wait out).
		tk := waitAttemptRunning(t, b.clients, jb, 0, 2, 10*time.Second)
		if tk.GetNodeId() != other {
			t.Errorf("attempt 2 runs on %s, want %s", tk.GetNodeId(), other)
		}
		t.Logf("revocation to attempt 2 running on %s: %s", other, time.Since(revoked).Round(time.Millisecond))
		testutil.Eventually(t, 20*time.Second, victim+" refused at registration", func() error {
			log, err := os.ReadFile(r.Agent(victim).LogPath)
			if err != nil {
				return err
			}
			if !strings.Contains(string(log), "registration refused: join_token: no such token") {
				return errors.New("no refusal in the agent's log yet")
			}
			return nil
		})
		for _, nd := range mustNodes(t, m) {
			if nd.GetId() == victim && nd.GetStatus() == apiaryv1.NodeStatus_NODE_STATUS_READY {
				t.Errorf("%s is READY again after its token was revoked (epoch %d)", victim, nd.GetEpoch())
			}
		}
		openGate(t, dir)
		j := waitState(t, b.clients, jb, apiaryv1.JobState_JOB_STATE_COMPLETE, 30*time.Second)
		if got := j.GetTasks()[0]; got.GetAttempt() != 2 || got.GetNodeId() != other {
			t.Errorf("completed as attempt %d on %s", got.GetAttempt(), got.GetNodeId())
		}
		if done := completions(logs(t, b.clients, jb)); done[0] != 1 {
			t.Errorf("%d committed completions", done[0])
		}
	})

	t.Run("DenialLogsAndMetrics", func(t *testing.T) {
		log := firstCoordLog(t, r)
		for _, want := range []string{"acl: call refused", "accessor=" + ta.GetAccessorId(), "reason=permission", "reason=no_token",
			"reason=unknown_token", "reason=expired_token", "reason=join_token"} {
			if !strings.Contains(log, want) {
				t.Errorf("the coordinator's log has no %q", want)
			}
		}
		for _, p := range procs(cl) {
			b, _ := os.ReadFile(p.LogPath)
			for _, s := range secrets {
				if strings.Contains(string(b), s) {
					t.Errorf("%s's log holds a token's secret", p.Name)
				}
			}
		}
		fams := testutil.ScrapeMetrics(t, "http://"+metrics+"/metrics")
		f := fams["apiary_acl_denials_total"]
		if f == nil {
			t.Fatal("no apiary_acl_denials_total")
		}
		got := map[string]float64{}
		for _, mt := range f.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == "reason" {
					got[l.GetValue()] += mt.GetCounter().GetValue()
				}
			}
		}
		for _, reason := range []string{"permission", "no_token", "unknown_token", "expired_token", "join_token"} {
			if got[reason] == 0 {
				t.Errorf("apiary_acl_denials_total{reason=%q} = 0 (%v)", reason, got)
			}
		}
	})
}

func mustNodes(t *testing.T, c aclClients) []*apiaryv1.Node {
	t.Helper()
	resp, err := c.admin.ListNodes(callCtx(t), &apiaryv1.ListNodesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetNodes()
}

// TestACLWithoutTLS: a region with --acl and --insecure-dev still enforces
// tokens (no certificate says who calls, so nothing passes without one: not
// a router's own calls either), while a region without --acl ignores
// tokens and its ACLService says ACLs are off.
func TestACLWithoutTLS(t *testing.T) {
	bin := testutil.Binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cl := startCluster(t, ctx, devcluster.Options{Binary: bin, Dir: t.TempDir(), Regions: []devcluster.RegionSpec{
		{Name: "eu-west", Jurisdiction: "eu", ExtraArgs: []string{"--acl"}},
		{Name: "us-east", Jurisdiction: "us"},
	}})
	on, off := cl.Regions[0], cl.Regions[1]
	anon := asToken(t, cl, on, "")
	_, err := anon.jobs.ListJobs(callCtx(t), &apiaryv1.ListJobsRequest{})
	refused(t, "ListJobs without a token", err, codes.Unauthenticated, "no ACL token: region eu-west runs with ACLs on; set APIARY_TOKEN")
	_, err = anon.admin.ListRegions(acl.Internal(callCtx(t)), &apiaryv1.ListRegionsRequest{})
	refused(t, "ListRegions marked internal, without TLS", err, codes.Unauthenticated, "set APIARY_TOKEN")
	_, err = anon.jobs.LookupRequest(callCtx(t), &apiaryv1.LookupRequestRequest{ClientId: "c", RequestId: "r"})
	refused(t, "LookupRequest without TLS or a token", err, codes.Unauthenticated, "set APIARY_TOKEN")
	boot, err := anon.acl.BootstrapACL(callCtx(t), &apiaryv1.BootstrapACLRequest{})
	if err != nil {
		t.Fatal(err)
	}
	m := asToken(t, cl, on, boot.GetToken().GetSecretId())
	applyPolicy(t, m, "team-a", "namespaces:\n  - name: a\n    capabilities: [submit, read]\n")
	a := asToken(t, cl, on, mkToken(t, m, &apiaryv1.CreateACLTokenRequest{Policies: []string{"team-a"}}).GetSecretId())
	if _, err := a.jobs.SubmitJob(callCtx(t), &apiaryv1.SubmitJobRequest{Spec: nsSpec(t, "a", "true")}); err != nil {
		t.Errorf("submit into a as a: %v", err)
	}
	_, err = a.jobs.SubmitJob(callCtx(t), &apiaryv1.SubmitJobRequest{Spec: nsSpec(t, "default", "true")})
	refused(t, "submit into default as a", err, codes.PermissionDenied, `JobService/SubmitJob needs capability "submit" on namespace "default"`)
	if _, err := a.jobs.LookupRequest(callCtx(t), &apiaryv1.LookupRequestRequest{ClientId: "c", RequestId: "r"}); err != nil {
		t.Errorf("LookupRequest with a client token, without TLS: %v", err)
	}
	if _, err := m.admin.ListNodes(callCtx(t), &apiaryv1.ListNodesRequest{}); err != nil {
		t.Errorf("ListNodes as management: %v", err)
	}
	// A job's trace is asked of the region's other coordinators with the
	// caller's token (here there are none; the call itself must pass).
	resp, err := a.jobs.ListJobs(callCtx(t), &apiaryv1.ListJobsRequest{})
	if err != nil || len(resp.GetJobs()) != 1 {
		t.Fatalf("ListJobs as a: %v, %v", resp, err)
	}
	if _, err := a.jobs.GetJobTrace(callCtx(t), &apiaryv1.GetJobTraceRequest{JobId: resp.GetJobs()[0].GetId()}); err != nil {
		t.Errorf("GetJobTrace of a's job as a: %v", err)
	}

	// ACLs off: any token is ignored; ACLService refuses, naming --acl.
	junk := asToken(t, cl, off, acl.NewID())
	if _, err := junk.jobs.SubmitJob(callCtx(t), &apiaryv1.SubmitJobRequest{Spec: nsSpec(t, "anything", "true")}); err != nil {
		t.Errorf("submit with a junk token where ACLs are off: %v", err)
	}
	if _, err := junk.admin.ListNodes(callCtx(t), &apiaryv1.ListNodesRequest{}); err != nil {
		t.Errorf("ListNodes with a junk token where ACLs are off: %v", err)
	}
	_, err = junk.acl.BootstrapACL(callCtx(t), &apiaryv1.BootstrapACLRequest{})
	refused(t, "BootstrapACL where ACLs are off", err, codes.FailedPrecondition, "ACLs are off in region us-east (start its coordinators with --acl)")
	if !strings.Contains(firstCoordLog(t, on), "ACLs on without TLS") {
		t.Error("no warning that ACLs run without TLS")
	}
}
