package testenv

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// DebeziumTable is Debezium's default outbox table (id, aggregatetype, aggregateid, type, payload)
// with extra columns of the types whose Debezium representation differs from their text, for
// table.fields.additional.placement: flag boolean, n bigint, amount double precision, ts timestamp,
// tstz timestamptz, day date, part integer.
const DebeziumTable = `CREATE TABLE %s (
    id            uuid         PRIMARY KEY,
    aggregatetype varchar(255) NOT NULL,
    aggregateid   varchar(255) NOT NULL,
    type          varchar(255) NOT NULL,
    payload       jsonb,
    flag          boolean,
    n             bigint,
    amount        double precision,
    ts            timestamp,
    tstz          timestamptz,
    day           date,
    part          integer
)`

// NewDebeziumFixture is NewFixture with Debezium's default outbox table (DebeziumTable) instead of
// sql/outbox.sql's, and outbox-cdc's insert-only publication of it. Debezium's own slots and
// publications, named after the fixture's slot and publication with a suffix, are dropped with it.
func NewDebeziumFixture(t testing.TB) *Fixture {
	t.Helper()
	f := &Fixture{PostgresURL: PostgresURL(t), AdminURL: AdminURL(t), Brokers: Brokers(t)}
	id := fmt.Sprintf("%s_%04x", sanitize(t.Name()), rand.IntN(0xffff))
	f.Table = "public.dbz_" + id
	f.Publication = "pub_" + id
	f.Slot = "slot_" + id
	f.TopicPrefix = "t." + strings.ReplaceAll(id, "_", "-")
	ctx := context.Background()
	db, err := pgx.Connect(ctx, f.PostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	f.DB = db
	for _, stmt := range []string{fmt.Sprintf(DebeziumTable, f.Table), fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert')", f.Publication, f.Table)} {
		if _, err := db.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		defer func() { _ = db.Close(ctx) }()
		admin, err := pgx.Connect(ctx, f.AdminURL)
		if err != nil {
			t.Errorf("clean up: %v", err)
			return
		}
		defer func() { _ = admin.Close(ctx) }()
		like := f.Slot + "%"
		for i := 0; i < 50; i++ {
			_, _ = admin.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name LIKE $1 AND active_pid IS NOT NULL`, like)
			if _, err = admin.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE $1`, like); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			t.Errorf("clean up: drop slots %s: %v", like, err)
		}
		rows, err := admin.Query(ctx, `SELECT pubname FROM pg_publication WHERE pubname LIKE $1`, f.Publication+"%")
		if err == nil {
			pubs, _ := pgx.CollectRows(rows, pgx.RowTo[string])
			for _, p := range pubs {
				_, _ = admin.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{p}.Sanitize())
			}
		}
		_, _ = admin.Exec(ctx, "DROP TABLE IF EXISTS "+f.Table)
	})
	return f
}

// Debezium is Kafka Connect in standalone mode running Debezium's PostgreSQL connector with the
// outbox EventRouter, from the jars `scripts/services.sh debezium-libs` fetches from Maven Central.
type Debezium struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed when the worker has exited
	dir    string
}

// DebeziumConnector is one connector of a Debezium worker: its name, slot and publication (created
// by Debezium, FOR TABLE with every operation), and its own properties: the EventRouter's
// (transforms.outbox.*) and converters (key.converter, ...).
type DebeziumConnector struct {
	Name, Slot, Publication string
	// Table is the outbox table it reads (the fixture's by default).
	Table      string
	Properties []string
}

// StartDebezium starts one Kafka Connect worker with a connector per entry of connectors, each on
// its table (f's by default; f gives the database and brokers) with Debezium's own slot and
// publication, streaming changes only (snapshot.mode no_data), and returns once every connector's
// slot is active. Topics it writes are created with
// the broker's default partition count. The worker is stopped when the test ends.
func StartDebezium(t testing.TB, f *Fixture, connectors ...DebeziumConnector) *Debezium {
	t.Helper()
	libs := filepath.Join(DevDir(t), "debezium-libs")
	if _, err := os.Stat(filepath.Join(libs, ".complete")); err != nil {
		t.Fatalf("the Debezium jars are missing in %s: fetch them with `scripts/services.sh debezium-libs` (make test does)", libs)
	}
	if _, err := exec.LookPath("java"); err != nil {
		t.Fatalf("java not found: run scripts/install-deps.sh (make test does)")
	}
	u, err := url.Parse(f.AdminURL)
	if err != nil {
		t.Fatal(err)
	}
	password, _ := u.User.Password()
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	restPort := freePort(t)
	d := &Debezium{dir: t.TempDir()}
	write := func(name string, lines ...string) string {
		path := filepath.Join(d.dir, name)
		if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	args := []string{write("worker.properties",
		"bootstrap.servers="+strings.Join(f.Brokers, ","),
		"key.converter=org.apache.kafka.connect.storage.StringConverter",
		"value.converter=org.apache.kafka.connect.storage.StringConverter",
		"offset.storage.file.filename="+filepath.Join(d.dir, "offsets"),
		"offset.flush.interval.ms=1000",
		fmt.Sprintf("listeners=http://127.0.0.1:%d", restPort),
		"plugin.discovery=only_scan",
	)}
	for _, c := range connectors {
		if c.Table == "" {
			c.Table = f.Table
		}
		props := append([]string{
			"name=" + c.Name,
			"connector.class=io.debezium.connector.postgresql.PostgresConnector",
			"plugin.name=pgoutput",
			"database.hostname=" + host,
			"database.port=" + port,
			"database.user=" + u.User.Username(),
			"database.password=" + password,
			"database.dbname=" + strings.TrimPrefix(u.Path, "/"),
			"topic.prefix=" + c.Name,
			"slot.name=" + c.Slot,
			"publication.name=" + c.Publication,
			"publication.autocreate.mode=filtered",
			"table.include.list=" + c.Table,
			"snapshot.mode=no_data",
			"topic.creation.default.partitions=-1",
			"topic.creation.default.replication.factor=-1",
			"transforms=outbox",
			"transforms.outbox.type=io.debezium.transforms.outbox.EventRouter",
		}, c.Properties...)
		args = append(args, write(c.Name+".properties", props...))
	}
	logFile := filepath.Join(d.dir, "connect.log")
	log4j := write("log4j2.properties",
		"status = warn",
		"appender.file.type = File",
		"appender.file.name = FILE",
		"appender.file.fileName = "+logFile,
		"appender.file.layout.type = PatternLayout",
		"appender.file.layout.pattern = [%d] %p %m (%c)%n",
		"rootLogger.level = warn",
		"rootLogger.appenderRef.file.ref = FILE",
	)
	d.cmd = exec.Command("java", append([]string{"-Xms128m", "-Xmx768m", "-XX:+UseSerialGC", "-Dlog4j2.configurationFile=" + log4j,
		"-cp", filepath.Join(libs, "*"), "org.apache.kafka.connect.cli.ConnectStandalone"}, args...)...)
	d.cmd.Dir = d.dir
	d.cmd.Stdout, d.cmd.Stderr = nil, nil
	if err := d.cmd.Start(); err != nil {
		t.Fatalf("start Kafka Connect: %v", err)
	}
	d.exited = make(chan struct{})
	go func() { _ = d.cmd.Wait(); close(d.exited) }()
	t.Cleanup(d.Stop)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, f.AdminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = admin.Close(context.Background()) }()
	slots := make([]string, 0, len(connectors))
	for _, c := range connectors {
		slots = append(slots, c.Slot)
	}
	sort.Strings(slots)
	for {
		var active int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = ANY($1) AND active`, slots).Scan(&active); err != nil {
			t.Fatalf("Debezium's slots %v: %v\n%s", slots, err, d.Log())
		}
		if active == len(slots) {
			return d
		}
		if d.Exited() || ctx.Err() != nil {
			t.Fatalf("Debezium's slots %v did not become active within 3 minutes; Kafka Connect's log:\n%s", slots, d.Log())
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// Log returns the end of Kafka Connect's log.
func (d *Debezium) Log() string {
	b, _ := os.ReadFile(filepath.Join(d.dir, "connect.log"))
	if len(b) > 8000 {
		b = b[len(b)-8000:]
	}
	return string(b)
}

// Exited reports whether the worker has exited.
func (d *Debezium) Exited() bool {
	select {
	case <-d.exited:
		return true
	default:
		return false
	}
}

// Stop stops the worker (SIGTERM, then SIGKILL after 20 s).
func (d *Debezium) Stop() {
	if d.cmd == nil || d.cmd.Process == nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(20 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.exited
	}
	d.cmd = nil
}
