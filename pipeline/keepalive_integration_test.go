package pipeline

import (
	"context"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// holdingHandler takes rows the way the router does at its in-flight cap while Kafka stalls: until
// release it takes nothing, answering the end of Deliver's context as Deliver must.
type holdingHandler struct {
	release time.Time
	rows    atomic.Int64
}

// Deliver implements replication.Handler.
func (h *holdingHandler) Deliver(ctx context.Context, _ *checkpoint.Tx, _ *replication.Row) error {
	if time.Now().Before(h.release) {
		<-ctx.Done()
		return ctx.Err()
	}
	h.rows.Add(1)
	return nil
}

// holdingBatcher takes rows at once and commits the way the exactly-once mode does when a Kafka
// commit waits for the one before it (Kafka slow): its first Flush blocks until release.
type holdingBatcher struct {
	holdingHandler
	due time.Time
}

// Committed implements replication.Batcher.
func (b *holdingBatcher) Committed(context.Context, *checkpoint.Tx, checkpoint.LSN) error {
	b.due = time.Now()
	return nil
}

// FlushDue implements replication.Batcher.
func (b *holdingBatcher) FlushDue() time.Time { return b.due }

// Flush implements replication.Batcher.
func (b *holdingBatcher) Flush(context.Context) error {
	b.due = time.Time{}
	time.Sleep(time.Until(b.release))
	return nil
}

// Deliver implements replication.Handler.
func (b *holdingBatcher) Deliver(context.Context, *checkpoint.Tx, *replication.Row) error {
	b.rows.Add(1)
	return nil
}

// TestStreamAnswersTheServerWhileTheRouterWaits: while the router waits for room (Kafka slow or
// away, up to kafka.ack_timeout), the stream reads nothing, so the walsender's keepalive requests go
// unanswered; a server whose wal_sender_timeout is shorter than postgres.status_interval (here 2 s
// against 10 s) ended the connection and the session had to start again. The stream now tells the
// server it is alive every second while it waits — for room, and for a Kafka commit.
func TestStreamAnswersTheServerWhileTheRouterWaits(t *testing.T) {
	t.Run("in-flight cap", func(t *testing.T) {
		h := &holdingHandler{}
		testAnswersWhileWaiting(t, h, &h.release, &h.rows)
	})
	t.Run("kafka commit", func(t *testing.T) {
		b := &holdingBatcher{}
		testAnswersWhileWaiting(t, b, &b.release, &b.rows)
	})
}

// testAnswersWhileWaiting streams with h from a walsender with wal_sender_timeout = 2s; h holds the
// stream from the first row until *release, set to 8 s after it starts, and counts rows in rows.
func testAnswersWhileWaiting(t *testing.T, h replication.Handler, release *time.Time, rows *atomic.Int64) {
	f := testenv.NewFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, f.AdminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	var start string
	if err := admin.QueryRow(ctx, "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')", f.Slot).Scan(&start); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(f.PostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	// User-settable: this walsender's own. (A space, not url.Values' "+", which libpq keeps.)
	if u.RawQuery != "" {
		u.RawQuery += "&"
	}
	u.RawQuery += "options=-c%20wal_sender_timeout%3D2s"
	conn, err := replication.Connect(ctx, replication.Target{URL: u.String()})
	if err != nil {
		t.Fatal(err)
	}
	schema, table := replication.SplitTable(f.Table)
	stream, err := replication.Start(ctx, conn, replication.Options{
		Slot: f.Slot, Outbox: replication.Outbox{Schema: schema, Table: table, Publication: f.Publication},
		StartLSN: checkpoint.LSN(testenv.MustLSN(t, start)), StatusInterval: 10 * time.Second, ReceiveTimeout: 30 * time.Second, Logger: testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stream.Close(context.Background()) }()
	*release = time.Now().Add(8 * time.Second)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- stream.Run(runCtx, checkpoint.NewTracker(checkpoint.LSN(testenv.MustLSN(t, start))), h)
	}()
	defer func() { stop(); <-done }() // before the stream is closed
	gen := testenv.NewGenerator(1, "Reserved")
	if err := testenv.InsertTx(ctx, f.DB, f.Table, []testenv.Event{gen.Event(0)}, false); err != nil {
		t.Fatal(err)
	}
	// The first row waits 8 s, four times the server's timeout; then a second one must still come.
	time.Sleep(time.Until(*release) + 500*time.Millisecond)
	if err := testenv.InsertTx(ctx, f.DB, f.Table, []testenv.Event{gen.Event(1)}, false); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for rows.Load() < 2 {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("the stream ended while the router waited %s with wal_sender_timeout = 2s: %v", 8*time.Second, err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows taken 20 s after the wait; want 2", rows.Load())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
