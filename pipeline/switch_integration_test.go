package pipeline

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// TestSwitchDeliveryBothWays: one slot streamed exactly-once, then at-least-once, then exactly-once
// again, each stopped gracefully, writers in between: the at-least-once router's graceful stop
// writes a hand-over checkpoint, so the switch back is no gap; every event reaches a read_committed
// consumer. The guard stays: the slot dropped and created anew, streamed at-least-once and stopped
// gracefully, hands nothing over (it did not deliver what lies between), and exactly-once refuses
// the gap.
func TestSwitchDeliveryBothWays(t *testing.T) {
	f := testenv.NewFixture(t)
	eos, alo := eosConfig(f), alsConfig(f)
	ctx := context.Background()
	gen := testenv.NewGenerator(4, "Switched")
	topics := testenv.TopicsOf(f, "Switched")
	var want []testenv.Event
	phase := func(cfg func() *running, n int) {
		t.Helper()
		run := cfg()
		evs := make([]testenv.Event, n)
		for i := range evs {
			evs[i] = gen.Event(i)
		}
		if err := testenv.InsertTx(ctx, f.DB, f.Table, evs, false); err != nil {
			t.Fatal(err)
		}
		want = append(want, evs...)
		testenv.ConsumeDistinct(t, f.Brokers, topics, len(want), time.Minute, readCommitted)
		if err := run.stop(); err != nil {
			t.Fatalf("stop: %v", err)
		}
	}
	phase(func() *running { return startPipeline(t, eos) }, 3)
	phase(func() *running { return startPipeline(t, alo) }, 3)
	phase(func() *running { return startPipeline(t, eos) }, 3) // refused as a gap without the hand-over
	got := testenv.ConsumeDistinct(t, f.Brokers, topics, len(want), time.Minute, readCommitted)
	testenv.VerifyDelivery(t, f, want, got)

	// The slot dropped and created anew: rows written meanwhile are in no slot. An at-least-once
	// router on the new slot stops gracefully, but hands nothing over.
	if _, err := f.DB.Exec(ctx, "SELECT pg_drop_replication_slot($1)", f.Slot); err != nil {
		t.Fatal(err)
	}
	if err := testenv.InsertTx(ctx, f.DB, f.Table, []testenv.Event{gen.Event(0)}, false); err != nil {
		t.Fatal(err)
	}
	run := startPipeline(t, alo)
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	p, err := New(eos, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := p.Run(rctx); !errors.Is(err, checkpoint.ErrGap) {
		t.Fatalf("exactly-once after a re-created slot streamed at-least-once: %v, want the gap refused", err)
	}
}
