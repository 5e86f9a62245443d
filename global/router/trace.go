package router

// GetJobTrace through the router: the job's region's answer (its
// coordinators' span buffers, which hold the agents' spans) plus this
// router's own buffer (its job.route span).

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/telemetry"
)

// GetJobTrace forwards to the job's region and adds the spans of this
// router's buffer. A region that does not answer is named in Unavailable
// (the router's own spans are still returned); a malformed job id is
// INVALID_ARGUMENT, and a region's refusal of the caller (PERMISSION_DENIED,
// UNAUTHENTICATED) is the answer, without the router's spans. Another router replica's job.route span is not asked
// for: only the router that routed the job holds it.
func (r *Router) GetJobTrace(ctx context.Context, req *apiaryv1.GetJobTraceRequest) (*apiaryv1.GetJobTraceResponse, error) {
	fwd := &apiaryv1.GetJobTraceRequest{JobId: req.GetJobId()}
	resp, err := forwardJob(ctx, r, fwd, apiaryv1.JobServiceClient.GetJobTrace, grpc.MaxCallRecvMsgSize(64<<20))
	if err != nil {
		if status.Code(err) == codes.InvalidArgument || isDenial(err) {
			// A caller the region refused gets none of the router's
			// spans of the job either.
			return nil, err
		}
		resp = &apiaryv1.GetJobTraceResponse{Unavailable: []string{status.Convert(err).Message()}}
	}
	if st := telemetry.StoreOf(r.cfg.Tracer); st != nil {
		resp.SpansJsonl = append(resp.SpansJsonl, st.JobJSONLines(req.GetJobId())...)
	} else {
		resp.NotRecording = append(resp.NotRecording, "the global router")
	}
	return resp, nil
}
