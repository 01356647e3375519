package config

import (
	"fmt"
	"strings"
)

// refRow is one row of the configuration reference (docs/configuration.md): the keys it documents,
// their default and meaning. The variables and flags come from the settings themselves, so that the
// page cannot disagree with what Load reads.
type refRow struct {
	keys    []string // dotted YAML keys; a family ends in ".*"
	def     string   // the default, as the page shows it
	doc     string   // what the keys mean (Markdown)
	env     string   // the variables' cell when the keys' own variables cannot say it (a family)
	envNote string   // appended to the variables' cell (the value's shape)
	flag    string   // the flags' cell when it is not the keys' own flags
}

// reference is the configuration reference, in the page's order. TestEveryKeyIsDocumented fails when a
// key Load reads has no row here; TestConfigurationReferenceIsCurrent when the page is not this table.
var reference = []refRow{
	{keys: []string{"fleet.coordination"}, def: "`kafka`", doc: "with `sources`: `kafka` (instances share the sources through a consumer group) or `none`"},
	{keys: []string{"fleet.group"}, def: "`outbox-cdc`", doc: "the consumer group (and topics `outbox-cdc.fleet.<group>*`) the instances share, whatever their sources lists hold; one per fleet on a shared Kafka cluster"},
	{keys: []string{"fleet.instance"}, def: "host name/metrics address", doc: "this instance's name in the group"},
	{keys: []string{"fleet.max_inflight_bytes"}, def: "`16777216`", doc: "the bytes in flight of all the process's sources together, beside each one's `limits.max_inflight_bytes`: the process's memory bound"},
	{keys: []string{"fleet.session_timeout"}, def: "`6s`", doc: "silence after which an instance's sources move (within the broker's `group.min/max.session.timeout.ms`)"},
	{keys: []string{"sources"}, def: "—", doc: "several sources in one process: a list of `name` plus `postgres`, `kafka`, `routing`, `limits` keys over the top-level ones ([fleet](fleet.md))", flag: "`run --source` picks some"},
	{keys: []string{"tables"}, def: "—", doc: "further outbox tables of the source's database, sharing its slot and publication: a list of `table` (schema.table) and `routing` over the source's ([fleet](fleet.md))"},
	{keys: []string{"postgres.url"}, def: "— (required)", doc: "connection URL; the role needs `REPLICATION`"},
	{keys: []string{"postgres.table"}, def: "`public.outbox`", doc: "outbox table; `\"\"` (in the file) for a source of WAL messages only (`postgres.message_prefixes`)"},
	{keys: []string{"postgres.slot"}, def: "`outbox_cdc`", doc: "logical replication slot"},
	{keys: []string{"postgres.publication"}, def: "`outbox_cdc`", doc: "publication"},
	{keys: []string{"postgres.create_slot"}, def: "`true`", doc: "create the slot when missing"},
	{keys: []string{"postgres.create_publication"}, def: "`true`", doc: "create the publication (`publish = 'insert'`) when missing, and add the configured tables it lacks"},
	{keys: []string{"postgres.message_prefixes"}, def: "—", doc: "prefixes of transactional WAL messages (`pg_logical_emit_message(true, prefix, content)`, PostgreSQL 14+) that carry events, read beside the tables' rows in commit order: the content is a JSON object whose fields are named like the columns (`event_id`, `event_type`, `aggregate_type`, `aggregate_id`, `payload`, `headers`, ...); see [messages](outbox-table.md#events-as-wal-messages-postgresmessage_prefixes)"},
	{keys: []string{"postgres.ignore_tables"}, def: "—", doc: "tables of the publication whose rows are not for this router (schema.table, or `*` for any other table): dropped and counted; any other table the publication carries is refused, and its first row stops the source unconfirmed"},
	{keys: []string{"postgres.status_interval"}, def: "`10s`", doc: "longest gap between status updates (100ms–50s)"},
	{keys: []string{"postgres.standby_poll_interval"}, def: "`2s`", doc: "hot standby retry interval"},
	{keys: []string{"postgres.receive_timeout"}, def: "`30s`", doc: "silence on the replication connection after which it is presumed dead and replaced (at least twice `status_interval`)"},
	{keys: []string{"postgres.password_command"}, def: "—", doc: "a command (`sh -c`) that prints the password, run for every new connection: RDS/Aurora IAM tokens, Cloud SQL and Azure Entra access tokens, passwords rotated on the server; it sees `PGHOST`, `PGPORT`, `PGUSER`, `PGDATABASE`; its output is never logged (the URL must hold no password)"},
	{keys: []string{"postgres.password_file"}, def: "—", doc: "a file holding the password of `postgres.url`'s user (a mounted Secret; read at start; the URL must not hold one): in a fleet, each source's own"},
	{keys: []string{"postgres.standby_urls"}, def: "—", doc: "comma-separated standby URLs whose readiness to take over the slot `init` and `status` check (PostgreSQL 17+)", flag: "`--standby` (init, status; repeatable)"},
	{keys: []string{"postgres.failover_slot"}, def: "`auto`", doc: "`auto`, `on` or `off`: the slot is a failover slot (PostgreSQL 17+, synchronized to standbys with `sync_replication_slots`), created so or altered to one before streaming; `auto` where the server supports it, `on` refuses older servers"},
	{keys: []string{"postgres.columns.*"}, def: "the [outbox table](outbox-table.md)'s", doc: "column of each role", env: "`OUTBOX_CDC_COLUMN_*`"},
	{keys: []string{"postgres.columns.trace_context"}, def: "none", doc: "a column with the writing transaction's W3C trace context (see [Trace context](outbox-table.md#trace-context))"},
	{keys: []string{"postgres.columns.timestamp"}, def: "none", doc: "a column whose value is each record's Kafka timestamp (see [Record timestamps](outbox-table.md#record-timestamps))"},
	{keys: []string{"kafka.brokers"}, def: "— (required)", doc: "seed brokers, comma-separated"},
	{keys: []string{"kafka.client_id"}, def: "`outbox-cdc`", doc: "client id"},
	{keys: []string{"kafka.create_topics"}, def: "`true`", doc: "create missing topics"},
	{keys: []string{"kafka.max_new_topics_per_hour"}, def: "`100`", doc: "topics a source creates in any hour; rows for a new topic past it are dead-lettered with the reason (0: no limit)"},
	{keys: []string{"kafka.topic_partitions"}, def: "`3`", doc: "partitions of created topics"},
	{keys: []string{"kafka.topic_replication_factor"}, def: "`-1` (broker default)", doc: "replication factor of created topics"},
	{keys: []string{"kafka.max_message_bytes"}, def: "`1000000`", doc: "larger records (or larger than the topic's `max.message.bytes`) are dead-lettered; batches never exceed it"},
	{keys: []string{"kafka.linger"}, def: "`10ms`", doc: "how long the producer fills a batch while the WAL stream is busy (0: never; franz-go's own default of 10 ms no longer applies behind a 0)"},
	{keys: []string{"kafka.record_timestamp"}, def: "`commit`", doc: "each record's Kafka timestamp when `postgres.columns.timestamp` gives none: `commit` (its transaction's commit time) or `produce` (see [Record timestamps](outbox-table.md#record-timestamps))"},
	{keys: []string{"kafka.compression"}, def: "`snappy`", doc: "the batches' codec: `none`, `gzip`, `snappy`, `lz4`, `zstd` (a batch that does not shrink goes uncompressed); measured below: no codec changes the drain beyond the noise on one machine"},
	{keys: []string{"kafka.topic_config"}, doc: "the configuration of topics the router and `init` create, e.g. `retention.ms`, `min.insync.replicas`, `cleanup.policy`; existing topics are left alone, the checkpoint topic keeps its own", envNote: " (`k=v,k=v`)"},
	{keys: []string{"kafka.header_format"}, def: "`outbox`", doc: "`outbox` (headers `event_id`, `event_type`, ...), `cloudevents` (CloudEvents binary mode: `ce_*` headers; see [CloudEvents](outbox-table.md#cloudevents-kafkaheader_format-cloudevents)) or `debezium` (records as Debezium's outbox EventRouter writes them, on Debezium's table by default; see [Coming from Debezium](debezium.md))"},
	{keys: []string{"kafka.debezium.converter"}, def: "`string`", doc: "debezium format: key and value as Kafka Connect's `string` (StringConverter) or `json` (JsonConverter, `schemas.enable=false`) writes them"},
	{keys: []string{"kafka.debezium.additional_placement"}, def: "none", doc: "debezium format: `table.fields.additional.placement` (`column:header[:alias]`, `column:envelope[:alias]`, `column:partition`, comma-separated)"},
	{keys: []string{"kafka.debezium.expand_json_payload"}, def: "`false`", doc: "debezium format: `table.expand.json.payload` (json converter)"},
	{keys: []string{"kafka.debezium.tombstone_on_empty_payload"}, def: "`false`", doc: "debezium format: `route.tombstone.on.empty.payload`"},
	{keys: []string{"kafka.cloudevents_source"}, def: "`/<database>/<table>`", doc: "the `ce_source` attribute in the cloudevents format; must be a URI-reference"},
	{keys: []string{"kafka.quiet_flush"}, def: "`1ms`", doc: "send what waits as soon as the WAL stream is quiet: at the end of a transaction that came after this long a pause, or once the stream stays quiet this long after one — the linger (at-least-once) or the open Kafka transaction (exactly-once) then ends at once; under load batches fill; on a busy stream (transactions with rows ending on average less than a quarter linger, or interval, apart) a send on a quiet stream comes at most every half `kafka.linger` (at-least-once) and a commit at most every half `kafka.transaction_interval` (exactly-once) (0: off)"},
	{keys: []string{"kafka.ack_timeout"}, def: "`10s`", doc: "no acknowledgement this long with records waiting: let go of the replication connection until Kafka answers (0: never)"},
	{keys: []string{"kafka.delivery"}, def: "`at-least-once`", doc: "`at-least-once` or `exactly-once` (Kafka transactions with a checkpoint; see [exactly-once](exactly-once.md))"},
	{keys: []string{"kafka.checkpoint_topic"}, def: "`outbox-cdc.checkpoints`", doc: "exactly-once: compacted topic of the checkpoints, keyed by slot (several slots may share it)"},
	{keys: []string{"kafka.transaction_interval"}, def: "`10ms`", doc: "exactly-once: a Kafka transaction takes more PostgreSQL transactions for this long after its first row (8 times as long, at most a quarter of the timeout, while catching up on a backlog); at most half of `kafka.transaction_timeout`"},
	{keys: []string{"kafka.transaction_max_records"}, def: "`10000`", doc: "exactly-once: or until this many rows are in (8 times as many while catching up on a backlog; a PostgreSQL transaction is never split)"},
	{keys: []string{"kafka.transaction_timeout"}, def: "`1m`", doc: "exactly-once: Kafka `transaction.timeout.ms`; must cover the delivery of the largest PostgreSQL transaction"},
	{keys: []string{"kafka.tls.enabled"}, def: "`false`", doc: "TLS to the brokers"},
	{keys: []string{"kafka.tls.ca_file", "kafka.tls.cert_file", "kafka.tls.key_file"}, def: "—", doc: "PEM CA bundle (replaces the system roots); client certificate for mutual TLS"},
	{keys: []string{"kafka.tls.insecure_skip_verify"}, def: "`false`", doc: "never in production"},
	{keys: []string{"kafka.sasl.mechanism"}, def: "—", doc: "`PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512`, `OAUTHBEARER` or `AWS_MSK_IAM` (see [Managed services](managed-services.md))"},
	{keys: []string{"kafka.sasl.oauth.token_url", "kafka.sasl.oauth.client_id", "kafka.sasl.oauth.client_secret_file", "kafka.sasl.oauth.scope", "kafka.sasl.oauth.client_auth"}, def: "—", doc: "OAUTHBEARER: the OIDC client-credentials flow (`client_auth`: `basic` or `post`)"},
	{keys: []string{"kafka.sasl.oauth.token_file"}, def: "—", doc: "OAUTHBEARER: instead, a token something else keeps fresh, read at every authentication"},
	{keys: []string{"kafka.sasl.oauth.extensions"}, def: "—", doc: "OAUTHBEARER: SASL extensions (Confluent Cloud's `logicalCluster`, `identityPoolId`)", envNote: " (`k=v,k=v`)"},
	{keys: []string{"kafka.sasl.aws.region"}, def: "the AWS chain's", doc: "AWS_MSK_IAM: the region for the credentials chain (the signature's region comes from the broker's host name)"},
	{keys: []string{"kafka.sasl.username", "kafka.sasl.password"}, def: "—", doc: "SASL credentials (prefer the environment for the password)"},
	{keys: []string{"routing.topic"}, def: "`{event_type}`", doc: "topic template"},
	{keys: []string{"routing.topics"}, def: "—", doc: "map `event_type` → topic"},
	{keys: []string{"routing.fallback_topic"}, def: "—", doc: "topic for rows the template cannot route"},
	{keys: []string{"routing.dlq_topic"}, def: "—", doc: "dead-letter topic; empty: stop on undeliverable rows"},
	{keys: []string{"routing.allowed_topics"}, def: "— (any)", doc: "glob patterns every routed topic must match (comma-separated in env and flag)"},
	{keys: []string{"limits.max_inflight_records"}, def: "`20000`", doc: "records handed to Kafka and not yet acknowledged: the cap of the in-flight window, the bound of memory"},
	{keys: []string{"limits.min_inflight_records"}, def: "`2000`", doc: "the smallest the in-flight window gets: it grows while a larger one brings more throughput at the same acknowledgement latency and shrinks when records only queue (see [In-flight window](performance-history.md), [performance history](performance-history.md)); at or above `max_inflight_records` the window is fixed at that cap"},
	{keys: []string{"limits.max_inflight_bytes"}, def: "`67108864`", doc: "bytes of those records, with the memory blocks their rows were read into (at most about 32 KiB each, sized to the rows, counted once while any of their records is in flight)"},
	{keys: []string{"log.level"}, def: "`info`", doc: "debug, info, warn, error"},
	{keys: []string{"log.format"}, def: "`auto`", doc: "text on a terminal, JSON otherwise"},
	{keys: []string{"metrics.addr"}, def: "`127.0.0.1:9187`", doc: "`/metrics`, `/healthz`, `/readyz`; empty disables"},
	{keys: []string{"metrics.admin_token_file"}, def: "—", doc: "the credentials the fleet API's pause and resume need (a mounted Secret; one per line, `token` or `name:token`, the name recorded as who paused; read at every request); without it they are taken from the instance's own host only"},
	{keys: []string{"metrics.allowed_hosts"}, def: "—", doc: "host names (besides IP addresses and `localhost`; `*.example.com` for a domain) the fleet API and `/status` answer under; other `Host` headers are refused (DNS rebinding)"},
	{keys: []string{"metrics.pprof"}, def: "`false`", doc: "also serve Go's profiles under `/debug/pprof/` on that address (for profiling; keep the address private)"},
	{keys: []string{"shutdown_timeout"}, def: "`30s`", doc: "graceful stop's wait for acknowledgements"},
	{keys: []string{"tracing.otlp_endpoint"}, def: "none (off)", doc: "an OTLP/HTTP collector (`http://collector:4318`): a producer span per record (see [Trace context](outbox-table.md#trace-context))"},
	{keys: []string{"tracing.service_name"}, def: "`outbox-cdc`", doc: "the spans' `service.name`"},
	{keys: []string{"tracing.sample_ratio"}, def: "`0`", doc: "the share of rows without a trace context that start a trace of their own (a row's sampled context is always followed)"},
}

// referenceTable renders the reference as the Markdown table of docs/configuration.md.
func referenceTable() string {
	byKey := map[string]setting{}
	for _, s := range settings {
		byKey[s.Key] = s
	}
	var b strings.Builder
	b.WriteString("| key | env | flag | default | meaning |\n|---|---|---|---|---|\n")
	for _, r := range reference {
		var keys, envs, flags []string
		for _, k := range r.keys {
			keys = append(keys, "`"+k+"`")
			if s, ok := byKey[k]; ok {
				if s.Env != "" {
					envs = append(envs, "`"+s.Env+"`")
				}
				if s.Flag != "" {
					flags = append(flags, "`--"+s.Flag+"`")
				}
			}
		}
		env := strings.Join(envs, ", ")
		if r.env != "" {
			env = r.env
		}
		flag := strings.Join(flags, ", ")
		if r.flag != "" {
			flag = r.flag
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", strings.Join(keys, ", "), env+r.envNote, flag, r.def, r.doc)
	}
	return b.String()
}
