// Package failover moves a region's accepted failover jobs to a standby
// region of their jurisdiction when the region is lost, fenced so that the
// lost region's late work never counts (docs/architecture.md, "Failover of
// accepted jobs"; issue 14).
//
// # What it owns
//
//   - The home side: which regions may stand by for a new job (Plan: the
//     routing decision of internal/federation.Eligible over the WAN pool,
//     narrowed by the job's failover.regions or the region's
//     --failover-peers), the synchronous write of the job's standby record
//     before the submission is acknowledged (Replicate), the asynchronous
//     push of completed tasks to the standbys (the progress loop), and, on
//     the way back, learning which jobs moved (the moved loop), and the
//     home's lease on its failover jobs: a job is dispatched only while some
//     standby saw the home up within after/2 (Hold); the pending record
//     of a submission between its standby writes and its commit, abandoned
//     and delivered to the standbys when the job never commits (Begin,
//     Abandon, the pending loop); and the release of a claim left behind
//     by a standby that never activated the job (release).
//   - The standby side: FailoverService (PutStandby, PushProgress,
//     MovedJobs, ClaimJob, ReleaseJob, DropClaim) over the /apiary/failover/ keys of
//     regional/store; the observation that a home region is down (the WAN
//     pool and direct gRPC health probes, written by every coordinator
//     under its session lease, so that no single observer decides); and the
//     activation of a standby job under a failover epoch above its home's,
//     in one Txn that can succeed once, after every other standby granted
//     it (ClaimJob; a region grants only when a majority of its
//     coordinators have seen the home down for after: the witness rule).
//
// # What it must not touch
//
// It imports nothing of package regional (internal/layering checks it) and
// writes no key of the scheduling loop's but a job and its tasks at
// activation (created, never rewritten: from then on the job is the
// region's like any other). Which coordinator is the region's failover
// leader is decided by the smallest live member id; every write it makes
// is guarded by compares, so two leaders for a moment do no harm.
package failover
