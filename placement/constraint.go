package placement

import (
	"fmt"
	"strconv"
	"strings"
)

// Constraint operators. The semantics follow Nomad's constraint block
// (https://developer.hashicorp.com/nomad/docs/job-specification/constraint)
// and Kubernetes node affinity operators (In, NotIn, Exists, DoesNotExist,
// Gt, Lt): a negative operator ("!=", "not_in", "not_exists") is satisfied by
// a node that lacks the label; every other operator needs the label.
const (
	OpEq        = "="
	OpNe        = "!="
	OpIn        = "in"
	OpNotIn     = "not_in"
	OpExists    = "exists"
	OpNotExists = "not_exists"
	OpLt        = "<"
	OpGt        = ">"
	OpLe        = "<="
	OpGe        = ">="
	// OpVersion matches a version range in Values[0], Nomad's syntax:
	// comma-separated conditions with =, !=, >, >=, <, <=, ~> (pessimistic),
	// e.g. ">= 1.2.0, < 2.0". Versions compare numerically per dot segment;
	// a leading "v" and a "-prerelease" suffix are accepted (a prerelease
	// sorts before its release).
	OpVersion = "version"
)

// matcher is a compiled label rule (constraint or affinity).
type matcher struct {
	label string
	op    string
	vals  []string
	num   float64
	ver   []verCond
	bad   bool // could not be compiled: never matches
}

type verCond struct {
	op string
	v  version
}

func compileMatcher(label, op string, values []string) matcher {
	m := matcher{label: label, op: op, vals: values}
	switch op {
	case OpEq, OpNe:
		if len(values) != 1 {
			m.bad = true
		}
	case OpIn, OpNotIn, OpExists, OpNotExists:
	case OpLt, OpGt, OpLe, OpGe:
		if len(values) != 1 {
			m.bad = true
			break
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(values[0]), 64)
		if err != nil {
			m.bad = true
		}
		m.num = f
	case OpVersion:
		if len(values) != 1 {
			m.bad = true
			break
		}
		conds, err := parseVersionRange(values[0])
		if err != nil {
			m.bad = true
		}
		m.ver = conds
	default:
		m.bad = true
	}
	return m
}

func describeRule(label, op string, values []string) string {
	switch op {
	case OpExists, OpNotExists:
		return label + " " + op
	case OpIn, OpNotIn:
		return fmt.Sprintf("%s %s [%s]", label, op, strings.Join(values, ","))
	default:
		return fmt.Sprintf("%s %s %s", label, op, strings.Join(values, ","))
	}
}

// match reports whether labels satisfy the rule.
func (m *matcher) match(labels map[string]string) bool {
	if m.bad {
		return false
	}
	v, ok := labels[m.label]
	return m.matchValue(v, ok)
}

// matchValue is match given the node's value of m.label (ok false: the node
// lacks the label). The outcome depends on nothing else, which is what lets
// filters and scores decide once per distinct value (codeMemo).
func (m *matcher) matchValue(v string, ok bool) bool {
	if m.bad {
		return false
	}
	switch m.op {
	case OpEq:
		return ok && v == m.vals[0]
	case OpNe:
		return !ok || v != m.vals[0]
	case OpIn:
		return ok && contains(m.vals, v)
	case OpNotIn:
		return !ok || !contains(m.vals, v)
	case OpExists:
		return ok
	case OpNotExists:
		return !ok
	case OpLt, OpGt, OpLe, OpGe:
		if !ok {
			return false
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil {
			return false
		}
		switch m.op {
		case OpLt:
			return f < m.num
		case OpGt:
			return f > m.num
		case OpLe:
			return f <= m.num
		default:
			return f >= m.num
		}
	case OpVersion:
		if !ok {
			return false
		}
		nv, err := parseVersion(v)
		if err != nil {
			return false
		}
		for _, c := range m.ver {
			if !c.holds(nv) {
				return false
			}
		}
		return true
	}
	return false
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// version is a parsed dotted version; pre is a prerelease tag ("" if none).
type version struct {
	seg []int
	pre string
}

func parseVersion(s string) (version, error) {
	s = strings.TrimSpace(s)
	s = strings.TrimPrefix(s, "v")
	if i := strings.IndexByte(s, '+'); i >= 0 { // build metadata is ignored
		s = s[:i]
	}
	var v version
	if i := strings.IndexByte(s, '-'); i >= 0 {
		v.pre = s[i+1:]
		s = s[:i]
	}
	if s == "" {
		return v, fmt.Errorf("empty version")
	}
	for _, p := range strings.Split(s, ".") {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return v, fmt.Errorf("bad version segment %q", p)
		}
		v.seg = append(v.seg, n)
	}
	return v, nil
}

// cmpVersion compares a and b: missing segments are 0; a prerelease sorts
// before the release (semver 2.0 §11, compared lexically).
func cmpVersion(a, b version) int {
	n := max(len(a.seg), len(b.seg))
	for i := 0; i < n; i++ {
		var x, y int
		if i < len(a.seg) {
			x = a.seg[i]
		}
		if i < len(b.seg) {
			y = b.seg[i]
		}
		if x != y {
			if x < y {
				return -1
			}
			return 1
		}
	}
	switch {
	case a.pre == b.pre:
		return 0
	case a.pre == "":
		return 1
	case b.pre == "":
		return -1
	case a.pre < b.pre:
		return -1
	default:
		return 1
	}
}

func parseVersionRange(s string) ([]verCond, error) {
	var out []verCond
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		op := "="
		for _, cand := range []string{"~>", ">=", "<=", "!=", ">", "<", "="} {
			if strings.HasPrefix(part, cand) {
				op = cand
				part = strings.TrimSpace(part[len(cand):])
				break
			}
		}
		v, err := parseVersion(part)
		if err != nil {
			return nil, err
		}
		out = append(out, verCond{op: op, v: v})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("empty version range")
	}
	return out, nil
}

func (c verCond) holds(v version) bool {
	d := cmpVersion(v, c.v)
	switch c.op {
	case "=":
		return d == 0
	case "!=":
		return d != 0
	case ">":
		return d > 0
	case ">=":
		return d >= 0
	case "<":
		return d < 0
	case "<=":
		return d <= 0
	case "~>":
		// Pessimistic: ~> 1.2.3 means >= 1.2.3, < 1.3; ~> 1.2 means >= 1.2, < 2.
		if d < 0 {
			return false
		}
		if len(c.v.seg) < 2 {
			return true
		}
		upper := version{seg: append([]int(nil), c.v.seg[:len(c.v.seg)-1]...)}
		upper.seg[len(upper.seg)-1]++
		return cmpVersion(version{seg: v.seg}, upper) < 0
	}
	return false
}
