package router

// GetJobTrace through the router: the job's region's answer (its
// coordinators' span buffers, which hold the agents' spans) plus this
// router's own buffer (its job.route span).

import (
	"context"

	"google.golang.org/grpc"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/telemetry"
)

// GetJobTrace forwards to the job's region and adds the spans of this
// router's buffer. The router's spans of a job (its trace id, job id,
// region, timings) are returned only with the region's successful answer
// to the caller's own call, because only the region judges the caller's
// token (the router checks none): when the region refuses the caller
// (PERMISSION_DENIED, UNAUTHENTICATED), the job id is malformed
// (INVALID_ARGUMENT) or the region does not answer (UNAVAILABLE naming
// the region), that error is the answer and nothing of the router's
// buffer is. Another router replica's job.route span is not asked for:
// only the router that routed the job holds it.
func (r *Router) GetJobTrace(ctx context.Context, req *apiaryv1.GetJobTraceRequest) (*apiaryv1.GetJobTraceResponse, error) {
	fwd := &apiaryv1.GetJobTraceRequest{JobId: req.GetJobId()}
	resp, err := forwardJob(ctx, r, fwd, apiaryv1.JobServiceClient.GetJobTrace, grpc.MaxCallRecvMsgSize(64<<20))
	if err != nil {
		return nil, err
	}
	if st := telemetry.StoreOf(r.cfg.Tracer); st != nil {
		resp.SpansJsonl = append(resp.SpansJsonl, st.JobJSONLines(req.GetJobId())...)
	} else {
		resp.NotRecording = append(resp.NotRecording, "the global router")
	}
	return resp, nil
}
