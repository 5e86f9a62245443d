package scheduler

import (
	"fmt"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/regional/taskstate"
)

// Stages: a task group's `after` names groups of its job that must have
// every task COMPLETE before its tasks are placed (Argo's and Airflow's
// task dependencies, within one job). place consults stageOf for each
// pending task of a job with such groups: a group whose predecessors are
// complete is placed as usual; one still waiting is left PENDING with the
// reason; one behind a predecessor that can no longer complete (a task of
// it FAILED or CANCELLED) has its pending tasks failed without running
// (taskstate.DependencyFailed), which in turn dooms the groups after it.

// jobStages is, per task group of one job, whether it may be placed
// (ready), the first predecessor it still waits for (waitFor), and the
// predecessor that can no longer complete (doomedBy).
type jobStages struct {
	ready    []bool
	waitFor  []string
	doomedBy []string
}

// stagesOf computes j's stages from the cached tasks, or returns nil when no
// group of j has an `after`.
func (c *ownerCache) stagesOf(jobID string, j *cJob) *jobStages {
	groups := j.rec.Spec.GetTasks()
	has := false
	for _, g := range groups {
		has = has || len(g.GetAfter()) > 0
	}
	if !has {
		return nil
	}
	complete := make([]int32, len(groups))
	dead := make([]bool, len(groups))
	for key := range c.jobTasks[jobID] {
		t := c.tasks[key].rec
		if int(t.Group) >= len(groups) {
			continue
		}
		switch t.State {
		case apiaryv1.TaskState_TASK_STATE_COMPLETE:
			complete[t.Group]++
		case apiaryv1.TaskState_TASK_STATE_FAILED, apiaryv1.TaskState_TASK_STATE_CANCELLED:
			dead[t.Group] = true
		}
	}
	index := make(map[string]int, len(groups))
	for i, g := range groups {
		index[g.GetName()] = i
	}
	st := &jobStages{ready: make([]bool, len(groups)), waitFor: make([]string, len(groups)), doomedBy: make([]string, len(groups))}
	for i, g := range groups {
		st.ready[i] = true
		for _, a := range g.GetAfter() {
			p, ok := index[a]
			switch {
			case !ok:
				continue // validation refuses it; an old record is placed as if it were absent
			case dead[p]:
				st.ready[i], st.doomedBy[i] = false, a
			case complete[p] < max(groups[p].GetCount(), 1):
				st.ready[i] = false
				if st.waitFor[i] == "" {
					st.waitFor[i] = a
				}
			}
		}
	}
	return st
}

// dependencyWrite fails a pending task whose group comes after doomedBy, in
// a fenced write compared on its ModRevision.
func (s *Loop) dependencyWrite(ct *cTask, doomedBy string, nowMs int64) (write, bool) {
	rec, changed := taskstate.DependencyFailed(ct.rec, doomedBy, nowMs)
	if !changed {
		return write{}, false
	}
	return s.taskWrite(ct, rec), true
}

// waitingReason is the unplaced reason of a task whose group waits for
// group name.
func waitingReason(name string) string {
	return fmt.Sprintf("task group %s must complete first (after)", name)
}
