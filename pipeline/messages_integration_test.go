package pipeline

import (
	"context"
	"database/sql"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql's "pgx" driver, for outbox.Emit's database/sql form
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/outbox"
	"github.com/outbox-cdc/outbox-cdc/replication"
	outboxsql "github.com/outbox-cdc/outbox-cdc/sql"
)

// messagePrefix is the prefix the tests' outbox messages are emitted under.
const messagePrefix = "outbox"

// TestOutboxMessagesKeepCommitOrder: events written as transactional WAL messages
// (postgres.message_prefixes), as rows, and as both interleaved within one transaction — rows deleted
// again by some — arrive once each, per aggregate in commit order, in both delivery modes. Messages
// of another prefix, and the messages of rolled-back transactions, never reach Kafka.
func TestOutboxMessagesKeepCommitOrder(t *testing.T) {
	forEachDelivery(t, testOutboxMessagesKeepCommitOrder)
}

func testOutboxMessagesKeepCommitOrder(t *testing.T, mode deliveryMode) {
	f := testenv.NewFixture(t)
	cfg := mode.config(f)
	cfg.Postgres.MessagePrefixes = []string{messagePrefix}
	r := startPipeline(t, cfg)
	ctx := context.Background()
	types := []string{"Placed", "Paid"}
	gen := testenv.NewGenerator(12, types...)
	stray := testenv.NewGenerator(3, types...).WithPrefix("stray-")
	rng := rand.New(rand.NewPCG(7, 51))
	var want, never []testenv.Event
	for i := 0; i < 300; i++ {
		tx, err := f.DB.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var evs []testenv.Event
		for j := rng.IntN(5); j >= 0; j-- {
			e := gen.Event(rng.IntN(12))
			if rng.IntN(2) == 0 {
				err = testenv.EmitIn(ctx, tx, messagePrefix, []testenv.Event{e})
			} else {
				err = testenv.InsertIn(ctx, tx, f.Table, []testenv.Event{e}, rng.IntN(2) == 0)
			}
			if err != nil {
				t.Fatal(err)
			}
			evs = append(evs, e)
		}
		if i%10 == 0 {
			// A message of another prefix in the same transaction: not an outbox event.
			s := stray.Event(i)
			if err := testenv.EmitIn(ctx, tx, "other", []testenv.Event{s}); err != nil {
				t.Fatal(err)
			}
			never = append(never, s)
		}
		if i%25 == 0 {
			// Rolled back: its messages were written to the WAL, but never committed.
			_ = tx.Rollback(ctx)
			never = append(never, evs...)
			continue
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		want = append(want, evs...)
	}
	// The last event is a marker: everything committed before it was read once it arrives.
	got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, types...), len(want), 2*time.Minute, mode.consumer...)
	testenv.VerifyDelivery(t, f, want, got)
	excluded := map[string]bool{}
	for _, e := range never {
		excluded[e.ID] = true
	}
	for _, rec := range got {
		if excluded[testenv.EventID(rec)] {
			t.Errorf("event %s of another prefix or a rolled-back transaction reached %s", testenv.EventID(rec), rec.Topic)
		}
	}
	h := r.p.Health()
	if h.Messages == 0 || h.Rows == 0 {
		t.Errorf("decoded %d messages and %d rows, want both", h.Messages, h.Rows)
	}
	if h.IgnoredMessages == 0 {
		t.Errorf("no message of the other prefix was counted as ignored")
	}
	t.Logf("%d events (%d messages, %d rows) delivered in commit order; %d ignored messages", len(want), h.Messages, h.Rows, h.IgnoredMessages)
}

// TestBadOutboxMessagesAreDeadLettered: each kind of message under the prefix that cannot become a
// record — not JSON, not UTF-8, not an object, a required field missing, a field of the wrong type,
// headers that are not an object, a message emitted outside a transaction — goes to the dead-letter
// topic with a reason naming what is wrong and the raw content, and the event after it is delivered:
// never a replay, never a silent drop.
func TestBadOutboxMessagesAreDeadLettered(t *testing.T) {
	forEachDelivery(t, testBadOutboxMessagesAreDeadLettered)
}

func testBadOutboxMessagesAreDeadLettered(t *testing.T, mode deliveryMode) {
	f := testenv.NewFixture(t)
	cfg := mode.config(f)
	cfg.Postgres.MessagePrefixes = []string{messagePrefix}
	cfg.Routing.DLQTopic = f.TopicPrefix + ".dlq"
	startPipeline(t, cfg)
	ctx := context.Background()
	gen := testenv.NewGenerator(1, "Placed")
	bad := []struct {
		name, sql string
		args      []any
		reason    string // what the dead-letter reason must say
		raw       string // the dead-letter value, when the content is kept as it was
	}{
		{"not JSON", `SELECT pg_logical_emit_message(true, $1, 'not json {')`, nil, "not JSON", "not json {"},
		{"not UTF-8", `SELECT pg_logical_emit_message(true, $1, '\xff7b7d'::bytea)`, nil, "not UTF-8", "\xff{}"},
		{"an array", `SELECT pg_logical_emit_message(true, $1, '[1, 2]')`, nil, "JSON array", "[1, 2]"},
		{"no event_id", `SELECT pg_logical_emit_message(true, $1, '{"event_type": "Placed", "aggregate_id": "agg-0", "payload": {}}')`, nil, `lacks field "event_id"`, ""},
		{"event_type an object", `SELECT pg_logical_emit_message(true, $1, '{"event_id": "` + testenv.NewUUID() + `", "event_type": {"a": 1}, "aggregate_id": "agg-0", "payload": {}}')`, nil, `"event_type"`, ""},
		{"headers a string", `SELECT pg_logical_emit_message(true, $1, '{"event_id": "` + testenv.NewUUID() + `", "event_type": "Placed", "aggregate_id": "agg-0", "payload": {}, "headers": "x"}')`, nil, `"headers"`, ""},
		{"outside a transaction", `SELECT pg_logical_emit_message(false, $1, '{"event_id": "` + testenv.NewUUID() + `", "event_type": "Placed", "aggregate_id": "agg-0", "payload": {}}')`, nil, "outside a transaction", ""},
	}
	var want []testenv.Event
	for _, b := range bad {
		tx, err := f.DB.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, b.sql, messagePrefix); err != nil {
			t.Fatalf("%s: %v", b.name, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		e := gen.Event(0)
		if err := emitTx(ctx, f.DB, e); err != nil {
			t.Fatal(err)
		}
		want = append(want, e)
	}
	got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Placed"), len(want), 2*time.Minute, mode.consumer...)
	testenv.VerifyDelivery(t, f, want, got)
	dlq := testenv.Consume(t, f.Brokers, []string{cfg.Routing.DLQTopic}, len(bad), time.Minute, mode.consumer...)
	if len(dlq) != len(bad) {
		t.Fatalf("the dead-letter topic holds %d records, want %d", len(dlq), len(bad))
	}
	// The dead-letter records spread over the topic's partitions (most have no key): matched by reason.
	for _, b := range bad {
		found := false
		for _, d := range dlq {
			if strings.Contains(testenv.Header(d, outbox.HeaderDLQReason), b.reason) {
				found = true
				if b.raw != "" && string(d.Value) != b.raw {
					t.Errorf("%s: the dead-letter value is %q, want the content as emitted, %q", b.name, d.Value, b.raw)
				}
			}
		}
		if !found {
			t.Errorf("%s: no dead-letter record's reason says %q", b.name, b.reason)
		}
	}
}

// emitTx writes e as an outbox message in a transaction of its own.
func emitTx(ctx context.Context, db *pgx.Conn, e testenv.Event) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := testenv.EmitIn(ctx, tx, messagePrefix, []testenv.Event{e}); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// TestEmitHelpersWriteOutboxMessages: the two ways an application writes an event as a WAL message —
// the SQL function outbox_emit (sql/outbox_emit.sql, installed by init) and outbox.Emit within a pgx
// or a database/sql transaction — deliver the event with the id they return, its key, payload and
// headers; an event emitted in a rolled-back transaction never arrives.
func TestEmitHelpersWriteOutboxMessages(t *testing.T) {
	f := testenv.NewFixture(t)
	cfg := testConfig(f)
	cfg.Postgres.MessagePrefixes = []string{messagePrefix}
	ctx := context.Background()

	// The function in a schema of the test's own, as init installs it (the server quotes the names).
	schema := strings.ReplaceAll(f.Slot, "-", "_") + "_emit"
	admin, err := pgx.Connect(ctx, f.AdminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = admin.Close(context.Background()) }()
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()+" AUTHORIZATION CURRENT_USER"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	cat, err := replication.OpenCatalog(ctx, replication.Target{URL: f.AdminURL})
	if err != nil {
		t.Fatal(err)
	}
	ddl, err := cat.EmitFunctionSQL(ctx, outboxsql.EmitTemplate(), schema, messagePrefix)
	if err == nil {
		err = cat.CreateEmitFunction(ctx, ddl)
	}
	_ = cat.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "GRANT USAGE ON SCHEMA "+pgx.Identifier{schema}.Sanitize()+" TO PUBLIC"); err != nil {
		t.Fatal(err)
	}
	startPipeline(t, cfg)

	type sent struct{ id, key, payload, header string }
	var want []sent
	// 1. The SQL function.
	var id string
	if err := f.DB.QueryRow(ctx, "SELECT "+pgx.Identifier{schema, "outbox_emit"}.Sanitize()+`('Placed', 'order', 'sql-1', '{"via": "sql"}', '{"k": "sql"}')`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	want = append(want, sent{id, "sql-1", `{"via": "sql"}`, "sql"})
	// 2. outbox.Emit in a pgx transaction; and one rolled back.
	for _, commit := range []bool{false, true} {
		tx, err := f.DB.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		id, err := outbox.Emit(ctx, tx.Exec, messagePrefix, outbox.Event{Type: "Placed", AggregateType: "order", AggregateID: "pgx-1",
			Payload: []byte(`{"via": "pgx"}`), Headers: map[string]string{"k": "pgx"}})
		if err != nil {
			t.Fatal(err)
		}
		if !commit {
			_ = tx.Rollback(ctx)
			continue
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		want = append(want, sent{id, "pgx-1", `{"via": "pgx"}`, "pgx"})
	}
	// 3. outbox.Emit in a database/sql transaction.
	db, err := sql.Open("pgx", f.PostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	stx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err = outbox.Emit(ctx, stx.ExecContext, messagePrefix, outbox.Event{Type: "Placed", AggregateType: "order", AggregateID: "sql-db-1",
		Payload: []byte(`{"via": "database/sql"}`), Headers: map[string]string{"k": "database/sql"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := stx.Commit(); err != nil {
		t.Fatal(err)
	}
	want = append(want, sent{id, "sql-db-1", `{"via": "database/sql"}`, "database/sql"})

	got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Placed"), len(want), time.Minute, testenv.ConsumerOpts()...)
	if len(got) != len(want) {
		t.Fatalf("%d records, want %d", len(got), len(want))
	}
	byID := map[string]*kgo.Record{}
	for _, r := range got {
		byID[testenv.EventID(r)] = r
	}
	for _, w := range want {
		r := byID[w.id]
		switch {
		case r == nil:
			t.Errorf("event %s (%s) did not arrive", w.id, w.header)
		case string(r.Key) != w.key || !testenv.SameJSON(r.Value, []byte(w.payload)) || testenv.Header(r, "k") != w.header:
			t.Errorf("event %s: key %q, value %s, header k %q; want %q, %s, %q", w.id, r.Key, r.Value, testenv.Header(r, "k"), w.key, w.payload, w.header)
		}
	}
}

// TestMessagesOnlySource: a source with postgres.message_prefixes and no postgres.table reads WAL
// messages alone: run creates an empty publication for the stream to name and delivers the messages
// in commit order; resync is refused, as there is nothing to snapshot.
func TestMessagesOnlySource(t *testing.T) {
	f := testenv.NewFixture(t)
	cfg := testConfig(f)
	cfg.Postgres.Table = ""
	cfg.Postgres.Publication = f.Publication + "_m"
	cfg.Postgres.MessagePrefixes = []string{messagePrefix}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	t.Cleanup(func() { _, _ = f.DB.Exec(context.Background(), "DROP PUBLICATION IF EXISTS "+cfg.Postgres.Publication) })
	startPipeline(t, cfg)
	var tables int
	if err := f.DB.QueryRow(ctx, "SELECT count(*) FROM pg_publication_tables WHERE pubname = $1", cfg.Postgres.Publication).Scan(&tables); err != nil {
		t.Fatalf("the publication was not created: %v", err)
	}
	if tables != 0 {
		t.Errorf("the publication carries %d tables, want none", tables)
	}
	gen := testenv.NewGenerator(5, "Placed")
	var want []testenv.Event
	for i := 0; i < 50; i++ {
		e := gen.Event(i)
		if err := emitTx(ctx, f.DB, e); err != nil {
			t.Fatal(err)
		}
		want = append(want, e)
	}
	got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Placed"), len(want), time.Minute, testenv.ConsumerOpts()...)
	testenv.VerifyDelivery(t, f, want, got)

	p, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Resync(ctx, ResyncOptions{Yes: true, DryRun: true}); !errors.Is(err, ErrNothingToResync) {
		t.Errorf("resync of a source of messages only: %v, want ErrNothingToResync", err)
	}
}

// TestMessagePrefixAddedToARunningSource: a change of configuration with a restart in the middle. A
// source without postgres.message_prefixes passes over the outbox messages an application emits too
// early — counted and reported once per prefix, never in silence — while its rows keep arriving;
// restarted with the prefix added, it delivers the messages emitted from then on beside the rows, per
// aggregate in commit order. (Checked by breaking it: without the report, the first half fails.)
func TestMessagePrefixAddedToARunningSource(t *testing.T) {
	f := testenv.NewFixture(t)
	cfg := testConfig(f)
	var logs testenv.LogBuffer
	r := startPipelineLogged(t, cfg, testLoggerTo(t, &logs))
	ctx := context.Background()
	gen := testenv.NewGenerator(4, "Placed")
	early := gen.Event(0)
	tx, err := f.DB.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	row := gen.Event(1)
	if err := testenv.EmitIn(ctx, tx, messagePrefix, []testenv.Event{early}); err != nil {
		t.Fatal(err)
	}
	if err := testenv.InsertIn(ctx, tx, f.Table, []testenv.Event{row}, false); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Placed"), 1, time.Minute, testenv.ConsumerOpts()...)
	if len(got) != 1 || testenv.EventID(got[0]) != row.ID {
		t.Fatalf("before the prefix is configured: %d records, want the row alone", len(got))
	}
	testenv.WaitFor(t, 10*time.Second, "the passed-over message reported", func() bool {
		return r.p.Health().IgnoredMessages >= 1 && strings.Contains(logs.String(), "passed over a WAL message") && strings.Contains(logs.String(), `prefix=`+messagePrefix)
	})
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}

	cfg.Postgres.MessagePrefixes = []string{messagePrefix}
	startPipeline(t, cfg)
	want := []testenv.Event{row}
	for i := 2; i < 42; i++ {
		e := gen.Event(i)
		tx, err := f.DB.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			err = testenv.EmitIn(ctx, tx, messagePrefix, []testenv.Event{e})
		} else {
			err = testenv.InsertIn(ctx, tx, f.Table, []testenv.Event{e}, false)
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		want = append(want, e)
	}
	got = testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Placed"), len(want), time.Minute, testenv.ConsumerOpts()...)
	for _, rec := range got {
		if testenv.EventID(rec) == early.ID {
			t.Errorf("the message emitted before its prefix was configured arrived after all: the slot had moved past it")
		}
	}
	testenv.VerifyDelivery(t, f, want, got)
}
