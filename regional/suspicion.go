package regional

import (
	"context"
	"encoding/json"
	"net"
	"time"

	"apiary.dev/apiary/shards"
)

// suspicionLoop lets a follower take the shards over on suspicion instead of
// waiting out the owner's lease: when the owner's API port refuses
// connections for SuspectAfter (the process is gone; a paused process still
// accepts), the follower revokes the owner's lease. Fencing makes a wrong
// suspicion harmless: the deposed owner's next write fails its epoch compare.
func (c *Coordinator) suspicionLoop(ctx context.Context) {
	if c.cfg.SuspectAfter < 0 {
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
		if err == nil && owner.Value != c.cfg.ID {
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
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
		err = shards.Depose(rctx, c.cli, owner)
		rcancel()
		if err == nil {
			lastDeposd = owner.Epoch
			c.log.Warn("deposed unreachable shard owner", "owner", owner.Value, "epoch", owner.Epoch, "unreachable_for", time.Since(since).Round(time.Millisecond), "dial_err", derr)
		}
		since = time.Time{}
	}
}
