package pipeline

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// TestFailoverWithALaggingStandby: on PostgreSQL 17, the standby's WAL stream is frozen (a black hole
// between it and the primary) while transactions commit on the primary; then the primary dies and the
// standby is promoted without them, and new transactions commit on the promoted server. What the
// router published from the frozen window is in Kafka but not in the database: phantom events.
//
//   - Without synchronized_standby_slots the router receives and publishes the frozen window: every
//     one of its events is a phantom. This is what `status` warns about.
//   - With synchronized_standby_slots naming the standby's slot, the walsender holds the window back
//     until the standby has it: nothing reaches Kafka that the promoted server lacks.
//
// Either way, every row on the promoted server reaches Kafka, in order per aggregate: in particular
// the transactions committed after the promotion, whose positions on the new timeline lie below
// where the router stood on the old one (the exactly-once mode must not take them for delivered).
func TestFailoverWithALaggingStandby(t *testing.T) {
	for _, synced := range []bool{false, true} {
		t.Run(fmt.Sprintf("synchronized_standby_slots=%t", synced), func(t *testing.T) { testFailoverWithALaggingStandby(t, synced) })
	}
}

func testFailoverWithALaggingStandby(t *testing.T, synchronizedStandbySlots bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	primary := newPrimary17(t, ctx)
	// The standby reaches the primary through a proxy that can freeze its WAL stream.
	proxy := testenv.NewProxy(t, fmt.Sprintf("127.0.0.1:%d", primary.Port))
	_, proxyPort, _ := strings.Cut(proxy.Addr(), ":")
	standby := standbyOf(t, ctx, primary, synchronizedStandbySlots, fmt.Sprintf("primary_conninfo = 'host=127.0.0.1 port=%s user=postgres dbname=postgres'", proxyPort))
	cfg, prefix := promotionConfig(t, primary, standby, "lagging")
	topics := []string{prefix + ".Placed", prefix + ".Paid"}
	run := startPipeline(t, cfg)

	gen := testenv.NewGenerator(5, "Placed", "Paid")
	batch := func(url string, n int) []testenv.Event {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var all []testenv.Event
		for i := 0; i < n; i += 5 {
			evs := []testenv.Event{gen.Event(i), gen.Event(i + 1), gen.Event(i + 2), gen.Event(i + 3), gen.Event(i + 4)}
			if err := testenv.InsertTx(ctx, conn, "public.outbox", evs, false); err != nil {
				t.Fatal(err)
			}
			all = append(all, evs...)
		}
		return all
	}
	has := func(recs []*kgo.Record, evs []testenv.Event) int {
		ids := map[string]bool{}
		for _, r := range recs {
			ids[testenv.Header(r, "event_id")] = true
		}
		n := 0
		for _, e := range evs {
			if ids[e.ID] {
				n++
			}
		}
		return n
	}

	// Before: delivered, replayed on the standby, and the slot synchronized there.
	before := batch(primary.URL, 100)
	testenv.ConsumeUntil(t, cfg.Kafka.Brokers, topics, func(r []*kgo.Record) bool { return has(r, before) == len(before) }, time.Minute)
	waitStandbySlotReady(t, ctx, primary, standby, cfg.Postgres.Slot, true)

	// The window: the standby's WAL stream is frozen while transactions commit on the primary.
	if n := proxy.BlackHole(); n == 0 {
		t.Fatal("no standby connection through the proxy to freeze")
	}
	window := batch(primary.URL, 50)
	if synchronizedStandbySlots {
		time.Sleep(3 * time.Second)
	} else {
		testenv.ConsumeUntil(t, cfg.Kafka.Brokers, topics, func(r []*kgo.Record) bool { return has(r, window) == len(window) }, time.Minute)
	}
	primary.Stop(t, "immediate")
	standby.Promote(t)

	// After: transactions on the promoted server, on the new timeline.
	after := batch(standby.URL, 100)
	got := testenv.ConsumeUntil(t, cfg.Kafka.Brokers, topics, func(r []*kgo.Record) bool { return has(r, after) == len(after) }, 2*time.Minute)
	if n := has(got, after); n < len(after) {
		t.Errorf("%d of %d events committed on the promoted server reached Kafka: the rest are lost", n, len(after))
	}

	if cfg.Kafka.ExactlyOnce() {
		// The checkpoints of the new timeline say where it began: a sibling promoted elsewhere with
		// the same timeline number is then told apart.
		testenv.WaitFor(t, time.Minute, "a checkpoint on timeline 2", func() bool {
			cp := lastCheckpoint(t, cfg)
			return cp != nil && cp.Timeline == 2 && cp.TimelineStart != 0
		})
	}
	want := readOutbox(t, ctx, standby.URL)
	real, phantoms := testenv.SplitPhantoms(want, got)
	t.Logf("synchronized_standby_slots set: %t; %d events committed while the standby was frozen; phantom events (in Kafka, not on the promoted server): %d",
		synchronizedStandbySlots, len(window), len(phantoms))
	if synchronizedStandbySlots && len(phantoms) > 0 {
		t.Errorf("%d phantom events with synchronized_standby_slots set", len(phantoms))
	}
	if !synchronizedStandbySlots && len(phantoms) != len(window) {
		t.Errorf("without synchronized_standby_slots, expected the %d events of the frozen window as phantoms, found %d", len(window), len(phantoms))
	}
	checkPromoted(t, prefix, want, real, len(got))
	if err := run.stop(); err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("stop: %v", err)
	}
}

// checkPromoted checks the records of the events on a promoted server (phantoms left out): every one
// arrived, in order per aggregate, with the right content; read is how many records were read in all.
func checkPromoted(t *testing.T, prefix string, want []testenv.Event, real []*kgo.Record, read int) testenv.DeliveryReport {
	t.Helper()
	rep := testenv.CheckDelivery(prefix, want, real)
	for i, p := range rep.Problems {
		if i == 30 {
			t.Errorf("... and %d more", len(rep.Problems)-30)
			break
		}
		t.Error(p)
	}
	t.Logf("%d rows on the promoted server; %d records read, %d duplicates, %d missing, %d order violations, %d wrong",
		len(want), read, rep.Duplicates, rep.Missing, rep.OrderViolations, rep.Wrong)
	return rep
}

// newPrimary17 starts a PostgreSQL 17 server with wal_level logical and sql/outbox.sql applied.
func newPrimary17(t *testing.T, ctx context.Context) *testenv.Cluster {
	t.Helper()
	primary := testenv.NewClusterOf(t, "17", "wal_level = logical")
	applyOutboxSQL(t, ctx, primary.URL)
	return primary
}

// standbyOf makes a standby of primary that synchronizes failover slots (physical slot sb1), with
// the extra postgresql.conf lines; with synchronized set, the primary's synchronized_standby_slots
// names it.
func standbyOf(t *testing.T, ctx context.Context, primary *testenv.Cluster, synchronized bool, extra ...string) *testenv.Cluster {
	t.Helper()
	standby := primary.Standby(t, "sb1", append([]string{"sync_replication_slots = on", "hot_standby_feedback = on"}, extra...)...)
	if synchronized {
		conn, err := pgx.Connect(ctx, primary.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		for _, sql := range []string{"ALTER SYSTEM SET synchronized_standby_slots = 'sb1'", "SELECT pg_reload_conf()"} {
			if _, err := conn.Exec(ctx, sql); err != nil {
				t.Fatal(err)
			}
		}
	}
	return standby
}

// promotionConfig is a router configuration on a multi-host URL naming both servers
// (target_session_attrs=read-write), with topics under a fresh prefix it returns.
func promotionConfig(t *testing.T, primary, standby *testenv.Cluster, name string) (config.Config, string) {
	t.Helper()
	prefix := fmt.Sprintf("t.%s-%x", name, time.Now().UnixNano()&0xffffff)
	cfg := config.Default()
	cfg.Postgres.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?target_session_attrs=read-write", primary.Port, standby.Port)
	cfg.Kafka.Brokers = testenv.Brokers(t)
	cfg.Postgres.StatusInterval = time.Second
	cfg.Routing.Topic = prefix + ".{event_type}"
	cfg.Kafka.Delivery = testenv.Delivery()
	cfg.Kafka.CheckpointTopic = prefix + ".checkpoints"
	return cfg, prefix
}

// applyOutboxSQL runs sql/outbox.sql on the server at url.
func applyOutboxSQL(t *testing.T, ctx context.Context, url string) {
	t.Helper()
	script, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "sql", "outbox.sql"))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, string(script)); err != nil {
		t.Fatalf("apply sql/outbox.sql: %v", err)
	}
}

// waitStandbySlotReady waits until the standby's copy of slot is synchronized and no longer temporary
// (a temporary synced slot is dropped at promotion), and with caughtUp until the standby has replayed
// everything the primary had written when asked.
func waitStandbySlotReady(t *testing.T, ctx context.Context, primary, standby *testenv.Cluster, slot string, caughtUp bool) {
	t.Helper()
	target := "0/0"
	if caughtUp {
		target = primaryLSN(t, ctx, primary.URL)
	}
	testenv.WaitFor(t, 2*time.Minute, "the slot synchronized to the standby and no longer temporary", func() bool {
		if p, err := pgx.Connect(ctx, primary.URL); err == nil {
			_, _ = p.Exec(ctx, "SELECT pg_log_standby_snapshot()") // speeds up the synchronization
			_ = p.Close(ctx)
		}
		conn, err := pgx.Connect(ctx, standby.URL)
		if err != nil {
			return false
		}
		defer conn.Close(ctx)
		var ready bool
		err = conn.QueryRow(ctx, `SELECT s.synced AND NOT s.temporary AND pg_last_wal_replay_lsn() >= $2::pg_lsn
			FROM pg_replication_slots s WHERE s.slot_name = $1`, slot, target).Scan(&ready)
		return err == nil && ready
	})
}

// primaryLSN is the server's current WAL write position.
func primaryLSN(t *testing.T, ctx context.Context, url string) string {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var lsn string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	return lsn
}

// readOutbox reads public.outbox on the server at url, in order per aggregate: what a promoted server
// holds is the truth a failover test checks Kafka against.
func readOutbox(t *testing.T, ctx context.Context, url string) []testenv.Event {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT event_id::text, event_type, aggregate_type, aggregate_id, aggregate_version, payload::text, COALESCE(headers::text, '')
		FROM public.outbox ORDER BY aggregate_id, aggregate_version`)
	if err != nil {
		t.Fatal(err)
	}
	want, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (testenv.Event, error) {
		var e testenv.Event
		err := r.Scan(&e.ID, &e.Type, &e.AggType, &e.AggID, &e.Version, &e.Payload, &e.Headers)
		return e, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(want) == 0 {
		t.Fatal("no rows on the server")
	}
	return want
}
