package pipeline

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// eosConfig is testConfig in exactly-once mode, with the fixture's own checkpoint topic.
func eosConfig(f *testenv.Fixture) config.Config {
	cfg := testConfig(f)
	cfg.Kafka.Delivery = config.DeliveryExactlyOnce
	return cfg
}

// deliveryMode is one value of kafka.delivery for tests that run in both: its configuration, and the
// consumer options of its consumers.
type deliveryMode struct {
	name     string
	config   func(*testenv.Fixture) config.Config
	consumer []kgo.Opt
}

// checkDuplicates fails the test when a read_committed consumer saw duplicates in exactly-once mode.
func (m deliveryMode) checkDuplicates(t *testing.T, dups int) {
	t.Helper()
	if m.name == config.DeliveryExactlyOnce && dups != 0 {
		t.Errorf("exactly-once: a read_committed consumer saw %d duplicates, want 0", dups)
	}
}

// forEachDelivery runs test once in each delivery mode.
func forEachDelivery(t *testing.T, test func(*testing.T, deliveryMode)) {
	for _, m := range []deliveryMode{
		{name: config.DeliveryAtLeastOnce, config: alsConfig},
		{name: config.DeliveryExactlyOnce, config: eosConfig, consumer: []kgo.Opt{readCommitted}},
	} {
		t.Run(m.name, func(t *testing.T) { test(t, m) })
	}
}

// alsConfig is testConfig in at-least-once mode, whatever mode the suite runs in.
func alsConfig(f *testenv.Fixture) config.Config {
	cfg := testConfig(f)
	cfg.Kafka.Delivery = config.DeliveryAtLeastOnce
	return cfg
}

// readCommitted is the consumer setting exactly-once consumers use.
var readCommitted = kgo.FetchIsolationLevel(kgo.ReadCommitted())

// lastCheckpoint reads the fixture's checkpoint topic as the router does at start.
func lastCheckpoint(t *testing.T, cfg config.Config) *checkpoint.Record {
	t.Helper()
	p, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.identify(ctx); err != nil {
		t.Fatal(err)
	}
	rt, err := p.newRouter(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	cp, err := rt.ReadCheckpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return cp
}

// TestExactlyOnceDelivery streams single rows, 100-row transactions and rows deleted by the
// transaction that inserted them in exactly-once mode, stops, writes more, and starts again: a
// read_committed consumer sees every event once and in order, the checkpoint topic holds the slot's
// position, and the slot is never confirmed past it.
func TestExactlyOnceDelivery(t *testing.T) {
	f := testenv.NewFixture(t)
	cfg := eosConfig(f)
	ctx := context.Background()
	gen := testenv.NewGenerator(20, "OrderCreated", "OrderPaid")
	var all []testenv.Event
	write := func(rounds int) {
		for i := 0; i < rounds; i++ {
			single := []testenv.Event{gen.Event(i)}
			batch := make([]testenv.Event, 100)
			for j := range batch {
				batch[j] = gen.Event(i + j)
			}
			deleted := []testenv.Event{gen.Event(i + 3), gen.Event(i + 4)}
			for k, evs := range [][]testenv.Event{single, batch, deleted} {
				if err := testenv.InsertTx(ctx, f.DB, f.Table, evs, k == 2); err != nil {
					t.Fatal(err)
				}
				all = append(all, evs...)
			}
		}
	}
	run := startPipeline(t, cfg)
	write(10)
	topics := testenv.TopicsOf(f, "OrderCreated", "OrderPaid")
	got := testenv.ConsumeDistinct(t, f.Brokers, topics, len(all), time.Minute, readCommitted)
	if dups := testenv.VerifyDelivery(t, f, all, got); dups != 0 {
		t.Errorf("a read_committed consumer saw %d duplicates, want 0", dups)
	}
	if err := run.stop(); err != nil {
		t.Fatalf("pipeline: %v", err)
	}
	if n := run.p.Router.TransactionsCommitted.Load(); n == 0 {
		t.Error("no Kafka transaction was committed")
	}
	cp := lastCheckpoint(t, cfg)
	if cp == nil {
		t.Fatal("no checkpoint in Kafka after a graceful stop")
	}
	confirmed := checkpoint.LSN(testenv.MustLSN(t, f.ConfirmedFlushLSN(t)))
	if confirmed > cp.LSN {
		t.Fatalf("the slot is confirmed at %s, past the last checkpoint %s", confirmed, cp.LSN)
	}

	write(5)
	run = startPipeline(t, cfg)
	got = testenv.ConsumeDistinct(t, f.Brokers, topics, len(all), time.Minute, readCommitted)
	if dups := testenv.VerifyDelivery(t, f, all, got); dups != 0 {
		t.Errorf("after a restart a read_committed consumer saw %d duplicates, want 0", dups)
	}
	if err := run.stop(); err != nil {
		t.Fatalf("pipeline: %v", err)
	}
}

// TestExactlyOnceSlotGuard drops the slot while the router is stopped, writes rows, and creates the
// slot anew: run refuses, naming both positions; with the gap accepted it streams what comes after
// the new slot; resync then publishes the rows still in the table, the lost ones among them.
func TestExactlyOnceSlotGuard(t *testing.T) {
	f := testenv.NewFixture(t)
	cfg := eosConfig(f)
	ctx := context.Background()
	gen := testenv.NewGenerator(5, "StockMoved")
	topics := testenv.TopicsOf(f, "StockMoved")
	before := []testenv.Event{gen.Event(0), gen.Event(1)}
	run := startPipeline(t, cfg)
	if err := testenv.InsertTx(ctx, f.DB, f.Table, before, false); err != nil {
		t.Fatal(err)
	}
	testenv.ConsumeDistinct(t, f.Brokers, topics, len(before), time.Minute, readCommitted)
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}

	if _, err := f.DB.Exec(ctx, "SELECT pg_drop_replication_slot($1)", f.Slot); err != nil {
		t.Fatal(err)
	}
	gap := []testenv.Event{gen.Event(2), gen.Event(3)}
	if err := testenv.InsertTx(ctx, f.DB, f.Table, gap, false); err != nil {
		t.Fatal(err)
	}
	if _, err := f.DB.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", f.Slot); err != nil {
		t.Fatal(err)
	}

	p, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err = p.Run(rctx)
	if !errors.Is(err, checkpoint.ErrGap) || !strings.Contains(err.Error(), "resync") || !strings.Contains(err.Error(), "--accept-gap") {
		t.Fatalf("run on a re-created slot returned %v, want the gap refused with the ways out", err)
	}
	t.Logf("refused: %v", err)

	accepted, err := New(cfg, testLogger(t), WithAcceptGap())
	if err != nil {
		t.Fatal(err)
	}
	actx, acancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- accepted.Run(actx) }()
	testenv.WaitFor(t, time.Minute, "streaming with the gap accepted", func() bool { return accepted.State() == StateStreaming })
	after := []testenv.Event{gen.Event(4)}
	if err := testenv.InsertTx(ctx, f.DB, f.Table, after, false); err != nil {
		t.Fatal(err)
	}
	got := testenv.ConsumeDistinct(t, f.Brokers, topics, len(before)+len(after), time.Minute, readCommitted)
	for _, r := range got {
		for _, e := range gap {
			if testenv.Header(r, "event_id") == e.ID {
				t.Fatalf("event %s written while the slot was missing was streamed: the test proves nothing", e.ID)
			}
		}
	}
	// --accept-gap accepted that gap, not any later one: the slot dropped and created anew under the
	// same process is refused like the first time.
	admin, err := pgx.Connect(ctx, f.AdminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	second := []testenv.Event{gen.Event(5)}
	var dropped bool
	for i := 0; i < 100 && !dropped; i++ {
		_, _ = admin.Exec(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL", f.Slot)
		_, err := admin.Exec(ctx, "SELECT pg_drop_replication_slot($1)", f.Slot)
		dropped = err == nil
		if !dropped {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if !dropped {
		t.Fatal("could not drop the slot")
	}
	if err := testenv.InsertTx(ctx, f.DB, f.Table, second, false); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", f.Slot); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, checkpoint.ErrGap) && !errors.Is(err, replication.ErrSlotLost) {
			t.Fatalf("the accepting process met a second gap and returned %v, want it refused", err)
		}
		t.Logf("second gap refused: %v", err)
	case <-time.After(time.Minute):
		acancel()
		<-done
		t.Fatal("the process that accepted one gap went on streaming over a second one")
	}
	acancel()

	// resync: the snapshot holds every row of the table, the gap's among them, and ends with a
	// checkpoint at the new slot's start, so that run accepts that slot without --accept-gap.
	rp, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	res, err := rp.Resync(ctx, ResyncOptions{Yes: true, SnapshotOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	got = testenv.ConsumeUntil(t, f.Brokers, topics, func(recs []*kgo.Record) bool {
		seen := 0
		for _, r := range recs {
			for _, e := range append(gap, second...) {
				if testenv.Header(r, "event_id") == e.ID {
					seen++
				}
			}
		}
		return seen == len(gap)+len(second)
	}, time.Minute, readCommitted)
	cp := lastCheckpoint(t, cfg)
	if cp == nil || cp.LSN != res.ConsistentPoint {
		t.Fatalf("after resync the checkpoint is %+v, want one at the slot's consistent point %s", cp, res.ConsistentPoint)
	}
	startPipeline(t, cfg) // no gap: the slot starts where the checkpoint stands
	t.Logf("resync published %d rows; %d records read", res.Rows, len(got))
}

// TestExactlyOnceConfirmsOnlyCommitted holds a Kafka transaction open (a 20 s transaction interval)
// after its records were acknowledged: the slot must not be confirmed past the rows until the Kafka
// transaction commits, however long it stays open, and a read_committed consumer sees nothing before.
func TestExactlyOnceConfirmsOnlyCommitted(t *testing.T) {
	f := testenv.NewFixture(t)
	cfg := eosConfig(f)
	cfg.Kafka.TransactionInterval = 20 * time.Second
	cfg.Kafka.QuietFlush = 0 // the interval alone ends the transaction
	ctx := context.Background()
	run := startPipeline(t, cfg)
	gen := testenv.NewGenerator(3, "CartUpdated")
	topics := testenv.TopicsOf(f, "CartUpdated")
	evs := []testenv.Event{gen.Event(0), gen.Event(1), gen.Event(2)}
	var before string
	if err := f.DB.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&before); err != nil {
		t.Fatal(err)
	}
	if err := testenv.InsertTx(ctx, f.DB, f.Table, evs, false); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	testenv.ConsumeDistinct(t, f.Brokers, topics, len(evs), 30*time.Second, kgo.FetchIsolationLevel(kgo.ReadUncommitted())) // acknowledged, not committed
	time.Sleep(2500 * time.Millisecond)                                                                                     // more than a status interval
	if time.Since(start) > 15*time.Second {
		t.Fatal("the records took too long to arrive: the test proves nothing")
	}
	if confirmed := testenv.MustLSN(t, f.ConfirmedFlushLSN(t)); confirmed > testenv.MustLSN(t, before) {
		t.Fatalf("the slot is confirmed at %s, past rows inserted after %s, while their Kafka transaction is still open", confirmed, before)
	}
	// What a read_committed consumer may read ends at the last stable offset: every record of the open
	// transaction must lie at or after it (the high watermark counts them, the stable offset does not).
	cl, err := kgo.NewClient(kgo.SeedBrokers(f.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	hwm, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		t.Fatal(err)
	}
	lso, err := adm.ListCommittedOffsets(ctx, topics...)
	if err != nil {
		t.Fatal(err)
	}
	unstable := int64(0)
	hwm.Each(func(o kadm.ListedOffset) {
		if s, ok := lso.Lookup(o.Topic, o.Partition); ok {
			unstable += o.Offset - s.Offset
		}
	})
	if unstable != int64(len(evs)) {
		t.Fatalf("%d records lie past the last stable offset, want the open transaction's %d: read_committed consumers could see them", unstable, len(evs))
	}
	got := testenv.ConsumeDistinct(t, f.Brokers, topics, len(evs), 30*time.Second, readCommitted)
	testenv.VerifyDelivery(t, f, evs, got)
	testenv.WaitFor(t, 10*time.Second, "slot confirmed past the rows", func() bool {
		return testenv.MustLSN(t, f.ConfirmedFlushLSN(t)) > testenv.MustLSN(t, before)
	})
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
}
