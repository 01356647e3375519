// Package config holds outbox-cdc's configuration: defaults, the YAML file, OUTBOX_CDC_* environment
// variables and command-line flags, applied in that order, then validated with errors that name the key.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"gopkg.in/yaml.v3"
)

// Config is the whole configuration of the daemon. The yaml tags are the keys of the config file; the
// dotted key of a field (for example postgres.slot) is the name used in errors, environment variables
// and docs/configuration.md (config/reference.go).
type Config struct {
	// Postgres is the source database and slot.
	Postgres Postgres `yaml:"postgres"`
	// Kafka is the producer and topic administration.
	Kafka Kafka `yaml:"kafka"`
	// Routing chooses topics.
	Routing Routing `yaml:"routing"`
	// Tables are further outbox tables of the same database, streamed through the same slot and
	// publication as postgres.table (one decode of the WAL), each with its own routing over this
	// one. OutboxTables returns them all.
	Tables []Table `yaml:"tables,omitempty"`
	// Limits bound memory.
	Limits Limits `yaml:"limits"`
	// Log configures logging.
	Log Log `yaml:"log"`
	// Metrics configures the HTTP endpoint.
	Metrics Metrics `yaml:"metrics"`
	// Tracing configures OpenTelemetry spans of delivered records.
	Tracing Tracing `yaml:"tracing"`
	// ShutdownTimeout bounds how long a graceful stop waits for in-flight acknowledgements.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// Fleet configures how instances that share a sources list share its sources.
	Fleet Fleet `yaml:"fleet"`
	// SourceList is the sources list: several outbox tables or databases streamed by one process (or
	// shared by several instances), each entry's keys over the top-level ones. Empty: the top-level
	// configuration is the one source (named DefaultSourceName). Sources returns each one whole.
	SourceList []Source `yaml:"sources,omitempty"`

	// Name is the source's name in a configuration returned by Sources (not a key of the file).
	Name string `yaml:"-"`
	// resolved is every source's whole configuration, built by Load from SourceList.
	resolved []Config

	// filePassword is what postgres.password_file held, a secret like the others.
	filePassword string
	// envPassword is PGPASSWORD from the environment Load read: pgx uses it when the URL has no
	// password (the Helm chart's way), so it is a secret to scrub like one in the URL.
	envPassword string
	// filesLater is set on a source of a sources list: a TLS file its configuration names that does
	// not exist yet (a Secret mounted late) is no error at start; the source waits for it, retried on
	// a backoff, while the others stream.
	filesLater bool
}

// Fleet configures the instances that share a sources list: each source is streamed by one instance
// at a time, assigned through a Kafka consumer group (the protocol Kafka Connect spreads its tasks
// with), and moved when an instance stops, dies or joins.
type Fleet struct {
	// Coordination is FleetKafka (the default: the instances of one sources list share its sources
	// through a consumer group on the top-level kafka settings) or FleetNone (every instance streams
	// every source; each slot's exclusivity leaves the others waiting as hot standbys).
	Coordination string `yaml:"coordination"`
	// Group is the consumer group's id (DefaultGroup, outbox-cdc, when empty): the fleet's name, the
	// same whatever its sources list holds, so that a change of the list keeps one group and its
	// pause states. Fleets that share a Kafka cluster set one each (the Helm chart: the release).
	Group string `yaml:"group"`
	// Instance names this instance to the others (the group's client id); empty: the host name and
	// metrics.addr.
	Instance string `yaml:"instance"`
	// SessionTimeout is how long an instance may go silent before its sources move to the others
	// (Kafka's session.timeout.ms, within the broker's group.min/max.session.timeout.ms).
	SessionTimeout time.Duration `yaml:"session_timeout"`
	// MaxInFlightBytes caps the bytes in flight of all the sources of the process together (each
	// also keeps its own limits.max_inflight_bytes): the process's memory is bounded by it, however
	// many sources are busy at once (16 MiB by default, which one busy source does not reach). A
	// source with nothing in flight always gets one record through.
	MaxInFlightBytes int64 `yaml:"max_inflight_bytes"`
}

// The values of fleet.coordination.
const (
	// FleetKafka shares the sources through a Kafka consumer group.
	FleetKafka = "kafka"
	// FleetNone has every instance stream every source (the slots keep them exclusive).
	FleetNone = "none"
)

// Tracing configures OpenTelemetry tracing: a producer span per delivered record, child of the trace
// context the row carries (postgres.columns.trace_context or its headers), exported over OTLP/HTTP.
type Tracing struct {
	// OTLPEndpoint is the collector's OTLP/HTTP endpoint (http://collector:4318); empty turns
	// tracing off.
	OTLPEndpoint string `yaml:"otlp_endpoint"`
	// ServiceName is the spans' service.name.
	ServiceName string `yaml:"service_name"`
	// SampleRatio is the share of rows without a trace context that start a trace of their own (0
	// to 1); a row's own sampled context is always followed.
	SampleRatio float64 `yaml:"sample_ratio"`
}

// Postgres configures the source database and the replication slot.
type Postgres struct {
	// URL is the connection string (postgres://user:password@host:port/db). The role needs the
	// REPLICATION attribute.
	URL string `yaml:"url"`
	// PasswordFile, when set, is a file holding the password of URL's user (a mounted Secret: the Helm
	// chart gives each source of a fleet its own). It is read at start; the URL must not hold one.
	PasswordFile string `yaml:"password_file"`
	// PasswordCommand, when set, is a command (run with sh -c) that prints the password of URL's user,
	// run for every new connection: short-lived credentials (RDS/Aurora IAM tokens, Cloud SQL and
	// Azure Entra access tokens) and passwords rotated on the server are picked up at the next
	// connection. It sees PGHOST, PGPORT, PGUSER and PGDATABASE; its output is never logged. The URL
	// must not hold a password, nor postgres.password_file be set.
	PasswordCommand string `yaml:"password_command"`
	// StandbyURLs are the standbys that should be able to take over the slot at a failover
	// (PostgreSQL 17+ failover slots); status and init check and explain their readiness.
	StandbyURLs []string `yaml:"standby_urls"`
	// Table is the outbox table, schema-qualified.
	Table string `yaml:"table"`
	// IgnoreTables are tables of the publication whose inserts are not for this router: their rows
	// are dropped and confirmed past. Schema-qualified names, or "*" for every table that is not an
	// outbox table. Any other table the publication carries beside the outbox tables is refused at
	// start, and an insert into one that joins while running stops the source before it is confirmed
	// past (it may be an outbox a newer configuration streams).
	IgnoreTables []string `yaml:"ignore_tables"`
	// MessagePrefixes, when not empty, are the prefixes of the transactional logical decoding messages
	// (pg_logical_emit_message(true, prefix, content)) that carry outbox events, read beside the
	// outbox tables' rows: the content is a JSON object with fields named like the columns
	// (Columns). Messages of other prefixes are counted and passed over.
	MessagePrefixes []string `yaml:"message_prefixes"`
	// Slot is the logical replication slot's name.
	Slot string `yaml:"slot"`
	// Publication is the publication's name.
	Publication string `yaml:"publication"`
	// CreateSlot creates the slot when it is missing.
	CreateSlot bool `yaml:"create_slot"`
	// CreatePublication creates the publication (FOR TABLE <table> WITH (publish = 'insert')) when missing.
	CreatePublication bool `yaml:"create_publication"`
	// Columns names the outbox table's columns.
	Columns Columns `yaml:"columns"`
	// StatusInterval is the longest time between two standby status updates.
	StatusInterval time.Duration `yaml:"status_interval"`
	// StandbyPollInterval is how often a standby instance retries a slot held by another instance.
	StandbyPollInterval time.Duration `yaml:"standby_poll_interval"`
	// ReceiveTimeout is the longest silence on the replication connection before it is presumed
	// dead and replaced (a half-open socket accepts writes for minutes without a word back).
	ReceiveTimeout time.Duration `yaml:"receive_timeout"`
	// FailoverSlot is auto, on or off: whether the slot is a failover slot (PostgreSQL 17+), synchronized
	// to standbys that have sync_replication_slots on, so that it survives a promotion. auto: on where
	// the server supports it; on: refuse older servers.
	FailoverSlot string `yaml:"failover_slot"`
}

// Columns maps the outbox's roles to column names, like Debezium's table.field.event.* options.
type Columns struct {
	// EventID, EventType, ... name the column of each role (event_id, event_type, ... by default).
	EventID          string `yaml:"event_id"`
	EventType        string `yaml:"event_type"`
	AggregateType    string `yaml:"aggregate_type"`
	AggregateID      string `yaml:"aggregate_id"`
	AggregateVersion string `yaml:"aggregate_version"`
	Payload          string `yaml:"payload"`
	Headers          string `yaml:"headers"`
	CreatedAt        string `yaml:"created_at"`
	// Timestamp, when set, names the column whose value is each record's Kafka timestamp (Debezium's
	// table.field.event.timestamp): a timestamptz, a timestamp (its wall time taken as UTC), or an
	// integer of milliseconds since the Unix epoch. A NULL or unreadable value falls back to
	// kafka.record_timestamp.
	Timestamp string `yaml:"timestamp"`
	// TraceContext, when set, names a column holding the W3C trace context of the transaction that
	// wrote the row: a traceparent, a JSON object with traceparent and tracestate, or Debezium's
	// tracingspancontext (traceparent=... lines). It becomes the record's traceparent and tracestate
	// headers (and ce_traceparent, ce_tracestate in the cloudevents format).
	TraceContext string `yaml:"trace_context"`
}

// The delivery modes of kafka.delivery.
const (
	// DeliveryAtLeastOnce produces without transactions: a crash replays what the slot had not confirmed.
	DeliveryAtLeastOnce = "at-least-once"
	// DeliveryExactlyOnce produces in Kafka transactions with a checkpoint: read_committed consumers see
	// every event exactly once.
	DeliveryExactlyOnce = "exactly-once"
)

// The values of kafka.record_timestamp.
const (
	// RecordTimestampCommit stamps each record with its transaction's commit time.
	RecordTimestampCommit = "commit"
	// RecordTimestampProduce stamps each record with the time the router produces it.
	RecordTimestampProduce = "produce"
)

// The values of kafka.header_format.
const (
	// HeaderFormatOutbox carries the event's attributes in headers named after the outbox columns.
	HeaderFormatOutbox = "outbox"
	// HeaderFormatCloudEvents carries them as CloudEvents attributes (Kafka binding, binary mode).
	HeaderFormatCloudEvents = "cloudevents"
	// HeaderFormatDebezium writes what Debezium's outbox EventRouter writes: an id header, the key
	// and value as Kafka Connect's converter (kafka.debezium.converter) serializes them.
	HeaderFormatDebezium = "debezium"
)

// The values of kafka.debezium.converter.
const (
	// DebeziumConverterString matches Kafka Connect's StringConverter.
	DebeziumConverterString = "string"
	// DebeziumConverterJSON matches Kafka Connect's JsonConverter with schemas.enable=false.
	DebeziumConverterJSON = "json"
)

// DebeziumTopic is the debezium format's default routing.topic: Debezium's
// route.topic.replacement outbox.event.${routedByValue}, routed by aggregatetype.
const DebeziumTopic = "outbox.event.{aggregate_type}"

// ApplyFormatDefaults gives the settings whose defaults depend on kafka.header_format the
// format's defaults, leaving those set says were set explicitly (nil: none was). With the debezium
// format, postgres.columns.* default to Debezium's column names and routing.topic to
// outbox.event.{aggregate_type}.
func (c *Config) ApplyFormatDefaults(set func(key string) bool) {
	if c.Kafka.HeaderFormat != HeaderFormatDebezium {
		return
	}
	if set == nil {
		set = func(string) bool { return false }
	}
	dbz := DebeziumColumns()
	cols := []struct {
		key      string
		field    *string
		debezium string
	}{
		{"postgres.columns.event_id", &c.Postgres.Columns.EventID, dbz.EventID},
		{"postgres.columns.event_type", &c.Postgres.Columns.EventType, dbz.EventType},
		{"postgres.columns.aggregate_type", &c.Postgres.Columns.AggregateType, dbz.AggregateType},
		{"postgres.columns.aggregate_id", &c.Postgres.Columns.AggregateID, dbz.AggregateID},
		{"postgres.columns.aggregate_version", &c.Postgres.Columns.AggregateVersion, dbz.AggregateVersion},
		{"postgres.columns.payload", &c.Postgres.Columns.Payload, dbz.Payload},
		{"postgres.columns.headers", &c.Postgres.Columns.Headers, dbz.Headers},
		{"postgres.columns.created_at", &c.Postgres.Columns.CreatedAt, dbz.CreatedAt},
	}
	for _, col := range cols {
		if !set(col.key) {
			*col.field = col.debezium
		}
	}
	if !set("routing.topic") {
		c.Routing.Topic = DebeziumTopic
	}
}

// The SASL mechanisms beyond user and password.
const (
	// SASLOAuthBearer is SASL/OAUTHBEARER with an OIDC token.
	SASLOAuthBearer = "OAUTHBEARER"
	// SASLAWSMSKIAM is Amazon MSK's IAM access control.
	SASLAWSMSKIAM = "AWS_MSK_IAM"
)

// Routing chooses each row's topic.
type Routing struct {
	// Topic is the topic template: {column} is replaced by the row's value of that column.
	Topic string `yaml:"topic"`
	// Topics maps an event_type to a topic, ahead of the template.
	Topics map[string]string `yaml:"topics"`
	// FallbackTopic takes rows whose template cannot be filled (a NULL column) or yields an invalid name.
	FallbackTopic string `yaml:"fallback_topic"`
	// DLQTopic receives rows that can never be delivered, with headers giving the reason. Empty: such a
	// row stops the router with an error instead.
	DLQTopic string `yaml:"dlq_topic"`
	// AllowedTopics, when not empty, lists glob patterns (*, ?, [...]) that every routed topic must
	// match; a row routed elsewhere is undeliverable. It bounds the topics that rows can make the
	// router create.
	AllowedTopics []string `yaml:"allowed_topics"`
}

// Limits bound the router's memory.
type Limits struct {
	// MaxInFlightRecords caps records handed to Kafka and not yet acknowledged: the bound of the
	// in-flight window, which adapts below it to what the connection to Kafka needs.
	MaxInFlightRecords int `yaml:"max_inflight_records"`
	// MinInFlightRecords is the smallest the in-flight window gets. The window is sized from the
	// acknowledgement throughput and the produce round trip (twice the records that cover one round
	// trip and the linger); at or above MaxInFlightRecords it is fixed at that cap.
	MinInFlightRecords int `yaml:"min_inflight_records"`
	// MaxInFlightBytes caps the bytes of those records.
	MaxInFlightBytes int64 `yaml:"max_inflight_bytes"`
}

// Log configures logging.
type Log struct {
	// Level is debug, info, warn or error.
	Level string `yaml:"level"`
	// Format is auto (text on a terminal, JSON otherwise), text or json.
	Format string `yaml:"format"`
}

// Metrics configures the HTTP endpoint for /metrics, /healthz and /readyz.
type Metrics struct {
	// Addr is host:port to listen on; empty disables the endpoint.
	Addr string `yaml:"addr"`
	// Pprof serves Go's profiles under /debug/pprof/ on the same address. Off by default: profiles
	// show code paths and memory, and a CPU profile costs while it runs.
	Pprof bool `yaml:"pprof"`
	// AdminTokenFile holds the credentials the fleet API's pause and resume need (a mounted Secret):
	// one per line, a token alone or name:token, the name being who a pause is recorded as. Read at
	// every request. Empty: pause and resume are taken from the instance's own host only.
	AdminTokenFile string `yaml:"admin_token_file"`
	// AllowedHosts are host names, besides IP addresses and localhost, under which the fleet API and
	// status page answer ("*.example.com" for a domain): any other Host header is refused, against
	// DNS rebinding. The metrics and health endpoints answer under any name.
	AllowedHosts []string `yaml:"allowed_hosts"`
}

// Default returns the configuration used where nothing else is said.
func Default() Config {
	return Config{
		Postgres: Postgres{
			Table:               "public.outbox",
			Slot:                "outbox_cdc",
			Publication:         "outbox_cdc",
			CreateSlot:          true,
			CreatePublication:   true,
			StatusInterval:      10 * time.Second,
			StandbyPollInterval: 2 * time.Second,
			ReceiveTimeout:      30 * time.Second,
			FailoverSlot:        "auto",
			Columns: Columns{
				EventID:          "event_id",
				EventType:        "event_type",
				AggregateType:    "aggregate_type",
				AggregateID:      "aggregate_id",
				AggregateVersion: "aggregate_version",
				Payload:          "payload",
				Headers:          "headers",
				CreatedAt:        "created_at",
			},
		},
		Kafka: Kafka{
			ClientID:               "outbox-cdc",
			CreateTopics:           true,
			MaxNewTopicsPerHour:    100,
			TopicPartitions:        3,
			TopicReplicationFactor: -1,
			MaxMessageBytes:        1000000,
			Linger:                 10 * time.Millisecond,
			Compression:            "snappy",
			Debezium:               Debezium{Converter: DebeziumConverterString},
			RecordTimestamp:        RecordTimestampCommit,
			QuietFlush:             time.Millisecond,
			AckTimeout:             10 * time.Second,
			Delivery:               DeliveryAtLeastOnce,
			HeaderFormat:           HeaderFormatOutbox,
			CheckpointTopic:        "outbox-cdc.checkpoints",
			TransactionInterval:    10 * time.Millisecond,
			TransactionMaxRecords:  10000,
			TransactionTimeout:     time.Minute,
		},
		Routing:         Routing{Topic: "{event_type}"},
		Limits:          Limits{MaxInFlightRecords: 20000, MinInFlightRecords: 2000, MaxInFlightBytes: 64 << 20},
		Log:             Log{Level: "info", Format: "auto"},
		Metrics:         Metrics{Addr: "127.0.0.1:9187"},
		Tracing:         Tracing{ServiceName: "outbox-cdc"},
		Fleet:           Fleet{Coordination: FleetKafka, SessionTimeout: 6 * time.Second, MaxInFlightBytes: 16 << 20},
		ShutdownTimeout: 30 * time.Second,
	}
}

// LoadFile merges the YAML file at path into c. Unknown keys are errors.
func (c *Config) LoadFile(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read config file: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(c); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	return nil
}

// LoadEnv applies every OUTBOX_CDC_* variable that names a setting; lookup is os.LookupEnv in
// production and a map in tests.
func (c *Config) LoadEnv(lookup func(string) (string, bool)) error {
	for _, s := range settings {
		v, ok := lookup(s.Env)
		if !ok || v == "" {
			continue
		}
		if err := s.set(c, v); err != nil {
			return fmt.Errorf("environment variable %s (%s): %w", s.Env, s.Key, err)
		}
	}
	return nil
}

// applyPasswordFile reads postgres.password_file into the URL's user information.
func (c *Config) applyPasswordFile() error {
	if c.Postgres.PasswordCommand != "" {
		switch u, err := url.Parse(c.Postgres.URL); {
		case c.Postgres.PasswordFile != "":
			return errors.New("postgres.password_command: postgres.password_file is set too; give the password in one place")
		case err == nil && u.User != nil:
			if _, has := u.User.Password(); has {
				return errors.New("postgres.password_command: postgres.url holds a password already; give the password in one place")
			}
		}
	}
	if c.Postgres.PasswordFile == "" {
		return nil
	}
	data, err := os.ReadFile(c.Postgres.PasswordFile)
	if err != nil {
		return fmt.Errorf("postgres.password_file: %w", err)
	}
	password := strings.TrimRight(string(data), "\r\n")
	if password == "" {
		return fmt.Errorf("postgres.password_file: %s is empty", c.Postgres.PasswordFile)
	}
	c.filePassword = password
	u, err := url.Parse(c.Postgres.URL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return errors.New("postgres.password_file: postgres.url must be a postgres:// URL to take the password (the value is not shown)")
	}
	if _, has := u.User.Password(); has {
		return errors.New("postgres.password_file: postgres.url holds a password already; give it in one place")
	}
	if u.User == nil || u.User.Username() == "" {
		return errors.New("postgres.password_file: postgres.url names no user")
	}
	u.User = url.UserPassword(u.User.Username(), password)
	c.Postgres.URL = u.String()
	return nil
}

// EventSource is the ce_source attribute of the cloudevents header format: kafka.cloudevents_source,
// else /<database>/<postgres.table> (the database from postgres.url).
func (c *Config) EventSource() string {
	if c.Kafka.CloudEventsSource != "" {
		return c.Kafka.CloudEventsSource
	}
	// A URI-reference: each part percent-encoded (a database may be named "my db").
	if pc, err := pgconn.ParseConfig(c.Postgres.URL); err == nil && pc.Database != "" {
		return "/" + url.PathEscape(pc.Database) + "/" + url.PathEscape(c.Postgres.Table)
	}
	return "/" + url.PathEscape(c.Postgres.Table)
}

// The placements of kafka.debezium.additional_placement.
const (
	// PlacementHeader adds the column as a header.
	PlacementHeader = "header"
	// PlacementEnvelope adds the column as a field of the value, beside payload.
	PlacementEnvelope = "envelope"
	// PlacementPartition sends the record to the partition the column (an integer) names.
	PlacementPartition = "partition"
)
