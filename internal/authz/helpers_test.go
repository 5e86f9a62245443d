package authz_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/authz"
	"apiary.dev/apiary/internal/pki"
	"apiary.dev/apiary/internal/testutil"
)

// Identities the tests use. The servers are a coordinator of eu-west and
// the router.
var (
	regionEU    = pki.Identity{Role: pki.RoleRegion, Region: "eu-west", ID: "eu-west-1"}
	regionEU2   = pki.Identity{Role: pki.RoleRegion, Region: "eu-west", ID: "eu-west-2"}
	regionUS    = pki.Identity{Role: pki.RoleRegion, Region: "us-east", ID: "us-east-1"}
	routerID    = pki.Identity{Role: pki.RoleRouter, Region: pki.GlobalRegion, ID: "r1"}
	agentEU     = pki.Identity{Role: pki.RoleAgent, Region: "eu-west", ID: "n1"}
	agentUS     = pki.Identity{Role: pki.RoleAgent, Region: "us-east", ID: "n1"}
	clientAll   = pki.Identity{Role: pki.RoleClient, Region: pki.GlobalRegion, ID: "cli"}
	clientEU    = pki.Identity{Role: pki.RoleClient, Region: "eu-west", ID: "ops"}
	clientUS    = pki.Identity{Role: pki.RoleClient, Region: "us-east", ID: "ops"}
	regionPol   = authz.Policy{Role: pki.RoleRegion, Region: "eu-west", Logger: slog.New(slog.DiscardHandler)}
	routerPol   = authz.Policy{Role: pki.RoleRouter, Region: pki.GlobalRegion, Logger: slog.New(slog.DiscardHandler)}
	allCallers  = []pki.Identity{regionEU2, regionUS, routerID, agentEU, agentUS, clientAll, clientEU, clientUS}
	callerNames = map[pki.Identity]string{regionEU: "region eu-west (self)", regionEU2: "region eu-west", regionUS: "region us-east",
		routerID: "router", agentEU: "agent eu-west/n1", agentUS: "agent us-east/n1", clientAll: "client global",
		clientEU: "client eu-west", clientUS: "client us-east"}
)

// ca is a CA made by internal/pki, with its files in a temp dir.
type ca struct {
	dir          string
	cert, key    []byte
	certsMu      sync.Mutex
	certs        map[pki.Identity][2][]byte
	reloadersMu  sync.Mutex
	reloadersMap map[pki.Identity]*pki.Reloader
}

func newCA(t *testing.T) *ca {
	t.Helper()
	c, k, err := pki.CreateCA(pki.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return &ca{dir: t.TempDir(), cert: c, key: k, certs: map[pki.Identity][2][]byte{}, reloadersMap: map[pki.Identity]*pki.Reloader{}}
}

// leaf returns (and caches) the certificate and key PEM of id.
func (c *ca) leaf(t *testing.T, id pki.Identity) (certPEM, keyPEM []byte) {
	t.Helper()
	c.certsMu.Lock()
	defer c.certsMu.Unlock()
	if p, ok := c.certs[id]; ok {
		return p[0], p[1]
	}
	cert, key, err := pki.CreateCert(c.cert, c.key, pki.CertOptions{Role: id.Role, Region: id.Region, ID: id.ID})
	if err != nil {
		t.Fatal(err)
	}
	c.certs[id] = [2][]byte{cert, key}
	return cert, key
}

// x509 is id's parsed certificate.
func (c *ca) x509(t *testing.T, id pki.Identity) *x509.Certificate {
	t.Helper()
	certPEM, _ := c.leaf(t, id)
	b, _ := pem.Decode(certPEM)
	cert, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// reloader writes id's material into files and loads it as a process does.
func (c *ca) reloader(t *testing.T, id pki.Identity) *pki.Reloader {
	t.Helper()
	c.reloadersMu.Lock()
	defer c.reloadersMu.Unlock()
	if r, ok := c.reloadersMap[id]; ok {
		return r
	}
	certPEM, keyPEM := c.leaf(t, id)
	name := id.Region + "-" + id.Role + "-" + id.ID
	files := map[string][]byte{name + "-ca.pem": c.cert, name + "-cert.pem": certPEM, name + "-key.pem": keyPEM}
	for f, b := range files {
		if err := os.WriteFile(filepath.Join(c.dir, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	r, err := pki.NewReloader(pki.ReloaderConfig{CAFile: filepath.Join(c.dir, name+"-ca.pem"), CertFile: filepath.Join(c.dir, name+"-cert.pem"),
		KeyFile: filepath.Join(c.dir, name+"-key.pem"), Role: id.Role, Region: id.Region, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	c.reloadersMap[id] = r
	return r
}

// peerCtx is the server-side context of a call whose TLS handshake
// verified id's certificate, as grpc hands it to an interceptor.
func (c *ca) peerCtx(t *testing.T, id pki.Identity) context.Context {
	t.Helper()
	return peer.NewContext(context.Background(), &peer.Peer{
		Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000},
		AuthInfo: credentials.TLSInfo{State: tls.ConnectionState{
			VerifiedChains: [][]*x509.Certificate{{c.x509(t, id)}}}},
	})
}

// recorder is what the test servers' handlers write to: every call that
// reached a handler, as "method by identity".
type recorder struct {
	mu      sync.Mutex
	reached []string
}

func (r *recorder) hit(ctx context.Context, method string) {
	who := "none"
	if id, err := pki.PeerIdentity(ctx); err == nil {
		who = id.String()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reached = append(r.reached, method+" by "+who)
}

func (r *recorder) calls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.reached...)
}

// The test servers implement every method of the generated interfaces
// (Unimplemented embedded for the future): each records that it was
// reached and answers an empty response.

type jobSrv struct {
	apiaryv1.UnimplementedJobServiceServer
	r *recorder
}

func (s jobSrv) SubmitJob(ctx context.Context, _ *apiaryv1.SubmitJobRequest) (*apiaryv1.SubmitJobResponse, error) {
	s.r.hit(ctx, "SubmitJob")
	return &apiaryv1.SubmitJobResponse{}, nil
}
func (s jobSrv) GetJob(ctx context.Context, _ *apiaryv1.GetJobRequest) (*apiaryv1.GetJobResponse, error) {
	s.r.hit(ctx, "GetJob")
	return &apiaryv1.GetJobResponse{}, nil
}
func (s jobSrv) ListJobs(ctx context.Context, _ *apiaryv1.ListJobsRequest) (*apiaryv1.ListJobsResponse, error) {
	s.r.hit(ctx, "ListJobs")
	return &apiaryv1.ListJobsResponse{}, nil
}
func (s jobSrv) CancelJob(ctx context.Context, _ *apiaryv1.CancelJobRequest) (*apiaryv1.CancelJobResponse, error) {
	s.r.hit(ctx, "CancelJob")
	return &apiaryv1.CancelJobResponse{}, nil
}
func (s jobSrv) WatchJob(_ *apiaryv1.WatchJobRequest, st grpc.ServerStreamingServer[apiaryv1.WatchJobResponse]) error {
	s.r.hit(st.Context(), "WatchJob")
	return st.Send(&apiaryv1.WatchJobResponse{})
}
func (s jobSrv) GetJobLogs(ctx context.Context, _ *apiaryv1.GetJobLogsRequest) (*apiaryv1.GetJobLogsResponse, error) {
	s.r.hit(ctx, "GetJobLogs")
	return &apiaryv1.GetJobLogsResponse{}, nil
}
func (s jobSrv) GetJobTrace(ctx context.Context, _ *apiaryv1.GetJobTraceRequest) (*apiaryv1.GetJobTraceResponse, error) {
	s.r.hit(ctx, "GetJobTrace")
	return &apiaryv1.GetJobTraceResponse{}, nil
}
func (s jobSrv) ForwardRequest(ctx context.Context, _ *apiaryv1.ForwardRequestRequest) (*apiaryv1.ForwardRequestResponse, error) {
	s.r.hit(ctx, "ForwardRequest")
	return &apiaryv1.ForwardRequestResponse{}, nil
}
func (s jobSrv) LookupRequest(ctx context.Context, _ *apiaryv1.LookupRequestRequest) (*apiaryv1.LookupRequestResponse, error) {
	s.r.hit(ctx, "LookupRequest")
	return &apiaryv1.LookupRequestResponse{}, nil
}

type agentSrv struct {
	apiaryv1.UnimplementedAgentServiceServer
	r *recorder
}

func (s agentSrv) RegisterNode(ctx context.Context, _ *apiaryv1.RegisterNodeRequest) (*apiaryv1.RegisterNodeResponse, error) {
	s.r.hit(ctx, "RegisterNode")
	return &apiaryv1.RegisterNodeResponse{}, nil
}
func (s agentSrv) Heartbeat(ctx context.Context, _ *apiaryv1.HeartbeatRequest) (*apiaryv1.HeartbeatResponse, error) {
	s.r.hit(ctx, "Heartbeat")
	return &apiaryv1.HeartbeatResponse{}, nil
}
func (s agentSrv) StreamAssignments(_ *apiaryv1.StreamAssignmentsRequest, st grpc.ServerStreamingServer[apiaryv1.StreamAssignmentsResponse]) error {
	s.r.hit(st.Context(), "StreamAssignments")
	return st.Send(&apiaryv1.StreamAssignmentsResponse{})
}
func (s agentSrv) ReportTaskStatus(ctx context.Context, _ *apiaryv1.ReportTaskStatusRequest) (*apiaryv1.ReportTaskStatusResponse, error) {
	s.r.hit(ctx, "ReportTaskStatus")
	return &apiaryv1.ReportTaskStatusResponse{}, nil
}
func (s agentSrv) AdoptAttempts(ctx context.Context, _ *apiaryv1.AdoptAttemptsRequest) (*apiaryv1.AdoptAttemptsResponse, error) {
	s.r.hit(ctx, "AdoptAttempts")
	return &apiaryv1.AdoptAttemptsResponse{}, nil
}
func (s agentSrv) DrainSelf(ctx context.Context, _ *apiaryv1.DrainSelfRequest) (*apiaryv1.DrainSelfResponse, error) {
	s.r.hit(ctx, "DrainSelf")
	return &apiaryv1.DrainSelfResponse{}, nil
}
func (s agentSrv) Deregister(ctx context.Context, _ *apiaryv1.DeregisterRequest) (*apiaryv1.DeregisterResponse, error) {
	s.r.hit(ctx, "Deregister")
	return &apiaryv1.DeregisterResponse{}, nil
}
func (s agentSrv) ExportSpans(ctx context.Context, _ *apiaryv1.ExportSpansRequest) (*apiaryv1.ExportSpansResponse, error) {
	s.r.hit(ctx, "ExportSpans")
	return &apiaryv1.ExportSpansResponse{}, nil
}

type adminSrv struct {
	apiaryv1.UnimplementedAdminServiceServer
	r *recorder
}

func (s adminSrv) ListNodes(ctx context.Context, _ *apiaryv1.ListNodesRequest) (*apiaryv1.ListNodesResponse, error) {
	s.r.hit(ctx, "ListNodes")
	return &apiaryv1.ListNodesResponse{}, nil
}
func (s adminSrv) ListShards(ctx context.Context, _ *apiaryv1.ListShardsRequest) (*apiaryv1.ListShardsResponse, error) {
	s.r.hit(ctx, "ListShards")
	return &apiaryv1.ListShardsResponse{}, nil
}

func (s adminSrv) GetRegionInfo(ctx context.Context, _ *apiaryv1.GetRegionInfoRequest) (*apiaryv1.GetRegionInfoResponse, error) {
	s.r.hit(ctx, "GetRegionInfo")
	return &apiaryv1.GetRegionInfoResponse{}, nil
}
func (s adminSrv) ListRegions(ctx context.Context, _ *apiaryv1.ListRegionsRequest) (*apiaryv1.ListRegionsResponse, error) {
	s.r.hit(ctx, "ListRegions")
	return &apiaryv1.ListRegionsResponse{}, nil
}
func (s adminSrv) QuarantineNode(ctx context.Context, _ *apiaryv1.QuarantineNodeRequest) (*apiaryv1.QuarantineNodeResponse, error) {
	s.r.hit(ctx, "QuarantineNode")
	return &apiaryv1.QuarantineNodeResponse{}, nil
}
func (s adminSrv) ReleaseNode(ctx context.Context, _ *apiaryv1.ReleaseNodeRequest) (*apiaryv1.ReleaseNodeResponse, error) {
	s.r.hit(ctx, "ReleaseNode")
	return &apiaryv1.ReleaseNodeResponse{}, nil
}
func (s adminSrv) DrainNode(ctx context.Context, _ *apiaryv1.DrainNodeRequest) (*apiaryv1.DrainNodeResponse, error) {
	s.r.hit(ctx, "DrainNode")
	return &apiaryv1.DrainNodeResponse{}, nil
}
func (s adminSrv) SetNodeEligibility(ctx context.Context, _ *apiaryv1.SetNodeEligibilityRequest) (*apiaryv1.SetNodeEligibilityResponse, error) {
	s.r.hit(ctx, "SetNodeEligibility")
	return &apiaryv1.SetNodeEligibilityResponse{}, nil
}
func (s adminSrv) GossipKeyring(ctx context.Context, _ *apiaryv1.GossipKeyringRequest) (*apiaryv1.GossipKeyringResponse, error) {
	s.r.hit(ctx, "GossipKeyring")
	return &apiaryv1.GossipKeyringResponse{}, nil
}
func (s adminSrv) SaveSnapshot(_ *apiaryv1.SaveSnapshotRequest, st grpc.ServerStreamingServer[apiaryv1.SaveSnapshotResponse]) error {
	s.r.hit(st.Context(), "SaveSnapshot")
	return st.Send(&apiaryv1.SaveSnapshotResponse{})
}

type aclSrv struct {
	apiaryv1.UnimplementedACLServiceServer
	r *recorder
}

func (s aclSrv) BootstrapACL(ctx context.Context, _ *apiaryv1.BootstrapACLRequest) (*apiaryv1.BootstrapACLResponse, error) {
	s.r.hit(ctx, "BootstrapACL")
	return &apiaryv1.BootstrapACLResponse{}, nil
}
func (s aclSrv) CreateACLToken(ctx context.Context, _ *apiaryv1.CreateACLTokenRequest) (*apiaryv1.CreateACLTokenResponse, error) {
	s.r.hit(ctx, "CreateACLToken")
	return &apiaryv1.CreateACLTokenResponse{}, nil
}
func (s aclSrv) ListACLTokens(ctx context.Context, _ *apiaryv1.ListACLTokensRequest) (*apiaryv1.ListACLTokensResponse, error) {
	s.r.hit(ctx, "ListACLTokens")
	return &apiaryv1.ListACLTokensResponse{}, nil
}
func (s aclSrv) RevokeACLToken(ctx context.Context, _ *apiaryv1.RevokeACLTokenRequest) (*apiaryv1.RevokeACLTokenResponse, error) {
	s.r.hit(ctx, "RevokeACLToken")
	return &apiaryv1.RevokeACLTokenResponse{}, nil
}
func (s aclSrv) GetACLSelf(ctx context.Context, _ *apiaryv1.GetACLSelfRequest) (*apiaryv1.GetACLSelfResponse, error) {
	s.r.hit(ctx, "GetACLSelf")
	return &apiaryv1.GetACLSelfResponse{}, nil
}
func (s aclSrv) ApplyACLPolicy(ctx context.Context, _ *apiaryv1.ApplyACLPolicyRequest) (*apiaryv1.ApplyACLPolicyResponse, error) {
	s.r.hit(ctx, "ApplyACLPolicy")
	return &apiaryv1.ApplyACLPolicyResponse{}, nil
}
func (s aclSrv) ListACLPolicies(ctx context.Context, _ *apiaryv1.ListACLPoliciesRequest) (*apiaryv1.ListACLPoliciesResponse, error) {
	s.r.hit(ctx, "ListACLPolicies")
	return &apiaryv1.ListACLPoliciesResponse{}, nil
}
func (s aclSrv) DeleteACLPolicy(ctx context.Context, _ *apiaryv1.DeleteACLPolicyRequest) (*apiaryv1.DeleteACLPolicyResponse, error) {
	s.r.hit(ctx, "DeleteACLPolicy")
	return &apiaryv1.DeleteACLPolicyResponse{}, nil
}

// recordingHealth is grpc's health server, recording Check calls.
type recordingHealth struct {
	*health.Server
	r *recorder
}

func (h recordingHealth) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	h.r.hit(ctx, "Check")
	return h.Server.Check(ctx, req)
}

// testServer is a real gRPC server on 127.0.0.1 serving JobService,
// AgentService, AdminService and Health behind p's interceptors, with
// opts (mTLS credentials, or none for plaintext).
type testServer struct {
	addr string
	rec  *recorder
}

func startServer(t *testing.T, p authz.Policy, opts ...grpc.ServerOption) *testServer {
	t.Helper()
	ts := &testServer{rec: &recorder{}}
	opts = append(opts, grpc.ChainUnaryInterceptor(p.UnaryInterceptor()), grpc.ChainStreamInterceptor(p.StreamInterceptor()))
	srv := grpc.NewServer(opts...)
	apiaryv1.RegisterJobServiceServer(srv, jobSrv{r: ts.rec})
	apiaryv1.RegisterAgentServiceServer(srv, agentSrv{r: ts.rec})
	apiaryv1.RegisterAdminServiceServer(srv, adminSrv{r: ts.rec})
	apiaryv1.RegisterACLServiceServer(srv, aclSrv{r: ts.rec})
	apiaryv1.RegisterFailoverServiceServer(srv, failSrv{r: ts.rec})
	healthpb.RegisterHealthServer(srv, recordingHealth{Server: health.NewServer(), r: ts.rec})
	lis := testutil.Listen(t)
	ts.addr = lis.Addr().String()
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return ts
}

type failSrv struct {
	apiaryv1.UnimplementedFailoverServiceServer
	r *recorder
}

func (s failSrv) PutStandby(ctx context.Context, _ *apiaryv1.PutStandbyRequest) (*apiaryv1.PutStandbyResponse, error) {
	s.r.hit(ctx, "PutStandby")
	return &apiaryv1.PutStandbyResponse{}, nil
}
func (s failSrv) PushProgress(ctx context.Context, _ *apiaryv1.PushProgressRequest) (*apiaryv1.PushProgressResponse, error) {
	s.r.hit(ctx, "PushProgress")
	return &apiaryv1.PushProgressResponse{}, nil
}
func (s failSrv) MovedJobs(ctx context.Context, _ *apiaryv1.MovedJobsRequest) (*apiaryv1.MovedJobsResponse, error) {
	s.r.hit(ctx, "MovedJobs")
	return &apiaryv1.MovedJobsResponse{}, nil
}
func (s failSrv) ReleaseJob(ctx context.Context, _ *apiaryv1.ReleaseJobRequest) (*apiaryv1.ReleaseJobResponse, error) {
	s.r.hit(ctx, "ReleaseJob")
	return &apiaryv1.ReleaseJobResponse{}, nil
}
func (s failSrv) DropClaim(ctx context.Context, _ *apiaryv1.DropClaimRequest) (*apiaryv1.DropClaimResponse, error) {
	s.r.hit(ctx, "DropClaim")
	return &apiaryv1.DropClaimResponse{}, nil
}
func (s failSrv) ClaimJob(ctx context.Context, _ *apiaryv1.ClaimJobRequest) (*apiaryv1.ClaimJobResponse, error) {
	s.r.hit(ctx, "ClaimJob")
	return &apiaryv1.ClaimJobResponse{}, nil
}
