package pipeline

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// TestTableAddedInARollingUpdate: an instance streams table A while a second one, whose configuration
// adds table B, waits as a hot standby (a rolling update). The new instance puts B into the
// publication; the old one meets B's first row, stops without confirming past it (the rows were
// dropped and confirmed past before) and the new instance takes the slot over: every row of A and of
// B arrives, per aggregate in commit order, with writers on both tables throughout. Afterwards the old
// configuration is refused at start naming B, and starts once B is listed under
// postgres.ignore_tables, dropping B's rows by the operator's choice.
func TestTableAddedInARollingUpdate(t *testing.T) {
	f := testenv.NewFixture(t)
	g := testenv.NewFixtureIn(t, f)
	oldCfg := testConfig(f)
	newCfg := withTables(t, oldCfg, g)
	types := []string{"Created", "Paid"}
	ctx := context.Background()

	old, err := New(oldCfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	oldCtx, stopOld := context.WithCancel(ctx)
	defer stopOld()
	oldDone := make(chan error, 1)
	go func() { oldDone <- old.Run(oldCtx) }()
	testenv.WaitFor(t, time.Minute, "the old instance streaming", func() bool { return old.State() == StateStreaming })
	wa := testenv.StartWriter(t, f, testenv.NewGenerator(8, types...).WithPrefix("a-"), 3, 2*time.Millisecond, false)
	testenv.WaitFor(t, time.Minute, "rows in A", func() bool { return wa.Written() > 300 })

	// The new instance: it adds B to the publication (postgres.create_publication) and waits for the
	// slot the old one holds.
	next := startStandby(t, newCfg)
	testenv.WaitFor(t, time.Minute, "B in the publication", func() bool {
		var tables []string
		if err := f.DB.QueryRow(ctx, `SELECT array_agg(schemaname || '.' || tablename) FROM pg_publication_tables WHERE pubname = $1`, f.Publication).Scan(&tables); err != nil {
			t.Fatal(err)
		}
		return slices.Contains(tables, g.Table)
	})
	wb := testenv.StartWriter(t, g, testenv.NewGenerator(8, types...).WithPrefix("b-"), 2, 3*time.Millisecond, true)

	select {
	case err := <-oldDone:
		if !errors.Is(err, replication.ErrUnlistedTable) || !strings.Contains(err.Error(), g.Table) || !strings.Contains(err.Error(), "postgres.ignore_tables") {
			t.Fatalf("the old instance stopped with %v, want ErrUnlistedTable naming %s and postgres.ignore_tables", err, g.Table)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the old instance streamed on past B's rows")
	}
	testenv.WaitFor(t, time.Minute, "the new instance took the slot over", func() bool { return next.p.State() == StateStreaming })
	testenv.WaitFor(t, time.Minute, "rows in B after the takeover", func() bool { return wb.Written() > 300 })
	wantA, err := wa.Stop()
	if err != nil {
		t.Fatal(err)
	}
	wantB, err := wb.Stop()
	if err != nil {
		t.Fatal(err)
	}
	gotA := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, types...), len(wantA), 2*time.Minute, testenv.ConsumerOpts()...)
	gotB := testenv.ConsumeDistinct(t, g.Brokers, testenv.TopicsOf(g, types...), len(wantB), 2*time.Minute, testenv.ConsumerOpts()...)
	testenv.VerifyDelivery(t, f, wantA, gotA)
	testenv.VerifyDelivery(t, g, wantB, gotB)
	t.Logf("%d events of A and %d of B delivered across the rolling update", len(wantA), len(wantB))
	if err := next.stop(); err != nil {
		t.Fatalf("new instance: %v", err)
	}

	// The old configuration again: refused at start, naming B.
	again, err := New(oldCfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	err = again.Run(rctx)
	cancel()
	if !errors.Is(err, replication.ErrUnlistedTable) || !errors.Is(err, replication.ErrNotSetUp) || !strings.Contains(err.Error(), g.Table) {
		t.Fatalf("the old configuration at start: %v, want a refusal naming %s", err, g.Table)
	}
	// Listing B under postgres.ignore_tables is the explicit choice: B's rows are dropped.
	ignoring := oldCfg
	ignoring.Postgres.IgnoreTables = []string{g.Table}
	run := startPipeline(t, ignoring)
	gen := testenv.NewGenerator(4, types...).WithPrefix("c-")
	evA, evB := []testenv.Event{gen.Event(0), gen.Event(1)}, []testenv.Event{gen.Event(2)}
	if err := testenv.InsertTx(ctx, f.DB, g.Table, evB, false); err != nil {
		t.Fatal(err)
	}
	if err := testenv.InsertTx(ctx, f.DB, f.Table, evA, false); err != nil {
		t.Fatal(err)
	}
	testenv.ConsumeUntil(t, f.Brokers, testenv.TopicsOf(f, types...), func(recs []*kgo.Record) bool {
		return slices.ContainsFunc(recs, func(r *kgo.Record) bool { return testenv.EventID(r) == evA[1].ID })
	}, time.Minute, testenv.ConsumerOpts()...)
	if n := run.p.Replication.IgnoredOtherTables.Load(); n != 1 {
		t.Errorf("ignored %d rows of %s, want 1", n, g.Table)
	}
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
}

// startStandby starts a pipeline that is expected to wait for a slot another one holds.
func startStandby(t *testing.T, cfg config.Config) *running {
	t.Helper()
	run := launch(t, cfg, testLogger(t))
	testenv.WaitFor(t, time.Minute, "the second instance waiting as a standby", func() bool { return run.p.State() == StateStandby })
	return run
}
