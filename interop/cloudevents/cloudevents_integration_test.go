package cloudevents

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/cloudevents/sdk-go/protocol/kafka_sarama/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/pipeline"
)

// TestSDKReadsWhatOutboxCDCWrites: the router runs with kafka.header_format cloudevents against the
// real services, and the official CloudEvents Go SDK (its Kafka protocol binding, binary mode) turns
// every record read back from the broker into an event: each attribute parses and holds the outbox
// row's value, the event validates, and its data is the payload byte for byte.
func TestSDKReadsWhatOutboxCDCWrites(t *testing.T) {
	f := testenv.NewFixture(t)
	cfg := config.Default()
	cfg.Postgres.URL, cfg.Postgres.Table, cfg.Postgres.Slot, cfg.Postgres.Publication = f.PostgresURL, f.Table, f.Slot, f.Publication
	cfg.Kafka.Brokers = f.Brokers
	cfg.Kafka.Delivery = testenv.Delivery()
	cfg.Kafka.CheckpointTopic = f.TopicPrefix + ".checkpoints"
	cfg.Kafka.HeaderFormat = config.HeaderFormatCloudEvents
	cfg.Routing.Topic = f.TopicPrefix + ".{event_type}"
	cfg.ShutdownTimeout = 20 * time.Second
	log := slog.New(slog.DiscardHandler)
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	p, err := pipeline.New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("router: %v", err)
		}
	}()

	testenv.WaitFor(t, time.Minute, "the router streaming", func() bool { return p.State() == pipeline.StateStreaming })
	gen := testenv.NewGenerator(3, "OrderPlaced")
	want := []testenv.Event{gen.Event(0), gen.Event(1), gen.Event(2), gen.Event(0)}
	if err := testenv.InsertTx(ctx, f.DB, f.Table, want, false); err != nil {
		t.Fatal(err)
	}
	created := map[string]time.Time{}
	rows, err := f.DB.Query(ctx, "SELECT event_id::text, created_at FROM "+f.Table)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var at time.Time
		if err := rows.Scan(&id, &at); err != nil {
			t.Fatal(err)
		}
		created[id] = at
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "OrderPlaced"), len(want), time.Minute)
	byID := map[string]testenv.Event{}
	for _, e := range want {
		byID[e.ID] = e
	}
	seen := map[string]bool{}
	for _, r := range got {
		e := toEvent(t, r)
		if err := e.Validate(); err != nil {
			t.Errorf("record at %s/%d@%d is not a valid CloudEvent: %v", r.Topic, r.Partition, r.Offset, err)
			continue
		}
		row, ok := byID[e.ID()]
		if !ok {
			t.Errorf("event %s was never written", e.ID())
			continue
		}
		seen[e.ID()] = true
		if e.SpecVersion() != "1.0" || e.Type() != row.Type || e.Subject() != row.AggID || e.DataContentType() != "application/json" {
			t.Errorf("event %s: specversion %q type %q subject %q datacontenttype %q; want 1.0, %s, %s, application/json",
				e.ID(), e.SpecVersion(), e.Type(), e.Subject(), e.DataContentType(), row.Type, row.AggID)
		}
		if src := e.Source(); src != cfg.EventSource() {
			t.Errorf("event %s: source %q, want %q", e.ID(), src, cfg.EventSource())
		}
		if at := created[e.ID()]; !e.Time().Equal(at) {
			t.Errorf("event %s: time %s, want created_at %s", e.ID(), e.Time(), at)
		}
		if string(e.Data()) != string(r.Value) || !testenv.SameJSON(e.Data(), []byte(row.Payload)) {
			t.Errorf("event %s: data %s, want the payload %s", e.ID(), e.Data(), row.Payload)
		}
		if v, ok := e.Extensions()["aggregateversion"].(string); !ok || v != strconv.Itoa(int(row.Version)) {
			t.Errorf("event %s: aggregateversion %v, want %d", e.ID(), e.Extensions()["aggregateversion"], row.Version)
		}
		if at, ok := e.Extensions()["aggregatetype"].(string); !ok || at != row.AggType {
			t.Errorf("event %s: aggregatetype %v, want %s", e.ID(), e.Extensions()["aggregatetype"], row.AggType)
		}
		if string(r.Key) != row.AggID {
			t.Errorf("event %s: key %q, want the aggregate id %q", e.ID(), r.Key, row.AggID)
		}
	}
	if len(seen) != len(want) {
		t.Errorf("the SDK read %d of %d events", len(seen), len(want))
	}
}

// toEvent hands a record read from the broker to the SDK's Kafka protocol binding, as a sarama
// consumer would receive it, and lets the SDK decide its encoding and build the event.
func toEvent(t *testing.T, r *kgo.Record) *event.Event {
	t.Helper()
	msg := &sarama.ConsumerMessage{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key, Value: r.Value, Timestamp: r.Timestamp}
	for _, h := range r.Headers {
		msg.Headers = append(msg.Headers, &sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
	}
	m := kafka_sarama.NewMessageFromConsumerMessage(msg)
	if enc := m.ReadEncoding(); enc != binding.EncodingBinary {
		t.Fatalf("record at %s/%d@%d: the SDK sees encoding %s, want binary", r.Topic, r.Partition, r.Offset, enc)
	}
	e, err := binding.ToEvent(context.Background(), m)
	if err != nil {
		t.Fatalf("record at %s/%d@%d: the SDK cannot read it: %v", r.Topic, r.Partition, r.Offset, err)
	}
	return e
}
