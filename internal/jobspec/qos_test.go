package jobspec

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/qos"
)

// parseValidate parses and validates one job file like the CLI.
func parseValidate(src string) (*apiaryv1.JobSpec, error) {
	spec, err := Parse([]byte(src))
	if err != nil {
		return nil, err
	}
	return spec, Validate(spec)
}

func TestParseLimitsAndBestEffort(t *testing.T) {
	spec, err := parseValidate("name: q\ntasks:\n" +
		"- name: g\n  command: 'true'\n  resources: {cpu_millis: 500, memory_mb: 256, limits: {cpu_millis: 500, memory_mb: 256}}\n" +
		"- name: b\n  command: 'true'\n  resources: {best_effort: true}\n" +
		"- name: u\n  command: 'true'\n  resources: {memory_mb: 128, limits: {memory_mb: 512}}\n")
	if err != nil {
		t.Fatal(err)
	}
	g, b, u := spec.Tasks[0].Resources, spec.Tasks[1].Resources, spec.Tasks[2].Resources
	if g.GetLimits().GetCpuMillis() != 500 || g.GetLimits().GetMemoryMb() != 256 || g.GetBestEffort() {
		t.Fatalf("guaranteed group parsed as %v", g)
	}
	if !b.GetBestEffort() || b.GetLimits() != nil {
		t.Fatalf("best-effort group parsed as %v", b)
	}
	if u.GetLimits().GetMemoryMb() != 512 || u.GetLimits().GetCpuMillis() != 0 {
		t.Fatalf("burstable group parsed as %v", u)
	}
	for i, want := range []qos.Class{qos.Guaranteed, qos.BestEffort, qos.Burstable} {
		if got := QoSClass(spec.Tasks[i].Resources); got != want {
			t.Errorf("tasks[%d]: class %s, want %s", i, got, want)
		}
	}
}

func TestLimitsErrorMessages(t *testing.T) {
	task := "name: t\ntasks:\n- name: a\n  command: echo\n  resources: "
	cases := []struct{ res, want string }{
		// A limit below its request (an unset request takes its limit,
		// so only an explicit one can be above it).
		{"{memory_mb: 100, limits: {memory_mb: 50}}", "tasks[0].resources.limits.memory_mb: must be >= the request memory_mb (100 MiB; got 50)"},
		{"{cpu_millis: 500, limits: {cpu_millis: 200}}", "tasks[0].resources.limits.cpu_millis: must be >= the request cpu_millis (500 millicores; got 200)"},
		// Bounds.
		{"{limits: {memory_mb: 16777217}}", "tasks[0].resources.limits.memory_mb: must be at most 16777216"},
		{"{limits: {cpu_millis: 1000001}}", "tasks[0].resources.limits.cpu_millis: must be at most 1000000"},
		{"{limits: {cpu_millis: 5}}", "tasks[0].resources.limits.cpu_millis: must be at least 10"},
		{"{limits: {memory_mb: -1}}", "tasks[0].resources.limits.memory_mb: must be > 0 (got -1)"},
		{"{limits: {memory_mb: 0}}", "tasks[0].resources.limits.memory_mb: must be > 0 (omit it for no limit)"},
		{"{limits: {memory: 5}}", `tasks[0].resources.limits.memory: unknown field (did you mean "memory_mb"?)`},
		{"{limits: {gpus: 1}}", `tasks[0].resources.limits.gpus: unknown field`},
		{"{limits: 5}", "tasks[0].resources.limits: must be a mapping"},
		{"{limit: {memory_mb: 5}}", `tasks[0].resources.limit: unknown field (did you mean "limits"?)`},
		{"{requests: {memory_mb: 5}}", "tasks[0].resources.requests: unknown field (the requests are cpu_millis and memory_mb directly under resources"},
		{"{best-effort: true}", `tasks[0].resources.best-effort: unknown field (did you mean "best_effort"?)`},
		{"{best_effort: yes please}", "tasks[0].resources.best_effort: must be true or false"},
		// best_effort excludes every request and limit.
		{"{best_effort: true, cpu_millis: 100}", "tasks[0].resources.cpu_millis: cannot be set with best_effort: true"},
		{"{best_effort: true, memory_mb: 100}", "tasks[0].resources.memory_mb: cannot be set with best_effort: true"},
		{"{best_effort: true, gpus: 1}", "tasks[0].resources.gpus: cannot be set with best_effort: true"},
		{"{best_effort: true, gpu_milli: 250}", "tasks[0].resources.gpu_milli: cannot be set with best_effort: true"},
		{"{best_effort: true, limits: {memory_mb: 64}}", "tasks[0].resources.limits: cannot be set with best_effort: true"},
	}
	for _, tc := range cases {
		_, err := parseValidate(task + tc.res + "\n")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("resources %s: want an error containing %q, got: %v", tc.res, tc.want, err)
		}
	}
	// Accepted: limits equal to or above the requests, a limit alone (the
	// request takes it), best_effort alone or with best_effort: false.
	for _, res := range []string{
		"{cpu_millis: 500, memory_mb: 256, limits: {cpu_millis: 500, memory_mb: 256}}",
		"{memory_mb: 100, limits: {memory_mb: 100}}",
		"{limits: {memory_mb: 32}}",
		"{limits: {cpu_millis: 10}}",
		"{cpu_millis: 5}",
		"{best_effort: true}",
		"{best_effort: false, cpu_millis: 5}",
		"{best_effort: true, limits: {}}",
	} {
		if _, err := parseValidate(task + res + "\n"); err != nil {
			t.Errorf("resources %s refused: %v", res, err)
		}
	}
}

// TestValidateLimitsProtoSpec: the same rules for a spec sent over gRPC.
func TestValidateLimitsProtoSpec(t *testing.T) {
	cases := []struct {
		r     *apiaryv1.Resources
		field string
	}{
		{&apiaryv1.Resources{MemoryMb: 100, Limits: &apiaryv1.ResourceLimits{MemoryMb: 99}}, "tasks[0].resources.limits.memory_mb"},
		{&apiaryv1.Resources{Limits: &apiaryv1.ResourceLimits{CpuMillis: 50}, CpuMillis: 51}, "tasks[0].resources.limits.cpu_millis"},
		{&apiaryv1.Resources{Limits: &apiaryv1.ResourceLimits{CpuMillis: -1}}, "tasks[0].resources.limits.cpu_millis"},
		{&apiaryv1.Resources{BestEffort: true, CpuMillis: 100}, "tasks[0].resources.cpu_millis"},
		{&apiaryv1.Resources{BestEffort: true, Limits: &apiaryv1.ResourceLimits{CpuMillis: 100}}, "tasks[0].resources.limits"},
	}
	for i, tc := range cases {
		s := &apiaryv1.JobSpec{Name: "x", Tasks: []*apiaryv1.TaskGroup{{Name: "a", Command: "echo", Resources: tc.r}}}
		err := Validate(s)
		var ve *ValidationError
		if !errors.As(err, &ve) || !ve.Has(tc.field) {
			t.Errorf("case %d: want an error for %s, got %v", i, tc.field, err)
		}
	}
}

func TestApplyResourceDefaults(t *testing.T) {
	cases := []struct {
		in       *apiaryv1.Resources
		cpu, mem int64
		class    qos.Class
	}{
		// Limits alone: the requests take them, so the task is Guaranteed.
		{&apiaryv1.Resources{Limits: &apiaryv1.ResourceLimits{CpuMillis: 500, MemoryMb: 32}}, 500, 32, qos.Guaranteed},
		// One limit: that request takes it, the other its default.
		{&apiaryv1.Resources{Limits: &apiaryv1.ResourceLimits{MemoryMb: 512}}, DefaultCPUMillis, 512, qos.Burstable},
		{&apiaryv1.Resources{Limits: &apiaryv1.ResourceLimits{CpuMillis: 50}}, 50, DefaultMemoryMB, qos.Burstable},
		// An explicit request stays below its limit.
		{&apiaryv1.Resources{MemoryMb: 16, Limits: &apiaryv1.ResourceLimits{MemoryMb: 32, CpuMillis: 100}}, 100, 16, qos.Burstable},
		// No limits: the defaults.
		{&apiaryv1.Resources{}, DefaultCPUMillis, DefaultMemoryMB, qos.Burstable},
		// BestEffort: no requests at all.
		{&apiaryv1.Resources{BestEffort: true}, 0, 0, qos.BestEffort},
	}
	for i, tc := range cases {
		r := proto.Clone(tc.in).(*apiaryv1.Resources)
		if got := QoSClass(r); got != tc.class {
			t.Errorf("case %d: QoSClass %s, want %s", i, got, tc.class)
		}
		if !proto.Equal(r, tc.in) {
			t.Errorf("case %d: QoSClass changed its argument", i)
		}
		ApplyResourceDefaults(r)
		if r.CpuMillis != tc.cpu || r.MemoryMb != tc.mem {
			t.Errorf("case %d: requests cpu %d mem %d, want %d %d", i, r.CpuMillis, r.MemoryMb, tc.cpu, tc.mem)
		}
		if got := qos.Of(r); got != tc.class {
			t.Errorf("case %d: qos.Of after the defaults %s, want %s", i, got, tc.class)
		}
		before := proto.Clone(r)
		ApplyResourceDefaults(r)
		if !proto.Equal(before, r) {
			t.Errorf("case %d: not idempotent", i)
		}
	}
	ApplyResourceDefaults(nil) // must not panic
	if QoSClass(nil) != qos.Burstable {
		t.Error("nil resources are not Burstable")
	}
}

// TestPrepareBestEffortTwice: the CLI applies the defaults and the router
// and the region Prepare again; a BestEffort group must stay valid and keep
// zero requests all the way, and limits alone stay Guaranteed.
func TestPrepareBestEffortTwice(t *testing.T) {
	spec, err := parseValidate("name: q\ntasks:\n- name: b\n  command: 'true'\n  resources: {best_effort: true}\n" +
		"- name: g\n  command: 'true'\n  resources: {limits: {cpu_millis: 250, memory_mb: 32}}\n")
	if err != nil {
		t.Fatal(err)
	}
	ApplyDefaults(spec) // the CLI
	for range 2 {       // the router, then the region
		if spec, err = Prepare(spec); err != nil {
			t.Fatal(err)
		}
	}
	b, g := spec.Tasks[0].Resources, spec.Tasks[1].Resources
	if b.CpuMillis != 0 || b.MemoryMb != 0 || !b.BestEffort || qos.Of(b) != qos.BestEffort {
		t.Fatalf("best-effort group after Prepare: %v", b)
	}
	if g.CpuMillis != 250 || g.MemoryMb != 32 || qos.Of(g) != qos.Guaranteed {
		t.Fatalf("limits-only group after Prepare: %v", g)
	}
}

// TestPriorityClassNames: priority takes a class name for its value
// (internal/priority), and an unknown name is an error naming the field
// and the classes.
func TestPriorityClassNames(t *testing.T) {
	for name, want := range map[string]int32{"batch": 20, "standard": 50, "urgent": 90} {
		s, err := Parse([]byte("name: x\npriority: " + name + "\ntasks:\n  - name: a\n    command: \"true\"\n"))
		if err != nil || s.GetPriority() != want {
			t.Errorf("priority %s: %v, %d; want %d", name, err, s.GetPriority(), want)
		}
	}
	_, err := Parse([]byte("name: x\npriority: critical\ntasks:\n  - name: a\n    command: \"true\"\n"))
	if err == nil || !strings.Contains(err.Error(), "priority") || !strings.Contains(err.Error(), "batch, standard, urgent") {
		t.Errorf("unknown class: %v", err)
	}
}
