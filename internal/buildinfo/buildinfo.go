// Package buildinfo says which build of outbox-cdc is running: its version, the commit it was built
// from, when that commit was made, and the Go version — from the link flags a release sets
// (`-X github.com/outbox-cdc/outbox-cdc/internal/buildinfo.version=...`, and commit and date), and
// otherwise from what Go records in every binary (debug.ReadBuildInfo: the module version and the
// version-control settings).
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// Set by the release build's link flags; empty otherwise.
var (
	version string
	commit  string
	date    string
)

// Info is what identifies a build.
type Info struct {
	// Version is the release version (v1.2.3), or Go's pseudo-version of the commit, or "dev".
	Version string `json:"version"`
	// Commit is the full commit hash the binary was built from ("unknown" without version control);
	// Modified is true when the working tree had changes.
	Commit   string `json:"commit"`
	Modified bool   `json:"modified,omitempty"`
	// Date is the commit's time (RFC 3339): a build of one commit is the same whenever it is made.
	Date string `json:"date"`
	// GoVersion is the Go toolchain; Platform is GOOS/GOARCH.
	GoVersion string `json:"go_version"`
	Platform  string `json:"platform"`
}

// Read returns the running binary's build information.
func Read() Info {
	info := Info{Version: version, Commit: commit, Date: date, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if info.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			info.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if info.Commit == "" {
					info.Commit = s.Value
				}
			case "vcs.time":
				if info.Date == "" {
					info.Date = s.Value
				}
			case "vcs.modified":
				info.Modified = s.Value == "true"
			}
		}
	}
	if info.Version == "" {
		info.Version = "dev"
	}
	if info.Commit == "" {
		info.Commit = "unknown"
	}
	if info.Date == "" {
		info.Date = "unknown"
	}
	return info
}

// String is the one line a log or `--version` shows.
func (i Info) String() string {
	commit := i.Commit
	if len(commit) > 12 {
		commit = commit[:12]
	}
	if i.Modified {
		commit += "+modified"
	}
	return fmt.Sprintf("%s (commit %s, %s, %s, %s)", i.Version, commit, i.Date, i.GoVersion, i.Platform)
}

// Lines is the full report of `outbox-cdc version`.
func (i Info) Lines() string {
	var b strings.Builder
	fmt.Fprintf(&b, "version   %s\ncommit    %s", i.Version, i.Commit)
	if i.Modified {
		b.WriteString(" (modified)")
	}
	fmt.Fprintf(&b, "\ndate      %s\ngo        %s\nplatform  %s\n", i.Date, i.GoVersion, i.Platform)
	return b.String()
}
