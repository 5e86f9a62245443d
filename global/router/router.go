// Package router is the global tier's JobService, AdminService (ListRegions,
// and the node commands sent to the region that has the node) and
// ACLService: a stateless router in front of the regions.
//
// SubmitJob: the eligible regions are those whose labels match the job's
// region selector, minus those the sovereignty policy forbids, minus those
// that are down (registry), minus those whose largest node is smaller than a
// task. They are tried best first (route.go). A job no region may run is
// refused with FAILED_PRECONDITION and a PreconditionFailure detail naming
// every region and why (selector, policy, down, capacity, refused).
//
// Retry rules, chosen so the router never makes a second job:
//   - nothing was sent (connection refused, no coordinator answering): try
//     the region's next coordinator, then the next eligible region;
//   - the region refused before accepting (FAILED_PRECONDITION, e.g. its own
//     policy re-check or a task that fits none of its nodes;
//     RESOURCE_EXHAUSTED, its backlog bound): try the next eligible region;
//   - the outcome is unknown (the request was sent and the call failed with
//     UNAVAILABLE, DEADLINE_EXCEEDED, ...): retry the SAME region with the
//     same client and request id, whose dedup key returns the job if the
//     first attempt committed. The router remembers (client id, request id)
//     → region for StickyTTL, so a client's own retry goes to that region
//     too, never elsewhere. A request without ids gets ids from the router.
//
// Job ids carry their region (internal/ids.RegionOf), so GetJob, CancelJob,
// WatchJob and GetJobLogs go to that region without a lookup. ListJobs fans
// out to every known region and lists the regions that did not answer.
//
// ACL tokens (Nomad's ACL system; internal/acl): the router checks no token
// and holds none. Every call it makes to a region on a caller's behalf
// (forwarded calls, fan-outs, a submission's retries and idempotency
// lookups) carries the caller's own token (acl.ForwardToken, in call), so
// each region decides with its own tokens and policies and the router never
// widens what a caller may do; a fan-out in which any region denied the
// caller answers with that denial, naming the region (never as an
// unavailable region), and the router's own span buffer is shown only
// with a region's successful answer (GetJobTrace). Its one call for no caller, the region
// list read while routing a keyed submission (withPeerView), carries no
// token and is marked acl.Internal. ACLService (acl.go) fans token and
// policy writes out to every region with the same ids.
package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/acl"
	"apiary.dev/apiary/internal/cliconn"
	"apiary.dev/apiary/internal/federation"
	"apiary.dev/apiary/internal/ids"
	"apiary.dev/apiary/internal/jobspec"
	"apiary.dev/apiary/internal/sovereignty"
	"apiary.dev/apiary/internal/telemetry"
)

// View is what the router needs of the region registry.
type View interface {
	Regions() []federation.Region
	Conn(addr string) (*grpc.ClientConn, error)
	MarkFailed(addr string)
}

// Config configures a Router.
type Config struct {
	View View
	// Policy is the sovereignty policy (nil: a job's jurisdiction must equal
	// the region's).
	Policy *sovereignty.Policy
	Logger *slog.Logger
	// AttemptTimeout bounds one forwarded call (default 5 s).
	AttemptTimeout time.Duration
	// StickyTTL is how long an unknown outcome pins a request id to its
	// region (default 10 min).
	StickyTTL time.Duration
	// Tracer makes the job.route span (nil: no tracing).
	Tracer trace.TracerProvider
	// Metrics registers apiary_router_* metrics (nil: none).
	Metrics prometheus.Registerer
}

// routerMetrics are the router's Prometheus metrics.
type routerMetrics struct {
	submissions *prometheus.CounterVec // outcome, region
	latency     prometheus.Histogram
}

func newRouterMetrics(reg prometheus.Registerer) *routerMetrics {
	m := &routerMetrics{
		submissions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "apiary_router_submissions_total",
			Help: "SubmitJob calls through the router by outcome (routed, refused, error) and region (routed only)."}, []string{"outcome", "region"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "apiary_router_submit_seconds",
			Help: "Time to route and forward one SubmitJob.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
	}
	if reg != nil {
		reg.MustRegister(m.submissions, m.latency)
	}
	return m
}

// Router serves JobService and AdminService.ListRegions.
type Router struct {
	apiaryv1.UnimplementedJobServiceServer
	cfg Config
	log *slog.Logger

	metrics *routerMetrics

	mu     sync.Mutex
	sticky map[string]stickyEntry
}

type stickyEntry struct {
	region string
	at     time.Time
}

// New returns a router.
func New(cfg Config) (*Router, error) {
	if cfg.View == nil {
		return nil, errors.New("router: View is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.AttemptTimeout <= 0 {
		cfg.AttemptTimeout = 5 * time.Second
	}
	if cfg.StickyTTL <= 0 {
		cfg.StickyTTL = 10 * time.Minute
	}
	return &Router{cfg: cfg, log: cfg.Logger, sticky: map[string]stickyEntry{}, metrics: newRouterMetrics(cfg.Metrics)}, nil
}

// Register registers JobService, AdminService and ACLService (acl.go) on s.
func (r *Router) Register(s *grpc.Server) {
	apiaryv1.RegisterJobServiceServer(s, r)
	apiaryv1.RegisterAdminServiceServer(s, &adminServer{r: r})
	apiaryv1.RegisterACLServiceServer(s, &aclServer{r: r})
}

// outcome classifies a failed forwarded call.
type outcome int

const (
	outFinal   outcome = iota // return the error to the client as is
	outNotSent                // nothing reached the region: try elsewhere
	outRefused                // the region refused before accepting: next region
	outUnknown                // sent, result unknown: retry the same region
)

func classify(err error, ctx context.Context) outcome {
	st := status.Convert(err)
	switch st.Code() {
	case codes.InvalidArgument, codes.AlreadyExists, codes.PermissionDenied, codes.Unauthenticated, codes.NotFound:
		return outFinal
	case codes.FailedPrecondition, codes.ResourceExhausted, codes.OutOfRange:
		return outRefused
	case codes.Unavailable:
		if notSent(err) {
			return outNotSent
		}
	case codes.Canceled:
		if ctx.Err() != nil {
			return outFinal
		}
	}
	return outUnknown
}

// notSent recognises a forwarded call that never left the router, by type,
// never by message text (a region may relay another hop's "connection
// refused" in an answer, and that call did reach it): no connection to the
// coordinator could be opened (cliconn.NotConnected, from the connection's
// state), the region has no coordinator answering, or the connection could
// not be made at all.
func notSent(err error) bool {
	var ns *notSentError
	return cliconn.NotConnected(err) || errors.Is(err, errNoCoordinator) || errors.As(err, &ns)
}

// notSentError marks an error of a call that was never sent.
type notSentError struct{ err error }

func (e *notSentError) Error() string              { return e.err.Error() }
func (e *notSentError) Unwrap() error              { return e.err }
func (e *notSentError) GRPCStatus() *status.Status { return status.Convert(e.err) }

var errNoCoordinator = status.Error(codes.Unavailable, "no coordinator answering")

// call runs fn against the region's answering coordinators until one takes
// the call: it moves on to the next coordinator only when nothing was sent.
// fn's context carries the token of ctx's incoming call (acl.ForwardToken):
// every call the router makes on a caller's behalf goes through here.
func (r *Router) call(ctx context.Context, region federation.Region, fn func(ctx context.Context, cc *grpc.ClientConn) error) error {
	addrs := region.Addrs()
	if len(addrs) == 0 {
		return errNoCoordinator
	}
	var last error
	for _, a := range addrs {
		cc, err := r.cfg.View.Conn(a)
		if err != nil {
			last = &notSentError{status.Errorf(codes.Unavailable, "error while dialing %s: %v", a, err)}
			continue
		}
		actx, cancel := context.WithTimeout(ctx, r.cfg.AttemptTimeout)
		// The caller's token, never one of the router's own: the region
		// judges the caller (see the package doc, "ACL tokens").
		err = fn(acl.ForwardToken(ctx, actx), cc)
		cancel()
		if err == nil {
			return nil
		}
		last = err
		if classify(err, ctx) != outNotSent {
			return err
		}
		r.cfg.View.MarkFailed(a)
	}
	return last
}

func stickyKey(client, req string) string { return client + "\x00" + req }

func (r *Router) stickyRegion(key string) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.sticky[key]
	if ok && time.Since(e.at) > r.cfg.StickyTTL {
		delete(r.sticky, key)
		return "", false
	}
	return e.region, ok
}

func (r *Router) setSticky(key, region string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if len(r.sticky) > 10000 {
		for k, e := range r.sticky {
			if now.Sub(e.at) > r.cfg.StickyTTL {
				delete(r.sticky, k)
			}
		}
	}
	r.sticky[key] = stickyEntry{region: region, at: now}
}

// SubmitJob routes a job to the best eligible region (see the package doc).
func (r *Router) SubmitJob(ctx context.Context, req *apiaryv1.SubmitJobRequest) (resp *apiaryv1.SubmitJobResponse, err error) {
	start := time.Now()
	tr := telemetry.Tracer(telemetry.OrNoop(r.cfg.Tracer))
	if tp := req.GetTraceparent(); tp != "" {
		ctx = telemetry.ContextWithTraceparent(ctx, tp)
	}
	ctx, span := tr.Start(ctx, telemetry.SpanRoute, trace.WithSpanKind(trace.SpanKindServer))
	if req.GetTraceparent() == "" && span.SpanContext().IsValid() {
		// The route span starts the job's trace; the region stores it.
		req = proto.Clone(req).(*apiaryv1.SubmitJobRequest)
		req.Traceparent = telemetry.SpanTraceparent(span)
	}
	defer func() {
		outcome, region := "routed", ""
		switch {
		case err != nil && status.Code(err) == codes.FailedPrecondition:
			outcome = "refused"
		case err != nil:
			outcome = "error"
		default:
			region = resp.GetRegion()
			span.SetAttributes(telemetry.AttrRegion.String(region), telemetry.AttrJobID.String(resp.GetJobId()))
		}
		if err != nil {
			telemetry.RecordError(span, err)
		}
		span.End()
		r.metrics.submissions.WithLabelValues(outcome, region).Inc()
		r.metrics.latency.Observe(time.Since(start).Seconds())
	}()
	if req.GetSpec() == nil {
		return nil, status.Error(codes.InvalidArgument, "spec: is required")
	}
	spec, err := jobspec.Prepare(req.GetSpec())
	if err != nil {
		return nil, err
	}
	req = proto.Clone(req).(*apiaryv1.SubmitJobRequest)
	keyed := (req.GetClientId() != "" || req.GetRequestId() != "") && !req.GetEphemeralRequestId()
	if req.GetClientId() == "" && req.GetRequestId() == "" {
		// The router's own retries must be idempotent too.
		req.ClientId, req.RequestId = "router", ids.NewJobID("req", time.Now())
	}
	key := stickyKey(req.GetClientId(), req.GetRequestId())
	regions := r.cfg.View.Regions()
	if err := r.checkValues(spec, regions); err != nil {
		return nil, err
	}
	if name, ok := r.stickyRegion(key); ok {
		for _, reg := range regions {
			if reg.Name == name {
				return r.submitSame(ctx, reg, req, key)
			}
		}
		return nil, status.Errorf(codes.Unavailable, "request %s was sent to region %s with an unknown outcome and that region is gone from the pool; retry later with the same request id", req.GetRequestId(), name)
	}
	if keyed {
		return r.submitKeyed(ctx, req, spec, regions, key)
	}
	eligible, excluded := federation.Eligible(regions, r.cfg.Policy, spec)
	exhausted := false
	for _, reg := range eligible {
		resp, err := r.submitTo(ctx, reg, req)
		if err == nil {
			return resp, nil
		}
		switch classify(err, ctx) {
		case outFinal:
			return nil, err
		case outNotSent:
			excluded = append(excluded, federation.Exclusion{Region: reg.Name, Kind: federation.KindDown, Detail: "no coordinator took the call: " + status.Convert(err).Message()})
		case outRefused:
			exhausted = exhausted || status.Code(err) == codes.ResourceExhausted
			excluded = append(excluded, federation.Exclusion{Region: reg.Name, Kind: federation.KindRefused, Detail: status.Convert(err).Message()})
		case outUnknown:
			r.setSticky(key, reg.Name)
			r.log.Warn("submission outcome unknown; retrying the same region", "region", reg.Name, "request_id", req.GetRequestId(), "err", err)
			return r.submitSame(ctx, reg, req, key)
		}
	}
	return nil, refusal(spec, regions, excluded, exhausted)
}

// checkValues refuses, before anything is sent, values no part of the
// federation knows: a jurisdiction or data class the sovereignty policy does
// not declare, and a region.prefer name that is no region of the pool (a typo
// there would silently lose the preference).
func (r *Router) checkValues(spec *apiaryv1.JobSpec, regions []federation.Region) error {
	if r.cfg.Policy != nil {
		if err := r.cfg.Policy.CheckValues(spec.GetJurisdiction(), spec.GetDataClass()); err != nil {
			return status.Error(codes.InvalidArgument, err.Error())
		}
	}
	known := make([]string, 0, len(regions))
	for _, reg := range regions {
		known = append(known, reg.Name)
	}
	sort.Strings(known)
	for i, p := range spec.GetRegion().GetPrefer() {
		if !slices.Contains(known, p) {
			return status.Errorf(codes.InvalidArgument, "region.prefer[%d]: %q is not a region of the federation (known: %s)", i, p, strings.Join(known, ", "))
		}
	}
	return nil
}

// submitTo sends a submission to one region.
func (r *Router) submitTo(ctx context.Context, reg federation.Region, req *apiaryv1.SubmitJobRequest) (*apiaryv1.SubmitJobResponse, error) {
	var resp *apiaryv1.SubmitJobResponse
	err := r.call(ctx, reg, func(ctx context.Context, cc *grpc.ClientConn) error {
		var err error
		resp, err = apiaryv1.NewJobServiceClient(cc).SubmitJob(ctx, req)
		return err
	})
	return resp, err
}

// submitSame retries a submission in one region (same request id) until it
// has an answer or ctx ends.
func (r *Router) submitSame(ctx context.Context, reg federation.Region, req *apiaryv1.SubmitJobRequest, key string) (*apiaryv1.SubmitJobResponse, error) {
	var last error
	for n := 0; ; n++ {
		if cur, ok := r.regionByName(reg.Name); ok {
			reg = cur
		}
		resp, err := r.submitTo(ctx, reg, req)
		if err == nil {
			return resp, nil
		}
		last = err
		if o := classify(err, ctx); o == outFinal || o == outRefused {
			return nil, err
		}
		wait := min(100*time.Millisecond<<min(n, 4), time.Second)
		select {
		case <-ctx.Done():
			return nil, status.Errorf(codes.Unavailable,
				"submission to region %s has an unknown outcome (%s); retry with the same request id: it will go to %s again and never create a second job",
				reg.Name, status.Convert(last).Message(), reg.Name)
		case <-time.After(wait):
		}
	}
}

func (r *Router) regionByName(name string) (federation.Region, bool) {
	for _, reg := range r.cfg.View.Regions() {
		if reg.Name == name {
			return reg, true
		}
	}
	return federation.Region{}, false
}

// refusal builds the structured error for a job no region took.
func refusal(spec *apiaryv1.JobSpec, regions []federation.Region, ex []federation.Exclusion, exhausted bool) error {
	sort.SliceStable(ex, func(a, b int) bool { return ex[a].Region < ex[b].Region })
	if len(regions) == 0 {
		return status.Error(codes.Unavailable, "no region is known to the router yet (is it joined to the WAN pool?)")
	}
	// "Up" is the problem when every region that selector and policy allow
	// is down (and there is at least one such region).
	allowedDown, allowedOther := 0, 0
	for _, e := range ex {
		switch e.Kind {
		case federation.KindDown:
			allowedDown++
		case federation.KindSelector, federation.KindPolicy:
		default:
			allowedOther++
		}
	}
	onlyDown := allowedDown > 0 && allowedOther == 0
	code := codes.FailedPrecondition
	head := fmt.Sprintf("no eligible region for job %q", spec.GetName())
	switch {
	case exhausted:
		code = codes.ResourceExhausted
		head = fmt.Sprintf("every eligible region refused job %q for now (backlog bound reached)", spec.GetName())
	case onlyDown:
		head = fmt.Sprintf("no eligible region up for job %q", spec.GetName())
	}
	pf := &errdetails.PreconditionFailure{}
	lines := []string{head + ":"}
	for _, e := range ex {
		pf.Violations = append(pf.Violations, &errdetails.PreconditionFailure_Violation{Type: e.Kind, Subject: "region " + e.Region, Description: e.Kind + ": " + e.Detail})
		lines = append(lines, fmt.Sprintf("  region %s: %s: %s", e.Region, e.Kind, e.Detail))
	}
	st := status.New(code, strings.Join(lines, "\n"))
	d, err := st.WithDetails(pf)
	if err == nil && exhausted {
		d, err = d.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(2 * time.Second)})
	}
	if err == nil {
		st = d
	}
	return st.Err()
}

// regionOf routes by the region prefix of a job id.
func (r *Router) regionOf(jobID string) (federation.Region, error) {
	if jobID == "" {
		return federation.Region{}, status.Error(codes.InvalidArgument, "job_id: is required")
	}
	name := ids.RegionOf(jobID)
	if name == "" {
		return federation.Region{}, status.Errorf(codes.InvalidArgument, "job_id: %q is not an apiary job id (<region>-<20 chars>)", jobID)
	}
	reg, ok := r.regionByName(name)
	if !ok {
		return federation.Region{}, status.Errorf(codes.NotFound, "job %s not found: region %s is not in the WAN pool", jobID, name)
	}
	if !reg.Up {
		return federation.Region{}, status.Errorf(codes.Unavailable, "region %s of job %s is down: %s", name, jobID, reg.DownReason)
	}
	return reg, nil
}

// activeRegion is the region that runs job jobID now: the region of its id,
// unless the job failed over (regional/failover). When the id's region
// answers that the job MOVED, the region it names; when the id's region is
// down, the first other up region that holds the job (asked with GetJob),
// else regionOf's error.
func (r *Router) activeRegion(ctx context.Context, jobID string) (federation.Region, error) {
	home, err := r.regionOf(jobID)
	if err == nil {
		var resp *apiaryv1.GetJobResponse
		gerr := r.call(ctx, home, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
			resp, err = apiaryv1.NewJobServiceClient(cc).GetJob(acl.ForwardToken(ctx, ctx), &apiaryv1.GetJobRequest{JobId: jobID})
			return err
		})
		if gerr == nil && resp.GetJob().GetState() == apiaryv1.JobState_JOB_STATE_MOVED {
			if to, ok := r.regionByName(resp.GetJob().GetFailover().GetActiveRegion()); ok && to.Up {
				return to, nil
			}
		}
		return home, nil
	}
	if status.Code(err) != codes.Unavailable {
		return home, err
	}
	for _, reg := range r.cfg.View.Regions() {
		if !reg.Up || reg.Name == ids.RegionOf(jobID) {
			continue
		}
		ferr := r.call(ctx, reg, func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := apiaryv1.NewJobServiceClient(cc).GetJob(acl.ForwardToken(ctx, ctx), &apiaryv1.GetJobRequest{JobId: jobID})
			return err
		})
		if ferr == nil {
			return reg, nil
		}
	}
	return home, err
}

// unary forwards an idempotent call about one job to the region running it
// (activeRegion). A region that does not answer is UNAVAILABLE naming the
// region and the job.
func (r *Router) unary(ctx context.Context, jobID string, fn func(ctx context.Context, c apiaryv1.JobServiceClient) error) error {
	reg, err := r.activeRegion(ctx, jobID)
	if err != nil {
		return err
	}
	return r.unaryAt(ctx, reg, jobID, fn)
}

// unaryAt makes the call of unary in region reg.
func (r *Router) unaryAt(ctx context.Context, reg federation.Region, jobID string, fn func(ctx context.Context, c apiaryv1.JobServiceClient) error) error {
	err := r.call(ctx, reg, func(ctx context.Context, cc *grpc.ClientConn) error {
		return fn(ctx, apiaryv1.NewJobServiceClient(cc))
	})
	if err == errNoCoordinator {
		return status.Errorf(codes.Unavailable, "region %s of job %s: no coordinator answering", reg.Name, jobID)
	}
	if err != nil && status.Code(err) == codes.Unavailable {
		return withPrefix(err, fmt.Sprintf("region %s of job %s: ", reg.Name, jobID))
	}
	return err
}

// withPrefix returns err's status (code and details kept) with prefix
// before its message.
func withPrefix(err error, prefix string) error {
	p := status.Convert(err).Proto()
	p.Message = prefix + p.GetMessage()
	return status.FromProto(p).Err()
}

// forwardJob makes one unary JobService call about req's job in the job's
// region (see unary).
func forwardJob[Req interface{ GetJobId() string }, Resp any](ctx context.Context, r *Router, req Req,
	method func(apiaryv1.JobServiceClient, context.Context, Req, ...grpc.CallOption) (Resp, error), opts ...grpc.CallOption) (Resp, error) {
	var resp Resp
	err := r.unary(ctx, req.GetJobId(), func(ctx context.Context, c apiaryv1.JobServiceClient) (err error) {
		resp, err = method(c, ctx, req, opts...)
		return err
	})
	return resp, err
}

// GetJob forwards to the job's region; a job that failed over is answered
// by the region running it now (see activeRegion), which names its home in
// failover.home_region.
func (r *Router) GetJob(ctx context.Context, req *apiaryv1.GetJobRequest) (*apiaryv1.GetJobResponse, error) {
	home, err := r.regionOf(req.GetJobId())
	if err != nil {
		return forwardJob(ctx, r, req, apiaryv1.JobServiceClient.GetJob) // the home is down: activeRegion looks further
	}
	get := func(reg federation.Region) (resp *apiaryv1.GetJobResponse, err error) {
		err = r.unaryAt(ctx, reg, req.GetJobId(), func(ctx context.Context, c apiaryv1.JobServiceClient) (err error) {
			resp, err = c.GetJob(ctx, req)
			return err
		})
		return resp, err
	}
	resp, err := get(home)
	if err != nil || resp.GetJob().GetState() != apiaryv1.JobState_JOB_STATE_MOVED {
		return resp, err
	}
	if to, ok := r.regionByName(resp.GetJob().GetFailover().GetActiveRegion()); ok && to.Up {
		if moved, err := get(to); err == nil {
			return moved, nil
		}
	}
	return resp, nil // the active region does not answer: the home's MOVED view
}

// CancelJob forwards to the job's region (cancel is idempotent).
func (r *Router) CancelJob(ctx context.Context, req *apiaryv1.CancelJobRequest) (*apiaryv1.CancelJobResponse, error) {
	return forwardJob(ctx, r, req, apiaryv1.JobServiceClient.CancelJob)
}

// GetJobLogs forwards to the job's region.
func (r *Router) GetJobLogs(ctx context.Context, req *apiaryv1.GetJobLogsRequest) (*apiaryv1.GetJobLogsResponse, error) {
	return forwardJob(ctx, r, req, apiaryv1.JobServiceClient.GetJobLogs, grpc.MaxCallRecvMsgSize(64<<20))
}

// WatchJob proxies the job region's stream.
func (r *Router) WatchJob(req *apiaryv1.WatchJobRequest, stream apiaryv1.JobService_WatchJobServer) error {
	ctx := stream.Context()
	reg, err := r.activeRegion(ctx, req.GetJobId())
	if err != nil {
		return err
	}
	var last error = errNoCoordinator
	for _, a := range reg.Addrs() {
		cc, err := r.cfg.View.Conn(a)
		if err != nil {
			continue
		}
		up, err := apiaryv1.NewJobServiceClient(cc).WatchJob(acl.ForwardToken(ctx, ctx), req)
		if err != nil {
			last = err
			continue
		}
		sent := false
		for {
			m, err := up.Recv()
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				// A watch is a read: before anything was relayed, any
				// UNAVAILABLE may try the next coordinator.
				if !sent && status.Code(err) == codes.Unavailable {
					r.cfg.View.MarkFailed(a)
					last = err
					break
				}
				return err
			}
			sent = true
			if err := stream.Send(m); err != nil {
				return err
			}
		}
	}
	return last
}

// ListJobs fans out to every region and merges, newest first. Each region
// lists only what the caller's token may read (the namespace filter is
// the region's to apply). Errors: INVALID_ARGUMENT from the router itself
// for a limit outside 0..10000 or a namespace filter that is no namespace
// ("*" included: "" lists every namespace the caller may read); a region's
// refusal of the caller or the request (fanResult.refused), never
// reported as an unavailable region.
func (r *Router) ListJobs(ctx context.Context, req *apiaryv1.ListJobsRequest) (*apiaryv1.ListJobsResponse, error) {
	limit := int(req.GetLimit())
	if limit < 0 || limit > 10000 {
		return nil, status.Errorf(codes.InvalidArgument, "limit: must be in 0..10000, got %d", limit)
	}
	if ns := req.GetNamespace(); ns != "" {
		if err := acl.ValidateNamespace(ns); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "%v; leave it empty to list every namespace the token may read", err)
		}
	}
	if err := ids.CheckPageToken(req.GetPageToken()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if limit == 0 {
		limit = 100
	}
	var pages []*apiaryv1.ListJobsResponse
	res := r.fanOutEach(ctx, r.cfg.View.Regions(), "list jobs", func(ctx context.Context, _ federation.Region, cc *grpc.ClientConn) (func(), error) {
		resp, err := apiaryv1.NewJobServiceClient(cc).ListJobs(ctx, req, grpc.MaxCallRecvMsgSize(64<<20))
		return func() { pages = append(pages, resp) }, err
	})
	if err := res.refused(); err != nil {
		// A region refused the caller (no token, or none that may read
		// the namespace asked for) or the request.
		return nil, err
	}
	out := mergeJobPages(pages, limit)
	out.UnavailableRegions = res.failed()
	return out, nil
}

// mergeJobPages merges the regions' pages of one ListJobs call into the
// federation's page of at most limit jobs, in descending job id order, as
// each region pages. A region's next_page_token is the last id it looked
// at (a region's page may end early, with fewer than limit jobs or none:
// ListJobsResponse), so the region has said nothing yet of the ids below
// it: the federation's page stops at the highest token, and its token is
// that one (every region lists the ids below it again on the next call),
// or the page's last id when limit cut it first.
func mergeJobPages(pages []*apiaryv1.ListJobsResponse, limit int) *apiaryv1.ListJobsResponse {
	out := &apiaryv1.ListJobsResponse{}
	cut := ""
	for _, p := range pages {
		out.Jobs = append(out.Jobs, p.GetJobs()...)
		cut = max(cut, p.GetNextPageToken())
	}
	sort.Slice(out.Jobs, func(a, b int) bool { return out.Jobs[a].GetId() > out.Jobs[b].GetId() })
	if cut != "" {
		n := sort.Search(len(out.Jobs), func(i int) bool { return out.Jobs[i].GetId() < cut })
		out.Jobs, out.NextPageToken = out.Jobs[:n], cut
	}
	if len(out.Jobs) > limit {
		out.Jobs = out.Jobs[:limit]
		out.NextPageToken = out.Jobs[limit-1].GetId()
	}
	return out
}

// adminServer serves ListRegions from the registry view, and ListNodes
// (admin.go) by asking every region.
type adminServer struct {
	apiaryv1.UnimplementedAdminServiceServer
	r *Router
}

// ListRegions answers from the router's view of the WAN pool, once the
// regions have let the caller read it: the view is the router's, the right
// to read it a region's to judge (with ACLs on, a token whose policies
// grant node read; internal/acl). The caller's token goes, in parallel, to
// every region that is up, as that region's own ListRegions; a denial by
// any of them is the answer (the first by region name, naming it), so the
// answer does not depend on which region is fastest. When no region
// denies (some answer, or none answers either way), the view is returned:
// an operator must be able to see that every region is down, and there
// is nothing else behind it. Each coordinator's shards_owned is what its
// WAN tags say (refreshed with them; -1 for one that publishes none).
func (s *adminServer) ListRegions(ctx context.Context, _ *apiaryv1.ListRegionsRequest) (*apiaryv1.ListRegionsResponse, error) {
	regions := s.r.cfg.View.Regions()
	if err := s.r.regionsAdmit(ctx, regions); err != nil {
		return nil, err
	}
	out := &apiaryv1.ListRegionsResponse{}
	for _, reg := range regions {
		out.Regions = append(out.Regions, reg.Summary())
	}
	return out, nil
}

// regionsAdmit asks every region of regions that is up for its own
// ListRegions with the caller's token, in parallel (fanOutEach), and
// returns the first denial (PERMISSION_DENIED, UNAUTHENTICATED) by region
// name, naming the region; nil when no region denied the caller.
func (r *Router) regionsAdmit(ctx context.Context, regions []federation.Region) error {
	res := r.fanOutEach(ctx, regions, "list regions (may the caller read them?)", func(ctx context.Context, _ federation.Region, cc *grpc.ClientConn) (func(), error) {
		_, err := apiaryv1.NewAdminServiceClient(cc).ListRegions(ctx, &apiaryv1.ListRegionsRequest{})
		return func() {}, err
	})
	return res.denied()
}
