package aclstore

import (
	"context"
	"sort"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/acl"
)

// ApplyPolicy creates or replaces the policy of p's name (Nomad's `acl
// policy apply`) after acl.ValidatePolicy (INVALID_ARGUMENT naming every
// broken field). Tokens that name it get its new grants as soon as each
// coordinator's cache sees the write.
func (s *Store) ApplyPolicy(ctx context.Context, p *apiaryv1.ACLPolicy) error {
	if err := acl.ValidatePolicy(p); err != nil {
		return status.Errorf(codes.InvalidArgument, "invalid policy:\n%v", err)
	}
	b, err := protojson.Marshal(p)
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "policy: %v", err)
	}
	cctx, cancel := context.WithTimeout(ctx, etcdTimeout)
	defer cancel()
	resp, err := s.cfg.Client.Put(cctx, keyPolicy(p.GetName()), string(b))
	if err != nil {
		return status.Errorf(codes.Unavailable, "apply policy: %v", err)
	}
	s.waitRev(ctx, resp.Header.Revision)
	s.log.Info("ACL policy applied", "policy", p.GetName())
	return nil
}

// ListPolicies returns every policy of the region, by name, read from
// etcd.
func (s *Store) ListPolicies(ctx context.Context) ([]*apiaryv1.ACLPolicy, error) {
	cctx, cancel := context.WithTimeout(ctx, etcdTimeout)
	defer cancel()
	resp, err := s.cfg.Client.Get(cctx, prefPolicies, clientv3.WithPrefix())
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "list policies: %v", err)
	}
	var out []*apiaryv1.ACLPolicy
	for _, kv := range resp.Kvs {
		var p apiaryv1.ACLPolicy
		if protojson.Unmarshal(kv.Value, &p) == nil {
			out = append(out, &p)
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].GetName() < out[b].GetName() })
	return out, nil
}

// DeletePolicy deletes the policy name. Tokens that name it keep the name
// and lose its grants (as in Nomad). NOT_FOUND when there is no such
// policy.
func (s *Store) DeletePolicy(ctx context.Context, name string) error {
	if err := acl.ValidatePolicyName("name", name); err != nil {
		return invalid(err)
	}
	cctx, cancel := context.WithTimeout(ctx, etcdTimeout)
	defer cancel()
	resp, err := s.cfg.Client.Delete(cctx, keyPolicy(name))
	if err != nil {
		return status.Errorf(codes.Unavailable, "delete policy: %v", err)
	}
	if resp.Deleted == 0 {
		return status.Errorf(codes.NotFound, "name: no policy %q in region %s", name, s.cfg.Region)
	}
	s.waitRev(ctx, resp.Header.Revision)
	s.log.Info("ACL policy deleted", "policy", name)
	return nil
}
