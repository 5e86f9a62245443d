package regional

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/serf/serf"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/pki"
	"apiary.dev/apiary/regional/failover"
	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/regional/taskstate"
)

// newFailover builds the coordinator's failover manager (regional/failover)
// once the region's meta is known.
func (c *Coordinator) newFailover() *failover.Manager {
	return failover.New(failover.Config{Meta: c.meta, CoordID: c.cfg.ID, Policy: c.cfg.Policy,
		DefaultAfter: c.cfg.FailoverAfter, Peers: c.cfg.FailoverPeers, Client: c.cli,
		Serf: func() *serf.Serf {
			c.wan.mu.Lock()
			defer c.wan.mu.Unlock()
			return c.wan.serf
		},
		Lease: func() clientv3.LeaseID {
			c.sessions.mu.Lock()
			defer c.sessions.mu.Unlock()
			if c.sessions.s == nil {
				return clientv3.NoLease
			}
			return c.sessions.s.Lease()
		},
		MayRun: c.mayRun,
		Dial:   c.dialRegion,
		Retry:  c.txnRetry,
		Log:    c.log.With("component", "failover")})
}

// dialRegion connects to a coordinator of another region (mTLS with this
// coordinator's certificate when TLS is on, verifying the peer as a
// coordinator of that region).
//
// Reconnects back off to at most 1 s, not gRPC's default 120 s: the
// failover manager probes other regions through these connections, and a
// region back from a long outage must be seen up within a probe round or
// two, not after minutes (its failover jobs are held until it is).
func (c *Coordinator) dialRegion(region, addr string) (*grpc.ClientConn, error) {
	opt := grpc.WithTransportCredentials(insecure.NewCredentials())
	if c.cfg.TLS != nil {
		opt = pki.DialOption(c.cfg.TLS, pki.RegionServerName(region))
	}
	return grpc.NewClient(addr, opt, grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
		MinConnectTimeout: time.Second}))
}

// holdJob is the scheduling loop's Hold: a failover job waits until its
// standbys said whether it moved.
func (c *Coordinator) holdJob(rec *store.JobRecord) bool {
	return c.fo != nil && c.fo.Hold(rec)
}

// explainHeld says in a job's failover status why the region holds it
// (failover.held), for a job not ended nor cancelled.
func (c *Coordinator) explainHeld(j *apiaryv1.Job, rec *store.JobRecord) {
	if c.fo == nil || j.GetFailover() == nil || rec.CancelRequested || terminalJob(j.GetState()) {
		return
	}
	j.Failover.Held = c.fo.HoldReason(rec)
}

// abandonStandby abandons a failover submission that was not committed
// here (its pending record, revision pendingRev, from failover.Begin): in
// the background, the pending record is marked abandoned unless the job
// exists (an error from the commit may hide a commit), and the standbys are
// told to drop their records; the failover leader retries what they did not
// take (regional/failover/pending.go), so a record left behind never runs
// as a second job. winner is the job a concurrent repeat of the same
// request made ("": none): the dropped record may have held the standbys'
// dedup key of that request, so the winner's standby record is written
// again, which puts the key back, but only while the winner is unfinished
// (a standby refuses the record of a job whose end it was told, and drops
// one whose end comes later).
func (c *Coordinator) abandonStandby(rec *store.JobRecord, pendingRev int64, winner, why string) {
	if c.fo == nil || rec == nil || pendingRev == 0 {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := c.fo.Abandon(ctx, rec.ID, rec.Shard, pendingRev, why); err != nil {
			c.log.Warn("failover: could not abandon an uncommitted submission now; the failover leader retries", "job", rec.ID, "err", err)
		}
		if winner == "" || winner == rec.ID {
			return
		}
		v, err := c.readJob(ctx, winner, false)
		if err != nil || v.rec.Failover == nil || len(v.rec.Failover.Standbys) == 0 || jobFinished(v) {
			if err != nil && status.Code(err) != codes.NotFound {
				c.log.Warn("failover: could not restore the standbys' dedup key of a repeated request", "job", winner, "err", err)
			}
			return
		}
		if _, err = c.fo.Replicate(ctx, &v.rec); err != nil {
			c.log.Warn("failover: could not restore the standbys' dedup key of a repeated request", "job", winner, "err", err)
			return
		}
		if v, err = c.readJob(ctx, winner, false); err != nil || jobFinished(v) {
			// Ended (or gone) meanwhile: its end may have reached the
			// standbys before the record did.
			c.fo.TellEnded(winner, standbysOf(v, rec))
		}
	}()
}

// jobFinished reports whether every task of a job is terminal, or the job
// moved or is to be cancelled: its standby records are no longer needed.
func jobFinished(v *jobView) bool {
	if v.rec.Moved() || v.rec.CancelRequested {
		return true
	}
	for _, t := range v.tasks {
		if !taskstate.Terminal(t.State) {
			return false
		}
	}
	return len(v.tasks) > 0
}

func standbysOf(v *jobView, rec *store.JobRecord) []string {
	if v != nil && v.rec.Failover != nil {
		return v.rec.Failover.Standbys
	}
	return rec.Failover.Standbys
}

// movedTo is the region (and epoch) a job moved to, from its record or, when
// the record here is older than the mark, from the failover manager ("" if
// it did not move).
func (c *Coordinator) movedTo(rec *store.JobRecord) (string, int64) {
	if rec.Moved() {
		return rec.Failover.MovedTo, rec.Failover.MovedEpoch
	}
	if c.fo != nil && rec.Failover != nil {
		return c.fo.MovedTo(rec.ID)
	}
	return "", 0
}

// failoverWarnings tell the submitter, at once, that an accepted failover
// job cannot move (and why: a typo in failover.regions, a standby that is
// down now, the policy), or that some of its standbys did not take it.
// Standbys are chosen once, at submission.
func (c *Coordinator) failoverWarnings(spec *apiaryv1.JobSpec, fo *store.FailoverRecord) []string {
	if fo == nil {
		return nil
	}
	var out []string
	known := map[string]bool{}
	if c.fo != nil {
		for _, r := range c.fo.Regions() {
			known[r.Name] = true
		}
	}
	for i, r := range spec.GetFailover().GetRegions() {
		if r == c.meta.Region {
			out = append(out, fmt.Sprintf("failover.regions[%d]: %s is the job's home region, which cannot stand by for itself", i, r))
		} else if len(known) > 0 && !known[r] {
			out = append(out, fmt.Sprintf("failover.regions[%d]: %s is no region of the federation (known: %s)", i, r, strings.Join(slices.Sorted(maps.Keys(known)), ", ")))
		}
	}
	if fo.NotEligible != "" {
		out = append(out, "failover: this job will not fail over (standbys are chosen at submission): "+fo.NotEligible)
	} else if want := spec.GetFailover().GetRegions(); len(want) > 0 && len(fo.Standbys) < min(len(want), failover.MaxStandbys) {
		out = append(out, fmt.Sprintf("failover: standing by in %s only, of %v", strings.Join(fo.Standbys, ", "), want))
	}
	return out
}
