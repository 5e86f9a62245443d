package acl

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

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
// Decoding is strict, because a policy grants access and a field read
// another way than its author meant widens or narrows it silently. The
// file must be one YAML document (YAML 1.2, go.yaml.in/yaml/v3) whose top
// level is a mapping of the fields above, each at most once; keys are
// case-sensitive ("NODE" is an unknown field, not node); description,
// node, name and the capabilities are strings; operator is true or false,
// nothing else (not yes, on, "true" or True); explicit tags (!!binary,
// !!str, ...), anchors and aliases are refused; a field whose value is
// empty (node:) is the field unset. Errors: the file is empty, more than
// 64 KiB or not YAML; otherwise every broken rule, joined, each a
// *FieldError naming the field and the line (`namespaces[0].caps: unknown
// field (line 3); ...`), then ValidatePolicy's errors.
func ParsePolicyYAML(name string, data []byte) (*apiaryv1.ACLPolicy, error) {
	if len(data) > MaxPolicyFileBytes {
		return nil, fmt.Errorf("policy file is %d bytes; the limit is %d (64 KiB)", len(data), MaxPolicyFileBytes)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, errors.New("policy file is empty")
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("policy file is empty (comments only)")
		}
		return nil, fmt.Errorf("policy file: not valid YAML: %s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	var next yaml.Node
	if err := dec.Decode(&next); !errors.Is(err, io.EOF) {
		return nil, errors.New("policy file: holds more than one YAML document (separated by ---); it must hold exactly one policy")
	}
	p := &apiaryv1.ACLPolicy{Name: name}
	var d policyDecoder
	if len(doc.Content) != 1 {
		return nil, errors.New("policy file is empty (comments only)")
	}
	d.policy(doc.Content[0], p)
	if err := errors.Join(d.errs...); err != nil {
		return nil, err
	}
	if err := ValidatePolicy(p); err != nil {
		return nil, err
	}
	return p, nil
}

// policyDecoder walks a policy file's YAML nodes by the policy's schema
// and collects one *FieldError per broken rule (ParsePolicyYAML).
type policyDecoder struct{ errs []error }

func (d *policyDecoder) fail(field string, n *yaml.Node, format string, args ...any) {
	d.errs = append(d.errs, fieldErr(field, "%s (line %d)", fmt.Sprintf(format, args...), n.Line))
}

// plain reports whether n may be read as a value: no explicit tag, no
// anchor, not an alias (each refused, naming field).
func (d *policyDecoder) plain(field string, n *yaml.Node) bool {
	switch {
	case n.Kind == yaml.AliasNode:
		d.fail(field, n, "aliases (*%s) are not allowed in a policy file", n.Value)
	case n.Anchor != "":
		d.fail(field, n, "anchors (&%s) are not allowed in a policy file", n.Anchor)
	case n.Style&yaml.TaggedStyle != 0:
		d.fail(field, n, "explicit tags (%s) are not allowed in a policy file", n.Tag)
	default:
		return true
	}
	return false
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" }

// describe names what a node holds, for "must be X (got Y)".
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!str":
			return fmt.Sprintf("the string %q", n.Value)
		case "!!bool":
			return "the boolean " + n.Value
		case "!!int", "!!float":
			return "the number " + n.Value
		}
		return fmt.Sprintf("%q (%s)", n.Value, n.ShortTag())
	}
	return "something else"
}

// str decodes a string field; an empty value (null) leaves *out unset.
func (d *policyDecoder) str(field string, n *yaml.Node, out *string) {
	if !d.plain(field, n) || isNull(n) {
		return
	}
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
		d.fail(field, n, "must be a string (got %s; quote it if it is one)", describe(n))
		return
	}
	*out = n.Value
}

// fields walks a mapping whose keys must be names (exact case, each at
// most once), calling set with each key and value; set reports whether
// it knows the key.
func (d *policyDecoder) fields(field string, n *yaml.Node, what string, known []string, set func(key string, v *yaml.Node)) {
	if !d.plain(field, n) {
		return
	}
	if n.Kind != yaml.MappingNode {
		d.fail(field, n, "must be %s (got %s)", what, describe(n))
		return
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		path := k.Value
		if field != "" {
			path = field + "." + k.Value
		}
		if !d.plain(path, k) {
			continue
		}
		if k.Kind != yaml.ScalarNode || k.ShortTag() != "!!str" {
			d.fail(path, k, "is not a field name (got %s); %s has only %s", describe(k), what, strings.Join(known, ", "))
			continue
		}
		if line, dup := seen[k.Value]; dup {
			d.fail(path, k, "duplicate key (also on line %d)", line)
			continue
		}
		seen[k.Value] = k.Line
		if !slices.Contains(known, k.Value) {
			hint := ""
			for _, f := range known {
				if strings.EqualFold(f, k.Value) {
					hint = fmt.Sprintf("; keys are case-sensitive: did you mean %q?", f)
				}
			}
			d.fail(path, k, "unknown field; %s has only %s%s", what, strings.Join(known, ", "), hint)
			continue
		}
		set(k.Value, v)
	}
}

// policy decodes the top-level mapping into p.
func (d *policyDecoder) policy(n *yaml.Node, p *apiaryv1.ACLPolicy) {
	d.fields("", n, "a policy (a mapping of description, namespaces, node, operator)",
		[]string{"description", "namespaces", "node", "operator"}, func(key string, v *yaml.Node) {
			switch key {
			case "description":
				d.str(key, v, &p.Description)
			case "node":
				d.str(key, v, &p.Node)
			case "operator":
				if !d.plain(key, v) || isNull(v) {
					return
				}
				if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!bool" || (v.Value != "true" && v.Value != "false") {
					d.fail(key, v, "must be true or false (got %s)", describe(v))
					return
				}
				p.Operator = v.Value == "true"
			case "namespaces":
				d.namespaces(v, p)
			}
		})
}

func (d *policyDecoder) namespaces(n *yaml.Node, p *apiaryv1.ACLPolicy) {
	if !d.plain("namespaces", n) || isNull(n) {
		return
	}
	if n.Kind != yaml.SequenceNode {
		d.fail("namespaces", n, "must be a list of {name, capabilities} (got %s)", describe(n))
		return
	}
	for i, item := range n.Content {
		f := fmt.Sprintf("namespaces[%d]", i)
		r := &apiaryv1.ACLNamespaceRule{}
		d.fields(f, item, "a namespace rule (a mapping of name, capabilities)", []string{"name", "capabilities"}, func(key string, v *yaml.Node) {
			switch key {
			case "name":
				d.str(f+".name", v, &r.Name)
			case "capabilities":
				cf := f + ".capabilities"
				if !d.plain(cf, v) || isNull(v) {
					return
				}
				if v.Kind != yaml.SequenceNode {
					d.fail(cf, v, "must be a list of submit, read, cancel (got %s)", describe(v))
					return
				}
				for k, c := range v.Content {
					var s string
					d.str(fmt.Sprintf("%s[%d]", cf, k), c, &s)
					r.Capabilities = append(r.Capabilities, s)
				}
			}
		})
		p.Namespaces = append(p.Namespaces, r)
	}
}
