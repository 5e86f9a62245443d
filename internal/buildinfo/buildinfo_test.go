package buildinfo

import (
	"runtime"
	"strings"
	"testing"
)

func TestGetStampedAndDefaults(t *testing.T) {
	in := Get()
	if in.Version != "dev" || in.GoVersion != runtime.Version() || in.Platform != runtime.GOOS+"/"+runtime.GOARCH {
		t.Errorf("unstamped Get() = %+v; want version dev, this Go and platform", in)
	}
	version, commit = "v1.2.3", "0123456789abcdef0123"
	defer func() { version, commit = "", "" }()
	in = Get()
	if in.Version != "v1.2.3" || in.Commit != "0123456789abcdef0123" || in.Modified {
		t.Errorf("stamped Get() = %+v; want the linker's values", in)
	}
	if s := in.String(); !strings.HasPrefix(s, "apiary v1.2.3 (commit 0123456789ab, go") {
		t.Errorf("String() = %q", s)
	}
}
