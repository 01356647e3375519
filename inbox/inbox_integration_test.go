package inbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// fixture is one test's database tables and topics on the real services.
type fixture struct {
	pool            *pgxpool.Pool
	brokers         []string
	name            string // unique: table, topic and group names derive from it
	topic, dlq      string
	table, applied  string // the inbox table and the test's own "effects" table
	producer        *kgo.Client
	mu              sync.Mutex
	producedByEvent map[string]int
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	brokers := testenv.Brokers(t)
	admin := testenv.AdminURL(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	name := fmt.Sprintf("inbox_%s_%x", strings.ToLower(strings.NewReplacer("/", "_", " ", "_", "=", "_").Replace(t.Name())), time.Now().UnixNano()&0xffffff)
	if len(name) > 50 {
		name = name[len(name)-50:]
		name = "i" + strings.TrimLeft(name, "_")
	}
	f := &fixture{pool: pool, brokers: brokers, name: name, topic: "t." + name, dlq: "t." + name + ".dlq",
		table: "public." + name, applied: "public." + name + "_effects", producedByEvent: map[string]int{}}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+f.applied+" (event_id text NOT NULL, aggregate_id text NOT NULL, version bigint, n bigint NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+f.applied+", "+f.table+", "+f.table+"_versions")
	})
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	f.producer = cl
	adm := kadm.NewClient(cl)
	if _, err := adm.CreateTopic(ctx, 3, 1, nil, f.topic); err != nil {
		t.Fatal(err)
	}
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, f.dlq); err != nil {
		t.Fatal(err)
	}
	return f
}

// event is one record the test produces.
type event struct {
	id, agg string
	version int64 // 0: no version header
	n       int
}

// produce writes evs to the fixture's topic in order, keyed by aggregate.
func (f *fixture) produce(t *testing.T, evs ...event) {
	t.Helper()
	if err := f.tryProduce(evs...); err != nil {
		t.Fatal(err)
	}
}

// tryProduce is produce for goroutines other than the test's.
func (f *fixture) tryProduce(evs ...event) error {
	recs := make([]*kgo.Record, len(evs))
	for i, e := range evs {
		r := &kgo.Record{Topic: f.topic, Key: []byte(e.agg), Value: []byte(fmt.Sprintf(`{"n": %d}`, e.n)),
			Headers: []kgo.RecordHeader{{Key: "event_id", Value: []byte(e.id)}, {Key: "event_type", Value: []byte("Counted")}, {Key: "aggregate_type", Value: []byte("counter")}}}
		if e.version > 0 {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: "aggregate_version", Value: []byte(strconv.FormatInt(e.version, 10))})
		}
		recs[i] = r
		f.mu.Lock()
		f.producedByEvent[e.id]++
		f.mu.Unlock()
	}
	return f.producer.ProduceSync(context.Background(), recs...).FirstErr()
}

// record is the handler of the tests: it inserts one row per application into the effects table,
// so that an event applied twice shows up twice.
func (f *fixture) record(ctx context.Context, tx pgx.Tx, ev Event) error {
	var n struct {
		N int `json:"n"`
	}
	_, _ = fmt.Sscanf(string(ev.Payload), `{"n": %d}`, &n.N)
	_, err := tx.Exec(ctx, "INSERT INTO "+f.applied+" (event_id, aggregate_id, version, n) VALUES ($1, $2, $3, $4)", ev.ID, ev.AggregateID, ev.AggregateVersion, n.N)
	return err
}

func (f *fixture) options(handler Handler) Options {
	return Options{Consumer: "svc-" + f.name, DB: f.pool, Handler: handler, Brokers: f.brokers, Topics: []string{f.topic},
		Group: "g-" + f.name, Table: f.table, DeadLetterTopic: f.dlq, RetryBackoff: 5 * time.Millisecond, MaxRetryBackoff: 50 * time.Millisecond}
}

// start runs an inbox until the test ends or stop is called; stop returns Run's error.
func start(t *testing.T, o Options) (in *Inbox, stop func() error) {
	t.Helper()
	in, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Setup(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop = func() error {
		once.Do(func() {
			cancel()
			runErr = <-done
			in.Close()
		})
		return runErr
	}
	t.Cleanup(func() { _ = stop() })
	return in, stop
}

// applications returns how often each event was applied.
func (f *fixture) applications(t *testing.T) map[string]int {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), "SELECT event_id, count(*) FROM "+f.applied+" GROUP BY event_id")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		out[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// waitApplied waits until every id in want was applied (or handled otherwise, per done).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.WaitFor(t, time.Minute, what, cond)
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

// TestEachEventAppliedOnce: every event is produced twice (a producer's retry, or a relay's replay
// after a crash): each is applied once, and the second copies are counted as duplicates.
func TestEachEventAppliedOnce(t *testing.T) {
	f := newFixture(t)
	reg := prometheus.NewRegistry()
	o := f.options(f.record)
	o.Registerer = reg
	in, _ := start(t, o)
	var evs []event
	for i, id := range ids("e", 200) {
		evs = append(evs, event{id: id, agg: fmt.Sprintf("a%d", i%7), n: i})
	}
	f.produce(t, evs...)
	f.produce(t, evs...)
	// And copies right behind their originals, so that both fall in one batch (one transaction, the
	// claims pipelined).
	var adjacent []event
	for i, id := range ids("adjacent", 20) {
		e := event{id: id, agg: fmt.Sprintf("a%d", i%7), n: i}
		adjacent = append(adjacent, e, e)
		evs = append(evs, e)
	}
	f.produce(t, adjacent...)
	waitFor(t, "every event and its copy handled", func() bool { s := in.Stats(); return s.Applied+s.Duplicates >= 440 })
	got := f.applications(t)
	for _, e := range evs {
		if got[e.id] != 1 {
			t.Errorf("event %s applied %d times", e.id, got[e.id])
		}
	}
	if s := in.Stats(); s.Applied != 220 || s.Duplicates != 220 {
		t.Errorf("stats %+v, want 220 applied and 220 duplicates", s)
	}
	if v := testutil.ToFloat64(in.m.events.WithLabelValues(OutcomeDuplicate)); v != 220 {
		t.Errorf("outbox_inbox_events_total{outcome=duplicate} = %v", v)
	}
	if n, err := testutil.GatherAndCount(reg, "outbox_inbox_events_total"); err != nil || n != 4 {
		t.Errorf("registered outcome series: %d, %v", n, err)
	}
}

// TestStaleVersionsAreSkipped: per aggregate and topic, an event whose version is not above the
// last applied one is skipped and recorded as stale (a replay of an old event whose claim was
// pruned); events without a version are never stale.
func TestStaleVersionsAreSkipped(t *testing.T) {
	f := newFixture(t)
	in, _ := start(t, f.options(f.record))
	f.produce(t,
		event{id: "v1", agg: "a", version: 1}, event{id: "v3", agg: "a", version: 3}, event{id: "v2", agg: "a", version: 2},
		event{id: "v3-again", agg: "a", version: 3}, event{id: "b1", agg: "b", version: 1}, event{id: "none", agg: "a"})
	waitFor(t, "six events handled", func() bool { s := in.Stats(); return s.Applied+s.Stale >= 6 })
	got := f.applications(t)
	for id, want := range map[string]int{"v1": 1, "v3": 1, "v2": 0, "v3-again": 0, "b1": 1, "none": 1} {
		if got[id] != want {
			t.Errorf("event %s applied %d times, want %d", id, got[id], want)
		}
	}
	var outcome string
	if err := f.pool.QueryRow(context.Background(), "SELECT outcome FROM "+f.table+" WHERE event_id = 'v2'").Scan(&outcome); err != nil || outcome != OutcomeStale {
		t.Errorf("claim of v2: %q, %v; want stale", outcome, err)
	}
}

// TestStaleVersionsToTheDeadLetterTopic: with DeadLetterStale, a stale event is dead-lettered with
// the reason.
func TestStaleVersionsToTheDeadLetterTopic(t *testing.T) {
	f := newFixture(t)
	o := f.options(f.record)
	o.Stale = DeadLetterStale
	in, _ := start(t, o)
	f.produce(t, event{id: "s2", agg: "a", version: 2}, event{id: "s1", agg: "a", version: 1})
	waitFor(t, "both handled", func() bool { s := in.Stats(); return s.Applied+s.DeadLettered >= 2 })
	dead := testenv.Consume(t, f.brokers, []string{f.dlq}, 1, 30*time.Second)
	if len(dead) != 1 || testenv.Header(dead[0], "event_id") != "s1" || !strings.Contains(testenv.Header(dead[0], HeaderDLQReason), "stale") {
		t.Fatalf("dead letters: %d, first %v", len(dead), dead)
	}
}

// TestFlakyHandler: a handler that fails up to twice per event is retried with backoff and every
// event is applied once; an event whose handler always fails is dead-lettered after MaxAttempts
// with the reason, the attempts and where it was read, and the events behind it on its partition go on.
func TestFlakyHandler(t *testing.T) {
	// The poison pill fails MaxAttempts times, alone or in a batch (its failure in the batch is its
	// first attempt: it is neither run nor counted once more).
	t.Run("one transaction per event", func(t *testing.T) { testFlakyHandler(t, 1, 154) })
	t.Run("batches", func(t *testing.T) { testFlakyHandler(t, 0, 154) })
}

func testFlakyHandler(t *testing.T, batch int, wantFailures int64) {
	f := newFixture(t)
	var mu sync.Mutex
	tries := map[string]int{}
	flaky := func(ctx context.Context, tx pgx.Tx, ev Event) error {
		mu.Lock()
		tries[ev.ID]++
		n := tries[ev.ID]
		mu.Unlock()
		if ev.ID == "poison" {
			return errors.New("cannot parse the payload")
		}
		// Event i fails its first i%3 attempts: fewer than MaxAttempts.
		i, _ := strconv.Atoi(strings.TrimPrefix(ev.ID, "f-"))
		if n <= i%3 {
			return errors.New("transient failure")
		}
		return f.record(ctx, tx, ev)
	}
	o := f.options(flaky)
	o.MaxAttempts, o.BatchSize = 4, batch
	in, _ := start(t, o)
	var evs []event
	for i, id := range ids("f", 150) {
		evs = append(evs, event{id: id, agg: "a", version: int64(2 * i), n: i})
		if i == 70 {
			evs = append(evs, event{id: "poison", agg: "a", version: int64(2*i + 1)})
		}
	}
	f.produce(t, evs...)
	waitFor(t, "every event handled", func() bool { s := in.Stats(); return s.Applied+s.DeadLettered >= int64(len(evs)) })
	got := f.applications(t)
	for _, e := range evs {
		want := 1
		if e.id == "poison" {
			want = 0
		}
		if got[e.id] != want {
			t.Errorf("event %s applied %d times, want %d", e.id, got[e.id], want)
		}
	}
	// Events 0..149 fail 0, 1 or 2 times each: 50*1 + 50*2 failures, and the poison pill's.
	if s := in.Stats(); s.Failures != wantFailures || s.DeadLettered != 1 || s.Applied != 150 {
		t.Errorf("stats %+v: want 150 applied, %d failures, one dead letter", s, wantFailures)
	}
	dead := testenv.Consume(t, f.brokers, []string{f.dlq}, 1, 30*time.Second)
	if len(dead) != 1 {
		t.Fatalf("%d dead letters", len(dead))
	}
	mu.Lock()
	if tries["poison"] != o.MaxAttempts {
		t.Errorf("the poison pill's handler ran %d times, want MaxAttempts (%d)", tries["poison"], o.MaxAttempts)
	}
	mu.Unlock()
	d := dead[0]
	if testenv.Header(d, "event_id") != "poison" || testenv.Header(d, HeaderDLQAttempts) != "4" || testenv.Header(d, HeaderDLQTopic) != f.topic ||
		!strings.Contains(testenv.Header(d, HeaderDLQReason), "cannot parse the payload") || testenv.Header(d, HeaderDLQConsumer) != o.Consumer {
		t.Errorf("dead letter headers: %v", d.Headers)
	}
	var outcome string
	if err := f.pool.QueryRow(context.Background(), "SELECT outcome FROM "+f.table+" WHERE event_id = 'poison'").Scan(&outcome); err != nil || outcome != OutcomeDeadLettered {
		t.Errorf("claim of the poison pill: %q, %v", outcome, err)
	}
}

// TestWithoutADeadLetterTopicRunStops: with no dead-letter topic, an event that cannot be handled
// stops Run with an error naming it, and nothing behind it is committed: a new instance handles
// it again.
func TestWithoutADeadLetterTopicRunStops(t *testing.T) {
	f := newFixture(t)
	broken := func(ctx context.Context, tx pgx.Tx, ev Event) error {
		if ev.ID == "bad" {
			return Permanent(errors.New("unknown schema version"))
		}
		return f.record(ctx, tx, ev)
	}
	o := f.options(broken)
	o.DeadLetterTopic = ""
	in, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Setup(context.Background()); err != nil {
		in.Close()
		t.Fatal(err)
	}
	f.produce(t, event{id: "ok1", agg: "a"}, event{id: "bad", agg: "a"}, event{id: "ok2", agg: "a"})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = in.Run(ctx)
	in.Close() // leaves the group
	if err == nil || !strings.Contains(err.Error(), "bad") || !strings.Contains(err.Error(), "no dead-letter topic") || !strings.Contains(err.Error(), "unknown schema version") {
		t.Fatalf("Run: %v", err)
	}
	if got := f.applications(t); got["ok2"] != 0 {
		t.Errorf("an event behind the failed one was applied: %v", got)
	}
	// A new instance, with the handler fixed, resumes at the failed event.
	in2, _ := start(t, f.options(f.record))
	waitFor(t, "the rest handled", func() bool { return in2.Stats().Applied >= 2 })
	if got := f.applications(t); got["ok1"] != 1 || got["bad"] != 1 || got["ok2"] != 1 {
		t.Errorf("applications %v", got)
	}
}

// TestRebalance: two instances of one service in one group while events keep coming; a second
// instance joins, and later the first leaves. Every event is applied exactly once.
func TestRebalance(t *testing.T) {
	f := newFixture(t)
	slow := func(ctx context.Context, tx pgx.Tx, ev Event) error {
		time.Sleep(time.Millisecond)
		return f.record(ctx, tx, ev)
	}
	first, stopFirst := start(t, f.options(slow))
	// A producer writes ten events every 20 ms until stopped.
	var produced []string
	stopProducing := make(chan struct{})
	producing := make(chan struct{})
	go func() {
		defer close(producing)
		for i := 0; ; i++ {
			select {
			case <-stopProducing:
				return
			case <-time.After(20 * time.Millisecond):
			}
			var evs []event
			for j := 0; j < 10; j++ {
				id := fmt.Sprintf("r-%d-%d", i, j)
				evs = append(evs, event{id: id, agg: fmt.Sprintf("a%d", (i+j)%11), n: i})
				produced = append(produced, id)
			}
			if err := f.tryProduce(evs...); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	waitFor(t, "the first instance working", func() bool { return first.Stats().Applied > 100 })
	second, _ := start(t, f.options(slow))
	waitFor(t, "the second instance working", func() bool { return second.Stats().Applied > 100 })
	if err := stopFirst(); err != nil {
		t.Fatal(err)
	}
	applied := second.Stats().Applied
	waitFor(t, "the second instance taking over", func() bool { return second.Stats().Applied > applied+200 })
	close(stopProducing)
	<-producing
	waitFor(t, "every event applied", func() bool { return len(f.applications(t)) >= len(produced) })
	got := f.applications(t)
	for _, id := range produced {
		if got[id] != 1 {
			t.Errorf("event %s applied %d times", id, got[id])
		}
	}
	t.Logf("%d events; first instance: %+v; second: %+v", len(produced), first.Stats(), second.Stats())
}

// TestPrune deletes claims older than the retention in batches and keeps newer ones and versions.
func TestPrune(t *testing.T) {
	f := newFixture(t)
	o := f.options(f.record)
	o.PruneBatch = 7
	in, _ := start(t, o)
	var evs []event
	for i, id := range ids("p", 40) {
		evs = append(evs, event{id: id, agg: "a", version: int64(i + 1)})
	}
	f.produce(t, evs...)
	waitFor(t, "all applied", func() bool { return in.Stats().Applied >= 40 })
	if _, err := f.pool.Exec(context.Background(), "UPDATE "+f.table+" SET handled_at = now() - interval '3 days' WHERE event_id < 'p-3'"); err != nil {
		t.Fatal(err)
	}
	n, err := in.Prune(context.Background(), 48*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	var left, versions int
	_ = f.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+f.table).Scan(&left)
	_ = f.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+f.table+"_versions").Scan(&versions)
	// p-0, p-1, p-10..p-19, p-2, p-20..p-29: 23 ids sort below "p-3".
	if n != 23 || left != 17 || versions != 1 {
		t.Errorf("pruned %d, left %d claims and %d version rows; want 23, 17, 1", n, left, versions)
	}
}

func TestNewChecksOptions(t *testing.T) {
	base := Options{Consumer: "c", DB: &pgxpool.Pool{}, Handler: func(context.Context, pgx.Tx, Event) error { return nil },
		Brokers: []string{"127.0.0.1:1"}, Topics: []string{"t"}, Group: "g"}
	for name, mutate := range map[string]func(*Options){
		"no consumer":                 func(o *Options) { o.Consumer = "" },
		"no handler":                  func(o *Options) { o.Handler = nil },
		"no group":                    func(o *Options) { o.Group = "" },
		"dead-letter stale, no topic": func(o *Options) { o.Stale = DeadLetterStale },
		"bad table":                   func(o *Options) { o.Table = "a.b.c" },
	} {
		o := base
		mutate(&o)
		if in, err := New(o); err == nil {
			in.Close()
			t.Errorf("%s: accepted", name)
		}
	}
	in, err := New(base)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if in.claims != `"public"."inbox"` || in.versions != `"public"."inbox_versions"` {
		t.Errorf("default tables %s, %s", in.claims, in.versions)
	}
}

// TestFailedDeadLetterWriteIsTriedAgain: with DeadLetterStale, a stale event whose dead-letter write
// fails (the topic is missing) is not recorded as handled: Run stops naming the write, nothing behind
// it is committed, and once the topic exists a new instance dead-letters it — alone and in batches.
func TestFailedDeadLetterWriteIsTriedAgain(t *testing.T) {
	for _, batch := range []int{1, 0} {
		t.Run(fmt.Sprintf("batch size %d", batch), func(t *testing.T) {
			f := newFixture(t)
			o := f.options(f.record)
			o.Stale, o.BatchSize, o.DeadLetterTopic = DeadLetterStale, batch, f.dlq+".missing"
			in, err := New(o)
			if err != nil {
				t.Fatal(err)
			}
			if err := in.Setup(context.Background()); err != nil {
				in.Close()
				t.Fatal(err)
			}
			// Setup created the dead-letter topic; it goes away before the write.
			cl, err := kgo.NewClient(kgo.SeedBrokers(f.brokers...))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			adm := kadm.NewClient(cl)
			if _, err := adm.DeleteTopic(context.Background(), o.DeadLetterTopic); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the dead-letter topic gone", func() bool {
				d, err := adm.ListTopics(context.Background(), o.DeadLetterTopic)
				return err == nil && !d.Has(o.DeadLetterTopic)
			})
			f.produce(t, event{id: "v2", agg: "a", version: 2}, event{id: "v1", agg: "a", version: 1}, event{id: "v3", agg: "a", version: 3})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			err = in.Run(ctx)
			in.Close()
			if err == nil || !strings.Contains(err.Error(), "dead-letter topic") || !strings.Contains(err.Error(), "v1") {
				t.Fatalf("Run with a dead-letter write that fails: %v", err)
			}
			if got := f.applications(t); got["v3"] != 0 {
				t.Errorf("an event behind the one that could not be dead-lettered was applied: %v", got)
			}
			in2, _ := start(t, o) // its Setup creates the dead-letter topic again
			waitFor(t, "the rest handled", func() bool { s := in2.Stats(); return s.DeadLettered >= 1 && s.Applied >= 1 })
			dead := testenv.Consume(t, f.brokers, []string{o.DeadLetterTopic}, 1, 30*time.Second)
			if len(dead) != 1 || testenv.Header(dead[0], "event_id") != "v1" {
				t.Fatalf("dead letters after the topic came: %d (%v), want v1", len(dead), dead)
			}
			if got := f.applications(t); got["v2"] != 1 || got["v3"] != 1 || got["v1"] != 0 {
				t.Errorf("applications %v", got)
			}
		})
	}
}

// flakyDB fails every other transaction it is asked to begin, as a database that comes and goes.
type flakyDB struct {
	DB
	n atomic.Int64
}

func (d *flakyDB) Begin(ctx context.Context) (pgx.Tx, error) {
	if d.n.Add(1)%2 == 1 {
		return nil, errors.New("connection refused")
	}
	return d.DB.Begin(ctx)
}

// TestDatabaseAnsweringAgainResetsTheWait: the database failing now and then, with answers in
// between, is not a database that has been away since its first failure: an event that keeps
// failing its handler meanwhile is retried, not given up on when the first failure grows old.
func TestDatabaseAnsweringAgainResetsTheWait(t *testing.T) {
	f := newFixture(t)
	var tries atomic.Int64
	slow := func(ctx context.Context, tx pgx.Tx, ev Event) error {
		if tries.Add(1) < 12 {
			time.Sleep(50 * time.Millisecond)
			return errors.New("not yet")
		}
		return f.record(ctx, tx, ev)
	}
	o := f.options(slow)
	o.DB, o.BatchSize, o.MaxAttempts = &flakyDB{DB: f.pool}, 1, 100
	in, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	in.unreachableFor = 300 * time.Millisecond // well under the 12 attempts' time
	if err := in.Setup(context.Background()); err != nil {
		in.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	stopped := make(chan struct{})
	go func() { done <- in.Run(ctx); close(stopped) }()
	defer func() { cancel(); <-stopped; in.Close() }()
	f.produce(t, event{id: "e1", agg: "a"})
	deadline := time.After(time.Minute)
	for in.Stats().Applied < 1 {
		select {
		case err := <-done:
			t.Fatalf("Run gave up though the database answered between its failures: %v", err)
		case <-deadline:
			t.Fatal("the event was not applied")
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TestSetupCreatesTheDeadLetterTopic: Setup creates a missing dead-letter topic, so that the first event
// that fails finds it instead of stalling and stopping Run.
func TestSetupCreatesTheDeadLetterTopic(t *testing.T) {
	f := newFixture(t)
	o := f.options(func(context.Context, pgx.Tx, Event) error { return Permanent(errors.New("never applies")) })
	o.DeadLetterTopic = f.dlq + ".created"
	in, _ := start(t, o)
	f.produce(t, event{id: "p1", agg: "a"})
	waitFor(t, "the event dead-lettered", func() bool { return in.Stats().DeadLettered == 1 })
	if dead := testenv.Consume(t, f.brokers, []string{o.DeadLetterTopic}, 1, 30*time.Second); len(dead) != 1 {
		t.Fatalf("%d dead letters in the created topic", len(dead))
	}
}
