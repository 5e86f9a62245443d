package regional

import (
	"context"
	"encoding/json"
	"net"
	"time"

	"apiary.dev/apiary/shards"
)

// suspicionLoop lets a follower take the shards over on suspicion instead of
// waiting out the owner's lease. Two detectors, each catching what the other
// cannot (measured in loadtest/results/lan-*/summary.md):
//
//   - TCP probe (SuspectAfter >= 0): the owner's API port refuses
//     connections for SuspectAfter. A crashed process is seen in about
//     SuspectAfter + 100 ms, faster than serf; a paused one still accepts
//     connections (the kernel completes the handshake) and is never seen.
//   - LAN pool (with LANAddr): the owner's LAN member was declared failed
//     (lanCoordinatorFailed). serf sees a paused process as well as a dead
//     one (about 1 s), and a host that is gone rather than refusing.
//
// Either way the follower revokes the owner's lease. Fencing makes a wrong
// suspicion harmless: the deposed owner's next write fails its epoch compare.
func (c *Coordinator) suspicionLoop(ctx context.Context) {
	met := c.lanMetrics()
	if c.cfg.SuspectAfter < 0 && c.cfg.LANAddr == "" {
		return
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var (
		suspect    shards.Owner
		since      time.Time
		lastAddr   = map[string]string{}
		lastDeposd int64
	)
	depose := func(owner shards.Owner, via string, attrs ...any) {
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
		err := shards.Depose(rctx, c.cli, owner)
		rcancel()
		if err == nil {
			lastDeposd = owner.Epoch
			met.OwnerDepositions.WithLabelValues(via).Inc()
			c.log.Warn("deposed unreachable shard owner", append([]any{"owner", owner.Value, "epoch", owner.Epoch, "via", via}, attrs...)...)
		}
		since = time.Time{}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if c.Owning() {
			since = time.Time{}
			continue
		}
		gctx, cancel := context.WithTimeout(ctx, time.Second)
		owner, err := shards.CurrentOwner(gctx, c.cli, prefOwner)
		if err == nil && owner.Value != c.cfg.ID && c.cfg.SuspectAfter >= 0 {
			if m, gerr := c.cli.Get(gctx, keyMember(owner.Value)); gerr == nil && len(m.Kvs) == 1 {
				var rec memberRecord
				if json.Unmarshal(m.Kvs[0].Value, &rec) == nil {
					lastAddr[owner.Value] = rec.APIAddr
				}
			}
		}
		cancel()
		if err != nil || owner.Value == c.cfg.ID || owner.Epoch == lastDeposd {
			since = time.Time{}
			continue
		}
		if c.lanCoordinatorFailed(owner.Value) {
			depose(owner, "lan_failed", "reason", "the owner's LAN member was declared failed")
			continue
		}
		if c.cfg.SuspectAfter < 0 {
			continue
		}
		addr := lastAddr[owner.Value]
		if addr == "" {
			continue
		}
		conn, derr := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if derr == nil {
			conn.Close()
			since = time.Time{}
			continue
		}
		if since.IsZero() || suspect.Epoch != owner.Epoch {
			suspect, since = owner, time.Now()
			continue
		}
		if time.Since(since) < c.cfg.SuspectAfter {
			continue
		}
		depose(owner, "tcp_refused", "reason", "the owner's API refused connections", "unreachable_for", time.Since(since).Round(time.Millisecond), "dial_err", derr)
	}
}
