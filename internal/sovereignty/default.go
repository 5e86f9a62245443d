package sovereignty

// DefaultYAML is the policy `apiary dev` uses when --policy is not given; it
// is a copy of deploy/policy.yaml (a test keeps them equal).
const DefaultYAML = `# Apiary sovereignty policy (read by apiary global --policy and
# apiary region --policy; strict YAML, validated at start-up).
#
# Rules are tried in order; the first whose match fits the job decides the
# jurisdictions it may run in. A job no rule matches gets default.allow.
# "*" means any jurisdiction; [] means nowhere (the job is refused).
version: 1
jurisdictions:
  eu: {description: "European Union (GDPR)"}
  us: {description: "United States"}
  ch: {description: "Switzerland"}
data_classes: [public, internal, personal, restricted]
default:
  allow: ["*"]
rules:
  # Restricted data is never scheduled automatically, anywhere.
  - name: restricted-nowhere
    match: {data_class: [restricted]}
    allow: []
  # EU data stays in the EU.
  - name: eu-data-in-eu
    match: {jurisdiction: [eu]}
    allow: [eu]
  # Swiss data may run in Switzerland or the EU (adequacy decision).
  - name: ch-data-in-ch-or-eu
    match: {jurisdiction: [ch]}
    allow: [ch, eu]
  # US personal data stays in the US; other US data may run anywhere.
  - name: us-personal-in-us
    match: {jurisdiction: [us], data_class: [personal]}
    allow: [us]
`
