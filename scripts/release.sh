#!/usr/bin/env bash
# Builds the release of the checked-out commit into dist/ (DIST overrides): static binaries for linux
# and darwin on amd64 and arm64 (PLATFORMS overrides), each in a tar.gz with the README and CHANGELOG;
# a CycloneDX SBOM per platform (cyclonedx-gomod, installed into .dev/bin once); the container image
# of the linux binaries (scripts/image: an OCI image layout and its tarball, no Docker engine needed);
# and SHA256SUMS over all of it. Reproducible: every time and owner is the commit's, so two builds of
# one commit give the same bytes (scripts/release_test.go checks it).
set -euo pipefail
cd "$(dirname "$0")/.."
DIST=${DIST:-dist}
PLATFORMS=${PLATFORMS:-linux/amd64 linux/arm64 darwin/amd64 darwin/arm64}
GO=${GO:-go}
DEV=${OUTBOX_CDC_DEV_DIR:-.dev}
SBOM_VERSION=v1.10.0

commit=$(git rev-parse HEAD)
date=$(git log -1 --format=%cI "$commit" | sed 's/+00:00$/Z/')
epoch=$(git log -1 --format=%ct "$commit")
if [ -n "${VERSION:-}" ]; then version=$VERSION
elif tag=$(git describe --tags --exact-match "$commit" 2>/dev/null); then version=$tag
else version="v0.0.0-$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y%m%d%H%M%S "$commit")-${commit:0:12}"; fi
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  echo "release: the working tree has uncommitted changes; the release would not be the commit's" >&2
  [ "${ALLOW_DIRTY:-}" = 1 ] || exit 1
fi

sbom="$DEV/bin/cyclonedx-gomod"
if [ ! -x "$sbom" ]; then
  echo "release: installing cyclonedx-gomod $SBOM_VERSION into $DEV/bin (once)" >&2
  GOBIN="$(cd "$(dirname "$DEV")" && pwd)/$(basename "$DEV")/bin" $GO install "github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod@$SBOM_VERSION"
fi

rm -rf "$DIST"
mkdir -p "$DIST"
pkg=github.com/outbox-cdc/outbox-cdc/internal/buildinfo
ldflags="-s -w -buildid= -X $pkg.version=$version -X $pkg.commit=$commit -X $pkg.date=$date"
linux_arches=()
for p in $PLATFORMS; do
  os=${p%/*}; arch=${p#*/}
  name="outbox-cdc_${version}_${os}_${arch}"
  mkdir -p "$DIST/$name"
  echo "release: $name" >&2
  CGO_ENABLED=0 GOOS=$os GOARCH=$arch $GO build -trimpath -buildvcs=false -ldflags "$ldflags" -o "$DIST/$name/outbox-cdc" .
  cp README.md CHANGELOG.md "$DIST/$name/"
  touch -d "@$epoch" "$DIST/$name" "$DIST/$name"/*
  tar --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner --format=pax --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -C "$DIST" -cf - "$name" | gzip -n -9 > "$DIST/$name.tar.gz"
  GOOS=$os GOARCH=$arch CGO_ENABLED=0 "$sbom" app -json -noserial -notimestamp -std -output "$DIST/$name.cdx.json" . 2>/dev/null
  [ "$os" = linux ] && linux_arches+=("$arch")
done
if [ ${#linux_arches[@]} -gt 0 ]; then
  arches=$(IFS=,; echo "${linux_arches[*]}")
  $GO run ./scripts/image -dist "$DIST" -version "$version" -commit "$commit" -date "$date" -platforms "$arches" -out "$DIST/outbox-cdc_${version}_image" >&2
  $GO run ./scripts/image -verify "$DIST/outbox-cdc_${version}_image" >&2
fi
(cd "$DIST" && sha256sum -- *.tar.gz *.cdx.json $(ls *_image.tar 2>/dev/null) > SHA256SUMS)
echo "release: $version ($commit) in $DIST:" >&2
cat "$DIST/SHA256SUMS" >&2
