package pipeline

import (
	"bytes"
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// TestPasswordCommandIsRunForEveryConnection: postgres.password_command gives the password of a role
// whose password is rotated on the server and in the command's source while the router streams: its
// connections are ended, and the new ones take the new password; every event arrives, the command ran
// again, and no password reaches the log.
func TestPasswordCommandIsRunForEveryConnection(t *testing.T) {
	f := testenv.NewFixture(t)
	ctx := context.Background()
	role := "pwcmd_" + strings.TrimPrefix(f.Slot, "slot_")
	admin, err := pgx.Connect(ctx, f.AdminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	exec := func(sql string) {
		t.Helper()
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec("CREATE ROLE " + role + " LOGIN REPLICATION PASSWORD 'first-Rotated-0001'")
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role)
		_, _ = admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+role)
	})
	exec("GRANT SELECT ON " + f.Table + " TO " + role)
	dir := t.TempDir()
	secret, counter := filepath.Join(dir, "password"), filepath.Join(dir, "runs")
	if err := os.WriteFile(secret, []byte("first-Rotated-0001\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(f)
	u, err := url.Parse(cfg.Postgres.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	cfg.Postgres.URL = u.String()
	cfg.Postgres.PasswordCommand = "echo run >> " + counter + "; test \"$PGUSER\" = " + role + " && cat " + secret
	var logged testenv.LogBuffer
	run := startPipelineLogged(t, cfg, testLoggerTo(t, &logged))

	gen := testenv.NewGenerator(3, "Rotated")
	topics := testenv.TopicsOf(f, "Rotated")
	want := []testenv.Event{gen.Event(0), gen.Event(1)}
	if err := testenv.InsertTx(ctx, f.DB, f.Table, want, false); err != nil {
		t.Fatal(err)
	}
	testenv.ConsumeDistinct(t, f.Brokers, topics, len(want), time.Minute, testenv.ConsumerOpts()...)
	runs := func() int { data, _ := os.ReadFile(counter); return bytes.Count(data, []byte("run")) }
	before := runs()

	// Rotated on the server and in the command's source; the old connections ended.
	exec("ALTER ROLE " + role + " PASSWORD 'second-Rotated-0002'")
	if err := os.WriteFile(secret, []byte("second-Rotated-0002\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	exec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '" + role + "'")
	more := []testenv.Event{gen.Event(2), gen.Event(0)}
	if err := testenv.InsertTx(ctx, f.DB, f.Table, more, false); err != nil {
		t.Fatal(err)
	}
	want = append(want, more...)
	got := testenv.ConsumeDistinct(t, f.Brokers, topics, len(want), 2*time.Minute, testenv.ConsumerOpts()...)
	testenv.VerifyDelivery(t, f, want, got)
	testenv.WaitFor(t, time.Minute, "streaming again", func() bool { return run.p.State() == StateStreaming })
	if after := runs(); after <= before {
		t.Errorf("the password command ran %d times before the rotation and %d after: it must run for every new connection", before, after)
	}
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	if l := logged.String(); strings.Contains(l, "Rotated-000") {
		t.Error("a password from the command reached the log")
	}
}
