package federation

import (
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/hashicorp/serf/serf"

	"apiary.dev/apiary/internal/priority"
	"apiary.dev/apiary/internal/testutil"
)

// worstTags are the largest tags a fleet-sized coordinator publishes apart
// from its labels: the longest region name, id and jurisdiction (63), an
// IPv6 API address, capacity sums of 12 digits (a million 256-core nodes in
// millicores is 2.56e11) and backlogs of 8 digits.
func worstTags(labels map[string]string) CoordinatorTags {
	big := int64(999_999_999_999)
	var bl []Backlog
	for _, c := range priority.Classes {
		bl = append(bl, Backlog{Class: c, Pending: 99_999_999, Bound: 99_999_999})
	}
	return CoordinatorTags{Region: strings.Repeat("r", 63), ID: strings.Repeat("i", 63), Jurisdiction: strings.Repeat("j", 63),
		Labels: labels, APIAddr: "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535", Health: HealthEtcdDown,
		Capacity: Capacity{Free: Res{big, big, big}, Largest: Res{big, big, big}, NodesReady: 9_999_999},
		Backlog:  bl, UpdatedMs: 9_999_999_999_999, Policy: "0a1b2c3d"}
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
}

func TestTagsRoundTrip(t *testing.T) {
	in := CoordinatorTags{Region: "eu-west", ID: "c1", Jurisdiction: "eu", Labels: map[string]string{"tier": "standard", "zone": "a"},
		APIAddr: "127.0.0.1:7071", Health: HealthOK,
		Capacity: Capacity{Free: Res{1000, 2048, 1}, Largest: Res{4000, 8192, 2}, NodesReady: 3},
		Backlog:  []Backlog{{priority.Batch, 5, 0}, {priority.Standard, 7, 50}, {priority.Urgent, 0, 10}}, UpdatedMs: 12345, Policy: "0a1b2c3d"}
	m, err := in.Encode()
	if err != nil {
		t.Fatal(err)
	}
	out, ok := DecodeCoordinatorTags(m)
	if !ok || fmt.Sprint(out) != fmt.Sprint(in) {
		t.Fatalf("round trip:\n in %+v\nout %+v", in, out)
	}
	if _, ok := DecodeCoordinatorTags(map[string]string{TagRole: RoleGlobal}); ok {
		t.Fatal("a router member decoded as a coordinator")
	}
	if _, err := (CoordinatorTags{Labels: map[string]string{"a,b": "c"}}).Encode(); err == nil || !strings.HasPrefix(err.Error(), "label:") {
		t.Fatalf("label with ',': %v", err)
	}
}
