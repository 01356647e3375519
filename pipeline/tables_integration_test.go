package pipeline

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"gopkg.in/yaml.v3"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// withTables adds the further outbox tables of fixtures to cfg (the tables list), each routed to its
// own fixture's topics.
func withTables(t *testing.T, cfg config.Config, fixtures ...*testenv.Fixture) config.Config {
	t.Helper()
	var doc strings.Builder
	for _, g := range fixtures {
		doc.WriteString("- table: " + g.Table + "\n  routing: {topic: \"" + g.TopicPrefix + ".{event_type}\"}\n")
	}
	if err := yaml.Unmarshal([]byte(doc.String()), &cfg.Tables); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestTablesShareOneSlot: two outbox tables of one database streamed through one slot and one
// publication, rows of both in the same transactions: every row reaches its own table's topics, per
// aggregate in commit order. A publication that lacks the second table is refused with the fix when
// the router may not change it, and the router adds the table when it may.
func TestTablesShareOneSlot(t *testing.T) {
	forEachDelivery(t, testTablesShareOneSlot)
}

func testTablesShareOneSlot(t *testing.T, mode deliveryMode) {
	f := testenv.NewFixture(t)
	g := testenv.NewFixtureIn(t, f)
	cfg := withTables(t, mode.config(f), g)
	ctx := context.Background()

	// The fixture's publication carries f's table only. Without postgres.create_publication, set-up
	// names the statement that adds g's, as something the database side provides (ErrPending).
	off := cfg
	off.Postgres.CreatePublication = false
	p, err := New(off, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	err = p.Run(runCtx)
	cancel()
	if !errors.Is(err, replication.ErrNotSetUp) || !errors.Is(err, replication.ErrPending) || !strings.Contains(err.Error(), "ADD TABLE "+pgx.Identifier(strings.Split(g.Table, ".")).Sanitize()) {
		t.Fatalf("run with a publication that lacks the second table: %v, want ErrNotSetUp and ErrPending naming ALTER PUBLICATION ... ADD TABLE %s", err, g.Table)
	}
	// With it (the default), the router adds the table, as init would.
	run := startPipeline(t, cfg)
	var tables []string
	if err := f.DB.QueryRow(ctx, `SELECT array_agg(schemaname || '.' || tablename ORDER BY tablename) FROM pg_publication_tables WHERE pubname = $1`, f.Publication).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if len(tables) != 2 || !strings.Contains(strings.Join(tables, ","), f.Table) || !strings.Contains(strings.Join(tables, ","), g.Table) {
		t.Fatalf("publication %s carries %v, want %s and %s", f.Publication, tables, f.Table, g.Table)
	}

	types := []string{"Created", "Paid"}
	// The same aggregate names in both tables: each table's events keep their own order on their
	// own topics.
	genF, genG := testenv.NewGenerator(10, types...), testenv.NewGenerator(10, types...)
	rng := rand.New(rand.NewPCG(3, 4))
	var wantF, wantG []testenv.Event
	for len(wantF)+len(wantG) < 3000 {
		tx, err := f.DB.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// Interleaved within the transaction: f, g, f again.
		for _, part := range []struct {
			fx   *testenv.Fixture
			gen  *testenv.Generator
			want *[]testenv.Event
		}{{f, genF, &wantF}, {g, genG, &wantG}, {f, genF, &wantF}} {
			evs := make([]testenv.Event, rng.IntN(8))
			for i := range evs {
				evs[i] = part.gen.Event(rng.IntN(10))
			}
			if err := testenv.InsertIn(ctx, tx, part.fx.Table, evs, rng.IntN(3) == 0); err != nil {
				t.Fatal(err)
			}
			*part.want = append(*part.want, evs...)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	gotF := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, types...), len(wantF), 2*time.Minute, mode.consumer...)
	gotG := testenv.ConsumeDistinct(t, g.Brokers, testenv.TopicsOf(g, types...), len(wantG), 2*time.Minute, mode.consumer...)
	testenv.VerifyDelivery(t, f, wantF, gotF)
	testenv.VerifyDelivery(t, g, wantG, gotG)
	t.Logf("%d events of %s and %d of %s delivered through slot %s", len(wantF), f.Table, len(wantG), g.Table, f.Slot)
	if err := run.stop(); err != nil {
		t.Fatalf("pipeline: %v", err)
	}
	if n := run.p.Router.Produced.Load(); n < int64(len(wantF)+len(wantG)) {
		t.Errorf("router counted %d produced, want at least %d", n, len(wantF)+len(wantG))
	}
}

// TestResyncOfSeveralTables: resync publishes the rows of every outbox table of the source from one
// snapshot, each to its own table's topics, then streams both from the slot's consistent point:
// every event exactly once, with writers on both tables straddling the slot's creation. The dry run
// counts each table's rows under its own topics.
func TestResyncOfSeveralTables(t *testing.T) {
	f := testenv.NewFixture(t)
	g := testenv.NewFixtureIn(t, f)
	if _, err := f.DB.Exec(context.Background(), "ALTER PUBLICATION "+f.Publication+" ADD TABLE "+g.Table); err != nil {
		t.Fatal(err)
	}
	cfg := withTables(t, testConfig(f), g)
	types := []string{"Created", "Paid"}
	want := map[*testenv.Fixture][]testenv.Event{
		f: testenv.Preload(t, f, testenv.NewGenerator(20, types...), 3000),
		g: testenv.Preload(t, g, testenv.NewGenerator(20, types...).WithPrefix("g-"), 2000),
	}

	p, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	p.rowsPerPart = 1000 // each table in parts
	var out strings.Builder
	dry, err := p.Resync(context.Background(), ResyncOptions{DryRun: true, Out: &out})
	if err != nil {
		t.Fatal(err)
	}
	perTable := map[*testenv.Fixture]int64{}
	for topic, n := range dry.PerTopic {
		for _, fx := range []*testenv.Fixture{f, g} {
			if strings.HasPrefix(topic, fx.TopicPrefix+".") {
				perTable[fx] += n
			}
		}
	}
	if dry.Rows != 5000 || perTable[f] != 3000 || perTable[g] != 2000 {
		t.Fatalf("dry run: %d rows, %d to %s's topics and %d to %s's, want 5000, 3000 and 2000:\n%s", dry.Rows, perTable[f], f.Table, perTable[g], g.Table, out.String())
	}

	writers := map[*testenv.Fixture]*testenv.Writer{
		f: testenv.StartWriter(t, f, testenv.NewGenerator(5, types...).WithPrefix("wf-"), 2, 2*time.Millisecond, false),
		g: testenv.StartWriter(t, g, testenv.NewGenerator(5, types...).WithPrefix("wg-"), 3, 3*time.Millisecond, false),
	}
	testenv.WaitFor(t, time.Minute, "writers running", func() bool { return writers[f].Written() > 50 && writers[g].Written() > 50 })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var res ResyncResult
	done := make(chan error, 1)
	go func() {
		var err error
		res, err = p.Resync(ctx, ResyncOptions{Yes: true})
		done <- err
	}()
	testenv.WaitFor(t, 2*time.Minute, "resync streaming after the snapshot", func() bool { return p.State() == StateStreaming })
	time.Sleep(time.Second)
	total := 0
	for fx, w := range writers {
		written, err := w.Stop()
		if err != nil {
			t.Fatalf("writer: %v", err)
		}
		want[fx] = append(want[fx], written...)
		total += len(want[fx])
	}
	for _, fx := range []*testenv.Fixture{f, g} {
		got := testenv.ConsumeDistinct(t, fx.Brokers, testenv.TopicsOf(fx, types...), len(want[fx]), 3*time.Minute)
		if dups := testenv.VerifyDelivery(t, fx, want[fx], got); dups != 0 {
			t.Errorf("%s: %d events arrived twice: the snapshot and the stream overlap", fx.Table, dups)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("resync: %v", err)
	}
	streamed := p.Replication.Rows.Load()
	t.Logf("%d events: %d from the snapshot, %d from the WAL", total, res.Rows, streamed)
	if res.Rows+streamed != int64(total) {
		t.Errorf("snapshot %d + stream %d = %d rows, want %d: a gap or an overlap at the boundary", res.Rows, streamed, res.Rows+streamed, total)
	}
}
