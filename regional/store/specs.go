package store

import (
	"sync"
	"time"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/jobspec"
	"apiary.dev/apiary/regional/taskstate"
)

// SpecCache keeps immutable job specs (a spec never changes after submit),
// filled by the scheduling loop's cache and by report commit. The zero value
// is ready to use; it is safe for concurrent use. It is bounded: past
// 50000 jobs it starts over.
type SpecCache struct {
	mu sync.Mutex
	m  map[string]*JobRecord
}

// Get returns the job record of id, or nil when it is not cached.
func (sc *SpecCache) Get(id string) *JobRecord {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.m[id]
}

// Put caches r under its job id.
func (sc *SpecCache) Put(r *JobRecord) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.m == nil || len(sc.m) > 50000 {
		sc.m = map[string]*JobRecord{}
	}
	sc.m[r.ID] = r
}

// PolicyOf is the retry policy of a task of group in a job of spec: the
// job's max_attempts (jobspec.DefaultMaxAttempts when unset or spec is nil)
// and the group's retryable exit codes.
func PolicyOf(spec *apiaryv1.JobSpec, group int32) taskstate.Policy {
	p := taskstate.Policy{MaxAttempts: spec.GetMaxAttempts()}
	if g := spec.GetTasks(); int(group) < len(g) {
		p.RetryableCodes = g[group].GetRetryableExitCodes()
	}
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = jobspec.DefaultMaxAttempts
	}
	d := spec.GetDisconnect()
	p.Replace = d == nil || d.Replace == nil || d.GetReplace()
	p.LostAfter = time.Duration(d.GetLostAfterMs()) * time.Millisecond
	return p
}
