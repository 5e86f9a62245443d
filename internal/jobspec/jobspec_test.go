package jobspec

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"

	"apiary.dev/apiary/internal/testutil"
)

// load parses and validates like the CLI does.
func load(path string) (*apiaryv1.JobSpec, error) {
	spec, err := ParseFile(path)
	if err != nil {
		return nil, err
	}
	if err := Validate(spec); err != nil {
		return nil, err
	}
	return spec, nil
}

func TestMalformedFiles(t *testing.T) {
	files, err := filepath.Glob("testdata/malformed/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 20 {
		t.Fatalf("want at least 20 malformed files, have %d", len(files))
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			want := testutil.ReadExpectation(t, path)
			_, err := load(path)
			if err == nil {
				t.Fatal("accepted a malformed file")
			}
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("error is %T, want *ValidationError: %v", err, err)
			}
			if want.Field != "" {
				if !ve.Has(want.Field) {
					t.Fatalf("no error names %q; got:\n%v", want.Field, err)
				}
				if !strings.Contains(err.Error(), want.Field+": ") {
					t.Fatalf("message does not name %q: %v", want.Field, err)
				}
			} else if !strings.Contains(err.Error(), want.Message) {
				t.Fatalf("message does not contain %q: %v", want.Message, err)
			}
			t.Logf("%v", err)
		})
	}
}

func TestHugeFileRejectedFast(t *testing.T) {
	path := filepath.Join(t.TempDir(), "huge.yaml")
	var b bytes.Buffer
	b.WriteString("name: huge\ntasks:\n")
	for b.Len() < 10<<20 {
		b.WriteString("  - name: t\n    command: echo\n    args: [\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"]\n")
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := ParseFile(path)
	if err == nil || !strings.Contains(err.Error(), "limit") || !strings.Contains(err.Error(), "1 MiB") {
		t.Fatalf("want a size-limit error, got %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("rejecting a 10 MB file took %v", d)
	}
	// Parse on the bytes too (the server-side path has bytes, not a file).
	start = time.Now()
	if _, err := Parse(b.Bytes()); err == nil || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("Parse: want a size-limit error, got %v", err)
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Fatalf("Parse of 10 MB took %v", d)
	}
}

func TestExamplesParseAndValidate(t *testing.T) {
	files, err := filepath.Glob("../../examples/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"hello.yaml": true, "fanout.yaml": true, "retry.yaml": true, "constrained.yaml": true, "eu-pinned.yaml": true}
	for _, path := range files {
		delete(want, filepath.Base(path))
		t.Run(filepath.Base(path), func(t *testing.T) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.HasPrefix(data, []byte("# ")) {
				t.Error("example has no comment header")
			}
			spec, err := load(path)
			if err != nil {
				t.Fatalf("example does not validate:\n%v", err)
			}
			ApplyDefaults(spec)
			if err := Validate(spec); err != nil {
				t.Fatalf("defaulted example does not validate:\n%v", err)
			}
		})
	}
	for name := range want {
		t.Errorf("examples/%s is missing", name)
	}
}

func TestParseFullSpec(t *testing.T) {
	src := `
name: full
priority: 70
region:
  selector: {tier: gold, "apiary.dev/zone": a}
  prefer: [eu-west, eu-central]
jurisdiction: eu
data_class: personal
max_attempts: 5
scheduler: spread
disconnect: {lost_after: 10m, replace: false}
tasks:
  - name: main
    count: 3
    command: /bin/sh
    args: ["-c", "echo hi"]
    env: {FOO: bar}
    resources: {cpu_millis: 250, memory_mb: 128, gpus: 1, gpu_models: [a100]}
    constraints:
      - {label: arch, op: "=", values: [amd64]}
      - {label: maintenance, op: not_exists}
      - {label: driver, op: version, values: [">= 1.2, < 2.0"]}
      - {label: cores, op: ">", values: ["4"]}
    affinities:
      - {label: zone, op: in, values: [a, b], weight: -20}
    spread:
      label: zone
      targets: {a: 60, b: 40}
      weight: 50
    distinct_hosts: true
    anti_affinity: {group: db.primary, scope: topology.kubernetes.io/zone}
    distinct_property: [{label: rack, max_per_value: 2}]
    datasets: [{name: s3://bucket/x, size_bytes: 1000000}]
    timeout: 1m30s
    retryable_exit_codes: [75, 3]
  - name: side
    command: "true"
    resources: {gpu_milli: 250}
    timeout: 500ms
`
	spec, err := Parse([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if err := Validate(spec); err != nil {
		t.Fatal(err)
	}
	want := &apiaryv1.JobSpec{
		Name: "full", Priority: 70, Jurisdiction: "eu", DataClass: "personal", MaxAttempts: 5, Scheduler: "spread",
		Disconnect: &apiaryv1.Disconnect{LostAfterMs: 600000, Replace: proto.Bool(false)},
		Region:     &apiaryv1.RegionSpec{Selector: map[string]string{"tier": "gold", "apiary.dev/zone": "a"}, Prefer: []string{"eu-west", "eu-central"}},
		Tasks: []*apiaryv1.TaskGroup{{
			Name: "main", Count: 3, Command: "/bin/sh", Args: []string{"-c", "echo hi"}, Env: map[string]string{"FOO": "bar"},
			Resources: &apiaryv1.Resources{CpuMillis: 250, MemoryMb: 128, Gpus: 1, GpuModels: []string{"a100"}},
			Constraints: []*apiaryv1.Constraint{
				{Label: "arch", Op: "=", Values: []string{"amd64"}},
				{Label: "maintenance", Op: "not_exists"},
				{Label: "driver", Op: "version", Values: []string{">= 1.2, < 2.0"}},
				{Label: "cores", Op: ">", Values: []string{"4"}},
			},
			Affinities:         []*apiaryv1.Affinity{{Label: "zone", Op: "in", Values: []string{"a", "b"}, Weight: -20}},
			Spreads:            []*apiaryv1.Spread{{Label: "zone", Targets: map[string]int32{"a": 60, "b": 40}, Weight: 50}},
			DistinctHosts:      true,
			AntiAffinity:       &apiaryv1.AntiAffinity{Group: "db.primary", Scope: "topology.kubernetes.io/zone"},
			DistinctProperties: []*apiaryv1.DistinctProperty{{Label: "rack", MaxPerValue: 2}},
			Datasets:           []*apiaryv1.Dataset{{Name: "s3://bucket/x", SizeBytes: 1000000}},
			TimeoutMs:          90000,
			RetryableExitCodes: []int32{75, 3},
		}, {
			Name: "side", Command: "true", Resources: &apiaryv1.Resources{GpuMilli: 250}, TimeoutMs: 500,
		}},
	}
	if !proto.Equal(spec, want) {
		t.Fatalf("got  %v\nwant %v", spec, want)
	}
	if n := TaskCount(spec); n != 4 {
		t.Fatalf("TaskCount = %d, want 4", n)
	}
}

func TestErrorMessages(t *testing.T) {
	cases := []struct {
		src, want string
	}{
		{"name: t\ntasks:\n- name: a\n  command: echo\n  resources: {memory_mb: 1.5}\n", "tasks[0].resources.memory_mb: must be an integer (got number 1.5)"},
		{"name: t\ntasks:\n- name: a\n  command: echo\n  resources: {memory_mb: -5}\n", "tasks[0].resources.memory_mb: must be > 0"},
		{"name: t\ntasks:\n- name: a\n  command: echo\n  resources: {memory_mb: 0}\n", "tasks[0].resources.memory_mb: must be > 0 (omit it for the default, 64)"},
		{"name: t\ntasks:\n- name: a\n  command: echo\n  resources: {memory: 5}\n", `tasks[0].resources.memory: unknown field (did you mean "memory_mb"?)`},
		{"name: t\ntasks:\n- name: a\n  commnd: echo\n", `tasks[0].commnd: unknown field (did you mean "command"?)`},
		{"name: 12\ntasks:\n- name: a\n  command: echo\n", "name: must be a string (got number 12; quote it)"},
		{"name: t\ntasks:\n- name: a\n  command: echo\n  timeout: 100us\n", "tasks[0].timeout: must be at least 1ms"},
		{"name: t\ntasks:\n- name: a\n  command: echo\n  env: {\"1BAD\": x}\n", "tasks[0].env.1BAD: must be a valid variable name"},
		{"name: t\nregion: {selector: {\"bad key!\": x}}\ntasks:\n- name: a\n  command: echo\n", `region.selector["bad key!"]: must be a label name`},
		{"name: t\ntasks:\n- name: a\n  command: echo\n  constraints: [{label: v, op: version, values: [banana]}]\n", "tasks[0].constraints[0].values[0]: is not a version constraint"},
		{"name: t\ntasks:\n- name: a\n  command: echo\n  constraints: [{label: v, op: in}]\n", `tasks[0].constraints[0].values: op "in" needs at least one value`},
		{"name: t\ntasks:\n- name: a\n  command: echo\n  constraints: [{label: v, op: \"=\", values: [a, b]}]\n", `tasks[0].constraints[0].values: op "=" needs exactly one value (got 2)`},
		{"name: t\ntasks:\n- name: a\n  command: echo\n  resources: {gpu_milli: 1000}\n", "tasks[0].resources.gpu_milli: must be between 1 and 999"},
		{"name: t\ntasks:\n- name: a\n  command: echo\n  count: 99999999999\n", "tasks[0].count: must be an integer between"},
		{"name: t\npriority: 0\ntasks:\n- name: a\n  command: echo\n", "priority: must be between 1 and 100"},
		{"name: t\ntasks:\n- name: a\n  command: echo\n  anti_affinity: {scope: zone}\n", "tasks[0].anti_affinity.group: is required"},
		{"name: t\ntasks:\n- name: a\n  command: echo\n  anti_affinity: {group: DB}\n", `tasks[0].anti_affinity.group: must be 1-63 characters of a-z, 0-9, '-', '_' and '.', starting with a letter or digit (got "DB")`},
		{"name: t\ntasks:\n- name: a\n  command: echo\n  anti_affinity: {group: db/x}\n", `tasks[0].anti_affinity.group: must be 1-63`},
		{"name: t\ntasks:\n- name: a\n  command: echo\n  anti_affinity: {group: db, scope: \"bad label!\"}\n", `tasks[0].anti_affinity.scope: must be a label name`},
		{"name: t\ntasks:\n- name: a\n  command: echo\n  anti_affinity: {group: db, scop: zone}\n", `tasks[0].anti_affinity.scop: unknown field (did you mean "scope"?)`},
		{"name: t\ntasks:\n- name: a\n  command: echo\n  anti_affinity: db\n", `tasks[0].anti_affinity: must be a mapping`},
		{"name: t\ntasks:\n- name: a\n  command: echo\n  after: [b]\n", `tasks[0].after[0]: "b" is not a task group of this job`},
		{"name: t\ntasks:\n- name: a\n  command: echo\n  after: [a]\n", `tasks[0].after[0]: a task group cannot come after itself`},
		{"name: t\ntasks:\n- name: a\n  command: echo\n  after: [b]\n- name: b\n  command: echo\n  after: [c]\n- name: c\n  command: echo\n  after: [a]\n", `after: the task groups' after lists form a cycle`},
		{"name: t\ntasks:\n- name: a\n  command: echo\n- name: b\n  command: echo\n  after: [a, a]\n", `tasks[1].after[1]: "a" is listed twice`},
		{"name: t\ntasks:\n- name: a\n  command: echo\n  outputs: [\"x/y\"]\n", `tasks[0].outputs[0]: must be 1-255 characters of letters, digits`},
		{"name: t\ntasks:\n- name: a\n  command: echo\n  outputs: [\"..\"]\n", `tasks[0].outputs[0]: must be 1-255`},
		{"name: t\ntasks:\n- name: a\n  command: echo\n  outputs: [p, p]\n", `tasks[0].outputs[1]: "p" is listed twice`},
		{"name: t\ntasks:\n- name: a\n  command: echo\n  outputs: [.hidden]\n", `tasks[0].outputs[0]: must be 1-255 characters of letters, digits, '.', '_' and '-', not starting with '.'`},
	}
	for _, tc := range cases {
		spec, err := Parse([]byte(tc.src))
		if err == nil {
			err = Validate(spec)
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("source:\n%s\nwant error containing %q, got: %v", tc.src, tc.want, err)
		}
	}
}

func TestParseCollectsSeveralErrors(t *testing.T) {
	_, err := Parse([]byte("name: t\nbogus: 1\ntasks:\n- name: a\n  command: 5\n  resources: {cpu_millis: x, nope: 1}\n"))
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("got %v", err)
	}
	for _, f := range []string{"bogus", "tasks[0].command", "tasks[0].resources.cpu_millis", "tasks[0].resources.nope"} {
		if !ve.Has(f) {
			t.Errorf("no error for %s in:\n%v", f, err)
		}
	}
	// Deterministic order.
	_, err2 := Parse([]byte("name: t\nbogus: 1\ntasks:\n- name: a\n  command: 5\n  resources: {cpu_millis: x, nope: 1}\n"))
	if err.Error() != err2.Error() {
		t.Fatalf("errors differ between runs:\n%v\n---\n%v", err, err2)
	}
}

// TestValidateProtoSpec covers specs that arrive over gRPC, with no YAML.
func TestValidateProtoSpec(t *testing.T) {
	ok := func() *apiaryv1.JobSpec {
		return &apiaryv1.JobSpec{Name: "x", Tasks: []*apiaryv1.TaskGroup{{Name: "a", Command: "echo"}}}
	}
	if err := Validate(ok()); err != nil {
		t.Fatalf("minimal spec: %v", err)
	}
	if err := Validate(nil); err == nil {
		t.Fatal("nil spec accepted")
	}
	cases := []struct {
		mut   func(*apiaryv1.JobSpec)
		field string
	}{
		{func(s *apiaryv1.JobSpec) { s.Name = "" }, "name"},
		{func(s *apiaryv1.JobSpec) { s.Name = strings.Repeat("a", 129) }, "name"},
		{func(s *apiaryv1.JobSpec) { s.Priority = -1 }, "priority"},
		{func(s *apiaryv1.JobSpec) { s.Priority = 101 }, "priority"},
		{func(s *apiaryv1.JobSpec) { s.MaxAttempts = 101 }, "max_attempts"},
		{func(s *apiaryv1.JobSpec) { s.MaxAttempts = -1 }, "max_attempts"},
		{func(s *apiaryv1.JobSpec) { s.Disconnect = &apiaryv1.Disconnect{LostAfterMs: -1} }, "disconnect.lost_after"},
		{func(s *apiaryv1.JobSpec) { s.Disconnect = &apiaryv1.Disconnect{LostAfterMs: 25 * 3600 * 1000} }, "disconnect.lost_after"},
		{func(s *apiaryv1.JobSpec) { s.Tasks = nil }, "tasks"},
		{func(s *apiaryv1.JobSpec) {
			for i := 0; i < 101; i++ {
				s.Tasks = append(s.Tasks, &apiaryv1.TaskGroup{Name: "g" + string(rune('a'+i%26)) + strings.Repeat("x", i/26), Command: "x"})
			}
		}, "tasks"},
		{func(s *apiaryv1.JobSpec) { s.Tasks[0].Command = "ec\x00ho" }, "tasks[0].command"},
		{func(s *apiaryv1.JobSpec) { s.Tasks[0].Count = -3 }, "tasks[0].count"},
		{func(s *apiaryv1.JobSpec) { s.Tasks[0].Count = 10001 }, "tasks[0].count"},
		{func(s *apiaryv1.JobSpec) { s.Tasks[0].Resources = &apiaryv1.Resources{CpuMillis: 1_000_001} }, "tasks[0].resources.cpu_millis"},
		{func(s *apiaryv1.JobSpec) { s.Tasks[0].Resources = &apiaryv1.Resources{MemoryMb: 16_777_217} }, "tasks[0].resources.memory_mb"},
		{func(s *apiaryv1.JobSpec) { s.Tasks[0].Resources = &apiaryv1.Resources{Gpus: 65} }, "tasks[0].resources.gpus"},
		{func(s *apiaryv1.JobSpec) { s.Tasks[0].Resources = &apiaryv1.Resources{GpuMilli: -1} }, "tasks[0].resources.gpu_milli"},
		{func(s *apiaryv1.JobSpec) { s.Tasks[0].TimeoutMs = -1 }, "tasks[0].timeout"},
		{func(s *apiaryv1.JobSpec) { s.Tasks[0].TimeoutMs = (7*24*time.Hour + time.Millisecond).Milliseconds() }, "tasks[0].timeout"},
		{func(s *apiaryv1.JobSpec) { s.Tasks[0].RetryableExitCodes = []int32{256} }, "tasks[0].retryable_exit_codes[0]"},
		{func(s *apiaryv1.JobSpec) { s.Tasks[0].Env = map[string]string{"apiary_x": "1"} }, "tasks[0].env.apiary_x"},
		{func(s *apiaryv1.JobSpec) { s.Tasks[0].Env = map[string]string{"A-B": "1"} }, "tasks[0].env.A-B"},
		{func(s *apiaryv1.JobSpec) { s.Scheduler = "random" }, "scheduler"},
		{func(s *apiaryv1.JobSpec) { s.Tasks[0].Constraints = []*apiaryv1.Constraint{{Label: "", Op: "exists"}} }, "tasks[0].constraints[0].label"},
		{func(s *apiaryv1.JobSpec) {
			s.Tasks[0].Constraints = []*apiaryv1.Constraint{{Label: "a", Op: "<", Values: []string{"NaN"}}}
		}, "tasks[0].constraints[0].values[0]"},
		{func(s *apiaryv1.JobSpec) {
			s.Tasks[0].Affinities = []*apiaryv1.Affinity{{Label: "a", Op: "=", Values: []string{"x"}, Weight: 101}}
		}, "tasks[0].affinities[0].weight"},
		{func(s *apiaryv1.JobSpec) {
			s.Tasks[0].Spreads = []*apiaryv1.Spread{{Label: "z", Targets: map[string]int32{"a": -1}}}
		}, "tasks[0].spread[0].targets.a"},
		{func(s *apiaryv1.JobSpec) {
			s.Tasks[0].DistinctProperties = []*apiaryv1.DistinctProperty{{Label: "rack", MaxPerValue: -1}}
		}, "tasks[0].distinct_property[0].max_per_value"},
		{func(s *apiaryv1.JobSpec) { s.Tasks[0].Datasets = []*apiaryv1.Dataset{{Name: "d", SizeBytes: -1}} }, "tasks[0].datasets[0].size_bytes"},
		{func(s *apiaryv1.JobSpec) { s.Region = &apiaryv1.RegionSpec{Prefer: []string{"eu", "eu"}} }, "region.prefer[1]"},
		{func(s *apiaryv1.JobSpec) { s.Jurisdiction = "e u" }, "jurisdiction"},
		{func(s *apiaryv1.JobSpec) { s.Tasks[0].Name = "" }, "tasks[0].name"},
		{func(s *apiaryv1.JobSpec) { s.Tasks[0].Args = []string{"ok", "b\x00d"} }, "tasks[0].args[1]"},
		{func(s *apiaryv1.JobSpec) { s.Name = "bad\xffutf8" }, ""},
	}
	for i, tc := range cases {
		s := ok()
		tc.mut(s)
		err := Validate(s)
		var ve *ValidationError
		if !errors.As(err, &ve) {
			t.Errorf("case %d (%s): got %v, want a ValidationError", i, tc.field, err)
			continue
		}
		if !ve.Has(tc.field) {
			t.Errorf("case %d: no error for %q in:\n%v", i, tc.field, err)
		}
	}
}

func TestTaskTotalLimit(t *testing.T) {
	s := &apiaryv1.JobSpec{Name: "x"}
	for i := 0; i < 2; i++ {
		s.Tasks = append(s.Tasks, &apiaryv1.TaskGroup{Name: string(rune('a' + i)), Command: "x", Count: 5000})
	}
	if err := Validate(s); err != nil {
		t.Fatalf("exactly 10000 tasks: %v", err)
	}
	s.Tasks = append(s.Tasks, &apiaryv1.TaskGroup{Name: "c", Command: "x"})
	if err := Validate(s); err == nil || !strings.Contains(err.Error(), "tasks: at most 10000 tasks") {
		t.Fatalf("10001 tasks: %v", err)
	}
}

func TestApplyDefaults(t *testing.T) {
	s := &apiaryv1.JobSpec{Name: "x", Tasks: []*apiaryv1.TaskGroup{{Name: "a", Command: "echo",
		DistinctProperties: []*apiaryv1.DistinctProperty{{Label: "rack"}}, AntiAffinity: &apiaryv1.AntiAffinity{Group: "db"}}}}
	ApplyDefaults(s)
	g := s.Tasks[0]
	if s.Priority != 50 || s.MaxAttempts != 3 || s.Scheduler != "" || g.Count != 1 ||
		g.Resources.GetCpuMillis() != 100 || g.Resources.GetMemoryMb() != 64 || g.DistinctProperties[0].MaxPerValue != 1 ||
		g.AntiAffinity.GetScope() != AntiAffinityScopeNode {
		t.Fatalf("defaults not applied: %v", s)
	}
	before := proto.Clone(s)
	ApplyDefaults(s)
	if !proto.Equal(before, s) {
		t.Fatal("ApplyDefaults is not idempotent")
	}
	// Explicit values are kept.
	s2 := &apiaryv1.JobSpec{Name: "x", Priority: 9, MaxAttempts: 1, Scheduler: "spread",
		Tasks: []*apiaryv1.TaskGroup{{Name: "a", Command: "e", Count: 7, Resources: &apiaryv1.Resources{CpuMillis: 5, MemoryMb: 6}}}}
	ApplyDefaults(s2)
	if s2.Priority != 9 || s2.MaxAttempts != 1 || s2.Scheduler != "spread" || s2.Tasks[0].Count != 7 ||
		s2.Tasks[0].Resources.CpuMillis != 5 || s2.Tasks[0].Resources.MemoryMb != 6 {
		t.Fatalf("explicit values changed: %v", s2)
	}
	ApplyDefaults(nil) // must not panic
}

func TestPayloadHash(t *testing.T) {
	src := "name: h\ntasks:\n- name: a\n  command: echo\n  env: {A: '1', B: '2', C: '3', D: '4'}\n  " +
		"spread: {label: z, targets: {a: 10, b: 20, c: 30}}\n"
	s1, err := Parse([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	h := PayloadHash(s1)
	if len(h) != 64 {
		t.Fatalf("hash %q is not hex sha256", h)
	}
	for i := 0; i < 20; i++ { // map order must not matter
		s2, _ := Parse([]byte(src))
		if PayloadHash(s2) != h {
			t.Fatal("hash is not stable")
		}
		// Round trip through the wire, as the server sees it.
		b, _ := proto.Marshal(s2)
		s3 := &apiaryv1.JobSpec{}
		if err := proto.Unmarshal(b, s3); err != nil {
			t.Fatal(err)
		}
		if PayloadHash(s3) != h {
			t.Fatal("hash changed over the wire")
		}
	}
	s4 := proto.Clone(s1).(*apiaryv1.JobSpec)
	s4.Tasks[0].Args = []string{"x"}
	if PayloadHash(s4) == h {
		t.Fatal("different payloads hash alike")
	}
	// After defaults, omitted and explicit defaults hash alike.
	a := &apiaryv1.JobSpec{Name: "x", Tasks: []*apiaryv1.TaskGroup{{Name: "a", Command: "e"}}}
	b := &apiaryv1.JobSpec{Name: "x", Priority: 50, MaxAttempts: 3,
		Tasks: []*apiaryv1.TaskGroup{{Name: "a", Command: "e", Count: 1, Resources: &apiaryv1.Resources{CpuMillis: 100, MemoryMb: 64}}}}
	ApplyDefaults(a)
	ApplyDefaults(b)
	if PayloadHash(a) != PayloadHash(b) {
		t.Fatal("defaulted specs hash differently")
	}
}

func TestGRPCStatus(t *testing.T) {
	err := Validate(&apiaryv1.JobSpec{Name: "x", Tasks: []*apiaryv1.TaskGroup{{Name: "a", Command: "",
		Resources: &apiaryv1.Resources{MemoryMb: -1}}}})
	st := status.Convert(err)
	if st.Code() != codes.InvalidArgument {
		t.Fatalf("code %v", st.Code())
	}
	var fields []string
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				fields = append(fields, v.GetField())
			}
		}
	}
	if strings.Join(fields, ",") != "tasks[0].command,tasks[0].resources.memory_mb" {
		t.Fatalf("BadRequest fields = %v", fields)
	}
}

func TestErrorCap(t *testing.T) {
	s := &apiaryv1.JobSpec{Name: "x"}
	for i := 0; i < 100; i++ {
		s.Tasks = append(s.Tasks, &apiaryv1.TaskGroup{Name: "", Command: "", Count: -1})
	}
	err := Validate(s)
	var ve *ValidationError
	if !errors.As(err, &ve) || len(ve.Errors) != maxReported || ve.Omitted == 0 ||
		!strings.Contains(err.Error(), "more errors") {
		t.Fatalf("error list not capped: %d listed, %d omitted", len(ve.Errors), ve.Omitted)
	}
}

func TestDocumentMarkers(t *testing.T) {
	for _, src := range []string{
		"---\nname: a\ntasks: [{name: a, command: echo}]\n",
		"name: a\ntasks: [{name: a, command: echo}]\n---\n",
		"name: a\ntasks: [{name: a, command: echo, args: [\"---\"]}]\n",
	} {
		if _, err := Parse([]byte(src)); err != nil {
			t.Errorf("%q: %v", src, err)
		}
	}
	if _, err := Parse([]byte("name: a\n---\nname: b\n")); err == nil {
		t.Error("two documents accepted")
	}
}

// TestPrepare: a validated, defaulted copy; the input is left as it was.
func TestPrepare(t *testing.T) {
	in := &apiaryv1.JobSpec{Name: "p", Tasks: []*apiaryv1.TaskGroup{{Name: "a", Command: "true"}}}
	out, err := Prepare(in)
	if err != nil {
		t.Fatal(err)
	}
	if out.GetPriority() != 50 || out.GetTasks()[0].GetCount() != 1 || out.GetTasks()[0].GetResources().GetCpuMillis() != 100 {
		t.Fatalf("defaults not applied: %v", out)
	}
	if in.GetPriority() != 0 || in.GetTasks()[0].GetCount() != 0 || in.GetTasks()[0].GetResources() != nil {
		t.Fatalf("input changed: %v", in)
	}
	if _, err := Prepare(&apiaryv1.JobSpec{Name: "p"}); err == nil || !strings.Contains(err.Error(), "tasks") {
		t.Fatalf("spec without tasks: %v", err)
	}
}

func TestPrepareNormalizesPolicyValues(t *testing.T) {
	s, err := Parse([]byte("name: job\njurisdiction: EU\ndata_class: Personal\ntasks: [{name: a, command: 'true'}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := Prepare(s)
	if err != nil {
		t.Fatal(err)
	}
	if p.GetJurisdiction() != "eu" || p.GetDataClass() != "personal" {
		t.Fatalf("prepared jurisdiction %q data_class %q; want eu, personal", p.GetJurisdiction(), p.GetDataClass())
	}
	if s.GetJurisdiction() != "EU" {
		t.Fatal("Prepare changed its input")
	}
	// The payload hash of an idempotent submission is taken after
	// Prepare, so `EU` and `eu` are the same payload.
	s2, _ := Parse([]byte("name: job\njurisdiction: eu\ndata_class: personal\ntasks: [{name: a, command: 'true'}]\n"))
	p2, err := Prepare(s2)
	if err != nil {
		t.Fatal(err)
	}
	if PayloadHash(p) != PayloadHash(p2) {
		t.Fatal("EU and eu hash differently")
	}
}

func TestGPUModelsWithoutGPUsRefused(t *testing.T) {
	s, err := Parse([]byte("name: job\ntasks: [{name: a, command: 'true', resources: {gpu_models: [A100]}}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := Validate(s); err == nil || !strings.Contains(err.Error(), "tasks[0].resources.gpu_models: applies only to the GPUs a task asks for") {
		t.Fatalf("gpu_models without gpus: %v", err)
	}
	s, _ = Parse([]byte("name: job\ntasks: [{name: a, command: 'true', resources: {gpu_milli: 500, gpu_models: [A100]}}]\n"))
	if err := Validate(s); err != nil {
		t.Fatalf("gpu_models with gpu_milli: %v", err)
	}
}

// TestDecodingErrorDoesNotHideRuleErrors: a decoding error (priority: 0)
// used to be the only error reported; the rules broken elsewhere are
// reported with it, and none restates the decoding error.
func TestDecodingErrorDoesNotHideRuleErrors(t *testing.T) {
	_, err := Parse([]byte("name: \"bad name!\"\npriority: 0\ntasks: [{name: a, command: 'true', env: {APIARY_X: y}, resources: {gpus: 1, gpu_milli: 500}}]\n"))
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("Parse: %v", err)
	}
	fields := map[string]int{}
	for _, fe := range ve.Errors {
		fields[fe.Field]++
	}
	for _, want := range []string{"priority", "name", "tasks[0].resources.gpu_milli"} {
		if fields[want] != 1 {
			t.Errorf("field %s reported %d times in %v", want, fields[want], ve.Errors)
		}
	}
	env := false
	for f := range fields {
		env = env || strings.HasPrefix(f, "tasks[0].env")
	}
	if !env {
		t.Errorf("the APIARY_ env key is not reported: %v", ve.Errors)
	}
}

func TestFailoverBlock(t *testing.T) {
	base := "name: f\ntasks: [{name: t, command: /bin/true}]\n"
	for _, tc := range []struct {
		yaml string
		want *apiaryv1.Failover
		err  string
	}{
		{yaml: "failover: {after: 5s, regions: [eu-central, eu-north]}", want: &apiaryv1.Failover{AfterMs: 5000, Regions: []string{"eu-central", "eu-north"}}},
		{yaml: "failover: {after: 1m, regions: auto}", want: &apiaryv1.Failover{AfterMs: 60000}},
		{yaml: "failover: {}", want: &apiaryv1.Failover{}},
		{yaml: "failover: off", want: &apiaryv1.Failover{Disabled: true}},
		{yaml: "failover: on", want: &apiaryv1.Failover{}},
		{yaml: `failover: "on"`, want: &apiaryv1.Failover{}},
		{yaml: `failover: "OFF"`, want: &apiaryv1.Failover{Disabled: true}},
		{yaml: "failover: maybe", err: `failover: must be on, off or a mapping`},
		{yaml: "failover: {regions: [auto]}", err: `failover.regions[0]: "auto" is not a region name: write regions: auto`},
		{yaml: "failover: {after: 500ms}", err: "failover.after: must be between 1s and 24h"},
		{yaml: "failover: {after: 25h}", err: "failover.after: must be between 1s and 24h"},
		{yaml: "failover: {after: 60}", err: "failover.after: must be a duration"},
		{yaml: "failover: {regions: all}", err: `failover.regions: must be a list of region names or "auto" (got "all")`},
		{yaml: "failover: {regions: [a, a]}", err: `failover.regions[1]: duplicate region "a"`},
		{yaml: "failover: {disabled: true, after: 5s}", err: "failover.disabled: is true: after and regions must be unset"},
		{yaml: "failover: {afer: 5s}", err: "afer"},
	} {
		s, err := Parse([]byte(base + tc.yaml))
		if err == nil {
			err = Validate(s)
		}
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: err %v; want one containing %q", tc.yaml, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.yaml, err)
			continue
		}
		if !proto.Equal(s.GetFailover(), tc.want) {
			t.Errorf("%s: failover %v; want %v", tc.yaml, s.GetFailover(), tc.want)
		}
	}
	s, err := Parse([]byte("name: f\nfailover: {after: 5s}\ntasks: [{name: t, command: /bin/true, secret_env: {K: v}}]\n"))
	if err == nil {
		err = Validate(s)
	}
	if err == nil || !strings.Contains(err.Error(), "failover: a job with secret_env cannot fail over") {
		t.Errorf("secret_env with failover: %v", err)
	}
}
