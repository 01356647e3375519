// Command image builds outbox-cdc's container image without a Docker engine, with
// go-containerregistry: for each Linux platform, the static binary a release built, on an empty base
// with CA certificates and a non-root user, labelled with the version, commit and source; written as an
// OCI image layout (a multi-platform index) and as a reproducible tarball of it. `make release` runs
// it after the binaries; `-verify` reads an image layout back and checks what a user relies on.
//
//	go run ./scripts/image -dist dist -version v1.2.3 -commit <sha> -date 2026-12-03T10:00:00Z
//	go run ./scripts/image -verify dist/image
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Source is the image's org.opencontainers.image.source label.
const Source = "https://github.com/outbox-cdc/outbox-cdc"

// nonroot is the user the image runs as (distroless's "nonroot" uid and gid).
const nonroot = 65532

// Spec says what to put in the image.
type Spec struct {
	// Dist holds the release's binaries: <Dist>/outbox-cdc_<Version>_linux_<arch>/outbox-cdc.
	Dist string
	// Version, Commit and Date (RFC 3339, the commit's time) label the image; Date is also every
	// file's and the image's creation time, so that one commit always gives the same image.
	Version, Commit, Date string
	// Platforms are the Linux architectures (amd64, arm64).
	Platforms []string
	// CAFile is the PEM bundle installed as /etc/ssl/certs/ca-certificates.crt.
	CAFile string
}

func main() {
	var s Spec
	var out, verify, platforms string
	flag.StringVar(&s.Dist, "dist", "dist", "the release's directory")
	flag.StringVar(&s.Version, "version", "", "the release version")
	flag.StringVar(&s.Commit, "commit", "", "the commit")
	flag.StringVar(&s.Date, "date", "", "the commit's date, RFC 3339")
	flag.StringVar(&platforms, "platforms", "amd64,arm64", "Linux architectures")
	flag.StringVar(&s.CAFile, "ca-file", "/etc/ssl/certs/ca-certificates.crt", "CA certificates to install")
	flag.StringVar(&out, "out", "", "image layout directory (default <dist>/image); a tarball of it is written beside")
	flag.StringVar(&verify, "verify", "", "read the image layout at this path back and check it")
	flag.Parse()
	if verify != "" {
		report, err := Verify(verify)
		if err != nil {
			fmt.Fprintln(os.Stderr, "image:", err)
			os.Exit(1)
		}
		fmt.Print(report)
		return
	}
	s.Platforms = strings.Split(platforms, ",")
	if out == "" {
		out = filepath.Join(s.Dist, "image")
	}
	digest, err := Build(s, out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
	fmt.Printf("image: %s (index %s)\n", out, digest)
}

// Build writes the image layout at out, and out+".tar", and returns the index's digest.
func Build(s Spec, out string) (v1.Hash, error) {
	if s.Version == "" || s.Commit == "" || s.Date == "" {
		return v1.Hash{}, errors.New("version, commit and date are required")
	}
	created, err := time.Parse(time.RFC3339, s.Date)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("date: %w", err)
	}
	ca, err := os.ReadFile(s.CAFile)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("CA certificates: %w", err)
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, arch := range s.Platforms {
		bin, err := os.ReadFile(filepath.Join(s.Dist, fmt.Sprintf("outbox-cdc_%s_linux_%s", s.Version, arch), "outbox-cdc"))
		if err != nil {
			return v1.Hash{}, fmt.Errorf("the %s binary: %w", arch, err)
		}
		img, err := image(s, arch, created, bin, ca)
		if err != nil {
			return v1.Hash{}, fmt.Errorf("%s: %w", arch, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
			Platform:    &v1.Platform{OS: "linux", Architecture: arch},
			Annotations: map[string]string{"org.opencontainers.image.ref.name": s.Version},
		}})
	}
	if err := os.RemoveAll(out); err != nil {
		return v1.Hash{}, err
	}
	if _, err := layout.Write(out, idx); err != nil {
		return v1.Hash{}, fmt.Errorf("write the image layout: %w", err)
	}
	if err := tarDir(out, out+".tar", created); err != nil {
		return v1.Hash{}, err
	}
	return idx.Digest()
}

// image is one platform's image: one layer holding the binary, the CA certificates and the user.
func image(s Spec, arch string, created time.Time, bin, ca []byte) (v1.Image, error) {
	files := []file{
		{name: "etc/", mode: 0o755, dir: true},
		{name: "etc/group", mode: 0o644, data: []byte(fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", nonroot))},
		{name: "etc/passwd", mode: 0o644, data: []byte(fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", nonroot, nonroot))},
		{name: "etc/ssl/", mode: 0o755, dir: true},
		{name: "etc/ssl/certs/", mode: 0o755, dir: true},
		{name: "etc/ssl/certs/ca-certificates.crt", mode: 0o644, data: ca},
		{name: "home/", mode: 0o755, dir: true},
		{name: "home/nonroot/", mode: 0o700, dir: true, uid: nonroot},
		{name: "outbox-cdc", mode: 0o755, data: bin},
		{name: "tmp/", mode: 0o1777, dir: true},
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: f.mode, Uid: f.uid, Gid: f.uid, ModTime: created, Format: tar.FormatPAX, Typeflag: tar.TypeReg, Size: int64(len(f.data))}
		if f.dir {
			h.Typeflag, h.Size = tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	layerBytes := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layerBytes)), nil },
		tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.BestCompression))
	if err != nil {
		return nil, err
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{Layer: layer, History: v1.History{Created: v1.Time{Time: created}, CreatedBy: "scripts/image: outbox-cdc " + s.Version}})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Created = "linux", arch, v1.Time{Time: created}
	cf.Config.Entrypoint = []string{"/outbox-cdc"}
	cf.Config.Cmd = []string{"run"}
	cf.Config.User = fmt.Sprintf("%d:%d", nonroot, nonroot)
	cf.Config.WorkingDir = "/home/nonroot"
	cf.Config.Env = []string{"SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"}
	cf.Config.Labels = Labels(s)
	return mutate.ConfigFile(img, cf)
}

// Labels are the image's OCI annotations as labels.
func Labels(s Spec) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       "outbox-cdc",
		"org.opencontainers.image.description": "Streams a PostgreSQL outbox table to Kafka from the WAL",
		"org.opencontainers.image.version":     s.Version,
		"org.opencontainers.image.revision":    s.Commit,
		"org.opencontainers.image.created":     s.Date,
		"org.opencontainers.image.source":      Source,
	}
}

type file struct {
	name string
	mode int64
	dir  bool
	uid  int
	data []byte
}

// tarDir writes the directory dir as a tarball at path, with sorted names, fixed times and owners,
// so that the same directory always makes the same bytes.
func tarDir(dir, path string, mtime time.Time) error {
	var names []string
	if err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			names = append(names, p)
		}
		return nil
	}); err != nil {
		return err
	}
	slices.Sort(names)
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	for _, p := range names {
		info, err := os.Stat(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		h := &tar.Header{Name: filepath.ToSlash(rel), Mode: 0o644, ModTime: mtime, Format: tar.FormatPAX, Typeflag: tar.TypeReg, Size: info.Size()}
		if info.IsDir() {
			h.Name, h.Mode, h.Typeflag, h.Size = h.Name+"/", 0o755, tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !info.IsDir() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if _, err := tw.Write(data); err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Close()
}

// Verify reads the image layout at path back and checks, for every platform, what a user of the
// image relies on: the entrypoint, a non-root user, the platform, the labels, and the files.
func Verify(path string) (string, error) {
	p, err := layout.FromPath(path)
	if err != nil {
		return "", fmt.Errorf("read the image layout: %w", err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		return "", err
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return "", err
	}
	var report strings.Builder
	for _, d := range im.Manifests {
		img, err := idx.Image(d.Digest)
		if err != nil {
			return "", err
		}
		cf, err := img.ConfigFile()
		if err != nil {
			return "", err
		}
		switch {
		case d.Platform == nil || d.Platform.OS != cf.OS || d.Platform.Architecture != cf.Architecture:
			return "", fmt.Errorf("manifest %s: platform %v, config says %s/%s", d.Digest, d.Platform, cf.OS, cf.Architecture)
		case !slices.Equal(cf.Config.Entrypoint, []string{"/outbox-cdc"}):
			return "", fmt.Errorf("%s: entrypoint %v", cf.Architecture, cf.Config.Entrypoint)
		case cf.Config.User == "" || strings.HasPrefix(cf.Config.User, "0") || strings.HasPrefix(cf.Config.User, "root"):
			return "", fmt.Errorf("%s: runs as %q, not a non-root user", cf.Architecture, cf.Config.User)
		case cf.Config.Labels["org.opencontainers.image.version"] == "" || cf.Config.Labels["org.opencontainers.image.source"] != Source ||
			cf.Config.Labels["org.opencontainers.image.revision"] == "":
			return "", fmt.Errorf("%s: labels %v", cf.Architecture, cf.Config.Labels)
		}
		files, err := layerFiles(img)
		if err != nil {
			return "", err
		}
		for _, want := range []string{"outbox-cdc", "etc/ssl/certs/ca-certificates.crt", "etc/passwd"} {
			if files[want] == 0 {
				return "", fmt.Errorf("%s: %s missing or empty", cf.Architecture, want)
			}
		}
		fmt.Fprintf(&report, "%s/%s %s: entrypoint %v, user %s, version %s, revision %s, binary %d bytes\n", cf.OS, cf.Architecture, d.Digest,
			cf.Config.Entrypoint, cf.Config.User, cf.Config.Labels["org.opencontainers.image.version"], cf.Config.Labels["org.opencontainers.image.revision"], files["outbox-cdc"])
	}
	if len(im.Manifests) == 0 {
		return "", errors.New("the image index lists no image")
	}
	return report.String(), nil
}

// layerFiles lists the regular files of an image's layers with their sizes.
func layerFiles(img v1.Image) (map[string]int64, error) {
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			return nil, err
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				_ = rc.Close()
				return nil, err
			}
			if h.Typeflag == tar.TypeReg {
				out[h.Name] = h.Size
			}
		}
		_ = rc.Close()
	}
	return out, nil
}
