// Package priority is the vocabulary of job priority classes that the
// region's admission bounds (--max-pending), the router's routing, the job
// spec (priority: urgent) and preemption use: a job's priority (0..100)
// maps to one class, and a class name to the priority it stands for. It is
// the one place where the classes' numbers are written down. It is pure
// and imports nothing of ours.
package priority

// Priority classes for admission bounds, by job priority (0..100).
const (
	Batch    = "batch"    // 0..39
	Standard = "standard" // 40..79
	Urgent   = "urgent"   // 80..100
)

// The priority a job file's class name stands for (priority: batch |
// standard | urgent): the middle of each class's range, so that each class
// preempts the classes below it (a preemptor needs PreemptionDelta over
// its victims) and never its own.
const (
	BatchValue    = 20
	StandardValue = 50
	UrgentValue   = 90
)

// PreemptionDelta is how much higher a task's priority must be than each
// task it preempts (Nomad's rule; placement.Options.PreemptionDelta):
// equal or near-equal priorities never preempt each other.
const PreemptionDelta = 10

// Value is the priority a class name stands for; false for any other name.
func Value(class string) (int32, bool) {
	switch class {
	case Batch:
		return BatchValue, true
	case Standard:
		return StandardValue, true
	case Urgent:
		return UrgentValue, true
	}
	return 0, false
}

// Classes lists the priority classes in order.
var Classes = []string{Batch, Standard, Urgent}

// Of maps a job priority to its class.
func Of(priority int32) string {
	switch {
	case priority >= 80:
		return Urgent
	case priority >= 40:
		return Standard
	}
	return Batch
}
