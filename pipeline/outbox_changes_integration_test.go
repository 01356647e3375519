package pipeline

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// runInBackground runs a pipeline until it returns or the test ends; the channel yields Run's result.
func runInBackground(t *testing.T, p *Pipeline) <-chan error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		done <- p.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-stopped:
		case <-time.After(60 * time.Second):
			t.Error("pipeline did not stop within 60 s")
		}
	})
	return done
}

// runUntilStreaming starts a pipeline for cfg in the background, waits until it streams, and returns
// it with the channel that yields Run's result.
func runUntilStreaming(t *testing.T, cfg config.Config) (*Pipeline, <-chan error) {
	t.Helper()
	p, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	done := runInBackground(t, p)
	testenv.WaitFor(t, time.Minute, "pipeline streaming", func() bool { return p.State() == StateStreaming })
	return p, done
}

// currentLSN returns pg_current_wal_lsn().
func currentLSN(t *testing.T, f *testenv.Fixture) string {
	t.Helper()
	var lsn string
	if err := f.DB.QueryRow(context.Background(), "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	return lsn
}

// busyOtherTable writes about mb megabytes to another table, so that keepalives carry a WAL end far
// past the outbox's last change: an idle confirm would pass it.
func busyOtherTable(t *testing.T, f *testenv.Fixture, mb int) {
	t.Helper()
	ctx := context.Background()
	other := strings.Replace(f.Table, "ob_", "busy_", 1)
	if _, err := f.DB.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+other+" (id bigserial primary key, filler text)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = f.DB.Exec(context.Background(), "DROP TABLE IF EXISTS "+other) })
	for i := 0; i < mb; i++ { // about 1 MB a transaction
		if _, err := f.DB.Exec(ctx, "INSERT INTO "+other+" (filler) SELECT repeat(md5(g::text), 32) FROM generate_series(1, 1000) g"); err != nil {
			t.Fatal(err)
		}
	}
}

// partitionedOutbox replaces the fixture's table by a range-partitioned one (by created_at) with a
// partition for last month and one for this month.
func partitionedOutbox(t *testing.T, f *testenv.Fixture) {
	t.Helper()
	ctx := context.Background()
	name := strings.TrimPrefix(f.Table, "public.")
	stmts := []string{
		"DROP PUBLICATION IF EXISTS " + f.Publication,
		"DROP TABLE " + f.Table,
		`CREATE TABLE ` + f.Table + ` (
			event_id uuid NOT NULL, event_type text NOT NULL, aggregate_type text, aggregate_id text NOT NULL,
			aggregate_version bigint, payload jsonb NOT NULL, headers jsonb, created_at timestamptz NOT NULL DEFAULT now(),
			PRIMARY KEY (event_id, created_at)) PARTITION BY RANGE (created_at)`,
		fmt.Sprintf(`CREATE TABLE %s_old PARTITION OF %s FOR VALUES FROM ('2000-01-01') TO ('2026-01-01')`, name, f.Table),
		fmt.Sprintf(`CREATE TABLE %s_now PARTITION OF %s FOR VALUES FROM ('2026-01-01') TO ('2100-01-01')`, name, f.Table),
	}
	for _, s := range stmts {
		if _, err := f.DB.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// insertAt writes events in one transaction with the given created_at.
func insertAt(t *testing.T, f *testenv.Fixture, at time.Time, evs []testenv.Event) {
	t.Helper()
	ctx := context.Background()
	tx, err := f.DB.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, e := range evs {
		if _, err := tx.Exec(ctx, `INSERT INTO `+f.Table+` (event_id, event_type, aggregate_type, aggregate_id, aggregate_version, payload, headers, created_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, e.ID, e.Type, e.AggType, e.AggID, e.Version, e.Payload, e.Headers, at); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestPartitionedOutbox: a range-partitioned outbox streams its rows under its own name — rows of
// every partition, of a partition attached while streaming, and around an old partition detached and
// dropped while streaming — with nothing lost.
func TestPartitionedOutbox(t *testing.T) {
	f := testenv.NewFixture(t)
	partitionedOutbox(t, f)
	startPipeline(t, testConfig(f)) // creates the publication, via the partition root
	gen := testenv.NewGenerator(5, "Partitioned")
	var want []testenv.Event
	batch := func(at time.Time) {
		evs := []testenv.Event{gen.Event(len(want)), gen.Event(len(want) + 1), gen.Event(len(want) + 2)}
		insertAt(t, f, at, evs)
		want = append(want, evs...)
	}
	name := strings.TrimPrefix(f.Table, "public.")
	ctx := context.Background()
	batch(time.Date(2025, 6, 1, 0, 0, 0, 0, time.UTC)) // the old partition
	batch(time.Now())                                  // this one
	if _, err := f.DB.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s_next PARTITION OF %s FOR VALUES FROM ('2100-01-01') TO ('2200-01-01')`, name, f.Table)); err != nil {
		t.Fatal(err)
	}
	batch(time.Date(2150, 1, 1, 0, 0, 0, 0, time.UTC)) // the partition attached while streaming
	batch(time.Date(2025, 7, 1, 0, 0, 0, 0, time.UTC))
	got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Partitioned"), len(want), time.Minute)
	testenv.VerifyDelivery(t, f, want, got)
	// Clean up the way partitioned outboxes are meant to: detach and drop an old partition.
	for _, s := range []string{fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s_old", f.Table, name), fmt.Sprintf("DROP TABLE %s_old", name)} {
		if _, err := f.DB.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	batch(time.Now())
	batch(time.Date(2150, 2, 1, 0, 0, 0, 0, time.UTC))
	got = testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Partitioned"), len(want), time.Minute)
	testenv.VerifyDelivery(t, f, want, got)
}

// TestPartitionedOutboxNeedsViaRoot: an existing publication that does not publish via the partition
// root is refused at start with the statement that fixes it.
func TestPartitionedOutboxNeedsViaRoot(t *testing.T) {
	f := testenv.NewFixture(t)
	partitionedOutbox(t, f)
	if _, err := f.DB.Exec(context.Background(), "CREATE PUBLICATION "+f.Publication+" FOR TABLE "+f.Table+" WITH (publish = 'insert')"); err != nil {
		t.Fatal(err)
	}
	p, err := New(testConfig(f), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = p.Run(ctx)
	want := "ALTER PUBLICATION " + pgx.Identifier{f.Publication}.Sanitize() + " SET (publish_via_partition_root = true)"
	if !errors.Is(err, replication.ErrNotSetUp) || !strings.Contains(err.Error(), want) {
		t.Fatalf("run returned %v, want a set-up error naming %q", err, want)
	}
}

// TestSchemaDriftStopsBeforeTheSlotMoves: when the payload column disappears from the stream mid-way
// (renamed, or left out of the publication's column list), the router stops with an error naming the
// column, after delivering and confirming everything before it, and never confirms past it.
func TestSchemaDriftStopsBeforeTheSlotMoves(t *testing.T) {
	tests := []struct{ name, ddl string }{
		{"renamed", "ALTER TABLE %[1]s RENAME COLUMN payload TO body"},
		{"left out of the column list", "ALTER PUBLICATION %[2]s SET TABLE %[1]s (event_id, event_type, aggregate_type, aggregate_id, aggregate_version, headers, created_at)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := testenv.NewFixture(t)
			_, done := runUntilStreaming(t, testConfig(f))
			gen := testenv.NewGenerator(3, "Drift")
			before := []testenv.Event{gen.Event(0), gen.Event(1)}
			if err := testenv.InsertTx(context.Background(), f.DB, f.Table, before, false); err != nil {
				t.Fatal(err)
			}
			admin, err := pgx.Connect(context.Background(), f.AdminURL)
			if err != nil {
				t.Fatal(err)
			}
			defer admin.Close(context.Background())
			if _, err := admin.Exec(context.Background(), fmt.Sprintf(tt.ddl, f.Table, f.Publication)); err != nil {
				t.Fatal(err)
			}
			atDrift := testenv.MustLSN(t, currentLSN(t, f))
			// The row after the change, written however the table now allows.
			col := "payload"
			if tt.name == "renamed" {
				col = "body"
			}
			if _, err := f.DB.Exec(context.Background(), `INSERT INTO `+f.Table+` (event_id, event_type, aggregate_id, `+col+`) VALUES (gen_random_uuid(), 'Drift', 'agg-9', '{"after": true}')`); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				if !errors.Is(err, replication.ErrOutboxChanged) || !strings.Contains(err.Error(), `"payload"`) {
					t.Fatalf("run returned %v, want ErrOutboxChanged naming the payload column", err)
				}
			case <-time.After(time.Minute):
				t.Fatal("the router kept streaming after the payload column disappeared")
			}
			if c := testenv.MustLSN(t, f.ConfirmedFlushLSN(t)); c > atDrift {
				t.Fatalf("slot confirmed %s, past %s where the payload column disappeared", c, atDrift)
			}
			got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Drift"), len(before), time.Minute)
			testenv.VerifyDelivery(t, f, before, got)
			for _, r := range got {
				if len(r.Value) == 0 {
					t.Fatalf("a record without a value reached Kafka: %v", r.Headers)
				}
			}
		})
	}
}

// TestOutboxLeavesThePublication: when the outbox stops being published while the router idles and
// other tables are busy — removed from the publication, dropped and re-created outside it, removed
// and added back (or dropped and re-created into it) faster than the verifier checks, the
// publication dropped (and re-created), or an inheritance child taking rows under its own name — the
// rows written meanwhile are not in the stream. The router must stop with an error pointing at
// resync, never confirm past them, and a router started afterwards must refuse too (never re-create
// the publication it lost).
func TestOutboxLeavesThePublication(t *testing.T) {
	const table = "CREATE TABLE %[1]s (event_id uuid PRIMARY KEY, event_type text NOT NULL, aggregate_type text, aggregate_id text NOT NULL, aggregate_version bigint, payload jsonb NOT NULL, headers jsonb, created_at timestamptz NOT NULL DEFAULT now())"
	tests := []struct {
		name, before, after string
		into                string // where the unpublished row goes: %[1]s is the outbox
		restartRefused      bool   // a new router refuses as well
		second              bool   // the change is to the second of two outbox tables of the source
	}{
		{name: "removed from the publication", before: "ALTER PUBLICATION %[2]s DROP TABLE %[1]s"},
		{name: "dropped and re-created", before: "DROP TABLE %[1]s; " + table},
		{name: "removed and added back", before: "ALTER PUBLICATION %[2]s DROP TABLE %[1]s", after: "ALTER PUBLICATION %[2]s ADD TABLE %[1]s"},
		{name: "dropped and re-created into the publication", before: "DROP TABLE %[1]s; " + table, after: "ALTER PUBLICATION %[2]s ADD TABLE %[1]s"},
		{name: "publication dropped", before: "DROP PUBLICATION %[2]s", restartRefused: true},
		{name: "publication dropped and re-created", before: "DROP PUBLICATION %[2]s", after: "CREATE PUBLICATION %[2]s FOR TABLE %[1]s WITH (publish = 'insert')"},
		{name: "inheritance child", before: "CREATE TABLE %[1]s_child () INHERITS (%[1]s)", into: "%[1]s_child", restartRefused: true},
		{name: "second table removed from the publication", before: "ALTER PUBLICATION %[2]s DROP TABLE %[1]s", second: true},
		{name: "second table removed and added back", before: "ALTER PUBLICATION %[2]s DROP TABLE %[1]s", after: "ALTER PUBLICATION %[2]s ADD TABLE %[1]s", second: true},
		{name: "second table dropped and re-created into the publication", before: "DROP TABLE %[1]s; " + table, after: "ALTER PUBLICATION %[2]s ADD TABLE %[1]s", second: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := testenv.NewFixture(t)
			t.Cleanup(func() { _, _ = f.DB.Exec(context.Background(), "DROP TABLE IF EXISTS "+f.Table+"_child") })
			cfg := testConfig(f)
			changed := f.Table
			ctx := context.Background()
			if tt.second {
				g := testenv.NewFixtureIn(t, f)
				if _, err := f.DB.Exec(ctx, "ALTER PUBLICATION "+f.Publication+" ADD TABLE "+g.Table); err != nil {
					t.Fatal(err)
				}
				cfg = withTables(t, cfg, g)
				changed = g.Table
			}
			p, done := runUntilStreaming(t, cfg)
			// Every change comes right after the one before: faster than the verifier checks.
			if _, err := f.DB.Exec(ctx, fmt.Sprintf(tt.before, changed, f.Publication)); err != nil {
				t.Fatal(err)
			}
			unpublished := testenv.MustLSN(t, currentLSN(t, f))
			into := changed
			if tt.into != "" {
				into = fmt.Sprintf(tt.into, changed)
			}
			gen := testenv.NewGenerator(1, "Unpublished")
			if err := testenv.InsertTx(ctx, f.DB, into, []testenv.Event{gen.Event(0)}, false); err != nil {
				t.Fatal(err)
			}
			if tt.after != "" {
				if _, err := f.DB.Exec(ctx, fmt.Sprintf(tt.after, changed, f.Publication)); err != nil {
					t.Fatal(err)
				}
			}
			busyOtherTable(t, f, 5)
			select {
			case err := <-done:
				if !errors.Is(err, replication.ErrOutboxChanged) || !strings.Contains(err.Error(), "resync") {
					t.Fatalf("run returned %v, want ErrOutboxChanged pointing at resync", err)
				}
				if tt.second && !strings.Contains(err.Error(), strings.TrimPrefix(changed, "public.")) && !strings.Contains(err.Error(), f.Publication) {
					t.Fatalf("run returned %v, want it to name %s", err, changed)
				}
				t.Logf("stopped: %v", err)
			case <-time.After(time.Minute):
				t.Fatal("the router kept streaming after the outbox stopped being published")
			}
			if p.State() == StateStreaming {
				t.Fatal("state still says streaming")
			}
			if c := testenv.MustLSN(t, f.ConfirmedFlushLSN(t)); c > unpublished {
				t.Fatalf("slot confirmed %s, past %s where the outbox stopped being published", c, unpublished)
			}
			if tt.restartRefused {
				p2, err := New(cfg, testLogger(t))
				if err != nil {
					t.Fatal(err)
				}
				rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				defer cancel()
				if err := p2.Run(rctx); !permanent(err) || !strings.Contains(err.Error(), "resync") && !strings.Contains(err.Error(), "inheritance") {
					t.Fatalf("a new router returned %v, want a permanent refusal", err)
				}
				if c := testenv.MustLSN(t, f.ConfirmedFlushLSN(t)); c > unpublished {
					t.Fatalf("slot confirmed %s after a restart, past %s where the outbox stopped being published", c, unpublished)
				}
			}
		})
	}
}

// TestHalfOpenConnectionIsReplaced black-holes the router's connections to PostgreSQL (no FIN, no
// reset: the peer just goes silent) under load. The router must notice within its receive timeout,
// take the slot back from its own dead session, and deliver everything.
func TestHalfOpenConnectionIsReplaced(t *testing.T) {
	f := testenv.NewFixture(t)
	cfg := testConfig(f)
	pgHost := strings.Split(strings.SplitN(f.PostgresURL, "@", 2)[1], "/")[0]
	proxy := testenv.NewProxy(t, pgHost)
	cfg.Postgres.URL = testenv.ProxyURL(t, proxy, f.PostgresURL)
	cfg.Postgres.StatusInterval = time.Second
	cfg.Postgres.ReceiveTimeout = 4 * time.Second
	run := startPipeline(t, cfg)
	writer := testenv.StartWriter(t, f, testenv.NewGenerator(10, "Silenced"), 3, 10*time.Millisecond, true)
	time.Sleep(2 * time.Second)
	if n := proxy.BlackHole(); n == 0 {
		t.Fatal("no connection went through the proxy")
	}
	holed := time.Now()
	testenv.WaitFor(t, 30*time.Second, "the router to leave the silent session", func() bool { return run.p.State() != StateStreaming })
	left := time.Since(holed)
	testenv.WaitFor(t, 30*time.Second, "the router to stream again", func() bool { return run.p.State() == StateStreaming })
	back := time.Since(holed)
	time.Sleep(2 * time.Second)
	want, err := writer.Stop()
	if err != nil {
		t.Fatal(err)
	}
	got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Silenced"), len(want), 2*time.Minute)
	dups := testenv.VerifyDelivery(t, f, want, got)
	t.Logf("silence noticed after %s, streaming again after %s (receive timeout %s, wal_sender_timeout 60s); %d events, %d duplicates",
		left.Round(100*time.Millisecond), back.Round(100*time.Millisecond), cfg.Postgres.ReceiveTimeout, len(want), dups)
	if back > 20*time.Second {
		t.Errorf("took %s to stream again: the router waited for the server to drop its dead session", back)
	}
}

// TestSetupErrorsStopWithTheFix: each set-up problem that retrying cannot fix makes run return at
// once with an error that names the problem and the fix, instead of retrying forever.
func TestSetupErrorsStopWithTheFix(t *testing.T) {
	tests := []struct {
		name    string
		prepare func(t *testing.T, f *testenv.Fixture, admin *pgx.Conn, cfg *config.Config)
		want    string
	}{
		{"role without REPLICATION", func(t *testing.T, f *testenv.Fixture, admin *pgx.Conn, cfg *config.Config) {
			role := "norepl_" + strings.TrimPrefix(f.Slot, "slot_")
			adminExec(t, admin, "CREATE ROLE "+role+" LOGIN PASSWORD 'norepl'")
			t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+role) })
			u, err := url.Parse(f.PostgresURL)
			if err != nil {
				t.Fatal(err)
			}
			u.User = url.UserPassword(role, "norepl")
			cfg.Postgres.URL = u.String()
		}, "REPLICATION"},
		{"unlogged outbox", func(t *testing.T, f *testenv.Fixture, admin *pgx.Conn, cfg *config.Config) {
			adminExec(t, admin, "DROP PUBLICATION "+f.Publication)
			adminExec(t, admin, "ALTER TABLE "+f.Table+" SET UNLOGGED")
		}, "SET LOGGED"},
		{"a view", func(t *testing.T, f *testenv.Fixture, admin *pgx.Conn, cfg *config.Config) {
			adminExec(t, admin, "CREATE VIEW "+f.Table+"_v AS SELECT * FROM "+f.Table)
			t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP VIEW IF EXISTS "+f.Table+"_v") })
			cfg.Postgres.Table = f.Table + "_v"
		}, "is a view"},
		{"slot of another plugin", func(t *testing.T, f *testenv.Fixture, admin *pgx.Conn, cfg *config.Config) {
			adminExec(t, admin, "SELECT pg_create_logical_replication_slot('"+f.Slot+"', 'test_decoding')")
		}, `uses plugin "test_decoding"`},
		{"slot of another database", func(t *testing.T, f *testenv.Fixture, admin *pgx.Conn, cfg *config.Config) {
			other, err := pgx.Connect(context.Background(), strings.Replace(f.AdminURL, "/outbox", "/postgres", 1))
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close(context.Background())
			adminExec(t, other, "SELECT pg_create_logical_replication_slot('"+f.Slot+"', 'pgoutput')")
			t.Cleanup(func() {
				c, err := pgx.Connect(context.Background(), strings.Replace(f.AdminURL, "/outbox", "/postgres", 1))
				if err == nil {
					_, _ = c.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", f.Slot)
					_ = c.Close(context.Background())
				}
			})
		}, `belongs to database "postgres"`},
		{"template column missing", func(t *testing.T, f *testenv.Fixture, admin *pgx.Conn, cfg *config.Config) {
			cfg.Routing.Topic = f.TopicPrefix + ".{tenant}"
		}, `no column "tenant" (routing.topic)`},
		{"generated event_type (PostgreSQL 15)", func(t *testing.T, f *testenv.Fixture, admin *pgx.Conn, cfg *config.Config) {
			adminExec(t, admin, "ALTER TABLE "+f.Table+" DROP COLUMN event_type, ADD COLUMN event_type text GENERATED ALWAYS AS (payload->>'type') STORED")
		}, `outbox column "event_type" (postgres.columns.event_type) is a generated column`},
		{"generated event_type, publication created by the router", func(t *testing.T, f *testenv.Fixture, admin *pgx.Conn, cfg *config.Config) {
			adminExec(t, admin, "DROP PUBLICATION "+f.Publication)
			adminExec(t, admin, "ALTER TABLE "+f.Table+" DROP COLUMN event_type, ADD COLUMN event_type text GENERATED ALWAYS AS (payload->>'type') STORED")
		}, "PostgreSQL before 18 never publishes generated columns"},
		{"inheritance children", func(t *testing.T, f *testenv.Fixture, admin *pgx.Conn, cfg *config.Config) {
			adminExec(t, admin, "CREATE TABLE "+f.Table+"_2026 () INHERITS ("+f.Table+")")
			t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP TABLE IF EXISTS "+f.Table+"_2026") })
		}, "has inheritance children (" + "ob_"},
		{"wal_level replica", func(t *testing.T, f *testenv.Fixture, admin *pgx.Conn, cfg *config.Config) {
			url := testenv.TempCluster(t, "wal_level = replica")
			db, err := pgx.Connect(context.Background(), url)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close(context.Background())
			adminExec(t, db, "CREATE TABLE outbox (event_id uuid PRIMARY KEY, event_type text, aggregate_id text, payload jsonb)")
			cfg.Postgres.URL = url
			cfg.Postgres.Table = "public.outbox"
		}, "ALTER SYSTEM SET wal_level = logical"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := testenv.NewFixture(t)
			admin, err := pgx.Connect(context.Background(), f.AdminURL)
			if err != nil {
				t.Fatal(err)
			}
			defer admin.Close(context.Background())
			cfg := testConfig(f)
			tt.prepare(t, f, admin, &cfg)
			p, err := New(cfg, testLogger(t))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			start := time.Now()
			err = p.Run(ctx)
			if err == nil || !permanent(err) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("run returned %v after %s, want a permanent error containing %q", err, time.Since(start).Round(time.Millisecond), tt.want)
			}
		})
	}
}

func adminExec(t *testing.T, db *pgx.Conn, sql string) {
	t.Helper()
	if _, err := db.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// TestFailoverSlot: on PostgreSQL 17 and later the slot the router creates is a failover slot, and an
// existing slot that is not one is made one before streaming (postgres.failover_slot auto); before
// 17, failover_slot=on stops the router naming the version, and auto streams from an ordinary slot.
func TestFailoverSlot(t *testing.T) {
	f := testenv.NewFixture(t)
	ctx := context.Background()
	var version int
	if err := f.DB.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		t.Fatal(err)
	}
	failover := func() bool {
		var on bool
		if err := f.DB.QueryRow(ctx, "SELECT failover FROM pg_replication_slots WHERE slot_name = $1", f.Slot).Scan(&on); err != nil {
			t.Fatal(err)
		}
		return on
	}
	if version < 170000 {
		cfg := testConfig(f)
		cfg.Postgres.FailoverSlot = "on"
		p, err := New(cfg, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := p.Run(rctx); !errors.Is(err, replication.ErrNotSetUp) || !strings.Contains(err.Error(), "17") {
			t.Fatalf("failover_slot=on on PostgreSQL %d: run returned %v, want a set-up error naming 17", version/10000, err)
		}
		run := startPipeline(t, testConfig(f))
		if h := run.p.Health(); h.PhantomRisk || !h.PhantomRiskKnown {
			t.Errorf("an ordinary slot reported phantom risk %t (known %t)", h.PhantomRisk, h.PhantomRiskKnown)
		}
		if err := run.stop(); err != nil {
			t.Fatal(err)
		}
		t.Logf("PostgreSQL %d: no failover slots; auto streams from an ordinary slot", version/10000)
		return
	}
	// An existing ordinary slot is made a failover slot.
	if _, err := f.DB.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", f.Slot); err != nil {
		t.Fatal(err)
	}
	if failover() {
		t.Fatal("a slot created without failover is a failover slot: the test proves nothing")
	}
	var logs testenv.LogBuffer
	run := startPipelineLogged(t, testConfig(f), testLoggerTo(t, &logs))
	if !failover() {
		t.Fatal("the router streams from a slot that is not a failover slot (postgres.failover_slot auto on PostgreSQL 17+)")
	}
	// The server has no synchronized_standby_slots: a failover could leave phantom events.
	if h := run.p.Health(); !h.PhantomRisk || len(h.Warnings) == 0 || !strings.Contains(logs.String(), "synchronized_standby_slots is empty") {
		t.Errorf("a failover slot without synchronized_standby_slots: phantom risk %t, warnings %q, log:\n%s", h.PhantomRisk, h.Warnings, logs.String())
	}
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	// A slot the router creates is one from the start.
	if _, err := f.DB.Exec(ctx, "SELECT pg_drop_replication_slot($1)", f.Slot); err != nil {
		t.Fatal(err)
	}
	run = startPipeline(t, testConfig(f))
	if !failover() {
		t.Fatal("the slot the router created is not a failover slot")
	}
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
}

// TestVanishedSlotIsNotRecreated drops the slot under a running router (as a failover to a server
// without it looks): the router must stop with an error pointing at resync, and must not create a new
// slot, which would silently skip what was committed in between.
func TestVanishedSlotIsNotRecreated(t *testing.T) {
	f := testenv.NewFixture(t)
	cfg := testConfig(f)
	p, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	done := make(chan error, 1)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { done <- p.Run(runCtx) }()
	testenv.WaitFor(t, 30*time.Second, "pipeline streaming", func() bool { return p.State() == StateStreaming })
	gen := testenv.NewGenerator(2, "Vanish")
	first := []testenv.Event{gen.Event(0)}
	if err := testenv.InsertTx(ctx, f.DB, f.Table, first, false); err != nil {
		t.Fatal(err)
	}
	testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Vanish"), 1, time.Minute)
	admin, err := pgx.Connect(ctx, f.AdminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	testenv.WaitFor(t, 30*time.Second, "the slot dropped under the router", func() bool {
		_, _ = admin.Exec(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL", f.Slot)
		_, err := admin.Exec(ctx, "SELECT pg_drop_replication_slot($1)", f.Slot)
		return err == nil
	})
	select {
	case err := <-done:
		if !errors.Is(err, replication.ErrSlotLost) || !strings.Contains(err.Error(), "resync") {
			t.Fatalf("run returned %v, want the vanished slot refused, pointing at resync", err)
		}
		t.Logf("refused: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the router kept running after its slot vanished")
	}
	var exists bool
	if err := admin.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1)", f.Slot).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Fatal("the router created a new slot after its slot vanished")
	}
}

// TestPromotedServerWithoutSlotIsRefused: a router started against a server promoted from a standby
// that lacks the slot (PostgreSQL before 17, or a standby the slot was never synchronized to) must
// not create a new slot there, which would silently skip what was committed between the old
// primary's last confirmed position and the failover; it stops and points at resync.
func TestPromotedServerWithoutSlotIsRefused(t *testing.T) {
	primary := testenv.NewCluster(t, "wal_level = logical")
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, primary.URL)
	if err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "sql", "outbox.sql"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, string(script)); err != nil {
		t.Fatalf("apply sql/outbox.sql: %v", err)
	}
	// A role of its own whose catalog connection cannot read the timeline from the WAL file name: the
	// refusal must not depend on that query (it once swallowed its error and created the slot); the
	// streaming connection's IDENTIFY_SYSTEM says which timeline the server is on.
	for _, stmt := range []string{"CREATE ROLE plain LOGIN REPLICATION", "REVOKE EXECUTE ON FUNCTION pg_walfile_name(pg_lsn) FROM PUBLIC"} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	_ = conn.Close(ctx)
	standby := primary.Standby(t, "sb1")
	standby.Promote(t)
	run := func(url string) error {
		cfg := config.Default()
		cfg.Postgres.URL, cfg.Kafka.Brokers = url, testenv.Brokers(t)
		p, err := New(cfg, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		return p.Run(rctx)
	}
	err = run(standby.URL)
	if !errors.Is(err, replication.ErrSlotLost) || !strings.Contains(err.Error(), "promoted") || !strings.Contains(err.Error(), "resync") {
		t.Fatalf("run on a promoted server without the slot returned %v, want a refusal naming the promotion and resync", err)
	}
	t.Logf("refused: %v", err)
	err = run(strings.Replace(standby.URL, "postgres@", "plain@", 1))
	if !errors.Is(err, replication.ErrSlotLost) || !strings.Contains(err.Error(), "promoted") {
		t.Fatalf("run as a role that may not read the WAL file name returned %v, want the same refusal", err)
	}
	t.Logf("refused: %v", err)
	check, err := pgx.Connect(ctx, standby.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer check.Close(ctx)
	var slots int
	if err := check.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'logical'").Scan(&slots); err != nil {
		t.Fatal(err)
	}
	if slots != 0 {
		t.Fatalf("%d logical slots on the promoted server, want none created", slots)
	}
}

// TestGeneratedColumnsOnPostgres18: PostgreSQL 18 can publish generated columns. A publication the
// router creates does (publish_generated_columns = stored), so a generated event_type routes every
// row; an existing publication that does not is refused at start with the statement that fixes it,
// and after that statement the router streams.
func TestGeneratedColumnsOnPostgres18(t *testing.T) {
	ctx := context.Background()
	pg := testenv.NewClusterOf(t, "18", "wal_level = logical")
	db, err := pgx.Connect(ctx, pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	adminExec(t, db, `CREATE TABLE outbox (event_id uuid PRIMARY KEY, aggregate_id text NOT NULL, payload jsonb NOT NULL,
		event_type text GENERATED ALWAYS AS (payload->>'type') STORED, created_at timestamptz NOT NULL DEFAULT now())`)
	prefix := fmt.Sprintf("t.gen18-%x", time.Now().UnixNano()&0xffffff)
	cfg := config.Default()
	cfg.Postgres.URL = pg.URL
	cfg.Kafka.Brokers = testenv.Brokers(t)
	cfg.Routing.Topic = prefix + ".{event_type}"
	cfg.Kafka.Delivery = testenv.Delivery()
	cfg.Kafka.CheckpointTopic = prefix + ".checkpoints"
	cfg.Postgres.Columns.AggregateType, cfg.Postgres.Columns.AggregateVersion, cfg.Postgres.Columns.Headers = "", "", ""

	// An existing publication without generated columns: refused, naming the fix.
	adminExec(t, db, "CREATE PUBLICATION outbox_cdc FOR TABLE outbox WITH (publish = 'insert')")
	p, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = p.Run(rctx)
	cancel()
	if err == nil || !permanent(err) || !strings.Contains(err.Error(), "publish_generated_columns = stored") {
		t.Fatalf("run returned %v, want a permanent error naming publish_generated_columns", err)
	}

	// A publication the router creates carries them.
	adminExec(t, db, "DROP PUBLICATION outbox_cdc")
	p, err = New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	runInBackground(t, p)
	testenv.WaitFor(t, time.Minute, "pipeline streaming", func() bool { return p.State() == StateStreaming })
	ids := []string{testenv.NewUUID(), testenv.NewUUID()}
	for i, id := range ids {
		if _, err := db.Exec(ctx, `INSERT INTO outbox (event_id, aggregate_id, payload) VALUES ($1, 'a1', $2)`, id, fmt.Sprintf(`{"type": "Gen%d"}`, i)); err != nil {
			t.Fatal(err)
		}
	}
	got := testenv.ConsumeDistinct(t, cfg.Kafka.Brokers, []string{prefix + ".Gen0", prefix + ".Gen1"}, len(ids), time.Minute)
	for i, id := range ids {
		found := false
		for _, r := range got {
			found = found || (testenv.EventID(r) == id && r.Topic == fmt.Sprintf("%s.Gen%d", prefix, i) && testenv.Header(r, "event_type") == fmt.Sprintf("Gen%d", i))
		}
		if !found {
			t.Errorf("event %s was not delivered to %s.Gen%d with its generated event_type", id, prefix, i)
		}
	}

	// A VIRTUAL generated column (18's default without STORED) is never published, whatever the
	// publication says: refused at start, naming STORED, even with a publication the router creates.
	adminExec(t, db, `CREATE TABLE outbox_virtual (event_id uuid PRIMARY KEY, aggregate_id text NOT NULL, payload jsonb NOT NULL,
		event_type text GENERATED ALWAYS AS (payload->>'type'), created_at timestamptz NOT NULL DEFAULT now())`)
	vcfg := cfg
	vcfg.Postgres.Table, vcfg.Postgres.Slot, vcfg.Postgres.Publication = "public.outbox_virtual", "outbox_cdc_virtual", "outbox_cdc_virtual"
	p, err = New(vcfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel = context.WithTimeout(ctx, 30*time.Second)
	err = p.Run(rctx)
	cancel()
	if err == nil || !permanent(err) || !strings.Contains(err.Error(), "VIRTUAL") || !strings.Contains(err.Error(), "STORED") {
		t.Fatalf("run on an outbox whose event_type is a VIRTUAL generated column returned %v, want a permanent error naming VIRTUAL and STORED", err)
	}
}
