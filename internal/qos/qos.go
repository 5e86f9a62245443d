// Package qos is the vocabulary of quality-of-service classes (Kubernetes'
// Guaranteed, Burstable and BestEffort, kubernetes.io "Pod Quality of
// Service Classes") that the job spec, the region's placement and
// preemption, the agent and the CLI share: a task group's class follows
// from its resource requests and limits (apiaryv1.Resources). It is pure:
// it imports only the API types.
package qos

import apiaryv1 "apiary.dev/apiary/api/apiary/v1"

// Class is a task's QoS class.
type Class string

// The classes, from the first to be preempted to the last.
const (
	// BestEffort requests nothing (Resources.best_effort): it reserves only
	// a task slot, runs wherever one is free, and is preempted before any
	// other class.
	BestEffort Class = "BestEffort"
	// Burstable requests resources and may use more (a limit above a
	// request, or no limit).
	Burstable Class = "Burstable"
	// Guaranteed has CPU and memory limits equal to its requests; the
	// agent enforces them with cgroup limits, and it is never preempted by
	// a Burstable or BestEffort task.
	Guaranteed Class = "Guaranteed"
)

// Classes lists the classes in preemption order (first preempted first).
var Classes = []Class{BestEffort, Burstable, Guaranteed}

// Of returns the class of a task group's resources (after the job spec's
// defaults are applied): BestEffort when best_effort is set; Guaranteed
// when limits for both CPU and memory are set and equal to the requests;
// Burstable otherwise (nil resources included).
func Of(r *apiaryv1.Resources) Class {
	switch {
	case r.GetBestEffort():
		return BestEffort
	case r.GetLimits().GetCpuMillis() > 0 && r.GetLimits().GetCpuMillis() == r.GetCpuMillis() &&
		r.GetLimits().GetMemoryMb() > 0 && r.GetLimits().GetMemoryMb() == r.GetMemoryMb():
		return Guaranteed
	}
	return Burstable
}

// Rank orders classes for preemption: BestEffort 0, Burstable 1,
// Guaranteed 2 (an unknown class ranks as Burstable).
func Rank(c Class) int {
	switch c {
	case BestEffort:
		return 0
	case Guaranteed:
		return 2
	}
	return 1
}
