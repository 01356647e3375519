package replication

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// TestSnapshotBatchesAreBoundedByBytes reads large rows through a snapshot and checks that no batch
// read ahead holds more than the size set, whatever the number of rows a batch would hold by count.
func TestSnapshotBatchesAreBoundedByBytes(t *testing.T) {
	f := testenv.NewFixture(t)
	ctx := context.Background()
	const rows, blob = 120, 200 << 10 // 24 MB in all; 1000 rows a batch would be all of them
	// Small rows first, then large ones, then small again: the batch size follows the rows.
	if _, err := f.DB.Exec(ctx, "INSERT INTO "+f.Table+` (event_id, event_type, aggregate_id, payload)
		SELECT gen_random_uuid(), 'Sized', lpad(g::text, 4, '0'),
			jsonb_build_object('blob', repeat('x', CASE WHEN g <= 20 OR g > 100 THEN 10 ELSE $1 END))
		FROM generate_series(1, $2) g`, blob, rows); err != nil {
		t.Fatal(err)
	}
	schema, table := SplitTable(f.Table)
	snap, err := OpenSnapshot(ctx, Target{URL: f.PostgresURL}, "")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = snap.Close(context.Background()) }()
	const budget = 1 << 20
	snap.SetBatchBytes(budget)
	cols := SnapshotColumns{EventType: "event_type", AggregateID: "aggregate_id", Read: []string{"event_id", "aggregate_id", "payload"}}
	var got []string
	err = snap.Each(ctx, Outbox{Schema: schema, Table: table}, cols, SnapshotFilter{}, func(r *Row) error {
		v, _ := r.Value("aggregate_id")
		got = append(got, string(v))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != rows {
		t.Fatalf("read %d rows, want %d", len(got), rows)
	}
	for i, id := range got {
		if want := fmt.Sprintf("%04d", i+1); id != want {
			t.Fatalf("row %d is aggregate %s, want %s", i, id, want)
		}
	}
	// A batch ends with the row that reaches the budget: it exceeds it by less than one row.
	if limit := int64(budget + blob + 1024); snap.peakBatchBytes > limit {
		t.Errorf("largest batch held %d bytes, want at most %d", snap.peakBatchBytes, limit)
	}
	t.Logf("largest FETCH batch: %d bytes (budget %d)", snap.peakBatchBytes, budget)
}

// TestSnapshotStopsWhenTheCallerFails checks that an error from the caller ends Each at once with
// that error, however many rows remain, and that the snapshot still closes.
func TestSnapshotStopsWhenTheCallerFails(t *testing.T) {
	f := testenv.NewFixture(t)
	ctx := context.Background()
	if _, err := f.DB.Exec(ctx, "INSERT INTO "+f.Table+` (event_id, event_type, aggregate_id, payload)
		SELECT gen_random_uuid(), 'Many', g::text, '{}' FROM generate_series(1, 200000) g`); err != nil {
		t.Fatal(err)
	}
	schema, table := SplitTable(f.Table)
	snap, err := OpenSnapshot(ctx, Target{URL: f.PostgresURL}, "")
	if err != nil {
		t.Fatal(err)
	}
	cols := SnapshotColumns{EventType: "event_type", AggregateID: "aggregate_id", Read: []string{"event_id"}}
	stop := errors.New("stop here")
	n := 0
	err = snap.Each(ctx, Outbox{Schema: schema, Table: table}, cols, SnapshotFilter{}, func(*Row) error {
		if n++; n == 1500 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || n != 1500 {
		t.Fatalf("Each returned %v after %d rows, want the caller's error after 1500", err, n)
	}
	if err := snap.Close(ctx); err != nil {
		t.Fatalf("close after a stopped read: %v", err)
	}
}

// TestSnapshotInParts reads a table in parts over two connections: every row exactly once (rows
// without an aggregate included), each aggregate's rows in order, whatever the number of parts; and
// an error of the caller ends the reading at once, and the connections close.
func TestSnapshotInParts(t *testing.T) {
	f := testenv.NewFixture(t)
	ctx := context.Background()
	if _, err := f.DB.Exec(ctx, "ALTER TABLE "+f.Table+" ALTER COLUMN aggregate_id DROP NOT NULL"); err != nil {
		t.Fatal(err)
	}
	const rows, aggs = 20000, 97
	if _, err := f.DB.Exec(ctx, "INSERT INTO "+f.Table+` (event_id, event_type, aggregate_id, aggregate_version, payload)
		SELECT gen_random_uuid(), 'Parted', CASE WHEN g % 5000 = 0 THEN NULL ELSE 'agg-' || (g % $2) END, g, '{}'
		FROM generate_series(1, $1) g`, rows, aggs); err != nil {
		t.Fatal(err)
	}
	schema, table := SplitTable(f.Table)
	o := Outbox{Schema: schema, Table: table}
	var snaps []*Snapshot
	for range 2 {
		snap, err := OpenSnapshot(ctx, Target{URL: f.PostgresURL}, "")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = snap.Close(context.Background()) }()
		snaps = append(snaps, snap)
	}
	cols := SnapshotColumns{EventType: "event_type", AggregateID: "aggregate_id", AggregateVersion: "aggregate_version",
		Read: []string{"event_id", "aggregate_id", "aggregate_version"}}
	for _, parts := range []int{1, 2, 3, 7} {
		seen := map[string]bool{}
		last := map[string]int{} // aggregate -> last version
		nulls := 0
		err := EachInParts(ctx, snaps, o, cols, SnapshotFilter{}, parts, func(r *Row) error {
			id, _ := r.Value("event_id")
			if seen[string(id)] {
				return fmt.Errorf("event %s twice", id)
			}
			seen[string(id)] = true
			agg, ok := r.Value("aggregate_id")
			if !ok {
				nulls++
				return nil
			}
			v, _ := r.Value("aggregate_version")
			var version int
			if _, err := fmt.Sscan(string(v), &version); err != nil {
				return err
			}
			if version <= last[string(agg)] {
				return fmt.Errorf("aggregate %s: version %d after %d", agg, version, last[string(agg)])
			}
			last[string(agg)] = version
			return nil
		})
		if err != nil {
			t.Fatalf("%d parts: %v", parts, err)
		}
		if len(seen) != rows || nulls != rows/5000 || len(last) != aggs {
			t.Fatalf("%d parts: %d rows (%d without an aggregate) over %d aggregates, want %d (%d) over %d", parts, len(seen), nulls, len(last), rows, rows/5000, aggs)
		}
	}
	stop := errors.New("stop here")
	n := 0
	err := EachInParts(ctx, snaps, o, cols, SnapshotFilter{}, 3, func(*Row) error {
		if n++; n == 9000 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || n != 9000 {
		t.Fatalf("EachInParts after the caller failed at row 9000: %v after %d rows", err, n)
	}
}
