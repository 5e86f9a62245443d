package layering

import (
	"bufio"
	"fmt"
	"path"
	"sort"
	"strings"
)

// Rule forbids packages matching From (minus the Except patterns) to import
// packages matching To. Patterns are module-relative paths: "regional/..."
// is regional and everything under it, "*" is every package of the module.
// A "*" target never matches the importer's own tree (what From matches),
// so `forbid placement/... -> *` lets placement/sim import placement.
type Rule struct {
	Line   int
	Text   string
	From   []string
	Except []string
	To     []string
}

// Parse reads the rules from the fenced "```layering" block of a Markdown
// document. Each rule is a line
//
//	forbid FROM [FROM...] [except PAT...] -> TO [TO...]
//
// with "#" comments and blank lines ignored. It is an error when there is
// no such block or a line does not parse.
func Parse(markdown string) ([]Rule, error) {
	var rules []Rule
	in, found := false, false
	sc := bufio.NewScanner(strings.NewReader(markdown))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trim := strings.TrimSpace(line)
		switch {
		case !in && trim == "```layering":
			in, found = true, true
			continue
		case in && trim == "```":
			in = false
			continue
		case !in:
			continue
		}
		if i := strings.Index(trim, "#"); i >= 0 {
			trim = strings.TrimSpace(trim[:i])
		}
		if trim == "" {
			continue
		}
		r, err := parseRule(trim)
		if err != nil {
			return nil, fmt.Errorf("line %d %q: %w", n, line, err)
		}
		r.Line = n
		rules = append(rules, r)
	}
	if !found {
		return nil, fmt.Errorf("no ```layering block")
	}
	if in {
		return nil, fmt.Errorf("the ```layering block is not closed")
	}
	return rules, nil
}

func parseRule(s string) (Rule, error) {
	r := Rule{Text: s}
	rest, ok := strings.CutPrefix(s, "forbid ")
	if !ok {
		return r, fmt.Errorf(`a rule starts with "forbid "`)
	}
	lhs, rhs, ok := strings.Cut(rest, "->")
	if !ok {
		return r, fmt.Errorf(`a rule needs "->"`)
	}
	from, except, _ := strings.Cut(lhs, " except ")
	r.From, r.Except, r.To = strings.Fields(from), strings.Fields(except), strings.Fields(rhs)
	if len(r.From) == 0 || len(r.To) == 0 {
		return r, fmt.Errorf("a rule needs at least one pattern on each side")
	}
	return r, nil
}

// match reports whether the module-relative package path p matches pattern.
func match(pattern, p string) bool {
	switch {
	case pattern == "*":
		return true
	case strings.HasSuffix(pattern, "/..."):
		base := strings.TrimSuffix(pattern, "/...")
		return p == base || strings.HasPrefix(p, base+"/")
	}
	return p == pattern
}

func matchAny(patterns []string, p string) bool {
	for _, pat := range patterns {
		if match(pat, p) {
			return true
		}
	}
	return false
}

// Violation is one forbidden edge.
type Violation struct {
	From, To string
	Rule     Rule
}

func (v Violation) String() string {
	return fmt.Sprintf("%s imports %s, forbidden by docs/architecture.md line %d: %s", v.From, v.To, v.Rule.Line, v.Rule.Text)
}

// Check returns every edge of graph (module-relative importer → imported
// packages of the module) that a rule forbids, sorted.
func Check(rules []Rule, graph map[string][]string) []Violation {
	var out []Violation
	for from, tos := range graph {
		for _, to := range tos {
			if to == from {
				continue
			}
			for _, r := range rules {
				if !matchAny(r.From, from) || matchAny(r.Except, from) || !matchAny(r.To, to) {
					continue
				}
				if len(r.To) == 1 && r.To[0] == "*" && matchAny(r.From, to) {
					continue // "*" never means the importer's own tree
				}
				out = append(out, Violation{From: from, To: to, Rule: r})
			}
		}
	}
	sort.Slice(out, func(a, b int) bool {
		if out[a].From != out[b].From {
			return out[a].From < out[b].From
		}
		return out[a].To < out[b].To
	})
	return out
}

// Rel turns an import path of module mod into a module-relative path, or ""
// for packages outside the module.
func Rel(mod, importPath string) string {
	if importPath == mod {
		return "."
	}
	if rest, ok := strings.CutPrefix(importPath, mod+"/"); ok {
		return path.Clean(rest)
	}
	return ""
}
