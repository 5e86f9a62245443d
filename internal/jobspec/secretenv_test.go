package jobspec

import (
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

// TestParseSecretEnv: a secret is given in env as {value, secret: true} or
// in secret_env; both end in secret_env; plain values, and secret: false,
// stay in env.
func TestParseSecretEnv(t *testing.T) {
	spec, err := Parse([]byte(`name: s
tasks:
  - name: t
    command: sh
    env:
      PLAIN: one
      NOT_SECRET: {value: two, secret: false}
      DB_PASSWORD: {value: "s3cret", secret: true}
    secret_env:
      API_TOKEN: tok
`))
	if err != nil {
		t.Fatal(err)
	}
	if err := Validate(spec); err != nil {
		t.Fatal(err)
	}
	g := spec.GetTasks()[0]
	if want := map[string]string{"PLAIN": "one", "NOT_SECRET": "two"}; !maps.Equal(g.GetEnv(), want) {
		t.Fatalf("env = %v, want %v", g.GetEnv(), want)
	}
	if want := map[string]string{"DB_PASSWORD": "s3cret", "API_TOKEN": "tok"}; !maps.Equal(g.GetSecretEnv(), want) {
		t.Fatalf("secret_env = %v, want %v", g.GetSecretEnv(), want)
	}
	if !HasSecrets(spec) {
		t.Fatal("HasSecrets = false")
	}
}

// TestSecretEnvRules: each broken rule names its field and the rule.
func TestSecretEnvRules(t *testing.T) {
	for _, tc := range []struct {
		yaml, field, rule string
	}{
		{"env: {A: {value: x, secret: true}}\n    secret_env: {A: z}", "tasks[0].secret_env.A", "given twice as a secret"},
		{"env: {A: x}\n    secret_env: {A: z}", "tasks[0].secret_env.A", "is also in env"},
		{"secret_env: {APIARY_X: z}", "tasks[0].secret_env.APIARY_X", "reserved for Apiary"},
		{"secret_env: {1BAD: z}", "tasks[0].secret_env.1BAD", "valid variable name"},
		{`secret_env: {"": z}`, "tasks[0].secret_env", "must not be empty"},
		{"secret_env: {A: 31337}", "tasks[0].secret_env.A", "must be a string (got a number, not shown"},
		{"env: {A: {value: 31337, secret: true}}", "tasks[0].env.A.value", "must be a string (got a number, not shown"},
		{"secret_env: [A]", "tasks[0].secret_env", "must be a mapping"},
		{"env: {A: {value: x, secret: 2}}", "tasks[0].env.A.secret", "true or false"},
		{"env: {A: {value: x, secrte: true}}", "tasks[0].env.A.secrte", `did you mean "secret"`},
		{"env: {A: [x]}", "tasks[0].env.A", "must be a string, or a mapping"},
		{"secrets: {A: x}", "tasks[0].secrets", `did you mean "secret_env"`},
	} {
		spec, err := Parse([]byte("name: s\ntasks:\n  - name: t\n    command: sh\n    " + tc.yaml + "\n"))
		if err == nil {
			err = Validate(spec)
		}
		var ve *ValidationError
		if !errors.As(err, &ve) || !ve.Has(tc.field) || !strings.Contains(err.Error(), tc.rule) || strings.Contains(err.Error(), "31337") {
			t.Errorf("%s: got %v; want an error on %s with %q", tc.yaml, err, tc.field, tc.rule)
		}
	}
	// Over gRPC: a NUL byte, and too many variables in env and secret_env
	// together.
	g := &apiaryv1.TaskGroup{Command: "sh", Env: map[string]string{}, SecretEnv: map[string]string{"A": "x\x00y"}}
	for i := range MaxEnv {
		g.Env[fmt.Sprintf("E%d", i)] = "v"
	}
	err := Validate(&apiaryv1.JobSpec{Name: "s", Tasks: []*apiaryv1.TaskGroup{g}})
	var ve *ValidationError
	if !errors.As(err, &ve) || !ve.Has("tasks[0].secret_env.A") || !ve.Has("tasks[0].secret_env") ||
		!strings.Contains(err.Error(), "NUL") || !strings.Contains(err.Error(), "env and secret_env together") {
		t.Fatalf("Validate: %v", err)
	}
	if strings.Contains(err.Error(), "x\x00y") {
		t.Fatal("the error repeats the secret value")
	}
}

// TestPayloadHashIgnoresSecretValues: secret values do not change the hash
// (a reader of the hash cannot test guesses); names do; a spec without
// secrets hashes as before (the plain encoding's hash).
func TestPayloadHashIgnoresSecretValues(t *testing.T) {
	mk := func(sec map[string]string) *apiaryv1.JobSpec {
		return &apiaryv1.JobSpec{Name: "s", Tasks: []*apiaryv1.TaskGroup{{Command: "sh", SecretEnv: sec}}}
	}
	a, b := PayloadHash(mk(map[string]string{"P": "one"})), PayloadHash(mk(map[string]string{"P": "two"}))
	if a != b {
		t.Fatal("the hash depends on a secret value")
	}
	if a == PayloadHash(mk(map[string]string{"Q": "one"})) || a == PayloadHash(mk(nil)) {
		t.Fatal("the hash ignores secret names")
	}
	plain := mk(nil)
	raw, _ := proto.MarshalOptions{Deterministic: true}.Marshal(plain)
	if PayloadHash(plain) != PayloadHash(proto.Clone(plain).(*apiaryv1.JobSpec)) || len(raw) == 0 {
		t.Fatal("unstable hash")
	}
	spec := mk(map[string]string{"P": "one"})
	PayloadHash(spec)
	if spec.GetTasks()[0].GetSecretEnv()["P"] != "one" {
		t.Fatal("PayloadHash changed the spec")
	}
}

// TestRedact: values become "<redacted>", names stay, the input is not
// changed, a spec without secrets is returned as is.
func TestRedact(t *testing.T) {
	spec := &apiaryv1.JobSpec{Name: "s", Tasks: []*apiaryv1.TaskGroup{{Command: "sh", Env: map[string]string{"E": "e"},
		SecretEnv: map[string]string{"P": "s3cret"}}, {Command: "true"}}}
	r := Redact(spec)
	if r.GetTasks()[0].GetSecretEnv()["P"] != Redacted || r.GetTasks()[0].GetEnv()["E"] != "e" || spec.GetTasks()[0].GetSecretEnv()["P"] != "s3cret" {
		t.Fatalf("Redact: %v (input now %v)", r, spec)
	}
	plain := &apiaryv1.JobSpec{Name: "p"}
	if Redact(plain) != plain {
		t.Fatal("Redact copied a spec without secrets")
	}
	_, err := MapSecrets(spec, func(g int, k, v string) (string, error) { return "", errors.New("no key") })
	if err == nil || err.Error() != "tasks[0].secret_env.P: no key" {
		t.Fatalf("MapSecrets error: %v", err)
	}
}
