//go:build release

package scripts

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// TestReleaseIsReproducible runs scripts/release.sh twice for linux/amd64, the second time with an
// empty build cache (nothing reused from the first): the archives, the SBOM and the image are the
// same bytes, and the binary says which build it is. About 3 minutes: behind the build tag release,
// run by `make test-release` (before a release), not by `make test`.
func TestReleaseIsReproducible(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the release twice; skipped under -short")
	}
	root := testenv.RepoRoot(t)
	tmp := t.TempDir()
	build := func(dist string, env ...string) []byte {
		t.Helper()
		cmd := exec.Command("bash", filepath.Join(root, "scripts", "release.sh"))
		cmd.Dir = root
		cmd.Env = append(os.Environ(), append([]string{"DIST=" + dist, "PLATFORMS=linux/amd64", "ALLOW_DIRTY=1"}, env...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("release.sh: %v\n%s", err, out)
		}
		sums, err := os.ReadFile(filepath.Join(dist, "SHA256SUMS"))
		if err != nil {
			t.Fatal(err)
		}
		return sums
	}
	a := build(filepath.Join(tmp, "a"))
	b := build(filepath.Join(tmp, "b"), "GOCACHE="+filepath.Join(tmp, "cache"))
	if !bytes.Equal(a, b) {
		t.Fatalf("two builds of one commit differ:\n%s\n---\n%s", a, b)
	}
	for _, want := range []string{"_linux_amd64.tar.gz", "_linux_amd64.cdx.json", "_image.tar"} {
		if !strings.Contains(string(a), want) {
			t.Errorf("SHA256SUMS lacks a %s:\n%s", want, a)
		}
	}
	bins, _ := filepath.Glob(filepath.Join(tmp, "a", "outbox-cdc_*_linux_amd64", "outbox-cdc"))
	if len(bins) != 1 {
		t.Fatalf("binaries %v", bins)
	}
	out, err := exec.Command(bins[0], "version").CombinedOutput()
	commit, _ := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
	if err != nil || !strings.Contains(string(out), "commit    "+strings.TrimSpace(string(commit))) || strings.Contains(string(out), "version   dev") {
		t.Fatalf("the released binary's version: %v\n%s", err, out)
	}
	t.Logf("%s", a)
}
