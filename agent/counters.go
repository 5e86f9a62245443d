package agent

import "sync/atomic"

// Counters count an agent's protocol events without a metrics registry, so
// that many agents in one process can share one set (`apiary loadtest
// fleet` sums thousands of simulated agents this way; Config.Counters).
// Every field is updated atomically and may be read at any time.
type Counters struct {
	// Registrations counts node epochs begun (answered RegisterNode).
	Registrations atomic.Int64
	// Heartbeats counts answered heartbeats.
	Heartbeats atomic.Int64
	// Started counts attempts started (processes, or noop timers).
	Started atomic.Int64
	// Ended counts started attempts that ended, whatever their outcome.
	Ended atomic.Int64
	// StartFailed counts attempts that could not start (START_FAILED).
	StartFailed atomic.Int64
	// Refused counts assignments refused by local admission (REFUSED).
	Refused atomic.Int64
}
