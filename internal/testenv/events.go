package testenv

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Event is one outbox row written by a test.
type Event struct {
	// ID, Type, AggType, AggID, Version, Payload and Headers are the row's columns.
	ID      string
	Type    string
	AggType string
	AggID   string
	Version int64
	Payload string
	Headers string // JSON object or ""
}

// Generator hands out events with per-aggregate increasing versions. It is not safe for concurrent
// use: concurrent writers each take their own, with their own aggregates (WithPrefix), since their
// commit order is not their version order.
type Generator struct {
	types    []string
	aggs     int
	prefix   string
	versions map[string]int64
	next     int
}

// NewGenerator returns a generator over aggs aggregates (agg-0, agg-1, ...) and the given event types.
func NewGenerator(aggs int, types ...string) *Generator {
	return &Generator{types: types, aggs: aggs, prefix: "agg-", versions: map[string]int64{}}
}

// WithPrefix names the generator's aggregates prefix0, prefix1, ... instead.
func (g *Generator) WithPrefix(prefix string) *Generator {
	g.prefix = prefix
	return g
}

// Event returns the next event, for aggregate pick modulo the aggregate count.
func (g *Generator) Event(pick int) Event {
	g.next++
	agg := fmt.Sprintf("%s%d", g.prefix, pick%g.aggs)
	g.versions[agg]++
	return Event{
		ID:      NewUUID(),
		Type:    g.types[g.next%len(g.types)],
		AggType: "order",
		AggID:   agg,
		Version: g.versions[agg],
		Payload: fmt.Sprintf(`{"n": %d, "agg": %q}`, g.next, agg),
		Headers: fmt.Sprintf(`{"traceparent": "00-%032x-%016x-01", "attempt": 1}`, g.next, g.next),
	}
}

// InsertTx writes events in one transaction; with deleteAfter the rows are deleted in the same
// transaction, the way applications keep the outbox empty.
func InsertTx(ctx context.Context, db *pgx.Conn, table string, evs []Event, deleteAfter bool) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := InsertIn(ctx, tx, table, evs, deleteAfter); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// InsertIn writes events into table within tx (a transaction may write to several outbox tables);
// with deleteAfter the rows are deleted again in tx.
func InsertIn(ctx context.Context, tx pgx.Tx, table string, evs []Event, deleteAfter bool) error {
	ids := make([]string, len(evs))
	types := make([]string, len(evs))
	aggTypes := make([]string, len(evs))
	aggIDs := make([]string, len(evs))
	versions := make([]int64, len(evs))
	payloads := make([]string, len(evs))
	headers := make([]*string, len(evs))
	for i, e := range evs {
		ids[i], types[i], aggTypes[i], aggIDs[i], versions[i], payloads[i] = e.ID, e.Type, e.AggType, e.AggID, e.Version, e.Payload
		if e.Headers != "" {
			h := e.Headers
			headers[i] = &h
		}
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+table+` (event_id, event_type, aggregate_type, aggregate_id, aggregate_version, payload, headers)
		SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::jsonb[], $7::jsonb[])`,
		ids, types, aggTypes, aggIDs, versions, payloads, headers)
	if err != nil {
		return fmt.Errorf("insert: %w", err)
	}
	if deleteAfter {
		if _, err := tx.Exec(ctx, `DELETE FROM `+table+` WHERE event_id = ANY($1::uuid[])`, ids); err != nil {
			return fmt.Errorf("delete: %w", err)
		}
	}
	return nil
}

// insertHeld writes evs in one transaction, the first row at once and the rest after hold.
func insertHeld(ctx context.Context, db *pgx.Conn, table string, evs []Event, hold time.Duration) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for i, e := range evs {
		if i == 1 {
			time.Sleep(hold)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+table+` (event_id, event_type, aggregate_type, aggregate_id, aggregate_version, payload, headers)
			VALUES ($1, $2, $3, $4, $5, $6, $7)`, e.ID, e.Type, e.AggType, e.AggID, e.Version, e.Payload, e.Headers); err != nil {
			return fmt.Errorf("insert: %w", err)
		}
	}
	return tx.Commit(ctx)
}

// TopicsOf returns the topics the fixture's events route to.
func TopicsOf(f *Fixture, types ...string) []string {
	out := make([]string, len(types))
	for i, ty := range types {
		out[i] = f.TopicPrefix + "." + ty
	}
	return out
}

// VerifyDelivery checks that every event of want (in commit order) arrived on its topic with the
// right key, value and headers, and that order held (see CheckDelivery); it fails t for each problem
// and returns the number of duplicate deliveries.
func VerifyDelivery(t testing.TB, f *Fixture, want []Event, got []*kgo.Record) (duplicates int) {
	t.Helper()
	rep := CheckDelivery(f.TopicPrefix, want, got)
	for i, p := range rep.Problems {
		if i == 50 {
			t.Errorf("... and %d more problems", len(rep.Problems)-50)
			break
		}
		t.Errorf("%s", p)
	}
	return rep.Duplicates
}

// DeliveryReport is what CheckDelivery found.
type DeliveryReport struct {
	// Events is the number of events expected; Missing, OrderViolations (order broken, stale
	// duplicates, cross-topic inversions) and Wrong (records with a wrong topic, key, value or header,
	// or unexpected records) count problems; Duplicates counts extra copies (at-least-once).
	Events, Missing, OrderViolations, Wrong, Duplicates int
	// Problems describes each problem.
	Problems []string
}

// CheckDelivery checks records against the events written (want, in commit order) for topics
// named topicPrefix + "." + event type:
//   - every event arrived on its topic with the right key, value and headers;
//   - per topic and key, in offset order, new events arrive in commit order, and a duplicate is only
//     ever part of a replay that re-sends that key's events in order from some point on (a "stale"
//     duplicate — an old version after newer ones, not followed by the versions between — is a
//     violation);
//   - per aggregate across topics, the last copies of its events were produced in commit order
//     (record timestamps), which is what a replay from the slot guarantees even after crashes.
func CheckDelivery(topicPrefix string, want []Event, got []*kgo.Record) DeliveryReport {
	rep := DeliveryReport{Events: len(want)}
	problem := func(counter *int, format string, args ...any) {
		*counter++
		rep.Problems = append(rep.Problems, fmt.Sprintf(format, args...))
	}
	byID := make(map[string]Event, len(want))
	for _, e := range want {
		byID[e.ID] = e
	}
	// The expected sequence per topic and key, and each event's place in it.
	place := make(map[string]int, len(want))
	length := map[string]int{}
	for _, e := range want {
		k := topicPrefix + "." + e.Type + "|" + e.AggID
		place[e.ID] = length[k]
		length[k]++
	}
	seen := make(map[string]bool, len(want))
	// Records of one partition arrive in offset order from the consumer; sort to be sure.
	sort.SliceStable(got, func(i, j int) bool {
		if got[i].Topic != got[j].Topic {
			return got[i].Topic < got[j].Topic
		}
		if got[i].Partition != got[j].Partition {
			return got[i].Partition < got[j].Partition
		}
		return got[i].Offset < got[j].Offset
	})
	type keyState struct{ next, replay int } // next new place; replay position while replaying
	states := map[string]*keyState{}
	last := make(map[string]*kgo.Record, len(want)) // event id -> its last copy
	for _, r := range got {
		id := Header(r, "event_id")
		e, ok := byID[id]
		if !ok {
			problem(&rep.Wrong, "unexpected record on %s with event_id %q", r.Topic, id)
			continue
		}
		k := r.Topic + "|" + string(r.Key)
		st := states[k]
		if st == nil {
			st = &keyState{}
			states[k] = st
		}
		if prev := last[id]; prev == nil || !r.Timestamp.Before(prev.Timestamp) {
			last[id] = r
		}
		i := place[id]
		switch {
		case i == st.next && st.replay >= st.next:
			st.next++
			st.replay = st.next
		case st.replay < st.next && i > st.replay:
			problem(&rep.OrderViolations, "stale duplicate on %s key %s: an old version was re-sent after newer ones, and version %d followed it without the versions between", r.Topic, r.Key, e.Version)
			st.next = max(st.next, i+1)
			st.replay = st.next
		case i > st.next:
			problem(&rep.OrderViolations, "per-aggregate order broken on %s key %s: version %d arrived before earlier versions", r.Topic, r.Key, e.Version)
			st.next = i + 1
			st.replay = st.next
		default: // a replay starting at i (or going on)
			st.replay = i + 1
		}
		if seen[id] {
			rep.Duplicates++
			continue
		}
		seen[id] = true
		if wantTopic := topicPrefix + "." + e.Type; r.Topic != wantTopic {
			problem(&rep.Wrong, "event %s on topic %s, want %s", id, r.Topic, wantTopic)
		}
		if string(r.Key) != e.AggID {
			problem(&rep.Wrong, "event %s key %q, want %q", id, r.Key, e.AggID)
		}
		if !SameJSON(r.Value, []byte(e.Payload)) {
			problem(&rep.Wrong, "event %s value %s, want %s", id, r.Value, e.Payload)
		}
		if h := Header(r, "event_type"); h != e.Type {
			problem(&rep.Wrong, "event %s header event_type %q, want %q", id, h, e.Type)
		}
		if h := Header(r, "aggregate_type"); h != e.AggType {
			problem(&rep.Wrong, "event %s header aggregate_type %q, want %q", id, h, e.AggType)
		}
		if h := Header(r, "aggregate_version"); h != fmt.Sprint(e.Version) {
			problem(&rep.Wrong, "event %s header aggregate_version %q, want %d", id, h, e.Version)
		}
		if h := Header(r, "created_at"); !strings.HasSuffix(h, "Z") {
			problem(&rep.Wrong, "event %s header created_at %q is not RFC 3339 UTC", id, h)
		}
		if e.Headers != "" {
			var hs map[string]any
			_ = json.Unmarshal([]byte(e.Headers), &hs)
			if tp, _ := hs["traceparent"].(string); Header(r, "traceparent") != tp {
				problem(&rep.Wrong, "event %s header traceparent %q, want %q", id, Header(r, "traceparent"), tp)
			}
		}
	}
	// Across topics: per aggregate, the last copies in commit order have non-decreasing timestamps.
	lastAt := map[string]*kgo.Record{}
	for _, e := range want {
		r := last[e.ID]
		if r == nil {
			continue
		}
		if prev := lastAt[e.AggID]; prev != nil && r.Timestamp.Before(prev.Timestamp) {
			problem(&rep.OrderViolations, "per-aggregate order across topics broken for %s: version %d (%s, produced %s) was last produced before an earlier version (%s, produced %s)",
				e.AggID, e.Version, r.Topic, r.Timestamp.Format(time.RFC3339Nano), prev.Topic, prev.Timestamp.Format(time.RFC3339Nano))
		}
		lastAt[e.AggID] = r
	}
	for _, e := range want {
		if !seen[e.ID] {
			rep.Missing++
			if rep.Missing <= 5 {
				rep.Problems = append(rep.Problems, fmt.Sprintf("event %s (%s, %s v%d) never arrived", e.ID, e.Type, e.AggID, e.Version))
			}
		}
	}
	if rep.Missing > 0 {
		rep.Problems = append(rep.Problems, fmt.Sprintf("%d of %d events missing", rep.Missing, len(want)))
	}
	return rep
}

// SplitPhantoms separates the records of events in want from the others: after a failover, the
// events in Kafka whose rows the promoted server lacks (phantom events). It returns the records of
// wanted events and the distinct ids of the phantoms.
func SplitPhantoms(want []Event, got []*kgo.Record) (real []*kgo.Record, phantoms map[string]bool) {
	wanted := make(map[string]bool, len(want))
	for _, e := range want {
		wanted[e.ID] = true
	}
	phantoms = map[string]bool{}
	for _, r := range got {
		if id := EventID(r); !wanted[id] {
			phantoms[id] = true
			continue
		}
		real = append(real, r)
	}
	return real, phantoms
}

// SameJSON reports whether a and b hold equal JSON values.
func SameJSON(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return string(xa) == string(ya)
}

// NewUUID returns a random (version 4) UUID.
func NewUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// MustLSN parses a PostgreSQL LSN; "" is 0.
func MustLSN(t testing.TB, s string) pglogrepl.LSN {
	t.Helper()
	if s == "" {
		return 0
	}
	lsn, err := pglogrepl.ParseLSN(s)
	if err != nil {
		t.Fatalf("parse LSN %q: %v", s, err)
	}
	return lsn
}

// WaitFor polls cond every 100 ms and fails the test if it is not true within timeout.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Preload writes n events of gen in transactions of 1,000 rows and keeps them in the table.
func Preload(t testing.TB, f *Fixture, gen *Generator, n int) []Event {
	t.Helper()
	var all []Event
	for len(all) < n {
		evs := make([]Event, min(1000, n-len(all)))
		for i := range evs {
			evs[i] = gen.Event(len(all) + i)
		}
		if err := InsertTx(context.Background(), f.DB, f.Table, evs, false); err != nil {
			t.Fatal(err)
		}
		all = append(all, evs...)
	}
	return all
}

// Writer inserts transactions of events on its own connection until stopped.
type Writer struct {
	mu     sync.Mutex
	events []Event
	stop   chan struct{}
	done   chan error
}

// StartWriter inserts a transaction of perTx events of gen every pause (rows deleted in the same
// transaction when deleteAfter) until Stop.
func StartWriter(t testing.TB, f *Fixture, gen *Generator, perTx int, pause time.Duration, deleteAfter bool) *Writer {
	t.Helper()
	return startWriter(t, f, gen, perTx, pause, 0, deleteAfter)
}

// StartSlowWriter is StartWriter whose transactions stay open for hold between their first and
// their last insert, so that they straddle whatever happens meanwhile (a slot's creation).
func StartSlowWriter(t testing.TB, f *Fixture, gen *Generator, perTx int, pause, hold time.Duration) *Writer {
	t.Helper()
	return startWriter(t, f, gen, perTx, pause, hold, false)
}

func startWriter(t testing.TB, f *Fixture, gen *Generator, perTx int, pause, hold time.Duration, deleteAfter bool) *Writer {
	t.Helper()
	w := &Writer{stop: make(chan struct{}), done: make(chan error, 1)}
	ctx := context.Background()
	db, err := pgx.Connect(ctx, f.PostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer db.Close(ctx)
		for i := 0; ; i++ {
			select {
			case <-w.stop:
				w.done <- nil
				return
			default:
			}
			w.mu.Lock()
			evs := make([]Event, perTx)
			for j := range evs {
				evs[j] = gen.Event(i + 7*j)
			}
			var err error
			if hold > 0 {
				err = insertHeld(ctx, db, f.Table, evs, hold)
			} else {
				err = InsertTx(ctx, db, f.Table, evs, deleteAfter)
			}
			if err == nil {
				w.events = append(w.events, evs...)
			}
			w.mu.Unlock()
			if err != nil {
				w.done <- err
				return
			}
			time.Sleep(pause)
		}
	}()
	t.Cleanup(func() { w.Stop() })
	return w
}

// Written returns how many events the writer has committed.
func (w *Writer) Written() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.events)
}

// Stop stops the writer and returns the events it committed, in commit order, and its error.
func (w *Writer) Stop() ([]Event, error) {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	err := <-w.done
	w.done <- err // keep the result for a second Stop
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]Event(nil), w.events...), err
}

// EmitIn writes events as transactional logical decoding messages of prefix within tx, one message
// per event with the outbox's fields as a JSON object (postgres.message_prefixes); nothing is written
// to a table. The values are parameters: none is spliced into the SQL.
func EmitIn(ctx context.Context, tx pgx.Tx, prefix string, evs []Event) error {
	for _, e := range evs {
		var headers *string
		if e.Headers != "" {
			headers = &e.Headers
		}
		if _, err := tx.Exec(ctx, `SELECT pg_logical_emit_message(true, $1, json_build_object(
			'event_id', $2::uuid, 'event_type', $3::text, 'aggregate_type', $4::text, 'aggregate_id', $5::text,
			'aggregate_version', $6::bigint, 'payload', $7::jsonb, 'headers', $8::jsonb)::text)`,
			prefix, e.ID, e.Type, e.AggType, e.AggID, e.Version, e.Payload, headers); err != nil {
			return fmt.Errorf("emit message: %w", err)
		}
	}
	return nil
}
