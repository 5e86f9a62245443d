package shards

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Term is one coordinator's ownership of every shard of the region, won by an
// etcd election (concurrency.Election: the oldest key under the prefix wins).
// Epoch is the CreateRevision of the owner key; every write the owner makes is
// fenced by comparing it (see Fence). A term ends when its lease is gone.
type Term struct {
	// Epoch is the fencing epoch: the owner key's CreateRevision.
	Epoch int64
	// Key is the owner key, under <prefix>/.
	Key string
	// LeaseID is the owner's session lease.
	LeaseID clientv3.LeaseID
	session *concurrency.Session
	elec    *concurrency.Election
}

// Fence returns the compare every owner write carries: the owner key still
// exists with the same CreateRevision. After the lease expires or is revoked
// (a peer took over on suspicion), the compare fails and the write is refused.
func (t *Term) Fence() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(t.Key), "=", t.Epoch)
}

// Done is closed when the term's lease is gone (expired, revoked, or closed).
func (t *Term) Done() <-chan struct{} { return t.session.Done() }

// Resign gives ownership up (graceful hand-over) and ends the session.
func (t *Term) Resign(ctx context.Context) error {
	err := t.elec.Resign(ctx)
	if cerr := t.session.Close(); err == nil {
		err = cerr
	}
	return err
}

// Elector campaigns for region-wide shard ownership.
type Elector struct {
	cli    *clientv3.Client
	prefix string
	value  string
	ttl    int
}

// NewElector returns an elector campaigning under prefix (e.g.
// "/apiary/shards/owner") with value (the coordinator's identity) and a
// session lease of ttlSeconds (etcd grants no less than ceil(1.5 x election
// timeout)).
func NewElector(cli *clientv3.Client, prefix, value string, ttlSeconds int) *Elector {
	return &Elector{cli: cli, prefix: prefix, value: value, ttl: ttlSeconds}
}

// Campaign blocks until this coordinator owns the shards or ctx ends. Each
// call uses a fresh lease, so a new term always has a new, higher epoch.
func (e *Elector) Campaign(ctx context.Context) (*Term, error) {
	s, err := concurrency.NewSession(e.cli, concurrency.WithTTL(e.ttl), concurrency.WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("shards: new session: %w", err)
	}
	el := concurrency.NewElection(s, e.prefix)
	if err := el.Campaign(ctx, e.value); err != nil {
		s.Orphan()
		_ = s.Close()
		return nil, fmt.Errorf("shards: campaign: %w", err)
	}
	// Election.Campaign returns once every older key is gone without
	// checking that its own still exists: if the session's lease expired
	// while it waited (a paused process), it "wins" with a deleted key.
	// Such a term could write nothing (its fence fails), but it would claim
	// ownership until it noticed the lease was gone; refuse it here.
	resp, err := e.cli.Get(ctx, e.prefix+"/", clientv3.WithFirstCreate()...)
	if err != nil || len(resp.Kvs) == 0 || string(resp.Kvs[0].Key) != el.Key() || resp.Kvs[0].CreateRevision != el.Rev() {
		s.Orphan()
		_ = s.Close()
		if err != nil {
			return nil, fmt.Errorf("shards: campaign: check own key: %w", err)
		}
		return nil, ErrLostWhileWaiting
	}
	return &Term{Epoch: el.Rev(), Key: el.Key(), LeaseID: s.Lease(), session: s, elec: el}, nil
}

// ErrLostWhileWaiting is returned by Campaign when the campaign's own key
// was deleted (its lease expired or was revoked) before the older keys were:
// the caller should campaign again.
var ErrLostWhileWaiting = errors.New("shards: campaign: own key lost while waiting for the older ones")

// Owner describes the current owner of the shards.
type Owner struct {
	Key     string
	Value   string
	Epoch   int64
	LeaseID clientv3.LeaseID
}

// ErrNoOwner is returned by CurrentOwner when no coordinator owns the shards.
var ErrNoOwner = errors.New("shards: no owner")

// CurrentOwner reads the current owner (the oldest key under prefix).
func CurrentOwner(ctx context.Context, cli *clientv3.Client, prefix string) (Owner, error) {
	resp, err := cli.Get(ctx, prefix+"/", clientv3.WithFirstCreate()...)
	if err != nil {
		return Owner{}, err
	}
	if len(resp.Kvs) == 0 {
		return Owner{}, ErrNoOwner
	}
	kv := resp.Kvs[0]
	return Owner{Key: string(kv.Key), Value: string(kv.Value), Epoch: kv.CreateRevision, LeaseID: clientv3.LeaseID(kv.Lease)}, nil
}

// Depose revokes the lease of a suspected-dead owner, so that the next
// candidate wins at once instead of waiting out the lease TTL. Fencing makes a
// wrong suspicion harmless: the deposed owner's next write fails its compare.
func Depose(ctx context.Context, cli *clientv3.Client, o Owner) error {
	if o.LeaseID == clientv3.NoLease {
		return nil
	}
	_, err := cli.Revoke(ctx, o.LeaseID)
	return err
}
