package regional

// GetJobTrace and ExportSpans: a job's trace read over the API from the
// coordinators' in-memory span buffers (telemetry.SpanStore), which also
// hold the spans the region's agents ship to them. See
// docs/observability.md, "apiary trace".

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/telemetry"
)

// peerTraceTimeout bounds the question to each peer coordinator.
const peerTraceTimeout = 3 * time.Second

// GetJobTrace answers from this coordinator's span buffer and, unless
// req.LocalOnly, from every other member of the region (asked in parallel,
// each for at most peerTraceTimeout; one that does not answer is named in
// Unavailable). It does not read the job: a job with no buffered spans
// gets an empty answer.
func (s *jobServer) GetJobTrace(ctx context.Context, req *apiaryv1.GetJobTraceRequest) (*apiaryv1.GetJobTraceResponse, error) {
	c := s.c
	if _, err := c.checkJobID(req.GetJobId()); err != nil {
		return nil, err
	}
	out := &apiaryv1.GetJobTraceResponse{}
	if st := telemetry.StoreOf(c.cfg.TracerProvider); st != nil {
		out.SpansJsonl = st.JobJSONLines(req.GetJobId())
	} else {
		out.NotRecording = append(out.NotRecording, "coordinator "+c.cfg.ID)
	}
	if req.GetLocalOnly() {
		return out, nil
	}
	cctx, cancel := etcdCtx(ctx)
	resp, err := c.cli.Get(cctx, prefMembers, clientv3.WithPrefix())
	cancel()
	if err != nil {
		out.Unavailable = append(out.Unavailable, fmt.Sprintf("region %s's other coordinators: listing them: %v", c.meta.Region, err))
		return out, nil
	}
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	for _, kv := range resp.Kvs {
		var m memberRecord
		if json.Unmarshal(kv.Value, &m) != nil || m.ID == c.cfg.ID || m.APIAddr == "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := askPeerTrace(ctx, c.peerDialOption(), m.APIAddr, req.GetJobId())
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				out.Unavailable = append(out.Unavailable, fmt.Sprintf("coordinator %s at %s: %s", m.ID, m.APIAddr, status.Convert(err).Message()))
				return
			}
			out.SpansJsonl = append(out.SpansJsonl, r.GetSpansJsonl()...)
			out.NotRecording = append(out.NotRecording, r.GetNotRecording()...)
		}()
	}
	wg.Wait()
	return out, nil
}

// askPeerTrace asks the coordinator at addr for its own spans of jobID,
// dialing with creds (Coordinator.peerDialOption).
func askPeerTrace(ctx context.Context, creds grpc.DialOption, addr, jobID string) (*apiaryv1.GetJobTraceResponse, error) {
	cc, err := grpc.NewClient(addr, creds)
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(ctx, peerTraceTimeout)
	defer cancel()
	return apiaryv1.NewJobServiceClient(cc).GetJobTrace(ctx, &apiaryv1.GetJobTraceRequest{JobId: jobID, LocalOnly: true},
		grpc.MaxCallRecvMsgSize(64<<20))
}

// ExportSpans keeps an agent's shipped spans in the span buffer (dropped
// when the coordinator keeps none).
func (s *agentServer) ExportSpans(_ context.Context, req *apiaryv1.ExportSpansRequest) (*apiaryv1.ExportSpansResponse, error) {
	st := telemetry.StoreOf(s.c.cfg.TracerProvider)
	if st == nil {
		return &apiaryv1.ExportSpansResponse{}, nil
	}
	return &apiaryv1.ExportSpansResponse{Kept: int32(st.AddJSONLines(req.GetSpansJsonl()))}, nil
}
