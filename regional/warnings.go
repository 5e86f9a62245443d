package regional

import (
	"fmt"
	"slices"
	"strings"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

// submitWarnings returns what may keep an accepted job waiting that the
// submitter should hear about at once: a task group whose gpu_models names no
// model that any node registered in this region has (ready or not). The job
// is still accepted, since a node with the model may register later. The
// models come from the capacity summary (admission.go: refreshed every
// CapacityRefresh and on each registration, so a node registered within
// that time may be missed, as for admission's size check); before the first
// summary there is no warning.
func (c *Coordinator) submitWarnings(spec *apiaryv1.JobSpec) []string {
	var groups []int
	for g, grp := range spec.GetTasks() {
		if len(grp.GetResources().GetGpuModels()) > 0 {
			groups = append(groups, g)
		}
	}
	if len(groups) == 0 {
		return nil
	}
	st := &c.capState
	st.mu.Lock()
	have := st.gpuModels // nil until the first summary
	st.mu.Unlock()
	if have == nil {
		return nil
	}
	known := make([]string, 0, len(have))
	for m := range have {
		known = append(known, m)
	}
	slices.Sort(known)
	var out []string
	for _, g := range groups {
		want := spec.GetTasks()[g].GetResources().GetGpuModels()
		if slices.ContainsFunc(want, func(m string) bool { return have[m] }) {
			continue
		}
		msg := fmt.Sprintf("tasks[%d].resources.gpu_models: no node of region %s has %s", g, c.meta.Region, quoteList(want))
		if len(known) == 0 {
			msg += " (no node here reports a GPU model)"
		} else {
			msg += fmt.Sprintf(" (models here: %s)", strings.Join(known, ", "))
		}
		for _, w := range want {
			for _, k := range known {
				if strings.EqualFold(w, k) && w != k {
					msg += fmt.Sprintf("; did you mean %q? models match exactly, case included", k)
				}
			}
		}
		out = append(out, msg+"; the job waits until such a node registers")
	}
	return out
}

func quoteList(v []string) string {
	q := make([]string, len(v))
	for i, s := range v {
		q[i] = fmt.Sprintf("%q", s)
	}
	if len(q) == 1 {
		return "model " + q[0]
	}
	return "any of the models " + strings.Join(q, ", ")
}
