package testenv

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TempCluster starts a throw-away PostgreSQL 15 cluster with the given postgresql.conf lines (for
// example "wal_level = replica") on a free loopback port, stops it when the test ends, and returns a
// superuser URL. As root it runs the server as the postgres user, which it must be.
func TempCluster(t testing.TB, settings ...string) string {
	t.Helper()
	return NewCluster(t, settings...).URL
}

// Cluster is a throw-away PostgreSQL cluster of a test.
type Cluster struct {
	// URL is a superuser URL.
	URL   string
	pgCtl func(args ...string) *exec.Cmd
	data  string
}

// Restart restarts the cluster with pg_ctl -m mode (fast, immediate) and returns how long the
// shutdown and start took; it fails the test if that exceeds timeout.
func (c *Cluster) Restart(t testing.TB, mode string, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	out, err := c.pgCtl("-D", c.data, "-m", mode, "-w", "-t", fmt.Sprint(int(timeout.Seconds())), "-l", filepath.Join(c.data, "server.log"), "restart").CombinedOutput()
	took := time.Since(start)
	if err != nil {
		_ = c.pgCtl("-D", c.data, "-l", filepath.Join(c.data, "server.log"), "-w", "start").Run()
		t.Fatalf("pg_ctl restart -m %s did not complete within %s: %v\n%s", mode, timeout, err, out)
	}
	return took
}

// NewCluster is TempCluster, returning the cluster.
func NewCluster(t testing.TB, settings ...string) *Cluster {
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
	return &Cluster{
		URL:   fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres", port),
		pgCtl: func(args ...string) *exec.Cmd { return asPG(filepath.Join(bin, "pg_ctl"), args...) },
		data:  data,
	}
}
