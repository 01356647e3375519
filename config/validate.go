// Validation: every key's value checked at start, with errors that name the key.

package config

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
)

// Validate checks the whole configuration (one source's) and returns every problem, each naming its
// key.
func (c *Config) Validate() error {
	var errs []error
	c.validate(func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
	})
	return errors.Join(errs...)
}

// validate reports every problem of the configuration to bad, with its key.
func (c *Config) validate(bad func(key, format string, args ...any)) {
	if c.Postgres.URL == "" {
		bad("postgres.url", "is required (flag --postgres or OUTBOX_CDC_POSTGRES)")
	} else if !strings.HasPrefix(c.Postgres.URL, "postgres://") && !strings.HasPrefix(c.Postgres.URL, "postgresql://") {
		bad("postgres.url", "must be a postgres:// URL (the value is not shown: it may hold a password)")
	} else if _, err := pgconn.ParseConfig(c.Postgres.URL); err != nil {
		// pgconn hides the password in its own messages; callers scrub the rest with Secrets.
		if !(c.filesLater && errors.Is(err, fs.ErrNotExist)) {
			bad("postgres.url", "%v", err)
		}
	}
	switch parts := strings.Split(c.Postgres.Table, "."); {
	case c.Postgres.Table == "" && len(c.Postgres.MessagePrefixes) > 0 && len(c.Tables) == 0:
		// A source of WAL messages only: no table, only the publication the stream names.
	case c.Postgres.Table == "" && len(c.Postgres.MessagePrefixes) > 0:
		bad("postgres.table", "is empty (a source of WAL messages only), but tables lists further outbox tables: name the first one here")
	case len(parts) > 2 || c.Postgres.Table == "" || parts[0] == "" || parts[len(parts)-1] == "":
		bad("postgres.table", "must be table or schema.table (empty only for a source of WAL messages, with postgres.message_prefixes), got %q", c.Postgres.Table)
	}
	for i, prefix := range c.Postgres.MessagePrefixes {
		switch {
		case prefix == "":
			bad("postgres.message_prefixes", "entry %d is empty: a prefix names the messages that carry events", i+1)
		case !utf8.ValidString(prefix):
			bad("postgres.message_prefixes", "entry %d is not UTF-8", i+1)
		case slices.Contains(c.Postgres.MessagePrefixes[:i], prefix):
			bad("postgres.message_prefixes", "%q is listed twice", prefix)
		}
	}
	for _, t := range c.Postgres.IgnoreTables {
		parts := strings.Split(t, ".")
		switch {
		case t == "*":
		case len(parts) > 2 || parts[0] == "" || parts[len(parts)-1] == "":
			bad("postgres.ignore_tables", "%q must be table, schema.table or *", t)
		case sameTable(t, c.Postgres.Table) || slices.ContainsFunc(c.Tables, func(x Table) bool { return sameTable(t, x.Name) }):
			bad("postgres.ignore_tables", "%q is an outbox table of this source (postgres.table, tables): its rows cannot be both streamed and ignored", t)
		}
	}
	identRE := regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)
	// 56, not 63: resync's marker slot adds "_resync".
	if !regexp.MustCompile(`^[a-z_][a-z0-9_]{0,55}$`).MatchString(c.Postgres.Slot) {
		bad("postgres.slot", "must be lower-case letters, digits and underscores (at most 56), got %q", c.Postgres.Slot)
	}
	if !identRE.MatchString(c.Postgres.Publication) {
		bad("postgres.publication", "must be lower-case letters, digits and underscores (at most 63), got %q", c.Postgres.Publication)
	}
	for key, v := range map[string]string{
		"postgres.columns.event_id": c.Postgres.Columns.EventID, "postgres.columns.event_type": c.Postgres.Columns.EventType,
		"postgres.columns.aggregate_id": c.Postgres.Columns.AggregateID, "postgres.columns.payload": c.Postgres.Columns.Payload,
	} {
		if v == "" {
			bad(key, "is required")
		}
	}
	if c.Postgres.StatusInterval < 100*time.Millisecond || c.Postgres.StatusInterval > 50*time.Second {
		bad("postgres.status_interval", "must be between 100ms and 50s (below wal_sender_timeout), got %s", c.Postgres.StatusInterval)
	}
	if c.Postgres.ReceiveTimeout < 2*c.Postgres.StatusInterval {
		bad("postgres.receive_timeout", "must be at least twice postgres.status_interval (%s), got %s", c.Postgres.StatusInterval, c.Postgres.ReceiveTimeout)
	}
	if c.Postgres.StandbyPollInterval <= 0 {
		bad("postgres.standby_poll_interval", "must be positive, got %s", c.Postgres.StandbyPollInterval)
	}
	if len(c.Kafka.Brokers) == 0 {
		bad("kafka.brokers", "is required (flag --brokers or OUTBOX_CDC_BROKERS)")
	}
	for _, b := range c.Kafka.Brokers {
		if !strings.Contains(b, ":") {
			bad("kafka.brokers", "%q must be host:port", b)
		}
	}
	if c.Kafka.MaxNewTopicsPerHour < 0 {
		bad("kafka.max_new_topics_per_hour", "must be 0 (no limit) or more, got %d", c.Kafka.MaxNewTopicsPerHour)
	}
	if c.Kafka.TopicPartitions < 1 {
		bad("kafka.topic_partitions", "must be at least 1, got %d", c.Kafka.TopicPartitions)
	}
	if c.Kafka.TopicReplicationFactor == 0 || c.Kafka.TopicReplicationFactor < -1 {
		bad("kafka.topic_replication_factor", "must be -1 (broker default) or at least 1, got %d", c.Kafka.TopicReplicationFactor)
	}
	if c.Kafka.MaxMessageBytes < 1024 {
		bad("kafka.max_message_bytes", "must be at least 1024, got %d", c.Kafka.MaxMessageBytes)
	}
	switch o := c.Kafka.SASL.OAuth; strings.ToUpper(c.Kafka.SASL.Mechanism) {
	case "":
	case "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512":
		if c.Kafka.SASL.Username == "" || c.Kafka.SASL.Password == "" {
			bad("kafka.sasl", "mechanism %s needs kafka.sasl.username and kafka.sasl.password", c.Kafka.SASL.Mechanism)
		}
	case SASLOAuthBearer:
		switch {
		case o.TokenFile != "" && o.TokenURL != "":
			bad("kafka.sasl.oauth", "set token_url (with client_id and client_secret_file) or token_file, not both")
		case o.TokenFile == "" && (o.TokenURL == "" || o.ClientID == "" || o.ClientSecretFile == ""):
			bad("kafka.sasl.oauth", "OAUTHBEARER needs token_url, client_id and client_secret_file (an OIDC client-credentials flow), or token_file")
		case o.TokenURL != "" && !strings.HasPrefix(o.TokenURL, "https://") && !strings.HasPrefix(o.TokenURL, "http://"):
			bad("kafka.sasl.oauth.token_url", "must be an http(s):// URL, got %q", o.TokenURL)
		}
		if o.ClientAuth != "" && o.ClientAuth != "basic" && o.ClientAuth != "post" {
			bad("kafka.sasl.oauth.client_auth", "must be basic or post, got %q", o.ClientAuth)
		}
	case SASLAWSMSKIAM:
		if !c.Kafka.TLS.Enabled {
			bad("kafka.sasl.mechanism", "AWS_MSK_IAM needs kafka.tls.enabled: MSK takes IAM only over TLS (port 9098)")
		}
	default:
		bad("kafka.sasl.mechanism", "must be PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER or AWS_MSK_IAM, got %q", c.Kafka.SASL.Mechanism)
	}
	for key, file := range map[string]string{"kafka.tls.ca_file": c.Kafka.TLS.CAFile, "kafka.tls.cert_file": c.Kafka.TLS.CertFile, "kafka.tls.key_file": c.Kafka.TLS.KeyFile} {
		if file == "" {
			continue
		}
		if !c.Kafka.TLS.Enabled {
			bad(key, "is set but kafka.tls.enabled is false")
		} else if data, err := os.ReadFile(file); c.filesLater && errors.Is(err, fs.ErrNotExist) {
			// Not there yet: the source waits for it.
		} else if err != nil {
			bad(key, "cannot read %s: %v", file, err)
		} else if key == "kafka.tls.ca_file" && !x509.NewCertPool().AppendCertsFromPEM(data) {
			bad(key, "%s holds no PEM certificate", file)
		}
	}
	if (c.Kafka.TLS.CertFile == "") != (c.Kafka.TLS.KeyFile == "") {
		bad("kafka.tls.cert_file", "and kafka.tls.key_file go together")
	}
	if c.Kafka.Linger < 0 {
		bad("kafka.linger", "must not be negative, got %s", c.Kafka.Linger)
	}
	switch c.Kafka.Compression {
	case "none", "gzip", "snappy", "lz4", "zstd":
	default:
		bad("kafka.compression", "must be none, gzip, snappy, lz4 or zstd, got %q", c.Kafka.Compression)
	}
	switch c.Kafka.RecordTimestamp {
	case RecordTimestampCommit, RecordTimestampProduce:
	default:
		bad("kafka.record_timestamp", "must be %s or %s, got %q", RecordTimestampCommit, RecordTimestampProduce, c.Kafka.RecordTimestamp)
	}
	for k, v := range c.Kafka.TopicConfig {
		if k == "" || v == "" || strings.ContainsAny(k, " =,") {
			bad("kafka.topic_config", "%q = %q is not a topic configuration (a Kafka topic config name and its value)", k, v)
		}
	}
	if c.Kafka.QuietFlush < 0 {
		bad("kafka.quiet_flush", "must not be negative, got %s", c.Kafka.QuietFlush)
	}
	if c.Kafka.AckTimeout != 0 && c.Kafka.AckTimeout < time.Second {
		bad("kafka.ack_timeout", "must be 0 (never release) or at least 1s, got %s", c.Kafka.AckTimeout)
	}
	switch c.Kafka.HeaderFormat {
	case HeaderFormatOutbox:
		if c.Kafka.CloudEventsSource != "" {
			bad("kafka.cloudevents_source", "is set but kafka.header_format is %s, not %s", c.Kafka.HeaderFormat, HeaderFormatCloudEvents)
		}
	case HeaderFormatCloudEvents:
		if c.Postgres.Columns.EventType == "" {
			bad("postgres.columns.event_type", "must be set when kafka.header_format is cloudevents (ce_type is required)")
		}
		if src := c.Kafka.CloudEventsSource; src != "" {
			if u, err := url.Parse(src); err != nil || strings.ContainsFunc(src, func(r rune) bool { return r <= ' ' || r == 0x7f || r > 0x7e }) || u.String() == "" {
				bad("kafka.cloudevents_source", "must be a URI-reference (RFC 3986: no spaces or control characters, non-ASCII percent-encoded), got %q", src)
			}
		}
	case HeaderFormatDebezium:
		if c.Kafka.CloudEventsSource != "" {
			bad("kafka.cloudevents_source", "is set but kafka.header_format is %s, not %s", c.Kafka.HeaderFormat, HeaderFormatCloudEvents)
		}
	default:
		bad("kafka.header_format", "must be %s, %s or %s, got %q", HeaderFormatOutbox, HeaderFormatCloudEvents, HeaderFormatDebezium, c.Kafka.HeaderFormat)
	}
	c.validateDebezium(bad)
	if e := c.Tracing.OTLPEndpoint; e != "" {
		if u, err := url.Parse(e); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("tracing.otlp_endpoint", "must be an http:// or https:// URL of an OTLP/HTTP collector, got %q", e)
		}
	}
	if r := c.Tracing.SampleRatio; r < 0 || r > 1 {
		bad("tracing.sample_ratio", "must be between 0 and 1, got %v", r)
	}
	if c.Tracing.ServiceName == "" {
		bad("tracing.service_name", "must not be empty")
	}
	switch c.Postgres.FailoverSlot {
	case "auto", "on", "off":
	default:
		bad("postgres.failover_slot", "must be auto, on or off, got %q", c.Postgres.FailoverSlot)
	}
	switch c.Kafka.Delivery {
	case DeliveryAtLeastOnce:
	case DeliveryExactlyOnce:
		if c.Kafka.CheckpointTopic == "" {
			bad("kafka.checkpoint_topic", "must be set in exactly-once mode")
		}
		if c.Kafka.TransactionInterval <= 0 {
			bad("kafka.transaction_interval", "must be positive, got %s", c.Kafka.TransactionInterval)
		}
		if c.Kafka.TransactionMaxRecords < 1 {
			bad("kafka.transaction_max_records", "must be at least 1, got %d", c.Kafka.TransactionMaxRecords)
		}
		if c.Kafka.TransactionTimeout < time.Second {
			bad("kafka.transaction_timeout", "must be at least 1s, got %s", c.Kafka.TransactionTimeout)
		} else if c.Kafka.TransactionInterval > c.Kafka.TransactionTimeout/2 {
			bad("kafka.transaction_interval", "must be at most half of kafka.transaction_timeout (%s): a Kafka transaction open longer than the timeout is aborted by the broker, and the commit itself takes time; got %s",
				c.Kafka.TransactionTimeout, c.Kafka.TransactionInterval)
		}
	default:
		bad("kafka.delivery", "must be %s or %s, got %q", DeliveryAtLeastOnce, DeliveryExactlyOnce, c.Kafka.Delivery)
	}
	if cp := c.Kafka.CheckpointTopic; cp != "" {
		// The checkpoint topic is shared by every slot's exactly-once router by default: a record a
		// row put there could pass for another slot's checkpoint. '.' and '_' collide in Kafka.
		same := func(t string) bool {
			return t != "" && strings.ReplaceAll(t, ".", "_") == strings.ReplaceAll(cp, ".", "_")
		}
		why := "is kafka.checkpoint_topic (%q), which holds the exactly-once checkpoints of every slot: no record may go there"
		if same(c.Routing.DLQTopic) {
			bad("routing.dlq_topic", why, cp)
		}
		if same(c.Routing.FallbackTopic) {
			bad("routing.fallback_topic", why, cp)
		}
		for et, t := range c.Routing.Topics {
			if same(t) {
				bad("routing.topics."+et, why, cp)
			}
		}
		if !strings.ContainsAny(c.Routing.Topic, "{}") && same(c.Routing.Topic) {
			bad("routing.topic", why, cp)
		}
	}
	if c.Routing.Topic == "" && len(c.Routing.Topics) == 0 && c.Routing.FallbackTopic == "" {
		bad("routing.topic", "is empty and neither routing.topics nor routing.fallback_topic is set: no row could be routed")
	}
	c.validateTables(bad)
	// Topic names and patterns are Kafka's business: router.NewRules checks them, naming the key.
	if c.Limits.MaxInFlightRecords < 1 {
		bad("limits.max_inflight_records", "must be at least 1, got %d", c.Limits.MaxInFlightRecords)
	}
	if c.Limits.MinInFlightRecords < 1 {
		bad("limits.min_inflight_records", "must be at least 1, got %d (at or above limits.max_inflight_records the window is fixed)", c.Limits.MinInFlightRecords)
	}
	if c.Limits.MaxInFlightBytes < int64(c.Kafka.MaxMessageBytes) {
		bad("limits.max_inflight_bytes", "must be at least kafka.max_message_bytes (%d), got %d", c.Kafka.MaxMessageBytes, c.Limits.MaxInFlightBytes)
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		bad("log.level", "must be debug, info, warn or error, got %q", c.Log.Level)
	}
	switch c.Log.Format {
	case "auto", "text", "json":
	default:
		bad("log.format", "must be auto, text or json, got %q", c.Log.Format)
	}
	if c.Metrics.Addr != "" {
		if _, _, err := net.SplitHostPort(c.Metrics.Addr); err != nil {
			bad("metrics.addr", "must be host:port (empty disables), got %q", c.Metrics.Addr)
		}
	}
	if c.ShutdownTimeout <= 0 {
		bad("shutdown_timeout", "must be positive, got %s", c.ShutdownTimeout)
	}
	switch c.Fleet.Coordination {
	case FleetKafka, FleetNone:
	default:
		bad("fleet.coordination", "must be %s or %s, got %q", FleetKafka, FleetNone, c.Fleet.Coordination)
	}
	if g := c.Fleet.Group; g != "" && !regexp.MustCompile(`^[A-Za-z0-9._-]{1,150}$`).MatchString(g) {
		bad("fleet.group", "must be at most 150 letters, digits, '.', '_' and '-' (it names the coordination topics outbox-cdc.fleet.<group> and outbox-cdc.fleet.<group>.<source>.<hash>), got %q", g)
	}
	if c.Fleet.MaxInFlightBytes < 1<<20 {
		bad("fleet.max_inflight_bytes", "must be at least 1 MiB (1048576), got %d", c.Fleet.MaxInFlightBytes)
	}
	if c.Fleet.SessionTimeout < time.Second || c.Fleet.SessionTimeout > 5*time.Minute {
		bad("fleet.session_timeout", "must be between 1s and 5m (and within the broker's group.min/max.session.timeout.ms), got %s", c.Fleet.SessionTimeout)
	}
}

// validateDebezium checks kafka.debezium.
func (c *Config) validateDebezium(bad func(key, format string, args ...any)) {
	d := c.Kafka.Debezium
	switch d.Converter {
	case DebeziumConverterString, DebeziumConverterJSON:
	default:
		bad("kafka.debezium.converter", "must be %s or %s, got %q", DebeziumConverterString, DebeziumConverterJSON, d.Converter)
	}
	fields, err := d.AdditionalFields()
	if err != nil {
		bad("kafka.debezium.additional_placement", "%v", err)
	}
	debezium := c.Kafka.HeaderFormat == HeaderFormatDebezium
	if !debezium && (d.AdditionalPlacement != "" || d.ExpandJSONPayload || d.TombstoneOnEmptyPayload || d.Converter != DebeziumConverterString) {
		bad("kafka.debezium", "is set but kafka.header_format is %s, not %s", c.Kafka.HeaderFormat, HeaderFormatDebezium)
		return
	}
	partitions := 0
	for _, f := range fields {
		switch f.Placement {
		case PlacementEnvelope:
			if d.Converter != DebeziumConverterJSON {
				bad("kafka.debezium.additional_placement", "%s:envelope needs kafka.debezium.converter json: with Connect's StringConverter the value would be the Java struct's toString()", f.Column)
			}
		case PlacementPartition:
			partitions++
		}
	}
	if partitions > 1 {
		bad("kafka.debezium.additional_placement", "names more than one partition column")
	}
	if d.ExpandJSONPayload && d.Converter != DebeziumConverterJSON {
		bad("kafka.debezium.expand_json_payload", "needs kafka.debezium.converter json: with Connect's StringConverter an expanded payload would be the Java struct's toString()")
	}
}
