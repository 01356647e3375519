package pipeline

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// TestPoisonRowCommitsTheTransactionsBeforeIt: exactly-once without a dead-letter topic, three
// PostgreSQL transactions in one Kafka transaction (a long transaction interval): two whole ones,
// then one whose second row can never be delivered (too large). The router stops with the row's
// error, but first commits the two whole transactions — they used to be aborted with the row's
// Kafka transaction and wait for a restart — and never the poison transaction's first row: a
// read_committed consumer sees exactly the events of the two.
func TestPoisonRowCommitsTheTransactionsBeforeIt(t *testing.T) {
	f := testenv.NewFixture(t)
	cfg := eosConfig(f)
	cfg.Kafka.TransactionInterval = 3 * time.Second
	cfg.Kafka.QuietFlush = 0
	cfg.Kafka.MaxMessageBytes = 4096
	p, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	testenv.WaitFor(t, time.Minute, "streaming", func() bool { return p.State() == StateStreaming })

	gen := testenv.NewGenerator(3, "Placed")
	first := []testenv.Event{gen.Event(0), gen.Event(1)}
	second := []testenv.Event{gen.Event(2), gen.Event(0)}
	head, poison := gen.Event(1), gen.Event(2)
	poison.Payload = `{"blob": "` + strings.Repeat("x", 10_000) + `"}`
	for _, tx := range [][]testenv.Event{first, second, {head, poison}} {
		if err := testenv.InsertTx(ctx, f.DB, f.Table, tx, false); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-done:
		var und *router.UndeliverableError
		if !errors.As(err, &und) || und.EventID != poison.ID {
			t.Fatalf("run: %v, want the poison row's UndeliverableError", err)
		}
	case <-ctx.Done():
		t.Fatal("the pipeline did not stop on the row that can never be delivered")
	}
	want := append(append([]testenv.Event{}, first...), second...)
	got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Placed"), len(want), time.Minute, readCommitted)
	testenv.VerifyDelivery(t, f, want, got)
	// Nothing of the poison transaction: its first row stays unread too.
	time.Sleep(time.Second)
	if extra := testenv.Consume(t, f.Brokers, testenv.TopicsOf(f, "Placed"), len(want)+1, 3*time.Second, readCommitted); len(extra) > len(want) {
		t.Errorf("a read_committed consumer saw %d records, want %d: part of the poison transaction was committed", len(extra), len(want))
	}
}
