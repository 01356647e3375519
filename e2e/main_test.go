package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/internal/freeport"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// binary is the outbox-cdc binary built once for the process-level tests.
var binary string

// TestMain builds the binary from the module's root, except under -short: every test here runs it
// against the real services.
func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "outbox-cdc-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "outbox-cdc")
	build := exec.Command("go", "build", "-o", binary, "..")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build outbox-cdc:", err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// routerProc is an outbox-cdc process whose JSON log lines the test can wait for.
type routerProc struct {
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []map[string]any
	raw   []string
	done  chan struct{}
}

func routerEnv(f *testenv.Fixture) []string {
	return append(os.Environ(),
		"OUTBOX_CDC_POSTGRES="+f.PostgresURL,
		"OUTBOX_CDC_BROKERS="+strings.Join(f.Brokers, ","),
		"OUTBOX_CDC_TABLE="+f.Table,
		"OUTBOX_CDC_SLOT="+f.Slot,
		"OUTBOX_CDC_PUBLICATION="+f.Publication,
		"OUTBOX_CDC_TOPIC="+f.TopicPrefix+".{event_type}",
		"OUTBOX_CDC_STATUS_INTERVAL=2s",
		"OUTBOX_CDC_STANDBY_POLL_INTERVAL=500ms",
		"OUTBOX_CDC_LOG_FORMAT=json",
		"OUTBOX_CDC_METRICS_ADDR=127.0.0.1:0",
		"OUTBOX_CDC_DELIVERY="+testenv.Delivery(),
		"OUTBOX_CDC_CHECKPOINT_TOPIC="+f.TopicPrefix+".checkpoints",
		// The delivery checker reads the record timestamp as the order of production (which copy of
		// a replayed event came last); commit times would make every copy equal.
		"OUTBOX_CDC_RECORD_TIMESTAMP=produce",
	)
}

func startRouter(t *testing.T, env []string, args ...string) *routerProc {
	t.Helper()
	cmd := exec.Command(binary, append([]string{"run"}, args...)...)
	cmd.Env = env
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &routerProc{cmd: cmd, done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			var m map[string]any
			_ = json.Unmarshal([]byte(line), &m)
			r.mu.Lock()
			r.raw = append(r.raw, line)
			if m != nil {
				r.lines = append(r.lines, m)
			}
			r.mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, stderr)
		_ = cmd.Wait()
		close(r.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-r.done
		if t.Failed() {
			t.Logf("router pid %d log:\n%s", cmd.Process.Pid, r.log())
		}
	})
	return r
}

// killAndRestart SIGKILLs the router, waits for it to end, and starts a new one with env.
func (r *routerProc) killAndRestart(t *testing.T, env []string) *routerProc {
	t.Helper()
	if err := r.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-r.done
	return startRouter(t, env)
}

func (r *routerProc) log() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.raw, "\n")
}

// waitLog waits for a log line whose msg contains substr.
func (r *routerProc) waitLog(t *testing.T, substr string, timeout time.Duration) {
	t.Helper()
	testenv.WaitFor(t, timeout, fmt.Sprintf("router log %q", substr), func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, l := range r.lines {
			if msg, _ := l["msg"].(string); strings.Contains(msg, substr) {
				return true
			}
		}
		return false
	})
}

func (r *routerProc) exitCode(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-r.done:
		return r.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		t.Fatalf("router did not exit within %s", timeout)
		return -1
	}
}

// copyEvents writes events with COPY in one transaction: many rows share WAL records (multi-insert).
// It returns a WAL position read inside the transaction, after the COPY: the commit ends past it.
func copyEvents(ctx context.Context, db *pgx.Conn, table string, evs []testenv.Event) (beforeCommit string, err error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return "", err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	rows := make([][]any, len(evs))
	for i, e := range evs {
		rows[i] = []any{e.ID, e.Type, e.AggType, e.AggID, e.Version, e.Payload, e.Headers}
	}
	schema, name, _ := strings.Cut(table, ".")
	_, err = tx.CopyFrom(ctx, pgx.Identifier{schema, name},
		[]string{"event_id", "event_type", "aggregate_type", "aggregate_id", "aggregate_version", "payload", "headers"},
		pgx.CopyFromRows(rows))
	if err != nil {
		return "", fmt.Errorf("copy: %w", err)
	}
	if err := tx.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&beforeCommit); err != nil {
		return "", err
	}
	return beforeCommit, tx.Commit(ctx)
}

// endOffsets returns the sum of the end offsets of topics (0 for a topic not created yet).
func endOffsets(t *testing.T, adm *kadm.Client, topics []string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	offsets, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return 0
	}
	var n int64
	offsets.Each(func(o kadm.ListedOffset) {
		if o.Err == nil {
			n += o.Offset
		}
	})
	return n
}

// TestKillDuringCopyLosesNothing copies 5,000 rows into the outbox, kills the router with SIGKILL
// while it delivers them — after a random number of them reached Kafka, before the slot confirmed
// the transaction — restarts it, and checks that nothing is lost and per-aggregate order holds.
// Duplicates are expected (at-least-once) and counted.
func TestKillDuringCopyLosesNothing(t *testing.T) {
	f := testenv.NewFixture(t)
	// A small in-flight cap and a long linger stretch the delivery over about five seconds: batches of
	// 50 records, one every 50 ms.
	env := append(routerEnv(f), "OUTBOX_CDC_MAX_INFLIGHT_RECORDS=50", "OUTBOX_CDC_LINGER=50ms")
	first := startRouter(t, env)
	first.waitLog(t, "streaming", 60*time.Second)

	gen := testenv.NewGenerator(50, "OrderCreated", "OrderPaid")
	evs := make([]testenv.Event, 5000)
	for i := range evs {
		evs[i] = gen.Event(rand.IntN(50))
	}
	topics := testenv.TopicsOf(f, "OrderCreated", "OrderPaid")
	cl, err := kgo.NewClient(kgo.SeedBrokers(f.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	// Created in advance, so that the client's metadata knows them while the COPY is delivered.
	if _, err := adm.CreateTopics(context.Background(), 3, -1, nil, topics...); err != nil {
		t.Fatal(err)
	}
	beforeCommit, err := copyEvents(context.Background(), f.DB, f.Table, evs)
	if err != nil {
		t.Fatal(err)
	}
	threshold := int64(100 + rand.IntN(2400))
	testenv.WaitFor(t, time.Minute, "part of the COPY in Kafka", func() bool { return endOffsets(t, adm, topics) >= threshold })
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-first.done
	inKafka := endOffsets(t, adm, topics)
	confirmedAtKill := f.ConfirmedFlushLSN(t)
	if inKafka >= int64(len(evs)) || testenv.MustLSN(t, confirmedAtKill) > testenv.MustLSN(t, beforeCommit) {
		t.Fatalf("the kill landed after the delivery (%d of %d records in Kafka, slot confirmed %s, COPY committed after %s): the test proves nothing",
			inKafka, len(evs), confirmedAtKill, beforeCommit)
	}

	second := startRouter(t, env)
	second.waitLog(t, "streaming", 60*time.Second)
	got := testenv.ConsumeDistinct(t, f.Brokers, topics, len(evs), 2*time.Minute)
	dups := testenv.VerifyDelivery(t, f, evs, got)
	t.Logf("killed with %d of %d records in Kafka (slot confirmed %s at the kill, before the COPY's commit): %d duplicates after the restart",
		inKafka, len(evs), confirmedAtKill, dups)
}

// TestTwoRoutersOnOneSlot starts two routers on one slot: the second waits as a hot standby, takes
// over when the first is killed, and nothing written meanwhile is lost.
func TestTwoRoutersOnOneSlot(t *testing.T) {
	f := testenv.NewFixture(t)
	activeAddr, standbyAddr := freeAddr(t), freeAddr(t)
	active := startRouter(t, append(routerEnv(f), "OUTBOX_CDC_METRICS_ADDR="+activeAddr))
	active.waitLog(t, "streaming", 60*time.Second)
	standby := startRouter(t, append(routerEnv(f), "OUTBOX_CDC_METRICS_ADDR="+standbyAddr))
	standby.waitLog(t, "hot standby", 60*time.Second)
	if code, body := httpGet(t, activeAddr, "/readyz"); code != 200 {
		t.Errorf("active /readyz = %d %q, want 200", code, body)
	}
	if code, body := httpGet(t, standbyAddr, "/readyz"); code != 503 || !strings.Contains(body, "standby") {
		t.Errorf("standby /readyz = %d %q, want 503 saying standby", code, body)
	}
	// The Helm chart's readiness probe: a standby ready to take over counts (once its slot monitor
	// has read the slot, within 5 s); the active one too.
	testenv.WaitFor(t, 20*time.Second, "the standby ready to take over", func() bool {
		code, _ := httpGet(t, standbyAddr, "/readyz?standby=ready")
		return code == 200
	})
	if code, body := httpGet(t, activeAddr, "/readyz?standby=ready"); code != 200 {
		t.Errorf("active /readyz?standby=ready = %d %q, want 200", code, body)
	}

	ctx := context.Background()
	gen := testenv.NewGenerator(10, "InventoryAdjusted")
	var all []testenv.Event
	write := func(n int) {
		for i := 0; i < n; i++ {
			evs := []testenv.Event{gen.Event(i), gen.Event(i + 1)}
			if err := testenv.InsertTx(ctx, f.DB, f.Table, evs, true); err != nil {
				t.Fatal(err)
			}
			all = append(all, evs...)
		}
	}
	write(200)
	if err := active.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	write(200) // written while no router streams
	standby.waitLog(t, "took over", 60*time.Second)
	write(200)
	got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "InventoryAdjusted"), len(all), 2*time.Minute)
	dups := testenv.VerifyDelivery(t, f, all, got)
	t.Logf("%d events, %d duplicates after the takeover", len(all), dups)
	if code, _ := httpGet(t, standbyAddr, "/readyz"); code != 200 {
		t.Errorf("/readyz of the instance that took over = %d, want 200", code)
	}
	_, body := httpGet(t, standbyAddr, "/metrics")
	for _, want := range []string{`outbox_cdc_role{role="active",source="default"} 1`, `outbox_cdc_events_produced_total{event_type="InventoryAdjusted",source="default"`} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics after the takeover lacks %s", want)
		}
	}
}

// TestSIGTERMStopsGracefully: SIGTERM while records are handed to Kafka and not yet acknowledged (a
// long linger holds them) makes the router flush them, confirm them in its final status update, and
// exit 0; a restart sends nothing again. (In-flight records held by a linger exist only in
// at-least-once mode: exactly-once flushes at every commit; TestGracefulStopConfirmsAcknowledged covers
// its open transaction at a stop.)
func TestSIGTERMStopsGracefully(t *testing.T) {
	f := testenv.NewFixture(t)
	addr := freeAddr(t)
	env := append(routerEnv(f), "OUTBOX_CDC_METRICS_ADDR="+addr, "OUTBOX_CDC_LINGER=5s", "OUTBOX_CDC_QUIET_FLUSH=0", "OUTBOX_CDC_DELIVERY=at-least-once")
	r := startRouter(t, env)
	r.waitLog(t, "streaming", 60*time.Second)
	gen := testenv.NewGenerator(3, "Refunded")
	evs := []testenv.Event{gen.Event(0), gen.Event(1), gen.Event(2)}
	if err := testenv.InsertTx(context.Background(), f.DB, f.Table, evs, false); err != nil {
		t.Fatal(err)
	}
	var afterCommit string
	if err := f.DB.QueryRow(context.Background(), "SELECT pg_current_wal_lsn()::text").Scan(&afterCommit); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "records in flight", func() bool {
		_, body := httpGet(t, addr, "/metrics")
		return strings.Contains(body, `outbox_cdc_inflight_records{source="default"} 3`)
	})
	if c := testenv.MustLSN(t, f.ConfirmedFlushLSN(t)); c >= testenv.MustLSN(t, afterCommit) {
		t.Fatalf("confirmed %s before the records were acknowledged", c)
	}
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := r.exitCode(t, 60*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	r.waitLog(t, "stopped", time.Second)
	if c := testenv.MustLSN(t, f.ConfirmedFlushLSN(t)); c < testenv.MustLSN(t, afterCommit) {
		t.Fatalf("confirmed_flush_lsn %s behind the last commit (WAL at %s after it)", c, afterCommit)
	}
	testenv.VerifyDelivery(t, f, evs, testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Refunded"), len(evs), time.Minute))
	again := startRouter(t, append(routerEnv(f), "OUTBOX_CDC_DELIVERY=at-least-once"))
	again.waitLog(t, "streaming", 60*time.Second)
	time.Sleep(2 * time.Second)
	if got := testenv.Consume(t, f.Brokers, testenv.TopicsOf(f, "Refunded"), len(evs)+1, 3*time.Second); len(got) != len(evs) {
		t.Fatalf("a restart after the graceful stop sent %d records again", len(got)-len(evs))
	}
}

// TestConfigErrorsNameTheKey: a bad setting stops the router at start with the key's name.
func TestConfigErrorsNameTheKey(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the binary, which -short does not build")
	}
	cmd := exec.Command(binary, "run", "--postgres", "postgres://u:secret@127.0.0.1:1/db", "--brokers", "127.0.0.1:1")
	cmd.Env = append(os.Environ(), "OUTBOX_CDC_MAX_INFLIGHT_RECORDS=0", "OUTBOX_CDC_SLOT=Bad-Slot")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("router started with an invalid configuration:\n%s", out)
	}
	for _, want := range []string{"limits.max_inflight_records", "postgres.slot"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output does not name %s:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "secret") {
		t.Errorf("output leaks the password:\n%s", out)
	}
}

// freeAddr returns a loopback address with a port that was free a moment ago (freeport.Loopback:
// below the ephemeral range, so that no outgoing connection takes it before the binary binds it).
func freeAddr(t *testing.T) string {
	t.Helper()
	port, err := freeport.Loopback()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", port)
}

func httpGet(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	var lastErr error
	for i := 0; i < 50; i++ {
		resp, err := http.Get("http://" + addr + path)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return resp.StatusCode, string(body)
		}
		lastErr = err
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("GET %s%s: %v", addr, path, lastErr)
	return 0, ""
}

// TestNoPasswordInOutput runs every command with hostile database URLs — a bad percent escape, '/',
// '#' or '@' in the password, a bad port, an invalid sslmode, a password in the query — and checks that
// nothing the process prints holds the password. run retries an unreachable server, so its output is
// read for a few seconds.
func TestNoPasswordInOutput(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the binary, which -short does not build")
	}
	urls := []struct{ url, password string }{
		{"postgres://u:Hx7%zzQ9@127.0.0.1:1/db", "Hx7%zzQ9"},
		{"postgres://u:Hx7/Q9pw@127.0.0.1:1/db", "Hx7/Q9pw"},
		{"postgres://u:Hx7#Q9pw@127.0.0.1:1/db", "Hx7#Q9pw"},
		{"postgres://u:Hx7@Q9pw@127.0.0.1:1/db", "Hx7@Q9pw"},
		{"postgres://u:Hx7Q9pw@127.0.0.1:notaport/db", "Hx7Q9pw"},
		{"postgres://u:Hx7Q9pw@127.0.0.1:1/db?sslmode=bogus", "Hx7Q9pw"},
		{"postgres://u@127.0.0.1:1/db?password=Hx7Q9pw", "Hx7Q9pw"},
		{"postgres://u:Hx7Q9pw@127.0.0.1:1/db", "Hx7Q9pw"},
	}
	for _, u := range urls {
		for _, command := range []string{"run", "status", "init", "resync", "config"} {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			cmd := exec.CommandContext(ctx, binary, command, "--brokers", "127.0.0.1:1", "--log-format", "json")
			if command == "resync" {
				cmd.Args = append(cmd.Args, "--dry-run")
			}
			cmd.Env = append(os.Environ(), "OUTBOX_CDC_POSTGRES="+u.url, "OUTBOX_CDC_METRICS_ADDR=")
			out, _ := cmd.CombinedOutput()
			cancel()
			for _, fragment := range []string{u.password, strings.SplitN(u.password, "/", 2)[0] + "/", "Q9pw"} {
				if strings.Contains(string(out), fragment) {
					t.Errorf("outbox-cdc %s with %s printed %q:\n%s", command, u.url, fragment, out)
				}
			}
		}
	}
}

// TestConfigCommandShowsNoSecret: `outbox-cdc config` prints the effective configuration; no password
// of any shape reaches it — in the URL, from PGPASSWORD, or a SASL password that YAML must quote — and
// an invalid configuration exits 1 naming the key.
func TestConfigCommandShowsNoSecret(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the binary, which -short does not build")
	}
	for _, sasl := range []string{"Q9pw'it: \"s", "Q9pw\nsecond line", "   Q9pw  "} {
		cmd := exec.Command(binary, "config", "--brokers", "127.0.0.1:1")
		cmd.Env = append(os.Environ(), "OUTBOX_CDC_POSTGRES=postgres://u:Hx7Q9pw@127.0.0.1:1/db", "PGPASSWORD=Zr4Q9pw",
			"OUTBOX_CDC_KAFKA_SASL_MECHANISM=SCRAM-SHA-256", "OUTBOX_CDC_KAFKA_SASL_USERNAME=u", "OUTBOX_CDC_KAFKA_SASL_PASSWORD="+sasl)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("config: %v\n%s", err, out)
		}
		if strings.Contains(string(out), "Q9pw") {
			t.Errorf("config printed a password (SASL %q):\n%s", sasl, out)
		}
		for _, want := range []string{"slot: outbox_cdc", "mechanism: SCRAM-SHA-256", "brokers:"} {
			if !strings.Contains(string(out), want) {
				t.Errorf("config output lacks %q:\n%s", want, out)
			}
		}
	}
	cmd := exec.Command(binary, "config", "--postgres", "postgres://u@127.0.0.1:1/db", "--brokers", "127.0.0.1:1")
	cmd.Env = append(os.Environ(), "OUTBOX_CDC_MAX_INFLIGHT_RECORDS=0")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "limits.max_inflight_records") {
		t.Errorf("config accepted an invalid configuration or did not name the key: %v\n%s", err, out)
	}
}

// TestFromDebeziumCommand: from-debezium reads a connector's JSON from standard input, prints the
// configuration and its notes without the connector's password, and exits 1 for a connector it
// cannot take over from.
func TestFromDebeziumCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the binary, which -short does not build")
	}
	connector := `{"name": "o", "config": {"connector.class": "io.debezium.connector.postgresql.PostgresConnector",
		"database.hostname": "pg", "database.dbname": "orders", "database.user": "dbz", "database.password": "Hx7Q9pw-dbz",
		"table.include.list": "public.outbox", "slot.name": "s1", "transforms": "outbox",
		"transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter", "transforms.outbox.table.field.event.key": "order_id"}}`
	cmd := exec.Command(binary, "from-debezium")
	cmd.Stdin = strings.NewReader(connector)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("from-debezium: %v\n%s", err, stderr.String())
	}
	// table.field.event.key names a column, not a secret: its value is written as it is.
	if !strings.Contains(stdout.String(), "header_format: debezium") || !strings.Contains(stdout.String(), "slot: s1") || !strings.Contains(stderr.String(), "kafka.brokers") ||
		!strings.Contains(stdout.String(), "aggregate_id: order_id") {
		t.Errorf("stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	}
	if strings.Contains(stdout.String()+stderr.String(), "Q9pw") {
		t.Errorf("the password was printed")
	}
	cmd = exec.Command(binary, "from-debezium", "-")
	cmd.Stdin = strings.NewReader(`{"connector.class": "io.debezium.connector.postgresql.PostgresConnector", "plugin.name": "decoderbufs", "database.password": "Hx7Q9pw-dbz"}`)
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "pgoutput") || strings.Contains(string(out), "Q9pw") {
		t.Errorf("a decoderbufs connector: %v\n%s", err, out)
	}
	// An option under the transform that the conversion does not know: refused, naming it.
	cmd = exec.Command(binary, "from-debezium")
	cmd.Stdin = strings.NewReader(strings.Replace(connector, `"slot.name"`, `"transforms.outbox.route.topic.replacment": "x", "slot.name"`, 1))
	out, err = cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "transforms.outbox.route.topic.replacment") {
		t.Errorf("a typo under the transform's prefix: %v\n%s", err, out)
	}
}

// TestVersionCommand: the binary the tests build reports a version, the commit and the platform, as
// text and as JSON.
func TestVersionCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the binary, which -short does not build")
	}
	out, err := exec.Command(binary, "version", "--json").CombinedOutput()
	if err != nil {
		t.Fatalf("version --json: %v\n%s", err, out)
	}
	var info struct {
		Version   string `json:"version"`
		Commit    string `json:"commit"`
		GoVersion string `json:"go_version"`
		Platform  string `json:"platform"`
	}
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatalf("version --json is not JSON: %v\n%s", err, out)
	}
	if info.Version == "" || info.Commit == "" || !strings.HasPrefix(info.GoVersion, "go") || info.Platform != runtime.GOOS+"/"+runtime.GOARCH {
		t.Errorf("version --json: %+v", info)
	}
	line, err := exec.Command(binary, "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(line), info.Version) || !strings.Contains(string(line), info.Platform) {
		t.Errorf("--version: %v: %s", err, line)
	}
}

// TestSilentConnectionIsNotReportedHealthy: with every connection to PostgreSQL black-holed (the
// peer goes silent, no FIN), /readyz must stop answering 200 within the receive timeout, the role must
// leave active, and the slot monitor must count its failure instead of keeping its last good value;
// the router then replaces its connections and is ready again.
func TestSilentConnectionIsNotReportedHealthy(t *testing.T) {
	f := testenv.NewFixture(t)
	pgHost := strings.Split(strings.SplitN(f.PostgresURL, "@", 2)[1], "/")[0]
	proxy := testenv.NewProxy(t, pgHost)
	addr := freeAddr(t)
	env := append(routerEnv(f), "OUTBOX_CDC_POSTGRES="+testenv.ProxyURL(t, proxy, f.PostgresURL), "OUTBOX_CDC_METRICS_ADDR="+addr,
		"OUTBOX_CDC_STATUS_INTERVAL=1s", "OUTBOX_CDC_RECEIVE_TIMEOUT=4s")
	r := startRouter(t, env)
	r.waitLog(t, "streaming", 60*time.Second)
	testenv.WaitFor(t, 30*time.Second, "/readyz 200", func() bool { code, _ := httpGet(t, addr, "/readyz"); return code == 200 })
	if n := proxy.BlackHole(); n == 0 {
		t.Fatal("no connection went through the proxy")
	}
	holed := time.Now()
	var body string
	testenv.WaitFor(t, 15*time.Second, "/readyz to stop answering 200", func() bool {
		var code int
		code, body = httpGet(t, addr, "/readyz")
		return code != 200
	})
	noticed := time.Since(holed)
	_, metrics := httpGet(t, addr, "/metrics")
	if !strings.Contains(metrics, `outbox_cdc_role{role="active",source="default"} 0`) {
		t.Errorf("role still active after the connection went silent")
	}
	testenv.WaitFor(t, 20*time.Second, "the slot monitor to count its failure", func() bool {
		_, m := httpGet(t, addr, "/metrics")
		return !strings.Contains(m, `outbox_cdc_slot_monitor_errors_total{source="default"} 0`)
	})
	testenv.WaitFor(t, 60*time.Second, "/readyz 200 again", func() bool { code, _ := httpGet(t, addr, "/readyz"); return code == 200 })
	t.Logf("/readyz said %q %s after the black hole (receive timeout 4s); ready again after %s",
		strings.TrimSpace(body), noticed.Round(100*time.Millisecond), time.Since(holed).Round(100*time.Millisecond))
	if noticed > 8*time.Second {
		t.Errorf("took %s to stop reporting ready", noticed)
	}
}
