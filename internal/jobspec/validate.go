package jobspec

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/acl"
	"apiary.dev/apiary/internal/qos"
)

// Limits and defaults of a job spec.
const (
	// MaxFileBytes is the largest job file Parse accepts, and the largest
	// encoded JobSpec Validate accepts.
	MaxFileBytes = 1 << 20

	MaxNameLen     = 128
	MaxTaskNameLen = 64
	MinPriority    = 0
	MaxPriority    = 100
	MaxMaxAttempts = 100
	MaxTaskGroups  = 100
	// MaxTasks caps the tasks of one job (the sum of the groups' counts).
	MaxTasks    = 10000
	MaxCount    = 10000
	MaxCPUMilli = 1_000_000
	MaxMemoryMB = 16_777_216
	MaxGPUs     = 64
	MaxGPUMilli = 999
	// MinCPULimitMillis is the smallest resources.limits.cpu_millis: the
	// agent enforces a CPU limit as a CFS quota per 100 ms period, and the
	// kernel's smallest quota is 1 ms (cpu.cfs_quota_us, cpu.max).
	MinCPULimitMillis = 10
	MaxTimeout        = 7 * 24 * time.Hour
	// MinFailoverAfter and MaxFailoverAfter bound failover.after: below a
	// second a serf WAN pool cannot tell a dead region from a slow one.
	MinFailoverAfter = time.Second
	MaxFailoverAfter = 24 * time.Hour
	// MaxLostAfter bounds disconnect.lost_after.
	MaxLostAfter = 24 * time.Hour

	MaxArgs        = 1024
	MaxArgsBytes   = 256 << 10
	MaxEnv         = 1024
	MaxRules       = 64 // constraints, affinities, spreads, ... per group
	MaxValues      = 256
	MaxLabelKeyLen = 253
	MaxLabelValLen = 256

	DefaultPriority    = 50
	DefaultMaxAttempts = 3
	DefaultCount       = 1
	DefaultCPUMillis   = 100
	DefaultMemoryMB    = 64
	// DefaultMaxPerValue is distinct_property.max_per_value when 0.
	DefaultMaxPerValue = 1
	// AntiAffinityScopeNode is anti_affinity.scope's default: one member of
	// the group per node (any other scope names a node label).
	AntiAffinityScopeNode = "node"

	// maxReported caps the field errors one ValidationError lists.
	maxReported = 100
)

// Schedulers are the accepted values of JobSpec.scheduler. "" means the
// region's default policy (its --scheduler, binpack unless set), so
// ApplyDefaults leaves it empty.
var Schedulers = []string{"binpack", "spread", "fragmentation"}

// Ops are the accepted constraint and affinity operators.
var Ops = []string{"=", "!=", "in", "not_in", "exists", "not_exists", "<", ">", "version"}

// FieldError is one broken rule: Field is the YAML path of the field
// (tasks[0].resources.memory_mb), empty for a file-level problem; Rule says
// what is wrong ("must be > 0").
type FieldError struct {
	Field string
	Rule  string
}

func (e FieldError) String() string {
	if e.Field == "" {
		return e.Rule
	}
	return e.Field + ": " + e.Rule
}

// ValidationError lists every broken rule of a job file or spec. Parse and
// Validate return it (as *ValidationError) for anything the user can fix.
type ValidationError struct {
	Errors []FieldError
	// Omitted counts errors beyond the ones listed.
	Omitted int
}

// Error joins one line per field error.
func (e *ValidationError) Error() string {
	var b strings.Builder
	for i, fe := range e.Errors {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(fe.String())
	}
	if e.Omitted > 0 {
		fmt.Fprintf(&b, "\n... and %d more errors", e.Omitted)
	}
	return b.String()
}

// Has reports whether some error names field (exactly).
func (e *ValidationError) Has(field string) bool {
	for _, fe := range e.Errors {
		if fe.Field == field {
			return true
		}
	}
	return false
}

// GRPCStatus makes a ValidationError an INVALID_ARGUMENT status with a
// BadRequest detail naming each field, so a server can return it as is and
// status.FromError / status.Convert understand it.
func (e *ValidationError) GRPCStatus() *status.Status {
	st := status.New(codes.InvalidArgument, "invalid job spec:\n"+e.Error())
	br := &errdetails.BadRequest{}
	for _, fe := range e.Errors {
		br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{
			Field: fe.Field, Description: fe.Rule,
		})
	}
	if ds, err := st.WithDetails(br); err == nil {
		return ds
	}
	return st
}

// errs collects field errors.
type errs struct {
	list    []FieldError
	omitted int
}

func (c *errs) add(field, format string, args ...any) {
	if len(c.list) >= maxReported {
		c.omitted++
		return
	}
	c.list = append(c.list, FieldError{Field: field, Rule: fmt.Sprintf(format, args...)})
}

func (c *errs) err() error {
	if len(c.list) == 0 {
		return nil
	}
	return &ValidationError{Errors: c.list, Omitted: c.omitted}
}

var (
	nameRE     = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)
	envKeyRE   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	labelKeyRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._/-]*[A-Za-z0-9])?$`)
	// antiAffinityGroupRE is an anti-affinity group name (it is part of an
	// etcd key: store.KeyAntiAffinity).
	antiAffinityGroupRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	// outputNameRE is an output's name: a directory name under the
	// attempt's output dir and the node's dataset dir.
	outputNameRE = regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9._-]{0,254}$`)
	// versionRE matches one comparison of a version constraint:
	// optional operator, then a dotted version with optional pre-release.
	versionRE = regexp.MustCompile(`^(=|!=|>|>=|<|<=|~>)?\s*v?[0-9]+(\.[0-9]+)*(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`)
)

// Validate checks spec against every rule of the job file, whether it came
// from Parse or over gRPC. It returns nil or a *ValidationError. Zero values
// that ApplyDefaults fills are accepted.
func Validate(spec *apiaryv1.JobSpec) error {
	var c errs
	if spec == nil {
		c.add("", "job spec is required")
		return c.err()
	}
	if b, err := proto.Marshal(spec); err != nil {
		c.add("", "job spec cannot be encoded (a string holds invalid UTF-8): %v", err)
		return c.err()
	} else if len(b) > MaxFileBytes {
		c.add("", "job spec is %d bytes encoded; the limit is %d (1 MiB)", len(b), MaxFileBytes)
		return c.err()
	}
	checkName(&c, "name", spec.GetName(), MaxNameLen, true)
	if p := spec.GetPriority(); p < MinPriority || p > MaxPriority {
		c.add("priority", "must be between %d and %d, or a class: batch, standard, urgent (got %d)", max(MinPriority, 1), MaxPriority, p)
	}
	if m := spec.GetMaxAttempts(); m < 0 || m > MaxMaxAttempts {
		c.add("max_attempts", "must be between 1 and %d (got %d)", MaxMaxAttempts, m)
	}
	if s := spec.GetScheduler(); s != "" && !contains(Schedulers, s) {
		c.add("scheduler", "must be one of %s (got %q)", strings.Join(Schedulers, ", "), s)
	}
	if d := spec.GetDisconnect(); d != nil {
		if la := d.GetLostAfterMs(); la < 0 || la > MaxLostAfter.Milliseconds() {
			c.add("disconnect.lost_after", "must be between 1ms and 24h, or 0 for the agent's --disconnect-grace (got %dms)", la)
		}
	}
	if f := spec.GetFailover(); f != nil {
		checkFailover(&c, spec, f)
	}
	if ns := spec.GetNamespace(); ns != "" {
		var fe *acl.FieldError
		if err := acl.ValidateNamespace(ns); errors.As(err, &fe) {
			c.add("namespace", "%s (omit it for %q)", fe.Rule, acl.DefaultNamespace)
		}
	}
	checkName(&c, "jurisdiction", spec.GetJurisdiction(), 64, false)
	checkName(&c, "data_class", spec.GetDataClass(), 64, false)
	if r := spec.GetRegion(); r != nil {
		checkLabelMap(&c, "region.selector", r.GetSelector())
		seen := map[string]bool{}
		for i, p := range r.GetPrefer() {
			f := fmt.Sprintf("region.prefer[%d]", i)
			if p == "" {
				c.add(f, "must not be empty")
			} else {
				checkName(&c, f, p, 64, true)
			}
			if seen[p] && p != "" {
				c.add(f, "duplicate region %q", p)
			}
			seen[p] = true
		}
	}

	groups := spec.GetTasks()
	switch {
	case len(groups) == 0:
		c.add("tasks", "at least one task is required")
	case len(groups) > MaxTaskGroups:
		c.add("tasks", "at most %d task groups are allowed (got %d)", MaxTaskGroups, len(groups))
	}
	names := map[string]int{}
	for i, g := range groups {
		p := fmt.Sprintf("tasks[%d]", i)
		if g == nil {
			c.add(p, "must not be null")
			continue
		}
		if g.GetName() != "" {
			if j, dup := names[g.GetName()]; dup {
				c.add(p+".name", "duplicate task name %q (also tasks[%d])", g.GetName(), j)
			} else {
				names[g.GetName()] = i
			}
		}
		validateGroup(&c, p, g)
	}
	validateAfter(&c, spec, names)
	if n := TaskCount(spec); n > MaxTasks {
		c.add("tasks", "at most %d tasks in total are allowed (the counts add up to %d)", MaxTasks, n)
	}
	return c.err()
}

// validateAfter checks each group's `after`: names of other groups of the
// job (names: group name → index), each at most once, and no cycle.
func validateAfter(c *errs, spec *apiaryv1.JobSpec, names map[string]int) {
	deps := make([][]int, len(spec.GetTasks()))
	for i, g := range spec.GetTasks() {
		seen := map[string]bool{}
		for k, a := range g.GetAfter() {
			f := fmt.Sprintf("tasks[%d].after[%d]", i, k)
			j, ok := names[a]
			switch {
			case seen[a]:
				c.add(f, "%q is listed twice", a)
			case !ok:
				c.add(f, "%q is not a task group of this job", a)
			case j == i:
				c.add(f, "a task group cannot come after itself")
			default:
				deps[i] = append(deps[i], j)
			}
			seen[a] = true
		}
	}
	// A cycle: depth-first search, reported once at the group it closes on.
	state := make([]int, len(deps)) // 0 new, 1 on the path, 2 done
	var visit func(i int) bool
	visit = func(i int) bool {
		state[i] = 1
		for _, j := range deps[i] {
			if state[j] == 1 || (state[j] == 0 && visit(j)) {
				return true
			}
		}
		state[i] = 2
		return false
	}
	for i := range deps {
		if state[i] == 0 && visit(i) {
			c.add(fmt.Sprintf("tasks[%d].after", i), "the task groups' after lists form a cycle through %q", spec.GetTasks()[i].GetName())
			return
		}
	}
}

func validateGroup(c *errs, p string, g *apiaryv1.TaskGroup) {
	checkName(c, p+".name", g.GetName(), MaxTaskNameLen, true)
	if n := g.GetCount(); n < 0 || n > MaxCount {
		c.add(p+".count", "must be between 1 and %d (got %d)", MaxCount, n)
	}
	switch cmd := g.GetCommand(); {
	case strings.TrimSpace(cmd) == "":
		c.add(p+".command", "is required (a program path or name)")
	case strings.ContainsRune(cmd, 0):
		c.add(p+".command", "must not contain a NUL byte")
	case len(cmd) > 4096:
		c.add(p+".command", "must be at most 4096 bytes")
	case !utf8.ValidString(cmd):
		c.add(p+".command", "must be valid UTF-8")
	}
	args := g.GetArgs()
	if len(args) > MaxArgs {
		c.add(p+".args", "at most %d arguments are allowed (got %d)", MaxArgs, len(args))
	}
	total := 0
	for i, a := range args {
		total += len(a)
		if strings.ContainsRune(a, 0) {
			c.add(fmt.Sprintf("%s.args[%d]", p, i), "must not contain a NUL byte")
		}
	}
	if total > MaxArgsBytes {
		c.add(p+".args", "must be at most %d bytes in total (got %d)", MaxArgsBytes, total)
	}
	if len(g.GetEnv()) > MaxEnv {
		c.add(p+".env", "at most %d variables are allowed (got %d)", MaxEnv, len(g.GetEnv()))
	}
	for _, k := range sortedKeys(g.GetEnv()) {
		f := p + ".env" + keyPath(k)
		switch {
		case !envKeyRE.MatchString(k):
			c.add(f, "must be a valid variable name ([A-Za-z_][A-Za-z0-9_]*)")
		case strings.HasPrefix(strings.ToUpper(k), "APIARY_"):
			c.add(f, "names starting with APIARY_ are reserved for Apiary")
		}
		if strings.ContainsRune(g.GetEnv()[k], 0) {
			c.add(f, "value must not contain a NUL byte")
		}
	}
	validateSecretEnv(c, p, g)
	validateResources(c, p+".resources", g.GetResources())

	checkCount(c, p+".constraints", len(g.GetConstraints()))
	for i, k := range g.GetConstraints() {
		validateRule(c, fmt.Sprintf("%s.constraints[%d]", p, i), k.GetLabel(), k.GetOp(), k.GetValues())
	}
	checkCount(c, p+".affinities", len(g.GetAffinities()))
	for i, a := range g.GetAffinities() {
		f := fmt.Sprintf("%s.affinities[%d]", p, i)
		validateRule(c, f, a.GetLabel(), a.GetOp(), a.GetValues())
		if w := a.GetWeight(); w == 0 || w < -100 || w > 100 {
			c.add(f+".weight", "must be between -100 and 100 and not 0 (got %d)", w)
		}
	}
	checkCount(c, p+".spread", len(g.GetSpreads()))
	for i, s := range g.GetSpreads() {
		f := fmt.Sprintf("%s.spread[%d]", p, i)
		checkLabelKey(c, f+".label", s.GetLabel())
		if w := s.GetWeight(); w < 0 || w > 100 {
			c.add(f+".weight", "must be between 0 and 100 (got %d)", w)
		}
		sum := 0
		for _, v := range sortedKeys(s.GetTargets()) {
			pct := s.GetTargets()[v]
			tf := f + ".targets" + keyPath(v)
			checkLabelValue(c, tf, v)
			if pct < 0 || pct > 100 {
				c.add(tf, "must be a percentage between 0 and 100 (got %d)", pct)
			}
			sum += int(pct)
		}
		if sum > 100 {
			c.add(f+".targets", "percentages must add up to at most 100 (got %d)", sum)
		}
	}
	checkCount(c, p+".distinct_property", len(g.GetDistinctProperties()))
	for i, d := range g.GetDistinctProperties() {
		f := fmt.Sprintf("%s.distinct_property[%d]", p, i)
		checkLabelKey(c, f+".label", d.GetLabel())
		if m := d.GetMaxPerValue(); m < 0 || m > MaxCount {
			c.add(f+".max_per_value", "must be between 1 and %d (got %d)", MaxCount, m)
		}
	}
	if aa := g.GetAntiAffinity(); aa != nil {
		switch grp := aa.GetGroup(); {
		case grp == "":
			c.add(p+".anti_affinity.group", "is required")
		case !antiAffinityGroupRE.MatchString(grp):
			c.add(p+".anti_affinity.group", "must be 1-63 characters of a-z, 0-9, '-', '_' and '.', starting with a letter or digit (got %q)", grp)
		}
		if sc := aa.GetScope(); sc != "" && sc != AntiAffinityScopeNode {
			checkLabelKey(c, p+".anti_affinity.scope", sc)
		}
	}
	checkCount(c, p+".outputs", len(g.GetOutputs()))
	outs := map[string]bool{}
	for i, o := range g.GetOutputs() {
		f := fmt.Sprintf("%s.outputs[%d]", p, i)
		switch {
		case !outputNameRE.MatchString(o) || o == "." || o == "..":
			c.add(f, "must be 1-255 characters of letters, digits, '.', '_' and '-', not starting with '.' (got %q)", o)
		case outs[o]:
			c.add(f, "%q is listed twice", o)
		}
		outs[o] = true
	}
	checkCount(c, p+".datasets", len(g.GetDatasets()))
	for i, d := range g.GetDatasets() {
		f := fmt.Sprintf("%s.datasets[%d]", p, i)
		if d.GetName() == "" {
			c.add(f+".name", "is required")
		} else if !ValidDatasetName(d.GetName()) {
			c.add(f+".name", "must be at most %d printable characters", MaxDatasetNameLen)
		}
		if d.GetSizeBytes() < 0 {
			c.add(f+".size_bytes", "must be >= 0 (got %d)", d.GetSizeBytes())
		}
	}
	if t := g.GetTimeoutMs(); t < 0 || t > MaxTimeout.Milliseconds() {
		c.add(p+".timeout", "must be between 0 (no limit) and %s (got %s)", "168h (7 days)",
			time.Duration(t)*time.Millisecond)
	}
	for i, code := range g.GetRetryableExitCodes() {
		if code < 1 || code > 255 {
			c.add(fmt.Sprintf("%s.retryable_exit_codes[%d]", p, i), "must be an exit code between 1 and 255 (got %d)", code)
		}
	}
}

func validateResources(c *errs, p string, r *apiaryv1.Resources) {
	if r == nil {
		return
	}
	bound := func(f string, v, max int64) {
		switch {
		case v < 0:
			c.add(p+"."+f, "must be > 0 (got %d)", v)
		case v > max:
			c.add(p+"."+f, "must be at most %d (got %d)", max, v)
		}
	}
	bound("cpu_millis", r.GetCpuMillis(), MaxCPUMilli)
	bound("memory_mb", r.GetMemoryMb(), MaxMemoryMB)
	if g := r.GetGpus(); g < 0 || g > MaxGPUs {
		c.add(p+".gpus", "must be between 0 and %d (got %d)", MaxGPUs, g)
	}
	if g := r.GetGpuMilli(); g < 0 || g > MaxGPUMilli {
		c.add(p+".gpu_milli", "must be between 1 and %d thousandths of one GPU (got %d)", MaxGPUMilli, g)
	}
	if r.GetGpus() > 0 && r.GetGpuMilli() > 0 {
		c.add(p+".gpu_milli", "cannot be combined with gpus (ask for whole GPUs or a share of one)")
	}
	if len(r.GetGpuModels()) > MaxValues {
		c.add(p+".gpu_models", "at most %d models are allowed", MaxValues)
	}
	if len(r.GetGpuModels()) > 0 && r.GetGpus() == 0 && r.GetGpuMilli() == 0 {
		c.add(p+".gpu_models", "applies only to the GPUs a task asks for: set gpus or gpu_milli too (without them the models would be ignored)")
	}
	for i, m := range r.GetGpuModels() {
		if m == "" || len(m) > MaxLabelValLen || hasControl(m) {
			c.add(fmt.Sprintf("%s.gpu_models[%d]", p, i), "must be a non-empty model name of at most %d printable characters", MaxLabelValLen)
		}
	}
	lim := r.GetLimits()
	bound("limits.cpu_millis", lim.GetCpuMillis(), MaxCPUMilli)
	bound("limits.memory_mb", lim.GetMemoryMb(), MaxMemoryMB)
	if l := lim.GetCpuMillis(); l > 0 && l < MinCPULimitMillis {
		c.add(p+".limits.cpu_millis", "must be at least %d (the smallest CFS quota, 1 ms per 100 ms period; got %d)", MinCPULimitMillis, l)
	}
	if r.GetBestEffort() {
		// BestEffort (Kubernetes' QoS class) requests nothing: a request or
		// a limit would make it Burstable or Guaranteed.
		const rule = "cannot be set with best_effort: true (a BestEffort task requests nothing and has no limits; drop one or the other)"
		for _, f := range []struct {
			name string
			set  bool
		}{
			{"cpu_millis", r.GetCpuMillis() != 0},
			{"memory_mb", r.GetMemoryMb() != 0},
			{"gpus", r.GetGpus() != 0},
			{"gpu_milli", r.GetGpuMilli() != 0},
			{"limits", lim.GetCpuMillis() != 0 || lim.GetMemoryMb() != 0},
		} {
			if f.set {
				c.add(p+"."+f.name, "%s", rule)
			}
		}
		return
	}
	cpu, mem := requestsAfterDefaults(r)
	if l := lim.GetCpuMillis(); l > 0 && l < cpu {
		c.add(p+".limits.cpu_millis", "must be >= the request cpu_millis (%d millicores; got %d): a limit is the most an attempt may use", cpu, l)
	}
	if l := lim.GetMemoryMb(); l > 0 && l < mem {
		c.add(p+".limits.memory_mb", "must be >= the request memory_mb (%d MiB; got %d): a limit is the most an attempt may use", mem, l)
	}
}

// requestsAfterDefaults returns the CPU (millicores) and memory (MiB)
// requests r has once ApplyResourceDefaults ran: an unset request takes
// its limit, else its default; a best_effort task's stay 0.
func requestsAfterDefaults(r *apiaryv1.Resources) (cpuMillis, memoryMB int64) {
	if r.GetBestEffort() {
		return r.GetCpuMillis(), r.GetMemoryMb()
	}
	pick := func(req, limit, def int64) int64 {
		switch {
		case req != 0:
			return req
		case limit > 0:
			return limit
		}
		return def
	}
	return pick(r.GetCpuMillis(), r.GetLimits().GetCpuMillis(), DefaultCPUMillis),
		pick(r.GetMemoryMb(), r.GetLimits().GetMemoryMb(), DefaultMemoryMB)
}

// ApplyResourceDefaults fills a task group's unset requests, in place
// (ApplyDefaults calls it for every group): a request left unset (0) takes
// its limit when the limit is set (Kubernetes' rule: limits alone make the
// requests equal, so `limits: {cpu_millis: 500, memory_mb: 256}` is
// Guaranteed), else its default (cpu_millis 100, memory_mb 64). A
// best_effort group gets no requests: they stay 0, as BestEffort reserves
// nothing. Idempotent; nil is left alone.
func ApplyResourceDefaults(r *apiaryv1.Resources) {
	if r == nil {
		return
	}
	r.CpuMillis, r.MemoryMb = requestsAfterDefaults(r)
}

// QoSClass is the QoS class of a task group's resources as submitted,
// that is after ApplyResourceDefaults (qos.Of on the defaulted copy; r is
// not changed): Guaranteed when both limits equal their requests,
// BestEffort with best_effort, Burstable otherwise.
func QoSClass(r *apiaryv1.Resources) qos.Class {
	if r == nil {
		r = &apiaryv1.Resources{}
	}
	d := proto.Clone(r).(*apiaryv1.Resources)
	ApplyResourceDefaults(d)
	return qos.Of(d)
}

// validateRule checks a constraint or affinity: label, op and its arity.
func validateRule(c *errs, p, label, op string, values []string) {
	checkLabelKey(c, p+".label", label)
	if len(values) > MaxValues {
		c.add(p+".values", "at most %d values are allowed (got %d)", MaxValues, len(values))
	}
	for i, v := range values {
		checkLabelValue(c, fmt.Sprintf("%s.values[%d]", p, i), v)
	}
	switch op {
	case "exists", "not_exists":
		if len(values) != 0 {
			c.add(p+".values", "must be empty for op %q", op)
		}
	case "=", "!=":
		if len(values) != 1 {
			c.add(p+".values", "op %q needs exactly one value (got %d)", op, len(values))
		}
	case "<", ">":
		if len(values) != 1 {
			c.add(p+".values", "op %q needs exactly one value (got %d)", op, len(values))
		} else if f, err := strconv.ParseFloat(strings.TrimSpace(values[0]), 64); err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			c.add(p+".values[0]", "op %q needs a number (got %q)", op, values[0])
		}
	case "in", "not_in":
		if len(values) == 0 {
			c.add(p+".values", "op %q needs at least one value", op)
		}
	case "version":
		if len(values) != 1 {
			c.add(p+".values", "op \"version\" needs exactly one version constraint such as \">= 1.2, < 2\" (got %d values)", len(values))
		} else {
			for _, part := range strings.Split(values[0], ",") {
				if !versionRE.MatchString(strings.TrimSpace(part)) {
					c.add(p+".values[0]", "is not a version constraint such as \">= 1.2, < 2\" (got %q)", values[0])
					break
				}
			}
		}
	case "":
		c.add(p+".op", "is required (one of %s)", strings.Join(Ops, ", "))
	default:
		c.add(p+".op", "must be one of %s (got %q)", strings.Join(Ops, ", "), op)
	}
}

func checkCount(c *errs, p string, n int) {
	if n > MaxRules {
		c.add(p, "at most %d entries are allowed (got %d)", MaxRules, n)
	}
}

func checkName(c *errs, field, v string, max int, required bool) {
	switch {
	case v == "":
		if required {
			c.add(field, "is required")
		}
	case len(v) > max:
		c.add(field, "must be at most %d characters (got %d)", max, len(v))
	case !nameRE.MatchString(v):
		c.add(field, "must contain only letters, digits, '.', '_' and '-' (got %q)", v)
	}
}

func checkLabelKey(c *errs, field, k string) {
	switch {
	case k == "":
		c.add(field, "is required")
	case len(k) > MaxLabelKeyLen:
		c.add(field, "must be at most %d characters", MaxLabelKeyLen)
	case !labelKeyRE.MatchString(k):
		c.add(field, "must be a label name of letters, digits, '.', '_', '-' and '/', starting and ending with a letter or digit (got %q)", k)
	}
}

func checkLabelValue(c *errs, field, v string) {
	if len(v) > MaxLabelValLen {
		c.add(field, "must be at most %d characters", MaxLabelValLen)
	} else if hasControl(v) || !utf8.ValidString(v) {
		c.add(field, "must be printable UTF-8 text")
	}
}

func checkLabelMap(c *errs, p string, m map[string]string) {
	if len(m) > MaxValues {
		c.add(p, "at most %d labels are allowed (got %d)", MaxValues, len(m))
	}
	for _, k := range sortedKeys(m) {
		f := p + keyPath(k)
		checkLabelKey(c, f, k)
		checkLabelValue(c, f, m[k])
	}
}

// MaxDatasetNameLen bounds a dataset's name, in bytes.
const MaxDatasetNameLen = 512

// ValidDatasetName reports whether name may name a dataset: 1 to
// MaxDatasetNameLen bytes of UTF-8 without control characters. The rule of
// a job's datasets[].name, of the datasets a node reports (regional) and of
// the dataset directories an agent reports (agent).
func ValidDatasetName(name string) bool {
	return name != "" && len(name) <= MaxDatasetNameLen && utf8.ValidString(name) && !hasControl(name)
}

func hasControl(s string) bool {
	return strings.IndexFunc(s, unicode.IsControl) >= 0
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// TaskCount is the number of tasks spec expands to (a count of 0 counts as 1).
func TaskCount(spec *apiaryv1.JobSpec) int {
	n := 0
	for _, g := range spec.GetTasks() {
		if c := g.GetCount(); c > 0 {
			n += int(c)
		} else {
			n++
		}
	}
	return n
}

// Prepare returns a validated copy of spec with the defaults applied, leaving
// spec itself unchanged: what a server does with a submitted spec. Errors
// are Validate's.
func Prepare(spec *apiaryv1.JobSpec) (*apiaryv1.JobSpec, error) {
	c := proto.Clone(spec).(*apiaryv1.JobSpec)
	Normalize(c)
	if err := Validate(c); err != nil {
		return nil, err
	}
	ApplyDefaults(c)
	return c, nil
}

// Normalize lower-cases the values the sovereignty policy compares
// (jurisdiction, data_class), in place, so `EU` means `eu` and never silently
// matches no rule. Prepare calls it before validation; the payload hash of an
// idempotent submission is taken after it.
func Normalize(spec *apiaryv1.JobSpec) {
	if spec == nil {
		return
	}
	spec.Jurisdiction = strings.ToLower(spec.Jurisdiction)
	spec.DataClass = strings.ToLower(spec.DataClass)
}

// ApplyDefaults fills every zero value that has a documented default, in
// place: priority 50, max_attempts 3, namespace "default", and per task group
// count 1, the requests (ApplyResourceDefaults: cpu_millis and memory_mb
// take their limit when one is set, else 100 and 64; none for best_effort),
// distinct_property.max_per_value 1.
// It is idempotent; call it after Validate.
func ApplyDefaults(spec *apiaryv1.JobSpec) {
	if spec == nil {
		return
	}
	if spec.Priority == 0 {
		spec.Priority = DefaultPriority
	}
	if spec.MaxAttempts == 0 {
		spec.MaxAttempts = DefaultMaxAttempts
	}
	if spec.Namespace == "" {
		spec.Namespace = acl.DefaultNamespace
	}
	for _, g := range spec.Tasks {
		if g == nil {
			continue
		}
		if g.Count == 0 {
			g.Count = DefaultCount
		}
		if g.Resources == nil {
			g.Resources = &apiaryv1.Resources{}
		}
		ApplyResourceDefaults(g.Resources)
		for _, d := range g.DistinctProperties {
			if d != nil && d.MaxPerValue == 0 {
				d.MaxPerValue = DefaultMaxPerValue
			}
		}
		if g.AntiAffinity != nil && g.AntiAffinity.Scope == "" {
			g.AntiAffinity.Scope = AntiAffinityScopeNode
		}
	}
}

// checkFailover checks the failover block: after in [1s, 24h] (or 0 for the
// region's default), region names valid and distinct, and no secret_env
// (sealed under the home region's keyring, which no standby holds).
func checkFailover(c *errs, spec *apiaryv1.JobSpec, f *apiaryv1.Failover) {
	if f.GetDisabled() {
		if f.GetAfterMs() != 0 || len(f.GetRegions()) > 0 {
			c.add("failover.disabled", "is true: after and regions must be unset")
		}
		return
	}
	if a := f.GetAfterMs(); a != 0 && (a < MinFailoverAfter.Milliseconds() || a > MaxFailoverAfter.Milliseconds()) {
		c.add("failover.after", "must be between 1s and 24h, or 0 for the home region's --failover-after (got %s)", time.Duration(a)*time.Millisecond)
	}
	seen := map[string]bool{}
	for i, r := range f.GetRegions() {
		p := fmt.Sprintf("failover.regions[%d]", i)
		checkName(c, p, r, 64, true)
		if seen[r] {
			c.add(p, "duplicate region %q", r)
		}
		seen[r] = true
	}
	if HasSecrets(spec) {
		c.add("failover", "a job with secret_env cannot fail over: its values are sealed under the home region's keyring, which no standby region holds (use failover: off, or move the secrets out of the spec)")
	}
}
