// Package e2e holds the process-level tests: they build the outbox-cdc binary once (not under
// -short) and run its commands against the real PostgreSQL and Kafka of `make up`.
package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/ops"
)

// runCLI runs the binary to completion and returns its combined output and exit code.
func runCLI(t *testing.T, env []string, timeout time.Duration, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("outbox-cdc %s did not finish within %s:\n%s", strings.Join(args, " "), timeout, out)
	}
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatal(err)
		}
		code = ee.ExitCode()
	}
	return string(out), code
}

func adminExec(t *testing.T, f *testenv.Fixture, sql string) {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, f.AdminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// TestLostSlotStatusRunResync invalidates the slot on purpose (small max_slot_wal_keep_size, WAL
// switched past it): status reports it lost and exits non-zero, run refuses and points at resync,
// and resync recovers so that every retained row arrives.
func TestLostSlotStatusRunResync(t *testing.T) {
	f := testenv.NewFixture(t)
	env := routerEnv(f)
	if out, code := runCLI(t, env, time.Minute, "init"); code != 0 {
		t.Fatalf("init: exit %d\n%s", code, out)
	}
	rows := testenv.Preload(t, f, testenv.NewGenerator(20, "Invoiced"), 300)

	adminExec(t, f, "ALTER SYSTEM SET max_slot_wal_keep_size = '32MB'")
	adminExec(t, f, "SELECT pg_reload_conf()")
	t.Cleanup(func() {
		adminExec(t, f, "ALTER SYSTEM RESET max_slot_wal_keep_size")
		adminExec(t, f, "SELECT pg_reload_conf()")
	})
	filler := strings.Replace(f.Table, "ob_", "fill_", 1)
	adminExec(t, f, "CREATE TABLE "+filler+" (filler text)")
	t.Cleanup(func() { adminExec(t, f, "DROP TABLE IF EXISTS "+filler) })
	testenv.WaitFor(t, 2*time.Minute, "slot lost", func() bool {
		adminExec(t, f, "INSERT INTO "+filler+" SELECT repeat(md5(g::text), 64) FROM generate_series(1, 20000) g")
		adminExec(t, f, "SELECT pg_switch_wal()")
		adminExec(t, f, "CHECKPOINT")
		var status *string
		_ = f.DB.QueryRow(context.Background(), "SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1", f.Slot).Scan(&status)
		return status != nil && *status == "lost"
	})

	out, code := runCLI(t, env, time.Minute, "status")
	if code == 0 || !strings.Contains(out, "lost") || !strings.Contains(out, "resync") {
		t.Fatalf("status on a lost slot: exit %d\n%s", code, out)
	}
	out, code = runCLI(t, env, time.Minute, "status", "--json")
	var st ops.Status
	if err := json.Unmarshal([]byte(out[:strings.LastIndex(out, "}")+1]), &st); err != nil || code == 0 || st.Healthy || st.Slot.WALStatus != "lost" {
		t.Fatalf("status --json on a lost slot: exit %d, %v\n%s", code, err, out)
	}
	out, code = runCLI(t, env, time.Minute, "run")
	if code == 0 || !strings.Contains(out, "outbox-cdc resync") {
		t.Fatalf("run on a lost slot: exit %d, want a refusal pointing at resync\n%s", code, out)
	}
	out, code = runCLI(t, env, 3*time.Minute, "resync", "--yes", "--snapshot-only")
	if code != 0 {
		t.Fatalf("resync: exit %d\n%s", code, out)
	}
	got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Invoiced"), len(rows), time.Minute)
	testenv.VerifyDelivery(t, f, rows, got)
}

// TestResyncKilledHalfwayThenRerun: a resync killed while it publishes the snapshot completes when
// run again; every row arrives (the first attempt's rows again, as duplicates).
func TestResyncKilledHalfwayThenRerun(t *testing.T) {
	f := testenv.NewFixture(t)
	rows := testenv.Preload(t, f, testenv.NewGenerator(20, "Shipped"), 20000)
	env := append(routerEnv(f), "OUTBOX_CDC_MAX_INFLIGHT_RECORDS=20")
	first := exec.Command(binary, "resync", "--yes", "--snapshot-only")
	first.Env = env
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	seen := testenv.Consume(t, f.Brokers, testenv.TopicsOf(f, "Shipped"), 1, time.Minute)
	time.Sleep(300 * time.Millisecond)
	_ = first.Process.Signal(syscall.SIGKILL)
	_ = first.Wait()
	if len(seen) == 0 {
		t.Fatal("the first resync published nothing before it was killed")
	}
	// run must not stream from a slot whose snapshot was not all published.
	out, code := runCLI(t, routerEnv(f), time.Minute, "run")
	if code == 0 || !strings.Contains(out, "run `outbox-cdc resync` again") {
		t.Fatalf("run after an interrupted resync: exit %d, want a refusal pointing at resync\n%s", code, out)
	}
	out, code = runCLI(t, routerEnv(f), time.Minute, "status")
	if code == 0 || !strings.Contains(out, "interrupted") {
		t.Fatalf("status after an interrupted resync: exit %d\n%s", code, out)
	}
	out, code = runCLI(t, routerEnv(f), 5*time.Minute, "resync", "--yes", "--snapshot-only")
	if code != 0 {
		t.Fatalf("second resync: exit %d\n%s", code, out)
	}
	got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Shipped"), len(rows), 2*time.Minute)
	dups := testenv.VerifyDelivery(t, f, rows, got)
	t.Logf("%d rows after a killed and a complete resync, %d duplicates", len(rows), dups)
}

// TestInitIsIdempotent: init creates table, publication, slot and topics once; the second run
// changes nothing; --dry-run changes nothing.
func TestInitIsIdempotent(t *testing.T) {
	f := testenv.NewFixture(t)
	table := f.Table + "_i"
	env := append(routerEnv(f), "OUTBOX_CDC_TABLE="+table, "OUTBOX_CDC_PUBLICATION="+f.Publication+"_i",
		"OUTBOX_CDC_SLOT="+f.Slot+"_i", "OUTBOX_CDC_DLQ_TOPIC="+f.TopicPrefix+".dlq")
	t.Cleanup(func() {
		adminExec(t, f, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '"+f.Slot+"_i'")
		adminExec(t, f, "DROP PUBLICATION IF EXISTS "+f.Publication+"_i")
		adminExec(t, f, "DROP TABLE IF EXISTS "+table)
	})
	out, code := runCLI(t, env, time.Minute, "init", "--create-table", "--dry-run")
	if code != 0 || !strings.Contains(out, "CREATE TABLE") || !strings.Contains(out, "CREATE PUBLICATION") || !strings.Contains(out, f.TopicPrefix+".dlq") {
		t.Fatalf("init --dry-run: exit %d\n%s", code, out)
	}
	var n int
	_ = f.DB.QueryRow(context.Background(), "SELECT count(*) FROM pg_class WHERE relname = $1", strings.TrimPrefix(table, "public.")).Scan(&n)
	if n != 0 {
		t.Fatal("init --dry-run created the table")
	}
	out, code = runCLI(t, env, time.Minute, "init", "--create-table")
	if code != 0 || strings.Count(out, "done ") != 4 {
		t.Fatalf("first init: exit %d, want 4 creations\n%s", code, out)
	}
	out, code = runCLI(t, env, time.Minute, "init", "--create-table")
	if code != 0 || strings.Contains(out, "done ") {
		t.Fatalf("second init: exit %d, want no change\n%s", code, out)
	}
	// The router streams from what init made.
	r := startRouter(t, append(env, "OUTBOX_CDC_CREATE_SLOT=false", "OUTBOX_CDC_CREATE_PUBLICATION=false"))
	r.waitLog(t, "streaming", time.Minute)
	out, code = runCLI(t, env, time.Minute, "status", "--json")
	if code != 0 || !strings.Contains(out, `"healthy": true`) {
		t.Fatalf("status with a streaming router: exit %d\n%s", code, out)
	}
}

// TestInitOnWalLevelReplica: init against a server with wal_level=replica fails and names the fix.
func TestInitOnWalLevelReplica(t *testing.T) {
	url := testenv.TempCluster(t, "wal_level = replica")
	env := append(os.Environ(), "OUTBOX_CDC_POSTGRES="+url, "OUTBOX_CDC_BROKERS=127.0.0.1:1", "OUTBOX_CDC_METRICS_ADDR=")
	out, code := runCLI(t, env, time.Minute, "init", "--create-table")
	if code == 0 {
		t.Fatalf("init succeeded on wal_level=replica:\n%s", out)
	}
	for _, want := range []string{`wal_level is "replica"`, "ALTER SYSTEM SET wal_level = logical", "restart"} {
		if !strings.Contains(out, want) {
			t.Errorf("init output lacks %q:\n%s", want, out)
		}
	}
}
