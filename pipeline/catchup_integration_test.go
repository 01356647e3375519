package pipeline

import (
	"context"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// TestExactlyOnceCatchesUpInLargerTransactions: a backlog committed well before the router reads it
// goes into Kafka in transactions larger than kafka.transaction_max_records allows a stream that
// keeps up (the server's send time of each transaction, against its commit time, says it is late),
// and arrives whole, in order, without duplicates.
func TestExactlyOnceCatchesUpInLargerTransactions(t *testing.T) {
	f := testenv.NewFixture(t)
	cfg := eosConfig(f)
	const perTx, txs = 50, 40
	cfg.Kafka.TransactionMaxRecords = perTx // keeping up: one PostgreSQL transaction per Kafka transaction
	ctx := context.Background()
	run := startPipeline(t, cfg) // creates the slot
	if err := run.stop(); err != nil {
		t.Fatalf("pipeline: %v", err)
	}
	gen := testenv.NewGenerator(20, "OrderCreated", "OrderPaid")
	var all []testenv.Event
	for i := 0; i < txs; i++ {
		evs := make([]testenv.Event, perTx)
		for j := range evs {
			evs[j] = gen.Event(i*perTx + j)
		}
		if err := testenv.InsertTx(ctx, f.DB, f.Table, evs, false); err != nil {
			t.Fatal(err)
		}
		all = append(all, evs...)
	}
	time.Sleep(catchUpBehind + 500*time.Millisecond) // the backlog is late by more than catchUpBehind

	run = startPipeline(t, cfg)
	topics := testenv.TopicsOf(f, "OrderCreated", "OrderPaid")
	got := testenv.ConsumeDistinct(t, f.Brokers, topics, len(all), time.Minute, readCommitted)
	if dups := testenv.VerifyDelivery(t, f, all, got); dups != 0 {
		t.Errorf("a read_committed consumer saw %d duplicates, want 0", dups)
	}
	if err := run.stop(); err != nil {
		t.Fatalf("pipeline: %v", err)
	}
	// Keeping up, the backlog would take at least txs Kafka transactions; catching up, each may hold
	// catchUpFactor times as many rows.
	if n := run.p.Router.TransactionsCommitted.Load(); n == 0 || n > txs/2 {
		t.Errorf("the backlog of %d transactions of %d rows went into %d Kafka transactions, want fewer than %d (catching up: up to %d rows each)",
			txs, perTx, n, txs/2, perTx*catchUpFactor)
	} else {
		t.Logf("the backlog of %d transactions of %d rows went into %d Kafka transactions", txs, perTx, n)
	}
}
