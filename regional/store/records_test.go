package store

import "testing"

func TestMustJSONDoesNotEscapeHTML(t *testing.T) {
	if got := MustJSON(map[string]string{"out": "<a>&"}); got != `{"out":"<a>&"}` {
		t.Fatalf("MustJSON = %s", got)
	}
}
