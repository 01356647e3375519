package pipeline

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/outbox"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// TestTenThousandEventsInCommitOrder writes 10,000 events over 50 aggregates in transactions of 1-50
// rows and checks that every one arrives on its topic with the right key, value and headers, and per
// aggregate in commit order.
func TestTenThousandEventsInCommitOrder(t *testing.T) {
	f := testenv.NewFixture(t)
	types := []string{"OrderCreated", "OrderPaid", "OrderShipped"}
	run := startPipeline(t, testConfig(f))

	rng := rand.New(rand.NewPCG(1, 2))
	gen := testenv.NewGenerator(50, types...)
	var all []testenv.Event
	ctx := context.Background()
	for len(all) < 10000 {
		n := min(1+rng.IntN(50), 10000-len(all))
		evs := make([]testenv.Event, n)
		for i := range evs {
			evs[i] = gen.Event(rng.IntN(50))
		}
		// Every third transaction deletes its rows again, as applications do to keep the outbox empty.
		if err := testenv.InsertTx(ctx, f.DB, f.Table, evs, rng.IntN(3) == 0); err != nil {
			t.Fatal(err)
		}
		all = append(all, evs...)
	}
	got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, types...), len(all), 2*time.Minute)
	dups := testenv.VerifyDelivery(t, f, all, got)
	t.Logf("%d events delivered, %d duplicates", len(all), dups)
	if err := run.stop(); err != nil {
		t.Fatalf("pipeline: %v", err)
	}
	if run.p.Router.Produced.Load() < int64(len(all)) {
		t.Errorf("router counted %d produced, want at least %d", run.p.Router.Produced.Load(), len(all))
	}
}

// TestInsertAndDeleteInOneTransaction: rows deleted by the transaction that inserted them are still
// delivered, because the WAL carries the insert.
func TestInsertAndDeleteInOneTransaction(t *testing.T) {
	f := testenv.NewFixture(t)
	startPipeline(t, testConfig(f))
	gen := testenv.NewGenerator(3, "ItemReserved")
	var all []testenv.Event
	for i := 0; i < 20; i++ {
		evs := []testenv.Event{gen.Event(i), gen.Event(i + 1)}
		if err := testenv.InsertTx(context.Background(), f.DB, f.Table, evs, true); err != nil {
			t.Fatal(err)
		}
		all = append(all, evs...)
	}
	var left int
	if err := f.DB.QueryRow(context.Background(), "SELECT count(*) FROM "+f.Table).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Fatalf("outbox holds %d rows, want 0", left)
	}
	got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "ItemReserved"), len(all), time.Minute)
	testenv.VerifyDelivery(t, f, all, got)
}

// TestGracefulStopConfirmsAcknowledged: a graceful stop while records are handed to Kafka and not
// yet acknowledged (a long linger holds them), or in exactly-once mode acknowledged in a Kafka
// transaction still open (a long transaction interval), flushes and commits them and confirms them
// in the final status update, so a restart delivers nothing again.
func TestGracefulStopConfirmsAcknowledged(t *testing.T) {
	forEachDelivery(t, testGracefulStopConfirmsAcknowledged)
}

func testGracefulStopConfirmsAcknowledged(t *testing.T, mode deliveryMode) {
	f := testenv.NewFixture(t)
	cfg := mode.config(f)
	cfg.Kafka.Linger = 5 * time.Second
	cfg.Kafka.QuietFlush = 0 // the linger, or the transaction interval, holds the records
	eos := cfg.Kafka.ExactlyOnce()
	if eos {
		// Long enough that the transaction is still open when the check below runs, even when a new
		// topic takes seconds to take its first records on a loaded machine; the stop commits it.
		cfg.Kafka.Linger = 10 * time.Millisecond
		cfg.Kafka.TransactionInterval = 30 * time.Second
	}
	run := startPipeline(t, cfg)
	gen := testenv.NewGenerator(2, "Ping")
	evs := []testenv.Event{gen.Event(0), gen.Event(1)}
	if err := testenv.InsertTx(context.Background(), f.DB, f.Table, evs, false); err != nil {
		t.Fatal(err)
	}
	var afterCommit string
	if err := f.DB.QueryRow(context.Background(), "SELECT pg_current_wal_lsn()::text").Scan(&afterCommit); err != nil {
		t.Fatal(err)
	}
	if eos {
		testenv.WaitFor(t, 30*time.Second, "records acknowledged in an open Kafka transaction", func() bool { return run.p.Router.Produced.Load() == int64(len(evs)) })
	} else {
		testenv.WaitFor(t, 30*time.Second, "records in flight", func() bool { return run.p.Router.InFlightRecords.Load() == int64(len(evs)) })
	}
	if c := testenv.MustLSN(t, f.ConfirmedFlushLSN(t)); c >= testenv.MustLSN(t, afterCommit) {
		t.Fatalf("confirmed %s before the records were delivered", c)
	}
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	testenv.VerifyDelivery(t, f, evs, testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Ping"), len(evs), time.Minute))
	confirmed := testenv.MustLSN(t, f.ConfirmedFlushLSN(t))
	if confirmed < testenv.MustLSN(t, afterCommit) {
		t.Fatalf("confirmed_flush_lsn %s is behind the last commit (wal was at %s after it)", confirmed, afterCommit)
	}
	// A restart must not deliver the events again.
	again := startPipeline(t, mode.config(f))
	time.Sleep(3 * time.Second)
	if n := again.p.Router.Produced.Load(); n != 0 {
		t.Fatalf("restart after a graceful stop produced %d records again", n)
	}
}

// TestQuietStreamSendsAtOnce: with a linger (at-least-once) or a transaction interval (exactly-once)
// of a minute, a transaction written while nothing else happens must still reach a consumer within
// seconds: once the WAL stream goes quiet after it, kafka.quiet_flush sends it without waiting.
func TestQuietStreamSendsAtOnce(t *testing.T) {
	forEachDelivery(t, testQuietStreamSendsAtOnce)
}

func testQuietStreamSendsAtOnce(t *testing.T, mode deliveryMode) {
	f := testenv.NewFixture(t)
	cfg := mode.config(f)
	cfg.Kafka.Linger, cfg.Kafka.TransactionInterval, cfg.Kafka.TransactionTimeout = time.Minute, time.Minute, 3*time.Minute
	startPipeline(t, cfg)
	gen := testenv.NewGenerator(2, "Quiet")
	// The first transaction creates the topic; the second one comes to a stream that is all set.
	for round := 1; round <= 2; round++ {
		evs := []testenv.Event{gen.Event(0), gen.Event(1), gen.Event(0)}
		if err := testenv.InsertTx(context.Background(), f.DB, f.Table, evs, false); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Quiet"), 3*round, 20*time.Second, mode.consumer...)
		ids := map[string]bool{}
		for _, r := range got {
			ids[testenv.Header(r, "event_id")] = true
		}
		if distinct := len(ids); distinct < 3*round {
			t.Fatalf("round %d: %d of %d events in Kafka after %s; a linger or transaction interval of a minute held them",
				round, distinct, 3*round, time.Since(start).Round(time.Millisecond))
		}
		t.Logf("round %d: all in Kafka after %s", round, time.Since(start).Round(time.Millisecond))
	}
}

// TestIdleOutboxDoesNotPinWAL writes 50 MB to another table while the outbox is idle; the slot's
// confirmed_flush_lsn must pass those writes within 15 seconds.
func TestIdleOutboxDoesNotPinWAL(t *testing.T) {
	forEachDelivery(t, testIdleOutboxDoesNotPinWAL)
}

func testIdleOutboxDoesNotPinWAL(t *testing.T, mode deliveryMode) {
	f := testenv.NewFixture(t)
	startPipeline(t, mode.config(f))
	ctx := context.Background()
	busyOtherTable(t, f, 50)
	var target string
	if err := f.DB.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&target); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	want := testenv.MustLSN(t, target)
	testenv.WaitFor(t, 15*time.Second, "confirmed_flush_lsn to pass "+target, func() bool {
		return testenv.MustLSN(t, f.ConfirmedFlushLSN(t)) >= want
	})
	t.Logf("confirmed_flush_lsn passed %s after %s", target, time.Since(start).Round(time.Millisecond))
}

// TestAlterTableUnderLoad adds a column to the outbox while events are written; nothing is lost.
func TestAlterTableUnderLoad(t *testing.T) {
	f := testenv.NewFixture(t)
	startPipeline(t, testConfig(f))
	ctx := context.Background()
	gen := testenv.NewGenerator(10, "StockChanged")
	var all []testenv.Event
	for i := 0; i < 300; i++ {
		if i == 150 {
			if _, err := f.DB.Exec(ctx, "ALTER TABLE "+f.Table+" ADD COLUMN tenant text DEFAULT 'acme'"); err != nil {
				t.Fatal(err)
			}
		}
		evs := []testenv.Event{gen.Event(i), gen.Event(i * 7)}
		if err := testenv.InsertTx(ctx, f.DB, f.Table, evs, i%2 == 0); err != nil {
			t.Fatal(err)
		}
		all = append(all, evs...)
	}
	got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "StockChanged"), len(all), time.Minute)
	testenv.VerifyDelivery(t, f, all, got)
}

// TestPoisonRowGoesToDLQ: a payload over the maximum message size lands in the dead-letter topic
// with its reason, and the rows around it are delivered in order.
func TestPoisonRowGoesToDLQ(t *testing.T) {
	forEachDelivery(t, testPoisonRowGoesToDLQ)
}

func testPoisonRowGoesToDLQ(t *testing.T, mode deliveryMode) {
	f := testenv.NewFixture(t)
	cfg := mode.config(f)
	cfg.Routing.DLQTopic = f.TopicPrefix + ".dlq"
	startPipeline(t, cfg)
	ctx := context.Background()
	gen := testenv.NewGenerator(1, "Big")
	before, poison, after := gen.Event(0), gen.Event(0), gen.Event(0)
	poison.Payload = `{"blob": "` + strings.Repeat("x", 1_500_000) + `"}`
	for _, e := range []testenv.Event{before, poison, after} {
		if err := testenv.InsertTx(ctx, f.DB, f.Table, []testenv.Event{e}, true); err != nil {
			t.Fatal(err)
		}
	}
	got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Big"), 2, time.Minute, mode.consumer...)
	testenv.VerifyDelivery(t, f, []testenv.Event{before, after}, got)

	dlq := testenv.Consume(t, f.Brokers, []string{cfg.Routing.DLQTopic}, 1, time.Minute, mode.consumer...)
	if len(dlq) != 1 {
		t.Fatalf("dead-letter topic holds %d records, want 1", len(dlq))
	}
	d := dlq[0]
	if id := testenv.Header(d, "event_id"); id != poison.ID {
		t.Errorf("dead-letter record is event %s, want %s", id, poison.ID)
	}
	if reason := testenv.Header(d, outbox.HeaderDLQReason); !strings.Contains(reason, "max_message_bytes") {
		t.Errorf("dead-letter reason %q does not name the size limit", reason)
	}
	if testenv.Header(d, outbox.HeaderDLQSourceLSN) == "" || testenv.Header(d, outbox.HeaderDLQTime) == "" {
		t.Errorf("dead-letter record lacks source LSN or time headers: %v", d.Headers)
	}
	if string(d.Key) != poison.AggID {
		t.Errorf("dead-letter key %q, want %q", d.Key, poison.AggID)
	}
}

// TestPoisonRowWithoutDLQStops: with no dead-letter topic, an undeliverable row stops the pipeline
// with an error naming the event, and the slot does not move past it.
func TestPoisonRowWithoutDLQStops(t *testing.T) {
	f := testenv.NewFixture(t)
	cfg := testConfig(f)
	p, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	gen := testenv.NewGenerator(1, "Bad")
	good, bad := gen.Event(0), gen.Event(0)
	bad.AggID = "" // the Kafka key may not be empty
	done := make(chan error, 1)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { done <- p.Run(runCtx) }()
	testenv.WaitFor(t, 30*time.Second, "pipeline streaming", func() bool { return p.State() == StateStreaming })
	if err := testenv.InsertTx(ctx, f.DB, f.Table, []testenv.Event{good}, false); err != nil {
		t.Fatal(err)
	}
	testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Bad"), 1, time.Minute)
	var beforeBad string
	if err := f.DB.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&beforeBad); err != nil {
		t.Fatal(err)
	}
	if err := testenv.InsertTx(ctx, f.DB, f.Table, []testenv.Event{bad}, false); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		var undeliverable *router.UndeliverableError
		if !errors.As(err, &undeliverable) || undeliverable.EventID != bad.ID {
			t.Fatalf("pipeline returned %v, want an UndeliverableError naming %s", err, bad.ID)
		}
		if !strings.Contains(err.Error(), bad.ID) {
			t.Fatalf("error %q does not name the event", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("pipeline did not stop on an undeliverable row")
	}
	if c := testenv.MustLSN(t, f.ConfirmedFlushLSN(t)); c > testenv.MustLSN(t, beforeBad) {
		t.Fatalf("slot confirmed %s, past the undeliverable row's transaction (which began after %s)", c, beforeBad)
	}
}

// TestBrokerOutageUnderLoad stops the broker for 20 s while events are written: the slot's
// confirmed_flush_lsn must never pass what was acknowledged before the broker went away, and every
// event arrives once it is back.
func TestBrokerOutageUnderLoad(t *testing.T) {
	forEachDelivery(t, testBrokerOutageUnderLoad)
}

func testBrokerOutageUnderLoad(t *testing.T, mode deliveryMode) {
	f := testenv.NewFixture(t)
	cfg := mode.config(f)
	cfg.Limits.MaxInFlightRecords = 2000
	startPipeline(t, cfg)
	ctx := context.Background()

	writer := testenv.StartWriter(t, f, testenv.NewGenerator(20, "Payment"), 3, 5*time.Millisecond, true)
	time.Sleep(3 * time.Second)
	testenv.StopKafka(t)
	var stopLSN string
	if err := f.DB.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&stopLSN); err != nil {
		t.Fatal(err)
	}
	limit := testenv.MustLSN(t, stopLSN)
	outageEnd := time.Now().Add(20 * time.Second)
	samples := 0
	for time.Now().Before(outageEnd) {
		if c := testenv.MustLSN(t, f.ConfirmedFlushLSN(t)); c > limit {
			t.Fatalf("confirmed_flush_lsn %s passed %s, the WAL position when the broker had stopped", c, limit)
		}
		samples++
		time.Sleep(250 * time.Millisecond)
	}
	testenv.StartKafka(t)
	time.Sleep(3 * time.Second)
	want, err := writer.Stop()
	if err != nil {
		t.Fatalf("writer: %v", err)
	}
	got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Payment"), len(want), 3*time.Minute, mode.consumer...)
	dups := testenv.VerifyDelivery(t, f, want, got)
	t.Logf("%d events written, outage checked by %d samples, %d duplicates", len(want), samples, dups)
	mode.checkDuplicates(t, dups)
}

// TestPayloadColumnTypes: json, text and bytea payload columns are forwarded as stored (bytea as its
// raw bytes), like jsonb; so is a payload of a domain over bytea (decoded as its base type).
func TestPayloadColumnTypes(t *testing.T) {
	tests := []struct {
		name, alter, insertExpr, want string
	}{
		{"json keeps its text", "json USING payload::json", `'{"b":1,  "a":2}'::json`, `{"b":1,  "a":2}`},
		{"text", "text USING payload::text", `'plain text, not JSON'`, `plain text, not JSON`},
		{"bytea raw bytes", "bytea USING convert_to(payload::text, 'UTF8')", `'\x00ff10'::bytea`, "\x00\xff\x10"},
		{"domain over a domain over bytea", "%s_bytes2 USING convert_to(payload::text, 'UTF8')", `'\x00ff10'::bytea`, "\x00\xff\x10"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := testenv.NewFixture(t)
			ctx := context.Background()
			if strings.Contains(tt.alter, "%s") {
				tt.alter = fmt.Sprintf(tt.alter, f.Table)
				for _, ddl := range []string{"CREATE DOMAIN " + f.Table + "_bytes AS bytea", "CREATE DOMAIN " + f.Table + "_bytes2 AS " + f.Table + "_bytes CHECK (octet_length(VALUE) < 1000)"} {
					if _, err := f.DB.Exec(ctx, ddl); err != nil {
						t.Fatal(err)
					}
				}
				t.Cleanup(func() { _, _ = f.DB.Exec(context.Background(), "DROP DOMAIN IF EXISTS "+f.Table+"_bytes CASCADE") })
			}
			if _, err := f.DB.Exec(ctx, "ALTER TABLE "+f.Table+" ALTER COLUMN payload TYPE "+tt.alter); err != nil {
				t.Fatal(err)
			}
			startPipeline(t, testConfig(f))
			if _, err := f.DB.Exec(ctx, "INSERT INTO "+f.Table+" (event_id, event_type, aggregate_id, payload) VALUES (gen_random_uuid(), 'Typed', 'a1', "+tt.insertExpr+")"); err != nil {
				t.Fatal(err)
			}
			got := testenv.Consume(t, f.Brokers, testenv.TopicsOf(f, "Typed"), 1, time.Minute)
			if len(got) != 1 {
				t.Fatalf("got %d records", len(got))
			}
			if string(got[0].Value) != tt.want {
				t.Fatalf("value %q, want %q", got[0].Value, tt.want)
			}
		})
	}
}

// TestReconnectsAfterConnectionLoss terminates the walsender twice under load: the pipeline
// reconnects with backoff, replays from the slot, and nothing is lost.
func TestReconnectsAfterConnectionLoss(t *testing.T) {
	forEachDelivery(t, testReconnectsAfterConnectionLoss)
}

func testReconnectsAfterConnectionLoss(t *testing.T, mode deliveryMode) {
	f := testenv.NewFixture(t)
	run := startPipeline(t, mode.config(f))
	writer := testenv.StartWriter(t, f, testenv.NewGenerator(10, "Reserved"), 3, 5*time.Millisecond, true)
	admin, err := pgx.Connect(context.Background(), f.AdminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	for i := 0; i < 2; i++ {
		time.Sleep(time.Second)
		var terminated bool
		testenv.WaitFor(t, time.Minute, "pipeline streaming, and its walsender terminated", func() bool {
			if run.p.State() != StateStreaming {
				return false
			}
			err := admin.QueryRow(context.Background(),
				"SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL", f.Slot).Scan(&terminated)
			return err == nil && terminated
		})
	}
	time.Sleep(time.Second)
	want, err := writer.Stop()
	if err != nil {
		t.Fatal(err)
	}
	got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Reserved"), len(want), 2*time.Minute, mode.consumer...)
	dups := testenv.VerifyDelivery(t, f, want, got)
	mode.checkDuplicates(t, dups)
	s := run.p.Health()
	t.Logf("%d events across 2 connection losses: %d reconnects, %d duplicates", len(want), s.Restarts, dups)
	if s.Restarts < 2 || s.Errors["postgres"] < 2 {
		t.Errorf("snapshot counts %d reconnects and %v errors, want at least 2 postgres failures", s.Restarts, s.Errors)
	}
}

// TestTopicMaxMessageBytesIsRespected: a topic whose max.message.bytes is below kafka.max_message_bytes
// takes the records that fit; a larger one is dead-lettered with the topic's limit as its reason, and
// the records around it (same aggregate, same batch window) are delivered in order.
func TestTopicMaxMessageBytesIsRespected(t *testing.T) {
	f := testenv.NewFixture(t)
	topic := f.TopicPrefix + ".Small"
	cl, err := kgo.NewClient(kgo.SeedBrokers(f.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	limit := "4096"
	if _, err := kadm.NewClient(cl).CreateTopic(context.Background(), 1, -1, map[string]*string{"max.message.bytes": &limit}, topic); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(f)
	cfg.Routing.DLQTopic = f.TopicPrefix + ".dlq"
	startPipeline(t, cfg)
	gen := testenv.NewGenerator(1, "Small")
	before, big, after := gen.Event(0), gen.Event(0), gen.Event(0)
	big.Payload = `{"blob": "` + strings.Repeat("y", 10000) + `"}`
	if err := testenv.InsertTx(context.Background(), f.DB, f.Table, []testenv.Event{before, big, after}, true); err != nil {
		t.Fatal(err)
	}
	got := testenv.ConsumeDistinct(t, f.Brokers, []string{topic}, 2, time.Minute)
	testenv.VerifyDelivery(t, f, []testenv.Event{before, after}, got)
	dlq := testenv.Consume(t, f.Brokers, []string{cfg.Routing.DLQTopic}, 1, time.Minute)
	if len(dlq) != 1 || testenv.Header(dlq[0], "event_id") != big.ID {
		t.Fatalf("dead-letter topic holds %d records, want the big event", len(dlq))
	}
	if reason := testenv.Header(dlq[0], outbox.HeaderDLQReason); !strings.Contains(reason, "max.message.bytes of topic "+topic) {
		t.Errorf("reason %q does not name the topic's limit", reason)
	}
}

// TestKafkaSASL: the router authenticates with SASL/PLAIN and SCRAM-SHA-256; a wrong password is a
// clear error.
func TestKafkaSASL(t *testing.T) {
	f := testenv.NewFixture(t)
	cfg := testConfig(f)
	cfg.Kafka.Brokers = testenv.SASLBrokers(t)
	cfg.Kafka.SASL = config.KafkaSASL{Mechanism: "PLAIN", Username: "outbox", Password: "wrong"}
	p, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	if _, err := p.newRouter(ctx); err == nil || !strings.Contains(strings.ToLower(err.Error()), "authentication") {
		t.Fatalf("wrong SASL password: %v, want an authentication error", err)
	}
	for _, mechanism := range []string{"SCRAM-SHA-256", "PLAIN"} {
		cfg.Kafka.SASL = config.KafkaSASL{Mechanism: mechanism, Username: "outbox", Password: "outbox-secret"}
		p, err := New(cfg, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		rt, err := p.newRouter(ctx)
		if err != nil {
			t.Fatalf("%s: %v", mechanism, err)
		}
		rt.Close()
	}
	startPipeline(t, cfg)
	gen := testenv.NewGenerator(2, "Secured")
	evs := []testenv.Event{gen.Event(0), gen.Event(1), gen.Event(0)}
	if err := testenv.InsertTx(context.Background(), f.DB, f.Table, evs, true); err != nil {
		t.Fatal(err)
	}
	got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Secured"), len(evs), time.Minute)
	testenv.VerifyDelivery(t, f, evs, got)
}

// TestKafkaTLS: the router verifies the broker against kafka.tls.ca_file; without it, the broker's
// private CA is refused.
func TestKafkaTLS(t *testing.T) {
	f := testenv.NewFixture(t)
	brokers, ca := testenv.TLSBrokers(t)
	cfg := testConfig(f)
	cfg.Kafka.Brokers = brokers
	cfg.Kafka.TLS = config.KafkaTLS{Enabled: true}
	p, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	if _, err := p.newRouter(ctx); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("TLS without the private CA: %v, want a certificate error", err)
	}
	cfg.Kafka.TLS.CAFile = ca
	startPipeline(t, cfg)
	gen := testenv.NewGenerator(2, "Encrypted")
	evs := []testenv.Event{gen.Event(0), gen.Event(1)}
	if err := testenv.InsertTx(context.Background(), f.DB, f.Table, evs, true); err != nil {
		t.Fatal(err)
	}
	got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Encrypted"), len(evs), time.Minute)
	testenv.VerifyDelivery(t, f, evs, got)
}

// TestBrokerRejectionDeadLettersOnlyTheRecordAtFault: the broker itself rejects a batch (the topic's
// max.message.bytes was lowered after the router learned it), failing an oversized record and its
// small neighbours with the same error. Only the oversized record may be dead-lettered; the
// neighbours are replayed and delivered, in order, and nothing replays forever.
func TestBrokerRejectionDeadLettersOnlyTheRecordAtFault(t *testing.T) {
	forEachDelivery(t, testBrokerRejectionDeadLettersOnlyTheRecordAtFault)
}

func testBrokerRejectionDeadLettersOnlyTheRecordAtFault(t *testing.T, mode deliveryMode) {
	f := testenv.NewFixture(t)
	topic := f.TopicPrefix + ".Shrinking"
	cl, err := kgo.NewClient(kgo.SeedBrokers(f.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx := context.Background()
	if _, err := adm.CreateTopic(ctx, 1, -1, nil, topic); err != nil {
		t.Fatal(err)
	}
	cfg := mode.config(f)
	cfg.Routing.DLQTopic = f.TopicPrefix + ".dlq"
	run := startPipeline(t, cfg)
	gen := testenv.NewGenerator(1, "Shrinking")
	warm := gen.Event(0)
	if err := testenv.InsertTx(ctx, f.DB, f.Table, []testenv.Event{warm}, true); err != nil {
		t.Fatal(err)
	}
	testenv.ConsumeDistinct(t, f.Brokers, []string{topic}, 1, time.Minute, mode.consumer...)
	limit := "4096"
	if _, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "max.message.bytes", Value: &limit}}, topic); err != nil {
		t.Fatal(err)
	}
	before, big, after := gen.Event(0), gen.Event(0), gen.Event(0)
	// Random bytes: the producer compresses batches, and the broker checks the compressed size.
	noise := make([]byte, 12000)
	for i := range noise {
		noise[i] = byte(rand.IntN(256))
	}
	big.Payload = `{"blob": "` + base64.StdEncoding.EncodeToString(noise) + `"}`
	if err := testenv.InsertTx(ctx, f.DB, f.Table, []testenv.Event{before, big, after}, true); err != nil {
		t.Fatal(err)
	}
	got := testenv.ConsumeDistinct(t, f.Brokers, []string{topic}, 3, time.Minute, mode.consumer...)
	testenv.VerifyDelivery(t, f, []testenv.Event{warm, before, after}, got)
	dlq := testenv.Consume(t, f.Brokers, []string{cfg.Routing.DLQTopic}, 1, 30*time.Second, mode.consumer...)
	time.Sleep(time.Second)
	dlq = append(dlq, testenv.Consume(t, f.Brokers, []string{cfg.Routing.DLQTopic}, 100, 2*time.Second, mode.consumer...)[len(dlq):]...)
	if len(dlq) != 1 || testenv.Header(dlq[0], "event_id") != big.ID {
		ids := make([]string, len(dlq))
		for i, r := range dlq {
			ids[i] = testenv.Header(r, "event_id")
		}
		t.Fatalf("dead-letter topic holds %v, want only the big event %s", ids, big.ID)
	}
	t.Logf("dead-letter reason: %s; sessions rebuilt: %d", testenv.Header(dlq[0], outbox.HeaderDLQReason), run.p.Health().Restarts)
}

// TestCutInsideATransactionResendsNothingAcknowledged: pgoutput sends a transaction's rows before its
// commit, and the router produces them as they come, so a fault in the middle of a large transaction
// leaves rows Kafka acknowledged in a transaction the slot replays whole. At-least-once, a process
// that survives the fault must not send those rows again: two cuts inside one 60,000-row transaction,
// the second in the replay of the first, and not one duplicate.
func TestCutInsideATransactionResendsNothingAcknowledged(t *testing.T) {
	f := testenv.NewFixture(t)
	cfg := testConfig(f)
	cfg.Kafka.Delivery = config.DeliveryAtLeastOnce
	run := startPipeline(t, cfg)
	const rows = 60000
	gen := testenv.NewGenerator(50, "Reserved")
	evs := make([]testenv.Event, rows)
	for i := range evs {
		evs[i] = gen.Event(i)
	}
	admin, err := pgx.Connect(context.Background(), f.AdminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	if err := testenv.InsertTx(context.Background(), f.DB, f.Table, evs, true); err != nil {
		t.Fatal(err)
	}
	// Cut when a sixth of the rows were acknowledged, then again in the replay at a half.
	for i, at := range []int64{rows / 6, rows / 2} {
		deadline := time.Now().Add(2 * time.Minute)
		for run.p.Health().Produced < at {
			if time.Now().After(deadline) {
				t.Fatalf("cut %d: only %d rows acknowledged after 2 minutes, want %d", i+1, run.p.Health().Produced, at)
			}
			time.Sleep(time.Millisecond)
		}
		var terminated bool
		err := admin.QueryRow(context.Background(),
			"SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL", f.Slot).Scan(&terminated)
		if err != nil || !terminated {
			t.Fatalf("cut %d: terminate the walsender: %v (terminated %t)", i+1, err, terminated)
		}
		if h := run.p.Health(); h.Transactions > 0 && h.Produced >= rows {
			t.Fatalf("cut %d came after the transaction was delivered whole (%d rows): the test did not cut inside it", i+1, h.Produced)
		}
		restarts := run.p.Health().Restarts
		testenv.WaitFor(t, time.Minute, "the pipeline streaming again after the cut", func() bool {
			h := run.p.Health()
			return h.Restarts > restarts && run.p.State() == StateStreaming
		})
	}
	got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Reserved"), rows, 2*time.Minute)
	dups := testenv.VerifyDelivery(t, f, evs, got)
	h := run.p.Health()
	t.Logf("%d rows in one transaction, cut twice inside it: %d rows skipped as acknowledged, %d duplicates, %d sessions rebuilt", rows, h.SkippedRows, dups, h.Restarts)
	if dups != 0 {
		t.Errorf("%d rows sent again: the replay of the cut transaction re-sent rows Kafka had acknowledged", dups)
	}
	if h.SkippedRows < rows/6+rows/2 {
		t.Errorf("%d rows skipped over two replays; want at least %d (a sixth, then a half)", h.SkippedRows, rows/6+rows/2)
	}
}

// TestReplayAfterConnectionLossSkipsAcknowledged: at-least-once, a process that survives a failure on
// PostgreSQL's side (its walsender terminated) knows which transactions Kafka acknowledged: the replay
// from the slot, which stands up to a status interval behind, skips them whole instead of sending
// them again — nor the rows of the transaction cut in the middle (its rows went out before its
// commit arrived) that Kafka acknowledged: nothing comes twice.
func TestReplayAfterConnectionLossSkipsAcknowledged(t *testing.T) {
	f := testenv.NewFixture(t)
	cfg := testConfig(f)
	cfg.Kafka.Delivery = config.DeliveryAtLeastOnce
	cfg.Postgres.StatusInterval = 10 * time.Second // the slot trails by up to 10 s of transactions
	cfg.Postgres.ReceiveTimeout = 30 * time.Second
	run := startPipeline(t, cfg)
	const perTx = 3
	writer := testenv.StartWriter(t, f, testenv.NewGenerator(10, "Reserved"), perTx, 5*time.Millisecond, true)
	admin, err := pgx.Connect(context.Background(), f.AdminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	const faults = 2
	for i := 0; i < faults; i++ {
		time.Sleep(3 * time.Second)
		var terminated bool
		testenv.WaitFor(t, time.Minute, "pipeline streaming, and its walsender terminated", func() bool {
			if run.p.State() != StateStreaming {
				return false
			}
			err := admin.QueryRow(context.Background(),
				"SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL", f.Slot).Scan(&terminated)
			return err == nil && terminated
		})
	}
	time.Sleep(2 * time.Second)
	want, err := writer.Stop()
	if err != nil {
		t.Fatal(err)
	}
	got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Reserved"), len(want), 2*time.Minute)
	dups := testenv.VerifyDelivery(t, f, want, got)
	s := run.p.Health()
	t.Logf("%d events across %d connection losses: %d rows skipped as acknowledged, %d duplicates", len(want), faults, s.SkippedRows, dups)
	if dups > 0 {
		t.Errorf("%d duplicates after %d connection losses: want none (every row Kafka acknowledged is skipped in the replay)", dups, faults)
	}
	if s.SkippedRows == 0 {
		t.Error("nothing was skipped: the slot was behind what Kafka had acknowledged, so the replay should have skipped it")
	}
}
