package policy

import (
	"os"
	"strings"
	"testing"
)

func TestDeployPolicyLoads(t *testing.T) {
	p, err := Load("../../deploy/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		jur, class, region string
		want               bool
	}{
		{"eu", "personal", "eu", true},
		{"eu", "personal", "us", false},
		{"eu", "", "us", false},
		{"", "", "us", true},
		{"us", "personal", "eu", false},
		{"us", "public", "eu", true},
		{"ch", "", "eu", true},
		{"eu", "restricted", "eu", false},
		{"", "restricted", "us", false},
	}
	for _, c := range cases {
		if got := p.Decide(c.jur, c.class).Allows(c.region); got != c.want {
			t.Errorf("Decide(%q,%q).Allows(%q) = %v, want %v", c.jur, c.class, c.region, got, c.want)
		}
		err := p.Check(c.jur, c.class, "r", c.region)
		if (err == nil) != c.want {
			t.Errorf("Check(%q,%q,%q) = %v", c.jur, c.class, c.region, err)
		}
	}
	if d := p.Decide("eu", "restricted"); d.Rule != "restricted-nowhere" || !strings.Contains(d.String(), "no jurisdiction") {
		t.Errorf("restricted decision = %+v / %s", d, d)
	}
}

func TestParseErrorsNameFields(t *testing.T) {
	base := "version: 1\njurisdictions: {eu: {}, us: {}}\ndefault: {allow: ['*']}\n"
	cases := map[string]struct{ doc, want string }{
		"empty":            {"", "file is empty"},
		"unknown top":      {base + "regions: []\n", "regions: unknown field"},
		"unknown nested":   {base + "rules: [{name: a, match: {jurisdiction: [eu], zone: x}, allow: [eu]}]\n", "zone: unknown field"},
		"duplicate key":    {base + "version: 1\n", "invalid YAML"},
		"bad version":      {strings.Replace(base, "version: 1", "version: 2", 1), "version: must be 1"},
		"wrong type":       {strings.Replace(base, "version: 1", "version: one", 1), "version: must be an integer"},
		"no default":       {"version: 1\njurisdictions: {eu: {}}\n", "default.allow: is required"},
		"undeclared":       {base + "rules: [{name: a, match: {jurisdiction: [eu]}, allow: [xx]}]\n", `rules[0].allow[0]: jurisdiction "xx" is not declared`},
		"undeclared match": {base + "rules: [{name: a, match: {jurisdiction: [cn]}, allow: [eu]}]\n", `rules[0].match.jurisdiction[0]: jurisdiction "cn" is not declared`},
		"dup rule":         {base + "rules: [{name: a, match: {jurisdiction: [eu]}, allow: [eu]}, {name: a, match: {jurisdiction: [us]}, allow: [us]}]\n", `rules[1].name: "a" is already used by rules[0]`},
		"empty match":      {base + "rules: [{name: a, match: {}, allow: [eu]}]\n", "rules[0].match: must name"},
		"star mixed":       {strings.Replace(base, "['*']", "['*', eu]", 1), `default.allow[0]: "*" must be the only entry`},
		"class undeclared": {base + "data_classes: [public]\nrules: [{name: a, match: {data_class: [secret]}, allow: []}]\n", `rules[0].match.data_class[0]: data class "secret" is not listed`},
		"missing allow":    {base + "rules: [{name: a, match: {data_class: [x]}}]\n", "rules[0].allow: is required"},
		"not a mapping":    {"- a\n- b\n", "must be a mapping"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(c.doc))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Parse error = %v, want it to contain %q", err, c.want)
			}
		})
	}
}

func TestFirstRuleWinsAndEmptyAllowIsNowhere(t *testing.T) {
	p, err := Parse([]byte(`
version: 1
jurisdictions: {eu: {}, us: {}}
default: {allow: [us]}
rules:
  - {name: first, match: {jurisdiction: [eu]}, allow: [eu]}
  - {name: second, match: {jurisdiction: [eu]}, allow: [us]}
  - {name: never, match: {data_class: [secret]}, allow: []}
`))
	if err != nil {
		t.Fatal(err)
	}
	if d := p.Decide("eu", ""); d.Rule != "first" || !d.Allows("eu") || d.Allows("us") {
		t.Errorf("eu: %+v", d)
	}
	if d := p.Decide("", "secret"); d.Allows("eu") || d.Allows("us") {
		t.Errorf("secret: %+v", d)
	}
	if d := p.Decide("", ""); d.Rule != "default" || !d.Allows("us") || d.Allows("eu") {
		t.Errorf("default: %+v", d)
	}
}

func TestDefaultYAMLIsDeployPolicy(t *testing.T) {
	b, err := os.ReadFile("../../deploy/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(b)) != strings.TrimSpace(DefaultYAML) {
		t.Fatal("global/policy/default.go DefaultYAML differs from deploy/policy.yaml; copy the file over")
	}
	if _, err := Parse([]byte(DefaultYAML)); err != nil {
		t.Fatal(err)
	}
}
