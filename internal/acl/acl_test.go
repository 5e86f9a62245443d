package acl

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"pgregory.net/rapid"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

func TestValidateNamespace(t *testing.T) {
	for ns, ok := range map[string]bool{
		"default": true, "a": true, "team-a": true, "a1-2-3": true, strings.Repeat("a", 63): true,
		"a-b": true, "a1": true, strings.Repeat("a", 62) + "1": true,
		"": false, "1abc": false, "-a": false, "Team": false, "a_b": false, "a.b": false, "*": false,
		strings.Repeat("a", 64): false, "é": false,
		// DNS labels (RFC 1123) do not end with '-'.
		"a-": false, "team-a-": false, strings.Repeat("a", 62) + "-": false,
	} {
		err := ValidateNamespace(ns)
		if (err == nil) != ok {
			t.Errorf("ValidateNamespace(%q) = %v; want ok=%v", ns, err, ok)
		}
		var fe *FieldError
		if err != nil && (!errors.As(err, &fe) || fe.Field != "namespace" || !strings.Contains(err.Error(), "starting with a letter and not ending with '-'")) {
			t.Errorf("ValidateNamespace(%q) = %v; want a FieldError naming namespace and the rule", ns, err)
		}
	}
	if OrDefault("") != DefaultNamespace || OrDefault("x") != "x" {
		t.Error("OrDefault")
	}
}

func TestHashAndIDs(t *testing.T) {
	if h := HashSecret("s"); len(h) != 64 || h != HashSecret("s") || h == HashSecret("t") {
		t.Errorf("HashSecret: %q", h)
	}
	a, b := NewID(), NewID()
	if a == b || ValidateID("accessor_id", a) != nil {
		t.Errorf("NewID: %q %q", a, b)
	}
	for _, bad := range []string{"", "x", strings.ToUpper(a), "{" + a + "}", a + "0"} {
		if err := ValidateID("secret_id", bad); err == nil || !strings.HasPrefix(err.Error(), "secret_id: must be a UUID") {
			t.Errorf("ValidateID(%q) = %v", bad, err)
		}
	}
}

func rule(name string, caps ...string) *apiaryv1.ACLNamespaceRule {
	return &apiaryv1.ACLNamespaceRule{Name: name, Capabilities: caps}
}

func TestValidatePolicy(t *testing.T) {
	good := &apiaryv1.ACLPolicy{Name: "team_a-1", Namespaces: []*apiaryv1.ACLNamespaceRule{rule("team-a", "submit", "read"), rule("*", "read")}, Node: "write"}
	if err := ValidatePolicy(good); err != nil {
		t.Fatalf("good policy: %v", err)
	}
	for _, tc := range []struct {
		p    *apiaryv1.ACLPolicy
		want []string
	}{
		{nil, []string{"policy: is required"}},
		{&apiaryv1.ACLPolicy{Name: ""}, []string{"name: must be 1-128 characters"}},
		{&apiaryv1.ACLPolicy{Name: "a b"}, []string{"name: must be 1-128"}},
		{&apiaryv1.ACLPolicy{Name: strings.Repeat("x", 129)}, []string{"name: must be 1-128"}},
		{&apiaryv1.ACLPolicy{Name: "p", Namespaces: []*apiaryv1.ACLNamespaceRule{rule("a", "read"), rule("b", "delete")}},
			[]string{`namespaces[1].capabilities[0]: "delete" is not one of submit, read, cancel`}},
		{&apiaryv1.ACLPolicy{Name: "p", Namespaces: []*apiaryv1.ACLNamespaceRule{rule("Bad", "read")}}, []string{`namespaces[0].name: must be "*" or a namespace`}},
		{&apiaryv1.ACLPolicy{Name: "p", Namespaces: []*apiaryv1.ACLNamespaceRule{rule("", "read")}}, []string{"namespaces[0].name: is required"}},
		{&apiaryv1.ACLPolicy{Name: "p", Namespaces: []*apiaryv1.ACLNamespaceRule{rule("a")}}, []string{"namespaces[0].capabilities: at least one"}},
		{&apiaryv1.ACLPolicy{Name: "p", Namespaces: []*apiaryv1.ACLNamespaceRule{rule("a", "read"), rule("a", "submit")}},
			[]string{`namespaces[1].name: duplicate rule for "a" (also namespaces[0])`}},
		{&apiaryv1.ACLPolicy{Name: "p", Namespaces: []*apiaryv1.ACLNamespaceRule{nil}}, []string{"namespaces[0]: must not be null"}},
		{&apiaryv1.ACLPolicy{Name: "p", Node: "admin"}, []string{`node: "admin" is not one of "" (none), read, write`}},
		{&apiaryv1.ACLPolicy{Name: "p", Description: strings.Repeat("d", 1025)}, []string{"description: must be valid UTF-8 of at most 1024 bytes"}},
		{&apiaryv1.ACLPolicy{Name: "", Node: "x"}, []string{"name: must be", "node: \"x\""}},
	} {
		err := ValidatePolicy(tc.p)
		if err == nil {
			t.Errorf("ValidatePolicy(%v) = nil; want %q", tc.p, tc.want)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("ValidatePolicy(%v) = %q; want it to say %q", tc.p, err, w)
			}
		}
	}
}

func TestParsePolicyYAML(t *testing.T) {
	p, err := ParsePolicyYAML("team-a", []byte(`
description: team A
namespaces:
  - name: team-a        # or "*"
    capabilities: [submit, read, cancel]
  - name: "*"
    capabilities: [read]
node: read
operator: false
`))
	if err != nil {
		t.Fatal(err)
	}
	if p.GetName() != "team-a" || p.GetDescription() != "team A" || p.GetNode() != "read" || p.GetOperator() ||
		len(p.GetNamespaces()) != 2 || p.GetNamespaces()[0].GetName() != "team-a" ||
		!slices.Equal(p.GetNamespaces()[0].GetCapabilities(), []string{"submit", "read", "cancel"}) || p.GetNamespaces()[1].GetName() != "*" {
		t.Errorf("parsed %v", p)
	}
	for _, tc := range []struct{ name, file, want string }{
		{"p", "", "policy file is empty"},
		{"p", "nodes: read\n", "nodes: unknown field; a policy"},
		{"p", "namespaces:\n  - name: a\n    caps: [read]\n", "namespaces[0].caps: unknown field; a namespace rule (a mapping of name, capabilities) has only name, capabilities (line 3)"},
		{"p", "node: [read]\n", "node"},
		{"p", "node: read\nnode: write\n", "node: duplicate key (also on line 1) (line 2)"},
		{"p", "namespaces:\n  - name: a\n    capabilities: [read, delete]\n", `namespaces[0].capabilities[1]: "delete" is not one of submit, read, cancel`},
		{"bad name", "node: read\n", "name: must be 1-128"},
		{"p", "- a\n", "must be a policy (a mapping of description, namespaces, node, operator) (got a list)"},
		{"p", "namespaces: [a]\n", "namespaces[0]: must be a namespace rule (a mapping of name, capabilities) (got the string \"a\")"},
		{"p", "node: 1\n", "node: must be a string (got the number 1; quote it if it is one)"},
		{"p", "description: [x]\n", "description: must be a string (got a list"},
		{"p", "namespaces:\n  - name: a\n    capabilities: read\n", "namespaces[0].capabilities: must be a list of submit, read, cancel"},
		{"p", "node: read\n---\n", "more than one YAML document"},
		{"p", "node: [\n", "not valid YAML"},
		{"p", "# only a comment\n", "policy file is empty"},
		{"p", strings.Repeat("#", MaxPolicyFileBytes+1), "the limit is"},
	} {
		_, err := ParsePolicyYAML(tc.name, []byte(tc.file))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParsePolicyYAML(%q, %q) = %v; want %q", tc.name, tc.file, err, tc.want)
		}
	}
}

// TestParsePolicyYAMLIsStrict: the lax readings an adversarial test found
// (issue 19) are refused, each naming the field: keys of another case
// (NODE, Capabilities beside capabilities), a second document, explicit
// tags (!!binary decoding to "write"), YAML 1.1 booleans (yes, on) and
// booleans of another spelling, anchors and aliases; while true/false,
// quoted strings and an empty value (the field unset) are read as written.
func TestParsePolicyYAMLIsStrict(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{"NODE: write\n", `NODE: unknown field; a policy (a mapping of description, namespaces, node, operator) has only description, namespaces, node, operator; keys are case-sensitive: did you mean "node"?`},
		{"Node: read\nnode: read\n", `Node: unknown field`},
		{"namespaces:\n  - name: a\n    capabilities: [read]\n    Capabilities: [submit, cancel]\n",
			`namespaces[0].Capabilities: unknown field; a namespace rule (a mapping of name, capabilities) has only name, capabilities; keys are case-sensitive: did you mean "capabilities"? (line 4)`},
		{"namespaces:\n  - name: a\n    capabilities: [read]\n    capabilities: [submit]\n", "namespaces[0].capabilities: duplicate key (also on line 3) (line 4)"},
		{"node: read\n---\nnode: write\noperator: true\n", "more than one YAML document (separated by ---)"},
		{"---\nnode: read\n---\n", "more than one YAML document"},
		{"node: !!binary d3JpdGU=\n", "node: explicit tags (!!binary) are not allowed in a policy file (line 1)"},
		{"node: !!str write\n", "node: explicit tags (!!str) are not allowed"},
		{"operator: !!bool true\n", "operator: explicit tags (!!bool) are not allowed"},
		{"!!map\nnode: read\n", "explicit tags (!!map) are not allowed"},
		{"namespaces:\n  - name: a\n    capabilities: [!!str read]\n", "namespaces[0].capabilities[0]: explicit tags (!!str)"},
		{"operator: yes\n", `operator: must be true or false (got the string "yes") (line 1)`},
		{"operator: on\n", `operator: must be true or false (got the string "on")`},
		{"operator: \"true\"\n", `operator: must be true or false (got the string "true")`},
		{"operator: True\n", "operator: must be true or false (got the boolean True)"},
		{"operator: 1\n", "operator: must be true or false (got the number 1)"},
		{"node: yes\n", `node: "yes" is not one of "" (none), read, write`},
		{"node: true\n", "node: must be a string (got the boolean true; quote it if it is one)"},
		{"node: &b read\n", "node: anchors (&b) are not allowed"},
		{"namespaces:\n  - &r {name: a, capabilities: [read]}\n  - *r\n", "namespaces[1]: aliases (*r) are not allowed"},
		{"<<: {node: write}\n", `<<: is not a field name (got "<<" (!!merge))`},
		{"NODE: write\noperator: yes\n", "operator: must be true or false"}, // every error, not the first only
	} {
		_, err := ParsePolicyYAML("p", []byte(tc.file))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParsePolicyYAML(%q) = %v; want %q", tc.file, err, tc.want)
		}
	}
	for file, want := range map[string]*apiaryv1.ACLPolicy{
		"operator: true\n":                   {Name: "p", Operator: true},
		"operator: false\nnode: \"write\"\n": {Name: "p", Node: "write"},
		"node:\ndescription:\nnamespaces:\n": {Name: "p"},
		"---\nnode: 'read'\n...\n":           {Name: "p", Node: "read"},
		"namespaces:\n  - {name: \"*\", capabilities: [\"read\"]}\n": {Name: "p",
			Namespaces: []*apiaryv1.ACLNamespaceRule{rule("*", "read")}},
	} {
		got, err := ParsePolicyYAML("p", []byte(file))
		if err != nil || !proto.Equal(got, want) {
			t.Errorf("ParsePolicyYAML(%q) = %v, %v; want %v", file, got, err, want)
		}
	}
}

func TestDecisions(t *testing.T) {
	pols := []*apiaryv1.ACLPolicy{
		{Name: "a-rw", Namespaces: []*apiaryv1.ACLNamespaceRule{rule("a", "submit", "read")}, Node: "read"},
		{Name: "all-read", Namespaces: []*apiaryv1.ACLNamespaceRule{rule("*", "read")}},
		{Name: "b-cancel", Namespaces: []*apiaryv1.ACLNamespaceRule{rule("b", "cancel")}, Node: "write", Operator: true},
		{Name: "default-submit", Namespaces: []*apiaryv1.ACLNamespaceRule{rule("default", "submit")}},
	}
	client := func(names ...string) *ACL {
		return Compile(&apiaryv1.ACLToken{AccessorId: "acc", SecretId: "sec", Type: TypeClient, Policies: names}, pols)
	}
	type q struct {
		ns, cap string
		want    bool
	}
	for _, tc := range []struct {
		name     string
		a        *ACL
		ns       []q
		nodeR    bool
		nodeW    bool
		operator bool
		readable []string
		all      bool
	}{
		{"nil", nil, []q{{"a", CapRead, false}}, false, false, false, nil, false},
		{"management", Compile(&apiaryv1.ACLToken{Type: TypeManagement}, nil), []q{{"a", CapRead, true}, {"zz", CapCancel, true}},
			true, true, true, nil, true},
		{"agent", Compile(&apiaryv1.ACLToken{Type: TypeAgent, Policies: []string{"a-rw"}}, pols), []q{{"a", CapRead, false}},
			false, false, false, nil, false},
		{"client without policies", client(), []q{{"a", CapRead, false}, {"default", CapSubmit, false}}, false, false, false, nil, false},
		{"a-rw", client("a-rw"), []q{{"a", CapSubmit, true}, {"a", CapRead, true}, {"a", CapCancel, false}, {"b", CapRead, false}, {"a", "bogus", false}},
			true, false, false, []string{"a"}, false},
		{"a-rw + b-cancel", client("a-rw", "b-cancel"), []q{{"a", CapRead, true}, {"b", CapCancel, true}, {"b", CapRead, false}},
			true, true, true, []string{"a"}, false},
		{"wildcard read", client("all-read", "b-cancel"), []q{{"zz", CapRead, true}, {"zz", CapSubmit, false}, {"b", CapCancel, true}, {"b", CapRead, true}},
			true, true, true, nil, true},
		{"empty namespace is default", client("default-submit"), []q{{"", CapSubmit, true}, {"default", CapSubmit, true}, {"", CapRead, false}},
			false, false, false, nil, false},
		{"unknown policy name grants nothing", client("missing"), []q{{"a", CapRead, false}}, false, false, false, nil, false},
	} {
		for _, x := range tc.ns {
			if got := tc.a.AllowNamespace(x.ns, x.cap); got != x.want {
				t.Errorf("%s: AllowNamespace(%q, %q) = %v", tc.name, x.ns, x.cap, got)
			}
		}
		if tc.a.AllowNode(false) != tc.nodeR || tc.a.AllowNode(true) != tc.nodeW || tc.a.AllowOperator() != tc.operator {
			t.Errorf("%s: node read %v write %v operator %v", tc.name, tc.a.AllowNode(false), tc.a.AllowNode(true), tc.a.AllowOperator())
		}
		names, all := tc.a.ReadableNamespaces()
		if all != tc.all || !slices.Equal(names, tc.readable) {
			t.Errorf("%s: ReadableNamespaces = %v, %v", tc.name, names, all)
		}
	}
	a := client("a-rw")
	if a.Token().GetSecretId() != "" || a.AccessorID() != "acc" {
		t.Errorf("the compiled ACL keeps the secret or loses the accessor: %v", a.Token())
	}
	now := time.Now()
	exp := Compile(&apiaryv1.ACLToken{Type: TypeClient, ExpirationTimeMs: now.UnixMilli()}, nil)
	if !exp.Expired(now) || exp.Expired(now.Add(-time.Second)) || a.Expired(now.Add(100*365*24*time.Hour)) {
		t.Error("Expired")
	}
	ctx := NewContext(context.Background(), a)
	if got, ok := FromContext(ctx); !ok || got != a {
		t.Error("FromContext")
	}
	if _, ok := FromContext(context.Background()); ok {
		t.Error("FromContext of a bare context")
	}
}

// TestGrantsAreTheUnionOfPolicies: for random policies and client tokens,
// a capability on a namespace is granted exactly when one of the token's
// own policies grants it on that namespace or on "*"; node and operator
// grants are the maximum over the token's policies; with no policy of its
// own a token may do nothing; management may do everything.
func TestGrantsAreTheUnionOfPolicies(t *testing.T) {
	nsNames := []string{"a", "b", "default", Wildcard}
	probe := []string{"a", "b", "default", "c", ""}
	rapid.Check(t, func(rt *rapid.T) {
		var pols []*apiaryv1.ACLPolicy
		for i := range rapid.IntRange(0, 5).Draw(rt, "npol") {
			p := &apiaryv1.ACLPolicy{Name: string(rune('p' + i)), Node: rapid.SampledFrom([]string{"", "read", "write"}).Draw(rt, "node"),
				Operator: rapid.Bool().Draw(rt, "op")}
			for _, n := range rapid.SliceOfDistinct(rapid.SampledFrom(nsNames), func(s string) string { return s }).Draw(rt, "ns") {
				caps := rapid.SliceOfNDistinct(rapid.SampledFrom(Capabilities), 1, 3, func(s string) string { return s }).Draw(rt, "caps")
				p.Namespaces = append(p.Namespaces, rule(n, caps...))
			}
			if err := ValidatePolicy(p); err != nil {
				rt.Fatalf("generated an invalid policy: %v", err)
			}
			pols = append(pols, p)
		}
		var own []string
		for _, p := range pols {
			if rapid.Bool().Draw(rt, "own") {
				own = append(own, p.GetName())
			}
		}
		a := Compile(&apiaryv1.ACLToken{Type: TypeClient, Policies: own}, pols)
		mine := func(p *apiaryv1.ACLPolicy) bool { return slices.Contains(own, p.GetName()) }
		for _, ns := range probe {
			for _, c := range Capabilities {
				want := false
				for _, p := range pols {
					for _, r := range p.GetNamespaces() {
						if mine(p) && (r.GetName() == OrDefault(ns) || r.GetName() == Wildcard) && slices.Contains(r.GetCapabilities(), c) {
							want = true
						}
					}
				}
				if got := a.AllowNamespace(ns, c); got != want {
					rt.Fatalf("AllowNamespace(%q, %q) = %v, want %v (own %v)", ns, c, got, want, own)
				}
				if len(own) == 0 && a.AllowNamespace(ns, c) {
					rt.Fatalf("a token without policies may %s in %q", c, ns)
				}
				if !Compile(&apiaryv1.ACLToken{Type: TypeManagement}, nil).AllowNamespace(ns, c) {
					rt.Fatalf("management may not %s in %q", c, ns)
				}
			}
		}
		wantR, wantW, wantOp := false, false, false
		for _, p := range pols {
			if mine(p) {
				wantR = wantR || p.GetNode() != ""
				wantW = wantW || p.GetNode() == "write"
				wantOp = wantOp || p.GetOperator()
			}
		}
		if a.AllowNode(false) != wantR || a.AllowNode(true) != wantW || a.AllowOperator() != wantOp || a.IsManagement() {
			rt.Fatalf("node read %v/%v write %v/%v operator %v/%v", a.AllowNode(false), wantR, a.AllowNode(true), wantW, a.AllowOperator(), wantOp)
		}
		names, all := a.ReadableNamespaces()
		for _, ns := range probe[:4] {
			if a.AllowNamespace(ns, CapRead) != (all || slices.Contains(names, ns)) {
				rt.Fatalf("ReadableNamespaces %v (all %v) disagrees with AllowNamespace(%q, read)", names, all, ns)
			}
		}
	})
}
