package pipeline

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// roleWithSettings creates a login role with REPLICATION whose own settings (ALTER ROLE ... SET) are
// the given ones, grants it the fixture's table, and returns the fixture's URL for that role. Role and
// database settings apply to every session of the role, replication connections included.
func roleWithSettings(t *testing.T, f *testenv.Fixture, settings ...string) string {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, f.AdminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = admin.Close(ctx) }()
	role := "r_" + strings.TrimPrefix(f.Slot, "slot_")
	if len(role) > 63 {
		role = role[:63]
	}
	stmts := []string{
		fmt.Sprintf("CREATE ROLE %s LOGIN REPLICATION PASSWORD 'settings-secret'", role),
		fmt.Sprintf("GRANT SELECT ON %s TO %s", f.Table, role),
	}
	for _, s := range settings {
		stmts = append(stmts, fmt.Sprintf("ALTER ROLE %s SET %s", role, s))
	}
	for _, s := range stmts {
		if _, err := admin.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		admin, err := pgx.Connect(ctx, f.AdminURL)
		if err != nil {
			t.Errorf("clean up role: %v", err)
			return
		}
		defer func() { _ = admin.Close(ctx) }()
		_, _ = admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, role)
		_, _ = admin.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = ANY($1) AND NOT active`, []string{f.Slot, f.Slot + "_resync"})
		if _, err := admin.Exec(ctx, "DROP OWNED BY "+role); err != nil {
			t.Errorf("clean up role: %v", err)
		}
		if _, err := admin.Exec(ctx, "DROP ROLE "+role); err != nil {
			t.Errorf("clean up role: %v", err)
		}
	})
	u, err := url.Parse(f.PostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, "settings-secret")
	return u.String()
}

// valueRow is one row of TestValuesUnderAnySessionSettings: SQL expressions for the extra columns and
// created_at, and the created_at header the record must carry ("" when any non-empty value will do).
type valueRow struct {
	name                                        string
	expiresAt, day, ts, tod, todTZ, iv, created string
	wantCreated                                 string
}

// TestValuesUnderAnySessionSettings: no value and no session setting of the role stops the stream.
// The outbox has temporal columns the router does not read (timestamptz, date, timestamp, time, timetz,
// interval) holding infinities and BC dates, created_at holding them too, and a bytea payload; the role
// that streams has DateStyle, IntervalStyle, bytea_output and TimeZone of its own. Every row is
// delivered by run and again by resync, created_at is RFC 3339 in UTC (infinity as itself), and the
// bytea payload is its raw bytes.
func TestValuesUnderAnySessionSettings(t *testing.T) {
	rows := []valueRow{
		{"finite", "'2026-12-03 10:00:00+00'", "'2026-12-03'", "'2026-12-03 10:00:00'", "'10:00'", "'10:00+02'", "'1 day 02:00:00'", "'2026-12-03 10:00:00.5+01'", "2026-12-03T09:00:00.5Z"},
		{"infinity", "'infinity'", "'infinity'", "'infinity'", "'23:59:59'", "'00:00+14'", "'-1 year -2 mons +3 days -04:05:06'", "'infinity'", "infinity"},
		{"minus-infinity", "'-infinity'", "'-infinity'", "'-infinity'", "'00:00'", "'00:00-12'", "'0'", "'-infinity'", "-infinity"},
		{"bc", "'0044-03-15 12:00:00+00 BC'", "'4713-01-01 BC'", "'0001-01-01 00:00:00 BC'", "'12:00:00.123456'", "'12:00:00.5+05:30'", "'178000000 years'", "'0044-03-15 12:00:00+00 BC'", ""},
		{"far-future", "'294276-12-31 23:59:59+00'", "'5874897-12-31'", "'294276-12-31 23:59:59'", "'24:00:00'", "'24:00:00-15:59'", "'-178000000 years'", "'10000-01-01 00:00:00+00'", ""},
	}
	settings := []struct {
		name         string
		payloadBytea bool
		set          []string
	}{
		{"defaults", false, nil},
		{"sql-dmy-escape", true, []string{"DateStyle = 'SQL, DMY'", "IntervalStyle = 'sql_standard'", "bytea_output = 'escape'", "TimeZone = 'Asia/Kolkata'"}},
		{"german-hex", true, []string{"DateStyle = 'German'", "IntervalStyle = 'iso_8601'", "bytea_output = 'hex'", "TimeZone = 'America/St_Johns'"}},
		{"postgres-mdy", false, []string{"DateStyle = 'Postgres, MDY'", "IntervalStyle = 'postgres_verbose'", "TimeZone = 'Pacific/Chatham'"}},
	}
	for _, st := range settings {
		t.Run(st.name, func(t *testing.T) {
			f := testenv.NewFixture(t)
			ctx := context.Background()
			if _, err := f.DB.Exec(ctx, "ALTER TABLE "+f.Table+" ADD COLUMN expires_at timestamptz, ADD COLUMN day date, ADD COLUMN ts timestamp, "+
				"ADD COLUMN tod time, ADD COLUMN tod_tz timetz, ADD COLUMN iv interval, ADD COLUMN raw bytea"); err != nil {
				t.Fatal(err)
			}
			payload := func(i int) (expr string, want string) {
				return fmt.Sprintf(`'{"row": %d}'`, i), fmt.Sprintf(`{"row": %d}`, i)
			}
			if st.payloadBytea {
				if _, err := f.DB.Exec(ctx, "ALTER TABLE "+f.Table+" ALTER COLUMN payload TYPE bytea USING convert_to(payload::text, 'UTF8')"); err != nil {
					t.Fatal(err)
				}
				// Bytes escape output spells out: a backslash, a quote, high and low bytes.
				payload = func(i int) (string, string) {
					return fmt.Sprintf(`'\x5c27%02x00ff0a'::bytea`, i), "\\'" + string([]byte{byte(i), 0, 0xff, '\n'})
				}
			}
			cfg := testConfig(f)
			cfg.Postgres.URL = roleWithSettings(t, f, st.set...)
			insert := func(prefix string) (ids []string, want map[string]valueRow, payloads map[string]string) {
				want, payloads = map[string]valueRow{}, map[string]string{}
				for i, r := range rows {
					id := testenv.NewUUID()
					expr, wantPayload := payload(i)
					if _, err := f.DB.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (event_id, event_type, aggregate_id, payload, expires_at, day, ts, tod, tod_tz, iv, raw, created_at)
						VALUES ($1, 'Values', $2, %s, %s, %s, %s, %s, %s, %s, '\x00ff5c', %s)`, f.Table, expr, r.expiresAt, r.day, r.ts, r.tod, r.todTZ, r.iv, r.created),
						id, prefix+r.name); err != nil {
						t.Fatalf("insert row %s: %v", r.name, err)
					}
					ids = append(ids, id)
					want[id], payloads[id] = r, wantPayload
				}
				return ids, want, payloads
			}
			check := func(what string, ids []string, want map[string]valueRow, payloads map[string]string, got []*kgo.Record) {
				t.Helper()
				byID := map[string]*kgo.Record{} // the last copy of each event
				for _, r := range got {
					byID[testenv.EventID(r)] = r
				}
				for _, id := range ids {
					r, ok := byID[id]
					if !ok {
						t.Errorf("%s: row %s (%s) was not delivered", what, want[id].name, id)
						continue
					}
					created := testenv.Header(r, "created_at")
					if w := want[id].wantCreated; w != "" && created != w || w == "" && created == "" {
						t.Errorf("%s: row %s: created_at header %q, want %q", what, want[id].name, created, w)
					}
					if string(r.Value) != payloads[id] {
						t.Errorf("%s: row %s: value %q, want %q", what, want[id].name, r.Value, payloads[id])
					}
				}
			}

			// run: the rows are written while the router streams.
			run := startPipeline(t, cfg)
			ids, want, payloads := insert("run-")
			got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Values"), len(ids), time.Minute)
			check("run", ids, want, payloads, got)
			if err := run.stop(); err != nil {
				t.Fatalf("run: %v", err)
			}

			// resync: the same rows, and the earlier ones, read back from a snapshot of the table.
			ids2, want2, payloads2 := insert("resync-")
			for id, r := range want {
				want2[id], payloads2[id] = r, payloads[id]
			}
			ids2 = append(ids2, ids...)
			p, err := New(cfg, testLogger(t))
			if err != nil {
				t.Fatal(err)
			}
			res, err := p.Resync(ctx, ResyncOptions{Yes: true, SnapshotOnly: true})
			if err != nil {
				t.Fatalf("resync: %v", err)
			}
			if res.Rows != int64(len(ids2)) {
				t.Errorf("resync published %d rows, want %d", res.Rows, len(ids2))
			}
			got = testenv.ConsumeUntil(t, f.Brokers, testenv.TopicsOf(f, "Values"), func(recs []*kgo.Record) bool { return len(recs) >= len(ids)+len(ids2) }, time.Minute)
			// A key's records share a partition, read in order: the last copy of a run row is resync's.
			check("resync", ids2, want2, payloads2, got)
		})
	}
}

// TestBytesOfAnSQLASCIIDatabasePassThrough: an SQL_ASCII database stores any bytes in text. The
// server, converting them to a UTF8 connection, refused a row whose bytes are not UTF-8: the walsender
// ended the stream at that row on every replay, and one row stopped the outbox for good. Now the
// bytes pass through as stored — key, value and header — by the stream and by resync, and a topic
// name they make invalid is dead-lettered with its reason, the rows around it delivered.
func TestBytesOfAnSQLASCIIDatabasePassThrough(t *testing.T) {
	f := testenv.NewDatabaseFixtureWith(t, "ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
	ctx := context.Background()
	cfg := testConfig(f)
	cfg.Routing.DLQTopic = f.TopicPrefix + ".dlq"
	type row struct{ id, eventType, aggID, payload, headers string }
	stored := row{testenv.NewUUID(), "Stored", "agg-\xff", "{\"name\": \"Ren\xe9e\"}", "{\"x-note\": \"caf\xe9\"}"}
	badTopic := row{testenv.NewUUID(), "Stor\xe9d", "agg-2", `{"n": 2}`, `{}`}
	plain := row{testenv.NewUUID(), "Stored", "agg-3", `{"n": 3}`, `{}`}
	insert := func(r row) {
		t.Helper()
		// convert_from(..., 'SQL_ASCII') takes the bytes as they are, whatever the client's encoding.
		if _, err := f.DB.Exec(ctx, `INSERT INTO `+f.Table+` (event_id, event_type, aggregate_type, aggregate_id, aggregate_version, payload, headers)
			VALUES ($1, convert_from($2, 'SQL_ASCII'), 'order', convert_from($3, 'SQL_ASCII'), 1, convert_from($4, 'SQL_ASCII')::jsonb, convert_from($5, 'SQL_ASCII')::jsonb)`,
			r.id, []byte(r.eventType), []byte(r.aggID), []byte(r.payload), []byte(r.headers)); err != nil {
			t.Fatal(err)
		}
	}
	check := func(what string, recs []*kgo.Record, want int) {
		t.Helper()
		found := 0
		for _, r := range recs {
			if testenv.Header(r, "event_id") != stored.id {
				continue
			}
			found++
			if string(r.Key) != stored.aggID || string(r.Value) != stored.payload || testenv.Header(r, "x-note") != "caf\xe9" {
				t.Errorf("%s: the row came as key %q, value %q, x-note %q; want the bytes as stored: %q, %q, %q",
					what, r.Key, r.Value, testenv.Header(r, "x-note"), stored.aggID, stored.payload, "caf\xe9")
			}
		}
		if found != want {
			t.Errorf("%s: the row with bytes that are not UTF-8 arrived %d times, want %d", what, found, want)
		}
	}

	run := startPipeline(t, cfg)
	for _, r := range []row{stored, badTopic, plain} {
		insert(r)
	}
	topics := testenv.TopicsOf(f, "Stored")
	got := testenv.ConsumeDistinct(t, f.Brokers, topics, 2, time.Minute, testenv.ConsumerOpts()...)
	check("stream", got, 1)
	dlq := testenv.Consume(t, f.Brokers, []string{cfg.Routing.DLQTopic}, 1, time.Minute, testenv.ConsumerOpts()...)
	if len(dlq) == 0 {
		t.Fatal("nothing dead-lettered: want the row whose event_type makes an invalid topic name")
	}
	if testenv.Header(dlq[0], "event_id") != badTopic.id || !strings.Contains(testenv.Header(dlq[0], "outbox.dlq.reason"), "not a valid Kafka topic name") {
		t.Errorf("dead-letter record %s with reason %q; want %s for its invalid topic name", testenv.Header(dlq[0], "event_id"), testenv.Header(dlq[0], "outbox.dlq.reason"), badTopic.id)
	}
	if h := run.p.Health(); h.Restarts != 0 {
		t.Errorf("%d sessions rebuilt: want none (the stream must pass the bytes, not fail on them)", h.Restarts)
	}
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}

	// resync reads the same rows from the table.
	p, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	res, err := p.Resync(ctx, ResyncOptions{Yes: true, SnapshotOnly: true})
	if err != nil {
		t.Fatalf("resync: %v", err)
	}
	if res.Rows != 3 {
		t.Errorf("resync published %d rows, want 3", res.Rows)
	}
	all := testenv.Consume(t, f.Brokers, topics, 4, time.Minute, testenv.ConsumerOpts()...)
	check("stream, then resync", all, 2)
}
