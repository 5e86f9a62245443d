package router_test

// Issue 19, adversarial findings on the router with ACLs on: what it
// answers when regions refuse the caller or a request, or do not answer.

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/acl"
	"apiary.dev/apiary/internal/cliconn"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/ids"
	"apiary.dev/apiary/internal/telemetry"
	"apiary.dev/apiary/internal/testutil"
)

// TestRouterACLAnswers runs a router and two regions with mutual TLS and
// ACLs (no nodes: jobs stay pending) and checks the router's answers:
//   - ListJobs with namespace "*" or "a-" is INVALID_ARGUMENT from the
//     router, not OK with every region "unavailable";
//   - a fan-out (ListJobs, ListNodes, ListRegions, ListACLTokens,
//     ListACLPolicies) in which one region does not know the caller's
//     token (made in eu-west only) answers UNAUTHENTICATED naming us-east,
//     not a partial list with us-east "unavailable";
//   - CreateACLToken with a client token is PERMISSION_DENIED;
//   - GetJobTrace returns the router's own spans (job.route) with the
//     region's answer only: refused without a token, and, once the job's
//     region is down, UNAVAILABLE naming it for any caller, management
//     included (the region no longer judges the token).
func TestRouterACLAnswers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cl, err := devcluster.Start(ctx, devcluster.Options{Binary: testutil.Binary(t), Dir: t.TempDir(), TLS: true, ACL: true,
		Global: &devcluster.GlobalSpec{}, Regions: []devcluster.RegionSpec{
			{Name: "eu-west", Jurisdiction: "eu"}, {Name: "us-east", Jurisdiction: "us"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cl.Stop()
		if t.Failed() {
			for _, p := range append(append([]*devcluster.Proc{cl.Global}, cl.Regions[0].Coords...), cl.Regions[1].Coords...) {
				if b, err := os.ReadFile(p.LogPath); err == nil {
					t.Logf("--- %s log tail ---\n%s", p.Name, b[max(0, len(b)-3000):])
				}
			}
		}
	})
	eu := cl.Regions[0]
	dial := func(addr, secret string) *grpc.ClientConn {
		t.Helper()
		rel, err := cl.ClientTLS().Load()
		if err != nil {
			t.Fatal(err)
		}
		cc, err := cliconn.DialTLS(addr, rel, "", cliconn.WithToken(secret))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
	call := func() context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		t.Cleanup(cancel)
		return ctx
	}
	want := func(what string, err error, code codes.Code, text ...string) {
		t.Helper()
		ok := status.Code(err) == code
		for _, s := range text {
			ok = ok && strings.Contains(status.Convert(err).Message(), s)
		}
		if !ok {
			t.Errorf("%s: %v; want %s saying %q", what, err, code, text)
		}
	}
	mgmt := dial(cl.GlobalAddr, cl.ManagementToken())
	mgmtACL := apiaryv1.NewACLServiceClient(mgmt)
	pol := &apiaryv1.ACLPolicy{Name: "team-a", Node: acl.NodeRead,
		Namespaces: []*apiaryv1.ACLNamespaceRule{{Name: "a", Capabilities: []string{acl.CapSubmit, acl.CapRead}}}}
	if resp, err := mgmtACL.ApplyACLPolicy(call(), &apiaryv1.ApplyACLPolicyRequest{Policy: pol}); err != nil || len(resp.GetRegions()) != 2 {
		t.Fatalf("apply team-a through the router: %v, %v", resp, err)
	}
	alice, err := mgmtACL.CreateACLToken(call(), &apiaryv1.CreateACLTokenRequest{Name: "alice", Policies: []string{"team-a"}})
	if err != nil {
		t.Fatal(err)
	}
	// Tokens eu-west holds and us-east does not (made at eu-west itself).
	euACL := apiaryv1.NewACLServiceClient(dial(eu.APIAddrs[0], cl.ManagementToken()))
	euClient, err := euACL.CreateACLToken(call(), &apiaryv1.CreateACLTokenRequest{Name: "eu client", Policies: []string{"team-a"}})
	if err != nil {
		t.Fatal(err)
	}
	euMgmt, err := euACL.CreateACLToken(call(), &apiaryv1.CreateACLTokenRequest{Name: "eu management", Type: acl.TypeManagement})
	if err != nil {
		t.Fatal(err)
	}

	mgmtJobs := apiaryv1.NewJobServiceClient(mgmt)
	for _, ns := range []string{"*", "a-", "Team"} {
		resp, err := mgmtJobs.ListJobs(call(), &apiaryv1.ListJobsRequest{Namespace: ns})
		want("ListJobs of namespace "+ns+" through the router", err, codes.InvalidArgument, "namespace: must be 1-63 characters")
		if err == nil {
			t.Logf("  it answered %v", resp)
		}
	}

	_, err = mgmtJobs.ListJobs(call(), &apiaryv1.ListJobsRequest{PageToken: "garbage"})
	want("ListJobs with a page token that is no job id, through the router", err, codes.InvalidArgument, "page_token: must be a previous answer's next_page_token")

	onlyEU := "region us-east: ACL token not found in region us-east"
	euClientConn := dial(cl.GlobalAddr, euClient.GetToken().GetSecretId())
	_, err = apiaryv1.NewJobServiceClient(euClientConn).ListJobs(call(), &apiaryv1.ListJobsRequest{Namespace: "a"})
	want("ListJobs with a token only eu-west knows", err, codes.Unauthenticated, onlyEU)
	_, err = apiaryv1.NewAdminServiceClient(euClientConn).ListNodes(call(), &apiaryv1.ListNodesRequest{})
	want("ListNodes with a token only eu-west knows", err, codes.Unauthenticated, onlyEU)
	_, err = apiaryv1.NewAdminServiceClient(euClientConn).ListRegions(call(), &apiaryv1.ListRegionsRequest{})
	want("ListRegions with a token only eu-west knows", err, codes.Unauthenticated, onlyEU)
	euMgmtACL := apiaryv1.NewACLServiceClient(dial(cl.GlobalAddr, euMgmt.GetToken().GetSecretId()))
	_, err = euMgmtACL.ListACLTokens(call(), &apiaryv1.ListACLTokensRequest{})
	want("ListACLTokens with a management token only eu-west knows", err, codes.Unauthenticated, onlyEU)
	_, err = euMgmtACL.ListACLPolicies(call(), &apiaryv1.ListACLPoliciesRequest{})
	want("ListACLPolicies with a management token only eu-west knows", err, codes.Unauthenticated, onlyEU)
	// alice (known everywhere) may not list namespace b anywhere.
	aliceConn := dial(cl.GlobalAddr, alice.GetToken().GetSecretId())
	_, err = apiaryv1.NewJobServiceClient(aliceConn).ListJobs(call(), &apiaryv1.ListJobsRequest{Namespace: "b"})
	want("ListJobs of namespace b as alice", err, codes.PermissionDenied, `needs capability "read" on namespace "b"`)

	aliceACL := apiaryv1.NewACLServiceClient(aliceConn)
	_, err = aliceACL.CreateACLToken(call(), &apiaryv1.CreateACLTokenRequest{Name: "mine", Type: acl.TypeManagement})
	want("CreateACLToken as alice (a client token)", err, codes.PermissionDenied, "needs a management token")
	// eu-west denies the permission, us-east does not know the token:
	// still a denial, not UNAVAILABLE.
	euClientACL := apiaryv1.NewACLServiceClient(euClientConn)
	_, err = euClientACL.CreateACLToken(call(), &apiaryv1.CreateACLTokenRequest{Name: "mine", Type: acl.TypeManagement})
	want("CreateACLToken with a client token only eu-west knows", err, codes.PermissionDenied, "needs a management token", "us-east: ACL token not found")
	_, err = euClientACL.ApplyACLPolicy(call(), &apiaryv1.ApplyACLPolicyRequest{Policy: pol})
	want("ApplyACLPolicy with a client token only eu-west knows", err, codes.PermissionDenied, "needs a management token")

	// A job routed by the router: its trace holds the router's job.route
	// span, given with the region's answer only.
	s := &apiaryv1.JobSpec{Name: "traced", Tasks: []*apiaryv1.TaskGroup{{Name: "t", Command: "true"}}}
	sub, err := mgmtJobs.SubmitJob(call(), &apiaryv1.SubmitJobRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	job := sub.GetJobId()
	tr, err := mgmtJobs.GetJobTrace(call(), &apiaryv1.GetJobTraceRequest{JobId: job})
	if err != nil || !strings.Contains(string(tr.GetSpansJsonl()), telemetry.SpanRoute) {
		t.Fatalf("GetJobTrace %s as management: %v; spans %q, want the router's %s span", job, err, tr.GetSpansJsonl(), telemetry.SpanRoute)
	}
	anonJobs := apiaryv1.NewJobServiceClient(dial(cl.GlobalAddr, ""))
	tr, err = anonJobs.GetJobTrace(call(), &apiaryv1.GetJobTraceRequest{JobId: job})
	want("GetJobTrace without a token", err, codes.Unauthenticated, "no ACL token")
	if len(tr.GetSpansJsonl()) > 0 {
		t.Errorf("GetJobTrace without a token returned spans: %q", tr.GetSpansJsonl())
	}
	home := ids.RegionOf(job)
	for _, r := range cl.Regions {
		if r.Spec.Name == home {
			for _, c := range r.Coords {
				if err := c.Kill(); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	// With a region down, an ACL write by a token that may not make it is
	// still PERMISSION_DENIED (an up region judges the token), and
	// UNAVAILABLE naming the region for one that may.
	_, err = aliceACL.CreateACLToken(call(), &apiaryv1.CreateACLTokenRequest{Name: "mine", Type: acl.TypeManagement})
	want("CreateACLToken as alice with "+home+" down", err, codes.PermissionDenied, "needs a management token")
	_, err = aliceACL.ApplyACLPolicy(call(), &apiaryv1.ApplyACLPolicyRequest{Policy: pol})
	want("ApplyACLPolicy as alice with "+home+" down", err, codes.PermissionDenied, "needs a management token")
	_, err = mgmtACL.CreateACLToken(call(), &apiaryv1.CreateACLTokenRequest{Name: "later", Policies: []string{"team-a"}})
	want("CreateACLToken as management with "+home+" down", err, codes.Unavailable, home)
	for name, c := range map[string]apiaryv1.JobServiceClient{"no token": anonJobs, "the management token": mgmtJobs} {
		tr, err := c.GetJobTrace(call(), &apiaryv1.GetJobTraceRequest{JobId: job})
		want("GetJobTrace with "+name+" while region "+home+" is down", err, codes.Unavailable, "region "+home)
		if len(tr.GetSpansJsonl()) > 0 || len(tr.GetUnavailable()) > 0 {
			t.Errorf("GetJobTrace with %s while %s is down answered %v: the router's spans without a region's judgement", name, home, tr)
		}
	}
}
