package telemetry

import "github.com/prometheus/client_golang/prometheus"

// LANMetrics are a coordinator's metrics of the region's serf LAN pool
// (regional/lan.go) and of its owner suspicion (regional/suspicion.go). The
// pool's member counts are RegionMetrics.SerfMembers with pool="lan".
type LANMetrics struct {
	// Suspicions counts members this coordinator's serf declared failed,
	// by role (agent, coordinator). A leave is not counted.
	Suspicions *prometheus.CounterVec
	// FastReclaims counts node epochs this coordinator ended on a LAN
	// suspicion, before their lease ran out, by reason (member_failed).
	FastReclaims *prometheus.CounterVec
	// FastReclaimSkips counts agent suspicions that ended no epoch, by
	// reason: epoch_changed (the tagged epoch is no longer the node's
	// current one: already ended, re-registered, or another coordinator
	// ended it first), unregistered (tagged epoch 0), mass_failure (too
	// many agents failed at once for this coordinator's view to be trusted;
	// the leases decide), error (etcd did not answer),
	// not_heartbeat_coordinator, heartbeats_arrive (a false suspicion) and
	// member_alive_again (serf refuted the failure during the veto).
	FastReclaimSkips *prometheus.CounterVec
	// OwnerDepositions counts shard owners this coordinator deposed on
	// suspicion, by what it saw: tcp_refused (the owner's API port refused
	// connections for --suspect-after), lan_failed (the owner's LAN member
	// was declared failed).
	OwnerDepositions *prometheus.CounterVec
}

// NewLANMetrics registers the LAN pool metrics on reg.
func NewLANMetrics(reg prometheus.Registerer) *LANMetrics {
	f := factory{reg}
	return &LANMetrics{
		Suspicions: f.counterVec("apiary_lan_suspicions_total",
			"LAN pool members this coordinator saw declared failed (not left), by role (agent, coordinator).", "role"),
		FastReclaims: f.counterVec("apiary_lan_fast_reclaims_total",
			"Node epochs this coordinator ended on a LAN suspicion before their lease expired, by reason (member_failed).", "reason"),
		FastReclaimSkips: f.counterVec("apiary_lan_fast_reclaim_skips_total",
			"Agent suspicions that ended no node epoch, by reason (epoch_changed, unregistered, mass_failure, error, not_heartbeat_coordinator, heartbeats_arrive, member_alive_again).", "reason"),
		OwnerDepositions: f.counterVec("apiary_owner_depositions_total",
			"Shard owners this coordinator deposed on suspicion, by what it saw (tcp_refused, lan_failed).", "via"),
	}
}
