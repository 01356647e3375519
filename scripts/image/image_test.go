package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestImageIsReproducibleAndReadsBack builds the image twice from stand-in binaries: the index digest
// and the tarball's bytes are the same, and the image read back has the entrypoint, a non-root user,
// both platforms, the labels and the files.
func TestImageIsReproducibleAndReadsBack(t *testing.T) {
	dist := t.TempDir()
	s := Spec{Dist: dist, Version: "v1.2.3", Commit: "0123456789abcdef0123456789abcdef01234567", Date: "2026-12-03T10:00:00Z",
		Platforms: []string{"amd64", "arm64"}, CAFile: filepath.Join(dist, "ca.pem")}
	if err := os.WriteFile(s.CAFile, []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, arch := range s.Platforms {
		dir := filepath.Join(dist, "outbox-cdc_v1.2.3_linux_"+arch)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "outbox-cdc"), []byte("binary for "+arch), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	first, err := Build(s, filepath.Join(dist, "a"))
	if err != nil {
		t.Fatal(err)
	}
	second, err := Build(s, filepath.Join(dist, "b"))
	if err != nil {
		t.Fatal(err)
	}
	if first != second {
		t.Errorf("two builds of one commit: index %s and %s", first, second)
	}
	a, err := os.ReadFile(filepath.Join(dist, "a.tar"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dist, "b.tar"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Error("two builds of one commit gave different tarballs")
	}
	report, err := Verify(filepath.Join(dist, "a"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"linux/amd64", "linux/arm64", "user 65532:65532", "version v1.2.3", "entrypoint [/outbox-cdc]"} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
}
