package regional

import (
	"strings"
	"testing"
)

func TestParseBacklogBounds(t *testing.T) {
	b, err := ParseBacklogBounds("50")
	if err != nil || b["batch"] != 50 || b["standard"] != 50 || b["urgent"] != 50 {
		t.Fatalf("50: %v %v", b, err)
	}
	b, err = ParseBacklogBounds("batch=10, urgent=0")
	if err != nil || b["batch"] != 10 || b["urgent"] != 0 || !b.any() {
		t.Fatalf("classes: %v %v", b, err)
	}
	if b, _ := ParseBacklogBounds(""); b.any() {
		t.Fatal("empty must be unbounded")
	}
	for in, want := range map[string]string{"-1": "must be >= 0", "gold=3": `class "gold"`, "batch=x": "must be N or class=N"} {
		if _, err := ParseBacklogBounds(in); err == nil || !strings.Contains(err.Error(), want) || !strings.HasPrefix(err.Error(), "max-pending") {
			t.Errorf("%q: %v, want %q", in, err, want)
		}
	}
}
