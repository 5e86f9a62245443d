package scheduler

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/regional/store"
)

// TestJobIndexPagesAndCounts: the owner cache keeps the index's records
// and counts in step with task changes, pages go in descending id order
// from a token with a filter, and WaitFor waits for the revision.
func TestJobIndexPagesAndCounts(t *testing.T) {
	h := newOwnerHarness(t)
	idx := NewJobIndex()
	h.s.cache.index = idx
	h.addNode("n1", 64000, 65536)
	for i := range 25 {
		h.addJob(fmt.Sprintf("j%02d", i), 100, false, pending(), pending())
	}
	h.load()
	if err := h.round(); err != nil {
		t.Fatal(err)
	}
	var ids []string
	token := ""
	for pages := 0; ; pages++ {
		page, more := idx.Page(token, 10, apiaryv1.JobState_JOB_STATE_UNSPECIFIED, func(*IndexedJob) bool { return true })
		for _, j := range page {
			ids = append(ids, j.Rec.ID)
			if j.Counts.GetAssigned() != 2 || j.State != apiaryv1.JobState_JOB_STATE_RUNNING {
				t.Fatalf("%s: counts %v state %s, want 2 ASSIGNED, RUNNING", j.Rec.ID, j.Counts, j.State)
			}
		}
		if !more {
			if pages != 2 || len(page) != 5 {
				t.Fatalf("last page %d has %d jobs, want page 2 with 5", pages, len(page))
			}
			break
		}
		token = page[len(page)-1].Rec.ID
	}
	if len(ids) != 25 || ids[0] != "j24" || ids[24] != "j00" {
		t.Fatalf("ids %v, want j24..j00", ids)
	}
	for i := 1; i < len(ids); i++ {
		if ids[i] >= ids[i-1] {
			t.Fatalf("not descending at %d: %v", i, ids)
		}
	}
	// A filter skips without filling the page with others.
	page, more := idx.Page("", 3, apiaryv1.JobState_JOB_STATE_UNSPECIFIED, func(j *IndexedJob) bool { return j.Rec.ID < "j05" })
	if len(page) != 3 || page[0].Rec.ID != "j04" || !more {
		t.Fatalf("filtered page %v more %v", page, more)
	}
	// A page of one state walks that state's jobs: j03's tasks complete,
	// and it moves from RUNNING to COMPLETE.
	for i := int32(0); i < 2; i++ {
		tk := h.task("j03", i)
		tk.State, tk.FinishedMs = apiaryv1.TaskState_TASK_STATE_COMPLETE, 42
		h.store.put(store.KeyTask(0, "j03", i), store.MustJSON(&tk))
		h.s.cache.apply(h.store.get(store.KeyTask(0, "j03", i)), false)
	}
	done, more := idx.Page("", 10, apiaryv1.JobState_JOB_STATE_COMPLETE, func(*IndexedJob) bool { return true })
	if len(done) != 1 || more || done[0].Rec.ID != "j03" || done[0].FinishTimeMs != 42 {
		t.Fatalf("COMPLETE page %+v (more %v): want j03 alone, finished at 42", done, more)
	}
	var running []string
	for tok := ""; ; {
		page, more := idx.Page(tok, 7, apiaryv1.JobState_JOB_STATE_RUNNING, func(*IndexedJob) bool { return true })
		for _, j := range page {
			if j.State != apiaryv1.JobState_JOB_STATE_RUNNING {
				t.Fatalf("RUNNING page holds %s in %s", j.Rec.ID, j.State)
			}
			running = append(running, j.Rec.ID)
		}
		if !more {
			break
		}
		tok = page[len(page)-1].Rec.ID
	}
	if len(running) != 24 || slices.Contains(running, "j03") {
		t.Fatalf("RUNNING pages: %d jobs %v; want the 24 others", len(running), running)
	}
	if page, more := idx.Page("", 10, apiaryv1.JobState_JOB_STATE_PENDING, func(*IndexedJob) bool { return true }); len(page) != 0 || more {
		t.Fatalf("PENDING page %v: want none", page)
	}
	// A job deleted with its tasks leaves the index.
	for i := int32(0); i < 2; i++ {
		h.watchDelete(store.KeyTask(0, "j24", i))
	}
	h.watchDelete(store.KeyJob(0, "j24"))
	if page, _ := idx.Page("", 1, apiaryv1.JobState_JOB_STATE_UNSPECIFIED, func(*IndexedJob) bool { return true }); page[0].Rec.ID != "j23" {
		t.Fatalf("after deleting j24 the first job is %s", page[0].Rec.ID)
	}
	// WaitFor returns once the revision is applied, and honours ctx.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := idx.WaitFor(ctx, 1<<40); err == nil {
		t.Fatal("WaitFor returned for a revision never applied")
	}
	go idx.advance(1 << 41)
	if err := idx.WaitFor(context.Background(), 1<<40); err != nil {
		t.Fatal(err)
	}
	idx.Reset()
	if idx.Revision() != 0 {
		t.Fatal("Reset kept the revision")
	}
	if page, _ := idx.Page("", 10, apiaryv1.JobState_JOB_STATE_UNSPECIFIED, func(*IndexedJob) bool { return true }); len(page) != 0 {
		t.Fatalf("Reset kept %d jobs", len(page))
	}
}
