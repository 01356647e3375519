package router

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// TestNextTransactionBeginsOnceTheLastIsComplete, on the real broker: EndTxn returns before the
// coordinator has written the commit markers, and a record produced into the next transaction
// meanwhile waits inside the broker for its retry backoff (20 ms). The router begins the next
// transaction only once the coordinator says the last one is complete, so back-to-back commits
// never find it still preparing. (Checked by breaking it: without the wait in begin, most rounds
// find PrepareCommit; without the pause between questions, some commit asks more often than
// the pauses allow.)
func TestNextTransactionBeginsOnceTheLastIsComplete(t *testing.T) {
	brokers := testenv.Brokers(t)
	suffix := fmt.Sprintf("%d", time.Now().UnixNano())
	rules, err := NewRules(config.Routing{Topic: "settle-" + suffix + "-{event_type}"}, defaultCols)
	if err != nil {
		t.Fatal(err)
	}
	slot := checkpoint.SlotID{SystemID: "settle", Database: "db", Slot: "s" + suffix}
	obs := &commits{}
	r, err := New(Options{
		Observer:     obs,
		Kafka:        config.Kafka{Brokers: brokers, ClientID: "test", CreateTopics: true, TopicPartitions: 1, TopicReplicationFactor: 1, MaxMessageBytes: 100000},
		Limits:       config.Limits{MinInFlightRecords: 10, MaxInFlightRecords: 10, MaxInFlightBytes: 1 << 20},
		Rules:        rules,
		Columns:      defaultCols,
		Transactions: &Transactions{Slot: slot, Topic: "settle-" + suffix + "-checkpoints", Timeout: 30 * time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := r.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.Fence(ctx); err != nil {
		t.Fatal(err)
	}
	admin, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	id := slot.TransactionalID()
	const rounds = 30
	for i := range rounds {
		if err := send(t, r, row("e", fmt.Sprintf("e%d", i)), func() {}); err != nil {
			t.Fatal(err)
		}
		if err := r.Commit(ctx, checkpoint.Record{LSN: checkpoint.LSN(100 + i)}); err != nil {
			t.Fatalf("round %d: commit: %v", i, err)
		}
		if err := r.begin(); err != nil {
			t.Fatal(err)
		}
		described, err := kadm.NewClient(admin).DescribeTransactions(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if state := described[id].State; strings.HasPrefix(state, "Prepare") {
			t.Fatalf("round %d: the next transaction began while the last was %s on its coordinator", i, state)
		}
	}
	last, err := r.ReadCheckpoint(ctx)
	if err != nil || last == nil || last.LSN != checkpoint.LSN(100+rounds-1) {
		t.Fatalf("checkpoint read back %+v (%v), want the last round's", last, err)
	}
	// Every commit was observed with its phases: one record, acknowledged, then EndTxn.
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.seen) != rounds {
		t.Fatalf("observed %d commits, want %d", len(obs.seen), rounds)
	}
	for i, c := range obs.seen {
		if c.Records != 1 || c.Flush <= 0 || c.End <= 0 || c.Settle < 0 || c.Latency() != c.Flush+c.End {
			t.Errorf("commit %d observed as %+v: want 1 record and positive flush and end times", i, c)
		}
		// The coordinator is asked with pauses between, not once per round trip.
		if c.SettleAsks < 1 || c.SettleAsks > asksWithin(c.Settle) {
			t.Errorf("commit %d: settle asked the coordinator %d times in %v, want 1 to %d (paced)", i, c.SettleAsks, c.Settle, asksWithin(c.Settle))
		}
	}
}

// asksWithin is how many times settle can ask within d when it pauses as it should: once at the
// start, then once after each pause (settlePause, doubling up to settlePauseMax) that ended by d.
func asksWithin(d time.Duration) int {
	asks, pause, waited := 1, settlePause, time.Duration(0)
	for waited+pause <= d {
		asks++
		waited += pause
		pause = min(2*pause, settlePauseMax)
	}
	return asks
}

// commits is a TxnObserver that keeps what it is told.
type commits struct {
	mu   sync.Mutex
	seen []TxnCommit
}

func (*commits) Produced(string, string, int, time.Duration, time.Duration) {}
func (*commits) DeadLettered(string, string)                                {}
func (c *commits) TransactionCommitted(t TxnCommit) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seen = append(c.seen, t)
}
