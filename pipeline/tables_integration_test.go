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
// aggregate in commit order. A publication that lacks the second table is refused with the fix; a
// publication created by the router carries both.
func TestTablesShareOneSlot(t *testing.T) {
	forEachDelivery(t, testTablesShareOneSlot)
}

func testTablesShareOneSlot(t *testing.T, mode deliveryMode) {
	f := testenv.NewFixture(t)
	g := testenv.NewFixtureIn(t, f)
	cfg := withTables(t, mode.config(f), g)
	ctx := context.Background()

	// The fixture's publication carries f's table only: set-up names the statement that adds g's.
	p, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	err = p.Run(runCtx)
	cancel()
	if !errors.Is(err, replication.ErrNotSetUp) || !strings.Contains(err.Error(), "ADD TABLE "+pgx.Identifier(strings.Split(g.Table, ".")).Sanitize()) {
		t.Fatalf("run with a publication that lacks the second table: %v, want ErrNotSetUp naming ALTER PUBLICATION ... ADD TABLE %s", err, g.Table)
	}
	// Without the publication (and before the slot), the router creates it for both tables.
	if _, err := f.DB.Exec(ctx, "DROP PUBLICATION "+f.Publication); err != nil {
		t.Fatal(err)
	}
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
