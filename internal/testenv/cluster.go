package testenv

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TempCluster starts a throw-away PostgreSQL 15 cluster with the given postgresql.conf lines (for
// example "wal_level = replica") on a free loopback port, stops it when the test ends, and returns a
// superuser URL. As root it runs the server as the postgres user, which it must be.
func TempCluster(t testing.TB, settings ...string) string {
	t.Helper()
	requireIntegration(t)
	bin := os.Getenv("PG_BIN")
	if bin == "" {
		bin = "/usr/lib/postgresql/15/bin"
	}
	if _, err := os.Stat(filepath.Join(bin, "initdb")); err != nil {
		t.Fatalf("PostgreSQL 15 server binaries not found in %s (scripts/install-deps.sh installs them): %v", bin, err)
	}
	dir, err := os.MkdirTemp("", "outbox-cdc-cluster")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	asPG := func(name string, args ...string) *exec.Cmd {
		if os.Geteuid() == 0 {
			return exec.Command("runuser", append([]string{"-u", "postgres", "--", name}, args...)...)
		}
		return exec.Command(name, args...)
	}
	if os.Geteuid() == 0 {
		if out, err := exec.Command("chown", "postgres:", dir).CombinedOutput(); err != nil {
			t.Fatalf("chown %s: %v\n%s", dir, err, out)
		}
	}
	data := filepath.Join(dir, "data")
	if out, err := asPG(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "--auth=trust").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	conf := append([]string{"listen_addresses = '127.0.0.1'", fmt.Sprintf("port = %d", port),
		fmt.Sprintf("unix_socket_directories = '%s'", data), "fsync = off"}, settings...)
	cmd := asPG("sh", "-c", fmt.Sprintf("cat >> %s/postgresql.conf", data))
	cmd.Stdin = strings.NewReader(strings.Join(conf, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("write postgresql.conf: %v\n%s", err, out)
	}
	if out, err := asPG(filepath.Join(bin, "pg_ctl"), "-D", data, "-l", filepath.Join(data, "server.log"), "-w", "start").CombinedOutput(); err != nil {
		t.Fatalf("start the temporary cluster: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		_ = asPG(filepath.Join(bin, "pg_ctl"), "-D", data, "-m", "immediate", "-w", "stop").Run()
	})
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres", port)
}
