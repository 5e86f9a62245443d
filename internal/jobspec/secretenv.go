package jobspec

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

// Secret environment values (TaskGroup.secret_env). In a job file a
// variable is made secret either in env, as a mapping
//
//	env:
//	  DB_PASSWORD: {value: "s3cret", secret: true}
//
// (a plain `NAME: value`, or `secret: false`, stays in env), or in a
// mapping of its own, `secret_env: {DB_PASSWORD: s3cret}`; both end in
// secret_env. A region stores the values sealed under its keyring and
// shows them as "<redacted>"; the rules here are env's (names, the
// APIARY_ prefix, no NUL byte, at most MaxEnv variables in env and
// secret_env together), plus: a name is in env or in secret_env, not both.

// Redacted is what every answer shows instead of a secret_env value.
const Redacted = "<redacted>"

// envMap decodes a task group's env: each value a string (plain) or a
// mapping {value: "...", secret: true|false}. Secret entries go to
// secretEnv.
func (d *decoder) envMap(path string, v any, env, secretEnv *map[string]string) {
	m, ok := v.(map[string]any)
	if !ok {
		d.typeErr(path, "a mapping of variable names to values", v)
		return
	}
	out := make(map[string]string, len(m))
	for _, k := range sortedKeys(m) {
		p := path + keyPath(k)
		if _, isMap := m[k].(map[string]any); !isMap {
			var s string
			if _, isStr := m[k].(string); !isStr {
				d.errs.add(p, "must be a string, or a mapping {value: \"...\", secret: true} (got %s)", describe(m[k]))
				continue
			}
			d.str(p, m[k], &s)
			out[k] = s
			continue
		}
		var val string
		var secret bool
		d.object(p, m[k], map[string]handler{
			"value":  func(p string, v any) { d.secretStr(p, v, &val) },
			"secret": func(p string, v any) { d.boolean(p, v, &secret) },
		})
		if !secret {
			out[k] = val
			continue
		}
		d.addSecret(p, k, val, secretEnv)
	}
	*env = out
}

// secretMap decodes a task group's secret_env mapping into secretEnv.
func (d *decoder) secretMap(path string, v any, secretEnv *map[string]string) {
	m, ok := v.(map[string]any)
	if !ok {
		d.typeErr(path, "a mapping of variable names to values", v)
		return
	}
	for _, k := range sortedKeys(m) {
		var s string
		p := path + keyPath(k)
		d.secretStr(p, m[k], &s)
		d.addSecret(p, k, s, secretEnv)
	}
}

// secretStr decodes a secret value: a string. Its error names the YAML
// type of what was given, never the value.
func (d *decoder) secretStr(path string, v any, dst *string) {
	s, ok := v.(string)
	if !ok {
		kind := "a number"
		switch v.(type) {
		case bool:
			kind = "a boolean"
		case []any:
			kind = "a list"
		case map[string]any:
			kind = "a mapping"
		}
		d.errs.add(path, "must be a string (got %s, not shown: it is a secret; quote it)", kind)
		return
	}
	*dst = s
}

// addSecret adds one secret variable, refusing a name given twice (in env
// with secret: true and in secret_env).
func (d *decoder) addSecret(path, name, value string, secretEnv *map[string]string) {
	if *secretEnv == nil {
		*secretEnv = map[string]string{}
	}
	if _, dup := (*secretEnv)[name]; dup {
		d.errs.add(path, "is given twice as a secret (in env with secret: true and in secret_env); give it once")
		return
	}
	(*secretEnv)[name] = value
}

// validateSecretEnv checks a group's secret_env (see the rules above); p is
// the group's path (tasks[0]).
func validateSecretEnv(c *errs, p string, g *apiaryv1.TaskGroup) {
	sec := g.GetSecretEnv()
	if len(sec) == 0 {
		return
	}
	if n := len(g.GetEnv()) + len(sec); n > MaxEnv {
		c.add(p+".secret_env", "at most %d variables are allowed in env and secret_env together (got %d)", MaxEnv, n)
	}
	for _, k := range sortedKeys(sec) {
		f := p + ".secret_env" + keyPath(k)
		switch {
		case k == "":
			f = p + ".secret_env"
			c.add(f, "a variable name must not be empty")
		case !envKeyRE.MatchString(k):
			c.add(f, "must be a valid variable name ([A-Za-z_][A-Za-z0-9_]*)")
		case strings.HasPrefix(strings.ToUpper(k), "APIARY_"):
			c.add(f, "names starting with APIARY_ are reserved for Apiary")
		}
		if _, both := g.GetEnv()[k]; both {
			c.add(f, "is also in env: a variable is either plain (env) or secret (secret_env), not both")
		}
		if strings.ContainsRune(sec[k], 0) {
			c.add(f, "value must not contain a NUL byte")
		}
	}
}

// HasSecrets reports whether any task group of spec has secret_env.
func HasSecrets(spec *apiaryv1.JobSpec) bool {
	for _, g := range spec.GetTasks() {
		if len(g.GetSecretEnv()) > 0 {
			return true
		}
	}
	return false
}

// withoutSecretValues returns spec itself when it has no secret_env, else
// a copy whose secret_env values are all "" (names kept).
func withoutSecretValues(spec *apiaryv1.JobSpec) *apiaryv1.JobSpec {
	if !HasSecrets(spec) {
		return spec
	}
	return mapSecrets(spec, func(int, string, string) string { return "" })
}

// Redact returns spec itself when it has no secret_env, else a copy whose
// secret_env values are all Redacted: what an answer to a client carries.
func Redact(spec *apiaryv1.JobSpec) *apiaryv1.JobSpec {
	if !HasSecrets(spec) {
		return spec
	}
	return mapSecrets(spec, func(int, string, string) string { return Redacted })
}

// mapSecrets returns a copy of spec with every secret_env value replaced by
// f(group index, name, value), called in group then name order; spec is not
// changed.
func mapSecrets(spec *apiaryv1.JobSpec, f func(group int, name, value string) string) *apiaryv1.JobSpec {
	out := proto.Clone(spec).(*apiaryv1.JobSpec)
	for i, g := range out.GetTasks() {
		for _, k := range sortedKeys(g.GetSecretEnv()) {
			g.SecretEnv[k] = f(i, k, g.SecretEnv[k])
		}
	}
	return out
}

// MapSecrets returns a copy of spec with every secret_env value replaced by
// f(group index, name, value) (in group then name order); spec is not
// changed. The first error of f stops it, returned with the value's path
// (tasks[0].secret_env.DB_PASSWORD: ...).
func MapSecrets(spec *apiaryv1.JobSpec, f func(group int, name, value string) (string, error)) (*apiaryv1.JobSpec, error) {
	var first error
	out := mapSecrets(spec, func(g int, k, v string) string {
		if first != nil {
			return v
		}
		nv, err := f(g, k, v)
		if err != nil {
			first = fmt.Errorf("tasks[%d].secret_env%s: %w", g, keyPath(k), err)
			return v
		}
		return nv
	})
	if first != nil {
		return nil, first
	}
	return out, nil
}
