#!/usr/bin/env bash
# Installs what the build, `make run` and `make test` need on a Debian machine, when missing:
# Go (expected preinstalled), PostgreSQL 15 server binaries and psql, Java 17 and Maven (for the Kafka
# broker's jars), npm and node (for the PostgreSQL 14/16/17/18 server builds of `make test-versions`).
# Safe to run again; does nothing when everything is present.
set -euo pipefail
need=()
[ -x /usr/lib/postgresql/15/bin/postgres ] || need+=(postgresql-15)
command -v psql >/dev/null || need+=(postgresql-client-15)
command -v java >/dev/null || need+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || need+=(maven)
command -v openssl >/dev/null || need+=(openssl)
command -v npm >/dev/null || need+=(npm)
command -v node >/dev/null || need+=(nodejs)
command -v chromium >/dev/null || need+=(chromium)   # the fleet status page's browser test
if [ ${#need[@]} -gt 0 ]; then
  echo "install-deps: installing ${need[*]}" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${need[@]}"
fi
command -v go >/dev/null || { echo "install-deps: Go 1.26 or newer is required (https://go.dev/doc/install)" >&2; exit 1; }
echo "install-deps: ok ($(go version | cut -d' ' -f3), postgres 15, $(java -version 2>&1 | head -1), maven)" >&2
