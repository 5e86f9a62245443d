package regional

// ACL enforcement (Config.ACL, `apiary region --acl`; Nomad's
// `acl { enabled = true }`): tokens and policies live in etcd under
// /apiary/acl/ (package regional/aclstore, with its watch cache); this file
// resolves each call's token in a gRPC interceptor chained after the mTLS
// authorization gate (internal/authz), decides what the method needs
// (aclMethods), and gives handlers aclCheck for the decisions that need
// the job's namespace. docs/security.md describes the rules.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/acl"
	"apiary.dev/apiary/internal/pki"
	"apiary.dev/apiary/internal/telemetry"
	"apiary.dev/apiary/regional/aclstore"
	"apiary.dev/apiary/regional/store"
)

// MetricACLDenials counts calls the ACL layer refused, by reason
// (acl.Reason*: no_token, unknown_token, expired_token, permission,
// join_token).
const MetricACLDenials = "apiary_acl_denials_total"

// aclNeed is what a method needs from the caller's token.
type aclNeed int

const (
	// needNothing: no token is read (AgentService, whose certificate is
	// its identity, RegisterNode's join token being checked in its
	// handler; health; BootstrapACL).
	needNothing aclNeed = iota + 1
	// needToken: any valid token; the handler checks the namespace
	// (JobService) or nothing more (GetACLSelf).
	needToken
	// needRouter: a router certificate without a token, or (without TLS,
	// where no certificate says who calls) a client or management token:
	// ForwardRequest and LookupRequest, the router's idempotency
	// bookkeeping.
	needRouter
	// needPeerRegion: a region certificate of another region, without a
	// token (FailoverService: the certificate gate, internal/authz, has
	// checked that it acts for its own region). Without TLS no caller has
	// that identity and a management token is needed: with ACLs on,
	// failover between regions needs mTLS.
	needPeerRegion
	needNodeRead
	needNodeWrite
	needOperator
	needManagement
)

// aclMethods is what every method of the region's API needs. A method
// missing here needs a management token (TestACLEveryMethodHasANeed walks
// the API).
var aclMethods = map[string]aclNeed{
	apiaryv1.JobService_SubmitJob_FullMethodName:      needToken,
	apiaryv1.JobService_GetJob_FullMethodName:         needToken,
	apiaryv1.JobService_ListJobs_FullMethodName:       needToken,
	apiaryv1.JobService_CancelJob_FullMethodName:      needToken,
	apiaryv1.JobService_WatchJob_FullMethodName:       needToken,
	apiaryv1.JobService_GetJobLogs_FullMethodName:     needToken,
	apiaryv1.JobService_GetJobTrace_FullMethodName:    needToken,
	apiaryv1.JobService_ForwardRequest_FullMethodName: needRouter,

	apiaryv1.FailoverService_PutStandby_FullMethodName:   needPeerRegion,
	apiaryv1.FailoverService_PushProgress_FullMethodName: needPeerRegion,
	apiaryv1.FailoverService_MovedJobs_FullMethodName:    needPeerRegion,
	apiaryv1.FailoverService_ClaimJob_FullMethodName:     needPeerRegion,
	apiaryv1.FailoverService_ReleaseJob_FullMethodName:   needPeerRegion,
	apiaryv1.FailoverService_DropClaim_FullMethodName:    needPeerRegion,

	apiaryv1.JobService_LookupRequest_FullMethodName: needRouter,

	apiaryv1.AgentService_RegisterNode_FullMethodName:      needNothing,
	apiaryv1.AgentService_Heartbeat_FullMethodName:         needNothing,
	apiaryv1.AgentService_StreamAssignments_FullMethodName: needNothing,
	apiaryv1.AgentService_ReportTaskStatus_FullMethodName:  needNothing,
	apiaryv1.AgentService_AdoptAttempts_FullMethodName:     needNothing,
	apiaryv1.AgentService_DrainSelf_FullMethodName:         needNothing,
	apiaryv1.AgentService_Deregister_FullMethodName:        needNothing,
	apiaryv1.AgentService_ExportSpans_FullMethodName:       needNothing,

	apiaryv1.AdminService_ListNodes_FullMethodName:          needNodeRead,
	apiaryv1.AdminService_GetRegionInfo_FullMethodName:      needNodeRead,
	apiaryv1.AdminService_ListShards_FullMethodName:         needNodeRead,
	apiaryv1.AdminService_ListRegions_FullMethodName:        needNodeRead, // a router's own call (acl.IsInternal): none
	apiaryv1.AdminService_QuarantineNode_FullMethodName:     needNodeWrite,
	apiaryv1.AdminService_ReleaseNode_FullMethodName:        needNodeWrite,
	apiaryv1.AdminService_DrainNode_FullMethodName:          needNodeWrite,
	apiaryv1.AdminService_SetNodeEligibility_FullMethodName: needNodeWrite,
	apiaryv1.AdminService_GossipKeyring_FullMethodName:      needOperator,
	// A snapshot holds all of the region's state (every job's spec and
	// environment, the ACL tokens' hashes, sealed secrets).
	apiaryv1.AdminService_SaveSnapshot_FullMethodName: needManagement,

	apiaryv1.ACLService_BootstrapACL_FullMethodName:    needNothing,
	apiaryv1.ACLService_GetACLSelf_FullMethodName:      needToken,
	apiaryv1.ACLService_CreateACLToken_FullMethodName:  needManagement,
	apiaryv1.ACLService_ListACLTokens_FullMethodName:   needManagement,
	apiaryv1.ACLService_RevokeACLToken_FullMethodName:  needManagement,
	apiaryv1.ACLService_ApplyACLPolicy_FullMethodName:  needManagement,
	apiaryv1.ACLService_ListACLPolicies_FullMethodName: needManagement,
	apiaryv1.ACLService_DeleteACLPolicy_FullMethodName: needManagement,

	healthpb.Health_Check_FullMethodName: needNothing,
	healthpb.Health_Watch_FullMethodName: needNothing,
	healthpb.Health_List_FullMethodName:  needNothing,
}

// peerACL is the ACL of a call from one of this region's own
// coordinators (a region certificate of the region: GetJobTrace's
// fan-out): management, as the certificate is root for the region anyway
// (docs/security.md).
var peerACL = acl.Compile(&apiaryv1.ACLToken{Type: acl.TypeManagement, Name: "region certificate"}, nil)

// endNodeOps ends a node's current epoch (deletes its alive key, as
// Deregister and the shard owner's node-loss path see it): what
// aclstore's RevokeToken puts in the Txn that revokes the node's join
// token.
func endNodeOps(nodeID string) []clientv3.Op {
	return []clientv3.Op{clientv3.OpDelete(store.KeyNodeAlive(nodeID))}
}

// aclDenialCounter registers apiary_acl_denials_total{reason} on reg (or
// reuses the one registered already).
func aclDenialCounter(reg prometheus.Registerer, log *slog.Logger) *prometheus.CounterVec {
	cv := prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricACLDenials,
		Help: "Calls refused by the region's ACL layer, by reason (no_token, unknown_token, expired_token, permission, join_token)."},
		[]string{"reason"})
	cv, err := telemetry.RegisterCounterVec(reg, cv)
	if err != nil {
		log.Warn("acl: denial counter not registered; denials are logged only", "metric", MetricACLDenials, "err", err)
		return nil
	}
	return cv
}

// startACL makes the ACL store and loads its cache (the "acl" part's
// start, after etcd, before the API serves).
func (c *Coordinator) startACL(ctx context.Context) error {
	s, err := aclstore.New(aclstore.Config{Client: c.cli, Region: c.cfg.Region, EndNodeOps: endNodeOps, Logger: c.log})
	if err != nil {
		return err
	}
	if err := s.Load(ctx); err != nil {
		return err
	}
	c.acls = s
	if c.cfg.TLS == nil {
		c.log.Warn("ACLs on without TLS (--insecure-dev): tokens and join tokens cross the network in plaintext, and no caller can prove it is this region's coordinator or a router")
	}
	return nil
}

// runACL keeps the cache current until ctx ends (the "acl" part's run).
func (c *Coordinator) runACL(ctx context.Context) error {
	c.acls.Run(ctx)
	return nil
}

// aclServer is the ACLService the API registers: the store's with ACLs
// on, one that refuses every call (FAILED_PRECONDITION naming --acl)
// without.
func (c *Coordinator) aclServer() apiaryv1.ACLServiceServer {
	if c.cfg.ACL {
		return aclstore.NewServer(c.acls)
	}
	return aclstore.Off{Region: c.cfg.Region}
}

// aclInterceptors are the ACL layer's server interceptors (nil with ACLs
// off).
func (c *Coordinator) aclInterceptors() (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	if !c.cfg.ACL {
		return nil, nil
	}
	unary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, err := c.aclAdmit(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
	stream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx, err := c.aclAdmit(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		if ctx == ss.Context() { // nothing added (AgentService streams)
			return handler(srv, ss)
		}
		return handler(srv, &aclStream{ServerStream: ss, ctx: ctx})
	}
	return unary, stream
}

// aclStream is a server stream whose context carries the caller's ACL.
type aclStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *aclStream) Context() context.Context { return s.ctx }

// aclAdmit decides what a call of fullMethod needs (aclMethods) and
// returns ctx with the caller's *acl.ACL (acl.NewContext), or the
// refusal, logged and counted:
//   - this region's own coordinators (region certificate): management;
//   - another region's coordinators (region certificate): FailoverService
//     only, without a token (without TLS, with ACLs on, no one passes:
//     failover between regions with ACLs needs mTLS);
//   - a router certificate: ForwardRequest and LookupRequest, and
//     ListRegions marked acl.IsInternal, pass without a token; anything
//     else is judged by the token it forwards;
//   - everyone else: the token must resolve (UNAUTHENTICATED saying to
//     set APIARY_TOKEN) and grant what the method needs
//     (PERMISSION_DENIED naming it).
func (c *Coordinator) aclAdmit(ctx context.Context, fullMethod string) (context.Context, error) {
	need, ok := aclMethods[fullMethod]
	if !ok {
		need = needManagement
	}
	if need == needNothing {
		return ctx, nil
	}
	id, idErr := pki.PeerIdentity(ctx)
	if idErr == nil {
		switch {
		case id.Role == pki.RoleRegion && id.Region == c.cfg.Region:
			return acl.NewContext(ctx, peerACL), nil
		case id.Role == pki.RoleRegion && need == needPeerRegion:
			return ctx, nil
		case id.Role == pki.RoleRouter && (need == needRouter ||
			(fullMethod == apiaryv1.AdminService_ListRegions_FullMethodName && acl.IsInternal(ctx))):
			return ctx, nil
		}
	}
	a, err := c.acls.Resolve(ctx, acl.FromIncoming(ctx))
	if err != nil {
		var d *aclstore.Denial
		if errors.As(err, &d) {
			return nil, c.aclDeny(ctx, fullMethod, d)
		}
		return nil, err
	}
	var what string
	switch need {
	case needToken:
	case needRouter:
		if t := a.Token().GetType(); t != acl.TypeClient && t != acl.TypeManagement {
			what = "a client or management token (or a router certificate)"
		}
	case needNodeRead:
		if !a.AllowNode(false) {
			what = `node "read"`
		}
	case needNodeWrite:
		if !a.AllowNode(true) {
			what = `node "write"`
		}
	case needOperator:
		if !a.AllowOperator() {
			what = "operator"
		}
	case needManagement, needPeerRegion:
		if !a.IsManagement() {
			what = "a management token"
		}
	}
	if what != "" {
		return nil, c.aclDeny(ctx, fullMethod, &aclstore.Denial{Code: codes.PermissionDenied, Reason: acl.ReasonPermission, Accessor: a.AccessorID(),
			Msg: fmt.Sprintf("permission denied: %s needs %s; ACL token %s (%s) has no policy granting it", shortMethod(fullMethod), what,
				a.AccessorID(), a.Token().GetType())})
	}
	return acl.NewContext(ctx, a), nil
}

// aclCheck is nil when ACLs are off or the caller's token (on ctx, put
// there by aclAdmit) has capability on namespace ns (""; the default);
// else the refusal, logged and counted: PERMISSION_DENIED naming the
// method, the capability and the namespace.
func (c *Coordinator) aclCheck(ctx context.Context, method, ns, capability string) error {
	if !c.cfg.ACL {
		return nil
	}
	a, _ := acl.FromContext(ctx)
	if a.AllowNamespace(ns, capability) {
		return nil
	}
	who := "this call carries no ACL token"
	if a != nil {
		who = fmt.Sprintf("ACL token %s (%s) has no policy granting it", a.AccessorID(), a.Token().GetType())
	}
	return c.aclDeny(ctx, method, &aclstore.Denial{Code: codes.PermissionDenied, Reason: acl.ReasonPermission, Accessor: a.AccessorID(),
		Msg: fmt.Sprintf("permission denied: %s needs capability %q on namespace %q; %s", shortMethod(method), capability, acl.OrDefault(ns), who)})
}

// aclAllowed reports whether the caller may use capability on ns (true
// with ACLs off); it neither logs nor counts (list filters).
func (c *Coordinator) aclAllowed(ctx context.Context, ns, capability string) bool {
	if !c.cfg.ACL {
		return true
	}
	a, _ := acl.FromContext(ctx)
	return a.AllowNamespace(ns, capability)
}

// aclManagement reports whether the caller holds a management token (or
// ACLs are off).
func (c *Coordinator) aclManagement(ctx context.Context) bool {
	if !c.cfg.ACL {
		return true
	}
	a, _ := acl.FromContext(ctx)
	return a.IsManagement()
}

// aclDeny logs d at WARN (method, the token's accessor id or "none", peer,
// code, reason, message; never a secret), counts it, and returns its
// status.
func (c *Coordinator) aclDeny(ctx context.Context, method string, d *aclstore.Denial) error {
	accessor := d.Accessor
	if accessor == "" {
		accessor = "none"
	}
	addr := "unknown"
	if pr, ok := peer.FromContext(ctx); ok && pr.Addr != nil {
		addr = pr.Addr.String()
	}
	c.log.WarnContext(ctx, "acl: call refused", "method", method, "accessor", accessor, "peer", addr,
		"code", d.Code.String(), "reason", d.Reason, "why", d.Msg)
	if c.aclDenials != nil {
		c.aclDenials.WithLabelValues(d.Reason).Inc()
	}
	return status.Error(d.Code, d.Msg)
}

// shortMethod is "JobService/GetJob" of "/apiary.v1.JobService/GetJob".
func shortMethod(m string) string {
	svc, meth, ok := strings.Cut(strings.TrimPrefix(m, "/"), "/")
	if !ok {
		return m
	}
	return svc[strings.LastIndexByte(svc, '.')+1:] + "/" + meth
}
