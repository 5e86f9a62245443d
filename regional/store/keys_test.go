package store

import (
	"strings"
	"testing"
)

// TestWatchedRangeHoldsPlanKeys: the owner loop's one watch covers
// [PrefJobs, PrefTasks + everything under it); the keys a plan compares and
// writes beside its tasks (node usage, anti-affinity scopes) must sort in
// it, or the loop could see a scope key's new revision without the task
// written with it.
func TestWatchedRangeHoldsPlanKeys(t *testing.T) {
	end := PrefTasks + "\xff"
	for _, k := range []string{KeyNodeUsage("n1"), KeyAntiAffinity("db", "zone", "eu-1a"), KeyAntiAffinity("a", "", ""),
		KeyAntiAffinity("z.9", "topology.kubernetes.io/zone", "x/y z")} {
		if k < PrefJobs || k >= end {
			t.Errorf("%q is outside the watched range [%q, %q)", k, PrefJobs, end)
		}
	}
	k := KeyAntiAffinity("db", "rack/row", "a/b")
	if !IsAntiAffinityKey(k) || strings.Count(strings.TrimPrefix(k, PrefAntiAffinity), "/") != 2 {
		t.Errorf("%q: label and value must be escaped to one path segment each", k)
	}
	if g, ok := AntiAffinityKeyGroup(k); !ok || g != "db" {
		t.Errorf("group of %q: %q, %v", k, g, ok)
	}
	if _, ok := AntiAffinityKeyGroup(KeyNodeUsage("n1")); ok {
		t.Error("a usage key parsed as an anti-affinity key")
	}
	if IsAntiAffinityKey(KeyNodeUsage("n1")) || IsTaskKey(k) || IsJobKey(k) || IsNodeKey(k) {
		t.Error("anti-affinity keys and other kinds overlap")
	}
}
