package pipeline

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// stampedTx inserts one transaction of rows of event type et, each with the given value of the
// stamp column (an SQL expression; "" leaves the column out), and returns their event ids and the
// interval the commit fell in (clock_timestamp() just before COMMIT, and just after it).
func stampedTx(t *testing.T, f *testenv.Fixture, et string, stamps ...string) (ids []string, from, to time.Time) {
	t.Helper()
	ctx := context.Background()
	tx, err := f.DB.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, stamp := range stamps {
		id := testenv.NewUUID()
		expr := "NULL"
		if stamp != "" {
			expr = stamp
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+f.Table+" (event_id, event_type, aggregate_id, payload, stamp) VALUES ($1, $2, $3, '{}', "+expr+")", id, et, id); err != nil {
			t.Fatalf("insert (stamp %s): %v", expr, err)
		}
		ids = append(ids, id)
	}
	if err := tx.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&from); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.DB.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&to); err != nil {
		t.Fatal(err)
	}
	return ids, from, to
}

// between reports whether a record's timestamp (milliseconds) lies in [from, to], widened by the
// millisecond Kafka truncates to.
func between(ts, from, to time.Time) bool {
	return !ts.Before(from.Truncate(time.Millisecond)) && !ts.After(to)
}

// TestRecordTimestamps: a record's Kafka timestamp is its transaction's commit time by default — the
// rows are committed while no router runs, and the router starts two seconds later — the produce time
// with kafka.record_timestamp produce, and the value of postgres.columns.timestamp when set (a NULL
// there falls back to the commit time). A column value the topic would refuse (two hours ahead: Kafka
// 4 refuses more than message.timestamp.after.max.ms, one hour by default) or delete at once (30 days
// old, beyond the topic's seven days of retention) gives the produce time instead, and nothing stops.
func TestRecordTimestamps(t *testing.T) {
	f := testenv.NewFixture(t)
	ctx := context.Background()
	if _, err := f.DB.Exec(ctx, "ALTER TABLE "+f.Table+" ADD COLUMN stamp timestamptz"); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(f)
	cfg.Kafka.RecordTimestamp = config.Default().Kafka.RecordTimestamp
	// The slot is created by the first session; everything after is committed while no router runs.
	run := startPipeline(t, cfg)
	warm, _, _ := stampedTx(t, f, "Warm", "")
	testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Warm"), len(warm), time.Minute)
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	consume := func(et string, ids []string) map[string]*kgo.Record {
		t.Helper()
		byID := map[string]*kgo.Record{}
		for _, r := range testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, et), len(ids), time.Minute) {
			byID[testenv.EventID(r)] = r
		}
		return byID
	}

	t.Run("commit time", func(t *testing.T) {
		ids, from, to := stampedTx(t, f, "Commit", "", "", "")
		time.Sleep(2 * time.Second)
		run := startPipeline(t, cfg)
		defer func() { _ = run.stop() }()
		got := consume("Commit", ids)
		for _, id := range ids {
			r := got[id]
			if r == nil || !between(r.Timestamp, from, to) {
				t.Fatalf("record %s: timestamp %v, want the commit time, in [%v, %v]", id, r.Timestamp, from, to)
			}
		}
	})

	t.Run("produce time", func(t *testing.T) {
		ids, _, to := stampedTx(t, f, "Produce", "", "")
		time.Sleep(2 * time.Second)
		started := time.Now()
		c := cfg
		c.Kafka.RecordTimestamp = config.RecordTimestampProduce
		run := startPipeline(t, c)
		defer func() { _ = run.stop() }()
		got := consume("Produce", ids)
		for _, id := range ids {
			if r := got[id]; r == nil || r.Timestamp.Before(started.Truncate(time.Millisecond)) || !r.Timestamp.After(to.Add(time.Second)) {
				t.Fatalf("record %s: timestamp %v, want the produce time (after %v)", id, got[id].Timestamp, started)
			}
		}
	})

	t.Run("column", func(t *testing.T) {
		var hourAgo time.Time
		if err := f.DB.QueryRow(ctx, "SELECT date_trunc('milliseconds', now() - interval '1 hour')").Scan(&hourAgo); err != nil {
			t.Fatal(err)
		}
		ids, from, to := stampedTx(t, f, "Column",
			"'"+hourAgo.Format(time.RFC3339Nano)+"'", // its own value
			"",                           // NULL: the commit time
			"now() + interval '2 hours'", // the broker would refuse it
			"now() - interval '30 days'", // retention would delete it
		)
		time.Sleep(2 * time.Second)
		started := time.Now()
		c := cfg
		c.Postgres.Columns.Timestamp = "stamp"
		run := startPipeline(t, c)
		defer func() { _ = run.stop() }()
		got := consume("Column", ids)
		if r := got[ids[0]]; r == nil || !r.Timestamp.Equal(hourAgo) {
			t.Errorf("stamp an hour ago: timestamp %v, want %v", r.Timestamp, hourAgo)
		}
		if r := got[ids[1]]; r == nil || !between(r.Timestamp, from, to) {
			t.Errorf("stamp NULL: timestamp %v, want the commit time in [%v, %v]", r.Timestamp, from, to)
		}
		for i, what := range map[int]string{2: "two hours ahead", 3: "30 days old"} {
			if r := got[ids[i]]; r == nil || r.Timestamp.Before(started.Truncate(time.Millisecond)) || r.Timestamp.After(time.Now()) {
				t.Errorf("stamp %s: timestamp %v, want the produce time (after %v)", what, r.Timestamp, started)
			}
		}
	})
}
