package ops

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// TestStandbyReadinessOnPostgres17 builds a PostgreSQL 17 primary with a failover slot and a physical
// standby that synchronizes it, and follows what status says: not ready while the standby's copy is
// temporary, ready once the slot moved forward on the primary, not ready (and a warning) when the
// primary's synchronized_standby_slots no longer names the standby, and unhealthy when it names a
// slot the server lacks (logical decoding would wait forever).
func TestStandbyReadinessOnPostgres17(t *testing.T) {
	primary := testenv.NewClusterOf(t, "17", "wal_level = logical")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	exec := func(sql string) {
		t.Helper()
		conn, err := pgx.Connect(ctx, primary.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	// The publication before the slot, as init and run create them (a slot older than its publication
	// cannot stream).
	exec("CREATE TABLE outbox (event_id uuid PRIMARY KEY, event_type text NOT NULL, aggregate_type text, aggregate_id text NOT NULL, aggregate_version bigint, payload jsonb NOT NULL, headers jsonb, created_at timestamptz NOT NULL DEFAULT now())")
	exec("CREATE PUBLICATION outbox_cdc FOR TABLE outbox WITH (publish = 'insert', publish_via_partition_root = true)")
	exec("SELECT pg_create_logical_replication_slot('outbox_cdc', 'pgoutput', false, false, true)")
	standby := primary.Standby(t, "sb1", "sync_replication_slots = on", "hot_standby_feedback = on")
	exec("ALTER SYSTEM SET synchronized_standby_slots = 'sb1'")
	exec("SELECT pg_reload_conf()")

	cfg := config.Default()
	cfg.Postgres.URL, cfg.Postgres.StandbyURLs = primary.URL, []string{standby.URL}
	cfg.Kafka.Brokers = testenv.Brokers(t)
	status := func() Status {
		t.Helper()
		st := GatherStatus(ctx, cfg)
		st.Evaluate(Thresholds{MaxLagBytes: 1 << 40, MaxInactive: time.Hour})
		if st.Failover == nil || len(st.Failover.Standbys) != 1 {
			t.Fatalf("no failover report: %+v (postgres: %s)", st.Failover, st.Postgres.Error)
		}
		return st
	}
	waitFor := func(what string, cond func(Status) bool) Status {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute)
		for {
			exec("SELECT pg_log_standby_snapshot()") // wakes the standby's slot sync worker sooner
			st := status()
			if cond(st) {
				return st
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 2 minutes; last report %+v, problems %q\nstandby log:\n%s", what, st.Failover.Standbys[0], st.Problems, standby.Log())
			}
			time.Sleep(time.Second)
		}
	}
	problems := func(st Status) string { return strings.Join(st.Problems, "\n") }

	st := waitFor("the slot synchronized to the standby", func(st Status) bool { return st.Failover.Standbys[0].Facts.SlotExists })
	if sb := st.Failover.Standbys[0]; sb.Facts.SlotTemporary {
		if sb.Ready || !strings.Contains(problems(st), "still temporary") {
			t.Fatalf("a temporary synced slot counted as ready: %+v, problems %q", sb, st.Problems)
		}
	}
	t.Logf("synchronized: %+v", st.Failover.Standbys[0].Facts)

	// A consumer moves the slot forward on the primary: the standby's copy stops being temporary.
	exec("CREATE TABLE moved (i int)")
	exec("INSERT INTO moved SELECT generate_series(1, 1000)")
	exec("SELECT pg_replication_slot_advance('outbox_cdc', pg_current_wal_lsn())")
	st = waitFor("the standby ready", func(st Status) bool { return st.Failover.Standbys[0].Ready })
	t.Logf("ready: %+v, trails %d bytes", st.Failover.Standbys[0].Facts, st.Failover.Standbys[0].TrailBytes)
	if strings.Contains(problems(st), "standby") || len(st.Warnings) > 0 {
		t.Fatalf("ready standby, yet problems %q, warnings %q", st.Problems, st.Warnings)
	}
	var out strings.Builder
	if err := Init(ctx, &out, cfg, InitOptions{CreateTable: true}); err != nil {
		t.Fatalf("init: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "is ready to take over slot outbox_cdc") {
		t.Fatalf("init does not say the standby is ready:\n%s", out.String())
	}

	// Without synchronized_standby_slots the router may publish what the standby never received.
	exec("ALTER SYSTEM RESET synchronized_standby_slots")
	exec("SELECT pg_reload_conf()")
	st = waitFor("the reset seen", func(st Status) bool { return len(st.Failover.Primary.SynchronizedStandbySlots) == 0 })
	if st.Failover.Standbys[0].Ready || !strings.Contains(problems(st), "does not name sb1") {
		t.Fatalf("standby ready without synchronized_standby_slots: problems %q", st.Problems)
	}
	if !strings.Contains(strings.Join(st.Warnings, "\n"), "phantom event") {
		t.Fatalf("no warning about phantom events: %q", st.Warnings)
	}

	// A name without its slot (what a promoted copy of a primary inherits) stops logical decoding.
	exec("ALTER SYSTEM SET synchronized_standby_slots = 'gone'")
	exec("SELECT pg_reload_conf()")
	st = waitFor("the setting seen", func(st Status) bool { return len(st.Failover.Primary.MissingStandbySlots) > 0 })
	if st.Healthy || !strings.Contains(problems(st), "waits for them forever") {
		t.Fatalf("synchronized_standby_slots naming a missing slot: healthy %t, problems %q", st.Healthy, st.Problems)
	}
	out.Reset()
	if err := Init(ctx, &out, cfg, InitOptions{DryRun: true}); err != nil {
		t.Fatalf("init --dry-run: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "FIX  failover: synchronized_standby_slots names gone") {
		t.Fatalf("init does not explain the missing synchronized standby slot:\n%s", out.String())
	}
}
