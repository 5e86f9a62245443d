package sovereignty

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
		t.Fatal("internal/sovereignty/default.go DefaultYAML differs from deploy/policy.yaml; copy the file over")
	}
	if _, err := Parse([]byte(DefaultYAML)); err != nil {
		t.Fatal(err)
	}
}

func TestResolveIsTheOneRule(t *testing.T) {
	p, err := Parse([]byte(DefaultYAML))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		pol           *Policy
		jur, class    string
		any           bool
		jurisdictions []string
		rule          string
	}{
		{p, "ch", "", false, []string{"ch", "eu"}, "ch-data-in-ch-or-eu"},
		{p, "us", "internal", true, nil, "default"},
		{p, "us", "personal", false, []string{"us"}, "us-personal-in-us"},
		{p, "eu", "restricted", false, []string{}, "restricted-nowhere"},
		{nil, "us", "", false, []string{"us"}, RuleNoPolicy},
		{nil, "", "personal", true, nil, RuleNoPolicy},
	}
	for _, c := range cases {
		d := Resolve(c.pol, c.jur, c.class)
		got := d.Jurisdictions()
		if d.Any != c.any || d.Rule != c.rule || strings.Join(got, ",") != strings.Join(c.jurisdictions, ",") || (got == nil) != (c.jurisdictions == nil) {
			t.Errorf("Resolve(%v, %q, %q) = %+v (jurisdictions %#v); want any=%v %v rule %s", c.pol != nil, c.jur, c.class, d, got, c.any, c.jurisdictions, c.rule)
		}
	}
	if s := Resolve(nil, "us", "").String(); !strings.Contains(s, "no sovereignty policy") {
		t.Errorf("no-policy decision reads %q", s)
	}
}

func TestCheckValuesListsKnownValues(t *testing.T) {
	p, err := Parse([]byte(DefaultYAML))
	if err != nil {
		t.Fatal(err)
	}
	for _, ok := range [][2]string{{"", ""}, {"eu", "personal"}, {"ch", ""}, {"", "restricted"}} {
		if err := p.CheckValues(ok[0], ok[1]); err != nil {
			t.Errorf("CheckValues(%q, %q) = %v", ok[0], ok[1], err)
		}
	}
	for _, c := range []struct{ jur, class, want string }{
		{"EU", "", `jurisdiction: "EU" is not a jurisdiction of the sovereignty policy (known: ch, eu, us)`},
		{"eu", "persnal", `data_class: "persnal" is not a data class of the sovereignty policy (known: internal, personal, public, restricted)`},
		{"xx", "yy", `jurisdiction: "xx"`},
	} {
		err := p.CheckValues(c.jur, c.class)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("CheckValues(%q, %q) = %v; want %q", c.jur, c.class, err, c.want)
		}
	}
	open, err := Parse([]byte("version: 1\njurisdictions: {eu: {}}\ndefault: {allow: ['*']}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := open.CheckValues("eu", "anything"); err != nil {
		t.Errorf("a policy without data_classes refused a class: %v", err)
	}
}
