package jobspec

import (
	"strings"
	"testing"
)

// TestNamespace: a job file's namespace is parsed, validated (the error
// names the field and the rule) and defaults to "default", which the
// payload hash covers (the same job in two namespaces is two payloads).
func TestNamespace(t *testing.T) {
	const job = "name: j\ntasks:\n  - name: t\n    command: \"true\"\n"
	s, err := Parse([]byte("namespace: team-a\n" + job))
	if err != nil {
		t.Fatal(err)
	}
	p, err := Prepare(s)
	if err != nil || p.GetNamespace() != "team-a" {
		t.Fatalf("Prepare: %v, namespace %q", err, p.GetNamespace())
	}
	s, err = Parse([]byte(job))
	if err != nil {
		t.Fatal(err)
	}
	d, err := Prepare(s)
	if err != nil || d.GetNamespace() != "default" {
		t.Fatalf("Prepare without a namespace: %v, namespace %q; want \"default\"", err, d.GetNamespace())
	}
	if PayloadHash(d) == PayloadHash(p) {
		t.Error("the payload hash does not cover the namespace")
	}
	s.Namespace = "default"
	if e, _ := Prepare(s); PayloadHash(e) != PayloadHash(d) {
		t.Error(`namespace "" and "default" hash differently after Prepare`)
	}
	for _, bad := range []string{"Team-A", "1a", "a_b", strings.Repeat("a", 64)} {
		s.Namespace = bad
		_, err := Prepare(s)
		if err == nil || !strings.Contains(err.Error(), "namespace: must be 1-63 characters of a-z, 0-9 and '-', starting with a letter") {
			t.Errorf("namespace %q: %v", bad, err)
		}
	}
	if _, err := Parse([]byte("namespace: 5\n" + job)); err == nil || !strings.Contains(err.Error(), "namespace: must be a string") {
		t.Errorf("namespace: 5: %v", err)
	}
}
