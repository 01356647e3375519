// Command chaos runs outbox-cdc against the local services (make up) while it injects the faults
// production sees — the router SIGKILLed and SIGTERMed, the broker stopped, PostgreSQL restarted (fast
// and immediate), the router's database connections cut and black-holed — and writers commit events
// throughout. Afterwards an independent consumer reads everything back and one line says what
// happened: events, lost, order violations, duplicates, faults of each kind, and the time from each
// fault's end until the router had confirmed everything committed before that moment.
//
// It exits 1 if anything was lost, arrived out of order or wrong, or a fault was not recovered from.
//
//	go run ./scripts/chaos                 # short mode: about two and a half minutes of faults
//	go run ./scripts/chaos -delivery exactly-once   # the same in exactly-once mode: any duplicate fails
//	go run ./scripts/chaos -long           # 1,000,000 events, 50 kills, 5 broker and 3 PostgreSQL restarts, 10 network faults
//	go run ./scripts/chaos -failover 3     # three primary failovers on a PostgreSQL 17 primary and standby (failover.go)
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/internal/faultnet"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

type options struct {
	duration    time.Duration
	events      int
	every       time.Duration
	rate        int
	binary      string
	minimum     map[string]int
	recoverWait time.Duration
	delivery    string
	failover    int
	messages    bool
}

func main() {
	long := flag.Bool("long", false, "long mode: at least 1,000,000 events, 50 kills, 5 broker restarts, 3 PostgreSQL restarts, 10 network faults")
	o := options{minimum: map[string]int{}}
	flag.DurationVar(&o.duration, "duration", 150*time.Second, "inject faults for at least this long (and, in the default mode, until every fault kind ran once)")
	flag.IntVar(&o.events, "events", 0, "and until at least this many events are committed")
	flag.DurationVar(&o.every, "every", 5*time.Second, "pause between faults")
	flag.IntVar(&o.rate, "rate", 400, "events per second written (two writers)")
	flag.StringVar(&o.binary, "binary", "bin/outbox-cdc", "the outbox-cdc binary")
	flag.DurationVar(&o.recoverWait, "recover-timeout", 2*time.Minute, "longest wait for the router to catch up after a fault")
	flag.StringVar(&o.delivery, "delivery", "at-least-once", "kafka.delivery of the router: at-least-once, or exactly-once (read back with read_committed; any duplicate fails the run)")
	flag.BoolVar(&o.messages, "messages", true, "the second writer writes its events as WAL messages (pg_logical_emit_message, postgres.message_prefixes), the first as rows (not with -fleet: its sources share one database)")
	fleet := flag.Int("fleet", 0, "instead of the other faults, this many sources shared by three instances (the consumer group), an instance killed and replaced at every fault")
	flag.IntVar(&o.failover, "failover", 0, "instead of the other faults, this many primary failovers on a PostgreSQL 17 primary and standby of the run's own")
	flag.Parse()
	if *fleet > 0 {
		// The fleet's sources share one database, and every slot of a database decodes every WAL
		// message: one prefix read by several sources would deliver each message from all of them.
		o.messages = false
	}
	if o.delivery != "at-least-once" && o.delivery != "exactly-once" {
		fmt.Fprintln(os.Stderr, "chaos: -delivery must be at-least-once or exactly-once")
		os.Exit(2)
	}
	if *long {
		o.duration, o.events, o.every, o.rate = 0, 1_000_000, 7*time.Second, 1500
		o.minimum = map[string]int{"kill": 50, "term": 5, "kafka": 5, "pg_fast": 2, "pg_immediate": 1, "cut": 5, "blackhole": 5}
	}
	if o.failover > 0 {
		o.duration, o.minimum = 0, map[string]int{"failover": o.failover}
	}
	if !*long && o.failover == 0 && *fleet == 0 {
		// However short the run, every fault kind is injected at least once.
		for _, k := range kinds {
			o.minimum[k] = max(o.minimum[k], 1)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var ok bool
	var err error
	if *fleet > 0 {
		ok, err = runFleet(ctx, o, *fleet)
	} else {
		ok, err = run(ctx, o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}

// env reads the local services' settings from the environment, else from .dev/env.
func env() (map[string]string, error) {
	out := map[string]string{}
	f, err := os.Open(".dev/env")
	if err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "="); ok && !strings.HasPrefix(k, "#") {
				out[k] = v
			}
		}
	}
	for _, k := range []string{"OUTBOX_CDC_POSTGRES", "OUTBOX_CDC_BROKERS", "OUTBOX_CDC_TEST_ADMIN_POSTGRES"} {
		if v := os.Getenv(k); v != "" {
			out[k] = v
		}
		if out[k] == "" {
			return nil, fmt.Errorf("%s is not set and .dev/env lacks it: start the local services with `make up`", k)
		}
	}
	return out, nil
}

// suite is one chaos run's state.
type suite struct {
	o                     options
	pgURL, adminURL       string
	brokers               []string
	table, pub, slot, pfx string
	proxy                 *faultnet.Proxy
	router                *routerProc
	logPath               string
	mu                    sync.Mutex
	committed             [][]testenv.Event // per writer, in commit order
	txids                 [][]string        // per writer, each committed event's transaction id
	commitAt              [][]time.Time     // per writer, when each committed event's commit returned
	faultLog              []faultAt         // every fault injected, in order
	kinds                 []string          // the run's fault kinds
	clusters              *clusters         // the failover run's servers
	primary, standby      *testenv.Cluster
	standbys              int
	faults                map[string]int
	recoveries            []time.Duration
	unrecovered           []string
}

func run(ctx context.Context, o options) (bool, error) {
	e, err := env()
	if err != nil {
		return false, err
	}
	id := fmt.Sprintf("%x", time.Now().Unix())
	s := &suite{o: o, pgURL: e["OUTBOX_CDC_POSTGRES"], adminURL: e["OUTBOX_CDC_TEST_ADMIN_POSTGRES"], brokers: strings.Split(e["OUTBOX_CDC_BROKERS"], ","),
		table: "public.chaos_" + id, pub: "chaos_" + id, slot: "chaos_" + id, pfx: "chaos-" + id, faults: map[string]int{}, kinds: kinds}
	if err := os.MkdirAll(".dev/chaos", 0o755); err != nil {
		return false, err
	}
	s.logPath = filepath.Join(".dev/chaos", id+".router.log")
	if o.failover > 0 {
		s.kinds = failoverKinds
		err := s.startPair(ctx)
		if s.clusters != nil {
			defer s.clusters.close()
		}
		if err != nil {
			return false, fmt.Errorf("start a PostgreSQL 17 primary and standby: %w", err)
		}
	}
	if err := s.setup(ctx); err != nil {
		return false, err
	}
	defer s.cleanup()
	if o.failover == 0 {
		host := strings.Split(strings.SplitN(s.pgURL, "@", 2)[1], "/")[0]
		if s.proxy, err = faultnet.Start(host); err != nil {
			return false, err
		}
		defer s.proxy.Close()
	}
	if s.router, err = s.startRouter(); err != nil {
		return false, err
	}
	defer s.router.stop(syscall.SIGKILL)
	if err := s.waitCaughtUp(ctx, s.currentLSN(ctx), time.Minute); err != nil {
		return false, fmt.Errorf("the router did not start: %w (log: %s)", err, s.logPath)
	}

	start := time.Now()
	wctx, stopWriters := context.WithCancel(ctx)
	var writers sync.WaitGroup
	s.newLedger()
	for w := 0; w < 2; w++ {
		writers.Add(1)
		go func() {
			defer writers.Done()
			s.write(wctx, w)
		}()
	}
	bag := s.faultBag()
	for ctx.Err() == nil && !s.done(start) {
		select {
		case <-ctx.Done():
		case <-time.After(o.every):
		}
		if ctx.Err() != nil {
			break
		}
		if len(bag) == 0 {
			bag = s.faultBag()
		}
		kind := bag[0]
		bag = bag[1:]
		if err := s.inject(ctx, kind); err != nil {
			stopWriters()
			return false, fmt.Errorf("fault %s: %w", kind, err)
		}
	}
	stopWriters()
	writers.Wait()
	final := s.currentLSN(context.Background())
	caughtUp := s.waitCaughtUp(context.Background(), final, o.recoverWait)
	var want []testenv.Event
	lostAcked := 0
	var survived map[string]bool
	if o.failover > 0 {
		if survived, err = s.survivors(context.Background()); err != nil {
			return false, fmt.Errorf("read the last primary's transactions: %w", err)
		}
	}
	for w, evs := range s.committed {
		for i, e := range evs {
			if survived != nil && !survived[s.txids[w][i]] {
				lostAcked++ // acknowledged by a primary that died before its standby had it
				continue
			}
			want = append(want, e)
		}
	}
	got := s.consume(want)
	phantoms := 0
	if o.failover > 0 {
		// Events in Kafka whose transaction the last primary lacks.
		real, seen := testenv.SplitPhantoms(want, got)
		phantoms, got = len(seen), real
	}
	rep := testenv.CheckDelivery(s.pfx, want, got)
	s.router.stop(syscall.SIGTERM)

	slices.Sort(s.recoveries)
	median, worst := time.Duration(0), time.Duration(0)
	if n := len(s.recoveries); n > 0 {
		median, worst = s.recoveries[n/2], s.recoveries[n-1]
	}
	var counts []string
	for _, k := range s.kinds {
		counts = append(counts, fmt.Sprintf("%s:%d", k, s.faults[k]))
	}
	fmt.Printf("chaos: delivery=%s events=%d lost=%d order_violations=%d wrong=%d duplicates=%d faults=%s recovery_median=%s recovery_max=%s unrecovered=%d duration=%s\n",
		o.delivery, rep.Events, rep.Missing, rep.OrderViolations, rep.Wrong, rep.Duplicates, strings.Join(counts, ","),
		median.Round(10*time.Millisecond), worst.Round(10*time.Millisecond), len(s.unrecovered), time.Since(start).Round(time.Second))
	fmt.Println("  " + s.duplicatesByFault(got))
	for i, p := range rep.Problems {
		if i == 20 {
			fmt.Printf("  ... %d more\n", len(rep.Problems)-20)
			break
		}
		fmt.Println("  " + p)
	}
	if o.failover > 0 {
		fmt.Printf("  failover: phantom_events=%d acknowledged_commits_lost_with_a_primary=%d (asynchronous physical replication; not in the database, so not expected in Kafka)\n", phantoms, lostAcked)
	}
	for _, u := range s.unrecovered {
		fmt.Println("  not recovered: " + u)
	}
	if caughtUp != nil {
		fmt.Println("  at the end: " + caughtUp.Error())
	}
	ok := rep.Missing == 0 && rep.OrderViolations == 0 && rep.Wrong == 0 && len(s.unrecovered) == 0 && caughtUp == nil && phantoms == 0
	if o.delivery == "exactly-once" && rep.Duplicates > 0 {
		fmt.Printf("  exactly-once: a read_committed consumer saw %d duplicates\n", rep.Duplicates)
		ok = false
	}
	if !ok {
		fmt.Println("  router log: " + s.logPath)
	}
	return ok, nil
}

// done reports whether the run has lasted long enough, written enough and injected every fault the
// minimums ask for.
func (s *suite) done(start time.Time) bool {
	if time.Since(start) < s.o.duration {
		return false
	}
	s.mu.Lock()
	n := len(s.committed[0]) + len(s.committed[1])
	s.mu.Unlock()
	if n < s.o.events {
		return false
	}
	for k, min := range s.o.minimum {
		if s.faults[k] < min {
			return false
		}
	}
	return true
}

// admin runs fn on a fresh superuser connection, retrying while PostgreSQL restarts.
func (s *suite) admin(ctx context.Context, fn func(*pgx.Conn) error) error {
	var err error
	for i := 0; i < 600 && ctx.Err() == nil; i++ {
		var c *pgx.Conn
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		c, err = pgx.Connect(cctx, s.adminURL)
		if err == nil {
			err = fn(c)
			_ = c.Close(context.Background())
		}
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return err
}

func (s *suite) currentLSN(ctx context.Context) pglogrepl.LSN {
	var lsn pglogrepl.LSN
	_ = s.admin(ctx, func(c *pgx.Conn) error {
		var text string
		if err := c.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&text); err != nil {
			return err
		}
		var err error
		lsn, err = pglogrepl.ParseLSN(text)
		return err
	})
	return lsn
}

// waitCaughtUp waits until the slot's confirmed position reaches target.
func (s *suite) waitCaughtUp(ctx context.Context, target pglogrepl.LSN, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var confirmed pglogrepl.LSN
	for time.Now().Before(deadline) && ctx.Err() == nil {
		_ = s.admin(ctx, func(c *pgx.Conn) error {
			var text *string
			if err := c.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", s.slot).Scan(&text); err != nil {
				return err
			}
			if text != nil {
				confirmed, _ = pglogrepl.ParseLSN(*text)
			}
			return nil
		})
		if confirmed >= target {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("slot confirmed %s, not %s, after %s", confirmed, target, timeout)
}

func (s *suite) setup(ctx context.Context) error {
	script, err := os.ReadFile("sql/outbox.sql")
	if err != nil {
		return err
	}
	sql := strings.ReplaceAll(string(script), "public.outbox", s.table)
	sql = strings.ReplaceAll(sql, "'outbox_cdc'", "'"+s.pub+"'")
	sql = strings.ReplaceAll(sql, "PUBLICATION outbox_cdc", "PUBLICATION "+s.pub)
	db, err := pgx.Connect(ctx, s.pgURL)
	if err != nil {
		return err
	}
	defer db.Close(context.Background())
	if _, err := db.Exec(ctx, sql); err != nil {
		return fmt.Errorf("apply sql/outbox.sql: %w", err)
	}
	// Each writer transaction also records its id here, so that a commit whose outcome was lost
	// with the connection can be looked up.
	_, err = db.Exec(ctx, "CREATE TABLE "+s.table+"_txlog (id uuid PRIMARY KEY)")
	return err
}

func (s *suite) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_ = s.admin(ctx, func(c *pgx.Conn) error {
		_, _ = c.Exec(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL", s.slot)
		time.Sleep(500 * time.Millisecond)
		_, _ = c.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", s.slot)
		_, _ = c.Exec(ctx, "DROP PUBLICATION IF EXISTS "+s.pub)
		_, _ = c.Exec(ctx, "DROP TABLE IF EXISTS "+s.table+", "+s.table+"_txlog")
		return nil
	})
}

// consume reads every record of the suite's topics until each committed event was seen (and a few
// seconds more, for trailing duplicates) or three minutes passed.
func (s *suite) consume(want []testenv.Event) []*kgo.Record {
	ids := make(map[string]bool, len(want))
	for _, e := range want {
		ids[e.ID] = true
	}
	opts := []kgo.Opt{kgo.SeedBrokers(s.brokers...), kgo.ConsumeTopics(s.pfx+".OrderPlaced", s.pfx+".OrderPaid"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(200 * time.Millisecond)}
	if s.o.delivery == "exactly-once" {
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos: consumer:", err)
		return nil
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out []*kgo.Record
	var doneAt time.Time
	for ctx.Err() == nil && (doneAt.IsZero() || time.Since(doneAt) < 3*time.Second) {
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		fetches := cl.PollFetches(pctx)
		pcancel()
		fetches.EachRecord(func(r *kgo.Record) {
			out = append(out, r)
			delete(ids, testenv.Header(r, "event_id"))
		})
		if len(ids) == 0 && doneAt.IsZero() {
			doneAt = time.Now()
		}
	}
	return out
}
