package regional

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestCapTailKeepsTheEndOnARuneBoundary(t *testing.T) {
	s := strings.Repeat("é", maxTailBytes) // 2 bytes per rune
	got := capTail(s)
	if len(got) > maxTailBytes || !utf8.ValidString(got) || !strings.HasSuffix(s, got) {
		t.Fatalf("capTail: %d bytes, valid %v", len(got), utf8.ValidString(got))
	}
	if capTail("short") != "short" {
		t.Fatal("short tails must be kept whole")
	}
}
