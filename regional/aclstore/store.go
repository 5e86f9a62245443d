package aclstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/acl"
	"apiary.dev/apiary/internal/ids"
	"apiary.dev/apiary/internal/lifecycle"
)

// Config configures a Store.
type Config struct {
	// Client is the region's etcd client.
	Client *clientv3.Client
	// Region is this region's name: agent tokens are made for it only, and
	// messages name it.
	Region string
	// EndNodeOps returns the etcd ops that end nodeID's current epoch
	// (regional: delete /apiary/nodes/<id>/alive). RevokeToken puts them
	// in the Txn that deletes an agent token bound to the node. Required.
	EndNodeOps func(nodeID string) []clientv3.Op
	// Logger: nil means slog.Default().
	Logger *slog.Logger
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time
}

// Store is a region's ACL state: etcd under Prefix, and a watch cache of
// it. Call Load (or Run, which loads first) before Resolve answers from the
// cache; until then, and for anything the cache misses, Resolve reads etcd.
type Store struct {
	cfg     Config
	log     *slog.Logger
	now     func() time.Time
	running atomic.Bool // Run is watching: writes wait for the cache

	mu       sync.RWMutex
	rev      int64                          // etcd revision the cache reflects
	tokens   map[string]*tokenRecord        // by accessor
	secrets  map[string]string              // secret hash -> accessor
	policies map[string]*apiaryv1.ACLPolicy // by name
	compiled map[string]*acl.ACL            // by accessor; emptied on every change
	advanced chan struct{}                  // closed (and replaced) when rev advances
}

// New returns a Store of cfg (not loaded yet).
func New(cfg Config) (*Store, error) {
	if cfg.Client == nil {
		return nil, errors.New("aclstore: Config.Client is required")
	}
	if cfg.EndNodeOps == nil {
		return nil, errors.New("aclstore: Config.EndNodeOps is required")
	}
	if !ids.Region.MatchString(cfg.Region) {
		return nil, fmt.Errorf("aclstore: Config.Region must be a region name, got %q", cfg.Region)
	}
	s := &Store{cfg: cfg, log: cfg.Logger, now: cfg.Now, advanced: make(chan struct{})}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.reset()
	return s, nil
}

func (s *Store) reset() {
	s.tokens, s.secrets, s.policies, s.compiled = map[string]*tokenRecord{}, map[string]string{}, map[string]*apiaryv1.ACLPolicy{}, map[string]*acl.ACL{}
}

// Region is the store's region.
func (s *Store) Region() string { return s.cfg.Region }

// etcdTimeout bounds every etcd call (MEASURED.md trap 4).
const etcdTimeout = 5 * time.Second

// Load replaces the cache with a range read of Prefix.
func (s *Store) Load(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, etcdTimeout)
	defer cancel()
	resp, err := s.cfg.Client.Get(cctx, Prefix, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("aclstore: load %s: %w", Prefix, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reset()
	for _, kv := range resp.Kvs {
		s.applyLocked(kv, false)
	}
	s.advanceLocked(resp.Header.Revision)
	return nil
}

// Run keeps the cache current until ctx ends: it loads, then watches
// Prefix from the next revision; a compacted watch reloads, any other
// watch failure watches again from where the cache is. Errors are logged
// and retried every 200 ms.
func (s *Store) Run(ctx context.Context) {
	s.running.Store(true)
	defer s.running.Store(false)
	loaded := false
	for ctx.Err() == nil {
		if !loaded {
			if err := s.Load(ctx); err != nil {
				if ctx.Err() == nil {
					s.log.Warn("acl cache: load failed; retrying", "err", err)
					_ = lifecycle.Sleep(ctx, 200*time.Millisecond)
				}
				continue
			}
			loaded = true
		}
		s.mu.RLock()
		from := s.rev + 1
		s.mu.RUnlock()
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		compacted := s.watch(wctx, from)
		cancel()
		if compacted {
			s.log.Info("acl cache: watch compacted; reloading", "from_revision", from)
			loaded = false
			continue
		}
		_ = lifecycle.Sleep(ctx, 200*time.Millisecond)
	}
}

// watch applies the events of one watch from revision from until it ends;
// it reports whether it ended because from was compacted.
func (s *Store) watch(ctx context.Context, from int64) (compacted bool) {
	for wr := range s.cfg.Client.Watch(ctx, Prefix, clientv3.WithPrefix(), clientv3.WithRev(from)) {
		if wr.CompactRevision != 0 || errors.Is(wr.Err(), rpctypes.ErrCompacted) {
			return true
		}
		if err := wr.Err(); err != nil {
			if ctx.Err() == nil {
				s.log.Warn("acl cache: watch failed; watching again", "err", err)
			}
			return false
		}
		s.mu.Lock()
		for _, ev := range wr.Events {
			s.applyLocked(ev.Kv, ev.Type == clientv3.EventTypeDelete)
		}
		s.advanceLocked(wr.Header.Revision)
		s.mu.Unlock()
	}
	return false
}

// applyLocked folds one key (or its deletion) into the cache.
func (s *Store) applyLocked(kv *mvccpb.KeyValue, deleted bool) {
	kind, id, ok := keyKind(string(kv.Key))
	if !ok {
		return
	}
	switch kind {
	case "token":
		if deleted {
			delete(s.tokens, id)
			break
		}
		var r tokenRecord
		if err := json.Unmarshal(kv.Value, &r); err != nil {
			s.log.Error("acl cache: token record does not decode; the token is refused", "key", string(kv.Key), "err", err)
			delete(s.tokens, id)
			break
		}
		s.tokens[id] = &r
	case "secret":
		if deleted {
			delete(s.secrets, id)
		} else {
			s.secrets[id] = string(kv.Value)
		}
	case "policy":
		if deleted {
			delete(s.policies, id)
			break
		}
		var p apiaryv1.ACLPolicy
		if err := protojson.Unmarshal(kv.Value, &p); err != nil {
			s.log.Error("acl cache: policy does not decode; it grants nothing", "key", string(kv.Key), "err", err)
			delete(s.policies, id)
			break
		}
		s.policies[id] = &p
	default:
		return // bootstrap and node bindings are read from etcd where needed
	}
	clear(s.compiled)
}

func (s *Store) advanceLocked(rev int64) {
	if rev <= s.rev {
		return
	}
	s.rev = rev
	close(s.advanced)
	s.advanced = make(chan struct{})
}

// waitRev waits (at most 2 s, or until ctx ends) until the cache reflects
// revision rev: a write's answer is sent once this coordinator's cache
// holds it, so the caller's next call here sees it. Without Run it
// returns at once.
func (s *Store) waitRev(ctx context.Context, rev int64) {
	if !s.running.Load() {
		return
	}
	deadline := time.NewTimer(2 * time.Second)
	defer deadline.Stop()
	for {
		s.mu.RLock()
		cur, ch := s.rev, s.advanced
		s.mu.RUnlock()
		if cur >= rev {
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return
		case <-deadline.C:
			s.log.Debug("acl cache: write not seen within 2s", "revision", rev, "cache_revision", cur)
			return
		}
	}
}

// Denial is a refusal by the ACL layer: a gRPC status (Code, Msg) with the
// metric reason (acl.Reason*) and the accessor id of the token involved
// ("" when none resolved). Never holds a secret.
type Denial struct {
	Code     codes.Code
	Reason   string
	Msg      string
	Accessor string
}

func (d *Denial) Error() string { return d.Msg }

// GRPCStatus makes a Denial its status (status.Convert, a handler's
// return value).
func (d *Denial) GRPCStatus() *status.Status { return status.New(d.Code, d.Msg) }

// tokenHint is how every "set a token" message ends.
func tokenHint() string {
	return "set " + acl.EnvToken + " to a token's secret id (apiary acl bootstrap, apiary acl token create)"
}

// Resolve returns the ACL of the token whose secret is secret, from the
// cache; on a miss it reads etcd before refusing (a token made a moment
// ago on another coordinator). Refusals are *Denial: no token
// (acl.ReasonNoToken), unknown (ReasonUnknownToken), expired
// (ReasonExpiredToken, with the accessor), all codes.Unauthenticated with
// a message that says to set APIARY_TOKEN; an etcd failure on a miss is
// codes.Unavailable.
func (s *Store) Resolve(ctx context.Context, secret string) (*acl.ACL, error) {
	if secret == "" {
		return nil, &Denial{Code: codes.Unauthenticated, Reason: acl.ReasonNoToken,
			Msg: fmt.Sprintf("no ACL token: region %s runs with ACLs on; %s", s.cfg.Region, tokenHint())}
	}
	hash := acl.HashSecret(secret)
	a := s.cached(hash)
	if a == nil {
		var err error
		if a, err = s.resolveDirect(ctx, hash); err != nil {
			return nil, s.accessorAsSecret(secret, err)
		}
	}
	if a.Expired(s.now()) {
		return nil, &Denial{Code: codes.Unauthenticated, Reason: acl.ReasonExpiredToken, Accessor: a.AccessorID(),
			Msg: fmt.Sprintf("ACL token %s expired at %s; %s", a.AccessorID(),
				time.UnixMilli(a.Token().GetExpirationTimeMs()).UTC().Format(time.RFC3339), tokenHint())}
	}
	return a, nil
}

// accessorAsSecret is err, or, when err says the token is unknown and
// secret is the accessor id of a token this region holds, a refusal that
// says so (a user who copied the Accessor ID line instead of the Secret
// ID). Accessor ids are public, so naming one reveals nothing.
func (s *Store) accessorAsSecret(secret string, err error) error {
	var d *Denial
	if !errors.As(err, &d) || d.Reason != acl.ReasonUnknownToken {
		return err
	}
	s.mu.RLock()
	_, ok := s.tokens[secret]
	s.mu.RUnlock()
	if !ok {
		return err
	}
	return &Denial{Code: codes.Unauthenticated, Reason: acl.ReasonUnknownToken, Accessor: secret,
		Msg: fmt.Sprintf("%s is the Accessor ID of an ACL token, not its secret: set %s to the token's Secret ID "+
			"(shown once, when it was made)", secret, acl.EnvToken)}
}

func (s *Store) unknownToken() error {
	return &Denial{Code: codes.Unauthenticated, Reason: acl.ReasonUnknownToken,
		Msg: fmt.Sprintf("ACL token not found in region %s (revoked, expired and removed, or never made here); %s", s.cfg.Region, tokenHint())}
}

// cached is the compiled ACL of the token whose secret hashes to hash, or
// nil when the cache does not hold it.
func (s *Store) cached(hash string) *acl.ACL {
	s.mu.RLock()
	acc, ok := s.secrets[hash]
	var rec *tokenRecord
	if ok {
		rec = s.tokens[acc]
	}
	a := s.compiled[acc]
	s.mu.RUnlock()
	if rec == nil || rec.SecretHash != hash {
		return nil
	}
	if a != nil {
		return a
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if a := s.compiled[acc]; a != nil {
		return a
	}
	if s.tokens[acc] != rec { // changed meanwhile: compile what is there now
		return nil
	}
	a = compile(rec, s.policies)
	s.compiled[acc] = a
	return a
}

func compile(rec *tokenRecord, policies map[string]*apiaryv1.ACLPolicy) *acl.ACL {
	var ps []*apiaryv1.ACLPolicy
	for _, n := range rec.Policies {
		if p := policies[n]; p != nil {
			ps = append(ps, p)
		}
	}
	return acl.Compile(rec.proto(), ps)
}

// resolveDirect reads the token whose secret hashes to hash, and the
// policies, from etcd (the cache is not changed: its watch brings them).
func (s *Store) resolveDirect(ctx context.Context, hash string) (*acl.ACL, error) {
	cctx, cancel := context.WithTimeout(ctx, etcdTimeout)
	defer cancel()
	resp, err := s.cfg.Client.Get(cctx, keySecret(hash))
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "read ACL token: %v", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, s.unknownToken()
	}
	tr, err := s.cfg.Client.Txn(cctx).Then(clientv3.OpGet(keyToken(string(resp.Kvs[0].Value))),
		clientv3.OpGet(prefPolicies, clientv3.WithPrefix())).Commit()
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "read ACL token: %v", err)
	}
	kvs := tr.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return nil, s.unknownToken()
	}
	var rec tokenRecord
	if err := json.Unmarshal(kvs[0].Value, &rec); err != nil || rec.SecretHash != hash {
		return nil, s.unknownToken()
	}
	pols := map[string]*apiaryv1.ACLPolicy{}
	for _, kv := range tr.Responses[1].GetResponseRange().Kvs {
		var p apiaryv1.ACLPolicy
		if protojson.Unmarshal(kv.Value, &p) == nil {
			pols[p.GetName()] = &p
		}
	}
	return compile(&rec, pols), nil
}
