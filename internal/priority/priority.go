// Package priority is the vocabulary of job priority classes that the
// region's admission bounds (--max-pending) and the router's routing both
// use: a job's priority (0..100) maps to one class. It is pure and imports
// nothing of ours.
package priority

// Priority classes for admission bounds, by job priority (0..100).
const (
	Batch    = "batch"    // 0..39
	Standard = "standard" // 40..79
	Urgent   = "urgent"   // 80..100
)

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
