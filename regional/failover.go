package regional

import (
	"github.com/hashicorp/serf/serf"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"apiary.dev/apiary/internal/pki"
	"apiary.dev/apiary/regional/failover"
	"apiary.dev/apiary/regional/store"
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
		Dial:  c.dialRegion,
		Retry: c.txnRetry,
		Log:   c.log.With("component", "failover")})
}

// dialRegion connects to a coordinator of another region (mTLS with this
// coordinator's certificate when TLS is on, verifying the peer as a
// coordinator of that region).
func (c *Coordinator) dialRegion(region, addr string) (*grpc.ClientConn, error) {
	opt := grpc.WithTransportCredentials(insecure.NewCredentials())
	if c.cfg.TLS != nil {
		opt = pki.DialOption(c.cfg.TLS, pki.RegionServerName(region))
	}
	return grpc.NewClient(addr, opt)
}

// holdJob is the scheduling loop's Hold: a failover job waits until its
// standbys said whether it moved.
func (c *Coordinator) holdJob(rec *store.JobRecord) bool {
	return c.fo != nil && c.fo.Hold(rec)
}

// abandonStandby tells a job's standbys to drop the record of a submission
// that was not committed here (best effort, in the background: a record
// left behind is dropped by nothing else, so this is logged).
func (c *Coordinator) abandonStandby(rec *store.JobRecord) {
	if c.fo == nil || rec == nil || rec.Failover == nil || len(rec.Failover.Standbys) == 0 {
		return
	}
	go c.fo.Abandon(rec.ID, rec.Failover.Standbys)
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
