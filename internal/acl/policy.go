package acl

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"sigs.k8s.io/yaml"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

// Limits of a policy.
const (
	MaxPolicyNameLen    = 128
	MaxDescriptionBytes = 1024
	MaxNamespaceRules   = 256
	// MaxPolicyFileBytes bounds a policy file (ParsePolicyYAML).
	MaxPolicyFileBytes = 64 << 10
)

var policyNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// ValidatePolicyName checks a policy name: 1-128 characters of
// [A-Za-z0-9_-]. The error is a *FieldError naming field.
func ValidatePolicyName(field, name string) error {
	if policyNameRE.MatchString(name) {
		return nil
	}
	return fieldErr(field, "must be 1-%d characters of A-Z, a-z, 0-9, '_' and '-' (got %q)", MaxPolicyNameLen, name)
}

// ValidatePolicy checks a policy before it is stored: name (1-128 of
// [A-Za-z0-9_-]), description (at most 1 KiB of UTF-8), at most 256
// namespace rules, each naming a valid namespace or "*" (once per policy)
// with at least one capability, each one of submit, read, cancel; node ""
// (none), "read" or "write". It returns nil or every broken rule joined
// (errors.Join of *FieldError, one per line), each naming its field:
//
//	namespaces[1].capabilities[0]: "delete" is not one of submit, read, cancel
func ValidatePolicy(p *apiaryv1.ACLPolicy) error {
	if p == nil {
		return fieldErr("policy", "is required")
	}
	var errs []error
	if err := ValidatePolicyName("name", p.GetName()); err != nil {
		errs = append(errs, err)
	}
	if d := p.GetDescription(); len(d) > MaxDescriptionBytes || !utf8.ValidString(d) {
		errs = append(errs, fieldErr("description", "must be valid UTF-8 of at most %d bytes", MaxDescriptionBytes))
	}
	rules := p.GetNamespaces()
	if len(rules) > MaxNamespaceRules {
		errs = append(errs, fieldErr("namespaces", "at most %d rules are allowed (got %d)", MaxNamespaceRules, len(rules)))
	}
	seen := map[string]int{}
	for i, r := range rules {
		f := fmt.Sprintf("namespaces[%d]", i)
		if r == nil {
			errs = append(errs, fieldErr(f, "must not be null"))
			continue
		}
		switch n := r.GetName(); {
		case n == Wildcard:
		case n == "":
			errs = append(errs, fieldErr(f+".name", "is required: a namespace, or \"*\" for every namespace"))
		case !namespaceRE.MatchString(n):
			errs = append(errs, fieldErr(f+".name", "must be \"*\" or a namespace: %s (got %q)", namespaceRule, n))
		}
		if j, dup := seen[r.GetName()]; dup && r.GetName() != "" {
			errs = append(errs, fieldErr(f+".name", "duplicate rule for %q (also namespaces[%d]); put all its capabilities in one rule", r.GetName(), j))
		} else {
			seen[r.GetName()] = i
		}
		if len(r.GetCapabilities()) == 0 {
			errs = append(errs, fieldErr(f+".capabilities", "at least one of %s is required", strings.Join(Capabilities, ", ")))
		}
		for k, c := range r.GetCapabilities() {
			if !slices.Contains(Capabilities, c) {
				errs = append(errs, fieldErr(fmt.Sprintf("%s.capabilities[%d]", f, k), "%q is not one of %s", c, strings.Join(Capabilities, ", ")))
			}
		}
	}
	switch p.GetNode() {
	case NodeNone, NodeRead, NodeWrite:
	default:
		errs = append(errs, fieldErr("node", "%q is not one of \"\" (none), read, write", p.GetNode()))
	}
	return errors.Join(errs...)
}

// policyFile is the YAML form of a policy (ParsePolicyYAML).
type policyFile struct {
	Description string       `json:"description"`
	Namespaces  []policyRule `json:"namespaces"`
	Node        string       `json:"node"`
	Operator    bool         `json:"operator"`
}

// policyRule is one entry of a policy file's namespaces.
type policyRule struct {
	Name         string   `json:"name"`
	Capabilities []string `json:"capabilities"`
}

// ParsePolicyYAML reads a policy file (the CLI's `apiary acl policy apply
// NAME FILE`; Nomad's policy files, in YAML) and returns the policy named
// name, validated (ValidatePolicy). The format:
//
//	description: team A
//	namespaces:
//	  - name: team-a        # or "*": every namespace
//	    capabilities: [submit, read, cancel]
//	node: read              # "", read or write
//	operator: false
//
// Decoding is strict: an unknown field, a value of the wrong type, a
// duplicate key, an empty file or more than 64 KiB are errors. Errors name
// the field where the decoder or the rules can.
func ParsePolicyYAML(name string, data []byte) (*apiaryv1.ACLPolicy, error) {
	if len(data) > MaxPolicyFileBytes {
		return nil, fmt.Errorf("policy file is %d bytes; the limit is %d (64 KiB)", len(data), MaxPolicyFileBytes)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, errors.New("policy file is empty")
	}
	var f policyFile
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, fmt.Errorf("policy file: %s", cleanYAMLError(err))
	}
	p := &apiaryv1.ACLPolicy{Name: name, Description: f.Description, Node: f.Node, Operator: f.Operator}
	for _, r := range f.Namespaces {
		p.Namespaces = append(p.Namespaces, &apiaryv1.ACLNamespaceRule{Name: r.Name, Capabilities: r.Capabilities})
	}
	if err := ValidatePolicy(p); err != nil {
		return nil, err
	}
	return p, nil
}

var yamlNoise = regexp.MustCompile(`^(error converting YAML to JSON: |error unmarshaling JSON: while decoding JSON: )?(yaml: )?(json: )?`)

func cleanYAMLError(err error) string {
	s := yamlNoise.ReplaceAllString(err.Error(), "")
	s = strings.ReplaceAll(s, "unmarshal errors:\n  ", "")
	s = strings.NewReplacer("Go struct field policyFile.", "", "Go struct field policyRule.", "namespaces[].", "Go value of type ", "").Replace(s)
	s = strings.NewReplacer(
		"into acl.policyFile", "into a policy (a mapping of description, namespaces, node, operator)",
		"of type []acl.policyRule", "of type list of {name, capabilities}",
		"into acl.policyRule", "into a namespace rule (a mapping of name, capabilities)").Replace(s)
	return strings.ReplaceAll(s, "\n  ", "; ")
}
