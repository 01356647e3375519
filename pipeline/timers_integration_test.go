package pipeline

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// TestRoleTimersDoNotReachOurSessions: the role outbox-cdc connects as carries the timers a DBA sets
// for application sessions (statement_timeout, lock_timeout, idle_in_transaction_session_timeout,
// idle_session_timeout, and transaction_timeout on PostgreSQL 17+), all far shorter than what
// outbox-cdc's own sessions need. A resync still publishes every row, and run's slot
// monitor and outbox verification, idle between their polls for longer than the idle timeout, never
// fail: the slot's state stays known and /readyz true.
func TestRoleTimersDoNotReachOurSessions(t *testing.T) {
	f := testenv.NewFixture(t)
	ctx := context.Background()
	// Statements and idle transactions may last 1 ms: every count, sort and FETCH of 20,000 rows takes
	// longer, and the second snapshot transaction idles while the first one counts. Sessions may idle
	// 300 ms, transactions last 300 ms (resync's last the whole snapshot).
	timers := []string{"statement_timeout = '1ms'", "lock_timeout = '1ms'", "idle_in_transaction_session_timeout = '1ms'", "idle_session_timeout = '300ms'"}
	var version int
	if err := f.DB.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		t.Fatal(err)
	}
	if version >= 170000 {
		timers = append(timers, "transaction_timeout = '300ms'")
	}
	cfg := testConfig(f)
	cfg.Postgres.URL = roleWithSettings(t, f, timers...)
	evs := testenv.Preload(t, f, testenv.NewGenerator(5, "Timed"), 20000)

	p, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	res, err := p.Resync(ctx, ResyncOptions{Yes: true, SnapshotOnly: true})
	if err != nil {
		t.Fatalf("resync under the role's timers: %v", err)
	}
	if res.Rows != int64(len(evs)) {
		t.Fatalf("resync published %d snapshot rows, want %d", res.Rows, len(evs))
	}
	got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Timed"), len(evs), time.Minute)
	testenv.VerifyDelivery(t, f, evs, got)

	// run: both the monitor (every 5 s) and the verifier (every 0.5 s) idle longer than 300 ms.
	log := &testenv.LogBuffer{}
	started := time.Now()
	run := startPipelineLogged(t, cfg, testLoggerTo(t, log))
	more := testenv.NewGenerator(5, "Timed").WithPrefix("after-")
	var after []testenv.Event
	for i := range 20 {
		after = append(after, more.Event(i))
	}
	if err := testenv.InsertTx(ctx, f.DB, f.Table, after, true); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the slot monitor's second poll", func() bool {
		h := run.p.Health()
		return h.SlotMonitorErrors > 0 || h.SlotMonitorLastSuccess.After(started.Add(slotPollInterval))
	})
	if h := run.p.Health(); h.SlotMonitorErrors != 0 || !h.Ready {
		t.Errorf("slot monitor errors %d, ready %t (%s): the role's idle_session_timeout ended the monitor's connection between polls", h.SlotMonitorErrors, h.Ready, h.NotReady)
	}
	got = testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Timed"), len(evs)+len(after), time.Minute)
	testenv.VerifyDelivery(t, f, append(evs, after...), got)
	if err := run.stop(); err != nil {
		t.Fatalf("run: %v", err)
	}
	if s := log.String(); strings.Contains(s, "cannot verify") || strings.Contains(s, "level=WARN") {
		t.Errorf("run warned under the role's timers:\n%s", s)
	}
}
