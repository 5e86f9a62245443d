package federation

import (
	"fmt"
	"io"
	"maps"
	"strings"
	"testing"

	"github.com/hashicorp/serf/serf"

	"apiary.dev/apiary/internal/priority"
	"apiary.dev/apiary/internal/testutil"
)

// worstTags are the largest tags a fleet-sized coordinator publishes apart
// from its labels: the longest region name, id and jurisdiction (63), an
// IPv6 API address, capacity sums of 12 digits (a million 256-core nodes in
// millicores is 2.56e11), backlogs of 8 digits and the largest shard count
// (shards.MaxCount, 65536: this package may not import shards).
func worstTags(labels map[string]string) CoordinatorTags {
	big := int64(999_999_999_999)
	var bl []Backlog
	for _, c := range priority.Classes {
		bl = append(bl, Backlog{Class: c, Pending: 99_999_999, Bound: 99_999_999})
	}
	return CoordinatorTags{Region: strings.Repeat("r", 63), ID: strings.Repeat("i", 63), Jurisdiction: strings.Repeat("j", 63),
		Labels: labels, APIAddr: "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535", Health: HealthEtcdDown,
		Capacity: Capacity{Free: Res{big, big, big}, Largest: Res{big, big, big}, NodesReady: 9_999_999},
		Backlog:  bl, UpdatedMs: 9_999_999_999_999, Policy: "0a1b2c3d", ShardsOwned: 65536}
}

// TestTagBudgetHoldsInRealSerf: the largest tags Encode accepts are accepted
// by a real serf member (whose limit is the encoded size, 512 bytes), and one
// more label byte is refused by Encode with a message naming the labels.
func TestTagBudgetHoldsInRealSerf(t *testing.T) {
	labels := map[string]string{"k": ""}
	var last map[string]string
	for {
		m, err := worstTags(labels).Encode()
		if err != nil {
			if !strings.Contains(err.Error(), "shorten the region labels") {
				t.Fatalf("Encode refused with %v; want a message naming the labels", err)
			}
			break
		}
		last = m
		labels["k"] += "v"
	}
	if last == nil {
		t.Fatal("even the worst tags without labels exceed the budget: nothing is left for labels")
	}
	t.Logf("room for labels with the widest summary: %d bytes (%q)", len(last[TagLabels]), last[TagLabels][:min(20, len(last[TagLabels]))])
	conf, err := NewSerfConfig(MemberConfig{Name: "budget", Bind: testutil.FreeAddr(t), Tags: last})
	if err != nil {
		t.Fatal(err)
	}
	conf.LogOutput, conf.MemberlistConfig.LogOutput = io.Discard, io.Discard
	s, err := serf.Create(conf)
	if err != nil {
		t.Fatalf("real serf refused tags Encode accepted (%d bytes by TagBytes): %v", TagBytes(last), err)
	}
	defer s.Shutdown()
	// And SetTags on a live member (what the coordinator does each refresh).
	if err := s.SetTags(last); err != nil {
		t.Fatalf("SetTags: %v", err)
	}
	// One more label byte, which Encode refused, is refused by serf too:
	// the budget is exact, not a guess with room to spare.
	over := maps.Clone(last)
	over[TagLabels] += "v"
	if err := s.SetTags(over); err == nil {
		t.Fatalf("real serf accepted tags of %d bytes by TagBytes, which Encode refused", TagBytes(over))
	}
}

// TestTagBytesIsSerfsSize: around the 512-byte limit, a real serf member
// accepts exactly the tag maps TagBytes puts at or under it, as a value
// grows one byte at a time, across the string header's step from 1 to 3
// bytes (at 32 bytes, placed at the limit) and with 16 or more tags (the
// map header's step).
func TestTagBytesIsSerfsSize(t *testing.T) {
	s := member(t, "size", testutil.FreeAddr(t))
	defer s.Shutdown()
	many := map[string]string{}
	for i := range 20 {
		many[fmt.Sprintf("k%02d", i)] = "v"
	}
	// A filler that puts the padded value's 31st byte at 511 or 512 bytes
	// in all, so its 32nd (a 3-byte header) crosses the limit or lands on it.
	step := func(total int) map[string]string {
		m := map[string]string{"fill": strings.Repeat("f", 100), "pad": strings.Repeat("p", 31)}
		m["fill"] = strings.Repeat("f", 100+total-TagBytes(m)) // past 31 bytes, one more byte is one more
		return m
	}
	for name, base := range map[string]map[string]string{"20 tags": many, "31-byte step crosses": step(511), "31-byte step lands": step(509)} {
		m := maps.Clone(base)
		if _, ok := m["pad"]; !ok {
			m["pad"] = ""
		}
		checked := 0
		for n := TagBytes(m); n <= MaxTagBytes+3; n = TagBytes(m) {
			if n >= MaxTagBytes-3 {
				err := s.SetTags(m)
				if (err == nil) != (n <= MaxTagBytes) {
					t.Errorf("%s, pad %d bytes: TagBytes %d, real serf: %v", name, len(m["pad"]), n, err)
				}
				checked++
			}
			m["pad"] += "p"
		}
		if checked < 2 {
			t.Errorf("%s: only %d sizes checked near the limit", name, checked)
		}
	}
}

func TestTagsRoundTrip(t *testing.T) {
	in := CoordinatorTags{Region: "eu-west", ID: "c1", Jurisdiction: "eu", Labels: map[string]string{"tier": "standard", "zone": "a"},
		APIAddr: "127.0.0.1:7071", Health: HealthOK,
		Capacity: Capacity{Free: Res{1000, 2048, 1}, Largest: Res{4000, 8192, 2}, NodesReady: 3},
		Backlog:  []Backlog{{priority.Batch, 5, 0}, {priority.Standard, 7, 50}, {priority.Urgent, 0, 10}}, UpdatedMs: 12345, Policy: "0a1b2c3d",
		ShardsOwned: 86}
	m, err := in.Encode()
	if err != nil {
		t.Fatal(err)
	}
	out, ok := DecodeCoordinatorTags(m)
	if !ok || fmt.Sprint(out) != fmt.Sprint(in) || m[TagShards] != "86" {
		t.Fatalf("round trip:\n in %+v\nout %+v\ntags %v", in, out, m)
	}
	if _, ok := DecodeCoordinatorTags(map[string]string{TagRole: RoleGlobal}); ok {
		t.Fatal("a router member decoded as a coordinator")
	}
	if _, err := (CoordinatorTags{Labels: map[string]string{"a,b": "c"}}).Encode(); err == nil || !strings.HasPrefix(err.Error(), "label:") {
		t.Fatalf("label with ',': %v", err)
	}
}

// TestTagsShardsOwned: a coordinator that owns no shard publishes 0; one
// that publishes no count (ShardsOwned -1, or an older coordinator without
// the tag) decodes as -1, and so does a tag that is not a count.
func TestTagsShardsOwned(t *testing.T) {
	base := CoordinatorTags{Region: "eu-west", ID: "c1", APIAddr: "127.0.0.1:7071", Health: HealthOK}
	for _, tc := range []struct {
		name   string
		owned  int
		edit   func(map[string]string)
		tag    string // the published tag; "" for absent
		decode int
	}{
		{"none owned", 0, nil, "0", 0},
		{"all of 65536", 65536, nil, "65536", 65536},
		{"not published", -1, nil, "", -1},
		{"older coordinator", 86, func(m map[string]string) { delete(m, TagShards) }, "", -1},
		{"not a count", 86, func(m map[string]string) { m[TagShards] = "x" }, "x", -1},
		{"negative", 86, func(m map[string]string) { m[TagShards] = "-3" }, "-3", -1},
	} {
		in := base
		in.ShardsOwned = tc.owned
		m, err := in.Encode()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if tc.edit != nil {
			tc.edit(m)
		}
		if got, ok := m[TagShards]; got != tc.tag || ok != (tc.tag != "") {
			t.Errorf("%s: tag %q (present %v), want %q", tc.name, got, ok, tc.tag)
		}
		out, ok := DecodeCoordinatorTags(m)
		if !ok || out.ShardsOwned != tc.decode {
			t.Errorf("%s: decoded ShardsOwned %d (ok %v), want %d", tc.name, out.ShardsOwned, ok, tc.decode)
		}
	}
}
