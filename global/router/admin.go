package router

import (
	"context"
	"sort"
	"sync"

	"google.golang.org/grpc"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/federation"
)

// ListNodes asks every region of the WAN pool for its nodes (each region's
// AdminService.ListNodes, through its answering coordinators) and merges
// them, sorted by region then node id; each node carries its region. Regions
// that are down or did not answer are named in unavailable_regions, not an
// error.
func (s *adminServer) ListNodes(ctx context.Context, req *apiaryv1.ListNodesRequest) (*apiaryv1.ListNodesResponse, error) {
	out := &apiaryv1.ListNodesResponse{}
	out.UnavailableRegions = s.r.fanOut(ctx, "list nodes", func(ctx context.Context, reg federation.Region, cc *grpc.ClientConn) (func(), error) {
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
	sort.Slice(out.Nodes, func(a, b int) bool {
		if x, y := out.Nodes[a].GetRegion(), out.Nodes[b].GetRegion(); x != y {
			return x < y
		}
		return out.Nodes[a].GetId() < out.Nodes[b].GetId()
	})
	return out, nil
}

// fanOut calls fn on every region that is up, in parallel (through call, so
// a dead coordinator is skipped), and applies each answer's merge function
// one at a time. It returns the regions that are down or did not answer,
// sorted; what is the caller's to log names the call (what).
func (r *Router) fanOut(ctx context.Context, what string, fn func(ctx context.Context, reg federation.Region, cc *grpc.ClientConn) (merge func(), err error)) []string {
	var unavailable []string
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, reg := range r.cfg.View.Regions() {
		if !reg.Up {
			unavailable = append(unavailable, reg.Name)
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
				r.log.Warn(what+": region did not answer", "region", reg.Name, "err", err)
				unavailable = append(unavailable, reg.Name)
				return
			}
			merge()
		}()
	}
	wg.Wait()
	sort.Strings(unavailable)
	return unavailable
}
