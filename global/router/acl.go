package router

// ACLService on the router: tokens and policies are kept by each region
// (regional/aclstore) and the router keeps nothing, so one token works in
// every region only because the router sends the same accessor and secret
// to every region (Nomad's ACL system replicates global tokens from its
// authoritative region instead; here every region is told at once). Every
// call carries the caller's token (call, acl.ForwardToken): the regions
// decide who may do it.

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/acl"
	"apiary.dev/apiary/internal/federation"
)

// aclServer is the router's ACLService.
type aclServer struct {
	apiaryv1.UnimplementedACLServiceServer
	r *Router
}

// fillIDs checks the ids a caller chose (each must be a UUID in canonical
// form, acl.ValidateID) and makes the missing ones (acl.NewID). It returns
// INVALID_ARGUMENT naming the field.
func fillIDs(accessor, secret *string) error {
	for _, f := range []struct {
		name string
		v    *string
	}{{"accessor_id", accessor}, {"secret_id", secret}} {
		if *f.v == "" {
			*f.v = acl.NewID()
		} else if err := acl.ValidateID(f.name, *f.v); err != nil {
			return status.Error(codes.InvalidArgument, err.Error())
		}
	}
	return nil
}

// writeResult is what one ACL write did in each region it was sent to.
type writeResult struct {
	ok   []string         // regions that took it, sorted
	errs map[string]error // regions that did not, and why
	// answers holds each region's response (for the fields only a region
	// knows: a token's create time, the node a revocation ended).
	answers map[string]any
}

func (w writeResult) failed() []string {
	out := make([]string, 0, len(w.errs))
	for name := range w.errs {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// failures are "region: why" per region that did not take the write.
func (w writeResult) failures() []string {
	var out []string
	for _, name := range w.failed() {
		out = append(out, name+": "+status.Convert(w.errs[name]).Message())
	}
	return out
}

// allFailed is the error of a write no region took: a denial of the
// caller when any region denied it (denialCode), else the regions' common
// code when they all answered with the same one (the same bad request),
// else UNAVAILABLE; the message names every region and why.
func (w writeResult) allFailed(what string) error {
	if len(w.errs) == 0 {
		return status.Errorf(codes.Unavailable, "%s: no region is known to the router yet (is it joined to the WAN pool?)", what)
	}
	code := codes.Unknown
	for _, err := range w.errs {
		c := status.Code(err)
		if code == codes.Unknown {
			code = c
		} else if code != c {
			code = codes.Unavailable
		}
	}
	switch code {
	case codes.DeadlineExceeded, codes.Canceled, codes.Unknown, codes.Internal:
		code = codes.Unavailable
	}
	if c, denied := denialCode(w.errs); denied {
		code = c
	}
	return status.Errorf(code, "%s: no region took it: %s", what, strings.Join(w.failures(), "; "))
}

// denialCode is the code of a write that a region refused for the caller
// (a retry does not change that, whatever the other regions answered):
// PERMISSION_DENIED when any region said so (the token is known there and
// may not do it), else UNAUTHENTICATED when any region did (no token, or
// one it does not know); denied is false when no region denied the
// caller.
func denialCode(errs map[string]error) (code codes.Code, denied bool) {
	for _, err := range errs {
		switch status.Code(err) {
		case codes.PermissionDenied:
			return codes.PermissionDenied, true
		case codes.Unauthenticated:
			code, denied = codes.Unauthenticated, true
		}
	}
	return code, denied
}

// writeAll sends one ACL write to each of regions in parallel (a region
// that is down fails at once, naming why) and collects the answers.
func (s *aclServer) writeAll(ctx context.Context, regions []federation.Region, what string,
	fn func(ctx context.Context, c apiaryv1.ACLServiceClient) (any, error)) writeResult {
	res := writeResult{errs: map[string]error{}, answers: map[string]any{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, reg := range regions {
		if !reg.Up {
			res.errs[reg.Name] = status.Errorf(codes.Unavailable, "region is down: %s", reg.DownReason)
			continue
		}
		wg.Go(func() {
			var answer any
			err := s.r.call(ctx, reg, func(ctx context.Context, cc *grpc.ClientConn) error {
				var err error
				answer, err = fn(ctx, apiaryv1.NewACLServiceClient(cc))
				return err
			})
			if err == errNoCoordinator {
				err = status.Error(codes.Unavailable, "no coordinator answering")
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				s.r.log.Warn(what+": region did not take it", "region", reg.Name, "err", err)
				res.errs[reg.Name] = err
				return
			}
			res.ok = append(res.ok, reg.Name)
			res.answers[reg.Name] = answer
		})
	}
	wg.Wait()
	sort.Strings(res.ok)
	return res
}

// BootstrapACL creates the first management token in every region the
// router knows, with the same accessor and secret everywhere (made here
// when the request leaves them empty). It answers the token, the regions
// that took it and those that did not ("region: why"). A partial bootstrap
// (a region down or failing) is safe to repeat with the same accessor and
// secret: the regions that took it answer the repeat as a success, the
// others take it. Errors: INVALID_ARGUMENT for an id that is not a UUID;
// when no region took it, the regions' common code (ALREADY_EXISTS: every
// region was bootstrapped before, with other ids) or UNAVAILABLE, naming
// every region.
func (s *aclServer) BootstrapACL(ctx context.Context, req *apiaryv1.BootstrapACLRequest) (*apiaryv1.BootstrapACLResponse, error) {
	fwd := &apiaryv1.BootstrapACLRequest{AccessorId: req.GetAccessorId(), SecretId: req.GetSecretId()}
	if err := fillIDs(&fwd.AccessorId, &fwd.SecretId); err != nil {
		return nil, err
	}
	res := s.writeAll(ctx, s.r.cfg.View.Regions(), "acl bootstrap", func(ctx context.Context, c apiaryv1.ACLServiceClient) (any, error) {
		return c.BootstrapACL(ctx, fwd)
	})
	if len(res.ok) == 0 {
		err := res.allFailed("acl bootstrap")
		if st := status.Convert(err); st.Code() != codes.AlreadyExists && len(res.errs) > 0 {
			return nil, status.Errorf(st.Code(), "%s; repeating the bootstrap is safe (with the same ids, accessor %s, or new ones)",
				st.Message(), fwd.GetAccessorId())
		}
		return nil, err
	}
	tok := &apiaryv1.ACLToken{AccessorId: fwd.GetAccessorId(), SecretId: fwd.GetSecretId(), Type: acl.TypeManagement}
	if a, ok := res.answers[res.ok[0]].(*apiaryv1.BootstrapACLResponse); ok && a.GetToken() != nil {
		tok = a.GetToken()
		// The secret is the one sent: a region's answer to a repeat may
		// leave it out.
		tok.AccessorId, tok.SecretId = fwd.GetAccessorId(), fwd.GetSecretId()
	}
	if len(res.errs) > 0 {
		s.r.log.Warn("acl bootstrap: partial; repeat it with the same accessor and secret once the regions that failed answer",
			"accessor", fwd.GetAccessorId(), "regions", res.ok, "failed", res.failures())
	}
	return &apiaryv1.BootstrapACLResponse{Token: tok, Regions: res.ok, FailedRegions: res.failures()}, nil
}

// CreateACLToken makes a token in every region the router knows (an agent
// token only in its region), with the same accessor and secret everywhere
// (made here when the request leaves them empty). All or nothing: every
// target region must be up before anything is sent (else UNAVAILABLE
// naming the regions that are down), and when a region does not take it,
// the token is revoked in the regions that took it (or may have) and the
// answer names the failed regions: PERMISSION_DENIED (or UNAUTHENTICATED)
// when any region denied the caller's token, whatever the others
// answered; else UNAVAILABLE, unless every failed region refused it
// outright and alike (their common code: INVALID_ARGUMENT for a policy a
// region lacks), which a retry would not change. Errors before anything
// is sent: INVALID_ARGUMENT for a bad type, an agent token without a
// region or naming a region the router does not know, a negative ttl, or
// an id that is not a UUID; with a target region down, the refusal an up
// region gives the caller's token (mayAdminister), else UNAVAILABLE
// naming the regions that are down.
func (s *aclServer) CreateACLToken(ctx context.Context, req *apiaryv1.CreateACLTokenRequest) (*apiaryv1.CreateACLTokenResponse, error) {
	fwd := &apiaryv1.CreateACLTokenRequest{Name: req.GetName(), Type: req.GetType(), Policies: req.GetPolicies(), Region: req.GetRegion(),
		NodeId: req.GetNodeId(), TtlMs: req.GetTtlMs(), AccessorId: req.GetAccessorId(), SecretId: req.GetSecretId()}
	switch fwd.GetType() {
	case "", acl.TypeClient, acl.TypeManagement, acl.TypeAgent:
	default:
		return nil, status.Errorf(codes.InvalidArgument, "type: must be %s, %s or %s, got %q", acl.TypeClient, acl.TypeManagement, acl.TypeAgent, fwd.GetType())
	}
	if fwd.GetTtlMs() < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "ttl_ms: must be >= 0 (0: never expires), got %d", fwd.GetTtlMs())
	}
	if err := fillIDs(&fwd.AccessorId, &fwd.SecretId); err != nil {
		return nil, err
	}
	targets := s.r.cfg.View.Regions()
	if fwd.GetType() == acl.TypeAgent {
		if fwd.GetRegion() == "" {
			return nil, status.Error(codes.InvalidArgument, "region: required for an agent token (the region the node may join)")
		}
		reg, ok := s.r.regionByName(fwd.GetRegion())
		if !ok {
			return nil, status.Errorf(codes.InvalidArgument, "region: %q is not a region of the federation (known: %s)",
				fwd.GetRegion(), strings.Join(regionNames(targets), ", "))
		}
		targets = []federation.Region{reg}
	}
	if len(targets) == 0 {
		return nil, status.Error(codes.Unavailable, "acl token create: no region is known to the router yet (is it joined to the WAN pool?)")
	}
	var down []string
	for _, reg := range targets {
		if !reg.Up {
			down = append(down, reg.Name+": "+reg.DownReason)
		}
	}
	if len(down) > 0 {
		// Nothing may be sent, so no region judges the token by making
		// it: ask one that is up whether the caller may.
		if err := s.mayAdminister(ctx, "acl token create"); err != nil {
			return nil, err
		}
		sort.Strings(down)
		return nil, status.Errorf(codes.Unavailable, "acl token create: a token is made in every region or none, and these are down (nothing was sent): %s",
			strings.Join(down, "; "))
	}
	res := s.writeAll(ctx, targets, "acl token create", func(ctx context.Context, c apiaryv1.ACLServiceClient) (any, error) {
		return c.CreateACLToken(ctx, fwd)
	})
	if len(res.errs) > 0 {
		return nil, s.rollback(ctx, fwd.GetAccessorId(), targets, res)
	}
	tok := &apiaryv1.ACLToken{AccessorId: fwd.GetAccessorId(), SecretId: fwd.GetSecretId(), Name: fwd.GetName(), Type: fwd.GetType(),
		Policies: fwd.GetPolicies(), Region: fwd.GetRegion(), NodeId: fwd.GetNodeId()}
	if a, ok := res.answers[res.ok[0]].(*apiaryv1.CreateACLTokenResponse); ok && a.GetToken() != nil {
		tok = a.GetToken()
		tok.AccessorId, tok.SecretId = fwd.GetAccessorId(), fwd.GetSecretId()
	}
	return &apiaryv1.CreateACLTokenResponse{Token: tok, Regions: res.ok}, nil
}

// mayAdminister asks the regions that are up who the caller's token is
// (GetACLSelf, the region's judgement of the token) and returns the
// refusal a region would give an ACL write: the region's own denial
// (UNAUTHENTICATED: no, unknown or expired token), or PERMISSION_DENIED
// for a token that is not a management token (every ACL write needs one,
// docs/security.md). nil when the token is a management token or no
// region answered: the router refuses earlier than a region would, never
// admits what a region would refuse.
func (s *aclServer) mayAdminister(ctx context.Context, what string) error {
	self, err := s.GetACLSelf(ctx, &apiaryv1.GetACLSelfRequest{})
	if err != nil {
		if isDenial(err) {
			return err
		}
		return nil
	}
	if t := self.GetToken(); t.GetType() != acl.TypeManagement {
		return status.Errorf(codes.PermissionDenied, "permission denied: %s needs a management token; ACL token %s (%s) is not one",
			what, t.GetAccessorId(), t.GetType())
	}
	return nil
}

// rollback revokes a token that not every target region took, in every
// target region but those that refused it outright (a region whose answer
// was lost may hold it), and returns the error of the create.
func (s *aclServer) rollback(ctx context.Context, accessor string, targets []federation.Region, res writeResult) error {
	var undo []federation.Region
	for _, reg := range targets {
		err, failed := res.errs[reg.Name]
		if !failed || !refusedOutright(err) {
			undo = append(undo, reg)
		}
	}
	// The caller may have given up; the revocation must still be made.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*s.r.cfg.AttemptTimeout)
	defer cancel()
	rev := s.writeAll(rctx, undo, "acl token create: revoke after a partial create", func(ctx context.Context, c apiaryv1.ACLServiceClient) (any, error) {
		return c.RevokeACLToken(ctx, &apiaryv1.RevokeACLTokenRequest{AccessorId: accessor})
	})
	var left []string
	for _, name := range rev.failed() {
		if status.Code(rev.errs[name]) != codes.NotFound {
			left = append(left, name+": "+status.Convert(rev.errs[name]).Message())
		}
	}
	// UNAVAILABLE (worth a retry) unless a region denied the caller
	// (denialCode) or every region that failed gave a definitive answer
	// (their common code: INVALID_ARGUMENT for a policy a region lacks),
	// which no retry changes.
	code := codes.Unavailable
	if c, denied := denialCode(res.errs); denied {
		code = c
	} else if allRefusedOutright(res) {
		failedOnly := writeResult{errs: res.errs}
		code = status.Code(failedOnly.allFailed("acl token create"))
	}
	msg := fmt.Sprintf("acl token create: not made (a token is made in every region or none); failed in %s", strings.Join(res.failures(), "; "))
	if len(left) > 0 {
		msg += fmt.Sprintf("; revoking it again FAILED in %s: revoke it there with `apiary acl token revoke %s`", strings.Join(left, "; "), accessor)
	} else if len(undo) > 0 {
		msg += fmt.Sprintf("; revoked again in %s", strings.Join(regionNames(undo), ", "))
	}
	return status.Error(code, msg)
}

// refusedOutright reports whether a region's error means it did not make
// the token: it refused the caller or the request before writing.
func refusedOutright(err error) bool {
	switch status.Code(err) {
	case codes.PermissionDenied, codes.Unauthenticated, codes.InvalidArgument, codes.AlreadyExists,
		codes.NotFound, codes.FailedPrecondition:
		return true
	}
	return notSent(err)
}

func allRefusedOutright(res writeResult) bool {
	for _, err := range res.errs {
		if !refusedOutright(err) {
			return false
		}
	}
	return true
}

func regionNames(regions []federation.Region) []string {
	out := make([]string, len(regions))
	for i, reg := range regions {
		out[i] = reg.Name
	}
	sort.Strings(out)
	return out
}

// removeAll sends a deletion to every region the router knows. A region
// that does not hold the object (NOT_FOUND) counts as done: a repeat after
// a partial deletion finishes it. Errors: NOT_FOUND when no region holds
// it; when no region took it, as writeResult.allFailed.
func (s *aclServer) removeAll(ctx context.Context, what, object string,
	fn func(ctx context.Context, c apiaryv1.ACLServiceClient) (any, error)) (writeResult, error) {
	res := s.writeAll(ctx, s.r.cfg.View.Regions(), what, fn)
	missing := 0
	for name, err := range res.errs {
		if status.Code(err) == codes.NotFound {
			missing++
			delete(res.errs, name)
			res.ok = append(res.ok, name)
		}
	}
	sort.Strings(res.ok)
	if missing > 0 && missing == len(res.ok) && len(res.errs) == 0 {
		return res, status.Errorf(codes.NotFound, "%s: no region holds %s", what, object)
	}
	if len(res.ok) == 0 {
		return res, res.allFailed(what)
	}
	return res, nil
}

// RevokeACLToken deletes the token in every region the router knows; an
// agent token's node loses its epoch in its region. It answers the regions
// where the token is gone and those that failed ("region: why"; repeat the
// revocation once they answer). Errors: INVALID_ARGUMENT without an
// accessor, NOT_FOUND when no region holds it, and as ApplyACLPolicy when
// no region took it.
func (s *aclServer) RevokeACLToken(ctx context.Context, req *apiaryv1.RevokeACLTokenRequest) (*apiaryv1.RevokeACLTokenResponse, error) {
	if req.GetAccessorId() == "" {
		return nil, status.Error(codes.InvalidArgument, "accessor_id: is required")
	}
	res, err := s.removeAll(ctx, "acl token revoke", "token "+req.GetAccessorId(), func(ctx context.Context, c apiaryv1.ACLServiceClient) (any, error) {
		return c.RevokeACLToken(ctx, req)
	})
	if err != nil {
		return nil, err
	}
	out := &apiaryv1.RevokeACLTokenResponse{Regions: res.ok, FailedRegions: res.failures()}
	for _, name := range res.ok {
		if a, ok := res.answers[name].(*apiaryv1.RevokeACLTokenResponse); ok && a.GetEndedNodeId() != "" {
			out.EndedNodeId = a.GetEndedNodeId()
		}
	}
	return out, nil
}

// ApplyACLPolicy creates or replaces the policy in every region the router
// knows, and answers the regions that took it and those that did not
// ("region: why"; apply it again once they answer). Errors:
// INVALID_ARGUMENT without a policy or its name; when no region took it,
// PERMISSION_DENIED or UNAUTHENTICATED when a region denied the caller,
// else the regions' common code (INVALID_ARGUMENT) or UNAVAILABLE, naming
// every region (writeResult.allFailed).
func (s *aclServer) ApplyACLPolicy(ctx context.Context, req *apiaryv1.ApplyACLPolicyRequest) (*apiaryv1.ApplyACLPolicyResponse, error) {
	if req.GetPolicy().GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "policy.name: is required")
	}
	res := s.writeAll(ctx, s.r.cfg.View.Regions(), "acl policy apply", func(ctx context.Context, c apiaryv1.ACLServiceClient) (any, error) {
		return c.ApplyACLPolicy(ctx, req)
	})
	if len(res.ok) == 0 {
		return nil, res.allFailed("acl policy apply")
	}
	return &apiaryv1.ApplyACLPolicyResponse{Regions: res.ok, FailedRegions: res.failures()}, nil
}

// DeleteACLPolicy deletes the policy in every region the router knows
// (answers and errors as RevokeACLToken).
func (s *aclServer) DeleteACLPolicy(ctx context.Context, req *apiaryv1.DeleteACLPolicyRequest) (*apiaryv1.DeleteACLPolicyResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name: is required")
	}
	res, err := s.removeAll(ctx, "acl policy delete", "policy "+req.GetName(), func(ctx context.Context, c apiaryv1.ACLServiceClient) (any, error) {
		return c.DeleteACLPolicy(ctx, req)
	})
	if err != nil {
		return nil, err
	}
	return &apiaryv1.DeleteACLPolicyResponse{Regions: res.ok, FailedRegions: res.failures()}, nil
}

// ListACLTokens asks every region and merges by accessor (the same token
// is in every region), sorted by name then accessor; regions that did not
// answer are named in unavailable_regions. A region's refusal of the
// caller is the answer, even when other regions answered
// (fanResult.refused).
func (s *aclServer) ListACLTokens(ctx context.Context, req *apiaryv1.ListACLTokensRequest) (*apiaryv1.ListACLTokensResponse, error) {
	seen := map[string]bool{}
	out := &apiaryv1.ListACLTokensResponse{}
	res := s.r.fanOutEach(ctx, s.r.cfg.View.Regions(), "acl token list", func(ctx context.Context, _ federation.Region, cc *grpc.ClientConn) (func(), error) {
		resp, err := apiaryv1.NewACLServiceClient(cc).ListACLTokens(ctx, req)
		return func() {
			for _, t := range resp.GetTokens() {
				if !seen[t.GetAccessorId()] {
					seen[t.GetAccessorId()] = true
					out.Tokens = append(out.Tokens, t)
				}
			}
		}, err
	})
	if err := res.refused(); err != nil {
		return nil, err
	}
	out.UnavailableRegions = res.failed()
	sort.Slice(out.Tokens, func(a, b int) bool {
		if x, y := out.Tokens[a].GetName(), out.Tokens[b].GetName(); x != y {
			return x < y
		}
		return out.Tokens[a].GetAccessorId() < out.Tokens[b].GetAccessorId()
	})
	return out, nil
}

// ListACLPolicies asks every region and merges by name, sorted; regions
// that did not answer are named in unavailable_regions. A region's refusal
// of the caller is the answer, even when other regions answered
// (fanResult.refused).
func (s *aclServer) ListACLPolicies(ctx context.Context, req *apiaryv1.ListACLPoliciesRequest) (*apiaryv1.ListACLPoliciesResponse, error) {
	seen := map[string]bool{}
	out := &apiaryv1.ListACLPoliciesResponse{}
	res := s.r.fanOutEach(ctx, s.r.cfg.View.Regions(), "acl policy list", func(ctx context.Context, _ federation.Region, cc *grpc.ClientConn) (func(), error) {
		resp, err := apiaryv1.NewACLServiceClient(cc).ListACLPolicies(ctx, req)
		return func() {
			for _, p := range resp.GetPolicies() {
				if !seen[p.GetName()] {
					seen[p.GetName()] = true
					out.Policies = append(out.Policies, p)
				}
			}
		}, err
	})
	if err := res.refused(); err != nil {
		return nil, err
	}
	out.UnavailableRegions = res.failed()
	sort.Slice(out.Policies, func(a, b int) bool { return out.Policies[a].GetName() < out.Policies[b].GetName() })
	return out, nil
}

// GetACLSelf asks one region that answers (the caller's token is the same
// in every region): regions that are up are tried in name order, moving on
// only while nothing answers. Errors: the region's (UNAUTHENTICATED for an
// unknown token), or UNAVAILABLE when no region answers.
func (s *aclServer) GetACLSelf(ctx context.Context, req *apiaryv1.GetACLSelfRequest) (*apiaryv1.GetACLSelfResponse, error) {
	regions := slices.Clone(s.r.cfg.View.Regions())
	sort.Slice(regions, func(a, b int) bool { return regions[a].Name < regions[b].Name })
	var tried []string
	for _, reg := range regions {
		if !reg.Up {
			tried = append(tried, reg.Name+": down: "+reg.DownReason)
			continue
		}
		var resp *apiaryv1.GetACLSelfResponse
		err := s.r.call(ctx, reg, func(ctx context.Context, cc *grpc.ClientConn) error {
			var err error
			resp, err = apiaryv1.NewACLServiceClient(cc).GetACLSelf(ctx, req)
			return err
		})
		if err == nil {
			return resp, nil
		}
		if c := status.Code(err); c != codes.Unavailable && c != codes.DeadlineExceeded || ctx.Err() != nil {
			return nil, err
		}
		tried = append(tried, reg.Name+": "+status.Convert(err).Message())
	}
	if len(tried) == 0 {
		return nil, status.Error(codes.Unavailable, "acl token self: no region is known to the router yet (is it joined to the WAN pool?)")
	}
	return nil, status.Errorf(codes.Unavailable, "acl token self: no region answered: %s", strings.Join(tried, "; "))
}
