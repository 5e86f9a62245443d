package regional

import (
	"context"
	"errors"
	"net"
	"syscall"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// suspicionLoop lets the region take a dead coordinator's shards over on
// suspicion instead of waiting out its session lease. Every coordinator
// watches every peer in the member set, with two detectors, each catching
// what the other cannot (measured in loadtest/results/lan-*/summary.md):
//
//   - TCP probe (SuspectAfter >= 0): the peer's API port refuses
//     connections (ECONNREFUSED; a dial that times out does not count)
//     for SuspectAfter. A crashed process is seen in about
//     SuspectAfter + 100 ms, faster than serf; a paused one still accepts
//     connections (the kernel completes the handshake) and is never seen.
//   - LAN pool (with LANAddr): the peer's LAN member was declared failed
//     (lanCoordinatorFailed). serf sees a paused process as well as a dead
//     one (about 1 s), and a host that is gone rather than refusing.
//
// Either way the coordinator revokes the peer's session lease: its member
// key and every shard owner key go at one revision, and the survivors
// claim its shards by rendezvous order. Fencing makes a wrong suspicion
// harmless: the deposed coordinator's next write for a shard fails the
// shard's epoch compare, and it rejoins with a new session.
func (c *Coordinator) suspicionLoop(ctx context.Context) {
	met := c.lanMetrics()
	if c.cfg.SuspectAfter < 0 && c.cfg.LANAddr == "" {
		return
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	refusedSince := map[clientv3.LeaseID]time.Time{}
	deposed := map[clientv3.LeaseID]bool{}
	failed := map[clientv3.LeaseID]bool{} // a revoke failed (logged once)
	depose := func(id string, p memberPeer, via string, attrs ...any) {
		if err := c.revoke(ctx, p.lease); err != nil {
			// Kept suspected: the next tick tries again (no leader yet,
			// most likely: the dead peer hosted it).
			if ctx.Err() == nil && !failed[p.lease] {
				c.log.Warn("revoking an unreachable coordinator's lease failed; retrying", "peer", id, "lease", int64(p.lease), "via", via, "err", err)
			}
			failed[p.lease] = true
			return
		}
		deposed[p.lease] = true
		met.OwnerDepositions.WithLabelValues(via).Inc()
		what := "revoked an unreachable coordinator's lease; its shards move"
		if p.rec.APIOnly {
			what = "revoked an unreachable coordinator's lease (it owns no shards)"
		}
		c.log.Warn(what, append([]any{"peer", id, "lease", int64(p.lease), "via", via}, attrs...)...)
		delete(refusedSince, p.lease)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		peers := c.members.live()
		seen := map[clientv3.LeaseID]bool{}
		for id, p := range peers {
			if id == c.cfg.ID || p.lease == 0 || deposed[p.lease] {
				continue
			}
			seen[p.lease] = true
			if c.lanCoordinatorFailed(id) {
				depose(id, p, "lan_failed", "reason", "its LAN member was declared failed")
				continue
			}
			if c.cfg.SuspectAfter < 0 || p.rec.APIAddr == "" {
				continue
			}
			conn, derr := net.DialTimeout("tcp", p.rec.APIAddr, 100*time.Millisecond)
			if derr == nil {
				conn.Close()
				delete(refusedSince, p.lease)
				continue
			}
			if !refusedDial(derr) {
				// A timeout is no refusal: the prober or the peer's host is
				// starved (the 1M run's coordinators deposed each other so
				// on a saturated host, and each move reloaded a cache of a
				// million records), or the host is gone, which the LAN
				// detector sees. The clock neither starts nor resets.
				continue
			}
			since, ok := refusedSince[p.lease]
			if !ok {
				refusedSince[p.lease] = time.Now()
				continue
			}
			if time.Since(since) >= c.cfg.SuspectAfter {
				depose(id, p, "tcp_refused", "reason", "its API refused connections", "unreachable_for", time.Since(since).Round(time.Millisecond), "dial_err", derr)
			}
		}
		for l := range refusedSince {
			if !seen[l] {
				delete(refusedSince, l)
			}
		}
		live := peersByLease(peers)
		for l := range deposed {
			if !live[l] {
				delete(deposed, l)
			}
		}
		for l := range failed {
			if !live[l] || deposed[l] {
				delete(failed, l)
			}
		}
	}
}

// refusedDial reports whether a dial failed because nothing listens at the
// address (ECONNREFUSED: the host answered with a reset), the TCP
// detector's one sign of a dead process; a timeout, an unreachable
// network or any other error is not.
func refusedDial(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED)
}

func peersByLease(peers map[string]memberPeer) map[clientv3.LeaseID]bool {
	out := make(map[clientv3.LeaseID]bool, len(peers))
	for _, p := range peers {
		out[p.lease] = true
	}
	return out
}

// revoke revokes a lease with a short deadline per attempt (commitAttempts
// of commitAttemptTimeout, as txnRetry): a revoke sent while the dead
// coordinator still hosted the raft leader is lost with it, and one long
// deadline would wait it out (about 2 s in the bench, loadtest/results/
// shards-2026-12-02) instead of reaching the new leader as soon as it is
// elected (about 0.7 s). A lease already gone counts as revoked.
func (c *Coordinator) revoke(ctx context.Context, lease clientv3.LeaseID) error {
	var last error
	for i := 0; i < commitAttempts && ctx.Err() == nil; i++ {
		actx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), commitAttemptTimeout)
		_, err := c.cli.Revoke(actx, lease)
		cancel()
		if err == nil || errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return nil
		}
		last = err
	}
	return last
}
