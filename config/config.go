// Package config holds outbox-cdc's configuration: defaults, the YAML file, OUTBOX_CDC_* environment
// variables and command-line flags, applied in that order, then validated with errors that name the key.
package config

import (
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
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

// Kafka configures the producer and topic administration.
type Kafka struct {
	// Brokers are the seed brokers, host:port.
	Brokers []string `yaml:"brokers"`
	// ClientID is the Kafka client id.
	ClientID string `yaml:"client_id"`
	// CreateTopics creates missing topics (with TopicPartitions and TopicReplicationFactor).
	CreateTopics bool `yaml:"create_topics"`
	// MaxNewTopicsPerHour bounds the topics a source creates in an hour (a routing column with values
	// no one planned would create a topic per value): rows for a new topic past it are dead-lettered
	// with the reason. 0: no limit.
	MaxNewTopicsPerHour int `yaml:"max_new_topics_per_hour"`
	// TopicPartitions is the partition count of created topics.
	TopicPartitions int32 `yaml:"topic_partitions"`
	// TopicReplicationFactor is the replication factor of created topics; -1 takes the broker's default.
	TopicReplicationFactor int16 `yaml:"topic_replication_factor"`
	// MaxMessageBytes is the largest record the router sends; larger rows go to the dead-letter topic.
	// Keep it at or below the topics' max.message.bytes.
	MaxMessageBytes int32 `yaml:"max_message_bytes"`
	// Linger is how long the producer waits to fill a batch while the WAL stream is busy; see
	// QuietFlush for when it does not wait.
	Linger time.Duration `yaml:"linger"`
	// Compression is the record batches' codec: none, gzip, snappy (the default), lz4 or zstd.
	Compression string `yaml:"compression"`
	// RecordTimestamp is each record's Kafka timestamp when postgres.columns.timestamp does not give
	// one: RecordTimestampCommit (the default: the commit time of the row's transaction) or
	// RecordTimestampProduce (when the router produces it). resync's rows, which have no commit time
	// in the WAL, carry their produce time.
	RecordTimestamp string `yaml:"record_timestamp"`
	// TopicConfig is the configuration of the topics the router creates (retention.ms,
	// min.insync.replicas, cleanup.policy, ...); Kafka's defaults apply to what it leaves out. The
	// checkpoint topic keeps its own (one partition, compacted).
	TopicConfig map[string]string `yaml:"topic_config"`
	// QuietFlush is how long the WAL stream must stay quiet after a transaction before what is
	// waiting is sent without waiting any longer: the records lingering in the producer
	// (at-least-once) or the open Kafka transaction, committed (exactly-once). At low load every
	// transaction goes out at once; under load the stream is never quiet and batches fill for
	// Linger or TransactionInterval. 0 turns it off.
	QuietFlush time.Duration `yaml:"quiet_flush"`
	// AckTimeout is how long Kafka may acknowledge nothing, with records waiting, before the router
	// lets go of the replication connection (and takes it again once Kafka answers): a session that
	// cannot confirm would hold PostgreSQL, whose walsender waits at shutdown for its client to
	// confirm what it sent. 0 keeps the connection however long Kafka is away.
	AckTimeout time.Duration `yaml:"ack_timeout"`
	// Delivery is DeliveryAtLeastOnce (the default) or DeliveryExactlyOnce: Kafka transactions that
	// hold whole PostgreSQL transactions and a checkpoint, so that read_committed consumers see every
	// event once.
	Delivery string `yaml:"delivery"`
	// CheckpointTopic is the compacted topic of the exactly-once mode's checkpoints.
	CheckpointTopic string `yaml:"checkpoint_topic"`
	// TransactionInterval is how long a Kafka transaction of the exactly-once mode stays open to take
	// more PostgreSQL transactions; TransactionMaxRecords ends one sooner (whole PostgreSQL
	// transactions are never split, so a larger one makes a larger Kafka transaction).
	TransactionInterval   time.Duration `yaml:"transaction_interval"`
	TransactionMaxRecords int           `yaml:"transaction_max_records"`
	// TransactionTimeout is the Kafka transaction timeout (transaction.timeout.ms): the broker aborts a
	// transaction left open longer, and it must cover the largest PostgreSQL transaction's delivery.
	TransactionTimeout time.Duration `yaml:"transaction_timeout"`
	// HeaderFormat is how a record carries its event's attributes: HeaderFormatOutbox (headers
	// event_id, event_type, aggregate_type, aggregate_version, created_at), HeaderFormatCloudEvents
	// (the CloudEvents Kafka binding in binary mode: ce_* headers and content-type) or
	// HeaderFormatDebezium (key, value, headers and topic as Debezium's outbox EventRouter writes
	// them, with Debezium's column names by default).
	HeaderFormat string `yaml:"header_format"`
	// CloudEventsSource is the ce_source attribute in the cloudevents format; empty means
	// /<database>/<postgres.table>.
	CloudEventsSource string `yaml:"cloudevents_source"`
	// Debezium configures the debezium format: records as Debezium's outbox EventRouter writes them.
	Debezium Debezium `yaml:"debezium"`
	// TLS and SASL secure the connections to the brokers.
	TLS KafkaTLS `yaml:"tls"`
	// SASL authenticates to the brokers.
	SASL KafkaSASL `yaml:"sasl"`
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

// Debezium configures the debezium format, after the EventRouter's options of the same meaning.
type Debezium struct {
	// Converter is the Kafka Connect converter whose bytes the key and value match:
	// DebeziumConverterString (StringConverter, the default) or DebeziumConverterJSON
	// (JsonConverter with schemas.enable=false).
	Converter string `yaml:"converter"`
	// AdditionalPlacement is table.fields.additional.placement: comma-separated
	// column:header[:alias], column:envelope[:alias] or column:partition.
	AdditionalPlacement string `yaml:"additional_placement"`
	// ExpandJSONPayload is table.expand.json.payload: a JSON payload is written as JSON, not as a
	// string holding JSON (with the json converter).
	ExpandJSONPayload bool `yaml:"expand_json_payload"`
	// TombstoneOnEmptyPayload is route.tombstone.on.empty.payload: a NULL or blank payload gives a
	// record without a value (a tombstone) whatever else the record would hold.
	TombstoneOnEmptyPayload bool `yaml:"tombstone_on_empty_payload"`
}

// The values of kafka.debezium.converter.
const (
	// DebeziumConverterString matches Kafka Connect's StringConverter.
	DebeziumConverterString = "string"
	// DebeziumConverterJSON matches Kafka Connect's JsonConverter with schemas.enable=false.
	DebeziumConverterJSON = "json"
)

// DebeziumColumns are the column names of Debezium's default outbox table, the debezium format's
// defaults: id, type, aggregatetype, aggregateid, payload, and no version, headers or creation time.
func DebeziumColumns() Columns {
	return Columns{EventID: "id", EventType: "type", AggregateType: "aggregatetype", AggregateID: "aggregateid", Payload: "payload"}
}

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

// ExactlyOnce reports whether kafka.delivery is exactly-once.
func (k Kafka) ExactlyOnce() bool { return k.Delivery == DeliveryExactlyOnce }

// KafkaTLS configures TLS to the brokers.
type KafkaTLS struct {
	// Enabled turns TLS on.
	Enabled bool `yaml:"enabled"`
	// CAFile is a PEM bundle replacing the system roots; CertFile and KeyFile a client certificate.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are the client certificate and key (PEM) for mutual TLS.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// InsecureSkipVerify turns certificate verification off (never in production).
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
}

// KafkaSASL configures SASL authentication to the brokers.
type KafkaSASL struct {
	// Mechanism is PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER or AWS_MSK_IAM; empty turns SASL
	// off.
	Mechanism string `yaml:"mechanism"`
	// Username is the SASL user.
	Username string `yaml:"username"`
	// Password is best given by OUTBOX_CDC_KAFKA_SASL_PASSWORD rather than in the file.
	Password string `yaml:"password"`
	// OAuth configures OAUTHBEARER: tokens from an OIDC provider's token endpoint (client
	// credentials), or from a file something else keeps fresh.
	OAuth KafkaOAuth `yaml:"oauth"`
	// AWS configures AWS_MSK_IAM (Amazon MSK's IAM access control): credentials come from the
	// standard AWS chain (environment, shared files, web identity/IRSA, ECS and EC2 roles).
	AWS KafkaAWS `yaml:"aws"`
}

// KafkaOAuth configures SASL/OAUTHBEARER.
type KafkaOAuth struct {
	// TokenURL is the OIDC provider's token endpoint; ClientID and ClientSecretFile (a file holding
	// the secret, read at each token request so that a rotated Secret is picked up) the client's
	// credentials; Scope the scope asked for (space-separated; empty: none).
	TokenURL         string `yaml:"token_url"`
	ClientID         string `yaml:"client_id"`
	ClientSecretFile string `yaml:"client_secret_file"`
	Scope            string `yaml:"scope"`
	// ClientAuth is how the client authenticates to the token endpoint: basic (HTTP Basic, the
	// default) or post (client_id and client_secret in the form).
	ClientAuth string `yaml:"client_auth"`
	// TokenFile, instead of the token endpoint, is a file holding a token that something else keeps
	// fresh (a sidecar, a projected service account token); it is read at every authentication.
	TokenFile string `yaml:"token_file"`
	// Extensions are SASL extensions sent with the token (Confluent Cloud: logicalCluster,
	// identityPoolId).
	Extensions map[string]string `yaml:"extensions"`
}

// KafkaAWS configures AWS_MSK_IAM.
type KafkaAWS struct {
	// Region is the cluster's region; empty takes the AWS chain's (AWS_REGION, the shared config).
	Region string `yaml:"region"`
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

// Secrets returns every value of the configuration that must never be printed: the candidates for
// the password in the PostgreSQL URL, however malformed the URL is (each way of splitting its user
// information, escaped and unescaped, and any password=... value), and the SASL password. Loggers
// and error output hide each wherever it appears.
func (c *Config) Secrets() []string {
	// A password command is shown as little as a password: it may carry one (echo ..., a key).
	out := []string{c.Kafka.SASL.Password, c.envPassword, c.filePassword, c.Postgres.PasswordCommand}
	add := func(v string) {
		out = append(out, v)
		if u, err := url.PathUnescape(v); err == nil && u != v {
			out = append(out, u)
		}
		if u, err := url.QueryUnescape(v); err == nil && u != v {
			out = append(out, u)
		}
	}
	for _, u := range append([]string{c.Postgres.URL}, c.Postgres.StandbyURLs...) {
		urlSecrets(u, add)
	}
	for _, s := range c.SourceList {
		s.secrets(add)
	}
	for _, r := range c.resolved {
		out = append(out, r.Secrets()...)
	}
	return out
}

// urlSecrets feeds add the password candidates of one PostgreSQL URL or connection string.
func urlSecrets(u string, add func(string)) {
	if i := strings.Index(u, "://"); i >= 0 {
		rest := u[i+3:]
		if colon := strings.IndexByte(rest, ':'); colon >= 0 {
			for at := strings.IndexByte(rest, '@'); at >= 0; {
				if at > colon {
					// A password with an unescaped '@' is split by URL parsers: its pieces may show
					// up as a host name in connection errors.
					add(rest[colon+1 : at])
					for _, piece := range strings.Split(rest[colon+1:at], "@") {
						add(piece)
					}
				}
				next := strings.IndexByte(rest[at+1:], '@')
				if next < 0 {
					break
				}
				at += next + 1
			}
		}
	}
	for _, m := range passwordPairRE.FindAllStringSubmatch(u, -1) {
		v := m[1]
		add(v)
		if unquoted := strings.Trim(v, "'"); unquoted != v {
			add(unquoted)
			add(strings.ReplaceAll(strings.ReplaceAll(unquoted, `\'`, `'`), `\\`, `\`))
		}
	}
}

// passwordPairRE matches password=value in a URL's query or a key=value connection string.
var passwordPairRE = regexp.MustCompile(`(?i)pass(?:word)?\s*=\s*('(?:[^'\\]|\\.)*(?:'|$)|[^\s&]*)`)

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

// PostgresTarget describes the database for logs: user@host:port/database, never the password.
func (c *Config) PostgresTarget() string { return Target(c.Postgres.URL, "postgres.url") }

// Target describes the database of a PostgreSQL URL for logs: user@host:port/database, never the
// password; with several hosts (a multi-host URL), every one, since which answers is decided at each
// connection. key names the URL's configuration key when it cannot be parsed.
func Target(url, key string) string {
	pc, err := pgconn.ParseConfig(url)
	if err != nil {
		return "(unparsable " + key + ")"
	}
	hosts := []string{fmt.Sprintf("%s:%d", pc.Host, pc.Port)}
	for _, fb := range pc.Fallbacks {
		if h := fmt.Sprintf("%s:%d", fb.Host, fb.Port); !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	return fmt.Sprintf("%s@%s/%s", pc.User, strings.Join(hosts, ","), pc.Database)
}

// AdditionalField is one entry of kafka.debezium.additional_placement.
type AdditionalField struct {
	// Column is the outbox column; Placement is PlacementHeader, PlacementEnvelope or
	// PlacementPartition; Alias is the header or envelope field name (the column's by default).
	Column, Placement, Alias string
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

// AdditionalFields parses kafka.debezium.additional_placement as Debezium does:
// column:placement[:alias] entries separated by commas.
func (d Debezium) AdditionalFields() ([]AdditionalField, error) {
	var out []AdditionalField
	for _, entry := range strings.Split(d.AdditionalPlacement, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		parts := strings.Split(entry, ":")
		if len(parts) < 2 || len(parts) > 3 || strings.TrimSpace(parts[0]) == "" {
			return nil, fmt.Errorf("%q is not column:placement or column:placement:alias", entry)
		}
		f := AdditionalField{Column: strings.TrimSpace(parts[0]), Placement: strings.ToLower(strings.TrimSpace(parts[1]))}
		f.Alias = f.Column
		if len(parts) == 3 && strings.TrimSpace(parts[2]) != "" {
			f.Alias = strings.TrimSpace(parts[2])
		}
		switch f.Placement {
		case PlacementHeader, PlacementEnvelope, PlacementPartition:
		default:
			return nil, fmt.Errorf("%q: placement %q must be header, envelope or partition", entry, f.Placement)
		}
		out = append(out, f)
	}
	return out, nil
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
