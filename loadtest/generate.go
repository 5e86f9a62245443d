package loadtest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

// Sample is one submission of an open-loop run. Latency is measured from
// Intended (the schedule), not from Sent, so a stalled system is charged for
// the submissions it delayed (coordinated omission counted).
type Sample struct {
	Seq      int
	Intended time.Time
	Sent     time.Time
	Done     time.Time
	JobID    string
	Err      string
}

// LatencyMs is Done - Intended in milliseconds.
func (s Sample) LatencyMs() float64 { return float64(s.Done.Sub(s.Intended).Microseconds()) / 1000 }

// LagMs is the generator's own lag: Sent - Intended in milliseconds.
func (s Sample) LagMs() float64 { return float64(s.Sent.Sub(s.Intended).Microseconds()) / 1000 }

// LoadOptions shape an open-loop run.
type LoadOptions struct {
	// Rate is submissions per second (> 0); Duration bounds the schedule.
	Rate     float64
	Duration time.Duration
	// Offsets, if set, is the schedule instead (trace replay): submission i
	// is intended at start + Offsets[i] (non-decreasing).
	Offsets []time.Duration
	// Spec makes the job for submission i.
	Spec func(i int) *apiaryv1.JobSpec
	// RunID prefixes request ids so runs never collide.
	RunID string
	// SubmitTimeout bounds one submission including retries of UNAVAILABLE
	// and RESOURCE_EXHAUSTED (same request id, so never a duplicate job).
	SubmitTimeout time.Duration
	// MaxInFlight bounds concurrent submissions (default 1024); a schedule
	// slot that finds none free is still sent, late, and its lag counted.
	MaxInFlight int
	// OnSample is called as each submission finishes (progress).
	OnSample func(Sample)
}

// Generate runs an open-loop schedule of SubmitJob calls and returns every
// sample in schedule order.
func Generate(ctx context.Context, js apiaryv1.JobServiceClient, o LoadOptions) ([]Sample, error) {
	if o.Offsets == nil && (o.Rate <= 0 || o.Duration <= 0) {
		return nil, fmt.Errorf("rate and duration must be > 0")
	}
	if o.SubmitTimeout == 0 {
		o.SubmitTimeout = 10 * time.Second
	}
	if o.MaxInFlight == 0 {
		o.MaxInFlight = 1024
	}
	n := int(o.Rate * o.Duration.Seconds())
	if o.Offsets != nil {
		n = len(o.Offsets)
	}
	samples := make([]Sample, n)
	sem := make(chan struct{}, o.MaxInFlight)
	var wg sync.WaitGroup
	var done atomic.Int64
	start := time.Now()
	var interval time.Duration
	if o.Rate > 0 {
		interval = time.Duration(float64(time.Second) / o.Rate)
	}
	for i := 0; i < n; i++ {
		intended := start.Add(time.Duration(i) * interval)
		if o.Offsets != nil {
			intended = start.Add(o.Offsets[i])
		}
		if d := time.Until(intended); d > 0 {
			select {
			case <-ctx.Done():
				wg.Wait()
				return samples[:i], ctx.Err()
			case <-time.After(d):
			}
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return samples[:i], ctx.Err()
		}
		wg.Add(1)
		go func(i int, intended time.Time) {
			defer wg.Done()
			defer func() { <-sem }()
			s := Sample{Seq: i, Intended: intended, Sent: time.Now()}
			req := &apiaryv1.SubmitJobRequest{Spec: o.Spec(i), ClientId: "apiary-loadtest", RequestId: fmt.Sprintf("%s-%d", o.RunID, i)}
			s.JobID, s.Err = submitRetry(ctx, js, req, o.SubmitTimeout)
			s.Done = time.Now()
			samples[i] = s
			done.Add(1)
			if o.OnSample != nil {
				o.OnSample(s)
			}
		}(i, intended)
	}
	wg.Wait()
	return samples, nil
}

// submitRetry submits with backoff on UNAVAILABLE, RESOURCE_EXHAUSTED and
// per-call deadlines, always with the same request id.
func submitRetry(ctx context.Context, js apiaryv1.JobServiceClient, req *apiaryv1.SubmitJobRequest, limit time.Duration) (string, string) {
	deadline := time.Now().Add(limit)
	backoff := 20 * time.Millisecond
	var last error
	for time.Now().Before(deadline) && ctx.Err() == nil {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := js.SubmitJob(cctx, req)
		cancel()
		if err == nil {
			return resp.GetJobId(), ""
		}
		last = err
		switch status.Code(err) {
		case codes.Unavailable, codes.ResourceExhausted, codes.DeadlineExceeded, codes.Aborted:
		default:
			return "", err.Error()
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 500*time.Millisecond)
	}
	if last == nil {
		last = ctx.Err()
	}
	return "", last.Error()
}
