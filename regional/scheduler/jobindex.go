package scheduler

import (
	"sync"

	"github.com/google/btree"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/regional/taskstate"
)

// JobIndex is the region's jobs with their task counts, kept by the
// scheduling loop's watch cache (ownerCache) and read concurrently by
// ListJobs: a page costs O(log jobs + page), and no task record is read
// (Kubernetes' apiserver serves LIST from its watch cache the same way;
// Nomad keeps a job summary per job). It holds the revision up to which
// the cache has applied etcd's events, so a reader can wait until it has
// seen every write committed before its request (WaitFor).
//
// Every coordinator's loop (API-only ones too) keeps one; a loop that
// reloads its cache resets it (Reset) and fills it again.
type JobIndex struct {
	watermark
	mu   sync.RWMutex
	jobs *btree.BTreeG[*jobEntry] // by id
	byID map[string]*jobEntry
	// byState holds the jobs of each derived state, by id (a page of one
	// state walks only its jobs).
	byState map[apiaryv1.JobState]*btree.BTreeG[*jobEntry]
}

// jobEntry is one job: its record (shared with the cache, never modified:
// a job update replaces it) and its tasks' counts.
type jobEntry struct {
	id     string
	rec    *store.JobRecord
	counts *apiaryv1.TaskCounts
	// finish is the latest FinishedMs of its tasks.
	finish int64
	// state is the job's derived state (taskstate.JobState), the
	// byState tree it is in.
	state apiaryv1.JobState
}

func byJobID(a, b *jobEntry) bool { return a.id < b.id }

// NewJobIndex returns an empty index at revision 0.
func NewJobIndex() *JobIndex {
	return &JobIndex{jobs: btree.NewG(32, byJobID), byID: map[string]*jobEntry{},
		byState: map[apiaryv1.JobState]*btree.BTreeG[*jobEntry]{}, watermark: newWatermark()}
}

// Reset empties the index (a reloading cache fills it again) and sets its
// revision to 0.
func (x *JobIndex) Reset() {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.jobs.Clear(false)
	clear(x.byID)
	clear(x.byState)
	x.reset()
}

// putJob adds or replaces a job's record (its counts stay).
func (x *JobIndex) putJob(rec *store.JobRecord) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if e := x.byID[rec.ID]; e != nil {
		e.rec = rec
		x.restate(e) // a cancel request may change it
		return
	}
	e := &jobEntry{id: rec.ID, rec: rec, counts: &apiaryv1.TaskCounts{}}
	x.byID[rec.ID] = e
	x.jobs.ReplaceOrInsert(e)
	x.restate(e)
}

// restate moves e to the tree of its derived state, if that changed
// (x.mu held).
func (x *JobIndex) restate(e *jobEntry) {
	st := taskstate.JobState(e.rec.CancelRequested, e.counts)
	if e.rec.Moved() {
		st = apiaryv1.JobState_JOB_STATE_MOVED
	}
	if st == e.state {
		return
	}
	if t := x.byState[e.state]; t != nil {
		t.Delete(e)
	}
	e.state = st
	t := x.byState[st]
	if t == nil {
		t = btree.NewG(32, byJobID)
		x.byState[st] = t
	}
	t.ReplaceOrInsert(e)
}

// deleteJob drops a job.
func (x *JobIndex) deleteJob(id string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if e := x.byID[id]; e != nil {
		delete(x.byID, id)
		x.jobs.Delete(e)
		if t := x.byState[e.state]; t != nil {
			t.Delete(e)
		}
	}
}

// task moves one task of job id from state old (UNSPECIFIED: it was not
// counted) to state new (UNSPECIFIED: it is gone), with its FinishedMs.
// A task of a job the index does not hold (its record not seen yet) is
// counted once the job arrives only through a reload; the job record is
// written before its tasks in one Txn, so the watch delivers it first.
func (x *JobIndex) task(id string, old, new apiaryv1.TaskState, finishedMs int64) {
	if old == new && finishedMs == 0 {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	e := x.byID[id]
	if e == nil {
		return
	}
	uncount(e.counts, old)
	if new != apiaryv1.TaskState_TASK_STATE_UNSPECIFIED {
		taskstate.Count(e.counts, new)
	}
	e.finish = max(e.finish, finishedMs)
	x.restate(e)
}

// uncount removes a task state from counts (the inverse of taskstate.Count).
func uncount(c *apiaryv1.TaskCounts, s apiaryv1.TaskState) {
	switch s {
	case apiaryv1.TaskState_TASK_STATE_PENDING:
		c.Pending--
	case apiaryv1.TaskState_TASK_STATE_ASSIGNED:
		c.Assigned--
	case apiaryv1.TaskState_TASK_STATE_RUNNING:
		c.Running--
	case apiaryv1.TaskState_TASK_STATE_COMPLETE:
		c.Complete--
	case apiaryv1.TaskState_TASK_STATE_FAILED:
		c.Failed--
	case apiaryv1.TaskState_TASK_STATE_CANCELLED:
		c.Cancelled--
	}
}

// IndexedJob is one job of a page: its record (read-only) and its counts
// and derived state as of the index's revision.
type IndexedJob struct {
	Rec          *store.JobRecord
	Counts       *apiaryv1.TaskCounts
	State        apiaryv1.JobState
	FinishTimeMs int64 // the latest task end, once the job is terminal
}

// Page returns up to limit jobs with an id below before ("" : from the
// highest), in descending id order, in state (UNSPECIFIED: any), that keep
// passes, and whether more may follow. A page of one state walks only the
// jobs in it: O(log jobs + what keep refuses + limit).
func (x *JobIndex) Page(before string, limit int, state apiaryv1.JobState, keep func(*IndexedJob) bool) (page []IndexedJob, more bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	visit := func(e *jobEntry) bool {
		if e.id == before {
			return true
		}
		c := e.counts
		counts := &apiaryv1.TaskCounts{Pending: c.Pending, Assigned: c.Assigned, Running: c.Running,
			Complete: c.Complete, Failed: c.Failed, Cancelled: c.Cancelled}
		j := IndexedJob{Rec: e.rec, Counts: counts, State: e.state}
		if j.State == apiaryv1.JobState_JOB_STATE_COMPLETE || j.State == apiaryv1.JobState_JOB_STATE_FAILED ||
			j.State == apiaryv1.JobState_JOB_STATE_CANCELLED {
			j.FinishTimeMs = e.finish
		}
		if !keep(&j) {
			return true
		}
		if len(page) == limit {
			more = true
			return false
		}
		page = append(page, j)
		return true
	}
	tree := x.jobs
	if state != apiaryv1.JobState_JOB_STATE_UNSPECIFIED {
		if tree = x.byState[state]; tree == nil {
			return nil, false
		}
	}
	if before == "" {
		tree.Descend(visit)
	} else {
		tree.DescendLessOrEqual(&jobEntry{id: before}, visit)
	}
	return page, more
}

// EachPending calls fn with every job's record and its PENDING task count,
// under the index's read lock (fn must not call the index), and returns
// the revision they are current to (0: the index is not loaded; fn was not
// called).
func (x *JobIndex) EachPending(fn func(rec *store.JobRecord, pending int32)) int64 {
	// Reset zeroes the revision under mu: read under it, a revision
	// above 0 means the load since the last Reset has finished.
	x.mu.RLock()
	defer x.mu.RUnlock()
	rev := x.Revision()
	if rev == 0 {
		return 0
	}
	for _, e := range x.byID {
		fn(e.rec, e.counts.Pending)
	}
	return rev
}
