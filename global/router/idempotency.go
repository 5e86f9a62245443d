package router

import (
	"context"
	"fmt"
	"hash/fnv"
	"sort"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/acl"
	"apiary.dev/apiary/internal/federation"
	"apiary.dev/apiary/internal/ids"
	"apiary.dev/apiary/internal/jobspec"
)

// Idempotency across regions (docs/architecture.md, "Idempotency across
// regions"). A submission that carries the client's own (client id, request
// id) has a home region: of the regions that the job's region selector and
// the sovereignty policy allow, up or down, the one with the highest
// rendezvous score for the pair (Thaler and Ravishankar's highest random
// weight, so a region joining or leaving moves only the keys it gains or
// held). Every router replica computes the same home from the same pool, and
// the home region's dedup key is the request's one source of truth:
//
//   - home answers: it made the job, or finds it (deduplicated), or tells
//     where it forwarded the request before, and the router follows;
//   - home refused to run it itself (FAILED_PRECONDITION, RESOURCE_EXHAUSTED,
//     after checking its dedup key): the router asks home to record, once,
//     a forward to the best other eligible region (ForwardRequest), then
//     submits there; that region's answer, refusal included, is final;
//   - home does not answer (nothing could be sent): the outcome is unknown,
//     since home holds or may hold the request; the client is told to retry
//     later and no job is made anywhere else;
//   - a call sent with an unknown result: retried in the same region (the
//     region's dedup key returns the job if the first attempt committed).

// homeRegion returns the candidate with the highest rendezvous score for the
// request (ties, which need a 64-bit collision, break by name).
func homeRegion(cands []federation.Region, clientID, requestID string) federation.Region {
	var best federation.Region
	var bestScore uint64
	for i, c := range cands {
		s := rendezvousScore(clientID, requestID, c.Name)
		if i == 0 || s > bestScore || (s == bestScore && c.Name < best.Name) {
			best, bestScore = c, s
		}
	}
	return best
}

func rendezvousScore(clientID, requestID, region string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(clientID))
	h.Write([]byte{0})
	h.Write([]byte(requestID))
	h.Write([]byte{0})
	h.Write([]byte(region))
	// FNV's low bits mix poorly for inputs that differ only at the end:
	// finish with a 64-bit mixer (splitmix64's).
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// homeCandidates are the regions a keyed request's home is chosen from:
// those the selector and the policy allow, whether up, down or too small
// right now, so that the home does not move while a region is down.
func homeCandidates(eligible []federation.Region, excluded []federation.Exclusion, regions []federation.Region) []federation.Region {
	out := append([]federation.Region(nil), eligible...)
	for _, e := range excluded {
		if e.Kind != federation.KindDown && e.Kind != federation.KindCapacity {
			continue
		}
		for _, reg := range regions {
			if reg.Name == e.Region {
				out = append(out, reg)
			}
		}
	}
	return out
}

// forwardedTo reads a region's "request forwarded" refusal.
func forwardedTo(err error) (string, bool) {
	for _, d := range status.Convert(err).Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetReason() == ids.ReasonRequestForwarded && ei.GetDomain() == ids.ErrorDomain {
			if to := ei.GetMetadata()["region"]; to != "" {
				return to, true
			}
		}
	}
	return "", false
}

// unknownOutcome is the answer when the region that holds or may hold a
// request cannot be asked.
func unknownOutcome(region, requestID, why string) error {
	return status.Errorf(codes.Unavailable,
		"outcome unknown: region %s holds or may hold request %q (%s) and does not answer; retry later with the same request id: it goes to %s again and never makes a second job (a new request id would make a new job elsewhere)",
		region, requestID, why, region)
}

// submitKeyed routes a submission that carries the client's own request id
// (see the comment at the top of this file).
func (r *Router) submitKeyed(ctx context.Context, req *apiaryv1.SubmitJobRequest, spec *apiaryv1.JobSpec, regions []federation.Region, key string) (*apiaryv1.SubmitJobResponse, error) {
	regions = r.withPeerView(ctx, regions)
	eligible, excluded := federation.Eligible(regions, r.cfg.Policy, spec)
	cands := homeCandidates(eligible, excluded, regions)
	if len(cands) == 0 {
		return nil, refusal(spec, regions, excluded, false)
	}
	home := homeRegion(cands, req.GetClientId(), req.GetRequestId())
	if !home.Up {
		return nil, unknownOutcome(home.Name, req.GetRequestId(), "it is the request's home region; "+home.DownReason)
	}
	// Before home may create a job, no other region may hold the request:
	// one that was its home when the pool looked different (a region joined
	// or left, another payload or policy gave other candidates).
	if resp, err, done := r.lookupElsewhere(ctx, req, spec, key, home, regions); done {
		return resp, err
	}
	resp, err := r.submitTo(ctx, home, req)
	if err == nil {
		return resp, nil
	}
	if to, ok := forwardedTo(err); ok {
		return r.submitForwarded(ctx, req, key, home.Name, to)
	}
	switch classify(err, ctx) {
	case outFinal:
		return nil, err
	case outNotSent:
		return nil, unknownOutcome(home.Name, req.GetRequestId(), "it is the request's home region")
	case outUnknown:
		r.setSticky(key, home.Name)
		r.log.Warn("submission outcome unknown; retrying the same region", "region", home.Name, "request_id", req.GetRequestId(), "err", err)
		return r.submitSame(ctx, home, req, key)
	}
	// Home refused to run the job itself: forward the request, once, to the
	// best other eligible region.
	excluded = append(excluded, federation.Exclusion{Region: home.Name, Kind: federation.KindRefused, Detail: status.Convert(err).Message()})
	var next *federation.Region
	for i := range eligible {
		if eligible[i].Name != home.Name {
			next = &eligible[i]
			break
		}
	}
	if next == nil {
		return nil, refusal(spec, regions, excluded, status.Code(err) == codes.ResourceExhausted)
	}
	var fr *apiaryv1.ForwardRequestResponse
	ferr := r.call(ctx, home, func(ctx context.Context, cc *grpc.ClientConn) error {
		var err error
		fr, err = apiaryv1.NewJobServiceClient(cc).ForwardRequest(ctx, &apiaryv1.ForwardRequestRequest{
			ClientId: req.GetClientId(), RequestId: req.GetRequestId(), PayloadHash: jobspec.PayloadHash(spec), Region: next.Name})
		return err
	})
	if ferr != nil {
		if classify(ferr, ctx) == outFinal {
			return nil, ferr
		}
		return nil, unknownOutcome(home.Name, req.GetRequestId(), "its home region refused to run it and could not record where it goes: "+status.Convert(ferr).Message())
	}
	if fr.GetJobId() != "" {
		// Home made a job for the request after all (a concurrent
		// submission): ask home again, so it judges the repeat (token,
		// secret values) as lookupElsewhere does.
		return r.submitForwarded(ctx, req, key, home.Name, home.Name)
	}
	return r.submitForwarded(ctx, req, key, home.Name, fr.GetRegion())
}

// lookupElsewhere asks every other region that is up whether it holds the
// request (LookupRequest, in parallel, one AttemptTimeout each). done is
// true when one does: then resp/err is the answer (its job, ALREADY_EXISTS
// for another payload, or the submission followed to where it was
// forwarded). Regions that are down or do not answer are skipped: they can
// hold the request only if its home moved while they held it, the residual
// case docs/architecture.md names.
func (r *Router) lookupElsewhere(ctx context.Context, req *apiaryv1.SubmitJobRequest, spec *apiaryv1.JobSpec, key string, home federation.Region, regions []federation.Region) (*apiaryv1.SubmitJobResponse, error, bool) {
	type hit struct {
		region string
		resp   *apiaryv1.LookupRequestResponse
	}
	var hits []hit
	var others []federation.Region
	for _, reg := range regions {
		if reg.Name != home.Name {
			others = append(others, reg)
		}
	}
	r.fanOutTo(ctx, others, "idempotency lookup", func(ctx context.Context, reg federation.Region, cc *grpc.ClientConn) (func(), error) {
		lr, err := apiaryv1.NewJobServiceClient(cc).LookupRequest(ctx, &apiaryv1.LookupRequestRequest{ClientId: req.GetClientId(), RequestId: req.GetRequestId()})
		return func() {
			if lr.GetFound() {
				hits = append(hits, hit{reg.Name, lr})
			}
		}, err
	})
	if len(hits) == 0 {
		return nil, nil, false
	}
	sort.Slice(hits, func(a, b int) bool { return hits[a].region < hits[b].region })
	h := hits[0]
	if h.resp.GetPayloadHash() != jobspec.PayloadHash(spec) {
		return nil, status.Errorf(codes.AlreadyExists, "request_id: %q of client %q was already used in region %s with a different payload",
			req.GetRequestId(), req.GetClientId(), h.region), true
	}
	if h.resp.GetJobId() != "" {
		// The job is there: submit the request to that region rather than
		// answer from the lookup, so that the region judges it as it
		// judges any repeat: the caller's token must allow submitting in the
		// job's namespace (a lookup carries no token: answering from it
		// would name a job to a caller who may not see it), and secret
		// values, which the payload hash leaves out, are compared there.
		resp, err := r.submitForwarded(ctx, req, key, h.region, h.region)
		return resp, err, true
	}
	resp, err := r.submitForwarded(ctx, req, key, h.region, h.resp.GetForwardedTo())
	return resp, err, true
}

// withPeerView adds to the router's own view the regions that an answering
// coordinator's WAN member knows and this router does not (as down): a
// router started after a region failed or left never hears of it through
// serf, but the coordinators that saw it keep it for an hour (serf's
// reconnect and tombstone timeouts), and a request's home must be computed
// over the same regions by every router. The read is the router's own, not
// the caller's: it carries no token and is marked acl.Internal, which a
// region with ACLs admits from a router certificate for ListRegions only.
func (r *Router) withPeerView(ctx context.Context, regions []federation.Region) []federation.Region {
	// The router's own read, for no caller: without the caller's token
	// (call forwards the incoming one, so drop it) and marked internal.
	ctx = acl.Internal(metadata.NewIncomingContext(ctx, metadata.MD{}))
	known := map[string]bool{}
	for _, reg := range regions {
		known[reg.Name] = true
	}
	for _, reg := range regions {
		if !reg.Up {
			continue
		}
		var lr *apiaryv1.ListRegionsResponse
		err := r.call(ctx, reg, func(ctx context.Context, cc *grpc.ClientConn) error {
			var err error
			lr, err = apiaryv1.NewAdminServiceClient(cc).ListRegions(ctx, &apiaryv1.ListRegionsRequest{})
			return err
		})
		if err != nil {
			continue
		}
		for _, rs := range lr.GetRegions() {
			if known[rs.GetName()] {
				continue
			}
			known[rs.GetName()] = true
			regions = append(regions, federation.Region{Name: rs.GetName(), Jurisdiction: rs.GetJurisdiction(), Labels: rs.GetLabels(),
				DownReason: fmt.Sprintf("not in this router's view of the WAN pool; region %s's coordinators know it", reg.Name)})
		}
		return regions // one answering coordinator's view is enough
	}
	return regions
}

// submitForwarded submits a request where its home region forwarded it. That
// region's answer is final, a refusal included: the forward is never moved.
func (r *Router) submitForwarded(ctx context.Context, req *apiaryv1.SubmitJobRequest, key, home, to string) (*apiaryv1.SubmitJobResponse, error) {
	reg, ok := r.regionByName(to)
	if !ok {
		return nil, unknownOutcome(to, req.GetRequestId(), "its home region "+home+" forwarded it there, and that region is not in the pool")
	}
	resp, err := r.submitTo(ctx, reg, req)
	if err == nil {
		return resp, nil
	}
	if again, ok := forwardedTo(err); ok {
		// Only a home region forwards; two homes mean two routers saw
		// different pools. Never guess: the client retries later.
		return nil, status.Errorf(codes.Unavailable, "request %q: region %s forwarded it to %s, which forwards it to %s; the routers' views of the pool differ, retry later",
			req.GetRequestId(), home, to, again)
	}
	switch classify(err, ctx) {
	case outNotSent:
		return nil, unknownOutcome(to, req.GetRequestId(), "its home region "+home+" forwarded it there")
	case outUnknown:
		r.setSticky(key, to)
		return r.submitSame(ctx, reg, req, key)
	}
	return nil, err
}

// HomeOf names the home region of an idempotent request among the named
// candidate regions (the regions its selector and the policy allow), as
// every router computes it; "" for no candidates.
func HomeOf(candidates []string, clientID, requestID string) string {
	regs := make([]federation.Region, len(candidates))
	for i, n := range candidates {
		regs[i] = federation.Region{Name: n}
	}
	if len(regs) == 0 {
		return ""
	}
	return homeRegion(regs, clientID, requestID).Name
}
