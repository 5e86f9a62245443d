package aclstore

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/acl"
	"apiary.dev/apiary/internal/ids"
)

// Limits of a token.
const (
	MaxTokenNameBytes = 256
	MaxTokenPolicies  = 64
	// MaxTTL bounds a token's time to live (ttl_ms).
	MaxTTL = 100 * 365 * 24 * time.Hour
)

// BootstrapName is the name of the token BootstrapACL makes.
const BootstrapName = "Bootstrap Token"

func invalid(err error) error { return status.Error(codes.InvalidArgument, err.Error()) }

// chooseIDs returns the request's accessor and secret ids (both or neither;
// UUIDs, distinct) or new ones.
func chooseIDs(accessor, secret string) (string, string, error) {
	switch {
	case accessor == "" && secret == "":
		return acl.NewID(), acl.NewID(), nil
	case accessor == "" || secret == "":
		return "", "", status.Error(codes.InvalidArgument, "accessor_id, secret_id: give both (the same token in every region) or neither (new ids)")
	}
	if err := acl.ValidateID("accessor_id", accessor); err != nil {
		return "", "", invalid(err)
	}
	if err := acl.ValidateID("secret_id", secret); err != nil {
		return "", "", invalid(err)
	}
	if accessor == secret {
		return "", "", status.Error(codes.InvalidArgument, "secret_id: must differ from accessor_id (the accessor is shown in lists and logs)")
	}
	return accessor, secret, nil
}

// withSecret is rec's proto with the secret (a create or bootstrap answer).
func withSecret(rec *tokenRecord, secret string) *apiaryv1.ACLToken {
	t := rec.proto()
	t.SecretId = secret
	return t
}

// Bootstrap makes the region's first management token (Nomad's `acl
// bootstrap`), once: with the request's accessor and secret ids (both
// UUIDs; the router's fan-out gives every region the same) or new ones.
// The bootstrap record, the token and its secret index are one Txn guarded
// by "no bootstrap record". A region bootstrapped already answers
// ALREADY_EXISTS, unless the request names the same accessor and secret
// and that token still exists (a repeat: its answer again).
func (s *Store) Bootstrap(ctx context.Context, req *apiaryv1.BootstrapACLRequest) (*apiaryv1.ACLToken, error) {
	accessor, secret, err := chooseIDs(req.GetAccessorId(), req.GetSecretId())
	if err != nil {
		return nil, err
	}
	hash := acl.HashSecret(secret)
	now := s.now().UnixMilli()
	rec := &tokenRecord{Accessor: accessor, SecretHash: hash, Name: BootstrapName, Type: acl.TypeManagement, CreateMs: now}
	cctx, cancel := context.WithTimeout(ctx, etcdTimeout)
	defer cancel()
	resp, err := s.cfg.Client.Txn(cctx).If(clientv3.Compare(clientv3.CreateRevision(keyBootstrap), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(keyToken(accessor)), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(keySecret(hash)), "=", 0)).
		Then(clientv3.OpPut(keyBootstrap, mustJSON(bootstrapRecord{Accessor: accessor, SecretHash: hash, AtMs: now})),
			clientv3.OpPut(keyToken(accessor), mustJSON(rec)), clientv3.OpPut(keySecret(hash), accessor)).
		Else(clientv3.OpGet(keyBootstrap), clientv3.OpGet(keyToken(accessor))).Commit()
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "bootstrap: %v", err)
	}
	if resp.Succeeded {
		s.waitRev(ctx, resp.Header.Revision)
		s.log.Info("ACL bootstrap: management token made", "accessor", accessor)
		return withSecret(rec, secret), nil
	}
	bkv, tkv := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
	if len(bkv) == 0 {
		return nil, status.Errorf(codes.AlreadyExists, "accessor_id or secret_id: already used by another token of region %s", s.cfg.Region)
	}
	var b bootstrapRecord
	_ = json.Unmarshal(bkv[0].Value, &b)
	if b.Accessor == accessor && b.SecretHash == hash {
		var got tokenRecord
		if len(tkv) == 1 && json.Unmarshal(tkv[0].Value, &got) == nil && got.SecretHash == hash {
			s.waitRev(ctx, tkv[0].ModRevision)
			return withSecret(&got, secret), nil
		}
		return nil, status.Errorf(codes.AlreadyExists, "region %s was bootstrapped with this token, and the token has been revoked since; use another management token",
			s.cfg.Region)
	}
	return nil, status.Errorf(codes.AlreadyExists, "region %s's ACLs were bootstrapped already (at %s, token %s); use a management token",
		s.cfg.Region, time.UnixMilli(b.AtMs).UTC().Format(time.RFC3339), b.Accessor)
}

// validateCreate checks a CreateACLTokenRequest and returns the token type.
func (s *Store) validateCreate(req *apiaryv1.CreateACLTokenRequest) (string, error) {
	if n := req.GetName(); len(n) > MaxTokenNameBytes || !utf8.ValidString(n) || strings.ContainsAny(n, "\x00\n") {
		return "", status.Errorf(codes.InvalidArgument, "name: must be valid UTF-8 of at most %d bytes without NUL or newline", MaxTokenNameBytes)
	}
	typ := req.GetType()
	if typ == "" {
		typ = acl.TypeClient
	}
	if !slices.Contains(acl.TokenTypes, typ) {
		return "", status.Errorf(codes.InvalidArgument, "type: must be one of %s (got %q)", strings.Join(acl.TokenTypes, ", "), typ)
	}
	if ttl := req.GetTtlMs(); ttl < 0 || ttl > MaxTTL.Milliseconds() {
		return "", status.Errorf(codes.InvalidArgument, "ttl_ms: must be between 0 (never expires) and %d (100 years), got %d", MaxTTL.Milliseconds(), ttl)
	}
	pols := req.GetPolicies()
	if typ != acl.TypeClient && len(pols) > 0 {
		return "", status.Errorf(codes.InvalidArgument, "policies: a %s token takes no policies (only client tokens do)", typ)
	}
	if typ != acl.TypeAgent && (req.GetRegion() != "" || req.GetNodeId() != "") {
		return "", status.Errorf(codes.InvalidArgument, "region, node_id: only agent tokens have them (this is a %s token)", typ)
	}
	switch typ {
	case acl.TypeClient:
		if len(pols) == 0 {
			return "", status.Error(codes.InvalidArgument, "policies: a client token needs at least one policy (apiary acl policy apply NAME FILE)")
		}
		if len(pols) > MaxTokenPolicies {
			return "", status.Errorf(codes.InvalidArgument, "policies: at most %d, got %d", MaxTokenPolicies, len(pols))
		}
		for i, p := range pols {
			if err := acl.ValidatePolicyName(fmt.Sprintf("policies[%d]", i), p); err != nil {
				return "", invalid(err)
			}
			if j := slices.Index(pols, p); j < i {
				return "", status.Errorf(codes.InvalidArgument, "policies[%d]: %q is named twice (also policies[%d])", i, p, j)
			}
		}
	case acl.TypeAgent:
		switch r := req.GetRegion(); {
		case r == "":
			return "", status.Errorf(codes.InvalidArgument, "region: an agent token needs the region its node joins (--region %s)", s.cfg.Region)
		case r != s.cfg.Region:
			return "", status.Errorf(codes.InvalidArgument, "region: an agent token for region %s cannot be made in region %s: make it there", r, s.cfg.Region)
		}
		if n := req.GetNodeId(); n != "" && !ids.Region.MatchString(n) {
			return "", status.Errorf(codes.InvalidArgument, "node_id: must be an agent certificate's id: 1-63 lower-case letters, digits or '-', not starting or ending with '-' (got %q)", n)
		}
	}
	return typ, nil
}

// CreateToken makes a token (Nomad's `acl token create`) and returns it
// with its secret, which is stored only as a SHA-256 hash. Client tokens
// need at least one policy, each of which must exist; agent tokens need
// region == this region and may be bound to node_id at once. The
// request's accessor_id and secret_id (the router's fan-out) are used when
// given, and a repeat with the same ids and fields returns the stored
// token. One Txn writes the token, its secret index and (agent with
// node_id) the node binding, compared on: no token with that accessor or
// secret, every policy present, the node unbound. Errors: INVALID_ARGUMENT
// naming the field (a missing policy too), ALREADY_EXISTS (ids used by
// another token, node bound to another token), UNAVAILABLE.
func (s *Store) CreateToken(ctx context.Context, req *apiaryv1.CreateACLTokenRequest) (*apiaryv1.ACLToken, error) {
	typ, err := s.validateCreate(req)
	if err != nil {
		return nil, err
	}
	accessor, secret, err := chooseIDs(req.GetAccessorId(), req.GetSecretId())
	if err != nil {
		return nil, err
	}
	hash := acl.HashSecret(secret)
	now := s.now().UnixMilli()
	rec := &tokenRecord{Accessor: accessor, SecretHash: hash, Name: req.GetName(), Type: typ, Policies: req.GetPolicies(),
		Region: req.GetRegion(), NodeID: req.GetNodeId(), CreateMs: now}
	if ttl := req.GetTtlMs(); ttl > 0 {
		rec.ExpireMs = now + ttl
	}
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(keyToken(accessor)), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(keySecret(hash)), "=", 0)}
	ops := []clientv3.Op{clientv3.OpPut(keyToken(accessor), mustJSON(rec)), clientv3.OpPut(keySecret(hash), accessor)}
	elses := []clientv3.Op{clientv3.OpGet(keyToken(accessor)), clientv3.OpGet(keySecret(hash))}
	for _, p := range rec.Policies {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(keyPolicy(p)), ">", 0))
		elses = append(elses, clientv3.OpGet(keyPolicy(p), clientv3.WithKeysOnly()))
	}
	if rec.NodeID != "" {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(keyNode(rec.NodeID)), "=", 0))
		ops = append(ops, clientv3.OpPut(keyNode(rec.NodeID), accessor))
		elses = append(elses, clientv3.OpGet(keyNode(rec.NodeID)))
	}
	cctx, cancel := context.WithTimeout(ctx, etcdTimeout)
	defer cancel()
	resp, err := s.cfg.Client.Txn(cctx).If(cmps...).Then(ops...).Else(elses...).Commit()
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "create token: %v", err)
	}
	if resp.Succeeded {
		s.waitRev(ctx, resp.Header.Revision)
		s.log.Info("ACL token made", "accessor", accessor, "type", typ, "name", rec.Name, "policies", rec.Policies, "node", rec.NodeID)
		return withSecret(rec, secret), nil
	}
	// Which compare failed?
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
		var got tokenRecord
		if json.Unmarshal(kvs[0].Value, &got) == nil && got.SecretHash == hash && got.Type == typ && got.Name == rec.Name &&
			slices.Equal(got.Policies, rec.Policies) && got.Region == rec.Region && (rec.NodeID == "" || got.NodeID == rec.NodeID) {
			s.waitRev(ctx, kvs[0].ModRevision)
			return withSecret(&got, secret), nil // a repeat
		}
		return nil, status.Errorf(codes.AlreadyExists, "accessor_id: %s is another token's", accessor)
	}
	if len(resp.Responses[1].GetResponseRange().Kvs) == 1 {
		return nil, status.Error(codes.AlreadyExists, "secret_id: already another token's secret")
	}
	for i, p := range rec.Policies {
		if len(resp.Responses[2+i].GetResponseRange().Kvs) == 0 {
			return nil, status.Errorf(codes.InvalidArgument, "policies[%d]: no policy %q in region %s (apiary acl policy apply %s FILE)", i, p, s.cfg.Region, p)
		}
	}
	if rec.NodeID != "" {
		if kvs := resp.Responses[len(resp.Responses)-1].GetResponseRange().Kvs; len(kvs) == 1 {
			return nil, status.Errorf(codes.AlreadyExists, "node_id: node %s is bound to join token %s already; revoke that token first", rec.NodeID, kvs[0].Value)
		}
	}
	return nil, status.Error(codes.Aborted, "create token: the ACL state changed meanwhile; retry")
}

// ListTokens returns every token of the region (never a secret), oldest
// first, read from etcd.
func (s *Store) ListTokens(ctx context.Context) ([]*apiaryv1.ACLToken, error) {
	cctx, cancel := context.WithTimeout(ctx, etcdTimeout)
	defer cancel()
	resp, err := s.cfg.Client.Get(cctx, prefTokens, clientv3.WithPrefix())
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "list tokens: %v", err)
	}
	var out []*apiaryv1.ACLToken
	for _, kv := range resp.Kvs {
		var r tokenRecord
		if json.Unmarshal(kv.Value, &r) == nil {
			out = append(out, r.proto())
		}
	}
	sort.Slice(out, func(a, b int) bool {
		if out[a].GetCreateTimeMs() != out[b].GetCreateTimeMs() {
			return out[a].GetCreateTimeMs() < out[b].GetCreateTimeMs()
		}
		return out[a].GetAccessorId() < out[b].GetAccessorId()
	})
	return out, nil
}

// RevokeToken deletes the token with accessor id accessor, its secret
// index and, for an agent token bound to a node, the node's binding and
// the node's current epoch (Config.EndNodeOps), in one Txn compared on the
// token's ModRevision (a registration that binds the token meanwhile makes
// it re-read and end that node's epoch). It returns the node whose epoch
// it ended ("" when none). Errors: INVALID_ARGUMENT, NOT_FOUND (no such
// token), ABORTED (kept changing), UNAVAILABLE.
func (s *Store) RevokeToken(ctx context.Context, accessor string) (string, error) {
	if err := acl.ValidateID("accessor_id", accessor); err != nil {
		return "", invalid(err)
	}
	cctx, cancel := context.WithTimeout(ctx, etcdTimeout)
	defer cancel()
	for range 8 {
		resp, err := s.cfg.Client.Get(cctx, keyToken(accessor))
		if err != nil {
			return "", status.Errorf(codes.Unavailable, "revoke token: %v", err)
		}
		if len(resp.Kvs) == 0 {
			return "", status.Errorf(codes.NotFound, "accessor_id: no token %s in region %s", accessor, s.cfg.Region)
		}
		var rec tokenRecord
		if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
			return "", status.Errorf(codes.Internal, "token %s does not decode: %v", accessor, err)
		}
		ops := []clientv3.Op{clientv3.OpDelete(keyToken(accessor)), clientv3.OpDelete(keySecret(rec.SecretHash))}
		if rec.NodeID != "" {
			b := keyNode(rec.NodeID)
			ops = append(ops, clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.Value(b), "=", accessor)}, []clientv3.Op{clientv3.OpDelete(b)}, nil))
			ops = append(ops, s.cfg.EndNodeOps(rec.NodeID)...)
		}
		tr, err := s.cfg.Client.Txn(cctx).If(clientv3.Compare(clientv3.ModRevision(keyToken(accessor)), "=", resp.Kvs[0].ModRevision)).
			Then(ops...).Commit()
		if err != nil {
			return "", status.Errorf(codes.Unavailable, "revoke token: %v", err)
		}
		if tr.Succeeded {
			s.waitRev(ctx, tr.Header.Revision)
			s.log.Info("ACL token revoked", "accessor", accessor, "type", rec.Type, "ended_node", rec.NodeID)
			return rec.NodeID, nil
		}
	}
	return "", status.Errorf(codes.Aborted, "revoke token %s: it kept changing; retry", accessor)
}

// Join is what a node's registration must commit with its new epoch
// (CheckJoin): Cmps hold while the join token is unchanged and bound to
// the node (or still unbound and the node unbound), Ops bind it at the
// first registration. Put both in the Txn that creates the node's epoch:
// then a revocation either commits first (the registration fails) or sees
// the binding and ends the epoch.
type Join struct {
	// Accessor is the join token's accessor id.
	Accessor string
	Cmps     []clientv3.Cmp
	Ops      []clientv3.Op
	// Binds is true when this registration binds the token to the node.
	Binds bool
}

// CheckJoin checks secret as the join token of node nodeID (read from
// etcd, never the cache: a revocation must not be missed) and returns what
// the registration's Txn must include. Refusals are *Denial:
// Unauthenticated without a token (ReasonNoToken), for an unknown
// (ReasonUnknownToken) or expired (ReasonExpiredToken) one;
// PermissionDenied (ReasonJoinToken) for a token that is not an agent
// token of this region, is bound to another node, or when the node is
// bound to another token. UNAVAILABLE when etcd cannot be read.
func (s *Store) CheckJoin(ctx context.Context, secret, nodeID string) (*Join, error) {
	deny := func(code codes.Code, reason, acc, format string, args ...any) error {
		return &Denial{Code: code, Reason: reason, Accessor: acc, Msg: "join_token: " + fmt.Sprintf(format, args...)}
	}
	hint := fmt.Sprintf("give the agent an agent token of region %s (apiary acl token create --type agent --region %s)", s.cfg.Region, s.cfg.Region)
	if secret == "" {
		return nil, deny(codes.Unauthenticated, acl.ReasonNoToken, "", "required: region %s runs with ACLs on; %s", s.cfg.Region, hint)
	}
	hash := acl.HashSecret(secret)
	cctx, cancel := context.WithTimeout(ctx, etcdTimeout)
	defer cancel()
	resp, err := s.cfg.Client.Get(cctx, keySecret(hash))
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "read join token: %v", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, deny(codes.Unauthenticated, acl.ReasonUnknownToken, "", "no such token in region %s (revoked, or never made here); %s", s.cfg.Region, hint)
	}
	accessor := string(resp.Kvs[0].Value)
	tr, err := s.cfg.Client.Txn(cctx).Then(clientv3.OpGet(keyToken(accessor)), clientv3.OpGet(keyNode(nodeID))).Commit()
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "read join token: %v", err)
	}
	tkv, nkv := tr.Responses[0].GetResponseRange().Kvs, tr.Responses[1].GetResponseRange().Kvs
	var rec tokenRecord
	if len(tkv) == 0 || json.Unmarshal(tkv[0].Value, &rec) != nil || rec.SecretHash != hash {
		return nil, deny(codes.Unauthenticated, acl.ReasonUnknownToken, "", "no such token in region %s (revoked, or never made here); %s", s.cfg.Region, hint)
	}
	switch {
	case rec.Type != acl.TypeAgent:
		return nil, deny(codes.PermissionDenied, acl.ReasonJoinToken, accessor, "token %s is a %s token, not an agent token; %s", accessor, rec.Type, hint)
	case rec.Region != s.cfg.Region:
		return nil, deny(codes.PermissionDenied, acl.ReasonJoinToken, accessor, "token %s is for region %s, not %s; %s", accessor, rec.Region, s.cfg.Region, hint)
	case rec.ExpireMs > 0 && s.now().UnixMilli() >= rec.ExpireMs:
		return nil, deny(codes.Unauthenticated, acl.ReasonExpiredToken, accessor, "token %s expired at %s; %s", accessor,
			time.UnixMilli(rec.ExpireMs).UTC().Format(time.RFC3339), hint)
	case rec.NodeID != "" && rec.NodeID != nodeID:
		return nil, deny(codes.PermissionDenied, acl.ReasonJoinToken, accessor, "token %s is bound to node %s; node %s needs a token of its own", accessor, rec.NodeID, nodeID)
	case len(nkv) == 1 && string(nkv[0].Value) != accessor:
		return nil, deny(codes.PermissionDenied, acl.ReasonJoinToken, accessor, "node %s is bound to another join token (%s); register it with that token, or revoke that token first",
			nodeID, nkv[0].Value)
	}
	j := &Join{Accessor: accessor, Cmps: []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(keyToken(accessor)), "=", tkv[0].ModRevision)}}
	if len(nkv) == 1 {
		j.Cmps = append(j.Cmps, clientv3.Compare(clientv3.ModRevision(keyNode(nodeID)), "=", nkv[0].ModRevision))
	} else {
		j.Cmps = append(j.Cmps, clientv3.Compare(clientv3.CreateRevision(keyNode(nodeID)), "=", 0))
		j.Ops = append(j.Ops, clientv3.OpPut(keyNode(nodeID), accessor))
	}
	if rec.NodeID == "" {
		rec.NodeID = nodeID
		j.Ops = append(j.Ops, clientv3.OpPut(keyToken(accessor), mustJSON(&rec)))
		j.Binds = true
	}
	return j, nil
}
