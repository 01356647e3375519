package pipeline

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// TestPromotionUnderLoad: on PostgreSQL 17, a primary and a physical standby that synchronizes the
// router's failover slot (synchronized_standby_slots set on the primary). Writers and the router run
// under load through a multi-host URL (target_session_attrs=read-write); the primary is killed
// (immediate shutdown) and the standby promoted. Every row on the promoted server must reach Kafka,
// in order per aggregate, and nothing may reach Kafka whose row the promoted server does not have (no
// phantom events). Several rounds, each with new servers.
func TestPromotionUnderLoad(t *testing.T) {
	rounds := 5
	if testing.Short() {
		rounds = 1
	}
	for round := 1; round <= rounds; round++ {
		t.Run(fmt.Sprint("round ", round), func(t *testing.T) { testPromotionUnderLoad(t, true) })
	}
	// Without synchronized_standby_slots the router may have published transactions the standby
	// never received: after the promotion they are in Kafka, not in the database (phantom events).
	// Nothing may be lost or reordered either way; the phantoms are counted and printed.
	t.Run("without synchronized_standby_slots", func(t *testing.T) { testPromotionUnderLoad(t, false) })
}

func testPromotionUnderLoad(t *testing.T, synchronizedStandbySlots bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	primary := newPrimary17(t, ctx)
	standby := standbyOf(t, ctx, primary, synchronizedStandbySlots)
	cfg, prefix := promotionConfig(t, primary, standby, "promotion")
	both := cfg.Postgres.URL
	run := startPipeline(t, cfg)

	// Two writers through the multi-host URL; a failed transaction is retried on a new connection.
	wctx, stopWriters := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			gen := testenv.NewGenerator(5, "Placed", "Paid").WithPrefix(fmt.Sprintf("w%d-", w))
			var conn *pgx.Conn
			defer func() {
				if conn != nil {
					_ = conn.Close(context.Background())
				}
			}()
			for i := 0; wctx.Err() == nil; i++ {
				if conn == nil {
					c, err := pgx.Connect(wctx, both)
					if err != nil {
						time.Sleep(100 * time.Millisecond)
						continue
					}
					conn = c
				}
				evs := []testenv.Event{gen.Event(i), gen.Event(i + 1), gen.Event(i)}
				if err := testenv.InsertTx(wctx, conn, "public.outbox", evs, false); err != nil {
					_ = conn.Close(context.Background())
					conn = nil
				}
				time.Sleep(5 * time.Millisecond)
			}
		}(w)
	}
	defer func() { stopWriters(); wg.Wait() }()

	// The standby's copy of the slot must be ready (synced, no longer temporary) before the failover.
	waitStandbySlotReady(t, ctx, primary, standby, cfg.Postgres.Slot, false)
	time.Sleep(2 * time.Second)
	primary.Stop(t, "immediate")
	standby.Promote(t)
	before := run.p.Router.Produced.Load()
	testenv.WaitFor(t, time.Minute, "the router delivering from the promoted server", func() bool {
		return run.p.State() == StateStreaming && run.p.Router.Produced.Load() > before+100
	})
	time.Sleep(2 * time.Second)
	stopWriters()
	wg.Wait()

	// What the promoted server holds is the truth.
	want := readOutbox(t, ctx, standby.URL)
	got := testenv.ConsumeDistinct(t, cfg.Kafka.Brokers, []string{prefix + ".Placed", prefix + ".Paid"}, len(want), 2*time.Minute)
	real, phantoms := testenv.SplitPhantoms(want, got)
	t.Logf("synchronized_standby_slots set: %t; phantom events (in Kafka, not on the promoted server): %d", synchronizedStandbySlots, len(phantoms))
	if synchronizedStandbySlots && len(phantoms) > 0 {
		// Not yet understood (once in many runs, in the exactly-once pass): what each server said
		// about the end of the old timeline, for the next one who reads this.
		tail := func(s string) string { return s[max(0, len(s)-4000):] }
		t.Errorf("%d phantom events with synchronized_standby_slots set: %v\npromoted server's log (end):\n%s\nold primary's log (end):\n%s",
			len(phantoms), phantoms, tail(standby.Log()), tail(primary.Log()))
	}
	rep := checkPromoted(t, prefix, want, real, len(got))
	// The router survived the failover: it knew which transactions Kafka had acknowledged, and the
	// promoted server's history says how far its WAL is the old primary's. Nothing is sent twice.
	if rep.Duplicates > 0 {
		t.Errorf("%d duplicates after a failover the router survived: acknowledged transactions below the old timeline's end were sent again", rep.Duplicates)
	}
	if err := run.stop(); err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("stop: %v", err)
	}
}
