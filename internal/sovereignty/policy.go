// Package sovereignty is Apiary's sovereignty policy: which jurisdictions a job may
// run in, given the jurisdiction its data belongs to and its data class.
//
// The policy is a strict YAML file (an unknown field, a duplicate key or a
// value of the wrong type is an error), validated once at start-up by both the
// global router (`apiary global --policy`) and every regional coordinator
// (`apiary region --policy`), so the router's routing decision and the
// region's re-check before it accepts a job apply the same rule. Errors name
// the field path and the rule, e.g. `rules[1].allow[0]: jurisdiction "xx" is
// not declared under jurisdictions`.
//
// Evaluation: the rules are tried in file order and the first rule whose
// match fits the job decides the set of jurisdictions the job may run in; if
// no rule matches, `default.allow` decides. `"*"` in an allow list means any
// jurisdiction. A region is allowed for a job when its jurisdiction is in that
// set. The package is pure: no I/O beyond reading the file.
package sovereignty

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

// Any in an allow list stands for every jurisdiction.
const Any = "*"

// MaxFileBytes bounds a policy file (64 KiB).
const MaxFileBytes = 64 << 10

// Policy is a validated sovereignty policy. Use Load or Parse; the zero value
// is not valid.
type Policy struct {
	// Version must be 1.
	Version int `json:"version"`
	// Jurisdictions declares every jurisdiction the policy talks about, with
	// an optional description.
	Jurisdictions map[string]Jurisdiction `json:"jurisdictions"`
	// DataClasses lists the data classes a job may carry; empty means any
	// class is accepted and only rules name classes.
	DataClasses []string `json:"data_classes,omitempty"`
	// Default applies to a job that no rule matches.
	Default Default `json:"default"`
	// Rules are tried in order; the first match decides.
	Rules []Rule `json:"rules,omitempty"`
}

// Jurisdiction describes one declared jurisdiction.
type Jurisdiction struct {
	Description string `json:"description,omitempty"`
}

// Default is the decision for a job no rule matches.
type Default struct {
	// Allow lists the jurisdictions such a job may run in ("*": any).
	Allow []string `json:"allow"`
}

// Rule maps jobs (by their data's jurisdiction and data class) to the
// jurisdictions they may run in.
type Rule struct {
	// Name identifies the rule in refusals ([a-z0-9-], unique).
	Name  string `json:"name"`
	Match Match  `json:"match"`
	// Allow lists the jurisdictions a matching job may run in; an empty list
	// means nowhere (the job is refused everywhere).
	Allow []string `json:"allow"`
}

// Match selects jobs. An empty list matches every value, including empty.
type Match struct {
	// Jurisdiction: the job's `jurisdiction` is one of these.
	Jurisdiction []string `json:"jurisdiction,omitempty"`
	// DataClass: the job's `data_class` is one of these.
	DataClass []string `json:"data_class,omitempty"`
}

// FieldError is one problem in a policy file, with the field path.
type FieldError struct {
	Field string
	Msg   string
}

func (e FieldError) String() string {
	if e.Field == "" {
		return e.Msg
	}
	return e.Field + ": " + e.Msg
}

// Error lists every problem found in a policy file.
type Error struct {
	Source string
	Errors []FieldError
}

func (e *Error) Error() string {
	var b strings.Builder
	src := e.Source
	if src == "" {
		src = "policy"
	}
	fmt.Fprintf(&b, "%s is not a valid sovereignty policy:", src)
	for _, fe := range e.Errors {
		b.WriteString("\n  " + fe.String())
	}
	return b.String()
}

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// Load reads, parses and validates the policy file at path.
func Load(path string) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	p, err := Parse(data)
	var pe *Error
	if errors.As(err, &pe) {
		pe.Source = path
	}
	return p, err
}

// Parse decodes and validates a policy document. Decoding is strict: an
// unknown field, a duplicate key or a wrong type is an error. It returns
// *Error listing every problem with its field path.
func Parse(data []byte) (*Policy, error) {
	fail := func(field, format string, args ...any) (*Policy, error) {
		return nil, &Error{Errors: []FieldError{{Field: field, Msg: fmt.Sprintf(format, args...)}}}
	}
	if len(data) > MaxFileBytes {
		return fail("", "file is %d bytes; the limit is %d", len(data), MaxFileBytes)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return fail("", "file is empty")
	}
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return fail("", "invalid YAML: %v", err)
	}
	if !bytes.HasPrefix(bytes.TrimSpace(js), []byte("{")) {
		return fail("", "the document must be a mapping")
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	var p Policy
	if err := dec.Decode(&p); err != nil {
		return fail(jsonField(err), "%s", jsonMsg(err))
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &p, nil
}

// jsonField extracts the field path from an encoding/json error.
func jsonField(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return te.Field
	}
	msg := err.Error()
	if i := strings.Index(msg, `unknown field "`); i >= 0 {
		return strings.TrimSuffix(msg[i+len(`unknown field "`):], `"`)
	}
	return ""
}

func jsonMsg(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("must be %s, got %s", jsonKind(te.Type.Kind().String()), te.Value)
	}
	if strings.Contains(err.Error(), "unknown field") {
		return "unknown field (the policy is strict; see examples/policy.yaml)"
	}
	return err.Error()
}

func jsonKind(k string) string {
	switch k {
	case "slice":
		return "a list"
	case "map", "struct":
		return "a mapping"
	case "int", "int64":
		return "an integer"
	}
	return "a " + k
}

// Validate checks the policy's rules; every error names its field.
func (p *Policy) Validate() error {
	var errs []FieldError
	add := func(field, format string, args ...any) {
		errs = append(errs, FieldError{Field: field, Msg: fmt.Sprintf(format, args...)})
	}
	if p.Version != 1 {
		add("version", "must be 1, got %d", p.Version)
	}
	if len(p.Jurisdictions) == 0 {
		add("jurisdictions", "must declare at least one jurisdiction")
	}
	for _, j := range sortedKeys(p.Jurisdictions) {
		if !nameRE.MatchString(j) {
			add("jurisdictions."+j, "name must match %s", nameRE)
		}
	}
	classes := map[string]bool{}
	for i, c := range p.DataClasses {
		f := fmt.Sprintf("data_classes[%d]", i)
		switch {
		case !nameRE.MatchString(c):
			add(f, "%q must match %s", c, nameRE)
		case classes[c]:
			add(f, "%q is listed twice", c)
		}
		classes[c] = true
	}
	checkAllow := func(field string, allow []string, mustBeSet bool) {
		if allow == nil && mustBeSet {
			add(field, "is required (a list of jurisdictions, %q for any, [] for none)", Any)
		}
		seen := map[string]bool{}
		for i, a := range allow {
			f := fmt.Sprintf("%s[%d]", field, i)
			switch {
			case a == Any && len(allow) > 1:
				add(f, "%q must be the only entry when used", Any)
			case a == Any:
			case seen[a]:
				add(f, "jurisdiction %q is listed twice", a)
			case p.Jurisdictions == nil || !hasKey(p.Jurisdictions, a):
				add(f, "jurisdiction %q is not declared under jurisdictions", a)
			}
			seen[a] = true
		}
	}
	checkAllow("default.allow", p.Default.Allow, true)
	names := map[string]int{}
	for i, r := range p.Rules {
		base := fmt.Sprintf("rules[%d]", i)
		if !nameRE.MatchString(r.Name) {
			add(base+".name", "must match %s, got %q", nameRE, r.Name)
		} else if j, dup := names[r.Name]; dup {
			add(base+".name", "%q is already used by rules[%d]", r.Name, j)
		}
		names[r.Name] = i
		if len(r.Match.Jurisdiction) == 0 && len(r.Match.DataClass) == 0 {
			add(base+".match", "must name a jurisdiction or a data_class (a rule matching every job belongs in default)")
		}
		for k, j := range r.Match.Jurisdiction {
			if !hasKey(p.Jurisdictions, j) {
				add(fmt.Sprintf("%s.match.jurisdiction[%d]", base, k), "jurisdiction %q is not declared under jurisdictions", j)
			}
		}
		for k, c := range r.Match.DataClass {
			f := fmt.Sprintf("%s.match.data_class[%d]", base, k)
			if !nameRE.MatchString(c) {
				add(f, "%q must match %s", c, nameRE)
			} else if len(p.DataClasses) > 0 && !classes[c] {
				add(f, "data class %q is not listed under data_classes", c)
			}
		}
		checkAllow(base+".allow", r.Allow, true)
	}
	if len(errs) > 0 {
		return &Error{Errors: errs}
	}
	return nil
}

func hasKey(m map[string]Jurisdiction, k string) bool { _, ok := m[k]; return ok }

func sortedKeys(m map[string]Jurisdiction) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Decision is what the policy says about one job.
type Decision struct {
	// Rule is the name of the deciding rule, or "default".
	Rule string
	// Any is true when the job may run in any jurisdiction.
	Any bool
	// Allowed lists the jurisdictions the job may run in (when !Any).
	Allowed []string
}

// Allows reports whether a region of jurisdiction j may run the job.
func (d Decision) Allows(j string) bool {
	if d.Any {
		return true
	}
	for _, a := range d.Allowed {
		if a == j {
			return true
		}
	}
	return false
}

// String describes the decision for refusals: `rule "eu-personal" allows
// jurisdictions [eu]`.
func (d Decision) String() string {
	switch {
	case d.Rule == RuleNoPolicy && !d.Any:
		return fmt.Sprintf("no sovereignty policy is loaded, so the job runs only in its own jurisdiction [%s]", strings.Join(d.Allowed, ", "))
	case d.Any:
		return fmt.Sprintf("policy rule %q allows any jurisdiction", d.Rule)
	case len(d.Allowed) == 0:
		return fmt.Sprintf("policy rule %q allows no jurisdiction", d.Rule)
	}
	return fmt.Sprintf("policy rule %q allows only jurisdictions [%s]", d.Rule, strings.Join(d.Allowed, ", "))
}

// Decide evaluates the policy for a job's data jurisdiction and data class
// (either may be empty).
func (p *Policy) Decide(jurisdiction, dataClass string) Decision {
	for _, r := range p.Rules {
		if matches(r.Match.Jurisdiction, jurisdiction) && matches(r.Match.DataClass, dataClass) {
			return decision(r.Name, r.Allow)
		}
	}
	return decision("default", p.Default.Allow)
}

// Check is the admission form of Decide: nil if a region of jurisdiction
// regionJurisdiction may run the job, else an error that names the field and
// the rule.
func (p *Policy) Check(jurisdiction, dataClass, regionName, regionJurisdiction string) error {
	d := p.Decide(jurisdiction, dataClass)
	if d.Allows(regionJurisdiction) {
		return nil
	}
	return d.Refusal(jurisdiction, dataClass, regionName, regionJurisdiction)
}

func decision(rule string, allow []string) Decision {
	if len(allow) == 1 && allow[0] == Any {
		return Decision{Rule: rule, Any: true}
	}
	return Decision{Rule: rule, Allowed: append([]string(nil), allow...)}
}

func matches(list []string, v string) bool {
	if len(list) == 0 {
		return true
	}
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}
