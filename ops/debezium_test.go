package ops

import (
	"os"
	"strings"
	"testing"

	"github.com/outbox-cdc/outbox-cdc/config"
)

// connectorJSON is a Debezium outbox connector as Kafka Connect's REST API returns it.
const connectorJSON = `{
  "name": "orders-outbox",
  "config": {
    "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
    "tasks.max": "1",
    "plugin.name": "pgoutput",
    "database.hostname": "pg-primary",
    "database.port": "5433",
    "database.user": "debezium",
    "database.password": "Sup3r-Secret",
    "database.dbname": "orders",
    "database.sslmode": "require",
    "topic.prefix": "orders",
    "slot.name": "orders_outbox",
    "publication.name": "orders_pub",
    "table.include.list": "public.outbox_events",
    "transforms": "outbox",
    "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
    "transforms.outbox.table.field.event.key": "order_id",
    "transforms.outbox.table.field.event.timestamp": "occurred_at",
    "transforms.outbox.route.topic.replacement": "orders.${routedByValue}.events",
    "transforms.outbox.table.fields.additional.placement": "type:header:eventType,version:envelope",
    "transforms.outbox.table.expand.json.payload": "true",
    "key.converter": "org.apache.kafka.connect.json.JsonConverter",
    "key.converter.schemas.enable": "false",
    "value.converter": "org.apache.kafka.connect.json.JsonConverter",
    "value.converter.schemas.enable": false,
    "topic.creation.default.partitions": "6",
    "topic.creation.default.replication.factor": "3",
    "signal.data.collection": "public.signals"
  }
}`

func TestFromDebezium(t *testing.T) {
	props, err := ParseDebeziumConfig([]byte(connectorJSON))
	if err != nil {
		t.Fatal(err)
	}
	conv := FromDebezium(props)
	if conv.Blocking {
		t.Fatalf("blocking: %v", conv.Notes)
	}
	out := string(conv.YAML)
	for _, want := range []string{
		"url: postgres://debezium@pg-primary:5433/orders?sslmode=require", "slot: orders_outbox", "publication: orders_pub",
		"create_slot: false", "table: public.outbox_events", "aggregate_id: order_id", "timestamp: occurred_at",
		"header_format: debezium", "delivery: at-least-once", "converter: json", "expand_json_payload: true",
		"additional_placement: type:header:eventType,version:envelope", "topic: orders.{aggregate_type}.events",
		"topic_partitions: 6", "topic_replication_factor: 3",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the configuration lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "Sup3r-Secret") || strings.Contains(strings.Join(conv.Notes, "\n"), "Sup3r-Secret") {
		t.Errorf("the password was printed")
	}
	notes := strings.Join(conv.Notes, "\n")
	for _, want := range []string{"password is not copied", "kafka.brokers", "signal.data.collection is not carried over"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q:\n%s", want, notes)
		}
	}
	// What it wrote loads, and is the debezium format on the connector's slot.
	path := t.TempDir() + "/c.yaml"
	writeFile(t, path, strings.Replace(out, "CHANGE-ME:9092", "kafka:9092", 1))
	cfg, err := config.Load(path, func(string) (string, bool) { return "", false }, nil)
	if err != nil {
		t.Fatalf("the converted configuration does not load: %v\n%s", err, out)
	}
	if cfg.Postgres.Columns.EventID != "id" || cfg.Postgres.Columns.AggregateID != "order_id" || cfg.Postgres.Columns.Payload != "payload" ||
		cfg.Routing.Topic != "orders.{aggregate_type}.events" || cfg.Kafka.Debezium.Converter != "json" || cfg.Postgres.CreateSlot {
		t.Errorf("loaded: %+v %q %+v", cfg.Postgres.Columns, cfg.Routing.Topic, cfg.Kafka.Debezium)
	}
}

func TestFromDebeziumRefusesAndNotes(t *testing.T) {
	for _, tc := range []struct {
		name, props, want string
		blocking          bool
	}{
		{"decoderbufs", "connector.class=io.debezium.connector.postgresql.PostgresConnector\nplugin.name=decoderbufs\ntransforms=o\ntransforms.o.type=io.debezium.transforms.outbox.EventRouter", "pgoutput", true},
		{"no event router", "connector.class=io.debezium.connector.postgresql.PostgresConnector\ntransforms=u\ntransforms.u.type=io.debezium.transforms.ExtractNewRecordState", "EventRouter", true},
		{"mysql", "connector.class=io.debezium.connector.mysql.MySqlConnector", "PostgresConnector", true},
		{"schemas", "connector.class=io.debezium.connector.postgresql.PostgresConnector\ntable.include.list=public.outbox\ntransforms=o\ntransforms.o.type=io.debezium.transforms.outbox.EventRouter\nvalue.converter=org.apache.kafka.connect.json.JsonConverter", "schemas.enable", false},
		{"regex", "connector.class=io.debezium.connector.postgresql.PostgresConnector\ntable.include.list=public.outbox\ntransforms=o\ntransforms.o.type=io.debezium.transforms.outbox.EventRouter\ntransforms.o.route.topic.regex=(?<routedByValue>.*)Event", "transforms.o.route.topic.regex", true},
		{"replacement with other groups", "connector.class=io.debezium.connector.postgresql.PostgresConnector\ntable.include.list=public.outbox\ntransforms=o\ntransforms.o.type=io.debezium.transforms.outbox.EventRouter\ntransforms.o.route.topic.replacement=x.$1", "transforms.o.route.topic.replacement", true},
		{"typo under the transform", "connector.class=io.debezium.connector.postgresql.PostgresConnector\ntable.include.list=public.outbox\ntransforms=o\ntransforms.o.type=io.debezium.transforms.outbox.EventRouter\ntransforms.o.table.field.event.paylod=body", "transforms.o.table.field.event.paylod", true},
		{"predicate", "connector.class=io.debezium.connector.postgresql.PostgresConnector\ntable.include.list=public.outbox\ntransforms=o\ntransforms.o.type=io.debezium.transforms.outbox.EventRouter\ntransforms.o.predicate=isOutbox", "transforms.o.predicate", true},
		{"no table list", "connector.class=io.debezium.connector.postgresql.PostgresConnector\ntransforms=o\ntransforms.o.type=io.debezium.transforms.outbox.EventRouter", "table.include.list is empty", true},
		{"table patterns", "connector.class=io.debezium.connector.postgresql.PostgresConnector\ntable.include.list=public.outbox_.*\ntransforms=o\ntransforms.o.type=io.debezium.transforms.outbox.EventRouter", "patterns", true},
		{"all-tables publication", "connector.class=io.debezium.connector.postgresql.PostgresConnector\ntable.include.list=public.outbox\ntransforms=o\ntransforms.o.type=io.debezium.transforms.outbox.EventRouter", "postgres.ignore_tables", false},
		{"messages without prefixes", "connector.class=io.debezium.connector.postgresql.PostgresConnector\ntransforms=m,o\ntransforms.m.type=io.debezium.connector.postgresql.transforms.DecodeLogicalDecodingMessageContent\ntransforms.o.type=io.debezium.transforms.outbox.EventRouter", "message.prefix.include.list is empty", true},
		{"message prefix patterns", "connector.class=io.debezium.connector.postgresql.PostgresConnector\nmessage.prefix.include.list=outbox.*\ntransforms=m,o\ntransforms.m.type=io.debezium.connector.postgresql.transforms.DecodeLogicalDecodingMessageContent\ntransforms.o.type=io.debezium.transforms.outbox.EventRouter", "patterns", true},
		{"messages without a table", "connector.class=io.debezium.connector.postgresql.PostgresConnector\nmessage.prefix.include.list=outbox\ntransforms=m,o\ntransforms.m.type=io.debezium.connector.postgresql.transforms.DecodeLogicalDecodingMessageContent\ntransforms.o.type=io.debezium.transforms.outbox.EventRouter", "WAL messages only", false},
		{"no converters", "connector.class=io.debezium.connector.postgresql.PostgresConnector\ntable.include.list=public.outbox\ntransforms=o\ntransforms.o.type=io.debezium.transforms.outbox.EventRouter", "StringConverter assumed", false},
	} {
		props, err := ParseDebeziumConfig([]byte(tc.props))
		if err != nil {
			t.Fatal(err)
		}
		conv := FromDebezium(props)
		if conv.Blocking != tc.blocking || !strings.Contains(strings.Join(conv.Notes, "\n"), tc.want) {
			t.Errorf("%s: blocking %v, notes:\n%s\nwant blocking %v and a note on %q", tc.name, conv.Blocking, strings.Join(conv.Notes, "\n"), tc.blocking, tc.want)
		}
	}
	// Debezium's defaults give the debezium format's defaults: nothing more to say.
	props, _ := ParseDebeziumConfig([]byte("connector.class=io.debezium.connector.postgresql.PostgresConnector\ndatabase.hostname=h\ndatabase.dbname=d\ntable.include.list=public.outbox\ntransforms=outbox\ntransforms.outbox.type=io.debezium.transforms.outbox.EventRouter"))
	out := string(FromDebezium(props).YAML)
	if strings.Contains(out, "columns:") || strings.Contains(out, "routing:") || !strings.Contains(out, "slot: debezium") || !strings.Contains(out, "publication: dbz_publication") {
		t.Errorf("defaults:\n%s", out)
	}
}

// TestFromDebeziumTablesList: a connector of several outbox tables becomes postgres.table and a
// tables list, not the default table; with a filtered publication nothing is ignored.
func TestFromDebeziumTablesList(t *testing.T) {
	props, err := ParseDebeziumConfig([]byte("connector.class=io.debezium.connector.postgresql.PostgresConnector\ndatabase.hostname=h\ndatabase.dbname=d\n" +
		"publication.autocreate.mode=filtered\ntable.include.list=orders.outbox, billing.outbox ,shipping.outbox\ntransforms=outbox\ntransforms.outbox.type=io.debezium.transforms.outbox.EventRouter"))
	if err != nil {
		t.Fatal(err)
	}
	conv := FromDebezium(props)
	if conv.Blocking {
		t.Fatalf("blocking: %v", conv.Notes)
	}
	path := t.TempDir() + "/c.yaml"
	writeFile(t, path, strings.Replace(string(conv.YAML), "CHANGE-ME:9092", "kafka:9092", 1))
	cfg, err := config.Load(path, func(string) (string, bool) { return "", false }, nil)
	if err != nil {
		t.Fatalf("does not load: %v\n%s", err, conv.YAML)
	}
	var names []string
	for _, tb := range cfg.Tables {
		names = append(names, tb.Name)
	}
	if cfg.Postgres.Table != "orders.outbox" || strings.Join(names, ",") != "billing.outbox,shipping.outbox" || len(cfg.Postgres.IgnoreTables) != 0 {
		t.Errorf("table %q, tables %v, ignore_tables %v:\n%s", cfg.Postgres.Table, names, cfg.Postgres.IgnoreTables, conv.YAML)
	}
}

// TestDebeziumSecretKey: options that hold secrets are masked, options that merely end in ".key" and
// name a column or a converter are not (their values, column names, would vanish from the output).
// TestFromDebeziumMessages: a connector that relays WAL messages (DecodeLogicalDecodingMessageContent
// before the EventRouter) becomes a source with postgres.message_prefixes, which loads.
func TestFromDebeziumMessages(t *testing.T) {
	props, err := ParseDebeziumConfig([]byte("connector.class=io.debezium.connector.postgresql.PostgresConnector\ndatabase.hostname=pg\ndatabase.dbname=orders\n" +
		"table.include.list=public.outbox\nmessage.prefix.include.list=outbox,billing\ntransforms=m,o\n" +
		"transforms.m.type=io.debezium.connector.postgresql.transforms.DecodeLogicalDecodingMessageContent\ntransforms.o.type=io.debezium.transforms.outbox.EventRouter\n"))
	if err != nil {
		t.Fatal(err)
	}
	conv := FromDebezium(props)
	if conv.Blocking {
		t.Fatalf("blocking: %v", conv.Notes)
	}
	if notes := strings.Join(conv.Notes, "\n"); strings.Contains(notes, "DecodeLogicalDecodingMessageContent") {
		t.Errorf("the message transform is said not to be carried over:\n%s", notes)
	}
	path := t.TempDir() + "/c.yaml"
	writeFile(t, path, strings.Replace(string(conv.YAML), "CHANGE-ME:9092", "kafka:9092", 1))
	cfg, err := config.Load(path, func(string) (string, bool) { return "", false }, nil)
	if err != nil {
		t.Fatalf("the converted configuration does not load: %v\n%s", err, conv.YAML)
	}
	if got := strings.Join(cfg.Postgres.MessagePrefixes, ","); got != "outbox,billing" {
		t.Errorf("postgres.message_prefixes %q, want outbox,billing:\n%s", got, conv.YAML)
	}
}

func TestDebeziumSecretKey(t *testing.T) {
	for key, secret := range map[string]bool{
		"database.password": true, "database.sslpassword": true, "database.sslkey": true, "sasl.jaas.config": true,
		"producer.override.sasl.jaas.config": true, "database.ssl.key": true, "some.api.key": true, "oauth.client.secret": true,
		"transforms.outbox.table.field.event.key": false, "key.converter": false, "message.key.columns": false,
		"transforms.outbox.table.field.event.payload": false, "database.user": false,
	} {
		if got := DebeziumSecretKey(key); got != secret {
			t.Errorf("DebeziumSecretKey(%q) = %v, want %v", key, got, secret)
		}
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
