package router

import (
	"context"
	"sort"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/federation"
)

// ListNodes asks every region of the WAN pool for its nodes (each region's
// AdminService.ListNodes, through its answering coordinators) and merges
// them, sorted by region then node id; each node carries its region. Regions
// that are down or did not answer are named in unavailable_regions, not an
// error; a region's refusal of the caller or the request is the answer
// (fanResult.refused).
func (s *adminServer) ListNodes(ctx context.Context, req *apiaryv1.ListNodesRequest) (*apiaryv1.ListNodesResponse, error) {
	out := &apiaryv1.ListNodesResponse{}
	res := s.r.fanOutEach(ctx, s.r.cfg.View.Regions(), "list nodes", func(ctx context.Context, reg federation.Region, cc *grpc.ClientConn) (func(), error) {
		resp, err := apiaryv1.NewAdminServiceClient(cc).ListNodes(ctx, req, grpc.MaxCallRecvMsgSize(64<<20))
		return func() {
			for _, n := range resp.GetNodes() {
				if n.Region == "" {
					n.Region = reg.Name
				}
				out.Nodes = append(out.Nodes, n)
			}
		}, err
	})
	if err := res.refused(); err != nil {
		return nil, err
	}
	out.UnavailableRegions = res.failed()
	sort.Slice(out.Nodes, func(a, b int) bool {
		if x, y := out.Nodes[a].GetRegion(), out.Nodes[b].GetRegion(); x != y {
			return x < y
		}
		return out.Nodes[a].GetId() < out.Nodes[b].GetId()
	})
	return out, nil
}

// fanOutTo calls fn on every one of regions that is up, in parallel (through
// call, so a dead coordinator is skipped), and applies each answer's merge
// function one at a time. It returns the regions that are down or did not
// answer, sorted; a region that did not answer is logged with what names
// the call.
func (r *Router) fanOutTo(ctx context.Context, regions []federation.Region, what string, fn func(ctx context.Context, reg federation.Region, cc *grpc.ClientConn) (merge func(), err error)) []string {
	return r.fanOutEach(ctx, regions, what, fn).failed()
}

// fanResult is what a fan-out learned of each region.
type fanResult struct {
	ok   []string         // regions that answered, sorted
	errs map[string]error // every other region: why (a down region: UNAVAILABLE naming it)
}

// failed returns the regions that did not answer, sorted.
func (f fanResult) failed() []string {
	out := make([]string, 0, len(f.errs))
	for name := range f.errs {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// failures returns "region: why" for every region that did not answer,
// sorted by region.
func (f fanResult) failures() []string {
	out := make([]string, 0, len(f.errs))
	for _, name := range f.failed() {
		out = append(out, name+": "+status.Convert(f.errs[name]).Message())
	}
	return out
}

// denied returns the first (by region name) ACL denial (PERMISSION_DENIED
// or UNAUTHENTICATED) of a fan-out, its message prefixed with "region R:
// ", or nil. Any region's denial is the answer, even when other regions
// answered: a caller a region refused is told so (its token is unknown
// there, say, as ACL state is per region), never that the region is
// unavailable, and an answer that leaves a refusing region out would
// depend on which regions happen to know the token.
func (f fanResult) denied() error {
	for _, name := range f.failed() {
		if isDenial(f.errs[name]) {
			return withPrefix(f.errs[name], "region "+name+": ")
		}
	}
	return nil
}

// refused is denied, else the first (by region name) INVALID_ARGUMENT of
// a region (a request the region refuses is no unavailable region), else
// nil.
func (f fanResult) refused() error {
	if err := f.denied(); err != nil {
		return err
	}
	for _, name := range f.failed() {
		if status.Code(f.errs[name]) == codes.InvalidArgument {
			return withPrefix(f.errs[name], "region "+name+": ")
		}
	}
	return nil
}

// isDenial reports whether err is a region's ACL (or certificate) refusal.
func isDenial(err error) bool {
	c := status.Code(err)
	return c == codes.PermissionDenied || c == codes.Unauthenticated
}

// fanOutEach calls fn on every one of regions that is up, in parallel
// (through call, so a dead coordinator is skipped, with the caller's
// token), applies each answer's merge function one at a time, and returns
// which regions answered and why the others did not. A region that did
// not answer is logged with what names the call (at DEBUG when it denied
// the caller: that is the caller's business, not the operator's).
func (r *Router) fanOutEach(ctx context.Context, regions []federation.Region, what string, fn func(ctx context.Context, reg federation.Region, cc *grpc.ClientConn) (merge func(), err error)) fanResult {
	res := fanResult{errs: map[string]error{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, reg := range regions {
		if !reg.Up {
			res.errs[reg.Name] = status.Errorf(codes.Unavailable, "region %s is down: %s", reg.Name, reg.DownReason)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var merge func()
			err := r.call(ctx, reg, func(ctx context.Context, cc *grpc.ClientConn) error {
				var err error
				merge, err = fn(ctx, reg, cc)
				return err
			})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if err == errNoCoordinator {
					err = status.Errorf(codes.Unavailable, "region %s: no coordinator answering", reg.Name)
				}
				if isDenial(err) {
					r.log.Debug(what+": region denied the caller", "region", reg.Name, "err", err)
				} else {
					r.log.Warn(what+": region did not answer", "region", reg.Name, "err", err)
				}
				res.errs[reg.Name] = err
				return
			}
			res.ok = append(res.ok, reg.Name)
			merge()
		}()
	}
	wg.Wait()
	sort.Strings(res.ok)
	return res
}

// QuarantineNode sends the quarantine to the one region that has the node
// (found by asking every region, as ListNodes does). Errors: NOT_FOUND when
// no region has it, UNAVAILABLE when none of the regions that answered has
// it and some did not answer, FAILED_PRECONDITION when several regions have
// a node of that id (send it to the region's address instead), and the
// region's own errors.
func (s *adminServer) QuarantineNode(ctx context.Context, req *apiaryv1.QuarantineNodeRequest) (*apiaryv1.QuarantineNodeResponse, error) {
	return toNodeRegion(ctx, s, req.GetNodeId(), func(ctx context.Context, c apiaryv1.AdminServiceClient) (*apiaryv1.QuarantineNodeResponse, error) {
		return c.QuarantineNode(ctx, req)
	})
}

// ReleaseNode sends the release to the one region that has the node; errors
// as QuarantineNode.
func (s *adminServer) ReleaseNode(ctx context.Context, req *apiaryv1.ReleaseNodeRequest) (*apiaryv1.ReleaseNodeResponse, error) {
	return toNodeRegion(ctx, s, req.GetNodeId(), func(ctx context.Context, c apiaryv1.AdminServiceClient) (*apiaryv1.ReleaseNodeResponse, error) {
		return c.ReleaseNode(ctx, req)
	})
}

// DrainNode sends the drain to the one region that has the node; errors as
// QuarantineNode.
func (s *adminServer) DrainNode(ctx context.Context, req *apiaryv1.DrainNodeRequest) (*apiaryv1.DrainNodeResponse, error) {
	return toNodeRegion(ctx, s, req.GetNodeId(), func(ctx context.Context, c apiaryv1.AdminServiceClient) (*apiaryv1.DrainNodeResponse, error) {
		return c.DrainNode(ctx, req)
	})
}

// SetNodeEligibility sends the change to the one region that has the node;
// errors as QuarantineNode.
func (s *adminServer) SetNodeEligibility(ctx context.Context, req *apiaryv1.SetNodeEligibilityRequest) (*apiaryv1.SetNodeEligibilityResponse, error) {
	return toNodeRegion(ctx, s, req.GetNodeId(), func(ctx context.Context, c apiaryv1.AdminServiceClient) (*apiaryv1.SetNodeEligibilityResponse, error) {
		return c.SetNodeEligibility(ctx, req)
	})
}

// toNodeRegion makes an admin call on the one region that has node id (see
// nodeRegion) and names that region in the answer's node.
func toNodeRegion[R interface{ GetNode() *apiaryv1.Node }](ctx context.Context, s *adminServer, id string,
	call func(context.Context, apiaryv1.AdminServiceClient) (R, error)) (R, error) {
	var resp R
	reg, err := s.nodeRegion(ctx, id)
	if err != nil {
		return resp, err
	}
	err = s.r.call(ctx, reg, func(ctx context.Context, cc *grpc.ClientConn) error {
		var err error
		resp, err = call(ctx, apiaryv1.NewAdminServiceClient(cc))
		return err
	})
	if err == nil {
		if n := resp.GetNode(); n != nil && n.Region == "" {
			n.Region = reg.Name
		}
	}
	return resp, err
}

// nodeRegion asks every region for its nodes and returns the one region
// that has a node of this id (errors: see QuarantineNode).
func (s *adminServer) nodeRegion(ctx context.Context, id string) (federation.Region, error) {
	var found []federation.Region
	res := s.r.fanOutEach(ctx, s.r.cfg.View.Regions(), "find node", func(ctx context.Context, reg federation.Region, cc *grpc.ClientConn) (func(), error) {
		resp, err := apiaryv1.NewAdminServiceClient(cc).ListNodes(ctx, &apiaryv1.ListNodesRequest{}, grpc.MaxCallRecvMsgSize(64<<20))
		return func() {
			for _, n := range resp.GetNodes() {
				if n.GetId() == id {
					found = append(found, reg)
					return
				}
			}
		}, err
	})
	if err := res.refused(); err != nil {
		return federation.Region{}, err
	}
	unavailable := res.failed()
	switch {
	case len(found) == 1:
		return found[0], nil
	case len(found) > 1:
		names := make([]string, len(found))
		for i, reg := range found {
			names[i] = reg.Name
		}
		sort.Strings(names)
		return federation.Region{}, status.Errorf(codes.FailedPrecondition,
			"node_id: node %s is in several regions (%s); send the command to that region's coordinators (--addr)", id, strings.Join(names, ", "))
	case len(unavailable) > 0:
		return federation.Region{}, status.Errorf(codes.Unavailable,
			"node_id: node %s is in none of the regions that answered; these did not: %s", id, strings.Join(unavailable, ", "))
	}
	return federation.Region{}, status.Errorf(codes.NotFound, "node_id: node %s: no such node in any region", id)
}
