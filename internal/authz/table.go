package authz

import (
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

// access is the rule a method falls under; Policy.decide spells out what
// each one admits on a region server and on the router.
type access int

const (
	// accessAgent: AgentService. On a region server, an agent certificate
	// of the server's region whose id is the request's node_id; refused on
	// the router.
	accessAgent access = iota + 1
	// accessAPI: JobService and AdminService as users call them. On a
	// region server: clients (unscoped, or scoped to this region), routers
	// and the coordinators of this region. On the router: clients.
	accessAPI
	// accessRouterOnly: calls only a router makes on a region
	// (ForwardRequest, LookupRequest: they write and read the region's
	// cross-region idempotency records). Refused on the router, which does
	// not serve them.
	accessRouterOnly
	// accessAnyone: grpc health; any verified identity.
	accessAnyone
	// accessPeerRegion: FailoverService, which one region's coordinators
	// call on another's. On a region server: region certificates of
	// another region only, acting for their own region (the request's
	// home_region or standby_region must be the certificate's region,
	// checkPeerRegion). Refused on the router, which does not serve it.
	accessPeerRegion
)

// rule is one method's entry.
type rule struct {
	// service is the gRPC service's full name (the metric's service label)
	// and short its last element, as messages name it ("JobService").
	service, short string
	access         access
}

const (
	jobService    = "apiary.v1.JobService"
	agentService  = "apiary.v1.AgentService"
	adminService  = "apiary.v1.AdminService"
	healthService = "grpc.health.v1.Health"
	aclService    = "apiary.v1.ACLService"
	failService   = "apiary.v1.FailoverService"
)

func job(a access) rule   { return rule{service: jobService, short: "JobService", access: a} }
func admin(a access) rule { return rule{service: adminService, short: "AdminService", access: a} }
func agent() rule         { return rule{service: agentService, short: "AgentService", access: accessAgent} }
func acl() rule           { return rule{service: aclService, short: "ACLService", access: accessAPI} }
func health() rule        { return rule{service: healthService, short: "Health", access: accessAnyone} }
func failover() rule {
	return rule{service: failService, short: "FailoverService", access: accessPeerRegion}
}

// methods is the table: every method a server of ours may serve, by full
// method name ("/apiary.v1.JobService/SubmitJob"). Adding an RPC to the
// proto fails TestEveryMethodHasARule until it is added here, with the
// rule chosen on purpose.
var methods = map[string]rule{
	apiaryv1.JobService_SubmitJob_FullMethodName:      job(accessAPI),
	apiaryv1.JobService_GetJob_FullMethodName:         job(accessAPI),
	apiaryv1.JobService_ListJobs_FullMethodName:       job(accessAPI),
	apiaryv1.JobService_CancelJob_FullMethodName:      job(accessAPI),
	apiaryv1.JobService_WatchJob_FullMethodName:       job(accessAPI),
	apiaryv1.JobService_GetJobLogs_FullMethodName:     job(accessAPI),
	apiaryv1.JobService_GetJobTrace_FullMethodName:    job(accessAPI), // also coordinator -> peer coordinator (local_only)
	apiaryv1.JobService_ForwardRequest_FullMethodName: job(accessRouterOnly),
	apiaryv1.JobService_LookupRequest_FullMethodName:  job(accessRouterOnly),

	apiaryv1.AgentService_RegisterNode_FullMethodName:      agent(),
	apiaryv1.AgentService_Heartbeat_FullMethodName:         agent(),
	apiaryv1.AgentService_StreamAssignments_FullMethodName: agent(),
	apiaryv1.AgentService_ReportTaskStatus_FullMethodName:  agent(),
	apiaryv1.AgentService_AdoptAttempts_FullMethodName:     agent(),
	apiaryv1.AgentService_DrainSelf_FullMethodName:         agent(),
	apiaryv1.AgentService_Deregister_FullMethodName:        agent(),
	apiaryv1.AgentService_ExportSpans_FullMethodName:       agent(),

	apiaryv1.AdminService_ListNodes_FullMethodName:          admin(accessAPI),
	apiaryv1.AdminService_GetRegionInfo_FullMethodName:      admin(accessAPI),
	apiaryv1.AdminService_ListShards_FullMethodName:         admin(accessAPI),
	apiaryv1.AdminService_ListRegions_FullMethodName:        admin(accessAPI), // also router -> region (peer view)
	apiaryv1.AdminService_QuarantineNode_FullMethodName:     admin(accessAPI),
	apiaryv1.AdminService_ReleaseNode_FullMethodName:        admin(accessAPI),
	apiaryv1.AdminService_DrainNode_FullMethodName:          admin(accessAPI),
	apiaryv1.AdminService_SetNodeEligibility_FullMethodName: admin(accessAPI),
	// Gossip keyring (apiary keyring): the gate admits it as the API; the
	// coordinator's handler (regional/keyring.go) then admits client
	// certificates only (an operator), and the router does not serve it.
	apiaryv1.AdminService_GossipKeyring_FullMethodName: admin(accessAPI),
	// etcd snapshot (apiary region snapshot save): admitted as the API;
	// with ACLs the coordinator's ACL layer then requires a management
	// token (regional/acl.go), and the router does not serve it.
	apiaryv1.AdminService_SaveSnapshot_FullMethodName: admin(accessAPI),

	// ACL tokens and policies: the gate admits users' certificates as for
	// the API (and routers, which fan ACL writes out to every region); the
	// ACL layer (internal/acl) then requires a management token for all
	// but BootstrapACL and GetACLSelf.
	apiaryv1.ACLService_BootstrapACL_FullMethodName:    acl(),
	apiaryv1.ACLService_CreateACLToken_FullMethodName:  acl(),
	apiaryv1.ACLService_ListACLTokens_FullMethodName:   acl(),
	apiaryv1.ACLService_RevokeACLToken_FullMethodName:  acl(),
	apiaryv1.ACLService_GetACLSelf_FullMethodName:      acl(),
	apiaryv1.ACLService_ApplyACLPolicy_FullMethodName:  acl(),
	apiaryv1.ACLService_ListACLPolicies_FullMethodName: acl(),
	apiaryv1.ACLService_DeleteACLPolicy_FullMethodName: acl(),

	// Failover of accepted jobs: coordinators of one region call those of
	// another (regional/failover), each for its own region.
	apiaryv1.FailoverService_PutStandby_FullMethodName:   failover(),
	apiaryv1.FailoverService_PushProgress_FullMethodName: failover(),
	apiaryv1.FailoverService_MovedJobs_FullMethodName:    failover(),
	apiaryv1.FailoverService_ClaimJob_FullMethodName:     failover(),
	apiaryv1.FailoverService_ReleaseJob_FullMethodName:   failover(),
	apiaryv1.FailoverService_DropClaim_FullMethodName:    failover(),

	healthpb.Health_Check_FullMethodName: health(),
	healthpb.Health_Watch_FullMethodName: health(),
	healthpb.Health_List_FullMethodName:  health(),
}
