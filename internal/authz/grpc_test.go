package authz_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/emptypb"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/authz"
	"apiary.dev/apiary/internal/pki"
	"apiary.dev/apiary/internal/testutil"
)

// method is one RPC of the served descriptors.
type method struct {
	full    string // "/apiary.v1.JobService/SubmitJob"
	service string // "JobService"
	name    string // "SubmitJob"
	md      protoreflect.MethodDescriptor
}

// servedMethods lists every method of apiary.v1 and grpc.health.v1.
func servedMethods(t *testing.T) []method {
	t.Helper()
	var out []method
	for _, fd := range []protoreflect.FileDescriptor{apiaryv1.File_apiary_v1_apiary_proto, healthpb.File_grpc_health_v1_health_proto} {
		for i := 0; i < fd.Services().Len(); i++ {
			sd := fd.Services().Get(i)
			for j := 0; j < sd.Methods().Len(); j++ {
				md := sd.Methods().Get(j)
				out = append(out, method{full: "/" + string(sd.FullName()) + "/" + string(md.Name()), service: string(sd.Name()), name: string(md.Name()), md: md})
			}
		}
	}
	if len(out) < 27 {
		t.Fatalf("only %d methods in the descriptors", len(out))
	}
	return out
}

// newMsg is an empty message of d's generated type, its node_id (if it has
// one) set to nodeID, and the region a FailoverService request acts for
// (home_region, job.home_region, standby_region) set to actFor.
func newMsg(t *testing.T, d protoreflect.MessageDescriptor, nodeID string, actFor ...string) proto.Message {
	t.Helper()
	mt, err := protoregistry.GlobalTypes.FindMessageByName(d.FullName())
	if err != nil {
		t.Fatal(err)
	}
	m := mt.New()
	if f := d.Fields().ByName("node_id"); f != nil && nodeID != "" {
		m.Set(f, protoreflect.ValueOfString(nodeID))
	}
	if len(actFor) > 0 {
		for _, name := range []protoreflect.Name{"home_region", "standby_region"} {
			if f := d.Fields().ByName(name); f != nil {
				m.Set(f, protoreflect.ValueOfString(actFor[0]))
			}
		}
		if f := d.Fields().ByName("job"); f != nil && f.Message() != nil {
			m.Set(f, protoreflect.ValueOfMessage(newMsg(t, f.Message(), "", actFor...).ProtoReflect()))
		}
	}
	return m.Interface()
}

// call makes one call of m on cc with an empty request (node_id = nodeID),
// unary or server-streaming as m is, and returns its outcome: for a
// stream, the outcome of receiving its first message.
func call(t *testing.T, cc *grpc.ClientConn, m method, nodeID string, actFor ...string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	in, out := newMsg(t, m.md.Input(), nodeID, actFor...), newMsg(t, m.md.Output(), "")
	if !m.md.IsStreamingServer() && !m.md.IsStreamingClient() {
		return cc.Invoke(ctx, m.full, in, out)
	}
	st, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: m.md.IsStreamingServer(), ClientStreams: m.md.IsStreamingClient()}, m.full)
	if err != nil {
		return err
	}
	if err := st.SendMsg(in); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if err := st.CloseSend(); err != nil {
		return err
	}
	return st.RecvMsg(out)
}

// recordsName: which methods' handlers record (every apiary one; of health,
// Check).
func recordsName(m method) bool { return m.service != "Health" || m.name == "Check" }

// dial connects to addr with mTLS as id, verifying the server as
// serverName.
func dial(t *testing.T, c *ca, id pki.Identity, addr, serverName string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, pki.DialOption(c.reloader(t, id), serverName))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// outcome is what a caller should get from one kind of method.
type outcome struct {
	api, routerOnly, agent, health codes.Code
	// peerOK: FailoverService is allowed (denied otherwise).
	peerOK bool
}

const (
	ok   = codes.OK
	deny = codes.PermissionDenied
)

// kindOf sorts a method into the columns of outcome.
func kindOf(m method) string {
	switch {
	case m.service == "Health":
		return "health"
	case m.service == "AgentService":
		return "agent"
	case m.name == "ForwardRequest" || m.name == "LookupRequest":
		return "routerOnly"
	case m.service == "FailoverService":
		return "peer"
	}
	return "api"
}

func (o outcome) of(m method) codes.Code {
	switch kindOf(m) {
	case "health":
		return o.health
	case "agent":
		return o.agent
	case "routerOnly":
		return o.routerOnly
	case "peer":
		if o.peerOK {
			return ok
		}
		return deny
	}
	return o.api
}

// checkMatrix calls every served method as every caller and checks the
// code, and that exactly the allowed calls reached their handler.
func checkMatrix(t *testing.T, c *ca, ts *testServer, serverName string, want map[pki.Identity]outcome) {
	t.Helper()
	methods := servedMethods(t)
	for _, caller := range allCallers {
		o, found := want[caller]
		if !found {
			t.Fatalf("no expectation for %s", callerNames[caller])
		}
		cc := dial(t, c, caller, ts.addr, serverName)
		for _, m := range methods {
			before := len(ts.rec.calls())
			err := call(t, cc, m, caller.ID, caller.Region)
			wantCode := o.of(m)
			if status.Code(err) != wantCode {
				t.Errorf("%s calling %s: %v; want %s", callerNames[caller], m.full, err, wantCode)
				continue
			}
			calls := ts.rec.calls()
			switch {
			case wantCode != codes.OK && len(calls) != before:
				t.Errorf("%s calling %s was refused but reached the handler: %v", callerNames[caller], m.full, calls[before:])
			case wantCode == codes.OK && recordsName(m) && !slices.Equal(calls[before:], []string{m.name + " by " + caller.String()}):
				t.Errorf("%s calling %s was allowed; handler records %v", callerNames[caller], m.full, calls[before:])
			}
		}
	}
}

// TestRegionServerOverMTLS: a coordinator of eu-west serving every service
// over mTLS behind the policy. Every method of every service is called by
// every kind of certificate (agents with their own node id).
func TestRegionServerOverMTLS(t *testing.T) {
	c := newCA(t)
	ts := startServer(t, regionPol, pki.ServerCredentials(c.reloader(t, regionEU)))
	checkMatrix(t, c, ts, pki.RegionServerName("eu-west"), map[pki.Identity]outcome{
		regionEU2: {api: ok, routerOnly: deny, agent: deny, health: ok},
		// Another region's coordinators call FailoverService only.
		regionUS:  {api: deny, routerOnly: deny, agent: deny, health: ok, peerOK: true},
		routerID:  {api: ok, routerOnly: ok, agent: deny, health: ok},
		agentEU:   {api: deny, routerOnly: deny, agent: ok, health: ok},
		agentUS:   {api: deny, routerOnly: deny, agent: deny, health: ok},
		clientAll: {api: ok, routerOnly: deny, agent: deny, health: ok},
		clientEU:  {api: ok, routerOnly: deny, agent: deny, health: ok},
		clientUS:  {api: deny, routerOnly: deny, agent: deny, health: ok},
	})
}

// TestRouterServerOverMTLS: the router's policy (the test server serves
// AgentService too, to show the policy refuses it, not only its absence).
func TestRouterServerOverMTLS(t *testing.T) {
	c := newCA(t)
	ts := startServer(t, routerPol, pki.ServerCredentials(c.reloader(t, routerID)))
	never := outcome{api: deny, routerOnly: deny, agent: deny, health: ok}
	client := outcome{api: ok, routerOnly: deny, agent: deny, health: ok}
	checkMatrix(t, c, ts, pki.RouterServerName, map[pki.Identity]outcome{
		regionEU2: never, regionUS: never, routerID: never, agentEU: never, agentUS: never,
		// A scoped client would act in every region through the router
		// (which forwards with its own certificate): refused.
		clientAll: client, clientEU: never, clientUS: never,
	})
}

// TestNodeIDMismatchOverMTLS: an agent of the region with a valid
// certificate cannot act for another node on any AgentService method,
// unary or stream, nor send an empty node id; nothing reaches a handler.
func TestNodeIDMismatchOverMTLS(t *testing.T) {
	c := newCA(t)
	ts := startServer(t, regionPol, pki.ServerCredentials(c.reloader(t, regionEU)))
	cc := dial(t, c, agentEU, ts.addr, pki.RegionServerName("eu-west"))
	n := 0
	for _, m := range servedMethods(t) {
		if m.service != "AgentService" {
			continue
		}
		n++
		for node, msg := range map[string]string{"n2": "agent certificate of node n1 cannot act for node n2", "": `agent certificate of node n1 cannot act for node ""`} {
			err := call(t, cc, m, node)
			if status.Code(err) != codes.PermissionDenied || status.Convert(err).Message() != msg {
				t.Errorf("%s with node_id %q: %v; want PermissionDenied %q", m.name, node, err, msg)
			}
		}
		if err := call(t, cc, m, "n1"); err != nil {
			t.Errorf("%s for its own node: %v", m.name, err)
		}
	}
	if n < 8 {
		t.Fatalf("only %d AgentService methods", n)
	}
	for _, got := range ts.rec.calls() {
		if !strings.HasSuffix(got, " by "+agentEU.String()) {
			t.Errorf("handler reached: %s", got)
		}
	}
	if len(ts.rec.calls()) != n {
		t.Errorf("handlers reached %d times; want %d (the own-node calls only): %v", len(ts.rec.calls()), n, ts.rec.calls())
	}
}

// TestNoCertificate: on a plaintext server with the interceptors, every
// call is Unauthenticated with the mTLS hint and reaches nothing; on the
// mTLS server a TLS client without a certificate fails the handshake.
func TestNoCertificate(t *testing.T) {
	plain := startServer(t, regionPol)
	cc, err := grpc.NewClient(plain.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	for _, m := range servedMethods(t) {
		err := call(t, cc, m, "n1")
		if status.Code(err) != codes.Unauthenticated || status.Convert(err).Message() != authz.NoCertificateMessage {
			t.Errorf("plaintext %s: %v; want Unauthenticated %q", m.full, err, authz.NoCertificateMessage)
		}
	}
	if got := plain.rec.calls(); len(got) != 0 {
		t.Errorf("plaintext calls reached handlers: %v", got)
	}

	c := newCA(t)
	ts := startServer(t, regionPol, pki.ServerCredentials(c.reloader(t, regionEU)))
	// Trusts the server, presents no certificate.
	noCert := c.reloader(t, clientAll).ClientTLSConfig(pki.RegionServerName("eu-west"))
	noCert.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &tls.Certificate{}, nil }
	cc2, err := grpc.NewClient(ts.addr, grpc.WithTransportCredentials(credentials.NewTLS(noCert)))
	if err != nil {
		t.Fatal(err)
	}
	defer cc2.Close()
	err = call(t, cc2, servedMethods(t)[0], "")
	if status.Code(err) != codes.Unavailable {
		t.Errorf("TLS without a client certificate: %v; want the connection refused (Unavailable)", err)
	}
	// Why: the server's TLS alert, read on a plain TLS connection (grpc's
	// error shows it or a reset, depending on timing).
	conn, err := tls.Dial("tcp", ts.addr, noCert)
	if err == nil {
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = conn.Read(make([]byte, 1))
		conn.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "certificate required") {
		t.Errorf("TLS without a client certificate: %v; want the server's alert \"certificate required\"", err)
	}
	if got := ts.rec.calls(); len(got) != 0 {
		t.Errorf("calls reached handlers: %v", got)
	}
}

// TestUnknownServiceDenied: a service registered on the server without a
// rule in the table is refused, over mTLS, to every caller.
func TestUnknownServiceDenied(t *testing.T) {
	c := newCA(t)
	rec := &recorder{}
	const full = "/apiary.v1.TestOnlyService/Do"
	desc := grpc.ServiceDesc{ServiceName: "apiary.v1.TestOnlyService", HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Do", Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			in := &emptypb.Empty{}
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, _ any) (any, error) { rec.hit(ctx, "Do"); return &emptypb.Empty{}, nil }
			return ic(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: full}, h)
		}}}}
	srv := grpc.NewServer(pki.ServerCredentials(c.reloader(t, regionEU)), grpc.UnaryInterceptor(regionPol.UnaryInterceptor()))
	srv.RegisterService(&desc, struct{}{})
	lis := testutil.Listen(t)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	for _, caller := range allCallers {
		cc := dial(t, c, caller, lis.Addr().String(), pki.RegionServerName("eu-west"))
		err := cc.Invoke(context.Background(), full, &emptypb.Empty{}, &emptypb.Empty{})
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s: %v; want PermissionDenied", callerNames[caller], err)
		}
	}
	if got := rec.calls(); len(got) != 0 {
		t.Errorf("the unlisted method was reached: %v", got)
	}
}

// denials reads apiary_authz_denials_total from reg by "service/reason".
func denials(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != authz.MetricDenials {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			out[labels["service"]+"/"+labels["reason"]] += m.GetCounter().GetValue()
		}
	}
	return out
}

// TestDenialsLoggedAndCounted: each refusal is one WARN line naming the
// method, the caller's identity and the reason, without the request's
// contents, and one count in apiary_authz_denials_total{service,reason};
// allowed calls are neither.
func TestDenialsLoggedAndCounted(t *testing.T) {
	c := newCA(t)
	logs := &testutil.LogBuffer{}
	reg := prometheus.NewRegistry()
	p := authz.Policy{Role: pki.RoleRegion, Region: "eu-west", Logger: slog.New(slog.NewJSONHandler(logs, nil)), Registerer: reg}
	ts := startServer(t, p, pki.ServerCredentials(c.reloader(t, regionEU)))
	// A second server's policy on the same registry shares the counter.
	startServer(t, p, pki.ServerCredentials(c.reloader(t, regionEU)))

	name := pki.RegionServerName("eu-west")
	agent := dial(t, c, agentEU, ts.addr, name)
	const secret = "hunter2-do-not-log"
	spec := &apiaryv1.SubmitJobRequest{Spec: &apiaryv1.JobSpec{Name: "x"}, ClientId: secret, RequestId: secret}
	if err := agent.Invoke(context.Background(), apiaryv1.JobService_SubmitJob_FullMethodName, spec, &apiaryv1.SubmitJobResponse{}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("agent SubmitJob: %v", err)
	}
	m := method{}
	for _, sm := range servedMethods(t) {
		if sm.name == "StreamAssignments" {
			m = sm
		}
	}
	if err := call(t, agent, m, "n2"); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("agent StreamAssignments for n2: %v", err)
	}
	if err := agent.Invoke(context.Background(), apiaryv1.AgentService_Heartbeat_FullMethodName, &apiaryv1.HeartbeatRequest{NodeId: "n1"}, &apiaryv1.HeartbeatResponse{}); err != nil {
		t.Fatalf("allowed heartbeat: %v", err)
	}
	us := dial(t, c, regionUS, ts.addr, name)
	if err := us.Invoke(context.Background(), apiaryv1.AgentService_Heartbeat_FullMethodName, &apiaryv1.HeartbeatRequest{NodeId: "n1"}, &apiaryv1.HeartbeatResponse{}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("us-east coordinator heartbeat: %v", err)
	}

	got := denials(t, reg)
	want := map[string]float64{"apiary.v1.JobService/wrong_role": 1, "apiary.v1.AgentService/node_mismatch": 1, "apiary.v1.AgentService/other_region": 1}
	if len(got) != len(want) {
		t.Errorf("denials %v; want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("denials[%s] = %v; want %v (all: %v)", k, got[k], v, got)
		}
	}

	text := logs.String()
	if strings.Contains(text, secret) {
		t.Errorf("a request's contents were logged:\n%s", text)
	}
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(text), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		lines = append(lines, rec)
	}
	if len(lines) != 3 {
		t.Fatalf("%d log lines; want 3:\n%s", len(lines), text)
	}
	for i, w := range []struct{ method, identity, reason string }{
		{apiaryv1.JobService_SubmitJob_FullMethodName, agentEU.String(), authz.ReasonWrongRole},
		{apiaryv1.AgentService_StreamAssignments_FullMethodName, agentEU.String(), authz.ReasonNodeMismatch},
		{apiaryv1.AgentService_Heartbeat_FullMethodName, regionUS.String(), authz.ReasonOtherRegion},
	} {
		l := lines[i]
		if l["level"] != "WARN" || l["method"] != w.method || l["identity"] != w.identity || l["reason"] != w.reason ||
			l["code"] != "PermissionDenied" || !strings.HasPrefix(l["peer"].(string), "127.0.0.1:") || l["why"] == "" {
			t.Errorf("log line %d = %v; want WARN %s by %s, %s", i, l, w.method, w.identity, w.reason)
		}
	}
}
