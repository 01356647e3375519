// Package testenv gives integration tests the local PostgreSQL and Kafka started by `make up`
// (scripts/services.sh), and fixtures on them: a private outbox table, publication, slot and topic
// prefix per test. A test that cannot reach a service fails with a message that says how to start it;
// it skips only under `go test -short`.
package testenv

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/config"
)

const startHint = "start the local services with `make up` (scripts/services.sh up), or set OUTBOX_CDC_POSTGRES and OUTBOX_CDC_BROKERS"

// RepoRoot returns the repository's root directory: the one holding outbox-cdc's go.mod (nested
// modules such as interop/cloudevents have their own).
func RepoRoot(t TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if mod, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.HasPrefix(mod, []byte("module github.com/outbox-cdc/outbox-cdc\n")) {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("testenv: go.mod not found above the working directory")
		}
		dir = parent
	}
}

// DevDir is the local services' directory: OUTBOX_CDC_DEV_DIR, else .dev in the repository, as
// scripts/services.sh and the Makefile have it.
func DevDir(t TB) string {
	if d := os.Getenv("OUTBOX_CDC_DEV_DIR"); d != "" {
		return d
	}
	return filepath.Join(RepoRoot(t), ".dev")
}

// lookup returns a setting from the environment, else from the services' env file.
func lookup(t testing.TB, key string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	f, err := os.Open(filepath.Join(DevDir(t), "env"))
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
		if ok && k == key {
			return v
		}
	}
	return ""
}

// Delivery is the kafka.delivery the suite runs the router in: at-least-once, or exactly-once when
// OUTBOX_CDC_TEST_DELIVERY says so (make test-exactly-once runs the integration suites that way).
// Tests that exist for one mode set it themselves.
func Delivery() string {
	if v := os.Getenv("OUTBOX_CDC_TEST_DELIVERY"); v != "" {
		return v
	}
	return "at-least-once"
}

// ConsumerOpts are the consumer options that read what the suite's delivery mode delivers: only
// committed records in the exactly-once mode (isolation.level=read_committed), every record otherwise.
func ConsumerOpts() []kgo.Opt {
	if Delivery() == "exactly-once" {
		return []kgo.Opt{kgo.FetchIsolationLevel(kgo.ReadCommitted())}
	}
	return nil
}

func requireIntegration(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: skipped under -short")
	}
}

// PostgresURL returns the router role's URL after checking that the server answers.
func PostgresURL(t testing.TB) string {
	t.Helper()
	requireIntegration(t)
	url := lookup(t, "OUTBOX_CDC_POSTGRES")
	if url == "" {
		t.Fatalf("OUTBOX_CDC_POSTGRES is not set and .dev/env is missing: %s", startHint)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("PostgreSQL is not reachable (%v): %s", err, startHint)
	}
	_ = conn.Close(ctx)
	return url
}

// AdminURL returns a superuser URL for the test database.
func AdminURL(t testing.TB) string {
	t.Helper()
	PostgresURL(t)
	url := lookup(t, "OUTBOX_CDC_TEST_ADMIN_POSTGRES")
	if url == "" {
		t.Fatalf("OUTBOX_CDC_TEST_ADMIN_POSTGRES is not set and .dev/env is missing: %s", startHint)
	}
	return url
}

// Brokers returns the Kafka seed brokers after checking that one answers.
func Brokers(t testing.TB) []string {
	t.Helper()
	requireIntegration(t)
	v := lookup(t, "OUTBOX_CDC_BROKERS")
	if v == "" {
		t.Fatalf("OUTBOX_CDC_BROKERS is not set and .dev/env is missing: %s", startHint)
	}
	brokers := strings.Split(v, ",")
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var pingErr error
	for ctx.Err() == nil {
		if pingErr = cl.Ping(ctx); pingErr == nil {
			return brokers
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("Kafka is not reachable at %s (%v): %s", v, pingErr, startHint)
	return nil
}

// Fixture is one test's private outbox: table, publication, slot and topic prefix, removed at the
// end of the test.
type Fixture struct {
	// PostgresURL is the router role's URL; AdminURL a superuser's.
	PostgresURL, AdminURL string
	// Brokers are the Kafka seed brokers.
	Brokers []string
	// Table (public.<name>), Publication and Slot are the test's own.
	Table, Publication, Slot string
	// TopicPrefix starts every topic name the test routes to.
	TopicPrefix string
	// DB is a connection of the router role for writing rows.
	DB *pgx.Conn
	// Database is the fixture's own database (NewDatabaseFixture), empty for the shared one.
	Database string
}

// NewFixture creates the test's outbox table from sql/outbox.sql (with its own names) and its
// publication; the slot is created by the router. Everything is dropped when the test ends.
func NewFixture(t testing.TB) *Fixture {
	t.Helper()
	return newFixture(t, PostgresURL(t), AdminURL(t))
}

// NewDatabaseFixture is NewFixture in a database of its own, created for the test (owned by the
// router's role) and dropped when it ends: a source of a fleet, which a test can make unavailable
// (BlockDatabase) without touching the others.
func NewDatabaseFixture(t testing.TB) *Fixture {
	t.Helper()
	return NewDatabaseFixtureWith(t, "")
}

// NewDatabaseFixtureWith is NewDatabaseFixture with options for CREATE DATABASE, a constant of the
// test's (e.g. "ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0").
func NewDatabaseFixtureWith(t testing.TB, options string) *Fixture {
	t.Helper()
	adminURL := AdminURL(t)
	routerURL := PostgresURL(t)
	name := fmt.Sprintf("db_%s_%04x", sanitize(t.Name()), rand.IntN(0xffff))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = admin.Close(ctx) }()
	ru, err := url.Parse(routerURL)
	if err != nil {
		t.Fatal(err)
	}
	owner := pgx.Identifier{ru.User.Username()}.Sanitize()
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" OWNER "+owner+" "+options); err != nil {
		t.Fatalf("create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		admin, err := pgx.Connect(ctx, adminURL)
		if err != nil {
			t.Errorf("clean up: %v", err)
			return
		}
		defer func() { _ = admin.Close(ctx) }()
		_, _ = admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{name}.Sanitize()+" ALLOW_CONNECTIONS true")
		_, _ = admin.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = $1 AND active_pid IS NOT NULL`, name)
		for i := 0; i < 50; i++ {
			if _, err = admin.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1`, name); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("clean up: drop database %s: %v", name, err)
		}
	})
	f := newFixture(t, withDatabase(t, routerURL, name), withDatabase(t, adminURL, name))
	f.Database = name
	return f
}

// NewFixtureIn is NewFixture in the database of another fixture: a second outbox table there.
func NewFixtureIn(t testing.TB, other *Fixture) *Fixture {
	t.Helper()
	f := newFixture(t, other.PostgresURL, other.AdminURL)
	f.Database = other.Database
	return f
}

// withDatabase returns the URL u connecting to database db.
func withDatabase(t testing.TB, u, db string) string {
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	pu.Path = "/" + db
	return pu.String()
}

// BlockDatabase makes the fixture's database refuse every connection (as a database that is down
// would) and ends the ones open, the router's included; the returned function lets them in again.
func (f *Fixture) BlockDatabase(t testing.TB) (unblock func()) {
	t.Helper()
	if f.Database == "" {
		t.Fatal("BlockDatabase needs a fixture of NewDatabaseFixture")
	}
	name := pgx.Identifier{f.Database}.Sanitize()
	f.adminExec(t, "ALTER DATABASE "+name+" ALLOW_CONNECTIONS false")
	f.adminExec(t, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, f.Database)
	return func() {
		f.adminExec(t, "ALTER DATABASE "+name+" ALLOW_CONNECTIONS true")
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		db, err := pgx.Connect(ctx, f.PostgresURL)
		if err != nil {
			t.Fatal(err)
		}
		f.DB = db // the old connection was ended
	}
}

// adminExec runs one statement as the superuser on the cluster's postgres database.
func (f *Fixture) adminExec(t testing.TB, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, withDatabase(t, f.AdminURL, "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = admin.Close(ctx) }()
	if _, err := admin.Exec(ctx, sql, args...); err != nil {
		t.Fatal(err)
	}
}

func newFixture(t testing.TB, routerURL, adminURL string) *Fixture {
	t.Helper()
	f := &Fixture{PostgresURL: routerURL, AdminURL: adminURL, Brokers: Brokers(t)}
	id := fmt.Sprintf("%s_%04x", sanitize(t.Name()), rand.IntN(0xffff))
	f.Table = "public.ob_" + id
	f.Publication = "pub_" + id
	f.Slot = "slot_" + id
	f.TopicPrefix = "t." + strings.ReplaceAll(id, "_", "-")
	ctx := context.Background()
	db, err := pgx.Connect(ctx, f.PostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	f.DB = db
	script, err := os.ReadFile(filepath.Join(RepoRoot(t), "sql", "outbox.sql"))
	if err != nil {
		t.Fatal(err)
	}
	sql := strings.ReplaceAll(string(script), "public.outbox", f.Table)
	sql = strings.ReplaceAll(sql, "'outbox_cdc'", "'"+f.Publication+"'")
	sql = strings.ReplaceAll(sql, "PUBLICATION outbox_cdc", "PUBLICATION "+f.Publication)
	if _, err := db.Exec(ctx, sql); err != nil {
		t.Fatalf("apply sql/outbox.sql: %v", err)
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
		// Terminate a walsender still holding the slot, then drop it and resync's marker: a left-over
		// slot pins WAL and uses up max_replication_slots for the tests after this one.
		slots := []string{f.Slot, f.Slot + "_resync"}
		for i := 0; ; i++ {
			_, _ = admin.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = ANY($1) AND active_pid IS NOT NULL`, slots)
			_, err = admin.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = ANY($1)`, slots)
			if err == nil {
				break
			}
			if i == 50 {
				t.Errorf("clean up: drop slot %s: %v", f.Slot, err)
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		_, _ = admin.Exec(ctx, "DROP PUBLICATION IF EXISTS "+f.Publication)
		_, _ = admin.Exec(ctx, "DROP TABLE IF EXISTS "+f.Table)
	})
	return f
}

func sanitize(name string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(name) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteRune('_')
		}
	}
	s := b.String()
	if len(s) > 30 {
		s = s[len(s)-30:]
	}
	return strings.Trim(s, "_")
}

// ConfirmedFlushLSN returns the slot's confirmed_flush_lsn as text, or "" when the slot is missing.
func (f *Fixture) ConfirmedFlushLSN(t testing.TB) string {
	t.Helper()
	var lsn *string
	err := f.DB.QueryRow(context.Background(), `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, f.Slot).Scan(&lsn)
	if err != nil && err != pgx.ErrNoRows {
		t.Fatalf("read confirmed_flush_lsn: %v", err)
	}
	if lsn == nil {
		return ""
	}
	return *lsn
}

// Consume reads records of topics from the beginning until want records arrived or timeout passed.
func Consume(t testing.TB, brokers []string, topics []string, want int, timeout time.Duration, extra ...kgo.Opt) []*kgo.Record {
	t.Helper()
	return ConsumeUntil(t, brokers, topics, func(recs []*kgo.Record) bool { return len(recs) >= want }, timeout, extra...)
}

// ConsumeDistinct reads records of topics from the beginning until want distinct event_id headers
// arrived or timeout passed, then reads for one more second to catch trailing duplicates.
// extra options are added to the consumer (kgo.FetchIsolationLevel(kgo.ReadCommitted()) for the
// exactly-once mode's consumers).
func ConsumeDistinct(t testing.TB, brokers []string, topics []string, want int, timeout time.Duration, extra ...kgo.Opt) []*kgo.Record {
	t.Helper()
	seen := map[string]bool{}
	counted := 0
	var doneAt time.Time
	return ConsumeUntil(t, brokers, topics, func(recs []*kgo.Record) bool {
		for _, r := range recs[counted:] {
			seen[EventID(r)] = true
		}
		counted = len(recs)
		if len(seen) >= want && doneAt.IsZero() {
			doneAt = time.Now()
		}
		return !doneAt.IsZero() && time.Since(doneAt) > time.Second
	}, timeout, extra...)
}

// ConsumeUntil reads records of topics from the beginning until done says so or timeout passed; extra
// options are added to the consumer.
func ConsumeUntil(t testing.TB, brokers []string, topics []string, done func([]*kgo.Record) bool, timeout time.Duration, extra ...kgo.Opt) []*kgo.Record {
	t.Helper()
	// read_committed, as exactly-once consumers must read; without transactions it makes no difference.
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(200 * time.Millisecond),
		kgo.FetchIsolationLevel(kgo.ReadCommitted())}, extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out []*kgo.Record
	for !done(out) && ctx.Err() == nil {
		pctx, pcancel := context.WithTimeout(ctx, 500*time.Millisecond)
		fetches := cl.PollFetches(pctx)
		pcancel()
		fetches.EachError(func(topic string, p int32, err error) {
			if ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
				t.Logf("consume %s/%d: %v", topic, p, err)
			}
		})
		fetches.EachRecord(func(r *kgo.Record) { out = append(out, r) })
	}
	return out
}

// EventID is a record's event id: its event_id header, or ce_id in the CloudEvents header format.
func EventID(r *kgo.Record) string {
	if id := Header(r, "event_id"); id != "" {
		return id
	}
	return Header(r, "ce_id")
}

// Header returns the value of a record's header.
func Header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// services runs scripts/services.sh with one command (kafka-stop, kafka-start).
func services(t testing.TB, command string) {
	t.Helper()
	cmd := exec.Command("bash", filepath.Join(RepoRoot(t), "scripts", "services.sh"), command)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("scripts/services.sh %s: %v\n%s", command, err, out)
	}
}

// StopKafka stops the local broker started by `make up`; the test's cleanup starts it again.
func StopKafka(t testing.TB) {
	t.Helper()
	t.Cleanup(func() { services(t, "kafka-start") })
	services(t, "kafka-stop")
}

// StartKafka starts the local broker again.
func StartKafka(t testing.TB) {
	t.Helper()
	services(t, "kafka-start")
}

// SASLBrokers returns the local broker's SASL/PLAIN listener (user outbox, password outbox-secret).
func SASLBrokers(t testing.TB) []string {
	t.Helper()
	return listener(t, "OUTBOX_CDC_TEST_SASL_BROKERS")
}

// listener returns the brokers of one of the local broker's further listeners, named by the
// variable key of .dev/env, or fails with how to start them.
func listener(t testing.TB, key string) []string {
	t.Helper()
	Brokers(t)
	v := lookup(t, key)
	if v == "" {
		t.Fatalf("%s is not set and .dev/env lacks it: %s", key, startHint)
	}
	return strings.Split(v, ",")
}

// RemoteListener returns the local broker's "remote" listener and the address it advertises, where
// nothing listens until a test starts a proxy there (faultnet): every connection of a client that
// bootstraps from advertised then passes the proxy. Only one test at a time may hold the port.
func RemoteListener(t testing.TB) (listener, advertised string) {
	t.Helper()
	Brokers(t)
	listener, advertised = lookup(t, "OUTBOX_CDC_TEST_REMOTE_LISTENER"), lookup(t, "OUTBOX_CDC_TEST_REMOTE_BROKERS")
	if listener == "" || advertised == "" {
		t.Fatalf("OUTBOX_CDC_TEST_REMOTE_LISTENER/_BROKERS are not set and .dev/env lacks them: %s", startHint)
	}
	return listener, advertised
}

// TLSBrokers returns the local broker's TLS listener and the PEM file of the CA that signed it.
func TLSBrokers(t testing.TB) (brokers []string, caFile string) {
	t.Helper()
	Brokers(t)
	v, ca := lookup(t, "OUTBOX_CDC_TEST_TLS_BROKERS"), lookup(t, "OUTBOX_CDC_TEST_TLS_CA_FILE")
	if v == "" || ca == "" {
		t.Fatalf("OUTBOX_CDC_TEST_TLS_BROKERS / OUTBOX_CDC_TEST_TLS_CA_FILE are not set and .dev/env lacks them: %s", startHint)
	}
	return strings.Split(v, ","), ca
}

// RouterConfig is the router's configuration for a fixture, with short intervals for tests, in the
// suite's delivery mode. Record timestamps are the produce time: the delivery checker reads them as
// the order of production (which copy of a replayed event came last); commit times would make every
// copy equal (TestRecordTimestamps checks the default).
func RouterConfig(f *Fixture) config.Config {
	cfg := config.Default()
	cfg.Postgres.URL = f.PostgresURL
	cfg.Postgres.Table = f.Table
	cfg.Postgres.Slot = f.Slot
	cfg.Postgres.Publication = f.Publication
	cfg.Postgres.StatusInterval = 2 * time.Second
	cfg.Postgres.StandbyPollInterval = 500 * time.Millisecond
	cfg.Kafka.Brokers = f.Brokers
	cfg.Kafka.TopicPartitions = 3
	cfg.Routing.Topic = f.TopicPrefix + ".{event_type}"
	cfg.ShutdownTimeout = 20 * time.Second
	cfg.Kafka.Delivery = Delivery()
	cfg.Kafka.CheckpointTopic = f.TopicPrefix + ".checkpoints"
	cfg.Kafka.RecordTimestamp = config.RecordTimestampProduce
	return cfg
}
