package agent

import (
	"errors"
	"fmt"
	"slices"
	"sync"
)

// AttemptKey identifies one attempt of one task.
type AttemptKey struct {
	JobID     string
	TaskIndex int32
	Attempt   int32
}

func (k AttemptKey) String() string {
	return fmt.Sprintf("%s/%d/%d", k.JobID, k.TaskIndex, k.Attempt)
}

// Request is what one attempt asks of the node.
type Request struct {
	// CPUMillis is CPU in millicores.
	CPUMillis int64
	// MemoryMB is memory in MiB.
	MemoryMB int64
	// GPUs is a number of whole GPUs; exclusive with GPUMilli.
	GPUs int32
	// GPUMilli is a share of one GPU in thousandths (1..999).
	GPUMilli int32
	// GPUModels lists acceptable GPU models; empty means any.
	GPUModels []string
	// Devices are the GPU devices to use, as the coordinator's placement
	// chose them: GPUs distinct idle devices, or the one device of a
	// GPUMilli share. Empty: the ledger picks (idle devices lowest index
	// first; for a share, the fullest device it fits on).
	Devices []int
}

// ErrNoRoom is wrapped by Ledger.Reserve when a request does not fit.
var ErrNoRoom = errors.New("no room")

// ErrHeld is returned by Ledger.Reserve when the key already holds resources.
var ErrHeld = errors.New("attempt already holds resources")

// Ledger is the agent's local account of the resources held by its running
// attempts. It is safe for concurrent use.
//
// GPUs are tracked per device: a whole-GPU request takes idle devices; a
// fractional request (GPUMilli) takes a share of one device, best fit.
type Ledger struct {
	mu       sync.Mutex
	capacity Resources
	gpuModel string
	maxTasks int
	used     Resources
	gpuUsed  []int32 // per device, thousandths in use
	holds    map[AttemptKey]hold
}

type hold struct {
	req     Request
	devices []int // GPU devices touched
}

// NewLedger returns a ledger for a node with the given capacity, GPU model,
// and cap on concurrent attempts (0 = no cap beyond resources).
func NewLedger(capacity Resources, gpuModel string, maxTasks int) *Ledger {
	return &Ledger{
		capacity: capacity,
		gpuModel: gpuModel,
		maxTasks: maxTasks,
		gpuUsed:  make([]int32, max(capacity.GPUs, 0)),
		holds:    make(map[AttemptKey]hold),
	}
}

// Reserve takes req's resources for key if they fit. It returns an error
// wrapping ErrNoRoom that names the first short resource, ErrHeld if key
// already holds resources, or a plain error for an invalid request
// (negative amounts, both GPUs and GPUMilli). Nothing is taken on error.
func (l *Ledger) Reserve(key AttemptKey, req Request) error {
	if req.CPUMillis < 0 || req.MemoryMB < 0 || req.GPUs < 0 || req.GPUMilli < 0 || req.GPUMilli > 999 {
		return fmt.Errorf("invalid resource request %+v", req)
	}
	if req.GPUs > 0 && req.GPUMilli > 0 {
		return errors.New("invalid resource request: gpus and gpu_milli are exclusive")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.holds[key]; ok {
		return ErrHeld
	}
	if l.maxTasks > 0 && len(l.holds) >= l.maxTasks {
		return fmt.Errorf("%w: max tasks %d reached", ErrNoRoom, l.maxTasks)
	}
	if free := l.capacity.CPUMillis - l.used.CPUMillis; req.CPUMillis > free {
		return fmt.Errorf("%w: cpu: need %d millis, free %d of %d", ErrNoRoom, req.CPUMillis, free, l.capacity.CPUMillis)
	}
	if free := l.capacity.MemoryMB - l.used.MemoryMB; req.MemoryMB > free {
		return fmt.Errorf("%w: memory: need %d MiB, free %d of %d", ErrNoRoom, req.MemoryMB, free, l.capacity.MemoryMB)
	}
	wantsGPU := req.GPUs > 0 || req.GPUMilli > 0
	if wantsGPU && len(req.GPUModels) > 0 && !slices.Contains(req.GPUModels, l.gpuModel) {
		return fmt.Errorf("%w: gpu model %q not in %v", ErrNoRoom, l.gpuModel, req.GPUModels)
	}
	var devices []int
	switch {
	case len(req.Devices) > 0:
		var err error
		if devices, err = l.takeDevices(req); err != nil {
			return err
		}
	case req.GPUs > 0:
		for i, u := range l.gpuUsed {
			if u == 0 && int32(len(devices)) < req.GPUs {
				devices = append(devices, i)
			}
		}
		if int32(len(devices)) < req.GPUs {
			return fmt.Errorf("%w: gpus: need %d, idle %d of %d", ErrNoRoom, req.GPUs, len(devices), len(l.gpuUsed))
		}
		for _, d := range devices {
			l.gpuUsed[d] = 1000
		}
	case req.GPUMilli > 0:
		best := -1
		for i, u := range l.gpuUsed {
			if u+req.GPUMilli <= 1000 && (best < 0 || u > l.gpuUsed[best]) {
				best = i
			}
		}
		if best < 0 {
			return fmt.Errorf("%w: gpu share: no device with %d/1000 free", ErrNoRoom, req.GPUMilli)
		}
		devices = []int{best}
		l.gpuUsed[best] += req.GPUMilli
	}
	l.used.CPUMillis += req.CPUMillis
	l.used.MemoryMB += req.MemoryMB
	l.used.GPUs += req.GPUs
	l.holds[key] = hold{req: req, devices: devices}
	return nil
}

// takeDevices takes exactly req.Devices (l.mu held), or returns an error
// wrapping ErrNoRoom naming the first device that cannot serve.
func (l *Ledger) takeDevices(req Request) ([]int, error) {
	want := req.GPUs
	if req.GPUMilli > 0 {
		want = 1
	}
	if int32(len(req.Devices)) != want {
		return nil, fmt.Errorf("%w: gpu devices %v: want %d for gpus %d, gpu_milli %d", ErrNoRoom, req.Devices, want, req.GPUs, req.GPUMilli)
	}
	for i, d := range req.Devices {
		switch {
		case d < 0 || d >= len(l.gpuUsed):
			return nil, fmt.Errorf("%w: gpu device %d: not a device of this node (0..%d)", ErrNoRoom, d, len(l.gpuUsed)-1)
		case slices.Contains(req.Devices[:i], d):
			return nil, fmt.Errorf("%w: gpu device %d named twice", ErrNoRoom, d)
		case req.GPUMilli > 0 && l.gpuUsed[d]+req.GPUMilli > 1000:
			return nil, fmt.Errorf("%w: gpu device %d: %d/1000 free, need %d", ErrNoRoom, d, 1000-l.gpuUsed[d], req.GPUMilli)
		case req.GPUMilli == 0 && l.gpuUsed[d] != 0:
			return nil, fmt.Errorf("%w: gpu device %d: not idle (%d/1000 in use)", ErrNoRoom, d, l.gpuUsed[d])
		}
	}
	for _, d := range req.Devices {
		if req.GPUMilli > 0 {
			l.gpuUsed[d] += req.GPUMilli
		} else {
			l.gpuUsed[d] = 1000
		}
	}
	return slices.Clone(req.Devices), nil
}

// Devices returns the GPU devices key holds (nil if none).
func (l *Ledger) Devices(key AttemptKey) []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.holds[key].devices)
}

// Release returns key's resources; it reports whether key held any.
func (l *Ledger) Release(key AttemptKey) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, ok := l.holds[key]
	if !ok {
		return false
	}
	delete(l.holds, key)
	l.used.CPUMillis -= h.req.CPUMillis
	l.used.MemoryMB -= h.req.MemoryMB
	l.used.GPUs -= h.req.GPUs
	for _, d := range h.devices {
		if h.req.GPUMilli > 0 {
			l.gpuUsed[d] -= h.req.GPUMilli
		} else {
			l.gpuUsed[d] = 0
		}
	}
	return true
}

// Used returns the resources held now (GPUs counts whole-GPU holds only) and
// the number of holding attempts.
func (l *Ledger) Used() (Resources, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.used, len(l.holds)
}
