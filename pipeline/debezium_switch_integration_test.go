package pipeline

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// switchRow is one row the switch-over writer inserted: its aggregate and its place in the
// aggregate's sequence.
type switchRow struct {
	id, agg string
	seq     int
}

// switchWriter inserts transactions of 1-5 rows into Debezium's default table until stopped, each
// row's payload {"agg": ..., "seq": n} numbering its aggregate's events.
type switchWriter struct {
	mu   sync.Mutex
	rows []switchRow
	stop chan struct{}
	done chan error
	n    atomic.Int64
}

func startSwitchWriter(t *testing.T, f *testenv.Fixture, aggTypes []string) *switchWriter {
	t.Helper()
	w := &switchWriter{stop: make(chan struct{}), done: make(chan error, 1)}
	db, err := pgx.Connect(context.Background(), f.PostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer func() { _ = db.Close(context.Background()) }()
		seqs := map[string]int{}
		for {
			select {
			case <-w.stop:
				w.done <- nil
				return
			case <-time.After(5 * time.Millisecond):
			}
			ctx := context.Background()
			tx, err := db.Begin(ctx)
			if err != nil {
				w.done <- err
				return
			}
			var batch []switchRow
			for range 1 + rand.IntN(5) {
				agg := fmt.Sprintf("agg-%d", rand.IntN(20))
				seqs[agg]++
				r := switchRow{id: testenv.NewUUID(), agg: agg, seq: seqs[agg]}
				payload := fmt.Sprintf(`{"agg": %q, "seq": %d}`, agg, r.seq)
				if _, err := tx.Exec(ctx, "INSERT INTO "+f.Table+" (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, 'Moved', $4)",
					r.id, aggTypes[len(agg)%len(aggTypes)], agg, payload); err != nil {
					w.done <- err
					return
				}
				batch = append(batch, r)
			}
			if err := tx.Commit(ctx); err != nil {
				w.done <- err
				return
			}
			w.mu.Lock()
			w.rows = append(w.rows, batch...)
			w.mu.Unlock()
			w.n.Add(int64(len(batch)))
		}
	}()
	return w
}

func (w *switchWriter) Stop() ([]switchRow, error) {
	close(w.stop)
	err := <-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rows, err
}

// TestSwitchOverFromDebezium: Debezium's connector (defaults: StringConverter, routing by
// aggregatetype) streams Debezium's default table under load; it is stopped, and outbox-cdc starts
// with kafka.header_format debezium on the slot and publication Debezium created (FOR TABLE, every
// operation) — no resync, no --accept-gap — while the load goes on. Every row reaches its topic; per
// aggregate the events are in order, each aggregate in one partition (the one Debezium used), and the
// only duplicates are events Debezium had sent and not yet confirmed in the slot.
func TestSwitchOverFromDebezium(t *testing.T) {
	f := testenv.NewDebeziumFixture(t)
	run := fmt.Sprintf("%04x", rand.IntN(0xffff))
	aggTypes := []string{"order_sw" + run, "payment_sw" + run}
	slot, pub := f.Slot+"_dbz", f.Publication+"_dbz"
	dbz := testenv.StartDebezium(t, f, testenv.DebeziumConnector{Name: "switch_" + run, Slot: slot, Publication: pub})
	w := startSwitchWriter(t, f, aggTypes)
	testenv.WaitFor(t, time.Minute, "rows written under Debezium", func() bool { return w.n.Load() > 1500 })
	dbz.Stop()
	var confirmedAtStop string
	ctx := context.Background()
	if err := f.DB.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&confirmedAtStop); err != nil {
		t.Fatal(err)
	}
	writtenAtStop := w.n.Load()

	cfg := testConfig(f)
	cfg.Kafka.HeaderFormat = config.HeaderFormatDebezium
	cfg.Kafka.RecordTimestamp = config.RecordTimestampCommit
	cfg.ApplyFormatDefaults(nil)
	cfg.Postgres.Slot, cfg.Postgres.Publication = slot, pub
	cfg.Postgres.CreateSlot = false
	r := startPipeline(t, cfg)
	testenv.WaitFor(t, time.Minute, "rows written under outbox-cdc", func() bool { return w.n.Load() > writtenAtStop+1500 })
	rows, err := w.Stop()
	if err != nil {
		t.Fatalf("writer: %v", err)
	}
	var topics []string
	for _, ty := range aggTypes {
		topics = append(topics, "outbox.event."+ty)
	}
	ids := map[string]switchRow{}
	for _, row := range rows {
		ids[row.id] = row
	}
	recs := testenv.ConsumeUntil(t, f.Brokers, topics, func(recs []*kgo.Record) bool {
		seen := map[string]bool{}
		for _, rec := range recs {
			seen[header(rec, "id")] = true
		}
		return len(seen) >= len(rows)
	}, 2*time.Minute)
	if err := r.stop(); err != nil {
		t.Fatalf("router: %v", err)
	}

	// Per aggregate, in the order read: each new event is the next in the aggregate's sequence;
	// an event seen before is a duplicate (a replay of what Debezium had not confirmed).
	type aggState struct {
		next      int
		partition int32
		topic     string
	}
	states := map[string]*aggState{}
	seen := map[string]bool{}
	duplicates := 0
	for _, rec := range recs {
		id := header(rec, "id")
		row, ok := ids[id]
		if !ok {
			t.Fatalf("record with id %q that no row has (topic %s)", id, rec.Topic)
		}
		var payload struct {
			Agg string `json:"agg"`
			Seq int    `json:"seq"`
		}
		if err := json.Unmarshal(rec.Value, &payload); err != nil || payload.Agg != row.agg || payload.Seq != row.seq || string(rec.Key) != row.agg {
			t.Fatalf("record %s: key %q value %q, want aggregate %s seq %d", id, rec.Key, rec.Value, row.agg, row.seq)
		}
		st := states[row.agg]
		if st == nil {
			st = &aggState{next: 1, partition: rec.Partition, topic: rec.Topic}
			states[row.agg] = st
		}
		if rec.Partition != st.partition || rec.Topic != st.topic {
			t.Errorf("aggregate %s on %s/%d and %s/%d: one aggregate must stay in one partition", row.agg, st.topic, st.partition, rec.Topic, rec.Partition)
		}
		switch {
		case seen[id]:
			duplicates++
		case row.seq != st.next:
			t.Errorf("aggregate %s: event %d arrived when %d was next", row.agg, row.seq, st.next)
			st.next = row.seq + 1
		default:
			st.next++
		}
		seen[id] = true
	}
	missing := 0
	for id := range ids {
		if !seen[id] {
			missing++
		}
	}
	if missing > 0 {
		t.Fatalf("%d of %d rows never arrived", missing, len(ids))
	}
	t.Logf("switch-over: %d rows (%d under Debezium, the rest under outbox-cdc), %d duplicates (Debezium's slot stood at %s when it stopped), %d aggregates in order",
		len(rows), writtenAtStop, duplicates, confirmedAtStop, len(states))
}

// header returns the value of rec's first header named key.
func header(rec *kgo.Record, key string) string {
	for _, h := range rec.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
