package authz

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/ids"
	"apiary.dev/apiary/internal/pki"
	"apiary.dev/apiary/internal/telemetry"
)

// Reasons a call is refused: the reason label of
// apiary_authz_denials_total and the "reason" attribute of the log line.
const (
	// ReasonNoCertificate: no verified client certificate (plaintext, or
	// TLS without one). codes.Unauthenticated.
	ReasonNoCertificate = "no_certificate"
	// ReasonBadIdentity: a verified certificate that carries no (or a
	// malformed) Apiary identity URI. codes.Unauthenticated.
	ReasonBadIdentity = "bad_identity"
	// ReasonWrongRole: the caller's role may not call the method here.
	ReasonWrongRole = "wrong_role"
	// ReasonOtherRegion: a region, agent or region-scoped client
	// certificate of another region.
	ReasonOtherRegion = "other_region"
	// ReasonNodeMismatch: an agent request whose node_id is not the agent
	// certificate's id (or that carries none).
	ReasonNodeMismatch = "node_mismatch"
	// ReasonUnknownMethod: the method has no rule (deny by default).
	ReasonUnknownMethod = "unknown_method"
	// ReasonMisconfigured: the server's Policy is invalid (see Validate);
	// every call is refused with codes.Internal.
	ReasonMisconfigured = "misconfigured"
)

// NoCertificateMessage is the status message of a call without a verified
// client certificate (codes.Unauthenticated).
const NoCertificateMessage = "no client certificate: this server requires mTLS (--tls-ca/--tls-cert/--tls-key)"

// MetricDenials is the name of the denial counter, labelled service (the
// gRPC service's full name, e.g. apiary.v1.AgentService, or "unknown" for
// a method without a rule) and reason (one of the Reason constants).
const MetricDenials = "apiary_authz_denials_total"

// Policy is one server's rule set: who may call which method of the
// server, decided from the caller's verified mTLS identity
// (pki.PeerIdentity). The zero Policy is invalid and refuses every call.
//
// On a region server (Role pki.RoleRegion, Region R):
//   - any method: a region certificate of a region other than R is
//     refused (PermissionDenied naming both regions);
//   - AgentService: agent certificates of region R only, and every request
//     message's node_id must be the certificate's id (for streams, every
//     message received);
//   - JobService and AdminService: client certificates (unscoped, or
//     scoped to R), router certificates and region certificates of R;
//     ForwardRequest and LookupRequest (router-to-region bookkeeping of
//     cross-region idempotency): router certificates only;
//   - grpc.health.v1.Health: any verified identity (but the other-region
//     rule above).
//
// On the router (Role pki.RoleRouter, Region pki.GlobalRegion):
//   - JobService and AdminService: client certificates of any region;
//     ForwardRequest and LookupRequest: nobody (coordinators serve them);
//   - AgentService: nobody;
//   - grpc.health.v1.Health: any verified identity.
//
// A method without a rule is refused (PermissionDenied); a call without a
// verified client certificate is refused with Unauthenticated.
type Policy struct {
	// Region is the server's region (pki.GlobalRegion, or empty, for the
	// router).
	Region string
	// Role is the server's own role: pki.RoleRegion or pki.RoleRouter.
	Role string
	// Logger receives one WARN line per denial: method, identity (its URI,
	// or "none"), peer address, code, reason and the message sent back;
	// never a request's contents. Nil means slog.Default().
	Logger *slog.Logger
	// Registerer, when set, gets the counter apiary_authz_denials_total
	// {service,reason} (registered once; a Policy built again on the same
	// registry reuses it). Nil: no metrics.
	Registerer prometheus.Registerer
}

// Validate says what is wrong with the policy: Role must be pki.RoleRegion
// with a region name (not "global") or pki.RoleRouter with Region empty or
// pki.GlobalRegion. Interceptors of an invalid policy refuse every call
// with codes.Internal; servers should call Validate at startup.
func (p Policy) Validate() error {
	switch p.Role {
	case pki.RoleRegion:
		if p.Region == pki.GlobalRegion || !ids.Region.MatchString(p.Region) {
			return fmt.Errorf("authz: a region server's policy needs its region name (got %q)", p.Region)
		}
	case pki.RoleRouter:
		if p.Region != "" && p.Region != pki.GlobalRegion {
			return fmt.Errorf("authz: the router's policy region must be %q (got %q)", pki.GlobalRegion, p.Region)
		}
	default:
		return fmt.Errorf("authz: policy role must be %q or %q (got %q)", pki.RoleRegion, pki.RoleRouter, p.Role)
	}
	return nil
}

// Authorize is the decision for one call of fullMethod
// ("/apiary.v1.AgentService/Heartbeat") with request message req, made by
// the peer of ctx (a server-side call context; see pki.PeerIdentity). It
// returns nil when the call may proceed, else a status error:
// codes.Unauthenticated without a verified client certificate (message
// NoCertificateMessage) or with one that carries no Apiary identity,
// codes.PermissionDenied for every rule that refuses it, codes.Internal
// for an invalid Policy. For AgentService methods req must be the request
// message (its node_id is checked); nil is refused. Authorize neither logs
// nor counts: the interceptors do.
func (p Policy) Authorize(ctx context.Context, fullMethod string, req any) error {
	id, idErr := pki.PeerIdentity(ctx)
	r, d := p.decide(p.Validate(), id, idErr, fullMethod)
	if d == nil {
		d = checkRequest(r, id, req)
	}
	if d != nil {
		return d.err()
	}
	return nil
}

// UnaryInterceptor enforces the policy on unary calls: a refused call
// never reaches its handler, is logged at WARN and counted.
func (p Policy) UnaryInterceptor() grpc.UnaryServerInterceptor {
	e := p.enforcer()
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		id, idErr := pki.PeerIdentity(ctx)
		r, d := e.p.decide(e.invalid, id, idErr, info.FullMethod)
		if d == nil {
			d = checkRequest(r, id, req)
		}
		if d != nil {
			return nil, e.deny(ctx, info.FullMethod, id, idErr == nil, d)
		}
		return handler(ctx, req)
	}
}

// StreamInterceptor enforces the policy on streams: the caller is checked
// when the stream opens (a refused stream never reaches its handler); on
// AgentService streams every message received is checked too (node_id
// must be the agent certificate's id), and the first one that fails ends
// the stream with PermissionDenied: the handler's RecvMsg returns the
// denial, its context is cancelled, every later RecvMsg and SendMsg
// returns the denial, and so does the stream, whatever the handler
// returns. Such a stream sends nothing before one received message has
// passed the check (SendMsg returns codes.Internal: a handler bug).
func (p Policy) StreamInterceptor() grpc.StreamServerInterceptor {
	e := p.enforcer()
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx := ss.Context()
		id, idErr := pki.PeerIdentity(ctx)
		r, d := e.p.decide(e.invalid, id, idErr, info.FullMethod)
		if d != nil {
			return e.deny(ctx, info.FullMethod, id, idErr == nil, d)
		}
		if r.access != accessAgent {
			return handler(srv, ss)
		}
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		bs := &nodeBoundStream{ServerStream: ss, ctx: cctx, cancel: cancel, e: e, id: id, method: info.FullMethod}
		err := handler(srv, bs)
		if denied := bs.denial(); denied != nil {
			return denied
		}
		return err
	}
}

// denial is one refusal: its status and its metric reason.
type denial struct {
	code   codes.Code
	reason string
	msg    string
}

func (d *denial) err() error { return status.Error(d.code, d.msg) }

func refuse(reason, format string, args ...any) *denial {
	return &denial{code: codes.PermissionDenied, reason: reason, msg: fmt.Sprintf(format, args...)}
}

// article is "a client certificate", "an agent certificate".
func article(role string) string {
	if role != "" && strings.ContainsRune("aeiou", rune(role[0])) {
		return "an " + role + " certificate"
	}
	return "a " + role + " certificate"
}

// methodName is the last element of a full method name.
func methodName(fullMethod string) string {
	return fullMethod[strings.LastIndexByte(fullMethod, '/')+1:]
}

// decide applies everything but the node_id check to a call by id (idErr:
// pki.PeerIdentity's error) of fullMethod on a server whose policy
// p.Validate() said invalid; it returns the method's rule and the denial,
// nil when the call may proceed.
func (p Policy) decide(invalid error, id pki.Identity, idErr error, fullMethod string) (rule, *denial) {
	if invalid != nil {
		return rule{}, &denial{code: codes.Internal, reason: ReasonMisconfigured, msg: invalid.Error()}
	}
	if idErr != nil {
		if errors.Is(idErr, pki.ErrNoPeerIdentity) {
			return rule{}, &denial{code: codes.Unauthenticated, reason: ReasonNoCertificate, msg: NoCertificateMessage}
		}
		return rule{}, &denial{code: codes.Unauthenticated, reason: ReasonBadIdentity,
			msg: "client certificate carries no valid Apiary identity: " + idErr.Error()}
	}
	r, ok := methods[fullMethod]
	// Another region's coordinators: FailoverService, and health (their
	// failover probes of this region).
	if p.Role == pki.RoleRegion && id.Role == pki.RoleRegion && id.Region != p.Region && (!ok || (r.access != accessPeerRegion && r.access != accessAnyone)) {
		return rule{}, refuse(ReasonOtherRegion, "a region certificate of region %s cannot act in region %s", id.Region, p.Region)
	}
	if !ok {
		return rule{}, refuse(ReasonUnknownMethod, "method %s has no authorization rule on this server: denied by default", fullMethod)
	}
	what := r.short + "/" + methodName(fullMethod)
	if r.access == accessAnyone {
		return r, nil
	}
	if p.Role == pki.RoleRouter {
		return r, p.decideRouter(r, id, what)
	}
	switch r.access {
	case accessAgent:
		if id.Role != pki.RoleAgent {
			return r, refuse(ReasonWrongRole, "%s cannot call %s: only agent certificates of region %s can", article(id.Role), what, p.Region)
		}
		if id.Region != p.Region {
			return r, refuse(ReasonOtherRegion, "an agent certificate of region %s cannot call %s of region %s", id.Region, r.short, p.Region)
		}
		return r, nil
	case accessAPI:
		switch id.Role {
		case pki.RoleClient:
			if id.Region != pki.GlobalRegion && id.Region != p.Region {
				return r, refuse(ReasonOtherRegion, "a client certificate scoped to region %s cannot call region %s", id.Region, p.Region)
			}
			return r, nil
		case pki.RoleRouter, pki.RoleRegion: // a region certificate here is of this region (checked above)
			return r, nil
		default:
			return r, refuse(ReasonWrongRole, "%s cannot call %s (%s)", article(id.Role), r.short, what)
		}
	case accessRouterOnly:
		if id.Role != pki.RoleRouter {
			return r, refuse(ReasonWrongRole, "%s cannot call %s: only routers call it", article(id.Role), what)
		}
		return r, nil
	case accessPeerRegion:
		if id.Role != pki.RoleRegion || id.Region == p.Region {
			return r, refuse(ReasonWrongRole, "%s cannot call %s: only the coordinators of other regions call it", article(id.Role), what)
		}
		return r, nil
	}
	return r, refuse(ReasonUnknownMethod, "method %s has no authorization rule on this server: denied by default", fullMethod)
}

// decideRouter is decide's answer on the router for a method that is not
// open to anyone.
func (p Policy) decideRouter(r rule, id pki.Identity, what string) *denial {
	switch r.access {
	case accessAgent:
		return refuse(ReasonWrongRole, "the router serves no %s: agents call their region's coordinators", r.short)
	case accessRouterOnly, accessPeerRegion:
		return refuse(ReasonWrongRole, "%s is served by coordinators only, not by the router", what)
	case accessAPI:
		switch id.Role {
		case pki.RoleClient:
			if id.Region != "" && id.Region != pki.GlobalRegion {
				// The router forwards with its own certificate, which
				// every region accepts: a scoped client must call its
				// region's coordinators, where the scope is checked.
				return refuse(ReasonOtherRegion, "a client certificate scoped to region %s cannot use the router (it acts in every region); call region %s's coordinators directly", id.Region, id.Region)
			}
			return nil
		case pki.RoleRegion:
			return refuse(ReasonWrongRole, "a region certificate cannot call the router's %s (%s): regions never call the router", r.short, what)
		case pki.RoleRouter:
			return refuse(ReasonWrongRole, "a router certificate cannot call another router's %s (%s)", r.short, what)
		default:
			return refuse(ReasonWrongRole, "%s cannot call %s (%s)", article(id.Role), r.short, what)
		}
	}
	return refuse(ReasonUnknownMethod, "%s has no authorization rule on the router: denied by default", what)
}

// checkRequest applies the per-message part of a rule: an agent acts for
// its own node, a peer region for its own region.
func checkRequest(r rule, id pki.Identity, req any) *denial {
	switch r.access {
	case accessAgent:
		return checkNode(id, req)
	case accessPeerRegion:
		return checkPeerRegion(id, req)
	}
	return nil
}

// actingRegion is the region a FailoverService request acts for: its
// home_region (ReleaseJob and DropClaim too), or standby_region for ClaimJob ("", false for any other
// message).
func actingRegion(req any) (string, bool) {
	switch m := req.(type) {
	case *apiaryv1.PutStandbyRequest:
		return m.GetJob().GetHomeRegion(), true
	case *apiaryv1.PushProgressRequest:
		return m.GetHomeRegion(), true
	case *apiaryv1.MovedJobsRequest:
		return m.GetHomeRegion(), true
	case *apiaryv1.ClaimJobRequest:
		return m.GetStandbyRegion(), true
	case *apiaryv1.ReleaseJobRequest:
		return m.GetHomeRegion(), true
	case *apiaryv1.DropClaimRequest:
		return m.GetHomeRegion(), true
	}
	return "", false
}

// checkPeerRegion refuses a FailoverService request whose acting region
// is not the region certificate's.
func checkPeerRegion(id pki.Identity, req any) *denial {
	got, ok := actingRegion(req)
	if !ok {
		return refuse(ReasonOtherRegion, "region certificate of region %s: the request names no region to check", id.Region)
	}
	if got == id.Region {
		return nil
	}
	if !plainID.MatchString(got) {
		got = fmt.Sprintf("%q", got)
	}
	return refuse(ReasonOtherRegion, "a region certificate of region %s cannot act for region %s", id.Region, got)
}

// nodeIDer is every AgentService request message (node_id field).
type nodeIDer interface{ GetNodeId() string }

// plainID is what a node id is printed bare as; anything else is quoted.
var plainID = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

// checkNode refuses an agent request whose node_id is not id's.
func checkNode(id pki.Identity, req any) *denial {
	n, ok := req.(nodeIDer)
	if !ok {
		return refuse(ReasonNodeMismatch, "agent certificate of node %s: the request carries no node_id to check", id.ID)
	}
	got := n.GetNodeId()
	if got == id.ID {
		return nil
	}
	if !plainID.MatchString(got) {
		got = fmt.Sprintf("%q", got)
	}
	return refuse(ReasonNodeMismatch, "agent certificate of node %s cannot act for node %s", id.ID, got)
}

// enforcer is a Policy with its logger and counter, shared by the calls
// of one interceptor.
type enforcer struct {
	p       Policy
	invalid error // p.Validate(), once
	log     *slog.Logger
	denials *prometheus.CounterVec // nil: no metrics
}

func (p Policy) enforcer() *enforcer {
	e := &enforcer{p: p, invalid: p.Validate(), log: p.Logger}
	if e.log == nil {
		e.log = slog.Default()
	}
	if e.invalid != nil {
		e.log.Error("authz: invalid server policy: every call will be refused", "err", e.invalid)
	}
	if p.Registerer != nil {
		cv := prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricDenials,
			Help: "gRPC calls refused by the authorization gate, by service (gRPC service full name, unknown for a method without a rule) and reason (no_certificate, bad_identity, wrong_role, other_region, node_mismatch, unknown_method, misconfigured)."},
			[]string{"service", "reason"})
		cv, err := telemetry.RegisterCounterVec(p.Registerer, cv)
		if err != nil {
			e.log.Warn("authz: denial counter not registered; denials are logged only", "metric", MetricDenials, "err", err)
			cv = nil
		}
		e.denials = cv
	}
	return e
}

// deny logs and counts d, and returns its status error.
func (e *enforcer) deny(ctx context.Context, fullMethod string, id pki.Identity, hasID bool, d *denial) error {
	service := "unknown"
	if r, ok := methods[fullMethod]; ok {
		service = r.service
	}
	who := "none"
	if hasID {
		who = id.String()
	}
	addr := "unknown"
	if pr, ok := peer.FromContext(ctx); ok && pr.Addr != nil {
		addr = pr.Addr.String()
	}
	e.log.WarnContext(ctx, "authz: call refused", "method", fullMethod, "identity", who, "peer", addr,
		"code", d.code.String(), "reason", d.reason, "why", d.msg)
	if e.denials != nil {
		e.denials.WithLabelValues(service, d.reason).Inc()
	}
	return d.err()
}

// nodeBoundStream checks every message an AgentService stream receives.
type nodeBoundStream struct {
	grpc.ServerStream
	ctx    context.Context
	cancel context.CancelFunc
	e      *enforcer
	id     pki.Identity
	method string

	mu      sync.Mutex
	checked bool  // a received message passed the check
	denied  error // the denial that ended the stream
}

func (s *nodeBoundStream) Context() context.Context { return s.ctx }

func (s *nodeBoundStream) denial() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.denied
}

func (s *nodeBoundStream) RecvMsg(m any) error {
	if err := s.denial(); err != nil {
		return err
	}
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if d := checkNode(s.id, m); d != nil {
		err := s.e.deny(s.ctx, s.method, s.id, true, d)
		s.mu.Lock()
		if s.denied == nil {
			s.denied = err
		}
		err = s.denied
		s.mu.Unlock()
		s.cancel()
		return err
	}
	s.mu.Lock()
	s.checked = true
	s.mu.Unlock()
	return nil
}

func (s *nodeBoundStream) SendMsg(m any) error {
	s.mu.Lock()
	denied, checked := s.denied, s.checked
	s.mu.Unlock()
	if denied != nil {
		return denied
	}
	if !checked {
		return status.Errorf(codes.Internal, "authz: %s sent before receiving a request whose node_id could be checked", s.method)
	}
	return s.ServerStream.SendMsg(m)
}
