// The Kafka side of the configuration: brokers, producer and topic settings, delivery mode, record
// formats (the Debezium options among them), TLS and SASL.

package config

import (
	"fmt"
	"strings"
	"time"
)

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

// DebeziumColumns are the column names of Debezium's default outbox table, the debezium format's
// defaults: id, type, aggregatetype, aggregateid, payload, and no version, headers or creation time.
func DebeziumColumns() Columns {
	return Columns{EventID: "id", EventType: "type", AggregateType: "aggregatetype", AggregateID: "aggregateid", Payload: "payload"}
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

// AdditionalField is one entry of kafka.debezium.additional_placement.
type AdditionalField struct {
	// Column is the outbox column; Placement is PlacementHeader, PlacementEnvelope or
	// PlacementPartition; Alias is the header or envelope field name (the column's by default).
	Column, Placement, Alias string
}

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
