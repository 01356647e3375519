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
	snap, err := OpenSnapshot(ctx, f.PostgresURL, "")
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
	snap, err := OpenSnapshot(ctx, f.PostgresURL, "")
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
