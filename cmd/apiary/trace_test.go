package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"apiary.dev/apiary/internal/telemetry"
)

var updateGolden = flag.Bool("update", false, "rewrite golden files")

// TestTraceGolden renders a recorded span file (spans out of order, another
// job's span, a torn last line) and compares it with the golden timeline.
func TestTraceGolden(t *testing.T) {
	spans, err := telemetry.ReadSpanFile(filepath.Join("testdata", "trace", "spans.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		golden string
		color  bool
	}{{"timeline.golden", false}, {"timeline-color.golden", true}} {
		var buf bytes.Buffer
		n, err := renderTrace(&buf, spans, "eu-west-0c2f9a1b7d3e5f6a8b9c", tc.color)
		if err != nil {
			t.Fatal(err)
		}
		if n != 12 {
			t.Errorf("%d spans drawn, want 12", n)
		}
		path := filepath.Join("testdata", "trace", tc.golden)
		if *updateGolden {
			if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if buf.String() != string(want) {
			t.Errorf("%s differs (go test -run TestTraceGolden -update to accept):\n%s", tc.golden, buf.String())
		}
		if tc.color != strings.Contains(buf.String(), ansiRed) {
			t.Errorf("color %v but red present %v", tc.color, !tc.color)
		}
	}
	if n, _ := renderTrace(&bytes.Buffer{}, spans, "eu-west-unknown", false); n != 0 {
		t.Errorf("unknown job drew %d spans", n)
	}
}
