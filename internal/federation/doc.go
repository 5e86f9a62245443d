// Package federation is the vocabulary the two tiers share about the serf WAN
// pool: the tag schema a regional coordinator publishes (region,
// jurisdiction, labels, API address, health, capacity and backlog summary,
// within serf's 512-byte budget), the tuned serf member configuration and
// join loop both tiers use, and the region view built from the pool's
// members (BuildRegions, Region.Summary), which the router's registry and a
// coordinator's `region list` both serve. It owns the one routing decision
// (Eligible: region selector, sovereignty policy, liveness, policy
// fingerprint, capacity), which the router applies to a new job and a home
// region applies to choose a failover job's standby regions, so a job can
// fail over only where it could have been routed. It also holds the gossip
// encryption both serf pools (WAN and the regions' LAN pools) use: keys
// (GenerateGossipKey, DecodeGossipKey) and keyrings kept in files
// (Gossip), which serf's KeyManager rotates.
//
// It is owned by neither tier: it must not import global/ or regional/
// (docs/architecture.md, "Layering"), and it holds no live state; the
// router's probing view is global/registry, the coordinator's member is
// regional/wan.go.
package federation
