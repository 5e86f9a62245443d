package authz_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/authz"
	"apiary.dev/apiary/internal/pki"
)

// TestAuthorizeDecisions is the rule table, decision by decision, with the
// message each refusal sends back.
func TestAuthorizeDecisions(t *testing.T) {
	c := newCA(t)
	hb := func(node string) any { return &apiaryv1.HeartbeatRequest{NodeId: node, NodeEpoch: 3} }
	for _, tc := range []struct {
		name   string
		p      authz.Policy
		caller pki.Identity
		method string
		req    any
		code   codes.Code
		msg    string // a substring of the status message
	}{
		// Region server, JobService and AdminService.
		{"client submits", regionPol, clientAll, apiaryv1.JobService_SubmitJob_FullMethodName, &apiaryv1.SubmitJobRequest{}, codes.OK, ""},
		{"client scoped to this region", regionPol, clientEU, apiaryv1.JobService_CancelJob_FullMethodName, &apiaryv1.CancelJobRequest{}, codes.OK, ""},
		{"client scoped to another region", regionPol, clientUS, apiaryv1.JobService_CancelJob_FullMethodName, &apiaryv1.CancelJobRequest{},
			codes.PermissionDenied, "a client certificate scoped to region us-east cannot call region eu-west"},
		{"router submits", regionPol, routerID, apiaryv1.JobService_SubmitJob_FullMethodName, &apiaryv1.SubmitJobRequest{}, codes.OK, ""},
		{"router lists nodes", regionPol, routerID, apiaryv1.AdminService_ListNodes_FullMethodName, &apiaryv1.ListNodesRequest{}, codes.OK, ""},
		{"peer coordinator asks for a trace", regionPol, regionEU2, apiaryv1.JobService_GetJobTrace_FullMethodName, &apiaryv1.GetJobTraceRequest{LocalOnly: true}, codes.OK, ""},
		{"agent submits", regionPol, agentEU, apiaryv1.JobService_SubmitJob_FullMethodName, &apiaryv1.SubmitJobRequest{},
			codes.PermissionDenied, "an agent certificate cannot call JobService"},
		{"agent drains a node", regionPol, agentEU, apiaryv1.AdminService_DrainNode_FullMethodName, &apiaryv1.DrainNodeRequest{NodeId: "n1"},
			codes.PermissionDenied, "an agent certificate cannot call AdminService"},
		{"coordinator of another region", regionPol, regionUS, apiaryv1.JobService_GetJobTrace_FullMethodName, &apiaryv1.GetJobTraceRequest{},
			codes.PermissionDenied, "a region certificate of region us-east cannot act in region eu-west"},
		{"coordinator of another region, health (its failover probe)", regionPol, regionUS, healthpb.Health_Check_FullMethodName, &healthpb.HealthCheckRequest{},
			codes.OK, ""},
		{"another region puts a standby record for itself", regionPol, regionUS, apiaryv1.FailoverService_PutStandby_FullMethodName,
			&apiaryv1.PutStandbyRequest{Job: &apiaryv1.StandbyJob{HomeRegion: "us-east"}}, codes.OK, ""},
		{"another region acts for a third", regionPol, regionUS, apiaryv1.FailoverService_PushProgress_FullMethodName,
			&apiaryv1.PushProgressRequest{HomeRegion: "ap-south"}, codes.PermissionDenied, "a region certificate of region us-east cannot act for region ap-south"},
		{"another region claims for a third", regionPol, regionUS, apiaryv1.FailoverService_ClaimJob_FullMethodName,
			&apiaryv1.ClaimJobRequest{StandbyRegion: "eu-west"}, codes.PermissionDenied, "cannot act for region eu-west"},
		{"a home region releases a claimed job of its own", regionPol, regionUS, apiaryv1.FailoverService_ReleaseJob_FullMethodName,
			&apiaryv1.ReleaseJobRequest{HomeRegion: "us-east"}, codes.OK, ""},
		{"another region releases a third's job", regionPol, regionUS, apiaryv1.FailoverService_ReleaseJob_FullMethodName,
			&apiaryv1.ReleaseJobRequest{HomeRegion: "ap-south"}, codes.PermissionDenied, "cannot act for region ap-south"},
		{"another region drops a claim on a third's job", regionPol, regionUS, apiaryv1.FailoverService_DropClaim_FullMethodName,
			&apiaryv1.DropClaimRequest{HomeRegion: "ap-south", ClaimedBy: "us-east"}, codes.PermissionDenied, "cannot act for region ap-south"},
		{"own region's coordinator calls failover", regionPol, regionEU2, apiaryv1.FailoverService_MovedJobs_FullMethodName,
			&apiaryv1.MovedJobsRequest{HomeRegion: "eu-west"}, codes.PermissionDenied, "only the coordinators of other regions call it"},
		{"client calls failover", regionPol, clientAll, apiaryv1.FailoverService_MovedJobs_FullMethodName,
			&apiaryv1.MovedJobsRequest{}, codes.PermissionDenied, "a client certificate cannot call FailoverService/MovedJobs"},
		{"router forwards a request", regionPol, routerID, apiaryv1.JobService_ForwardRequest_FullMethodName, &apiaryv1.ForwardRequestRequest{}, codes.OK, ""},
		{"client forwards a request", regionPol, clientAll, apiaryv1.JobService_ForwardRequest_FullMethodName, &apiaryv1.ForwardRequestRequest{},
			codes.PermissionDenied, "a client certificate cannot call JobService/ForwardRequest: only routers call it"},
		{"peer coordinator looks up a request", regionPol, regionEU2, apiaryv1.JobService_LookupRequest_FullMethodName, &apiaryv1.LookupRequestRequest{},
			codes.PermissionDenied, "only routers call it"},

		// Region server, AgentService.
		{"agent heartbeats for itself", regionPol, agentEU, apiaryv1.AgentService_Heartbeat_FullMethodName, hb("n1"), codes.OK, ""},
		{"agent heartbeats for another node", regionPol, agentEU, apiaryv1.AgentService_Heartbeat_FullMethodName, hb("n2"),
			codes.PermissionDenied, "agent certificate of node n1 cannot act for node n2"},
		{"agent registers another node", regionPol, agentEU, apiaryv1.AgentService_RegisterNode_FullMethodName, &apiaryv1.RegisterNodeRequest{NodeId: "n2"},
			codes.PermissionDenied, "agent certificate of node n1 cannot act for node n2"},
		{"agent reports for another node", regionPol, agentEU, apiaryv1.AgentService_ReportTaskStatus_FullMethodName, &apiaryv1.ReportTaskStatusRequest{NodeId: "n2"},
			codes.PermissionDenied, "agent certificate of node n1 cannot act for node n2"},
		{"agent request without node id", regionPol, agentEU, apiaryv1.AgentService_Deregister_FullMethodName, &apiaryv1.DeregisterRequest{},
			codes.PermissionDenied, `agent certificate of node n1 cannot act for node ""`},
		{"agent request message missing", regionPol, agentEU, apiaryv1.AgentService_Heartbeat_FullMethodName, nil,
			codes.PermissionDenied, "the request carries no node_id to check"},
		{"agent of another region", regionPol, agentUS, apiaryv1.AgentService_Heartbeat_FullMethodName, hb("n1"),
			codes.PermissionDenied, "an agent certificate of region us-east cannot call AgentService of region eu-west"},
		{"client registers a node", regionPol, clientAll, apiaryv1.AgentService_RegisterNode_FullMethodName, &apiaryv1.RegisterNodeRequest{NodeId: "cli"},
			codes.PermissionDenied, "a client certificate cannot call AgentService/RegisterNode: only agent certificates of region eu-west can"},
		{"router registers a node", regionPol, routerID, apiaryv1.AgentService_RegisterNode_FullMethodName, &apiaryv1.RegisterNodeRequest{NodeId: "r1"},
			codes.PermissionDenied, "a router certificate cannot call AgentService"},
		{"peer coordinator reports", regionPol, regionEU2, apiaryv1.AgentService_ReportTaskStatus_FullMethodName, &apiaryv1.ReportTaskStatusRequest{NodeId: "eu-west-2"},
			codes.PermissionDenied, "a region certificate cannot call AgentService"},

		// Health and unknown methods.
		{"agent checks health", regionPol, agentUS, healthpb.Health_Check_FullMethodName, &healthpb.HealthCheckRequest{}, codes.OK, ""},
		{"a method without a rule", regionPol, clientAll, "/apiary.v1.JobService/PurgeEverything", &apiaryv1.GetJobRequest{},
			codes.PermissionDenied, "method /apiary.v1.JobService/PurgeEverything has no authorization rule on this server: denied by default"},
		{"reflection is not served", regionPol, clientAll, "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", nil,
			codes.PermissionDenied, "denied by default"},

		// Router.
		{"router: unscoped client submits", routerPol, clientAll, apiaryv1.JobService_SubmitJob_FullMethodName, &apiaryv1.SubmitJobRequest{}, codes.OK, ""},
		{"router: a client scoped to a region is refused (it would act in every region)", routerPol, clientUS, apiaryv1.JobService_SubmitJob_FullMethodName, &apiaryv1.SubmitJobRequest{},
			codes.PermissionDenied, "scoped to region us-east cannot use the router"},
		{"router: client lists regions", routerPol, clientAll, apiaryv1.AdminService_ListRegions_FullMethodName, &apiaryv1.ListRegionsRequest{}, codes.OK, ""},
		{"router: agent submits", routerPol, agentEU, apiaryv1.JobService_SubmitJob_FullMethodName, &apiaryv1.SubmitJobRequest{},
			codes.PermissionDenied, "an agent certificate cannot call JobService"},
		{"router: region submits", routerPol, regionEU, apiaryv1.JobService_SubmitJob_FullMethodName, &apiaryv1.SubmitJobRequest{},
			codes.PermissionDenied, "a region certificate cannot call the router's JobService (JobService/SubmitJob): regions never call the router"},
		{"router: another router", routerPol, routerID, apiaryv1.AdminService_ListNodes_FullMethodName, &apiaryv1.ListNodesRequest{},
			codes.PermissionDenied, "a router certificate cannot call another router's AdminService"},
		{"router: agent service", routerPol, agentEU, apiaryv1.AgentService_Heartbeat_FullMethodName, hb("n1"),
			codes.PermissionDenied, "the router serves no AgentService"},
		{"router: client forwards a request", routerPol, clientAll, apiaryv1.JobService_ForwardRequest_FullMethodName, &apiaryv1.ForwardRequestRequest{},
			codes.PermissionDenied, "JobService/ForwardRequest is served by coordinators only, not by the router"},
		{"router: region checks health", routerPol, regionUS, healthpb.Health_Watch_FullMethodName, &healthpb.HealthCheckRequest{}, codes.OK, ""},

		// Misconfigured servers refuse everything.
		{"policy without role", authz.Policy{Region: "eu-west"}, clientAll, apiaryv1.JobService_GetJob_FullMethodName, &apiaryv1.GetJobRequest{},
			codes.Internal, `authz: policy role must be "region" or "router" (got "")`},
		{"region policy without region", authz.Policy{Role: pki.RoleRegion}, clientAll, healthpb.Health_Check_FullMethodName, &healthpb.HealthCheckRequest{},
			codes.Internal, "a region server's policy needs its region name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.p.Authorize(c.peerCtx(t, tc.caller), tc.method, tc.req)
			if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.msg) {
				t.Fatalf("Authorize(%s, %s) = %v; want %s %q", callerNames[tc.caller], tc.method, err, tc.code, tc.msg)
			}
		})
	}
}

// TestAuthorizeWithoutIdentity: no peer, a plaintext peer, TLS without a
// verified chain and a verified certificate without an Apiary identity are
// all Unauthenticated, on every kind of method and on both servers.
func TestAuthorizeWithoutIdentity(t *testing.T) {
	tlsNoChain := peer.NewContext(context.Background(), &peer.Peer{AuthInfo: credentials.TLSInfo{State: tls.ConnectionState{}}})
	noURI := peer.NewContext(context.Background(), &peer.Peer{AuthInfo: credentials.TLSInfo{State: tls.ConnectionState{
		VerifiedChains: [][]*x509.Certificate{{{}}}}}})
	for _, p := range []authz.Policy{regionPol, routerPol} {
		for _, m := range []string{apiaryv1.JobService_SubmitJob_FullMethodName, apiaryv1.AgentService_RegisterNode_FullMethodName,
			apiaryv1.AdminService_DrainNode_FullMethodName, healthpb.Health_Check_FullMethodName, "/no.such.Service/Method"} {
			for name, ctx := range map[string]context.Context{"no peer": context.Background(), "TLS without a verified chain": tlsNoChain} {
				err := p.Authorize(ctx, m, &apiaryv1.RegisterNodeRequest{NodeId: "n1"})
				if status.Code(err) != codes.Unauthenticated || status.Convert(err).Message() != authz.NoCertificateMessage {
					t.Errorf("%s server, %s, %s: %v; want Unauthenticated %q", p.Role, m, name, err, authz.NoCertificateMessage)
				}
			}
			err := p.Authorize(noURI, m, &apiaryv1.RegisterNodeRequest{NodeId: "n1"})
			if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "client certificate carries no valid Apiary identity") {
				t.Errorf("%s server, %s, certificate without identity: %v", p.Role, m, err)
			}
		}
	}
}

func TestPolicyValidate(t *testing.T) {
	for _, tc := range []struct {
		p   authz.Policy
		err string
	}{
		{authz.Policy{Role: pki.RoleRegion, Region: "eu-west"}, ""},
		{authz.Policy{Role: pki.RoleRouter, Region: pki.GlobalRegion}, ""},
		{authz.Policy{Role: pki.RoleRouter}, ""},
		{authz.Policy{Role: pki.RoleRegion, Region: pki.GlobalRegion}, `a region server's policy needs its region name (got "global")`},
		{authz.Policy{Role: pki.RoleRegion, Region: "EU West"}, `a region server's policy needs its region name (got "EU West")`},
		{authz.Policy{Role: pki.RoleRouter, Region: "eu-west"}, `the router's policy region must be "global" (got "eu-west")`},
		{authz.Policy{Role: pki.RoleAgent, Region: "eu-west"}, `policy role must be "region" or "router" (got "agent")`},
	} {
		err := tc.p.Validate()
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%+v.Validate() = %v; want %q", tc.p, err, tc.err)
		}
	}
}

// fakeStream is a server stream of StreamAssignmentsRequest messages, for
// the stream interceptor's message checks (the real grpc path is in
// grpc_test.go; no API method has a client stream to send a second
// message on).
type fakeStream struct {
	ctx  context.Context
	in   []*apiaryv1.StreamAssignmentsRequest
	sent int
}

func (s *fakeStream) SetHeader(metadata.MD) error  { return nil }
func (s *fakeStream) SendHeader(metadata.MD) error { return nil }
func (s *fakeStream) SetTrailer(metadata.MD)       {}
func (s *fakeStream) Context() context.Context     { return s.ctx }
func (s *fakeStream) SendMsg(any) error            { s.sent++; return nil }
func (s *fakeStream) RecvMsg(m any) error {
	if len(s.in) == 0 {
		return io.EOF
	}
	m.(*apiaryv1.StreamAssignmentsRequest).NodeId = s.in[0].NodeId
	s.in = s.in[1:]
	return nil
}

// TestStreamChecksEveryMessage: on an AgentService stream every received
// message's node_id is checked, not only the first; the first mismatch
// ends the stream with PermissionDenied (its context cancelled, later
// sends and receives refused) whatever the handler returns; and nothing
// is sent before a message has passed.
func TestStreamChecksEveryMessage(t *testing.T) {
	c := newCA(t)
	info := &grpc.StreamServerInfo{FullMethod: apiaryv1.AgentService_StreamAssignments_FullMethodName, IsServerStream: true}
	intercept := regionPol.StreamInterceptor()

	fs := &fakeStream{ctx: c.peerCtx(t, agentEU), in: []*apiaryv1.StreamAssignmentsRequest{{NodeId: "n1"}, {NodeId: "n1"}, {NodeId: "n2"}, {NodeId: "n1"}}}
	var steps []string
	err := intercept(nil, fs, info, func(_ any, ss grpc.ServerStream) error {
		for i := 0; i < 4; i++ {
			rerr := ss.RecvMsg(&apiaryv1.StreamAssignmentsRequest{})
			serr := ss.SendMsg(&apiaryv1.StreamAssignmentsResponse{})
			steps = append(steps, status.Code(rerr).String()+"/"+status.Code(serr).String())
		}
		if ss.Context().Err() == nil {
			t.Error("the stream's context was not cancelled by the denial")
		}
		return nil // a handler that ignores the denial
	})
	if want := "OK/OK OK/OK PermissionDenied/PermissionDenied PermissionDenied/PermissionDenied"; strings.Join(steps, " ") != want {
		t.Errorf("recv/send codes %v; want %s", steps, want)
	}
	if fs.sent != 2 {
		t.Errorf("%d messages sent; want 2 (none after the denial)", fs.sent)
	}
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "agent certificate of node n1 cannot act for node n2") {
		t.Errorf("stream ended with %v; want the node denial", err)
	}
	if len(fs.in) != 1 {
		t.Errorf("%d messages left unread; want 1 (nothing read after the denial)", len(fs.in))
	}

	fs = &fakeStream{ctx: c.peerCtx(t, agentEU), in: []*apiaryv1.StreamAssignmentsRequest{{NodeId: "n1"}}}
	err = intercept(nil, fs, info, func(_ any, ss grpc.ServerStream) error {
		return ss.SendMsg(&apiaryv1.StreamAssignmentsResponse{})
	})
	if status.Code(err) != codes.Internal || fs.sent != 0 {
		t.Errorf("send before any receive: %v, %d sent; want Internal and nothing sent", err, fs.sent)
	}

	// The identity is checked at open: the handler never runs.
	fs = &fakeStream{ctx: c.peerCtx(t, clientAll), in: []*apiaryv1.StreamAssignmentsRequest{{NodeId: "cli"}}}
	err = intercept(nil, fs, info, func(any, grpc.ServerStream) error { return errors.New("handler reached") })
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("client opening StreamAssignments: %v; want PermissionDenied before the handler", err)
	}
}
