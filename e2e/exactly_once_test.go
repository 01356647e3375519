package e2e

import (
	"context"
	"math/rand/v2"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// eosEnv is routerEnv in exactly-once mode with the fixture's own checkpoint topic.
func eosEnv(f *testenv.Fixture) []string {
	return append(routerEnv(f), "OUTBOX_CDC_DELIVERY=exactly-once")
}

// TestExactlyOnceUnderKills SIGKILLs the exactly-once router 20 times at random moments while single
// rows, 100-row transactions, rows deleted by their own transaction and a 5,000-row COPY are written:
// a read_committed consumer must see every committed event exactly once, per aggregate in commit
// order. The duplicates a read_uncommitted consumer sees (records of aborted transactions) are
// printed for comparison.
func TestExactlyOnceUnderKills(t *testing.T) {
	f := testenv.NewFixture(t)
	env := eosEnv(f)
	gen := testenv.NewGenerator(40, "PaymentAuthorized", "PaymentCaptured")
	topics := testenv.TopicsOf(f, "PaymentAuthorized", "PaymentCaptured")
	ctx := context.Background()

	r := startRouter(t, env)
	r.waitLog(t, "streaming", 60*time.Second)

	// Writers: single rows and 100-row transactions (a third deleted by their own transaction) in
	// one connection, and one 5,000-row COPY in the middle of the kills.
	var mu sync.Mutex
	var all []testenv.Event
	stop := make(chan struct{})
	writerDone := make(chan error, 1)
	go func() {
		rng := rand.New(rand.NewPCG(7, 11))
		for i := 0; ; i++ {
			select {
			case <-stop:
				writerDone <- nil
				return
			default:
			}
			n := 1
			if rng.IntN(4) == 0 {
				n = 100
			}
			mu.Lock() // the generator and the connection are shared with the COPY
			evs := make([]testenv.Event, n)
			for j := range evs {
				evs[j] = gen.Event(rng.IntN(40))
			}
			err := testenv.InsertTx(ctx, f.DB, f.Table, evs, rng.IntN(3) == 0)
			if err == nil {
				all = append(all, evs...)
			}
			mu.Unlock()
			if err != nil {
				writerDone <- err
				return
			}
			time.Sleep(time.Duration(rng.IntN(5)) * time.Millisecond)
		}
	}()

	const kills = 20
	rng := rand.New(rand.NewPCG(3, 5))
	for k := 0; k < kills; k++ {
		if k == kills/2 {
			mu.Lock()
			copied := make([]testenv.Event, 5000)
			for i := range copied {
				copied[i] = gen.Event(rng.IntN(40))
			}
			_, err := copyEvents(ctx, f.DB, f.Table, copied)
			if err == nil {
				all = append(all, copied...)
			}
			mu.Unlock()
			if err != nil {
				t.Fatal(err)
			}
		}
		// A random moment: sometimes during start-up, mostly while streaming.
		if rng.IntN(4) != 0 {
			r.waitLog(t, "streaming", 60*time.Second)
		}
		time.Sleep(time.Duration(50+rng.IntN(1500)) * time.Millisecond)
		r = r.killAndRestart(t, env)
	}
	close(stop)
	if err := <-writerDone; err != nil {
		t.Fatal(err)
	}
	r.waitLog(t, "streaming", 60*time.Second)
	mu.Lock()
	want := append([]testenv.Event(nil), all...)
	mu.Unlock()

	got := testenv.ConsumeDistinct(t, f.Brokers, topics, len(want), 3*time.Minute, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	dups := testenv.VerifyDelivery(t, f, want, got)
	if dups != 0 {
		t.Errorf("a read_committed consumer saw %d duplicates after %d kills, want 0", dups, kills)
	}
	uncommitted := testenv.ConsumeDistinct(t, f.Brokers, topics, len(want), time.Minute, kgo.FetchIsolationLevel(kgo.ReadUncommitted()))
	rep := testenv.CheckDelivery(f.TopicPrefix, want, uncommitted)
	t.Logf("%d events, %d kills: read_committed saw %d records (%d duplicates); read_uncommitted saw %d records (%d duplicates from aborted transactions)",
		len(want), kills, len(got), dups, len(uncommitted), rep.Duplicates)
}

// TestExactlyOnceFencing freezes the active exactly-once router (SIGSTOP) with a Kafka transaction
// open, ends its walsender as wal_sender_timeout would, lets the standby take the slot over, and
// resumes the frozen one (SIGCONT): it must not make a single record visible to a read_committed
// consumer, and it must say it was fenced and wait as a standby.
func TestExactlyOnceFencing(t *testing.T) {
	f := testenv.NewFixture(t)
	ctx := context.Background()
	// A long transaction interval (and no commit on a quiet stream) keeps the frozen router's Kafka
	// transaction open, its records already acknowledged, when it is stopped, however slow the
	// machine; the standby commits as usual once it has taken over.
	active := startRouter(t, append(eosEnv(f), "OUTBOX_CDC_TRANSACTION_INTERVAL=50s", "OUTBOX_CDC_TRANSACTION_TIMEOUT=2m", "OUTBOX_CDC_QUIET_FLUSH=0"))
	active.waitLog(t, "streaming", 60*time.Second)
	standby := startRouter(t, eosEnv(f))
	standby.waitLog(t, "hot standby", 60*time.Second)

	gen := testenv.NewGenerator(10, "ShipmentBooked")
	topics := testenv.TopicsOf(f, "ShipmentBooked")
	var all []testenv.Event
	write := func(n int) {
		for i := 0; i < n; i++ {
			evs := []testenv.Event{gen.Event(i), gen.Event(i + 1)}
			if err := testenv.InsertTx(ctx, f.DB, f.Table, evs, i%2 == 0); err != nil {
				t.Fatal(err)
			}
			all = append(all, evs...)
		}
	}
	write(100)
	testenv.ConsumeDistinct(t, f.Brokers, topics, len(all), time.Minute, kgo.FetchIsolationLevel(kgo.ReadUncommitted())) // produced, not yet committed
	if err := active.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var ended bool
	if err := f.DB.QueryRow(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active", f.Slot).Scan(&ended); err != nil || !ended {
		t.Fatalf("end the frozen router's walsender: %v (ended %t)", err, ended)
	}
	standby.waitLog(t, "took over", 60*time.Second)
	write(100)
	got := testenv.ConsumeDistinct(t, f.Brokers, topics, len(all), time.Minute, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err := active.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	active.waitLog(t, "hot standby", 60*time.Second)
	if !strings.Contains(active.log(), "fenced") {
		t.Errorf("the resumed router did not say it was fenced")
	}
	write(50)
	got = testenv.ConsumeDistinct(t, f.Brokers, topics, len(all), time.Minute, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if dups := testenv.VerifyDelivery(t, f, all, got); dups != 0 {
		t.Errorf("a read_committed consumer saw %d duplicates across the takeover, want 0", dups)
	}
}

// TestExactlyOnceGapCLI drops and re-creates the slot while the exactly-once router is stopped, with
// rows written in between: status exits 1 naming the gap, run exits 1 naming both positions, run
// --accept-gap streams, and resync --yes --snapshot-only publishes the rows still in the table.
func TestExactlyOnceGapCLI(t *testing.T) {
	f := testenv.NewFixture(t)
	env := eosEnv(f)
	ctx := context.Background()
	gen := testenv.NewGenerator(5, "RefundIssued")
	topics := testenv.TopicsOf(f, "RefundIssued")
	r := startRouter(t, env)
	r.waitLog(t, "streaming", 60*time.Second)
	first := []testenv.Event{gen.Event(0)}
	if err := testenv.InsertTx(ctx, f.DB, f.Table, first, false); err != nil {
		t.Fatal(err)
	}
	testenv.ConsumeDistinct(t, f.Brokers, topics, 1, time.Minute, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := r.exitCode(t, time.Minute); code != 0 {
		t.Fatalf("SIGTERM: exit %d", code)
	}
	adminExec(t, f, "SELECT pg_drop_replication_slot('"+f.Slot+"')")
	gap := []testenv.Event{gen.Event(1), gen.Event(2)}
	if err := testenv.InsertTx(ctx, f.DB, f.Table, gap, false); err != nil {
		t.Fatal(err)
	}
	adminExec(t, f, "SELECT pg_create_logical_replication_slot('"+f.Slot+"', 'pgoutput')")

	out, code := runCLI(t, env, time.Minute, "status")
	if code == 0 || !strings.Contains(out, "ahead of the last checkpoint") || !strings.Contains(out, "checkpoint") {
		t.Fatalf("status with the slot ahead of the checkpoint: exit %d\n%s", code, out)
	}
	// init says what run would: not "ok".
	out, code = runCLI(t, env, time.Minute, "init")
	if code == 0 || !strings.Contains(out, "FIX") || !strings.Contains(out, "ahead of the last checkpoint") {
		t.Fatalf("init with the slot ahead of the checkpoint: exit %d, want a failure naming the gap\n%s", code, out)
	}
	out, code = runCLI(t, env, time.Minute, "run")
	if code != 1 || !strings.Contains(out, "ahead of the last checkpoint") || !strings.Contains(out, "--accept-gap") {
		t.Fatalf("run with the slot ahead of the checkpoint: exit %d, want 1 naming the gap\n%s", code, out)
	}
	accepted := startRouter(t, env, "--accept-gap")
	accepted.waitLog(t, "streaming", 60*time.Second)
	later := []testenv.Event{gen.Event(3)}
	if err := testenv.InsertTx(ctx, f.DB, f.Table, later, false); err != nil {
		t.Fatal(err)
	}
	testenv.ConsumeDistinct(t, f.Brokers, topics, 2, time.Minute, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err := accepted.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	accepted.exitCode(t, time.Minute)
	if out, code := runCLI(t, env, 3*time.Minute, "resync", "--yes", "--snapshot-only"); code != 0 {
		t.Fatalf("resync: exit %d\n%s", code, out)
	}
	all := append(append(append([]testenv.Event(nil), first...), gap...), later...)
	got := testenv.ConsumeDistinct(t, f.Brokers, topics, len(all), time.Minute, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	rep := testenv.CheckDelivery(f.TopicPrefix, all, got)
	if rep.Missing != 0 {
		t.Fatalf("after resync %d events are missing: %v", rep.Missing, rep.Problems)
	}
	if out, code := runCLI(t, env, time.Minute, "status"); strings.Contains(out, "ahead of the last checkpoint") {
		t.Fatalf("status after resync still reports a gap (exit %d)\n%s", code, out)
	}
	if out, code := runCLI(t, env, time.Minute, "init"); code != 0 || !strings.Contains(out, "checkpoint topic") {
		t.Fatalf("init after resync: exit %d, want 0 with the checkpoint topic checked\n%s", code, out)
	}
}
