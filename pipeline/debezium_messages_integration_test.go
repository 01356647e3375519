package pipeline

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// debeziumMessages are outbox messages as a team on Debezium emits them (fields named like Debezium's
// outbox columns): object payloads with every JSON kind (null members and empty arrays, which
// Debezium's inference leaves out; doubles; integers beyond 32 bits; escapes; characters beyond the
// Basic Multilingual Plane), string, number, boolean, array and empty payloads, unicode keys. Debezium
// 3.6.1's task stops for good on a null or absent payload, a message without a placed field and an
// array mixing kinds, so none is here (TestDebeziumMessageRecords covers the last).
func debeziumMessages(aggType string) []string {
	payloads := []string{
		`{"total": 9.99, "items": [1, 2, 3], "note": "naïve \"q\"\nline", "z": null, "big": 12345678901, "f": 100.0}`,
		`"just a string"`, `123`, `2.50`, `true`, `""`, `"{\"as\": \"text\"}"`, `{}`, `[1, 2]`, `["a", null, "b"]`,
		`{"nested": {"a": [{"x": 1}, {"x": 2}], "e": "😀"}}`, `[{"x": 1}, {"x": 2}]`,
		`{"a": [], "b": {"c": [true, false], "d": -2.5e-7, "e": 0.00001, "g": 12345678.5}}`, `{"u": "\u0001\t", "ключ": "注文"}`,
	}
	keys := []string{"42", "ключ-1", "注文-2", "😀-3", "a b", "order-7"}
	var out []string
	for i, p := range payloads {
		out = append(out, fmt.Sprintf(`{"id": "%s", "aggregatetype": "%s", "aggregateid": "%s", "type": "Type%d", "payload": %s}`,
			testenv.NewUUID(), aggType, keys[i%len(keys)], i%3, p))
	}
	return out
}

// TestDebeziumMessagesMatch runs Debezium 3.6.1's PostgreSQL connector with
// DecodeLogicalDecodingMessageContent and the outbox EventRouter (StringConverter, then
// JsonConverter) beside outbox-cdc's debezium format reading the same transactional messages
// (postgres.message_prefixes), and compares the records per topic and partition: the same keys,
// values and headers in the same order. A message of another prefix and a rolled-back one reach
// neither.
func TestDebeziumMessagesMatch(t *testing.T) {
	f := testenv.NewDebeziumFixture(t)
	run := fmt.Sprintf("%04x", rand.IntN(0xffff))
	prefix, aggType := "outbox_"+run, "order_"+run
	jsonConverter := []string{
		"key.converter=org.apache.kafka.connect.json.JsonConverter", "key.converter.schemas.enable=false",
		"value.converter=org.apache.kafka.connect.json.JsonConverter", "value.converter.schemas.enable=false",
	}
	variants := []struct {
		name      string
		converter string
		props     []string
	}{
		{"string converter", config.DebeziumConverterString, nil},
		{"json converter", config.DebeziumConverterJSON, jsonConverter},
	}
	var connectors []testenv.DebeziumConnector
	for i, v := range variants {
		connectors = append(connectors, testenv.DebeziumConnector{Name: fmt.Sprintf("dm%d_%s", i+1, run),
			Slot: fmt.Sprintf("%s_dbz%d", f.Slot, i+1), Publication: fmt.Sprintf("%s_dbz%d", f.Publication, i+1),
			Properties: append([]string{
				"message.prefix.include.list=" + prefix,
				"transforms=decode,outbox",
				"transforms.decode.type=io.debezium.connector.postgresql.transforms.DecodeLogicalDecodingMessageContent",
				fmt.Sprintf("transforms.outbox.route.topic.replacement=dm%d_%s.outbox.event.${routedByValue}", i+1, run),
				"transforms.outbox.table.fields.additional.placement=type:header:eventType",
			}, v.props...)})
	}
	testenv.StartDebezium(t, f, connectors...)
	for i, v := range variants {
		cfg := testConfig(f)
		cfg.Kafka.RecordTimestamp = config.RecordTimestampCommit
		cfg.Kafka.HeaderFormat = config.HeaderFormatDebezium
		cfg.ApplyFormatDefaults(nil)
		cfg.Postgres.Slot = fmt.Sprintf("%s_ocdc%d", f.Slot, i+1)
		cfg.Postgres.MessagePrefixes = []string{prefix}
		cfg.Routing.Topic = fmt.Sprintf("om%d_%s.outbox.event.{aggregate_type}", i+1, run)
		cfg.Kafka.Debezium = config.Debezium{Converter: v.converter, AdditionalPlacement: "type:header:eventType"}
		p := startPipeline(t, cfg)
		t.Cleanup(func() { _ = p.stop() })
		waitSlotActive(t, f, cfg.Postgres.Slot)
	}

	ctx := context.Background()
	messages := debeziumMessages(aggType)
	emit := "SELECT pg_logical_emit_message(true, $1, $2::text)"
	for start := 0; start < len(messages); start += 4 {
		tx, err := f.DB.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range messages[start:min(start+4, len(messages))] {
			if _, err := tx.Exec(ctx, emit, prefix, m); err != nil {
				t.Fatalf("emit %s: %v", m, err)
			}
		}
		// Another prefix in the same transaction reaches neither.
		if _, err := tx.Exec(ctx, emit, prefix+"_other", messages[start]); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	tx, err := f.DB.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, emit, prefix, messages[0]); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	for i, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			dbzPrefix, ours := fmt.Sprintf("dm%d_%s.", i+1, run), fmt.Sprintf("om%d_%s.", i+1, run)
			want := len(messages)
			enough := func(r []*kgo.Record) bool { return len(r) >= want }
			theirs := testenv.ConsumeUntil(t, f.Brokers, []string{dbzPrefix + "outbox.event." + aggType}, enough, 2*time.Minute)
			mine := testenv.ConsumeUntil(t, f.Brokers, []string{ours + "outbox.event." + aggType}, enough, time.Minute)
			if len(theirs) != want || len(mine) != want {
				t.Fatalf("Debezium wrote %d records, outbox-cdc %d, want %d each", len(theirs), len(mine), want)
			}
			compareDebezium(t, dbzPrefix, theirs, ours, mine)
		})
	}
}
