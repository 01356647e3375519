package config

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestLoadPrecedence(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.yaml")
	yaml := `
postgres:
  url: postgres://file@h/db
  slot: from_file
  status_interval: 5s
kafka:
  brokers: [file:9092]
routing:
  topic: "file.{event_type}"
  topics:
    OrderPaid: payments
limits:
  max_inflight_records: 100
`
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	RegisterFlags(fs)
	if err := fs.Parse([]string{"--slot", "from_flag"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(path, env(map[string]string{
		"OUTBOX_CDC_SLOT":    "from_env",
		"OUTBOX_CDC_BROKERS": "env1:9092, env2:9092",
		"OUTBOX_CDC_TOPIC":   "env.{event_type}",
	}), fs)
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		key       string
		got, want any
	}{
		{"postgres.url from file", cfg.Postgres.URL, "postgres://file@h/db"},
		{"postgres.slot: flag beats env beats file", cfg.Postgres.Slot, "from_flag"},
		{"postgres.status_interval from file", cfg.Postgres.StatusInterval, 5 * time.Second},
		{"kafka.brokers: env beats file", strings.Join(cfg.Kafka.Brokers, ","), "env1:9092,env2:9092"},
		{"routing.topic: env beats file", cfg.Routing.Topic, "env.{event_type}"},
		{"routing.topics from file", cfg.Routing.Topics["OrderPaid"], "payments"},
		{"limits.max_inflight_records from file", cfg.Limits.MaxInFlightRecords, 100},
		{"postgres.table default", cfg.Postgres.Table, "public.outbox"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.key, c.got, c.want)
		}
	}
}

func TestValidationNamesKeys(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantKey string
	}{
		{"missing url", func(c *Config) { c.Postgres.URL = "" }, "postgres.url"},
		{"not a postgres url", func(c *Config) { c.Postgres.URL = "mysql://x" }, "postgres.url"},
		{"bad slot", func(c *Config) { c.Postgres.Slot = "Bad-Slot" }, "postgres.slot"},
		{"bad table", func(c *Config) { c.Postgres.Table = "a.b.c" }, "postgres.table"},
		{"no brokers", func(c *Config) { c.Kafka.Brokers = nil }, "kafka.brokers"},
		{"broker without port", func(c *Config) { c.Kafka.Brokers = []string{"localhost"} }, "kafka.brokers"},
		{"zero in-flight", func(c *Config) { c.Limits.MaxInFlightRecords = 0 }, "limits.max_inflight_records"},
		{"in-flight bytes below message size", func(c *Config) { c.Limits.MaxInFlightBytes = 10 }, "limits.max_inflight_bytes"},
		{"status interval too long", func(c *Config) { c.Postgres.StatusInterval = time.Minute }, "postgres.status_interval"},
		{"log level", func(c *Config) { c.Log.Level = "loud" }, "log.level"},
		{"replication factor 0", func(c *Config) { c.Kafka.TopicReplicationFactor = 0 }, "kafka.topic_replication_factor"},
		{"nothing routes", func(c *Config) { c.Routing.Topic = "" }, "routing.topic"},
		{"unknown delivery", func(c *Config) { c.Kafka.Delivery = "exactly_once" }, "kafka.delivery"},
		{"no checkpoint topic", func(c *Config) { c.Kafka.Delivery, c.Kafka.CheckpointTopic = DeliveryExactlyOnce, "" }, "kafka.checkpoint_topic"},
		{"zero transaction interval", func(c *Config) { c.Kafka.Delivery, c.Kafka.TransactionInterval = DeliveryExactlyOnce, 0 }, "kafka.transaction_interval"},
		{"zero transaction records", func(c *Config) { c.Kafka.Delivery, c.Kafka.TransactionMaxRecords = DeliveryExactlyOnce, 0 }, "kafka.transaction_max_records"},
		{"short transaction timeout", func(c *Config) { c.Kafka.Delivery, c.Kafka.TransactionTimeout = DeliveryExactlyOnce, time.Millisecond }, "kafka.transaction_timeout"},
		{"transaction interval near the timeout", func(c *Config) {
			c.Kafka.Delivery, c.Kafka.TransactionInterval, c.Kafka.TransactionTimeout = DeliveryExactlyOnce, 40*time.Second, time.Minute
		}, "kafka.transaction_interval"},
		{"unknown compression", func(c *Config) { c.Kafka.Compression = "brotli" }, "kafka.compression"},
		{"topic config without a value", func(c *Config) { c.Kafka.TopicConfig = map[string]string{"retention.ms": ""} }, "kafka.topic_config"},
		{"dead letters into the checkpoint topic", func(c *Config) { c.Routing.DLQTopic = c.Kafka.CheckpointTopic }, "routing.dlq_topic"},
		{"fallback into the checkpoint topic", func(c *Config) { c.Routing.FallbackTopic = c.Kafka.CheckpointTopic }, "routing.fallback_topic"},
		{"an event type into the checkpoint topic", func(c *Config) { c.Routing.Topics = map[string]string{"Paid": "outbox-cdc_checkpoints"} }, "routing.topics.Paid"},
		{"every row into the checkpoint topic", func(c *Config) { c.Routing.Topic = c.Kafka.CheckpointTopic }, "routing.topic"},
		{"unknown header format", func(c *Config) { c.Kafka.HeaderFormat = "cloudevent" }, "kafka.header_format"},
		{"source without cloudevents", func(c *Config) { c.Kafka.CloudEventsSource = "/x" }, "kafka.cloudevents_source"},
		{"cloudevents without a type column", func(c *Config) { c.Kafka.HeaderFormat, c.Postgres.Columns.EventType = HeaderFormatCloudEvents, "" }, "postgres.columns.event_type"},
		{"ignoring the outbox", func(c *Config) { c.Postgres.IgnoreTables = []string{"outbox"} }, "postgres.ignore_tables"},
		{"oauth without a token endpoint", func(c *Config) { c.Kafka.SASL.Mechanism = SASLOAuthBearer }, "kafka.sasl.oauth"},
		{"oauth with both sources", func(c *Config) {
			c.Kafka.SASL = KafkaSASL{Mechanism: SASLOAuthBearer, OAuth: KafkaOAuth{TokenURL: "https://idp/token", ClientID: "x", ClientSecretFile: "/s", TokenFile: "/t"}}
		}, "kafka.sasl.oauth"},
		{"oauth client auth", func(c *Config) {
			c.Kafka.SASL = KafkaSASL{Mechanism: SASLOAuthBearer, OAuth: KafkaOAuth{TokenFile: "/t", ClientAuth: "jwt"}}
		}, "kafka.sasl.oauth.client_auth"},
		{"msk iam without tls", func(c *Config) { c.Kafka.SASL.Mechanism = SASLAWSMSKIAM }, "kafka.sasl.mechanism"},
		{"ignoring a three-part name", func(c *Config) { c.Postgres.IgnoreTables = []string{"a.b.c"} }, "postgres.ignore_tables"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			c.Postgres.URL = "postgres://u:p@h:5432/db"
			c.Kafka.Brokers = []string{"h:9092"}
			if err := c.Validate(); err != nil {
				t.Fatalf("base config invalid: %v", err)
			}
			tt.mutate(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.wantKey+":") {
				t.Fatalf("error %v does not name %s", err, tt.wantKey)
			}
		})
	}
}

func TestUnknownYAMLKeyIsAnError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte("postgres:\n  slott: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := Default()
	err := c.LoadFile(path)
	if err == nil || !strings.Contains(err.Error(), "slott") {
		t.Fatalf("got %v, want an error naming the unknown key", err)
	}
}

func TestIntegerOverflowIsAnError(t *testing.T) {
	for name, v := range map[string]string{
		"OUTBOX_CDC_TOPIC_REPLICATION_FACTOR": "70000",      // int16
		"OUTBOX_CDC_TOPIC_PARTITIONS":         "4294967297", // int32
		"OUTBOX_CDC_MAX_INFLIGHT_BYTES":       "99999999999999999999",
	} {
		c := Default()
		if err := c.LoadEnv(env(map[string]string{name: v})); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s=%s: got %v, want an error naming the variable", name, v, err)
		}
	}
}

func TestEnvErrorsNameVariableAndKey(t *testing.T) {
	c := Default()
	err := c.LoadEnv(env(map[string]string{"OUTBOX_CDC_CREATE_TOPICS": "maybe"}))
	if err == nil || !strings.Contains(err.Error(), "OUTBOX_CDC_CREATE_TOPICS") || !strings.Contains(err.Error(), "kafka.create_topics") {
		t.Fatalf("got %v", err)
	}
}

// TestSecretsCoverHostileURLs: whatever shape the URL has — a bad percent escape, '/', '#' or '@' in
// the password, a bad port, an invalid sslmode, a quoted key=value password — the password is among
// the secrets, and no validation error prints it.
// TestPGPASSWORDIsASecret: a password from the environment (the Helm chart's way) is scrubbed like
// one in the URL.
func TestPGPASSWORDIsASecret(t *testing.T) {
	env := map[string]string{"OUTBOX_CDC_POSTGRES": "postgres://outbox@db/app", "OUTBOX_CDC_BROKERS": "k:9092", "PGPASSWORD": "from-env"}
	c, err := Load("", func(k string) (string, bool) { v, ok := env[k]; return v, ok }, nil)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range c.Secrets() {
		found = found || s == "from-env"
	}
	if !found {
		t.Errorf("secrets %q lack PGPASSWORD", c.Secrets())
	}
}

func TestSecretsCoverHostileURLs(t *testing.T) {
	tests := []struct{ url, password string }{
		{"postgres://outbox:s3cret@db:5432/app", "s3cret"},
		{"postgres://outbox:s3%zzcret@db/app", "s3%zzcret"},
		{"postgres://outbox:se/cret@db:5432/app", "se/cret"},
		{"postgres://outbox:sec#ret@db/app", "sec#ret"},
		{"postgres://outbox:p@ss@db/app", "p@ss"},
		{"postgres://outbox:s3cret@db:notaport/app", "s3cret"},
		{"postgres://outbox:s3cret@db/app?sslmode=bogus", "s3cret"},
		{"postgres://outbox:s%40cret@db/app", "s@cret"},
		{"postgres://db/app?password=inquery&sslmode=bogus", "inquery"},
	}
	for _, tt := range tests {
		c := Default()
		c.Postgres.URL = tt.url
		c.Kafka.Brokers = []string{"k:9092"}
		secrets := c.Secrets()
		found := false
		for _, s := range secrets {
			found = found || s == tt.password
		}
		if !found {
			t.Errorf("%s: secrets %q lack the password %q", tt.url, secrets, tt.password)
		}
		if err := c.Validate(); err != nil && strings.Contains(err.Error(), tt.password) {
			t.Errorf("%s: validation error prints the password: %v", tt.url, err)
		}
	}
}

func TestInvalidSSLModeAndCAFileAreConfigErrors(t *testing.T) {
	c := Default()
	c.Postgres.URL = "postgres://u:p@h/db?sslmode=bogus"
	c.Kafka.Brokers = []string{"k:9092"}
	c.Kafka.TLS.Enabled = true
	c.Kafka.TLS.CAFile = filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(c.Kafka.TLS.CAFile, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := c.Validate()
	for _, want := range []string{"postgres.url", "sslmode", "kafka.tls.ca_file", "holds no PEM certificate"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("validation error %v does not mention %q", err, want)
		}
	}
}

func TestEventSource(t *testing.T) {
	c := Default()
	c.Postgres.URL, c.Postgres.Table = "postgres://u:secret@h:5432/orders?sslmode=disable", "public.outbox"
	if got := c.EventSource(); got != "/orders/public.outbox" {
		t.Errorf("default source %q", got)
	}
	c.Kafka.CloudEventsSource = "urn:orders"
	if got := c.EventSource(); got != "urn:orders" {
		t.Errorf("configured source %q", got)
	}
	// The default is a URI-reference whatever the names hold.
	c.Kafka.CloudEventsSource = ""
	c.Postgres.URL = "postgres://u:secret@h:5432/my%20db%3Fx?sslmode=disable"
	if got := c.EventSource(); got != "/my%20db%3Fx/public.outbox" {
		t.Errorf("default source %q, want the database name percent-encoded", got)
	}
	// A configured one that is not a URI-reference is refused, naming the key.
	c.Postgres.URL, c.Kafka.Brokers, c.Kafka.HeaderFormat = "postgres://u:secret@h:5432/orders", []string{"h:9092"}, HeaderFormatCloudEvents
	for _, bad := range []string{"my source", "/orders\n", "/ördërs", "%zz"} {
		c.Kafka.CloudEventsSource = bad
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "kafka.cloudevents_source:") {
			t.Errorf("source %q: %v, want an error naming kafka.cloudevents_source", bad, err)
		}
	}
	for _, good := range []string{"urn:orders", "/orders/public.outbox", "https://example.com/orders", "/my%20db"} {
		c.Kafka.CloudEventsSource = good
		if err := c.Validate(); err != nil {
			t.Errorf("source %q refused: %v", good, err)
		}
	}
}

// TestExampleConfigLoads keeps testdata/outbox-cdc.yaml (docs/configuration.md's example) loadable.
func TestExampleConfigLoads(t *testing.T) {
	cfg, err := Load("../testdata/outbox-cdc.yaml", env(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Routing.DLQTopic != "outbox.dlq" || cfg.Routing.Topics["OrderPaid"] != "payments" {
		t.Fatalf("example config not applied: %+v", cfg.Routing)
	}
	def := Default()
	if cfg.Limits != def.Limits || cfg.Postgres.Columns != def.Postgres.Columns || cfg.Kafka.MaxMessageBytes != def.Kafka.MaxMessageBytes {
		t.Fatal("testdata/outbox-cdc.yaml no longer shows the defaults")
	}
}

func TestKafkaSecurityValidation(t *testing.T) {
	base := func() Config {
		c := Default()
		c.Postgres.URL = "postgres://u@h/db"
		c.Kafka.Brokers = []string{"h:9092"}
		return c
	}
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantKey string
	}{
		{"mechanism without credentials", func(c *Config) { c.Kafka.SASL.Mechanism = "PLAIN" }, "kafka.sasl"},
		{"unknown mechanism", func(c *Config) { c.Kafka.SASL = KafkaSASL{Mechanism: "KERBEROS", Username: "u", Password: "p"} }, "kafka.sasl.mechanism"},
		{"CA file without TLS", func(c *Config) { c.Kafka.TLS.CAFile = "/etc/hosts" }, "kafka.tls.ca_file"},
		{"missing CA file", func(c *Config) { c.Kafka.TLS = KafkaTLS{Enabled: true, CAFile: "/no/such/ca.pem"} }, "kafka.tls.ca_file"},
		{"cert without key", func(c *Config) { c.Kafka.TLS = KafkaTLS{Enabled: true, CertFile: "/etc/hosts"} }, "kafka.tls.cert_file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := base()
			tt.mutate(&c)
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tt.wantKey) {
				t.Fatalf("error %v does not name %s", err, tt.wantKey)
			}
		})
	}
	c := base()
	c.Kafka.SASL = KafkaSASL{Mechanism: "SCRAM-SHA-512", Username: "u", Password: "p"}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestTargetNamesEveryHost: a multi-host URL's target names every host (which one answers is decided
// at each connection), once each, and never the password.
func TestTargetNamesEveryHost(t *testing.T) {
	for url, want := range map[string]string{
		"postgres://u:secret@h1:5432/db":                                         "u@h1:5432/db",
		"postgres://u:secret@h1:5432,h2:5433/db?target_session_attrs=read-write": "u@h1:5432,h2:5433/db",
		"postgres://u:secret@h1,h2/db?sslmode=prefer":                            "u@h1:5432,h2:5432/db",
	} {
		if got := Target(url, "postgres.url"); got != want {
			t.Errorf("Target(%q) = %q, want %q", url, got, want)
		}
	}
}

// TestTopicConfigFromTheEnvironment: OUTBOX_CDC_TOPIC_CONFIG is key=value pairs; a pair without '='
// is an error naming the variable.
func TestTopicConfigFromTheEnvironment(t *testing.T) {
	c := Default()
	if err := c.LoadEnv(env(map[string]string{"OUTBOX_CDC_TOPIC_CONFIG": "retention.ms=604800000, min.insync.replicas=2", "OUTBOX_CDC_COMPRESSION": "zstd"})); err != nil {
		t.Fatal(err)
	}
	if c.Kafka.TopicConfig["retention.ms"] != "604800000" || c.Kafka.TopicConfig["min.insync.replicas"] != "2" || c.Kafka.Compression != "zstd" {
		t.Fatalf("topic config %v, compression %q", c.Kafka.TopicConfig, c.Kafka.Compression)
	}
	if err := c.LoadEnv(env(map[string]string{"OUTBOX_CDC_TOPIC_CONFIG": "retention.ms"})); err == nil || !strings.Contains(err.Error(), "OUTBOX_CDC_TOPIC_CONFIG") {
		t.Fatalf("a pair without '=': %v", err)
	}
}

// TestDebeziumFormatDefaults: kafka.header_format debezium alone reads Debezium's default outbox
// table and topics; what the file, the environment or a flag sets explicitly stays.
func TestDebeziumFormatDefaults(t *testing.T) {
	base := map[string]string{"OUTBOX_CDC_POSTGRES": "postgres://u@h/db", "OUTBOX_CDC_BROKERS": "k:9092", "OUTBOX_CDC_HEADER_FORMAT": "debezium"}
	cfg, err := Load("", env(base), nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Postgres.Columns != DebeziumColumns() || cfg.Routing.Topic != "outbox.event.{aggregate_type}" || cfg.Kafka.Debezium.Converter != DebeziumConverterString {
		t.Fatalf("columns %+v topic %q converter %q", cfg.Postgres.Columns, cfg.Routing.Topic, cfg.Kafka.Debezium.Converter)
	}
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte("postgres:\n  columns:\n    payload: body\nrouting:\n  topic: \"{event_type}\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	withEnv := map[string]string{"OUTBOX_CDC_COLUMN_EVENT_ID": "event_uuid"}
	for k, v := range base {
		withEnv[k] = v
	}
	cfg, err = Load(path, env(withEnv), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c := cfg.Postgres.Columns; c.Payload != "body" || c.EventID != "event_uuid" || c.AggregateID != "aggregateid" || cfg.Routing.Topic != "{event_type}" {
		t.Fatalf("explicit settings replaced: columns %+v topic %q", c, cfg.Routing.Topic)
	}
	// The outbox format keeps its own defaults.
	cfg, err = Load("", env(map[string]string{"OUTBOX_CDC_POSTGRES": "postgres://u@h/db", "OUTBOX_CDC_BROKERS": "k:9092"}), nil)
	if err != nil || cfg.Postgres.Columns.EventID != "event_id" || cfg.Routing.Topic != "{event_type}" {
		t.Fatalf("outbox format: %v %+v", err, cfg.Postgres.Columns)
	}
}

func TestDebeziumValidation(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		mutate     func(c *Config)
	}{
		{"converter", "kafka.debezium.converter", func(c *Config) { c.Kafka.Debezium.Converter = "avro" }},
		{"placement", "kafka.debezium.additional_placement", func(c *Config) { c.Kafka.Debezium.AdditionalPlacement = "type:body" }},
		{"entry", "kafka.debezium.additional_placement", func(c *Config) { c.Kafka.Debezium.AdditionalPlacement = "a:header:b:c" }},
		{"envelope needs json", "kafka.debezium.additional_placement", func(c *Config) { c.Kafka.Debezium.AdditionalPlacement = "type:envelope" }},
		{"two partition columns", "kafka.debezium.additional_placement", func(c *Config) {
			c.Kafka.Debezium.AdditionalPlacement = "a:partition,b:partition"
		}},
		{"expand needs json", "kafka.debezium.expand_json_payload", func(c *Config) { c.Kafka.Debezium.ExpandJSONPayload = true }},
		{"debezium settings without the format", "kafka.debezium", func(c *Config) {
			c.Kafka.HeaderFormat = HeaderFormatOutbox
			c.Kafka.Debezium.TombstoneOnEmptyPayload = true
		}},
	} {
		c := Default()
		c.Postgres.URL, c.Kafka.Brokers, c.Kafka.HeaderFormat = "postgres://u@h/db", []string{"k:9092"}, HeaderFormatDebezium
		c.ApplyFormatDefaults(nil)
		tc.mutate(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %s", tc.name, err, tc.want)
		}
	}
	c := Default()
	c.Postgres.URL, c.Kafka.Brokers, c.Kafka.HeaderFormat = "postgres://u@h/db", []string{"k:9092"}, HeaderFormatDebezium
	c.Kafka.Debezium = Debezium{Converter: DebeziumConverterJSON, AdditionalPlacement: "type:header:eventType, type:envelope:t ,part:partition", ExpandJSONPayload: true}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	fields, _ := c.Kafka.Debezium.AdditionalFields()
	if len(fields) != 3 || fields[0] != (AdditionalField{"type", "header", "eventType"}) || fields[2] != (AdditionalField{"part", "partition", "part"}) {
		t.Fatalf("fields %+v", fields)
	}
}

// TestPasswordCommandIsASecret: a password command may carry a password (echo ..., a key on its
// command line): it is scrubbed like one.
func TestPasswordCommandIsASecret(t *testing.T) {
	c := Default()
	c.Postgres.PasswordCommand = "echo sup3r-s3cret"
	if !slices.Contains(c.Secrets(), "echo sup3r-s3cret") {
		t.Errorf("secrets %q lack the password command", c.Secrets())
	}
}

// TestMessagesOnlyNeedsNoTable: postgres.table may be empty only for a source of WAL messages
// (postgres.message_prefixes), and then without a tables list.
func TestMessagesOnlyNeedsNoTable(t *testing.T) {
	for _, tc := range []struct {
		name     string
		prefixes []string
		tables   []Table
		ok       bool
	}{
		{"messages only", []string{"outbox"}, nil, true},
		{"no table, no messages", nil, nil, false},
		{"no table but further tables", []string{"outbox"}, []Table{{Name: "public.more"}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Default()
			cfg.Postgres.URL, cfg.Kafka.Brokers = "postgres://u@h/db", []string{"k:9092"}
			cfg.Postgres.Table, cfg.Postgres.MessagePrefixes, cfg.Tables = "", tc.prefixes, tc.tables
			err := cfg.Validate()
			if (err == nil) != tc.ok || (err != nil && !strings.Contains(err.Error(), "postgres.table")) {
				t.Errorf("Validate: %v, want ok=%t (an error naming postgres.table)", err, tc.ok)
			}
		})
	}
}
