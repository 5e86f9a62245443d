package router

import (
	"context"
	"sort"
	"sync"

	"google.golang.org/grpc"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

// ListNodes asks every region of the WAN pool for its nodes (each region's
// AdminService.ListNodes, through its answering coordinators) and merges
// them, sorted by region then node id; each node carries its region. Regions
// that are down or did not answer are named in unavailable_regions, not an
// error.
func (s *adminServer) ListNodes(ctx context.Context, req *apiaryv1.ListNodesRequest) (*apiaryv1.ListNodesResponse, error) {
	out := &apiaryv1.ListNodesResponse{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, reg := range s.r.cfg.View.Regions() {
		if !reg.Up {
			out.UnavailableRegions = append(out.UnavailableRegions, reg.Name)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var resp *apiaryv1.ListNodesResponse
			err := s.r.call(ctx, reg, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
				resp, err = apiaryv1.NewAdminServiceClient(cc).ListNodes(ctx, req, grpc.MaxCallRecvMsgSize(64<<20))
				return err
			})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				s.r.log.Warn("list nodes: region did not answer", "region", reg.Name, "err", err)
				out.UnavailableRegions = append(out.UnavailableRegions, reg.Name)
				return
			}
			for _, n := range resp.GetNodes() {
				if n.Region == "" {
					n.Region = reg.Name
				}
				out.Nodes = append(out.Nodes, n)
			}
		}()
	}
	wg.Wait()
	sort.Strings(out.UnavailableRegions)
	sort.Slice(out.Nodes, func(a, b int) bool {
		if x, y := out.Nodes[a].GetRegion(), out.Nodes[b].GetRegion(); x != y {
			return x < y
		}
		return out.Nodes[a].GetId() < out.Nodes[b].GetId()
	})
	return out, nil
}
