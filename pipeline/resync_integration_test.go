package pipeline

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// TestResyncNoGapNoOverlap: 20,000 rows exist and several writers keep inserting while resync starts,
// some of them holding their transactions open so that they straddle the slot's consistent point;
// every event arrives exactly once — from the snapshot if committed before the slot, from the WAL if
// after — and per-aggregate order holds across the boundary.
func TestResyncNoGapNoOverlap(t *testing.T) {
	f := testenv.NewFixture(t)
	gen := testenv.NewGenerator(50, "OrderCreated", "OrderPaid")
	preloaded := testenv.Preload(t, f, gen, 20000)
	// Concurrent writers commit in an order of their own: each has its own aggregates.
	writers := []*testenv.Writer{
		testenv.StartWriter(t, f, testenv.NewGenerator(10, "OrderCreated", "OrderPaid").WithPrefix("fast-a-"), 2, 2*time.Millisecond, false),
		testenv.StartWriter(t, f, testenv.NewGenerator(10, "OrderCreated", "OrderPaid").WithPrefix("fast-b-"), 3, 3*time.Millisecond, false),
		testenv.StartSlowWriter(t, f, testenv.NewGenerator(10, "OrderCreated", "OrderPaid").WithPrefix("slow-a-"), 3, 5*time.Millisecond, 150*time.Millisecond),
		testenv.StartSlowWriter(t, f, testenv.NewGenerator(10, "OrderCreated", "OrderPaid").WithPrefix("slow-b-"), 2, 0, 70*time.Millisecond),
	}
	// Let the writers get going, so that transactions straddle the slot's creation.
	testenv.WaitFor(t, time.Minute, "writers running", func() bool { return writers[2].Written() > 10 && writers[0].Written() > 100 })
	p, err := New(testConfig(f), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	p.rowsPerPart = 4000 // the snapshot in parts over two connections (6 here), as a large table is read
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var res ResyncResult
	resyncDone := make(chan error, 1)
	go func() {
		var err error
		res, err = p.Resync(ctx, ResyncOptions{Yes: true})
		resyncDone <- err
	}()
	testenv.WaitFor(t, 2*time.Minute, "resync streaming after the snapshot", func() bool { return p.State() == StateStreaming })
	time.Sleep(2 * time.Second)
	want := preloaded
	for _, w := range writers {
		written, err := w.Stop()
		if err != nil {
			t.Fatalf("writer: %v", err)
		}
		want = append(want, written...)
	}
	got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "OrderCreated", "OrderPaid"), len(want), 3*time.Minute)
	dups := testenv.VerifyDelivery(t, f, want, got)
	cancel()
	if err := <-resyncDone; err != nil {
		t.Fatalf("resync: %v", err)
	}
	streamed := p.Replication.Rows.Load()
	t.Logf("%d events: %d from the snapshot, %d from the WAL, %d duplicates in Kafka", len(want), res.Rows, streamed, dups)
	if dups != 0 {
		t.Errorf("%d events arrived twice: the snapshot and the stream overlap", dups)
	}
	if res.Rows+streamed != int64(len(want)) {
		t.Errorf("snapshot %d + stream %d = %d rows, want %d: a gap or an overlap at the boundary", res.Rows, streamed, res.Rows+streamed, len(want))
	}
	if res.Rows <= 20000 || streamed == 0 {
		t.Errorf("snapshot held %d rows and the stream %d: the writers did not straddle the slot's creation", res.Rows, streamed)
	}
}

// TestResyncDryRunAndFilters: --dry-run counts per topic and changes nothing; filters publish exactly
// the rows they select.
func TestResyncDryRunAndFilters(t *testing.T) {
	f := testenv.NewFixture(t)
	ctx := context.Background()
	gen := testenv.NewGenerator(4, "OrderCreated", "OrderPaid", "OrderShipped")
	all := testenv.Preload(t, f, gen, 300)
	// Back-date a third of the rows.
	if _, err := f.DB.Exec(ctx, "UPDATE "+f.Table+" SET created_at = '2026-01-01T00:00:00Z' WHERE aggregate_version % 3 = 0"); err != nil {
		t.Fatal(err)
	}
	p, err := New(testConfig(f), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	res, err := p.Resync(ctx, ResyncOptions{DryRun: true, Out: &out})
	if err != nil {
		t.Fatal(err)
	}
	if res.Rows != int64(len(all)) {
		t.Fatalf("dry run counted %d rows, want %d", res.Rows, len(all))
	}
	for _, typ := range []string{"OrderCreated", "OrderPaid", "OrderShipped"} {
		if n := res.PerTopic[f.TopicPrefix+"."+typ]; n != 100 {
			t.Errorf("dry run: %d rows for %s, want 100", n, typ)
		}
		if !strings.Contains(out.String(), f.TopicPrefix+"."+typ) {
			t.Errorf("dry-run output does not name topic %s:\n%s", typ, out.String())
		}
	}
	if f.ConfirmedFlushLSN(t) != "" {
		t.Fatal("dry run created the slot")
	}

	since := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	var want []testenv.Event
	var versions = map[string]int64{}
	for _, e := range all {
		versions[e.ID] = e.Version
		if e.Type == "OrderPaid" && e.AggID == "agg-1" && e.Version%3 != 0 {
			want = append(want, e)
		}
	}
	res, err = p.Resync(ctx, ResyncOptions{Yes: true, SnapshotOnly: true, Since: since, EventTypes: []string{"OrderPaid"}, AggregateIDs: []string{"agg-1"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Rows != int64(len(want)) {
		t.Fatalf("resync published %d rows, want %d", res.Rows, len(want))
	}
	got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "OrderCreated", "OrderPaid", "OrderShipped"), len(want), time.Minute)
	if len(got) != len(want) {
		t.Fatalf("Kafka holds %d records, want exactly the %d selected", len(got), len(want))
	}
	testenv.VerifyDelivery(t, f, want, got)
	if f.ConfirmedFlushLSN(t) == "" {
		t.Fatal("--snapshot-only did not leave the slot for a later run")
	}
}

// TestResyncRefusals: a slot held by a running router stops resync; an existing slot is not dropped
// without --yes.
func TestResyncRefusals(t *testing.T) {
	f := testenv.NewFixture(t)
	run := startPipeline(t, testConfig(f))
	p, err := New(testConfig(f), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	_, err = p.Resync(context.Background(), ResyncOptions{Yes: true, Out: &out})
	if !errors.Is(err, replication.ErrSlotInUse) || !strings.Contains(err.Error(), "running router") {
		t.Fatalf("resync on an active slot: %v", err)
	}
	if !strings.Contains(out.String(), "active=true") {
		t.Errorf("resync did not print the slot's state: %q", out.String())
	}
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	asked := ""
	_, err = p.Resync(context.Background(), ResyncOptions{Confirm: func(q string) bool { asked = q; return false }})
	if err == nil || !strings.Contains(err.Error(), "--yes") {
		t.Fatalf("resync without --yes on an existing slot: %v", err)
	}
	if !strings.Contains(asked, f.Slot) {
		t.Fatalf("confirmation question %q does not name the slot", asked)
	}
}

// TestResyncKeepsPerAggregateOrder: snapshot rows reach each key in version order, even when
// created_at (the inserting transaction's start) and the physical order say otherwise.
func TestResyncKeepsPerAggregateOrder(t *testing.T) {
	f := testenv.NewFixture(t)
	gen := testenv.NewGenerator(2, "Ordered")
	var evs []testenv.Event
	for i := 0; i < 12; i++ {
		evs = append(evs, gen.Event(i))
	}
	// Insert the newest versions first, with the earliest created_at.
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := len(evs) - 1; i >= 0; i-- {
		insertAt(t, f, base.Add(time.Duration(len(evs)-i)*time.Minute), []testenv.Event{evs[i]})
	}
	p, err := New(testConfig(f), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Resync(context.Background(), ResyncOptions{Yes: true, SnapshotOnly: true}); err != nil {
		t.Fatal(err)
	}
	got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Ordered"), len(evs), time.Minute)
	testenv.VerifyDelivery(t, f, evs, got)
}

// TestResyncLeavesNoMarkerWhenTheOldSlotCannotBeDropped: when dropping the existing slot fails (a
// router grabbed it after resync looked), resync stops and leaves no marker behind: the old slot is
// intact and run may use it.
func TestResyncLeavesNoMarkerWhenTheOldSlotCannotBeDropped(t *testing.T) {
	f := testenv.NewFixture(t)
	run := startPipeline(t, testConfig(f))
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	p, err := New(testConfig(f), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	var holder *running
	_, err = p.Resync(context.Background(), ResyncOptions{Confirm: func(string) bool {
		holder = startPipeline(t, testConfig(f)) // takes the slot between resync's look and its drop
		return true
	}})
	if !errors.Is(err, replication.ErrSlotInUse) {
		t.Fatalf("resync returned %v, want the slot in use", err)
	}
	var marker bool
	if err := f.DB.QueryRow(context.Background(), "SELECT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1)", replication.ResyncMarker(f.Slot)).Scan(&marker); err != nil {
		t.Fatal(err)
	}
	if marker {
		t.Fatal("resync left its marker behind though the old slot was never dropped")
	}
	if err := holder.stop(); err != nil {
		t.Fatalf("the router on the intact slot: %v", err)
	}
}

// TestRouterWaitsWhileResyncRuns: a router started while a resync publishes its snapshot waits as a
// standby (the marker exists, but a resync is alive) instead of exiting, and streams once it is done.
func TestRouterWaitsWhileResyncRuns(t *testing.T) {
	f := testenv.NewFixture(t)
	gen := testenv.NewGenerator(20, "Waited")
	preloaded := testenv.Preload(t, f, gen, 20000)
	cfg := testConfig(f)
	cfg.Limits.MaxInFlightRecords = 50 // a slow snapshot
	resyncer, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	resynced := make(chan error, 1)
	go func() {
		_, err := resyncer.Resync(context.Background(), ResyncOptions{Yes: true, SnapshotOnly: true})
		resynced <- err
	}()
	testenv.WaitFor(t, time.Minute, "the resync marker", func() bool {
		var marker bool
		_ = f.DB.QueryRow(context.Background(), "SELECT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1)", replication.ResyncMarker(f.Slot)).Scan(&marker)
		return marker
	})
	router, err := New(testConfig(f), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	done := runInBackground(t, router)
	sawStandby := false
	for {
		select {
		case err := <-resynced:
			if err != nil {
				t.Fatalf("resync: %v", err)
			}
			if !sawStandby {
				t.Fatal("the snapshot was published before the router was seen waiting: make it slower")
			}
			testenv.WaitFor(t, time.Minute, "the router to stream after the resync", func() bool { return router.State() == StateStreaming })
			got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Waited"), len(preloaded), 2*time.Minute)
			testenv.VerifyDelivery(t, f, preloaded, got)
			return
		case err := <-done:
			t.Fatalf("the router stopped while a resync ran: %v", err)
		case <-time.After(50 * time.Millisecond):
			sawStandby = sawStandby || router.State() == StateStandby
		}
	}
}

// TestResyncOrdersByTransactionWhenPagesAreReused: without a version column, and with created_at the
// same (set by the application to one second), an aggregate's events come from the snapshot in the
// order of their transactions and, within one, of their statements — not by physical position, which
// vacuumed and reused space turns around: the later event lies in an earlier page.
func TestResyncOrdersByTransactionWhenPagesAreReused(t *testing.T) {
	f := testenv.NewFixture(t)
	ctx := context.Background()
	cfg := testConfig(f)
	cfg.Postgres.Columns.AggregateVersion = "" // order by version would hide the rest
	exec := func(db *pgx.Conn, sql string, args ...any) {
		t.Helper()
		if _, err := db.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	// Rows stored as they are (no compression), so that a page holds a known few of them.
	exec(f.DB, "ALTER TABLE "+f.Table+" ALTER COLUMN payload SET STORAGE PLAIN")
	exec(f.DB, "INSERT INTO "+f.Table+` (event_id, event_type, aggregate_id, payload)
		SELECT gen_random_uuid(), 'Filler', 'filler-' || g, jsonb_build_object('blob', repeat('x', 2000)) FROM generate_series(1, 100) g`)
	at := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	gen := testenv.NewGenerator(1, "Ordered")
	var evs []testenv.Event
	insert := func(db *pgx.Conn, size int) {
		t.Helper()
		e := gen.Event(0)
		e.Payload = fmt.Sprintf(`{"n": %d, "blob": %q}`, len(evs), strings.Repeat("y", size))
		exec(db, "INSERT INTO "+f.Table+` (event_id, event_type, aggregate_type, aggregate_id, payload, created_at) VALUES ($1, $2, $3, $4, $5, $6)`,
			e.ID, e.Type, e.AggType, e.AggID, e.Payload, at)
		evs = append(evs, e)
	}
	insert(f.DB, 10) // the first event: at the end of the table
	exec(f.DB, "DELETE FROM "+f.Table+" WHERE event_type = 'Filler' AND (ctid::text::point)[0] < 10")
	exec(f.DB, "VACUUM "+f.Table)
	// Later events, each from a connection of its own, land in the space the vacuum freed.
	for _, sizes := range [][]int{{3000}, {3000, 6000, 4000}} {
		db, err := pgx.Connect(ctx, f.PostgresURL)
		if err != nil {
			t.Fatal(err)
		}
		tx, err := db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, size := range sizes {
			insert(tx.Conn(), size)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		_ = db.Close(ctx)
	}
	var firstPage, secondPage int
	if err := f.DB.QueryRow(ctx, "SELECT (SELECT (ctid::text::point)[0]::int FROM "+f.Table+" WHERE event_id = $1), (SELECT (ctid::text::point)[0]::int FROM "+f.Table+" WHERE event_id = $2)",
		evs[0].ID, evs[1].ID).Scan(&firstPage, &secondPage); err != nil {
		t.Fatal(err)
	}
	if secondPage >= firstPage {
		t.Fatalf("the second event lies in page %d, after the first's %d: no reused space, the test proves nothing", secondPage, firstPage)
	}
	p, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Resync(ctx, ResyncOptions{Yes: true, SnapshotOnly: true, EventTypes: []string{"Ordered"}}); err != nil {
		t.Fatal(err)
	}
	got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Ordered"), len(evs), time.Minute)
	var order []string // one key, one partition: offset order
	for _, r := range got {
		order = append(order, testenv.EventID(r))
	}
	var want []string
	for _, e := range evs {
		want = append(want, e.ID)
	}
	if strings.Join(order, ",") != strings.Join(want, ",") {
		t.Fatalf("the aggregate's events arrived as\n%v, want\n%v", order, want)
	}
}

// TestResyncRefusesRowsHiddenByRowLevelSecurity: row-level security on the outbox hides rows from a
// role that neither owns the table nor bypasses it (with no policy at all, every row), while the WAL
// carries them all. resync, dry or not, refuses before it touches the slot, naming BYPASSRLS, instead
// of publishing a snapshot without them; with BYPASSRLS every row is published.
func TestResyncRefusesRowsHiddenByRowLevelSecurity(t *testing.T) {
	f := testenv.NewFixture(t)
	ctx := context.Background()
	cfg := testConfig(f)
	cfg.Postgres.URL = roleWithSettings(t, f)
	evs := testenv.Preload(t, f, testenv.NewGenerator(3, "Hidden"), 50)
	if _, err := f.DB.Exec(ctx, "ALTER TABLE "+f.Table+" ENABLE ROW LEVEL SECURITY"); err != nil {
		t.Fatal(err)
	}
	run := startPipeline(t, cfg) // the slot exists: a refused resync must leave it as it was
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	before := f.ConfirmedFlushLSN(t)
	p, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []ResyncOptions{{Yes: true, SnapshotOnly: true}, {DryRun: true, Out: io.Discard}} {
		res, err := p.Resync(ctx, o)
		if !errors.Is(err, replication.ErrNotSetUp) || !strings.Contains(err.Error(), "BYPASSRLS") {
			t.Fatalf("resync (dry run %t) of an outbox whose rows row-level security hides: %d rows, error %v; want a set-up error naming BYPASSRLS", o.DryRun, res.Rows, err)
		}
	}
	var slots []string
	if err := f.DB.QueryRow(ctx, "SELECT coalesce(array_agg(slot_name::text), '{}') FROM pg_replication_slots WHERE slot_name LIKE $1", f.Slot+"%").Scan(&slots); err != nil {
		t.Fatal(err)
	}
	if after := f.ConfirmedFlushLSN(t); after != before || len(slots) != 1 {
		t.Fatalf("the refused resync changed the slots: %v, confirmed_flush_lsn %s, was %s", slots, after, before)
	}

	u, err := url.Parse(cfg.Postgres.URL)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, f.AdminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = admin.Close(ctx) }()
	if _, err := admin.Exec(ctx, "ALTER ROLE "+pgx.Identifier{u.User.Username()}.Sanitize()+" BYPASSRLS"); err != nil {
		t.Fatal(err)
	}
	res, err := p.Resync(ctx, ResyncOptions{Yes: true, SnapshotOnly: true})
	if err != nil {
		t.Fatalf("resync with BYPASSRLS: %v", err)
	}
	if res.Rows != int64(len(evs)) {
		t.Fatalf("resync with BYPASSRLS published %d rows, want %d", res.Rows, len(evs))
	}
	got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Hidden"), len(evs), time.Minute)
	testenv.VerifyDelivery(t, f, evs, got)
}
