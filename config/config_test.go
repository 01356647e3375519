package config

import (
	"os"
	"path/filepath"
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
		{"bad mapped topic", func(c *Config) { c.Routing.Topics = map[string]string{"X": "a b"} }, "routing.topics.X"},
		{"bad dlq", func(c *Config) { c.Routing.DLQTopic = "no/slash" }, "routing.dlq_topic"},
		{"zero in-flight", func(c *Config) { c.Limits.MaxInFlightRecords = 0 }, "limits.max_inflight_records"},
		{"in-flight bytes below message size", func(c *Config) { c.Limits.MaxInFlightBytes = 10 }, "limits.max_inflight_bytes"},
		{"status interval too long", func(c *Config) { c.Postgres.StatusInterval = time.Minute }, "postgres.status_interval"},
		{"log level", func(c *Config) { c.Log.Level = "loud" }, "log.level"},
		{"replication factor 0", func(c *Config) { c.Kafka.TopicReplicationFactor = 0 }, "kafka.topic_replication_factor"},
		{"nothing routes", func(c *Config) { c.Routing.Topic = "" }, "routing.topic"},
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

func TestEnvErrorsNameVariableAndKey(t *testing.T) {
	c := Default()
	err := c.LoadEnv(env(map[string]string{"OUTBOX_CDC_CREATE_TOPICS": "maybe"}))
	if err == nil || !strings.Contains(err.Error(), "OUTBOX_CDC_CREATE_TOPICS") || !strings.Contains(err.Error(), "kafka.create_topics") {
		t.Fatalf("got %v", err)
	}
}

func TestMaskURL(t *testing.T) {
	tests := []struct{ in, want string }{
		{"postgres://outbox:s3cret@db:5432/app", "postgres://outbox:xxxxx@db:5432/app"},
		{"postgres://outbox@db/app", "postgres://outbox@db/app"},
		{"postgres://db/app?password=s3cret&sslmode=require", "postgres://db/app?password=xxxxx&sslmode=require"},
		{"host=db password=s3cret user=x", "host=db password=xxxxx user=x"},
	}
	for _, tt := range tests {
		got := MaskURL(tt.in)
		if got != tt.want || strings.Contains(got, "s3cret") {
			t.Errorf("MaskURL(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestExampleConfigLoads keeps testdata/outbox-cdc.yaml (the README's reference) loadable.
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
	if s := c.KafkaSecurity(); s.SASLMechanism != "SCRAM-SHA-512" || s.SASLPassword != "p" {
		t.Fatalf("security %+v", s)
	}
}
