package main

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/outbox-cdc/outbox-cdc/internal/freeport"
)

// Debezium's two configurations.
const (
	systemDebezium      = "debezium"
	systemDebeziumTuned = "debezium tuned"
)

// heartbeatTopic is where the tuned Debezium's heartbeats go (topic.heartbeat.prefix + "." +
// topic.prefix). The broker does not create topics on use, and Connect blocks on an unknown one.
const heartbeatTopic = "__debezium-heartbeat.dbzbench"

// startDebezium starts Kafka Connect 4.1 standalone with Debezium 3.6.1's PostgreSQL connector and
// the outbox EventRouter SMT on the target's slot and publication: routing by event_type, key =
// aggregate_id, value = payload, event_type/aggregate_type/created_at as headers, offsets flushed
// every second. Its jars come from `scripts/services.sh debezium-libs`.
//
// tuned adds what a user tuning for latency and throughput would set: the connector polls its queue
// every 5 ms (default 500) in batches of up to 8,192 (default 2,048) from a queue of 65,536 (default
// 8,192); heartbeats every second so that the slot is confirmed while the outbox is idle; the
// producer lingers 5 ms (Connect's default 0) in batches of up to 512 KB (default 16 KB), without
// compression; a 2 GB heap (default here 1 GB).
func (b *bench) startDebezium(t *target, tuned bool) (*exec.Cmd, error) {
	libs, err := filepath.Abs(filepath.Join(".dev", "debezium-libs"))
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(libs, ".complete")); err != nil {
		return nil, fmt.Errorf("Debezium jars missing in %s: run scripts/services.sh debezium-libs (make bench-compare does)", libs)
	}
	u, err := url.Parse(b.c.pgURL)
	if err != nil {
		return nil, err
	}
	password, _ := u.User.Password()
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		return nil, fmt.Errorf("postgres url host: %w", err)
	}
	dir := filepath.Join(b.workDir, "debezium-"+t.slot)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	restPort, err := freePort()
	if err != nil {
		return nil, err
	}
	var workerTuning, connectorTuning []string
	heap := "-Xmx1g"
	if tuned {
		heap = "-Xmx2g"
		workerTuning = []string{"producer.linger.ms=5", "producer.batch.size=524288", "producer.compression.type=none"}
		connectorTuning = []string{"poll.interval.ms=5", "max.batch.size=8192", "max.queue.size=65536", "heartbeat.interval.ms=1000"}
	}
	files := map[string]string{
		"worker.properties": lines(append([]string{
			"bootstrap.servers=" + b.c.brokers,
			"key.converter=org.apache.kafka.connect.storage.StringConverter",
			"value.converter=org.apache.kafka.connect.storage.StringConverter",
			"offset.storage.file.filename=" + filepath.Join(dir, "offsets"),
			"offset.flush.interval.ms=1000",
			fmt.Sprintf("listeners=http://127.0.0.1:%d", restPort),
			"plugin.discovery=only_scan",
		}, workerTuning...)...),
		"connector.properties": lines(append([]string{
			"name=outbox-bench",
			"connector.class=io.debezium.connector.postgresql.PostgresConnector",
			"plugin.name=pgoutput",
			"database.hostname=" + host,
			"database.port=" + port,
			"database.user=" + u.User.Username(),
			"database.password=" + password,
			"database.dbname=" + strings.TrimPrefix(u.Path, "/"),
			"topic.prefix=dbzbench",
			"slot.name=" + t.slot,
			"publication.name=" + t.pub,
			"publication.autocreate.mode=disabled",
			"table.include.list=" + t.table,
			"snapshot.mode=no_data",
			"tombstones.on.delete=false",
			"transforms=outbox",
			"transforms.outbox.type=io.debezium.transforms.outbox.EventRouter",
			"transforms.outbox.table.field.event.id=event_id",
			"transforms.outbox.table.field.event.key=aggregate_id",
			"transforms.outbox.table.field.event.payload=payload",
			"transforms.outbox.route.by.field=event_type",
			"transforms.outbox.route.topic.replacement=" + t.topic,
			"transforms.outbox.table.fields.additional.placement=event_type:header,aggregate_type:header,created_at:header",
		}, connectorTuning...)...),
		"log4j2.properties": lines(
			"status = warn",
			"appender.file.type = File",
			"appender.file.name = FILE",
			"appender.file.fileName = "+filepath.Join(dir, "connect.log"),
			"appender.file.layout.type = PatternLayout",
			"appender.file.layout.pattern = [%d] %p %m (%c)%n",
			"rootLogger.level = warn",
			"rootLogger.appenderRef.file.ref = FILE",
		),
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			return nil, err
		}
	}
	cmd := exec.Command("java", "-Xms256m", heap, "-XX:+UseG1GC",
		"-Dlog4j2.configurationFile="+filepath.Join(dir, "log4j2.properties"),
		"-cp", filepath.Join(libs, "*"), "org.apache.kafka.connect.cli.ConnectStandalone",
		filepath.Join(dir, "worker.properties"), filepath.Join(dir, "connector.properties"))
	cmd.Dir = dir
	return cmd, cmd.Start()
}

func lines(l ...string) string { return strings.Join(l, "\n") + "\n" }

// freePort is a loopback port for a server the bench starts (freeport.Loopback).
func freePort() (int, error) { return freeport.Loopback() }
