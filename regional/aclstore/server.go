package aclstore

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/acl"
)

// Server is a region's ACLService (ACLs on). Every method but
// BootstrapACL and GetACLSelf needs a management token: the caller's
// *acl.ACL must be on the call's context (acl.NewContext; the region's
// interceptor puts it there and refuses, logs and counts first; this
// check is a second line). GetACLSelf needs any valid token.
type Server struct {
	apiaryv1.UnimplementedACLServiceServer
	s *Store
}

// NewServer serves store.
func NewServer(store *Store) *Server { return &Server{s: store} }

// management refuses a caller without a management token.
func (sv *Server) management(ctx context.Context, method string) error {
	a, _ := acl.FromContext(ctx)
	if a.IsManagement() {
		return nil
	}
	return &Denial{Code: codes.PermissionDenied, Reason: acl.ReasonPermission, Accessor: a.AccessorID(),
		Msg: fmt.Sprintf("ACLService/%s needs a management token", method)}
}

func (sv *Server) BootstrapACL(ctx context.Context, req *apiaryv1.BootstrapACLRequest) (*apiaryv1.BootstrapACLResponse, error) {
	t, err := sv.s.Bootstrap(ctx, req)
	if err != nil {
		return nil, err
	}
	return &apiaryv1.BootstrapACLResponse{Token: t, Regions: []string{sv.s.cfg.Region}}, nil
}

func (sv *Server) CreateACLToken(ctx context.Context, req *apiaryv1.CreateACLTokenRequest) (*apiaryv1.CreateACLTokenResponse, error) {
	if err := sv.management(ctx, "CreateACLToken"); err != nil {
		return nil, err
	}
	t, err := sv.s.CreateToken(ctx, req)
	if err != nil {
		return nil, err
	}
	return &apiaryv1.CreateACLTokenResponse{Token: t, Regions: []string{sv.s.cfg.Region}}, nil
}

func (sv *Server) ListACLTokens(ctx context.Context, _ *apiaryv1.ListACLTokensRequest) (*apiaryv1.ListACLTokensResponse, error) {
	if err := sv.management(ctx, "ListACLTokens"); err != nil {
		return nil, err
	}
	ts, err := sv.s.ListTokens(ctx)
	if err != nil {
		return nil, err
	}
	return &apiaryv1.ListACLTokensResponse{Tokens: ts}, nil
}

func (sv *Server) RevokeACLToken(ctx context.Context, req *apiaryv1.RevokeACLTokenRequest) (*apiaryv1.RevokeACLTokenResponse, error) {
	if err := sv.management(ctx, "RevokeACLToken"); err != nil {
		return nil, err
	}
	node, err := sv.s.RevokeToken(ctx, req.GetAccessorId())
	if err != nil {
		return nil, err
	}
	return &apiaryv1.RevokeACLTokenResponse{EndedNodeId: node, Regions: []string{sv.s.cfg.Region}}, nil
}

func (sv *Server) GetACLSelf(ctx context.Context, _ *apiaryv1.GetACLSelfRequest) (*apiaryv1.GetACLSelfResponse, error) {
	a, _ := acl.FromContext(ctx)
	if t := a.Token(); t.GetAccessorId() != "" {
		return &apiaryv1.GetACLSelfResponse{Token: t}, nil
	}
	return nil, &Denial{Code: codes.Unauthenticated, Reason: acl.ReasonNoToken,
		Msg: fmt.Sprintf("GetACLSelf: this call carries no ACL token; %s", tokenHint())}
}

func (sv *Server) ApplyACLPolicy(ctx context.Context, req *apiaryv1.ApplyACLPolicyRequest) (*apiaryv1.ApplyACLPolicyResponse, error) {
	if err := sv.management(ctx, "ApplyACLPolicy"); err != nil {
		return nil, err
	}
	if err := sv.s.ApplyPolicy(ctx, req.GetPolicy()); err != nil {
		return nil, err
	}
	return &apiaryv1.ApplyACLPolicyResponse{Regions: []string{sv.s.cfg.Region}}, nil
}

func (sv *Server) ListACLPolicies(ctx context.Context, _ *apiaryv1.ListACLPoliciesRequest) (*apiaryv1.ListACLPoliciesResponse, error) {
	if err := sv.management(ctx, "ListACLPolicies"); err != nil {
		return nil, err
	}
	ps, err := sv.s.ListPolicies(ctx)
	if err != nil {
		return nil, err
	}
	return &apiaryv1.ListACLPoliciesResponse{Policies: ps}, nil
}

func (sv *Server) DeleteACLPolicy(ctx context.Context, req *apiaryv1.DeleteACLPolicyRequest) (*apiaryv1.DeleteACLPolicyResponse, error) {
	if err := sv.management(ctx, "DeleteACLPolicy"); err != nil {
		return nil, err
	}
	if err := sv.s.DeletePolicy(ctx, req.GetName()); err != nil {
		return nil, err
	}
	return &apiaryv1.DeleteACLPolicyResponse{Regions: []string{sv.s.cfg.Region}}, nil
}

// Off is the ACLService of a region that runs without ACLs: every method
// answers FAILED_PRECONDITION "ACLs are off in region R (start its
// coordinators with --acl)".
type Off struct {
	apiaryv1.UnimplementedACLServiceServer
	Region string
}

func (o Off) err() error {
	return status.Errorf(codes.FailedPrecondition, "ACLs are off in region %s (start its coordinators with --acl)", o.Region)
}

func (o Off) BootstrapACL(context.Context, *apiaryv1.BootstrapACLRequest) (*apiaryv1.BootstrapACLResponse, error) {
	return nil, o.err()
}

func (o Off) CreateACLToken(context.Context, *apiaryv1.CreateACLTokenRequest) (*apiaryv1.CreateACLTokenResponse, error) {
	return nil, o.err()
}

func (o Off) ListACLTokens(context.Context, *apiaryv1.ListACLTokensRequest) (*apiaryv1.ListACLTokensResponse, error) {
	return nil, o.err()
}

func (o Off) RevokeACLToken(context.Context, *apiaryv1.RevokeACLTokenRequest) (*apiaryv1.RevokeACLTokenResponse, error) {
	return nil, o.err()
}

func (o Off) GetACLSelf(context.Context, *apiaryv1.GetACLSelfRequest) (*apiaryv1.GetACLSelfResponse, error) {
	return nil, o.err()
}

func (o Off) ApplyACLPolicy(context.Context, *apiaryv1.ApplyACLPolicyRequest) (*apiaryv1.ApplyACLPolicyResponse, error) {
	return nil, o.err()
}

func (o Off) ListACLPolicies(context.Context, *apiaryv1.ListACLPoliciesRequest) (*apiaryv1.ListACLPoliciesResponse, error) {
	return nil, o.err()
}

func (o Off) DeleteACLPolicy(context.Context, *apiaryv1.DeleteACLPolicyRequest) (*apiaryv1.DeleteACLPolicyResponse, error) {
	return nil, o.err()
}
