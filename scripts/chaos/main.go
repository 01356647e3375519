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
	"math/rand/v2"
	"os"
	"os/exec"
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
	"github.com/outbox-cdc/outbox-cdc/internal/freeport"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// fault kinds, in the order the summary prints them.
var kinds = []string{"kill", "term", "kafka", "pg_fast", "pg_immediate", "cut", "blackhole"}

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

// faultAt is one injected fault: its kind, when it began and when it ended (the router restarted,
// the service back); end is zero while it runs.
type faultAt struct {
	kind string
	at   time.Time
	end  time.Time
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

// duplicatesByFault says how many duplicate records each kind of fault caused, and how many per
// fault of that kind. A duplicate is put down to the first fault that had not ended when its event
// was committed: the fault under way then (a broker that writes what it is sent while it stops, and
// whose acknowledgements are lost with it), or else the next one (the event was sent before it, and
// the replay after it sent it again). An event sent twice with no fault ending after its commit
// counts as "none" (a needless duplicate).
func (s *suite) duplicatesByFault(got []*kgo.Record) string {
	return duplicatesByFault(got, s.committed, s.commitAt, s.faultLog, s.kinds)
}

// duplicatesByFault is suite.duplicatesByFault over the run's committed events (per writer), their
// commit times, the faults in order and the kinds the run injects.
func duplicatesByFault(got []*kgo.Record, committed [][]testenv.Event, commitAt [][]time.Time, faultLog []faultAt, kinds []string) string {
	copies := map[string]int{}
	for _, r := range got {
		copies[testenv.EventID(r)]++
	}
	byKind := map[string]int{}
	for w, evs := range committed {
		for i, e := range evs {
			n := copies[e.ID]
			if n < 2 {
				continue
			}
			at := commitAt[w][i]
			// Faults run one after the other, so their ends are in order too; a fault still running
			// (no end) is the last one.
			j, _ := slices.BinarySearchFunc(faultLog, at, func(f faultAt, t time.Time) int {
				if f.end.IsZero() {
					return 1
				}
				return f.end.Compare(t)
			})
			kind := "none"
			if j < len(faultLog) {
				kind = faultLog[j].kind
			}
			byKind[kind] += n - 1
		}
	}
	injected := map[string]int{}
	for _, f := range faultLog {
		injected[f.kind]++
	}
	var parts []string
	for _, k := range append(slices.Clone(kinds), "none") {
		if k == "none" && byKind[k] == 0 {
			continue
		}
		part := fmt.Sprintf("%s:%d", k, byKind[k])
		if n := injected[k]; n > 0 {
			part += fmt.Sprintf(" (%.0f per fault)", float64(byKind[k])/float64(n))
		}
		parts = append(parts, part)
	}
	return "duplicates by fault: " + strings.Join(parts, ", ")
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

// faultBag is a shuffled round of faults: every kind once, plus what the minimums still need in
// proportion (kills dominate a long run).
func (s *suite) faultBag() []string {
	bag := slices.Clone(s.kinds)
	for k, min := range s.o.minimum {
		for i := s.faults[k] + 1; i < min && len(bag) < 40; i += len(s.kinds) {
			bag = append(bag, k)
		}
	}
	rand.Shuffle(len(bag), func(i, j int) { bag[i], bag[j] = bag[j], bag[i] })
	return bag
}

// inject runs one fault, then waits until the router has confirmed everything committed before the
// fault ended.
func (s *suite) inject(ctx context.Context, kind string) error {
	s.faultLog = append(s.faultLog, faultAt{kind: kind, at: time.Now()})
	var err error
	switch kind {
	case "kill", "term":
		sig := syscall.SIGKILL
		if kind == "term" {
			sig = syscall.SIGTERM
		}
		if code := s.router.stop(sig); kind == "term" && code != 0 {
			s.unrecovered = append(s.unrecovered, fmt.Sprintf("SIGTERM exit code %d, want 0", code))
		}
		time.Sleep(time.Duration(rand.IntN(1500)) * time.Millisecond)
		s.router, err = s.startRouter()
	case "kafka":
		if err = services("kafka-stop"); err == nil {
			time.Sleep(time.Duration(3+rand.IntN(8)) * time.Second)
			err = services("kafka-start")
		}
	case "pg_fast":
		err = services("pg-restart", "fast")
	case "pg_immediate":
		err = services("pg-restart", "immediate")
	case "cut":
		s.proxy.Cut()
	case "blackhole":
		s.proxy.BlackHole()
	case "failover":
		err = s.failover(ctx)
	}
	if err != nil {
		return err
	}
	s.faults[kind]++
	end := time.Now()
	s.faultLog[len(s.faultLog)-1].end = end
	target := s.currentLSN(ctx)
	if err := s.waitCaughtUp(ctx, target, s.o.recoverWait); err != nil {
		s.unrecovered = append(s.unrecovered, fmt.Sprintf("%s at %s: %v", kind, end.Format(time.TimeOnly), err))
		return nil
	}
	s.recoveries = append(s.recoveries, time.Since(end))
	return nil
}

func services(args ...string) error {
	out, err := exec.Command("bash", append([]string{"scripts/services.sh"}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("scripts/services.sh %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
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

// write commits transactions of one to five events at the writer's share of the rate, deleting the
// rows in the same transaction half of the time, until ctx ends. Only what was seen committed (or
// found committed after an unknown outcome) is recorded.
func (s *suite) write(ctx context.Context, w int) {
	gen := testenv.NewGenerator(20, "OrderPlaced", "OrderPaid").WithPrefix(fmt.Sprintf("w%d-", w))
	var db *pgx.Conn
	defer func() {
		if db != nil {
			_ = db.Close(context.Background())
		}
	}()
	pause := time.Duration(float64(time.Second) * 3 / (float64(s.o.rate) / 2))
	for i := 0; ctx.Err() == nil; i++ {
		if db == nil || db.IsClosed() {
			c, err := pgx.Connect(ctx, s.pgURL)
			if err != nil {
				time.Sleep(200 * time.Millisecond)
				continue
			}
			db = c
		}
		evs := make([]testenv.Event, 1+rand.IntN(5))
		for j := range evs {
			evs[j] = gen.Event(rand.IntN(20))
		}
		txid := testenv.NewUUID()
		committed, known := s.commit(ctx, db, evs, txid, rand.IntN(2) == 0, s.o.messages && w == 1)
		if !known {
			_ = db.Close(context.Background())
			db = nil
			committed = s.lookup(txid)
		}
		if committed {
			now := time.Now()
			s.mu.Lock()
			s.committed[w] = append(s.committed[w], evs...)
			for range evs {
				s.txids[w] = append(s.txids[w], txid)
				s.commitAt[w] = append(s.commitAt[w], now)
			}
			s.mu.Unlock()
		}
		time.Sleep(pause)
	}
}

// newLedger empties the record of what the two writers committed (events, transaction ids, commit times).
func (s *suite) newLedger() {
	s.committed, s.txids, s.commitAt = make([][]testenv.Event, 2), make([][]string, 2), make([][]time.Time, 2)
}

// commit writes evs in one transaction, as rows (deleted again with deleteAfter) or as WAL messages
// (asMessages). known is false when the connection failed at the commit, so that the outcome must be
// looked up.
func (s *suite) commit(ctx context.Context, db *pgx.Conn, evs []testenv.Event, txid string, deleteAfter, asMessages bool) (committed, known bool) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return false, !db.IsClosed()
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if asMessages {
		if err := testenv.EmitIn(ctx, tx, messagePrefix, evs); err != nil {
			return false, !db.IsClosed()
		}
		evs = nil
	}
	for _, e := range evs {
		if _, err := tx.Exec(ctx, `INSERT INTO `+s.table+` (event_id, event_type, aggregate_type, aggregate_id, aggregate_version, payload, headers)
			VALUES ($1, $2, $3, $4, $5, $6, $7)`, e.ID, e.Type, e.AggType, e.AggID, e.Version, e.Payload, e.Headers); err != nil {
			return false, !db.IsClosed()
		}
		if deleteAfter {
			if _, err := tx.Exec(ctx, `DELETE FROM `+s.table+` WHERE event_id = $1`, e.ID); err != nil {
				return false, !db.IsClosed()
			}
		}
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+s.table+"_txlog (id) VALUES ($1)", txid); err != nil {
		return false, !db.IsClosed()
	}
	if err := tx.Commit(ctx); err != nil {
		return false, false
	}
	return true, true
}

// lookup says whether the transaction txid committed, once the database answers again.
// It does not use the writers' context, which ends when they stop, possibly with a commit unresolved.
func (s *suite) lookup(txid string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var found bool
	if err := s.admin(ctx, func(c *pgx.Conn) error {
		return c.QueryRow(ctx, "SELECT EXISTS (SELECT FROM "+s.table+"_txlog WHERE id = $1)", txid).Scan(&found)
	}); err != nil {
		fmt.Fprintln(os.Stderr, "chaos: cannot resolve a commit's outcome:", err)
	}
	return found
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

// messagePrefix is the prefix of the WAL messages the second writer emits (-messages).
const messagePrefix = "chaos-outbox"

// routerProc is a running outbox-cdc process.
type routerProc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func (s *suite) startRouter() (*routerProc, error) {
	proxied := s.pgURL
	if s.proxy != nil {
		var err error
		if proxied, err = s.proxy.URL(s.pgURL); err != nil {
			return nil, err
		}
	}
	port, err := freeport.Loopback()
	if err != nil {
		return nil, err
	}
	metrics := fmt.Sprintf("127.0.0.1:%d", port)
	logFile, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(s.o.binary, "run")
	cmd.Env = append(os.Environ(),
		"OUTBOX_CDC_POSTGRES="+proxied, "OUTBOX_CDC_BROKERS="+strings.Join(s.brokers, ","),
		"OUTBOX_CDC_TABLE="+s.table, "OUTBOX_CDC_SLOT="+s.slot, "OUTBOX_CDC_PUBLICATION="+s.pub,
		"OUTBOX_CDC_TOPIC="+s.pfx+".{event_type}", "OUTBOX_CDC_STATUS_INTERVAL=2s", "OUTBOX_CDC_RECEIVE_TIMEOUT=5s",
		"OUTBOX_CDC_STANDBY_POLL_INTERVAL=500ms", "OUTBOX_CDC_SHUTDOWN_TIMEOUT=10s", "OUTBOX_CDC_LOG_FORMAT=json",
		"OUTBOX_CDC_METRICS_ADDR="+metrics, "OUTBOX_CDC_DELIVERY="+s.o.delivery, "OUTBOX_CDC_CHECKPOINT_TOPIC="+s.pfx+".checkpoints",
		// The delivery checker reads the record timestamp as the order of production.
		"OUTBOX_CDC_RECORD_TIMESTAMP=produce", "OUTBOX_CDC_MESSAGE_PREFIXES="+messagePrefix)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", s.o.binary, err)
	}
	r := &routerProc{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logFile.Close()
		close(r.done)
	}()
	return r, nil
}

// stop signals the process and waits for it; it returns the exit code.
func (r *routerProc) stop(sig syscall.Signal) int {
	select {
	case <-r.done:
		return r.cmd.ProcessState.ExitCode()
	default:
	}
	_ = r.cmd.Process.Signal(sig)
	select {
	case <-r.done:
	case <-time.After(60 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.done
	}
	return r.cmd.ProcessState.ExitCode()
}
