package sovereignty

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// RuleNoPolicy names the decision made without a policy file: a job whose
// data has a jurisdiction runs only in that jurisdiction; a job without one
// runs anywhere.
const RuleNoPolicy = "no-policy"

// Resolve is the one answer to "where may this job run", used by the router
// (which regions it may be sent to), by the region's admission (may this
// region accept it) and, through the set stored with the job at admission, by
// the placement filter (which nodes may run its tasks). jurisdiction and
// dataClass are the job's (either may be empty; callers normalise case first,
// see internal/jobspec.Prepare).
//
// p may be nil: then the RuleNoPolicy decision applies.
func Resolve(p *Policy, jurisdiction, dataClass string) Decision {
	if p != nil {
		return p.Decide(jurisdiction, dataClass)
	}
	if jurisdiction == "" {
		return Decision{Rule: RuleNoPolicy, Any: true}
	}
	return Decision{Rule: RuleNoPolicy, Allowed: []string{jurisdiction}}
}

// Jurisdictions is the set the placement filter enforces: nil when the job
// may run in any jurisdiction, else the allowed jurisdictions (possibly
// empty: nowhere).
func (d Decision) Jurisdictions() []string {
	if d.Any {
		return nil
	}
	return append([]string{}, d.Allowed...)
}

// CheckValues refuses a job's jurisdiction or data class that the policy does
// not declare, so a typo (`EU` for `eu`, `persnal`) is an error at submission
// instead of a job that matches no rule and runs under default.allow, or
// waits forever. Both values are compared as given (the job spec normalises
// them to lower case before this). An empty value is always accepted. A
// policy that lists no data_classes accepts any data class.
//
// Errors: `jurisdiction: "xx" is not a jurisdiction of the sovereignty policy
// (known: ch, eu, us)` and the same for `data_class`.
func (p *Policy) CheckValues(jurisdiction, dataClass string) error {
	var msgs []string
	if jurisdiction != "" && !hasKey(p.Jurisdictions, jurisdiction) {
		msgs = append(msgs, fmt.Sprintf("jurisdiction: %q is not a jurisdiction of the sovereignty policy (known: %s)",
			jurisdiction, strings.Join(sortedKeys(p.Jurisdictions), ", ")))
	}
	if dataClass != "" && len(p.DataClasses) > 0 && !slices.Contains(p.DataClasses, dataClass) {
		known := slices.Clone(p.DataClasses)
		slices.Sort(known)
		msgs = append(msgs, fmt.Sprintf("data_class: %q is not a data class of the sovereignty policy (known: %s)",
			dataClass, strings.Join(known, ", ")))
	}
	if len(msgs) == 0 {
		return nil
	}
	return fmt.Errorf("%s", strings.Join(msgs, "; "))
}

// Refusal describes why a region of jurisdiction regionJurisdiction may not
// run a job under d, for the region's own refusal:
// `jurisdiction: job data (jurisdiction "eu", data_class "") may not run in
// region us-east (jurisdiction "us"): policy rule "eu-data-in-eu" allows only
// jurisdictions [eu]`.
func (d Decision) Refusal(jurisdiction, dataClass, regionName, regionJurisdiction string) error {
	return fmt.Errorf("jurisdiction: job data (jurisdiction %q, data_class %q) may not run in region %s (jurisdiction %q): %s",
		jurisdiction, dataClass, regionName, regionJurisdiction, d)
}

// Fingerprint names the policy's content in 8 hex digits (the start of the
// SHA-256 of its canonical JSON), for the WAN tags: a router refuses to
// route to a region whose policy differs from its own, since the region's
// re-check and its placement filter apply the region's policy. A nil policy
// (none loaded) has the fingerprint "".
func (p *Policy) Fingerprint() string {
	if p == nil {
		return ""
	}
	b, err := json.Marshal(p) // struct fields in order, map keys sorted
	if err != nil {
		return "invalid"
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:4])
}
