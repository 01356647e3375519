package pipeline

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// TestResyncNoGapNoOverlap: 20,000 rows exist and writers keep inserting while resync starts; every
// event arrives exactly once — from the snapshot if committed before the slot, from the WAL if after —
// and per-aggregate order holds across the boundary.
func TestResyncNoGapNoOverlap(t *testing.T) {
	f := testenv.NewFixture(t)
	gen := testenv.NewGenerator(50, "OrderCreated", "OrderPaid")
	preloaded := testenv.Preload(t, f, gen, 20000)
	writer := testenv.StartWriter(t, f, gen, 2, 2*time.Millisecond, false)
	// Let the writers get going, so that transactions straddle the slot's creation.
	testenv.WaitFor(t, time.Minute, "writers running", func() bool { return writer.Written() > 100 })
	p, err := New(testConfig(f), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
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
	written, err := writer.Stop()
	if err != nil {
		t.Fatalf("writer: %v", err)
	}
	want := append(preloaded, written...)
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
