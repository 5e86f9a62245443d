package scheduler

import (
	"testing"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/regional/taskstate"
)

// TestStagesOf: a group is ready once every task of each group it comes
// after is COMPLETE (counting the group's count, not only the tasks seen),
// waits for the first that is not, and is doomed by one with a FAILED or
// CANCELLED task; a job without `after` has no stages.
func TestStagesOf(t *testing.T) {
	c := newOwnerCache(nil)
	spec := &apiaryv1.JobSpec{Name: "j", Tasks: []*apiaryv1.TaskGroup{
		{Name: "a", Count: 2}, {Name: "b", Count: 1}, {Name: "c", After: []string{"a"}},
		{Name: "d", After: []string{"a", "b"}}, {Name: "e", After: []string{"b"}}}}
	j := &cJob{rec: store.JobRecord{ID: "j", Spec: spec}}
	c.jobs["j"] = j
	put := func(group, index int32, st apiaryv1.TaskState) {
		key := store.KeyTask(0, "j", index)
		c.setTask(key, &cTask{key: key, rec: taskstate.Task{JobID: "j", Group: group, Index: index, State: st}})
	}
	put(0, 0, apiaryv1.TaskState_TASK_STATE_COMPLETE)
	put(0, 1, apiaryv1.TaskState_TASK_STATE_RUNNING)
	put(1, 2, apiaryv1.TaskState_TASK_STATE_FAILED)
	st := c.stagesOf("j", j)
	if st == nil {
		t.Fatal("no stages for a job with after")
	}
	if !st.ready[0] || !st.ready[1] {
		t.Fatal("groups without after must be ready")
	}
	if st.ready[2] || st.waitFor[2] != "a" || st.doomedBy[2] != "" {
		t.Fatalf("c (after a, one of 2 complete): ready %v wait %q doomed %q", st.ready[2], st.waitFor[2], st.doomedBy[2])
	}
	if st.ready[3] || st.doomedBy[3] != "b" {
		t.Fatalf("d (after a and a failed b): ready %v doomed %q", st.ready[3], st.doomedBy[3])
	}
	put(0, 1, apiaryv1.TaskState_TASK_STATE_COMPLETE)
	if st := c.stagesOf("j", j); !st.ready[2] || st.ready[4] {
		t.Fatalf("after a completed: c ready %v (want true), e ready %v (want false: b failed)", st.ready[2], st.ready[4])
	}
	plain := &cJob{rec: store.JobRecord{ID: "p", Spec: &apiaryv1.JobSpec{Name: "p", Tasks: []*apiaryv1.TaskGroup{{Name: "x"}}}}}
	if c.stagesOf("p", plain) != nil {
		t.Fatal("stages for a job without after")
	}
}
