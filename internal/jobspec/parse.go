package jobspec

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"

	yamlv2 "go.yaml.in/yaml/v2"
	"sigs.k8s.io/yaml"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/priority"
)

// ParseFile reads and parses the job file at path. It never reads more than
// MaxFileBytes+1 bytes, so an oversized file is refused quickly. Errors the
// user can fix are *ValidationError; an unreadable file is a plain error
// wrapping the *os.PathError.
func ParseFile(path string) (*apiaryv1.JobSpec, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Mode().IsRegular() && st.Size() > MaxFileBytes {
		return nil, tooLarge(st.Size())
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxFileBytes {
		return nil, tooLarge(-1)
	}
	return Parse(data)
}

func tooLarge(n int64) error {
	var c errs
	if n >= 0 {
		c.add("", "job file is %d bytes; the limit is %d bytes (1 MiB)", n, MaxFileBytes)
	} else {
		c.add("", "job file is larger than the limit of %d bytes (1 MiB)", MaxFileBytes)
	}
	return c.err()
}

// Parse decodes a YAML job file into a JobSpec. Decoding is strict: an
// unknown field, a value of the wrong type, a duplicate key, a document that
// is not a mapping, more than one document or more than MaxFileBytes are
// errors, returned as a *ValidationError whose entries name the field path
// (tasks[0].resources.memory_mb: must be an integer). Parse does not run
// Validate; callers run both.
func Parse(data []byte) (*apiaryv1.JobSpec, error) {
	if len(data) > MaxFileBytes {
		return nil, tooLarge(int64(len(data)))
	}
	var c errs
	if len(bytes.TrimSpace(data)) == 0 {
		c.add("", "job file is empty")
		return nil, c.err()
	}
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		c.add("", "invalid YAML: %s", cleanYAMLError(err))
		return nil, c.err()
	}
	// Only a "---" can start a second document; skip the second parse if none.
	if bytes.Contains(data, []byte("---")) && countDocuments(data) > 1 {
		c.add("", "job file holds more than one YAML document (separated by ---); it must hold exactly one")
		return nil, c.err()
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	var root any
	if err := dec.Decode(&root); err != nil {
		c.add("", "invalid YAML: %v", err)
		return nil, c.err()
	}
	switch root.(type) {
	case map[string]any:
	case nil:
		c.add("", "job file is empty")
		return nil, c.err()
	default:
		c.add("", "job file must be a YAML mapping of fields (name, tasks, ...), not %s", describe(root))
		return nil, c.err()
	}
	d := &decoder{errs: &c}
	spec := d.jobSpec(root)
	if c.err() != nil {
		// Report the rules broken by the fields that did decode too, so one
		// run shows every problem (a decoding error used to hide them until
		// it was fixed). A rule about a field related to one that failed to
		// decode (the same, a parent or a child path) is left out: it would
		// only restate that failure.
		var ve *ValidationError
		if errors.As(Validate(spec), &ve) {
			for _, fe := range ve.Errors {
				if !c.related(fe.Field) {
					c.add(fe.Field, "%s", fe.Rule)
				}
			}
		}
		return nil, c.err()
	}
	return spec, nil
}

// related reports whether field is, contains or lies inside a field that
// already has an error.
func (c *errs) related(field string) bool {
	within := func(a, b string) bool { // a is b or lies inside it
		return a == b || b == "" || strings.HasPrefix(a, b+".") || strings.HasPrefix(a, b+"[")
	}
	for _, fe := range c.list {
		if within(field, fe.Field) || within(fe.Field, field) {
			return true
		}
	}
	return false
}

var yamlPrefix = regexp.MustCompile(`^(error converting YAML to JSON: )?(yaml: )?`)

func cleanYAMLError(err error) string {
	s := yamlPrefix.ReplaceAllString(err.Error(), "")
	s = strings.ReplaceAll(s, "unmarshal errors:\n  ", "")
	return strings.ReplaceAll(s, "\n  ", "; ")
}

// countDocuments counts the non-empty YAML documents in data, stopping at 2
// (a parse error after the first counts as another document).
func countDocuments(data []byte) int {
	d := yamlv2.NewDecoder(bytes.NewReader(data))
	n := 0
	for {
		var v any
		err := d.Decode(&v)
		if errors.Is(err, io.EOF) {
			return n
		}
		if err != nil {
			return n + 1
		}
		if v != nil {
			n++
		}
		if n > 1 {
			return n
		}
	}
}

// decoder walks the generic JSON tree and fills the proto, recording an error
// with the field path for everything it cannot take.
type decoder struct{ errs *errs }

type handler func(path string, v any)

// object decodes a mapping: each present key goes to its handler, in sorted
// order so errors are deterministic; unknown keys are errors. A null value is
// treated as absent.
func (d *decoder) object(path string, v any, fields map[string]handler) {
	m, ok := v.(map[string]any)
	if !ok {
		d.typeErr(path, "a mapping", v)
		return
	}
	for _, k := range sortedKeys(m) {
		p := join(path, k)
		h, known := fields[k]
		if !known {
			d.errs.add(p, "unknown field%s", suggest(k, fields))
			continue
		}
		if m[k] == nil {
			continue
		}
		h(p, m[k])
	}
}

// list decodes a sequence, calling each for every element.
func (d *decoder) list(path string, v any, each func(path string, v any)) {
	l, ok := v.([]any)
	if !ok {
		d.typeErr(path, "a list", v)
		return
	}
	for i, e := range l {
		each(fmt.Sprintf("%s[%d]", path, i), e)
	}
}

// listOrOne accepts a list or a single mapping (as a list of one).
func (d *decoder) listOrOne(path string, v any, each func(path string, v any)) {
	if m, ok := v.(map[string]any); ok {
		each(path, m)
		return
	}
	d.list(path, v, each)
}

func (d *decoder) typeErr(path, want string, got any) {
	hint := ""
	if want == "a string" {
		switch got.(type) {
		case json.Number, bool:
			hint = "; quote it"
		}
	}
	d.errs.add(path, "must be %s (got %s%s)", want, describe(got), hint)
}

func (d *decoder) str(path string, v any, dst *string) {
	s, ok := v.(string)
	if !ok {
		d.typeErr(path, "a string", v)
		return
	}
	*dst = s
}

func (d *decoder) boolean(path string, v any, dst *bool) {
	b, ok := v.(bool)
	if !ok {
		d.typeErr(path, "true or false", v)
		return
	}
	*dst = b
}

func (d *decoder) integer(path string, v any, min, max int64) (int64, bool) {
	n, ok := v.(json.Number)
	if !ok {
		d.typeErr(path, "an integer", v)
		return 0, false
	}
	i, err := n.Int64()
	if err != nil {
		d.typeErr(path, "an integer", v)
		return 0, false
	}
	if i < min || i > max {
		d.errs.add(path, "must be an integer between %d and %d (got %d)", min, max, i)
		return 0, false
	}
	return i, true
}

func (d *decoder) int32v(path string, v any, dst *int32) {
	if i, ok := d.integer(path, v, math.MinInt32, math.MaxInt32); ok {
		*dst = int32(i)
	}
}

// positive32 is an int32 field whose 0 means "default" in the proto; an
// explicit 0 in a file is refused so the user is not surprised.
func (d *decoder) positive32(path string, v any, dst *int32, def string) {
	var x int32
	d.int32v(path, v, &x)
	if x == 0 && isZero(v) {
		d.errs.add(path, "must be > 0 (omit it for the default, %s)", def)
		return
	}
	*dst = x
}

func (d *decoder) int64v(path string, v any, dst *int64) {
	if i, ok := d.integer(path, v, math.MinInt64, math.MaxInt64); ok {
		*dst = i
	}
}

func (d *decoder) positive64(path string, v any, dst *int64, def string) {
	var x int64
	d.int64v(path, v, &x)
	if x == 0 && isZero(v) {
		d.errs.add(path, "must be > 0 (omit it for the default, %s)", def)
		return
	}
	*dst = x
}

func isZero(v any) bool {
	n, ok := v.(json.Number)
	if !ok {
		return false
	}
	i, err := n.Int64()
	return err == nil && i == 0
}

func (d *decoder) strList(path string, v any, dst *[]string) {
	d.list(path, v, func(p string, e any) {
		var s string
		d.str(p, e, &s)
		*dst = append(*dst, s)
	})
}

func (d *decoder) strMap(path string, v any, dst *map[string]string) {
	m, ok := v.(map[string]any)
	if !ok {
		d.typeErr(path, "a mapping of strings", v)
		return
	}
	out := make(map[string]string, len(m))
	for _, k := range sortedKeys(m) {
		var s string
		d.str(path+keyPath(k), m[k], &s)
		out[k] = s
	}
	*dst = out
}

// duration decodes a duration string into ms; zero says what 0 means (for
// the error of a duration below 1 ms).
func (d *decoder) duration(path string, v any, dstMs *int64, zero string) {
	s, ok := v.(string)
	if !ok {
		if isZero(v) {
			*dstMs = 0
			return
		}
		d.errs.add(path, "must be a duration such as \"30s\" or \"5m\" (got %s; a bare number has no unit)", describe(v))
		return
	}
	dur, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		d.errs.add(path, "must be a duration such as \"30s\" or \"5m\" (got %q)", s)
		return
	}
	if dur != 0 && dur > -time.Millisecond && dur < time.Millisecond {
		d.errs.add(path, "must be at least 1ms, or 0 for %s (got %s)", zero, dur)
		return
	}
	*dstMs = dur.Milliseconds()
}

func (d *decoder) jobSpec(v any) *apiaryv1.JobSpec {
	s := &apiaryv1.JobSpec{}
	d.object("", v, map[string]handler{
		"name": func(p string, v any) { d.str(p, v, &s.Name) },
		"priority": func(p string, v any) {
			if name, ok := v.(string); ok {
				// A class name stands for its value (internal/priority).
				x, ok := priority.Value(strings.ToLower(strings.TrimSpace(name)))
				if !ok {
					d.errs.add(p, "must be an integer 1..%d or a priority class: %s (got %q)", MaxPriority, strings.Join(priority.Classes, ", "), name)
					return
				}
				s.Priority = x
				return
			}
			var x int32
			d.int32v(p, v, &x)
			if x == 0 && isZero(v) {
				d.errs.add(p, "must be between 1 and %d (0 means the default, %d; omit the field for it)", MaxPriority, DefaultPriority)
				return
			}
			s.Priority = x
		},
		"region":       func(p string, v any) { s.Region = d.region(p, v) },
		"jurisdiction": func(p string, v any) { d.str(p, v, &s.Jurisdiction) },
		"data_class":   func(p string, v any) { d.str(p, v, &s.DataClass) },
		"max_attempts": func(p string, v any) { d.positive32(p, v, &s.MaxAttempts, fmt.Sprint(DefaultMaxAttempts)) },
		"scheduler":    func(p string, v any) { d.str(p, v, &s.Scheduler) },
		"namespace":    func(p string, v any) { d.str(p, v, &s.Namespace) },
		"disconnect": func(p string, v any) {
			dc := &apiaryv1.Disconnect{}
			d.object(p, v, map[string]handler{
				"lost_after": func(p string, v any) { d.duration(p, v, &dc.LostAfterMs, "the agent's --disconnect-grace") },
				"replace": func(p string, v any) {
					var b bool
					d.boolean(p, v, &b)
					dc.Replace = &b
				},
			})
			s.Disconnect = dc
		},
		"failover": func(p string, v any) { s.Failover = d.failover(p, v) },
		"tasks": func(p string, v any) {
			d.list(p, v, func(p string, v any) { s.Tasks = append(s.Tasks, d.task(p, v)) })
		},
	})
	return s
}

// failover reads `failover: {after: 60s, regions: [a, b] | auto, disabled:
// true}`; `failover: off` (or false) is `disabled: true`, `failover: on`
// (or true) is `{}`: the home region's defaults.
func (d *decoder) failover(path string, v any) *apiaryv1.Failover {
	f := &apiaryv1.Failover{}
	if b, ok := v.(bool); ok {
		f.Disabled = !b
		return f
	}
	if s, ok := v.(string); ok {
		switch strings.ToLower(strings.TrimSpace(s)) {
		case "off":
			f.Disabled = true
			return f
		case "on":
			return f
		}
		d.errs.add(path, "must be on, off or a mapping such as {after: 60s, regions: [eu-central]} (got %q)", s)
		return f
	}
	d.object(path, v, map[string]handler{
		"after": func(p string, v any) { d.duration(p, v, &f.AfterMs, "the home region's --failover-after") },
		"regions": func(p string, v any) {
			if s, ok := v.(string); ok {
				if !strings.EqualFold(strings.TrimSpace(s), "auto") {
					d.errs.add(p, "must be a list of region names or \"auto\" (got %q)", s)
				}
				return
			}
			d.strList(p, v, &f.Regions)
			for i, r := range f.Regions {
				if strings.EqualFold(strings.TrimSpace(r), "auto") {
					d.errs.add(fmt.Sprintf("%s[%d]", p, i), "\"auto\" is not a region name: write regions: auto (not in a list) to let the home region choose")
				}
			}
		},
		"disabled": func(p string, v any) { d.boolean(p, v, &f.Disabled) },
	})
	return f
}

func (d *decoder) region(path string, v any) *apiaryv1.RegionSpec {
	r := &apiaryv1.RegionSpec{}
	d.object(path, v, map[string]handler{
		"selector": func(p string, v any) { d.strMap(p, v, &r.Selector) },
		"prefer":   func(p string, v any) { d.strList(p, v, &r.Prefer) },
	})
	return r
}

func (d *decoder) task(path string, v any) *apiaryv1.TaskGroup {
	t := &apiaryv1.TaskGroup{}
	d.object(path, v, map[string]handler{
		"name":       func(p string, v any) { d.str(p, v, &t.Name) },
		"count":      func(p string, v any) { d.positive32(p, v, &t.Count, "1") },
		"command":    func(p string, v any) { d.str(p, v, &t.Command) },
		"args":       func(p string, v any) { d.strList(p, v, &t.Args) },
		"env":        func(p string, v any) { d.envMap(p, v, &t.Env, &t.SecretEnv) },
		"secret_env": func(p string, v any) { d.secretMap(p, v, &t.SecretEnv) },
		"resources":  func(p string, v any) { t.Resources = d.resources(p, v) },
		"constraints": func(p string, v any) {
			d.list(p, v, func(p string, v any) {
				k := &apiaryv1.Constraint{}
				d.rule(p, v, &k.Label, &k.Op, &k.Values, nil)
				t.Constraints = append(t.Constraints, k)
			})
		},
		"affinities": func(p string, v any) {
			d.list(p, v, func(p string, v any) {
				a := &apiaryv1.Affinity{}
				d.rule(p, v, &a.Label, &a.Op, &a.Values, &a.Weight)
				t.Affinities = append(t.Affinities, a)
			})
		},
		"spread": func(p string, v any) {
			d.listOrOne(p, v, func(p string, v any) { t.Spreads = append(t.Spreads, d.spread(p, v)) })
		},
		"distinct_hosts": func(p string, v any) { d.boolean(p, v, &t.DistinctHosts) },
		"anti_affinity": func(p string, v any) {
			aa := &apiaryv1.AntiAffinity{}
			d.object(p, v, map[string]handler{
				"group": func(p string, v any) { d.str(p, v, &aa.Group) },
				"scope": func(p string, v any) { d.str(p, v, &aa.Scope) },
			})
			t.AntiAffinity = aa
		},
		"distinct_property": func(p string, v any) {
			d.listOrOne(p, v, func(p string, v any) {
				dp := &apiaryv1.DistinctProperty{}
				d.object(p, v, map[string]handler{
					"label":         func(p string, v any) { d.str(p, v, &dp.Label) },
					"max_per_value": func(p string, v any) { d.positive32(p, v, &dp.MaxPerValue, fmt.Sprint(DefaultMaxPerValue)) },
				})
				t.DistinctProperties = append(t.DistinctProperties, dp)
			})
		},
		"datasets": func(p string, v any) {
			d.list(p, v, func(p string, v any) {
				ds := &apiaryv1.Dataset{}
				d.object(p, v, map[string]handler{
					"name":       func(p string, v any) { d.str(p, v, &ds.Name) },
					"size_bytes": func(p string, v any) { d.int64v(p, v, &ds.SizeBytes) },
				})
				t.Datasets = append(t.Datasets, ds)
			})
		},
		"after":   func(p string, v any) { d.strList(p, v, &t.After) },
		"outputs": func(p string, v any) { d.strList(p, v, &t.Outputs) },
		"timeout": func(p string, v any) { d.duration(p, v, &t.TimeoutMs, "no limit") },
		"retryable_exit_codes": func(p string, v any) {
			d.list(p, v, func(p string, v any) {
				var x int32
				d.int32v(p, v, &x)
				t.RetryableExitCodes = append(t.RetryableExitCodes, x)
			})
		},
	})
	return t
}

func (d *decoder) resources(path string, v any) *apiaryv1.Resources {
	r := &apiaryv1.Resources{}
	d.object(path, v, map[string]handler{
		"cpu_millis": func(p string, v any) { d.positive64(p, v, &r.CpuMillis, fmt.Sprint(DefaultCPUMillis)) },
		"memory_mb":  func(p string, v any) { d.positive64(p, v, &r.MemoryMb, fmt.Sprint(DefaultMemoryMB)) },
		"gpus":       func(p string, v any) { d.int32v(p, v, &r.Gpus) },
		"gpu_milli":  func(p string, v any) { d.int32v(p, v, &r.GpuMilli) },
		"gpu_models": func(p string, v any) { d.strList(p, v, &r.GpuModels) },
		"limits": func(p string, v any) {
			l := &apiaryv1.ResourceLimits{}
			d.object(p, v, map[string]handler{
				"cpu_millis": func(p string, v any) { d.limit64(p, v, &l.CpuMillis) },
				"memory_mb":  func(p string, v any) { d.limit64(p, v, &l.MemoryMb) },
			})
			r.Limits = l
		},
		"best_effort": func(p string, v any) { d.boolean(p, v, &r.BestEffort) },
	})
	return r
}

// limit64 is a limit (resources.limits.*), whose 0 means "no limit" in the
// proto; an explicit 0 in a file is refused, as for positive64.
func (d *decoder) limit64(path string, v any, dst *int64) {
	var x int64
	d.int64v(path, v, &x)
	if x == 0 && isZero(v) {
		d.errs.add(path, "must be > 0 (omit it for no limit)")
		return
	}
	*dst = x
}

// rule decodes a constraint (weight == nil) or an affinity.
func (d *decoder) rule(path string, v any, label, op *string, values *[]string, weight *int32) {
	fields := map[string]handler{
		"label":  func(p string, v any) { d.str(p, v, label) },
		"op":     func(p string, v any) { d.str(p, v, op) },
		"values": func(p string, v any) { d.strList(p, v, values) },
	}
	if weight != nil {
		fields["weight"] = func(p string, v any) { d.int32v(p, v, weight) }
	}
	d.object(path, v, fields)
}

func (d *decoder) spread(path string, v any) *apiaryv1.Spread {
	s := &apiaryv1.Spread{}
	d.object(path, v, map[string]handler{
		"label":  func(p string, v any) { d.str(p, v, &s.Label) },
		"weight": func(p string, v any) { d.int32v(p, v, &s.Weight) },
		"targets": func(p string, v any) {
			m, ok := v.(map[string]any)
			if !ok {
				d.typeErr(p, "a mapping of label value to percent", v)
				return
			}
			s.Targets = make(map[string]int32, len(m))
			for _, k := range sortedKeys(m) {
				var x int32
				d.int32v(p+keyPath(k), m[k], &x)
				s.Targets[k] = x
			}
		},
	})
	return s
}

// describe names a decoded value's YAML type for an error message.
func describe(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case string:
		if len(x) > 40 {
			x = x[:40] + "..."
		}
		return fmt.Sprintf("string %q", x)
	case json.Number:
		return "number " + x.String()
	case bool:
		return fmt.Sprintf("boolean %v", x)
	case []any:
		return "a list"
	case map[string]any:
		return "a mapping"
	}
	return fmt.Sprintf("%T", v)
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

var plainKey = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// keyPath renders a map key as a path element: .KEY, or ["key"] when the key
// holds characters that would make the path ambiguous.
func keyPath(k string) string {
	if plainKey.MatchString(k) {
		return "." + k
	}
	return fmt.Sprintf("[%q]", k)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// aliases maps likely mistakes to the field meant.
var aliases = map[string]string{
	"cpu": "cpu_millis", "memory": "memory_mb", "mem": "memory_mb", "gpu": "gpus",
	"spreads": "spread", "distinct_properties": "distinct_property",
	"timeout_ms": "timeout", "constraint": "constraints", "affinity": "affinities",
	"cmd": "command", "arguments": "args", "environment": "env", "task": "tasks",
	"retry_exit_codes": "retryable_exit_codes", "selectors": "selector",
	"secrets": "secret_env", "secret_environment": "secret_env",
	"limit": "limits", "besteffort": "best_effort", "best-effort": "best_effort",
}

// hints explain a field that does not exist because the file says it
// another way; given when the mapping has the field named (Kubernetes'
// resources.requests: the requests are resources.cpu_millis and memory_mb).
var hints = map[string]struct{ field, hint string }{
	"requests": {"limits", " (the requests are cpu_millis and memory_mb directly under resources; only limits has a mapping of its own)"},
}

// suggest returns ` (did you mean "x"?)` for a near miss, or "".
func suggest(k string, fields map[string]handler) string {
	if h, ok := hints[strings.ToLower(k)]; ok {
		if _, known := fields[h.field]; known {
			return h.hint
		}
	}
	if a, ok := aliases[strings.ToLower(k)]; ok {
		if _, known := fields[a]; known {
			return fmt.Sprintf(" (did you mean %q?)", a)
		}
	}
	best, bestD := "", 3
	for f := range fields {
		if dd := editDistance(strings.ToLower(k), f); dd < bestD || (dd == bestD && f < best) {
			best, bestD = f, dd
		}
	}
	if best != "" && bestD <= 2 && len(k) > 2 {
		return fmt.Sprintf(" (did you mean %q?)", best)
	}
	return ""
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
