// Package buildinfo says which build of apiary is running: the version and
// commit stamped at link time (make build and make image set them with
// -ldflags -X), else what the Go toolchain recorded from the VCS.
//
// It owns nothing else and imports nothing of Apiary's.
package buildinfo

import (
	"runtime"
	"runtime/debug"
)

// Set by the linker: -X apiary.dev/apiary/internal/buildinfo.version=v0.3.0-12-gabc1234
// -X apiary.dev/apiary/internal/buildinfo.commit=abc1234... (the Makefile's
// LDFLAGS).
var (
	version = ""
	commit  = ""
)

// Info is a build's identity.
type Info struct {
	// Version: `git describe --tags --always --dirty` at build time, or
	// "dev" when not stamped.
	Version string `json:"version"`
	// Commit: the full commit hash ("" when unknown), with Modified true
	// when the work tree had uncommitted changes.
	Commit    string `json:"commit"`
	Modified  bool   `json:"modified,omitempty"`
	GoVersion string `json:"go_version"`
	// Platform is GOOS/GOARCH.
	Platform string `json:"platform"`
}

// Get returns the running binary's Info.
func Get() Info {
	in := Info{Version: version, Commit: commit, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if in.Commit == "" {
					in.Commit = s.Value
				}
			case "vcs.modified":
				if commit == "" {
					in.Modified = s.Value == "true"
				}
			}
		}
	}
	if in.Version == "" {
		in.Version = "dev"
	}
	return in
}

// String is "apiary VERSION (commit C[, modified], GOVERSION PLATFORM)".
func (i Info) String() string {
	c := i.Commit
	if c == "" {
		c = "unknown"
	} else if len(c) > 12 {
		c = c[:12]
	}
	if i.Modified {
		c += ", modified"
	}
	return "apiary " + i.Version + " (commit " + c + ", " + i.GoVersion + " " + i.Platform + ")"
}
