package buildinfo

import (
	"runtime"
	"strings"
	"testing"
)

// TestReadFillsEveryField: a test binary has no link flags and no module version, so every field
// falls back to what Go recorded or to a placeholder; none is empty.
func TestReadFillsEveryField(t *testing.T) {
	i := Read()
	for name, v := range map[string]string{"version": i.Version, "commit": i.Commit, "date": i.Date, "go": i.GoVersion, "platform": i.Platform} {
		if v == "" {
			t.Errorf("%s is empty", name)
		}
	}
	if i.GoVersion != runtime.Version() {
		t.Errorf("go version %q, want %q", i.GoVersion, runtime.Version())
	}
}

// TestLinkFlagsWin: a release's link flags name the version, commit and date.
func TestLinkFlagsWin(t *testing.T) {
	version, commit, date = "v1.2.3", "0123456789abcdef0123456789abcdef01234567", "2026-12-03T10:00:00Z"
	defer func() { version, commit, date = "", "", "" }()
	i := Read()
	if i.Version != "v1.2.3" || i.Commit != commit || i.Date != date {
		t.Fatalf("read %+v, want the link flags' values", i)
	}
	if s := i.String(); !strings.Contains(s, "v1.2.3") || !strings.Contains(s, "0123456789ab") || strings.Contains(s, "0123456789abc") {
		t.Errorf("String %q: want the version and a 12-character commit", s)
	}
	if l := i.Lines(); !strings.Contains(l, "commit    "+commit) || !strings.Contains(l, "go        "+runtime.Version()) {
		t.Errorf("Lines:\n%s", l)
	}
}
