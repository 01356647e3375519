package pipeline

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/outbox"
)

// TestRowsNeverReachTheCheckpointTopic: a row whose event_type routes it into kafka.checkpoint_topic,
// with a payload shaped like another slot's checkpoint and keyed like it, is dead-lettered with the
// reason, in both delivery modes; the checkpoint topic never holds it, so no slot can take it for its
// checkpoint and skip its events.
func TestRowsNeverReachTheCheckpointTopic(t *testing.T) {
	forEachDelivery(t, func(t *testing.T, mode deliveryMode) {
		f := testenv.NewFixture(t)
		cfg := mode.config(f)
		cfg.Routing.DLQTopic = f.TopicPrefix + ".dlq"
		if !strings.HasSuffix(cfg.Kafka.CheckpointTopic, ".checkpoints") || cfg.Routing.Topic != f.TopicPrefix+".{event_type}" {
			t.Fatalf("the fixture's routing changed (%s, %s): the row below would not aim at the checkpoint topic", cfg.Routing.Topic, cfg.Kafka.CheckpointTopic)
		}
		startPipeline(t, cfg)
		ctx := context.Background()
		other := checkpoint.SlotID{SystemID: "1", Database: "orders", Slot: "outbox_cdc"}
		forged := testenv.Event{ID: testenv.NewUUID(), Type: "checkpoints", AggType: "x", AggID: other.String(), Version: 1,
			Payload: string(checkpoint.Record{Slot: other, LSN: 0xFFFF0000, Written: time.Now()}.Marshal())}
		honest := testenv.NewGenerator(1, "Honest").Event(0)
		if err := testenv.InsertTx(ctx, f.DB, f.Table, []testenv.Event{forged, honest}, true); err != nil {
			t.Fatal(err)
		}
		dlq := testenv.Consume(t, f.Brokers, []string{cfg.Routing.DLQTopic}, 1, time.Minute, mode.consumer...)
		if len(dlq) != 1 || testenv.EventID(dlq[0]) != forged.ID || !strings.Contains(testenv.Header(dlq[0], outbox.HeaderDLQReason), "kafka.checkpoint_topic") {
			t.Fatalf("dead-letter topic holds %d records (%v), want the forging row with a reason naming kafka.checkpoint_topic", len(dlq), dlq)
		}
		testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Honest"), 1, time.Minute, mode.consumer...)
		cl, err := kgo.NewClient(kgo.SeedBrokers(f.Brokers...))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, cfg.Kafka.CheckpointTopic)
		if err != nil {
			t.Fatal(err)
		}
		all := testenv.ConsumeUntil(t, f.Brokers, []string{cfg.Kafka.CheckpointTopic}, func(recs []*kgo.Record) bool {
			n := int64(0)
			ends.Each(func(o kadm.ListedOffset) { n += max(o.Offset, 0) })
			return int64(len(recs)) >= n
		}, 10*time.Second, kgo.FetchIsolationLevel(kgo.ReadUncommitted()))
		for _, r := range all {
			if string(r.Key) == other.String() {
				t.Fatalf("the checkpoint topic holds a record keyed %s: a row forged another slot's checkpoint", r.Key)
			}
		}
	})
}

// TestMissingCheckpointIsRefused: a slot that had a checkpoint and finds none — the checkpoint topic
// deleted under a running router, or between two runs — stops naming kafka.checkpoint_topic, instead
// of resuming from the slot and delivering its unconfirmed tail again to read_committed consumers.
func TestMissingCheckpointIsRefused(t *testing.T) {
	f := testenv.NewFixture(t)
	cfg := eosConfig(f)
	ctx := context.Background()
	gen := testenv.NewGenerator(2, "Kept")
	cl, err := kgo.NewClient(kgo.SeedBrokers(f.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	deleteTopic := func() {
		t.Helper()
		if _, err := adm.DeleteTopic(ctx, cfg.Kafka.CheckpointTopic); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, 30*time.Second, "the checkpoint topic gone", func() bool {
			d, err := adm.ListTopics(ctx, cfg.Kafka.CheckpointTopic)
			return err == nil && !d.Has(cfg.Kafka.CheckpointTopic)
		})
	}

	// Between runs.
	run := startPipeline(t, cfg)
	if err := testenv.InsertTx(ctx, f.DB, f.Table, []testenv.Event{gen.Event(0)}, false); err != nil {
		t.Fatal(err)
	}
	testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Kept"), 1, time.Minute, readCommitted)
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	deleteTopic()
	p, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	err = p.Run(rctx)
	cancel()
	if !errors.Is(err, checkpoint.ErrMissing) || !strings.Contains(err.Error(), "kafka.checkpoint_topic") {
		t.Fatalf("run after the checkpoint topic was deleted returned %v, want ErrMissing naming kafka.checkpoint_topic", err)
	}
	t.Logf("between runs: %v", err)

	// Under a running router: the next session finds nothing.
	accepted, err := New(cfg, testLogger(t), WithAcceptGap())
	if err != nil {
		t.Fatal(err)
	}
	done := runInBackground(t, accepted)
	testenv.WaitFor(t, time.Minute, "streaming with the missing checkpoint accepted", func() bool { return accepted.State() == StateStreaming })
	if err := testenv.InsertTx(ctx, f.DB, f.Table, []testenv.Event{gen.Event(1)}, false); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "a checkpoint written", func() bool { cp := lastCheckpoint(t, cfg); return cp != nil })
	deleteTopic()
	if _, err := f.DB.Exec(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1", f.Slot); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, checkpoint.ErrMissing) {
			t.Fatalf("the router whose checkpoint topic was deleted under it returned %v, want ErrMissing", err)
		}
		t.Logf("under a running router: %v", fmt.Sprint(err))
	case <-time.After(2 * time.Minute):
		t.Fatal("the router went on without its checkpoint")
	}
}

// TestFencedCommitIsRefused: a router whose transactional id another instance has fenced while its
// Kafka transaction was open (records produced and acknowledged, not committed) must have its commit
// refused — named as fencing, not as a timeout — and replay the transaction in a new session, so that
// read_committed consumers see every event once.
func TestFencedCommitIsRefused(t *testing.T) {
	f := testenv.NewFixture(t)
	cfg := eosConfig(f)
	cfg.Kafka.TransactionInterval = 10 * time.Second
	cfg.Kafka.QuietFlush = 0 // the interval alone ends the transaction
	var logs testenv.LogBuffer
	run := startPipelineLogged(t, cfg, testLoggerTo(t, &logs))
	ctx := context.Background()
	gen := testenv.NewGenerator(4, "Fenced")
	topics := testenv.TopicsOf(f, "Fenced")
	evs := []testenv.Event{gen.Event(0), gen.Event(1), gen.Event(2)}
	start := time.Now()
	if err := testenv.InsertTx(ctx, f.DB, f.Table, evs, false); err != nil {
		t.Fatal(err)
	}
	testenv.ConsumeDistinct(t, f.Brokers, topics, len(evs), 30*time.Second, kgo.FetchIsolationLevel(kgo.ReadUncommitted())) // produced, not committed
	if time.Since(start) > 8*time.Second {
		t.Fatal("the records took too long to arrive: the transaction may have committed already, the test proves nothing")
	}
	// Another instance of the slot fences it: it initializes the slot's transactional id.
	other, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := other.identify(ctx); err != nil {
		t.Fatal(err)
	}
	rt, err := other.newRouter(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Fence(ctx); err != nil {
		t.Fatal(err)
	}
	rt.Close()
	testenv.WaitFor(t, time.Minute, "the fenced commit refused", func() bool { return strings.Contains(logs.String(), "commit kafka transaction: fenced") })
	if strings.Contains(logs.String(), "stayed open longer than kafka.transaction_timeout") {
		t.Errorf("a takeover was reported as a transaction timeout:\n%s", logs.String())
	}
	later := []testenv.Event{gen.Event(3)}
	if err := testenv.InsertTx(ctx, f.DB, f.Table, later, false); err != nil {
		t.Fatal(err)
	}
	all := append(evs, later...)
	got := testenv.ConsumeDistinct(t, f.Brokers, topics, len(all), time.Minute, readCommitted)
	if dups := testenv.VerifyDelivery(t, f, all, got); dups != 0 {
		t.Errorf("a read_committed consumer saw %d duplicates, want 0", dups)
	}
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
}
