package fleet_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/fleet"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/metrics"
	"github.com/outbox-cdc/outbox-cdc/pipeline"
)

// sourceConfig is a source of the fleet for fixture f, with short intervals for tests.
func sourceConfig(name string, f *testenv.Fixture) config.Config {
	cfg := testenv.RouterConfig(f)
	cfg.Name = name
	return cfg
}

func testLogger() *slog.Logger {
	var w io.Writer = io.Discard
	if testing.Verbose() {
		w = os.Stderr
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

func readyz(t *testing.T, h http.Handler, source string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz?source="+source, nil))
	return rec.Code, strings.TrimSpace(rec.Body.String())
}

// TestOneSourceDownOthersStream: three sources on three databases stream from one process; the
// database of one refuses connections (as one that is down does): the other two keep streaming and
// stay ready, the one down is not ready and says why, and once its database is back it delivers
// what was written before it went down and after it came back, nothing lost.
func TestOneSourceDownOthersStream(t *testing.T) {
	const n = 3
	types := []string{"Created", "Paid"}
	var (
		fixtures [n]*testenv.Fixture
		gens     [n]*testenv.Generator
		written  [n][]testenv.Event
		members  []fleet.Source
	)
	m := metrics.New()
	for i := range n {
		fixtures[i] = testenv.NewDatabaseFixture(t)
		gens[i] = testenv.NewGenerator(20, types...).WithPrefix(fmt.Sprintf("s%d-agg-", i))
		name := fmt.Sprintf("s%d", i)
		members = append(members, fleet.Source{Config: sourceConfig(name, fixtures[i]), Options: []pipeline.Option{pipeline.WithObserver(m.Source(name))}})
	}
	write := func(i, rows int) {
		t.Helper()
		written[i] = append(written[i], testenv.Preload(t, fixtures[i], gens[i], rows)...)
	}
	f, err := fleet.New(testLogger(), m, func(s string) string { return s }, nil, members)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(60 * time.Second):
			t.Error("Run did not return within 60 s of its context's end")
		}
	}()
	h := m.Handler()
	// Ready: every slot exists (the router creates it), so nothing written from now on is missed.
	testenv.WaitFor(t, 60*time.Second, "every source ready", func() bool {
		for i := range n {
			if code, _ := readyz(t, h, fmt.Sprintf("s%d", i)); code != http.StatusOK {
				return false
			}
		}
		return true
	})
	for i := range n {
		write(i, 200)
	}

	// s2's database goes down: it stops being ready and says why; s0 and s1 stream on, ready.
	unblock := fixtures[2].BlockDatabase(t)
	testenv.WaitFor(t, 60*time.Second, "s2 not ready", func() bool {
		code, _ := readyz(t, h, "s2")
		return code == http.StatusServiceUnavailable
	})
	for round := range 3 {
		for i := range 2 {
			write(i, 100)
			if code, body := readyz(t, h, fmt.Sprintf("s%d", i)); code != http.StatusOK {
				t.Errorf("round %d: s%d is not ready while only s2's database is down: %d %s", round, i, code, body)
			}
		}
		time.Sleep(time.Second)
	}
	for i := range 2 {
		recs := testenv.ConsumeDistinct(t, fixtures[i].Brokers, testenv.TopicsOf(fixtures[i], types...), len(written[i]), 60*time.Second, testenv.ConsumerOpts()...)
		testenv.VerifyDelivery(t, fixtures[i], written[i], recs)
	}
	code, body := readyz(t, h, "s2")
	if code != http.StatusServiceUnavailable || !strings.HasPrefix(body, "s2: ") {
		t.Errorf("/readyz?source=s2 while its database is down = %d %q, want 503 naming s2", code, body)
	}

	// Back: s2 delivers what was written before and after, and is ready again.
	unblock()
	write(2, 100)
	recs := testenv.ConsumeDistinct(t, fixtures[2].Brokers, testenv.TopicsOf(fixtures[2], types...), len(written[2]), 90*time.Second, testenv.ConsumerOpts()...)
	testenv.VerifyDelivery(t, fixtures[2], written[2], recs)
	testenv.WaitFor(t, 60*time.Second, "s2 ready again", func() bool {
		code, _ := readyz(t, h, "s2")
		return code == http.StatusOK
	})
}

// metricsText scrapes h's /metrics.
func metricsText(t *testing.T, h http.Handler) string {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	return rec.Body.String()
}

// TestPausedSourceIsWatched: a source paused through the coordination stops streaming and releases its
// slot, but its slot is still watched by the instance assigned it: the lag grows in /metrics with
// rows written meanwhile, the pause's time is there for the alert, and a slot dropped while paused
// is reported as gone. Resumed, it delivers what was written during the pause.
func TestPausedSourceIsWatched(t *testing.T) {
	f := testenv.NewFixture(t)
	m := metrics.New()
	group := "test-paused-" + strings.ReplaceAll(f.Slot, "_", "-")
	coord := &fleet.Coordinator{
		Group: group, Topic: "outbox-cdc.fleet." + group, Instance: "one", SessionTimeout: 6 * time.Second,
		RebalanceTimeout: 30 * time.Second, ReplicationFactor: -1, ClientOpts: []kgo.Opt{kgo.SeedBrokers(f.Brokers...)}, Log: testLogger(),
	}
	// A multi-host URL whose first host does not answer: the API names the one that does.
	cfg := sourceConfig("orders", f)
	var real string
	cfg.Postgres.URL, real = testenv.DeadHostFirst(cfg.Postgres.URL)
	fl, err := fleet.New(testLogger(), m, func(s string) string { return s }, coord,
		[]fleet.Source{{Config: cfg, Options: []pipeline.Option{pipeline.WithObserver(m.Source("orders"))}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := runFleet(t, fl)
	h := m.Handler()
	testenv.WaitFor(t, 60*time.Second, "orders streaming", func() bool { code, _ := readyz(t, h, "orders"); return code == http.StatusOK })
	if s := fl.Snapshot(ctx).Sources[0]; s.Server != real || !strings.Contains(s.Database, "127.0.0.1:1,"+real) {
		t.Errorf("the API shows database %q, server %q: want both hosts, and %s as the server", s.Database, s.Server, real)
	}
	if err := fl.SetPaused(ctx, "orders", true, "test"); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "orders paused, its slot released", func() bool {
		var active bool
		if err := f.DB.QueryRow(ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, f.Slot).Scan(&active); err != nil {
			t.Fatal(err)
		}
		return !active && strings.Contains(metricsText(t, h), `outbox_cdc_role{role="paused",source="orders"} 1`)
	})
	gen := testenv.NewGenerator(5, "Placed")
	written := testenv.Preload(t, f, gen, 300)
	lagRE := regexp.MustCompile(`(?m)^outbox_cdc_slot_lag_bytes\{source="orders"\} ([0-9.e+]+)$`)
	testenv.WaitFor(t, 30*time.Second, "the paused slot's lag in /metrics, growing with what was written", func() bool {
		mm := lagRE.FindStringSubmatch(metricsText(t, h))
		if mm == nil {
			return false
		}
		lag, _ := strconv.ParseFloat(mm[1], 64)
		return lag > 10_000
	})
	text := metricsText(t, h)
	for _, want := range []string{`outbox_cdc_paused_since_timestamp_seconds{source="orders"}`, `outbox_cdc_slot_wal_status{source="orders",status="reserved"} 1`} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics of the paused source lacks %s", want)
		}
	}

	// Resumed: everything written during the pause arrives.
	if err := fl.SetPaused(ctx, "orders", false, "test"); err != nil {
		t.Fatal(err)
	}
	recs := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Placed"), len(written), 60*time.Second, testenv.ConsumerOpts()...)
	testenv.VerifyDelivery(t, f, written, recs)

	// Paused again, and its slot dropped meanwhile: reported as gone, not as a quiet pause.
	if err := fl.SetPaused(ctx, "orders", true, "test"); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the slot released again", func() bool {
		var active bool
		_ = f.DB.QueryRow(ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, f.Slot).Scan(&active)
		return !active && strings.Contains(metricsText(t, h), `outbox_cdc_role{role="paused",source="orders"} 1`)
	})
	if _, err := f.DB.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, f.Slot); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the dropped slot reported", func() bool {
		_, body := readyz(t, h, "orders")
		return strings.Contains(metricsText(t, h), `outbox_cdc_slot_wal_status{source="orders",status="missing"} 1`) && strings.Contains(body, "slot is gone")
	})
}

// TestSourceWaitsForItsTLSFile: a source whose postgres.url names a CA file that is not there yet (a
// Secret mounted late) is held with the reason while the other source streams, and streams once the
// file appears — retried on a backoff, without a restart — delivering what was written meanwhile.
func TestSourceWaitsForItsTLSFile(t *testing.T) {
	good, late := testenv.NewFixture(t), testenv.NewFixture(t)
	caFile := filepath.Join(t.TempDir(), "secret-mounted-later", "ca.pem")
	lateCfg := sourceConfig("late", late)
	lateCfg.Postgres.URL += "?sslmode=prefer&sslrootcert=" + caFile // the dev server has no TLS: prefer falls back
	m := metrics.New()
	fl, err := fleet.New(testLogger(), m, func(s string) string { return s }, nil, []fleet.Source{
		{Config: sourceConfig("good", good), Options: []pipeline.Option{pipeline.WithObserver(m.Source("good"))}},
		{Config: lateCfg, Options: []pipeline.Option{pipeline.WithObserver(m.Source("late"))}},
	})
	if err != nil {
		t.Fatal(err)
	}
	runFleet(t, fl)
	h := m.Handler()
	testenv.WaitFor(t, 60*time.Second, "good streaming, late held naming its file", func() bool {
		codeGood, _ := readyz(t, h, "good")
		codeLate, body := readyz(t, h, "late")
		return codeGood == http.StatusOK && codeLate != http.StatusOK && strings.Contains(body, "does not exist") && strings.Contains(body, "started again in")
	})
	written := testenv.Preload(t, late, testenv.NewGenerator(3, "Late"), 20)
	if err := os.MkdirAll(filepath.Dir(caFile), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(caFile, selfSignedPEM(t), 0o600); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 90*time.Second, "late streaming once its file is there", func() bool { code, _ := readyz(t, h, "late"); return code == http.StatusOK })
	more := testenv.Preload(t, late, testenv.NewGenerator(3, "Late").WithPrefix("more-"), 20)
	got := testenv.ConsumeDistinct(t, late.Brokers, testenv.TopicsOf(late, "Late"), len(more), 60*time.Second, testenv.ConsumerOpts()...)
	testenv.VerifyDelivery(t, late, more, got)
	_ = written // written before the slot existed: the slot was created when the source could start (said in the log)
}

// selfSignedPEM is a self-signed certificate, as PEM.
func selfSignedPEM(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// runFleet runs fl until the test ends, and returns the context it runs under.
func runFleet(t *testing.T, fl *fleet.Fleet) context.Context {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fl.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return ctx
}
