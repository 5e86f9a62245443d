package shards

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultPrefix is where the per-shard owner keys live in a region's etcd:
// <DefaultPrefix>/<s>/owner.
const DefaultPrefix = "/apiary/shards"

// shardDigits pads shard numbers in keys so that a range read returns the
// owner keys in shard order (the same padding as regional's job keys).
const shardDigits = 5

// Epoch is a shard's fencing epoch: the etcd CreateRevision of its owner key.
// Each claim creates the key anew, so a later owner always has a higher
// epoch; 0 means no owner. (The idea is etcd's concurrency.Election, whose
// leader key revision is a fencing token.)
type Epoch int64

// Layout names the owner keys of a region's shards.
type Layout struct {
	// Prefix is the key prefix without a trailing slash, e.g. DefaultPrefix.
	Prefix string
	// Count is the region's shard count (1..MaxCount, fixed at creation).
	Count int
}

// Validate checks the layout: the prefix starts with "/" and does not end
// with one, and the count is in 1..MaxCount.
func (l Layout) Validate() error {
	if !strings.HasPrefix(l.Prefix, "/") || strings.HasSuffix(l.Prefix, "/") {
		return fmt.Errorf("shards prefix: must start with / and not end with one, got %q", l.Prefix)
	}
	return Validate(l.Count)
}

// CheckShard returns an error naming the rule if s is not a shard of l.
func (l Layout) CheckShard(s int) error {
	if s < 0 || s >= l.Count {
		return fmt.Errorf("shard: must be in 0..%d, got %d", l.Count-1, s)
	}
	return nil
}

// OwnerKey is shard s's owner key, <Prefix>/<s, 5 digits>/owner. Its value
// is the owning member's id; it lives under that member's lease.
func (l Layout) OwnerKey(s int) string {
	return fmt.Sprintf("%s/%0*d/owner", l.Prefix, shardDigits, s)
}

// ShardOf parses an owner key back to its shard; ok is false for any other
// key (including today's election keys under <Prefix>/owner/).
func (l Layout) ShardOf(key string) (s int, ok bool) {
	rest, ok := strings.CutPrefix(key, l.Prefix+"/")
	if !ok {
		return 0, false
	}
	num, ok := strings.CutSuffix(rest, "/owner")
	if !ok || len(num) != shardDigits {
		return 0, false
	}
	s, err := strconv.Atoi(num)
	if err != nil || s < 0 || s >= l.Count {
		return 0, false
	}
	return s, true
}

// watchPrefix covers every owner key (and nothing outside Prefix).
func (l Layout) watchPrefix() string { return l.Prefix + "/" }

// Fence is the compare every write for shard s carries: its owner key still
// exists with CreateRevision e. Once the owner released the shard, or its
// lease expired or was revoked (a peer took over on suspicion), the compare
// fails and the write is refused: the writer must drop the shard.
func (l Layout) Fence(s int, e Epoch) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(l.OwnerKey(s)), "=", int64(e))
}

// ErrOwned is matched (errors.Is) by the *OwnedError Claim returns when
// another member, or another lease of this member, owns the shard.
var ErrOwned = errors.New("shard owned by another")

// OwnedError says who owns the shard a Claim found taken.
type OwnedError struct {
	Shard  int
	Member string
	Epoch  Epoch
	Lease  clientv3.LeaseID
}

func (e *OwnedError) Error() string {
	return fmt.Sprintf("shard %d: owned by %s (epoch %d, lease %x)", e.Shard, e.Member, e.Epoch, int64(e.Lease))
}

// Is makes errors.Is(err, ErrOwned) true.
func (e *OwnedError) Is(target error) bool { return target == ErrOwned }

// ErrNotOwner is returned by Release when the shard's owner key is not the
// one of that epoch any more (released already, lapsed, or revoked): there is
// nothing left to release.
var ErrNotOwner = errors.New("shard not owned at that epoch")

// ErrLeaseGone is returned when the claimer's lease no longer exists
// (expired or revoked): every shard it held is gone with it, and the member
// must start again with a new lease.
var ErrLeaseGone = errors.New("shards: lease gone")

// Claimer claims and releases shards for one member under one lease.
type Claimer struct {
	cli    *clientv3.Client
	layout Layout
	id     string
	lease  clientv3.LeaseID
}

// NewClaimer returns a claimer for member id under lease (the coordinator's
// session lease, the one its member key lives under, so that losing it drops
// the member and all its shards at one revision). Errors name the field:
// client, layout (Validate), id (non-empty, no "/"), lease (not NoLease).
func NewClaimer(cli *clientv3.Client, l Layout, id string, lease clientv3.LeaseID) (*Claimer, error) {
	switch {
	case cli == nil:
		return nil, errors.New("client: must not be nil")
	case id == "" || strings.Contains(id, "/"):
		return nil, fmt.Errorf("id: must be non-empty without /, got %q", id)
	case lease == clientv3.NoLease:
		return nil, errors.New("lease: must be a granted lease, got none")
	}
	if err := l.Validate(); err != nil {
		return nil, err
	}
	return &Claimer{cli: cli, layout: l, id: id, lease: lease}, nil
}

// Layout is the claimer's key layout.
func (c *Claimer) Layout() Layout { return c.layout }

// Claim takes shard s if nobody owns it: one Txn that creates the owner key
// (value = member id, under the claimer's lease) only if absent
// (CreateRevision == 0). It returns the new epoch. If this claimer's lease
// already holds the key (a retried claim whose first try committed), it
// returns that key's epoch. Errors: *OwnedError (errors.Is ErrOwned) when
// another lease holds it; ErrLeaseGone when the lease is gone; the shard
// range; etcd errors otherwise (the claim may or may not have committed:
// call Claim again).
func (c *Claimer) Claim(ctx context.Context, s int) (Epoch, error) {
	if err := c.layout.CheckShard(s); err != nil {
		return 0, err
	}
	key := c.layout.OwnerKey(s)
	resp, err := c.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, c.id, clientv3.WithLease(c.lease))).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return 0, fmt.Errorf("claim shard %d: %w", s, ErrLeaseGone)
		}
		return 0, fmt.Errorf("claim shard %d: %w", s, err)
	}
	if resp.Succeeded {
		return Epoch(resp.Header.Revision), nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 { // deleted between compare and get: impossible in one Txn
		return 0, fmt.Errorf("claim shard %d: owner key vanished inside a txn", s)
	}
	kv := kvs[0]
	if clientv3.LeaseID(kv.Lease) == c.lease && string(kv.Value) == c.id {
		return Epoch(kv.CreateRevision), nil
	}
	return 0, &OwnedError{Shard: s, Member: string(kv.Value), Epoch: Epoch(kv.CreateRevision), Lease: clientv3.LeaseID(kv.Lease)}
}

// MaxClaimBatch is the most shards ClaimMany claims in one Txn (etcd's
// default --max-txn-ops is 128; each shard costs one nested Txn).
const MaxClaimBatch = 64

// ClaimMany claims each of ss as Claim does, in one Txn of nested Txns (one
// per shard, at most MaxClaimBatch shards), so that taking a dead member's
// hundred shards costs one commit rather than a hundred. It returns the
// epochs of the shards claimed (all claimed in one Txn share its revision:
// an epoch is per shard key, so that is fine) and an *OwnedError per shard
// that another lease holds. Errors: ErrLeaseGone; a shard out of range or
// too many shards (nothing is claimed); etcd errors (the claims may or may
// not have committed: call again, a retry finds its own keys).
func (c *Claimer) ClaimMany(ctx context.Context, ss []int) (claimed map[int]Epoch, owned map[int]error, err error) {
	if len(ss) > MaxClaimBatch {
		return nil, nil, fmt.Errorf("claim: at most %d shards per call, got %d", MaxClaimBatch, len(ss))
	}
	ops := make([]clientv3.Op, 0, len(ss))
	for _, s := range ss {
		if err := c.layout.CheckShard(s); err != nil {
			return nil, nil, err
		}
		key := c.layout.OwnerKey(s)
		ops = append(ops, clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)},
			[]clientv3.Op{clientv3.OpPut(key, c.id, clientv3.WithLease(c.lease))}, []clientv3.Op{clientv3.OpGet(key)}))
	}
	resp, err := c.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return nil, nil, fmt.Errorf("claim %d shards: %w", len(ss), ErrLeaseGone)
		}
		return nil, nil, fmt.Errorf("claim %d shards: %w", len(ss), err)
	}
	claimed, owned = map[int]Epoch{}, map[int]error{}
	for i, r := range resp.Responses {
		s, tr := ss[i], r.GetResponseTxn()
		if tr.GetSucceeded() {
			claimed[s] = Epoch(resp.Header.Revision)
			continue
		}
		kvs := tr.GetResponses()[0].GetResponseRange().GetKvs()
		if len(kvs) == 0 {
			return nil, nil, fmt.Errorf("claim shard %d: owner key vanished inside a txn", s)
		}
		kv := kvs[0]
		if clientv3.LeaseID(kv.Lease) == c.lease && string(kv.Value) == c.id {
			claimed[s] = Epoch(kv.CreateRevision)
			continue
		}
		owned[s] = &OwnedError{Shard: s, Member: string(kv.Value), Epoch: Epoch(kv.CreateRevision), Lease: clientv3.LeaseID(kv.Lease)}
	}
	return claimed, owned, nil
}

// Release gives shard s up: one Txn that deletes the owner key only if its
// CreateRevision is still e. The caller must have stopped writing for s
// first (in-flight plans finished or abandoned): the next owner may claim
// the moment the delete commits. Errors: ErrNotOwner if the key of epoch e
// is already gone; the shard or epoch range; etcd errors (retry).
func (c *Claimer) Release(ctx context.Context, s int, e Epoch) error {
	if err := c.layout.CheckShard(s); err != nil {
		return err
	}
	if e <= 0 {
		return fmt.Errorf("epoch: must be > 0, got %d", e)
	}
	key := c.layout.OwnerKey(s)
	resp, err := c.cli.Txn(ctx).If(c.layout.Fence(s, e)).Then(clientv3.OpDelete(key)).Commit()
	if err != nil {
		return fmt.Errorf("release shard %d: %w", s, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("release shard %d epoch %d: %w", s, e, ErrNotOwner)
	}
	return nil
}

// Fence is the claimer's layout's Fence(s, e).
func (c *Claimer) Fence(s int, e Epoch) clientv3.Cmp { return c.layout.Fence(s, e) }
