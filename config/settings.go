package config

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"
)

// setting is one configuration key that can also be set by an environment variable and, for the
// quick-start keys, by a flag.
type setting struct {
	Key   string // dotted YAML key
	Env   string // environment variable
	Flag  string // flag name; empty when the key has no flag
	Usage string
	set   func(c *Config, v string) error
}

func str(p func(c *Config) *string) func(*Config, string) error {
	return func(c *Config, v string) error { *p(c) = v; return nil }
}

func boolean(p func(c *Config) *bool) func(*Config, string) error {
	return func(c *Config, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("want true or false, got %q", v)
		}
		*p(c) = b
		return nil
	}
}

func integer[T int | int16 | int32 | int64](p func(c *Config) *T) func(*Config, string) error {
	return func(c *Config, v string) error {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || int64(T(n)) != n {
			var zero T
			return fmt.Errorf("want an integer that fits %T, got %q", zero, v)
		}
		*p(c) = T(n)
		return nil
	}
}

func float(p func(c *Config) *float64) func(*Config, string) error {
	return func(c *Config, v string) error {
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil {
			return fmt.Errorf("%q is not a number", v)
		}
		*p(c) = f
		return nil
	}
}

func duration(p func(c *Config) *time.Duration) func(*Config, string) error {
	return func(c *Config, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("want a duration such as 10s, got %q", v)
		}
		*p(c) = d
		return nil
	}
}

func list(p func(c *Config) *[]string) func(*Config, string) error {
	return func(c *Config, v string) error {
		var out []string
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
		*p(c) = out
		return nil
	}
}

// keyValues parses "key=value,key=value" into a map (replacing it).
func keyValues(p func(c *Config) *map[string]string) func(*Config, string) error {
	return func(c *Config, v string) error {
		out := map[string]string{}
		for _, pair := range strings.Split(v, ",") {
			if pair = strings.TrimSpace(pair); pair == "" {
				continue
			}
			k, val, ok := strings.Cut(pair, "=")
			if !ok || strings.TrimSpace(k) == "" {
				return fmt.Errorf("%q is not key=value", pair)
			}
			out[strings.TrimSpace(k)] = strings.TrimSpace(val)
		}
		*p(c) = out
		return nil
	}
}

// settings lists every key that environment variables and flags can set.
var settings = []setting{
	{"postgres.url", "OUTBOX_CDC_POSTGRES", "postgres", "PostgreSQL URL (role with REPLICATION)", str(func(c *Config) *string { return &c.Postgres.URL })},
	{"postgres.standby_urls", "OUTBOX_CDC_STANDBY_URLS", "", "", list(func(c *Config) *[]string { return &c.Postgres.StandbyURLs })},
	{"postgres.password_command", "OUTBOX_CDC_PASSWORD_COMMAND", "", "", str(func(c *Config) *string { return &c.Postgres.PasswordCommand })},
	{"postgres.password_file", "OUTBOX_CDC_PASSWORD_FILE", "", "", str(func(c *Config) *string { return &c.Postgres.PasswordFile })},
	{"postgres.table", "OUTBOX_CDC_TABLE", "table", "outbox table, schema-qualified", str(func(c *Config) *string { return &c.Postgres.Table })},
	{"postgres.ignore_tables", "OUTBOX_CDC_IGNORE_TABLES", "", "", list(func(c *Config) *[]string { return &c.Postgres.IgnoreTables })},
	{"postgres.message_prefixes", "OUTBOX_CDC_MESSAGE_PREFIXES", "", "", list(func(c *Config) *[]string { return &c.Postgres.MessagePrefixes })},
	{"postgres.slot", "OUTBOX_CDC_SLOT", "slot", "logical replication slot", str(func(c *Config) *string { return &c.Postgres.Slot })},
	{"postgres.publication", "OUTBOX_CDC_PUBLICATION", "publication", "publication", str(func(c *Config) *string { return &c.Postgres.Publication })},
	{"postgres.create_slot", "OUTBOX_CDC_CREATE_SLOT", "", "", boolean(func(c *Config) *bool { return &c.Postgres.CreateSlot })},
	{"postgres.create_publication", "OUTBOX_CDC_CREATE_PUBLICATION", "", "", boolean(func(c *Config) *bool { return &c.Postgres.CreatePublication })},
	{"postgres.status_interval", "OUTBOX_CDC_STATUS_INTERVAL", "", "", duration(func(c *Config) *time.Duration { return &c.Postgres.StatusInterval })},
	{"postgres.receive_timeout", "OUTBOX_CDC_RECEIVE_TIMEOUT", "", "", duration(func(c *Config) *time.Duration { return &c.Postgres.ReceiveTimeout })},
	{"postgres.failover_slot", "OUTBOX_CDC_FAILOVER_SLOT", "", "", str(func(c *Config) *string { return &c.Postgres.FailoverSlot })},
	{"postgres.standby_poll_interval", "OUTBOX_CDC_STANDBY_POLL_INTERVAL", "", "", duration(func(c *Config) *time.Duration { return &c.Postgres.StandbyPollInterval })},
	{"postgres.columns.event_id", "OUTBOX_CDC_COLUMN_EVENT_ID", "", "", str(func(c *Config) *string { return &c.Postgres.Columns.EventID })},
	{"postgres.columns.event_type", "OUTBOX_CDC_COLUMN_EVENT_TYPE", "", "", str(func(c *Config) *string { return &c.Postgres.Columns.EventType })},
	{"postgres.columns.aggregate_type", "OUTBOX_CDC_COLUMN_AGGREGATE_TYPE", "", "", str(func(c *Config) *string { return &c.Postgres.Columns.AggregateType })},
	{"postgres.columns.aggregate_id", "OUTBOX_CDC_COLUMN_AGGREGATE_ID", "", "", str(func(c *Config) *string { return &c.Postgres.Columns.AggregateID })},
	{"postgres.columns.aggregate_version", "OUTBOX_CDC_COLUMN_AGGREGATE_VERSION", "", "", str(func(c *Config) *string { return &c.Postgres.Columns.AggregateVersion })},
	{"postgres.columns.payload", "OUTBOX_CDC_COLUMN_PAYLOAD", "", "", str(func(c *Config) *string { return &c.Postgres.Columns.Payload })},
	{"postgres.columns.headers", "OUTBOX_CDC_COLUMN_HEADERS", "", "", str(func(c *Config) *string { return &c.Postgres.Columns.Headers })},
	{"postgres.columns.created_at", "OUTBOX_CDC_COLUMN_CREATED_AT", "", "", str(func(c *Config) *string { return &c.Postgres.Columns.CreatedAt })},
	{"postgres.columns.timestamp", "OUTBOX_CDC_COLUMN_TIMESTAMP", "", "", str(func(c *Config) *string { return &c.Postgres.Columns.Timestamp })},
	{"postgres.columns.trace_context", "OUTBOX_CDC_COLUMN_TRACE_CONTEXT", "", "", str(func(c *Config) *string { return &c.Postgres.Columns.TraceContext })},
	{"kafka.brokers", "OUTBOX_CDC_BROKERS", "brokers", "Kafka seed brokers, comma-separated host:port", list(func(c *Config) *[]string { return &c.Kafka.Brokers })},
	{"kafka.client_id", "OUTBOX_CDC_CLIENT_ID", "", "", str(func(c *Config) *string { return &c.Kafka.ClientID })},
	{"kafka.create_topics", "OUTBOX_CDC_CREATE_TOPICS", "", "", boolean(func(c *Config) *bool { return &c.Kafka.CreateTopics })},
	{"kafka.max_new_topics_per_hour", "OUTBOX_CDC_MAX_NEW_TOPICS_PER_HOUR", "", "", integer(func(c *Config) *int { return &c.Kafka.MaxNewTopicsPerHour })},
	{"kafka.topic_partitions", "OUTBOX_CDC_TOPIC_PARTITIONS", "", "", integer(func(c *Config) *int32 { return &c.Kafka.TopicPartitions })},
	{"kafka.topic_replication_factor", "OUTBOX_CDC_TOPIC_REPLICATION_FACTOR", "", "", integer(func(c *Config) *int16 { return &c.Kafka.TopicReplicationFactor })},
	{"kafka.max_message_bytes", "OUTBOX_CDC_MAX_MESSAGE_BYTES", "", "", integer(func(c *Config) *int32 { return &c.Kafka.MaxMessageBytes })},
	{"kafka.linger", "OUTBOX_CDC_LINGER", "", "", duration(func(c *Config) *time.Duration { return &c.Kafka.Linger })},
	{"kafka.compression", "OUTBOX_CDC_COMPRESSION", "", "", str(func(c *Config) *string { return &c.Kafka.Compression })},
	{"kafka.record_timestamp", "OUTBOX_CDC_RECORD_TIMESTAMP", "", "", str(func(c *Config) *string { return &c.Kafka.RecordTimestamp })},
	{"kafka.topic_config", "OUTBOX_CDC_TOPIC_CONFIG", "", "", keyValues(func(c *Config) *map[string]string { return &c.Kafka.TopicConfig })},
	{"kafka.quiet_flush", "OUTBOX_CDC_QUIET_FLUSH", "", "", duration(func(c *Config) *time.Duration { return &c.Kafka.QuietFlush })},
	{"kafka.ack_timeout", "OUTBOX_CDC_KAFKA_ACK_TIMEOUT", "", "", duration(func(c *Config) *time.Duration { return &c.Kafka.AckTimeout })},
	{"kafka.delivery", "OUTBOX_CDC_DELIVERY", "delivery", "at-least-once or exactly-once (Kafka transactions; consumers read read_committed)", str(func(c *Config) *string { return &c.Kafka.Delivery })},
	{"kafka.checkpoint_topic", "OUTBOX_CDC_CHECKPOINT_TOPIC", "", "", str(func(c *Config) *string { return &c.Kafka.CheckpointTopic })},
	{"kafka.transaction_interval", "OUTBOX_CDC_TRANSACTION_INTERVAL", "", "", duration(func(c *Config) *time.Duration { return &c.Kafka.TransactionInterval })},
	{"kafka.transaction_max_records", "OUTBOX_CDC_TRANSACTION_MAX_RECORDS", "", "", integer(func(c *Config) *int { return &c.Kafka.TransactionMaxRecords })},
	{"kafka.transaction_timeout", "OUTBOX_CDC_TRANSACTION_TIMEOUT", "", "", duration(func(c *Config) *time.Duration { return &c.Kafka.TransactionTimeout })},
	{"kafka.header_format", "OUTBOX_CDC_HEADER_FORMAT", "header-format", "outbox (event_id, event_type, ... headers), cloudevents (CloudEvents binary mode: ce_* headers) or debezium (as Debezium's outbox EventRouter writes them)", str(func(c *Config) *string { return &c.Kafka.HeaderFormat })},
	{"kafka.debezium.converter", "OUTBOX_CDC_DEBEZIUM_CONVERTER", "", "", str(func(c *Config) *string { return &c.Kafka.Debezium.Converter })},
	{"kafka.debezium.additional_placement", "OUTBOX_CDC_DEBEZIUM_ADDITIONAL_PLACEMENT", "", "", str(func(c *Config) *string { return &c.Kafka.Debezium.AdditionalPlacement })},
	{"kafka.debezium.expand_json_payload", "OUTBOX_CDC_DEBEZIUM_EXPAND_JSON_PAYLOAD", "", "", boolean(func(c *Config) *bool { return &c.Kafka.Debezium.ExpandJSONPayload })},
	{"kafka.debezium.tombstone_on_empty_payload", "OUTBOX_CDC_DEBEZIUM_TOMBSTONE_ON_EMPTY_PAYLOAD", "", "", boolean(func(c *Config) *bool { return &c.Kafka.Debezium.TombstoneOnEmptyPayload })},
	{"kafka.cloudevents_source", "OUTBOX_CDC_CLOUDEVENTS_SOURCE", "", "", str(func(c *Config) *string { return &c.Kafka.CloudEventsSource })},
	{"kafka.tls.enabled", "OUTBOX_CDC_KAFKA_TLS", "", "", boolean(func(c *Config) *bool { return &c.Kafka.TLS.Enabled })},
	{"kafka.tls.ca_file", "OUTBOX_CDC_KAFKA_TLS_CA_FILE", "", "", str(func(c *Config) *string { return &c.Kafka.TLS.CAFile })},
	{"kafka.tls.cert_file", "OUTBOX_CDC_KAFKA_TLS_CERT_FILE", "", "", str(func(c *Config) *string { return &c.Kafka.TLS.CertFile })},
	{"kafka.tls.key_file", "OUTBOX_CDC_KAFKA_TLS_KEY_FILE", "", "", str(func(c *Config) *string { return &c.Kafka.TLS.KeyFile })},
	{"kafka.tls.insecure_skip_verify", "OUTBOX_CDC_KAFKA_TLS_INSECURE_SKIP_VERIFY", "", "", boolean(func(c *Config) *bool { return &c.Kafka.TLS.InsecureSkipVerify })},
	{"kafka.sasl.mechanism", "OUTBOX_CDC_KAFKA_SASL_MECHANISM", "", "", str(func(c *Config) *string { return &c.Kafka.SASL.Mechanism })},
	{"kafka.sasl.username", "OUTBOX_CDC_KAFKA_SASL_USERNAME", "", "", str(func(c *Config) *string { return &c.Kafka.SASL.Username })},
	{"kafka.sasl.password", "OUTBOX_CDC_KAFKA_SASL_PASSWORD", "", "", str(func(c *Config) *string { return &c.Kafka.SASL.Password })},
	{"kafka.sasl.oauth.token_url", "OUTBOX_CDC_KAFKA_SASL_OAUTH_TOKEN_URL", "", "", str(func(c *Config) *string { return &c.Kafka.SASL.OAuth.TokenURL })},
	{"kafka.sasl.oauth.client_id", "OUTBOX_CDC_KAFKA_SASL_OAUTH_CLIENT_ID", "", "", str(func(c *Config) *string { return &c.Kafka.SASL.OAuth.ClientID })},
	{"kafka.sasl.oauth.client_secret_file", "OUTBOX_CDC_KAFKA_SASL_OAUTH_CLIENT_SECRET_FILE", "", "", str(func(c *Config) *string { return &c.Kafka.SASL.OAuth.ClientSecretFile })},
	{"kafka.sasl.oauth.scope", "OUTBOX_CDC_KAFKA_SASL_OAUTH_SCOPE", "", "", str(func(c *Config) *string { return &c.Kafka.SASL.OAuth.Scope })},
	{"kafka.sasl.oauth.client_auth", "OUTBOX_CDC_KAFKA_SASL_OAUTH_CLIENT_AUTH", "", "", str(func(c *Config) *string { return &c.Kafka.SASL.OAuth.ClientAuth })},
	{"kafka.sasl.oauth.token_file", "OUTBOX_CDC_KAFKA_SASL_OAUTH_TOKEN_FILE", "", "", str(func(c *Config) *string { return &c.Kafka.SASL.OAuth.TokenFile })},
	{"kafka.sasl.oauth.extensions", "OUTBOX_CDC_KAFKA_SASL_OAUTH_EXTENSIONS", "", "", keyValues(func(c *Config) *map[string]string { return &c.Kafka.SASL.OAuth.Extensions })},
	{"kafka.sasl.aws.region", "OUTBOX_CDC_KAFKA_SASL_AWS_REGION", "", "", str(func(c *Config) *string { return &c.Kafka.SASL.AWS.Region })},
	{"routing.topic", "OUTBOX_CDC_TOPIC", "topic", "topic template, {column} is replaced by the row's value", str(func(c *Config) *string { return &c.Routing.Topic })},
	{"routing.fallback_topic", "OUTBOX_CDC_FALLBACK_TOPIC", "fallback-topic", "topic for rows the template cannot route", str(func(c *Config) *string { return &c.Routing.FallbackTopic })},
	{"routing.dlq_topic", "OUTBOX_CDC_DLQ_TOPIC", "dlq-topic", "dead-letter topic for rows that can never be delivered", str(func(c *Config) *string { return &c.Routing.DLQTopic })},
	{"routing.allowed_topics", "OUTBOX_CDC_ALLOWED_TOPICS", "allowed-topics", "comma-separated glob patterns every routed topic must match (empty: any)", list(func(c *Config) *[]string { return &c.Routing.AllowedTopics })},
	{"limits.max_inflight_records", "OUTBOX_CDC_MAX_INFLIGHT_RECORDS", "", "", integer(func(c *Config) *int { return &c.Limits.MaxInFlightRecords })},
	{"limits.min_inflight_records", "OUTBOX_CDC_MIN_INFLIGHT_RECORDS", "", "", integer(func(c *Config) *int { return &c.Limits.MinInFlightRecords })},
	{"limits.max_inflight_bytes", "OUTBOX_CDC_MAX_INFLIGHT_BYTES", "", "", integer(func(c *Config) *int64 { return &c.Limits.MaxInFlightBytes })},
	{"log.level", "OUTBOX_CDC_LOG_LEVEL", "log-level", "debug, info, warn or error", str(func(c *Config) *string { return &c.Log.Level })},
	{"log.format", "OUTBOX_CDC_LOG_FORMAT", "log-format", "auto (text on a terminal, JSON otherwise), text or json", str(func(c *Config) *string { return &c.Log.Format })},
	{"metrics.pprof", "OUTBOX_CDC_PPROF", "", "", boolean(func(c *Config) *bool { return &c.Metrics.Pprof })},
	{"metrics.addr", "OUTBOX_CDC_METRICS_ADDR", "metrics-addr", "listen address for /metrics, /healthz, /readyz (empty disables)", str(func(c *Config) *string { return &c.Metrics.Addr })},
	{"metrics.admin_token_file", "OUTBOX_CDC_ADMIN_TOKEN_FILE", "", "", str(func(c *Config) *string { return &c.Metrics.AdminTokenFile })},
	{"metrics.allowed_hosts", "OUTBOX_CDC_ALLOWED_HOSTS", "", "", list(func(c *Config) *[]string { return &c.Metrics.AllowedHosts })},
	{"tracing.otlp_endpoint", "OUTBOX_CDC_OTLP_ENDPOINT", "", "", str(func(c *Config) *string { return &c.Tracing.OTLPEndpoint })},
	{"tracing.service_name", "OUTBOX_CDC_TRACING_SERVICE_NAME", "", "", str(func(c *Config) *string { return &c.Tracing.ServiceName })},
	{"tracing.sample_ratio", "OUTBOX_CDC_TRACING_SAMPLE_RATIO", "", "", float(func(c *Config) *float64 { return &c.Tracing.SampleRatio })},
	{"shutdown_timeout", "OUTBOX_CDC_SHUTDOWN_TIMEOUT", "", "", duration(func(c *Config) *time.Duration { return &c.ShutdownTimeout })},
	{"fleet.coordination", "OUTBOX_CDC_FLEET_COORDINATION", "", "", str(func(c *Config) *string { return &c.Fleet.Coordination })},
	{"fleet.group", "OUTBOX_CDC_FLEET_GROUP", "", "", str(func(c *Config) *string { return &c.Fleet.Group })},
	{"fleet.instance", "OUTBOX_CDC_FLEET_INSTANCE", "", "", str(func(c *Config) *string { return &c.Fleet.Instance })},
	{"fleet.max_inflight_bytes", "OUTBOX_CDC_FLEET_MAX_INFLIGHT_BYTES", "", "", integer(func(c *Config) *int64 { return &c.Fleet.MaxInFlightBytes })},
	{"fleet.session_timeout", "OUTBOX_CDC_FLEET_SESSION_TIMEOUT", "", "", duration(func(c *Config) *time.Duration { return &c.Fleet.SessionTimeout })},
}

// RegisterFlags adds the quick-start flags to fs. Their values are strings so that an unset flag
// never overrides the file or the environment; apply them with ApplyFlags.
func RegisterFlags(fs *pflag.FlagSet) {
	for _, s := range settings {
		if s.Flag != "" {
			fs.String(s.Flag, "", s.Usage+" ("+s.Key+", $"+s.Env+")")
		}
	}
}

// ApplyFlags applies the flags of fs that were set on the command line.
func (c *Config) ApplyFlags(fs *pflag.FlagSet) error {
	for _, s := range settings {
		if s.Flag == "" || !fs.Changed(s.Flag) {
			continue
		}
		v, err := fs.GetString(s.Flag)
		if err != nil {
			return fmt.Errorf("flag --%s: %w", s.Flag, err)
		}
		if err := s.set(c, v); err != nil {
			return fmt.Errorf("flag --%s (%s): %w", s.Flag, s.Key, err)
		}
	}
	return nil
}

// EnvReference returns "key  ENV" lines for every environment variable, for the help text.
func EnvReference() string {
	var b strings.Builder
	for _, s := range settings {
		fmt.Fprintf(&b, "  %-38s %s\n", s.Env, s.Key)
	}
	return b.String()
}

// Load builds the configuration: defaults, then the file at path (if not empty), then the
// environment, then the flags set in fs (if not nil); then validates it.
func Load(path string, lookup func(string) (string, bool), fs *pflag.FlagSet) (Config, error) {
	c := Default()
	if path != "" {
		if err := c.LoadFile(path); err != nil {
			return c, err
		}
	}
	if err := c.LoadEnv(lookup); err != nil {
		return c, err
	}
	if v, ok := lookup("PGPASSWORD"); ok {
		c.envPassword = v
	}
	if fs != nil {
		if err := c.ApplyFlags(fs); err != nil {
			return c, err
		}
	}
	explicit, err := explicitKeys(path, lookup, fs)
	if err != nil {
		return c, err
	}
	if c.HasSources() {
		// The top-level keys are every source's defaults; each source is validated whole.
		if err := c.resolveSources(func(key string) bool { return explicit[key] }); err != nil {
			return c, fmt.Errorf("invalid configuration:\n%w", err)
		}
		return c, nil
	}
	c.ApplyFormatDefaults(func(key string) bool { return explicit[key] })
	if err := c.applyPasswordFile(); err != nil {
		return c, fmt.Errorf("invalid configuration:\n%w", err)
	}
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("invalid configuration:\n%w", err)
	}
	return c, nil
}

// explicitKeys returns the keys the file at path, the environment and the flags of fs set: the
// settings whose format-dependent defaults (ApplyFormatDefaults) must not replace them.
func explicitKeys(path string, lookup func(string) (string, bool), fs *pflag.FlagSet) (map[string]bool, error) {
	keys := map[string]bool{}
	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("read config file: %w", err)
		}
		var doc map[string]any
		if err := yaml.Unmarshal(data, &doc); err != nil {
			return nil, fmt.Errorf("config file %s: %w", path, err)
		}
		var walk func(prefix string, m map[string]any)
		walk = func(prefix string, m map[string]any) {
			for k, v := range m {
				keys[prefix+k] = true
				if sub, ok := v.(map[string]any); ok {
					walk(prefix+k+".", sub)
				}
			}
		}
		walk("", doc)
	}
	for _, s := range settings {
		if v, ok := lookup(s.Env); ok && v != "" {
			keys[s.Key] = true
		}
		if fs != nil && s.Flag != "" && fs.Changed(s.Flag) {
			keys[s.Key] = true
		}
	}
	return keys, nil
}
