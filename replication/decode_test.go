package replication

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
)

// wal builds pgoutput (proto_version 2, streaming off) messages the way PostgreSQL encodes them.
type wal struct{ b []byte }

func (w *wal) u8(v byte)        { w.b = append(w.b, v) }
func (w *wal) u16(v uint16)     { w.b = binary.BigEndian.AppendUint16(w.b, v) }
func (w *wal) u32(v uint32)     { w.b = binary.BigEndian.AppendUint32(w.b, v) }
func (w *wal) u64(v uint64)     { w.b = binary.BigEndian.AppendUint64(w.b, v) }
func (w *wal) str(s string)     { w.b = append(append(w.b, s...), 0) }
func (w *wal) bytes() []byte    { return w.b }
func msg(f func(w *wal)) []byte { w := &wal{}; f(w); return w.bytes() }

type col struct {
	name string
	oid  uint32
}

func relationMsg(id uint32, ns, name string, cols ...col) []byte {
	return msg(func(w *wal) {
		w.u8('R')
		w.u32(id)
		w.str(ns)
		w.str(name)
		w.u8('d')
		w.u16(uint16(len(cols)))
		for _, c := range cols {
			w.u8(0)
			w.str(c.name)
			w.u32(c.oid)
			w.u32(0xffffffff)
		}
	})
}

func beginMsg(finalLSN uint64) []byte {
	return msg(func(w *wal) { w.u8('B'); w.u64(finalLSN); w.u64(0); w.u32(1) })
}

func commitMsg(commitLSN, endLSN uint64) []byte {
	return msg(func(w *wal) { w.u8('C'); w.u8(0); w.u64(commitLSN); w.u64(endLSN); w.u64(0) })
}

// insertMsg encodes values as text; a nil value is NULL.
func insertMsg(relID uint32, values ...*string) []byte {
	return msg(func(w *wal) {
		w.u8('I')
		w.u32(relID)
		w.u8('N')
		w.u16(uint16(len(values)))
		for _, v := range values {
			if v == nil {
				w.u8('n')
				continue
			}
			w.u8('t')
			w.u32(uint32(len(*v)))
			w.b = append(w.b, *v...)
		}
	})
}

func deleteMsg(relID uint32) []byte {
	return msg(func(w *wal) {
		w.u8('D')
		w.u32(relID)
		w.u8('K')
		w.u16(1)
		w.u8('t')
		w.u32(1)
		w.u8('1')
	})
}

func s(v string) *string { return &v }

// recordingHandler records delivered rows, registers them in the tracker as the pipeline does, and
// acknowledges nothing.
type recordingHandler struct {
	tracker *checkpoint.Tracker
	rows    []Row
	txs     []*checkpoint.Tx
}

func (h *recordingHandler) Deliver(_ context.Context, tx *checkpoint.Tx, row *Row) error {
	if h.tracker != nil {
		h.tracker.Add(tx)
	}
	h.rows = append(h.rows, *row)
	h.txs = append(h.txs, tx)
	return nil
}

// testRoles are the columns the router reads in the stream tests (none required: the tests' tables
// have a few of them).
var testRoles = []ColumnRole{{Column: "event_id"}, {Column: "event_type"}, {Column: "aggregate_id"}, {Column: "payload"}, {Column: "headers"}, {Column: "created_at"}}

func newTestStream() *Stream {
	st := newStream(nil, Options{Outbox: Outbox{Schema: "public", Table: "outbox", Publication: "pub"}, StatusInterval: time.Hour,
		Columns: testRoles, StartLSN: 100, Logger: slog.New(slog.DiscardHandler), Counters: new(Counters)})
	st.tracker = checkpoint.NewTracker(100)
	return st
}

func feed(t *testing.T, st *Stream, h Handler, msgs ...[]byte) {
	t.Helper()
	for _, m := range msgs {
		if err := st.handleWAL(context.Background(), h, pglogrepl.XLogData{WALStart: 500, WALData: m}); err != nil {
			t.Fatalf("handleWAL(%q...): %v", m[:1], err)
		}
	}
}

func TestStreamDecodesOutboxInsertsAndIgnoresTheRest(t *testing.T) {
	st := newTestStream()
	st.opts.Ignore = IgnoredTables{"orders"} // public.orders
	h := &recordingHandler{tracker: st.tracker}
	outboxCols := []col{{"event_id", pgtype.UUIDOID}, {"event_type", pgtype.TextOID}, {"payload", pgtype.ByteaOID}, {"created_at", pgtype.TimestamptzOID}}
	feed(t, st, h,
		relationMsg(1, "public", "outbox", outboxCols...),
		relationMsg(2, "public", "orders", col{"id", pgtype.Int8OID}),
		beginMsg(900),
		insertMsg(1, s("e1"), s("OrderPaid"), s(`\x68690a`), s("2026-12-02 09:30:00.123456+01")),
		insertMsg(2, s("7")),
		deleteMsg(1),
		insertMsg(1, s("e2"), nil, nil, s("2026-12-02 08:30:00+00")),
		commitMsg(900, 1000),
	)
	if len(h.rows) != 2 {
		t.Fatalf("delivered %d rows, want 2", len(h.rows))
	}
	r := h.rows[0]
	if v, ok := r.Value("payload"); !ok || string(v) != "hi\n" {
		t.Errorf("bytea payload %q, want raw bytes %q", v, "hi\n")
	}
	if v, _ := r.Value("created_at"); string(v) != "2026-12-02T08:30:00.123456Z" {
		t.Errorf("created_at %q, want RFC 3339 UTC", v)
	}
	if _, ok := h.rows[1].Value("event_type"); ok {
		t.Error("NULL column reported as present")
	}
	if _, ok := h.rows[1].Value("no_such_column"); ok {
		t.Error("missing column reported as present")
	}
	if got := st.counters.IgnoredOtherTables.Load(); got != 1 {
		t.Errorf("ignored other-table changes %d, want 1", got)
	}
	if got := st.counters.IgnoredDeletes.Load(); got != 1 {
		t.Errorf("ignored outbox deletes %d, want 1", got)
	}
	// Nothing was acknowledged: the watermark stays; once both rows are, it moves to the end LSN.
	if wm := st.tracker.Watermark(); wm != 100 {
		t.Fatalf("watermark %s before acks", wm)
	}
	st.tracker.Ack(h.txs[0])
	if wm := st.tracker.Watermark(); wm != 100 {
		t.Fatalf("watermark %s with one row unacknowledged", wm)
	}
	st.tracker.Ack(h.txs[1])
	if wm := st.tracker.Watermark(); wm != 1000 {
		t.Fatalf("watermark %s after acks, want the commit end LSN 0/3E8", wm)
	}
}

// TestUnlistedTableStopsTheStream: an insert into a published table that is neither an outbox table
// nor ignored stops the stream before its transaction can be confirmed, naming the table and the
// keys that settle it; "*" and a schema-qualified name ignore it; a delete of it is no event.
func TestUnlistedTableStopsTheStream(t *testing.T) {
	outboxCols := []col{{"event_id", pgtype.TextOID}}
	for _, tc := range []struct {
		name   string
		ignore IgnoredTables
		stops  bool
	}{
		{"not ignored", nil, true},
		{"another table ignored", IgnoredTables{"public.payments"}, true},
		{"same name in another schema ignored", IgnoredTables{"billing.orders"}, true},
		{"ignored by name", IgnoredTables{"public.orders"}, false},
		{"ignored by default schema", IgnoredTables{"orders"}, false},
		{"every other table ignored", IgnoredTables{IgnoreAll}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := newTestStream()
			st.opts.Ignore = tc.ignore
			h := &recordingHandler{tracker: st.tracker}
			feed(t, st, h, relationMsg(1, "public", "outbox", outboxCols...), relationMsg(2, "public", "orders", col{"id", pgtype.Int8OID}),
				beginMsg(900), insertMsg(1, s("e1")), deleteMsg(2))
			err := st.handleWAL(context.Background(), h, pglogrepl.XLogData{WALStart: 800, WALData: insertMsg(2, s("7"))})
			if !tc.stops {
				if err != nil {
					t.Fatalf("insert into an ignored table: %v", err)
				}
				feed(t, st, h, commitMsg(900, 1000))
				if st.counters.IgnoredOtherTables.Load() != 2 {
					t.Errorf("ignored %d other-table changes, want 2", st.counters.IgnoredOtherTables.Load())
				}
				return
			}
			if !errors.Is(err, ErrUnlistedTable) || !errors.Is(err, ErrOutboxChanged) {
				t.Fatalf("insert into an unlisted table: %v, want ErrUnlistedTable", err)
			}
			for _, want := range []string{"public.orders", "postgres.ignore_tables", "tables", "0/384"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error does not name %q: %v", want, err)
				}
			}
			st.tracker.Ack(h.txs[0])
			if wm := st.tracker.Watermark(); wm != 100 {
				t.Errorf("watermark %s: the transaction with the unlisted row must not be confirmable", wm)
			}
		})
	}
}

// TestRelationMessageReplacesCache: after ALTER TABLE ADD COLUMN the server sends a new Relation
// message; rows must align with the new columns.
func TestRelationMessageReplacesCache(t *testing.T) {
	st := newTestStream()
	h := &recordingHandler{}
	feed(t, st, h,
		relationMsg(1, "public", "outbox", col{"event_id", pgtype.TextOID}),
		beginMsg(1), insertMsg(1, s("e1")), commitMsg(1, 2),
		relationMsg(1, "public", "outbox", col{"event_id", pgtype.TextOID}, col{"tenant", pgtype.TextOID}),
		beginMsg(3), insertMsg(1, s("e2"), s("acme")), commitMsg(3, 4),
	)
	if v, ok := h.rows[1].Value("tenant"); !ok || string(v) != "acme" {
		t.Fatalf("tenant %q after ALTER TABLE", v)
	}
}

// TestRelationMessageMissingARequiredColumnStops: a payload column dropped or renamed mid-stream (or
// left out of the publication's column list) must stop the stream at its Relation message, before a
// row without a value is produced; a missing optional column only warns.
func TestRelationMessageMissingARequiredColumnStops(t *testing.T) {
	roles := []ColumnRole{
		{Column: "event_id", Key: "postgres.columns.event_id", Required: true},
		{Column: "payload", Key: "postgres.columns.payload", Required: true},
		{Column: "headers", Key: "postgres.columns.headers"},
	}
	tests := []struct {
		name    string
		cols    []col
		wantErr string
	}{
		{"all there", []col{{"event_id", pgtype.TextOID}, {"payload", pgtype.JSONBOID}, {"headers", pgtype.JSONBOID}}, ""},
		{"optional missing", []col{{"event_id", pgtype.TextOID}, {"payload", pgtype.JSONBOID}}, ""},
		{"payload renamed", []col{{"event_id", pgtype.TextOID}, {"body", pgtype.JSONBOID}}, `no column "payload" (postgres.columns.payload)`},
		{"event_id dropped", []col{{"payload", pgtype.JSONBOID}}, `no column "event_id"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := newTestStream()
			st.opts.Columns = roles
			st.log = slog.New(slog.DiscardHandler)
			h := &recordingHandler{}
			err := st.handleWAL(context.Background(), h, pglogrepl.XLogData{WALStart: 500, WALData: relationMsg(1, "public", "outbox", tt.cols...)})
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if !errors.Is(err, ErrOutboxChanged) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %v, want ErrOutboxChanged naming %s", err, tt.wantErr)
			}
			// Another table's relation message is never checked.
			if err := st.handleWAL(context.Background(), h, pglogrepl.XLogData{WALData: relationMsg(2, "public", "orders", col{"id", pgtype.Int8OID})}); err != nil {
				t.Fatalf("other table: %v", err)
			}
		})
	}
}

// TestMissingOptionalColumnIsWarnedOncePerChange: PostgreSQL sends an outbox's Relation message again
// after any invalidation of the table's cache entry (an autoanalyze among them); the warning about a
// missing optional column comes once, again only after the column came back and went again, and it
// names the transaction's position (a Relation message carries none).
func TestMissingOptionalColumnIsWarnedOncePerChange(t *testing.T) {
	st := newTestStream()
	st.opts.Columns = []ColumnRole{
		{Column: "event_id", Key: "postgres.columns.event_id", Required: true},
		{Column: "headers", Key: "postgres.columns.headers"},
	}
	var logged bytes.Buffer
	st.log = slog.New(slog.NewJSONHandler(&logged, nil))
	without := relationMsg(1, "public", "outbox", col{"event_id", pgtype.TextOID})
	with := relationMsg(1, "public", "outbox", col{"event_id", pgtype.TextOID}, col{"headers", pgtype.JSONBOID})
	h := &recordingHandler{}
	rel := func(m []byte, final uint64) {
		t.Helper()
		for _, m := range [][]byte{beginMsg(final), m, commitMsg(final, final+8)} {
			if err := st.handleWAL(context.Background(), h, pglogrepl.XLogData{WALData: m}); err != nil {
				t.Fatal(err)
			}
		}
	}
	rel(without, 0x1000)
	rel(without, 0x2000)
	rel(without, 0x3000)
	if n := strings.Count(logged.String(), "optional column is gone"); n != 1 {
		t.Fatalf("%d warnings for one missing column sent three times, want 1:\n%s", n, logged.String())
	}
	if !strings.Contains(logged.String(), `"lsn":"0/1000"`) {
		t.Fatalf("the warning does not name the transaction's position 0/1000:\n%s", logged.String())
	}
	rel(with, 0x4000)
	rel(without, 0x5000)
	if n := strings.Count(logged.String(), "optional column is gone"); n != 2 {
		t.Fatalf("%d warnings after the column came back and went again, want 2:\n%s", n, logged.String())
	}

	// A column set-up already warned of (Options.Missing) is no change at the session's first
	// Relation message.
	logged.Reset()
	opts := st.opts
	opts.Missing = []MissingColumn{{Table: 0, Column: "headers"}}
	st = newStream(nil, opts)
	st.tracker = checkpoint.NewTracker(100)
	st.log = slog.New(slog.NewJSONHandler(&logged, nil))
	rel(without, 0x6000)
	if logged.Len() != 0 {
		t.Fatalf("warned of a column set-up had warned of:\n%s", logged.String())
	}
	rel(with, 0x7000)
	rel(without, 0x8000)
	if n := strings.Count(logged.String(), "optional column is gone"); n != 1 {
		t.Fatalf("%d warnings after the column was added and dropped, want 1:\n%s", n, logged.String())
	}
}

// TestConfirmableIsHeldAtTheVerifiedPosition: the position sent to the server is the watermark held
// at the last verified position, and never goes backwards.
func TestConfirmableIsHeldAtTheVerifiedPosition(t *testing.T) {
	st := newTestStream()
	limit := LSN(300)
	st.opts.ConfirmLimit = func() LSN { return limit }
	st.tracker.AdvanceIdle(1000)
	if got := st.confirmable(); got != 300 {
		t.Fatalf("confirmable %s with the watermark at 0/3E8 and the outbox verified at 0/12C, want 0/12C", got)
	}
	st.sentLSN = 300
	limit = 50 // a verification can only move forward, but the stream must not trust that
	if got := st.confirmable(); got != 300 {
		t.Fatalf("confirmable %s went backwards", got)
	}
	limit = 5000
	if got := st.confirmable(); got != 1000 {
		t.Fatalf("confirmable %s, want the watermark 0/3E8 once verified past it", got)
	}
}

func TestStreamRejectsProtocolSurprises(t *testing.T) {
	tests := []struct {
		name string
		msgs [][]byte
	}{
		{"insert before relation", [][]byte{beginMsg(1), insertMsg(9, s("x"))}},
		{"column count mismatch", [][]byte{relationMsg(1, "public", "outbox", col{"a", pgtype.TextOID}), beginMsg(1), insertMsg(1, s("x"), s("y"))}},
		{"commit without begin", [][]byte{commitMsg(1, 2)}},
		{"nested begin", [][]byte{beginMsg(1), beginMsg(2)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := newTestStream()
			var err error
			for _, m := range tt.msgs {
				if err = st.handleWAL(context.Background(), &recordingHandler{}, pglogrepl.XLogData{WALData: m}); err != nil {
					break
				}
			}
			if !errors.Is(err, ErrUnreadable) {
				t.Fatalf("error %v, want ErrUnreadable (a replay would meet it again)", err)
			}
		})
	}
}

// TestOnlyReadColumnsAreConverted: values of columns the router does not read are passed on as sent,
// whatever they hold; a read timestamp with no RFC 3339 form is passed on as well; a read bytea value
// that cannot be decoded is the row's problem, never the stream's error.
func TestOnlyReadColumnsAreConverted(t *testing.T) {
	st := newTestStream()
	h := &recordingHandler{}
	cols := []col{{"event_id", pgtype.UUIDOID}, {"payload", pgtype.ByteaOID}, {"created_at", pgtype.TimestamptzOID},
		{"expires_at", pgtype.TimestamptzOID}, {"raw", pgtype.ByteaOID}, {"day", pgtype.DateOID}}
	feed(t, st, h,
		relationMsg(1, "public", "outbox", cols...),
		beginMsg(900),
		insertMsg(1, s("e1"), s(`\x6869`), s("infinity"), s("not a time at all"), s(`\x00ff`), s("-infinity")),
		insertMsg(1, s("e2"), s(`\xzz`), s("-infinity"), s("infinity"), s(`plain\`), s("infinity")),
		commitMsg(900, 1000),
	)
	if len(h.rows) != 2 {
		t.Fatalf("delivered %d rows, want 2", len(h.rows))
	}
	want := []map[string]string{
		{"payload": "hi", "created_at": "infinity", "expires_at": "not a time at all", "raw": `\x00ff`, "day": "-infinity"},
		{"payload": `\xzz`, "created_at": "-infinity", "expires_at": "infinity", "raw": `plain\`, "day": "infinity"},
	}
	for i, w := range want {
		for c, v := range w {
			if got, _ := h.rows[i].Value(c); string(got) != v {
				t.Errorf("row %d column %s = %q, want %q", i+1, c, got, v)
			}
		}
	}
	if p := h.rows[0].Problem(); p != "" {
		t.Errorf("row 1 has the problem %q", p)
	}
	if p := h.rows[1].Problem(); !strings.Contains(p, "column payload") || !strings.Contains(p, "hex") {
		t.Errorf("row 2's problem %q does not name the payload column and its format", p)
	}
}

// TestDomainColumnsAreDecodedAsTheirBaseType: a column of a domain over bytea (or timestamptz) the
// router reads is decoded as its base type, asked once per type and stream.
func TestDomainColumnsAreDecodedAsTheirBaseType(t *testing.T) {
	st := newTestStream()
	asked := map[uint32]int{}
	st.opts.BaseType = func(_ context.Context, oid uint32) (uint32, error) {
		asked[oid]++
		return map[uint32]uint32{70001: pgtype.ByteaOID, 70002: pgtype.TimestamptzOID, 70003: 70003}[oid], nil
	}
	h := &recordingHandler{}
	cols := []col{{"event_id", pgtype.UUIDOID}, {"payload", 70001}, {"created_at", 70002}, {"unread", 70004}, {"event_type", 70003}}
	feed(t, st, h,
		relationMsg(1, "public", "outbox", cols...),
		beginMsg(900), insertMsg(1, s("e1"), s(`\x6869`), s("2026-12-02 09:30:00+01"), s("u"), s("T")), commitMsg(900, 1000),
		relationMsg(1, "public", "outbox", cols...),
		beginMsg(1100), insertMsg(1, s("e2"), s(`\x6a6b`), s("infinity"), s("u"), s("T")), commitMsg(1100, 1200),
	)
	if v, _ := h.rows[0].Value("payload"); string(v) != "hi" {
		t.Errorf("payload of a domain over bytea %q, want its bytes", v)
	}
	if v, _ := h.rows[0].Value("created_at"); string(v) != "2026-12-02T08:30:00Z" {
		t.Errorf("created_at of a domain over timestamptz %q, want RFC 3339", v)
	}
	if oid, _ := h.rows[1].TypeOID("payload"); oid != pgtype.ByteaOID {
		t.Errorf("payload's type %d, want its base type bytea", oid)
	}
	if asked[70001] != 1 || asked[70002] != 1 || asked[70003] != 1 || asked[70004] != 0 {
		t.Errorf("base types asked %v: want each read column's type once, an unread column's never", asked)
	}
	st = newTestStream()
	st.opts.BaseType = func(context.Context, uint32) (uint32, error) { return 0, errors.New("catalog down") }
	if err := st.handleWAL(context.Background(), h, pglogrepl.XLogData{WALData: relationMsg(1, "public", "outbox", cols...)}); err == nil || errors.Is(err, ErrUnreadable) {
		t.Fatalf("a failed type look-up gave %v, want a (transient) error", err)
	}
}

func TestDecodeBytea(t *testing.T) {
	tests := []struct {
		text, want, err string
	}{
		{`\x`, "", ""},
		{`\x00ff5C0a`, "\x00\xff\\\n", ""},
		{`abc`, "abc", ""},
		{`\\'\000\377\012x`, "\\'\x00\xff\nx", ""},
		{`\x0`, "", "hex"},
		{`\x0g`, "", "hex"},
		{`a\9bc`, "", "escape"},
		{`a\400`, "", "escape"},
		{`tail\`, "", "escape"},
		{`\12`, "", "escape"},
	}
	for _, tt := range tests {
		got, err := decodeBytea([]byte(tt.text))
		switch {
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("decodeBytea(%q) error %v, want one naming %s", tt.text, err, tt.err)
		case tt.err == "" && (err != nil || string(got) != tt.want):
			t.Errorf("decodeBytea(%q) = %q, %v, want %q", tt.text, got, err, tt.want)
		}
	}
}

func TestSplitTable(t *testing.T) {
	for in, want := range map[string][2]string{"outbox": {"public", "outbox"}, "app.events": {"app", "events"}} {
		if s, tb := SplitTable(in); s != want[0] || tb != want[1] {
			t.Errorf("SplitTable(%q) = %q, %q", in, s, tb)
		}
	}
}

// TestTimestampsBecomeRFC3339: created_at of type timestamptz is sent in UTC; of type timestamp
// (without time zone) its wall time is taken as UTC; infinity is passed as it is.
func TestTimestampsBecomeRFC3339(t *testing.T) {
	d := NewRowDecoder([]string{"created_at"})
	tests := []struct {
		oid        uint32
		text, want string
	}{
		{pgtype.TimestamptzOID, "2026-12-02 09:30:00.5+01", "2026-12-02T08:30:00.5Z"},
		{pgtype.TimestamptzOID, "2026-12-02 09:30:00+05:30:15", "2026-12-02T03:59:45Z"},
		{pgtype.TimestamptzOID, "infinity", "infinity"},
		{pgtype.TimestamptzOID, "-infinity", "-infinity"},
		{pgtype.TimestamptzOID, "02.12.2026 09:30:00 CET", "02.12.2026 09:30:00 CET"}, // not ISO: passed on
		{pgtype.TimestampOID, "2026-12-02 09:30:00.123456", "2026-12-02T09:30:00.123456Z"},
		{pgtype.TimestampOID, "2026-12-02 09:30:00", "2026-12-02T09:30:00Z"},
		{pgtype.TimestampOID, "infinity", "infinity"},
		{pgtype.TimestampOID, "-infinity", "-infinity"},
	}
	for _, tt := range tests {
		row := d.Decode([]string{"created_at"}, []uint32{tt.oid}, [][]byte{[]byte(tt.text)})
		if p := row.Problem(); p != "" {
			t.Fatalf("%s: %s", tt.text, p)
		}
		if v, _ := row.Value("created_at"); string(v) != tt.want {
			t.Errorf("%s (oid %d) -> %q, want %q", tt.text, tt.oid, v, tt.want)
		}
	}
}

// slowTimestamp is convertText's general path: parse with pgtype, format as RFC 3339 in UTC.
func slowTimestamp(t *testing.T, oid uint32, text string) string {
	t.Helper()
	types := pgtype.NewMap()
	if oid == pgtype.TimestamptzOID {
		var ts pgtype.Timestamptz
		if err := types.Scan(oid, pgtype.TextFormatCode, []byte(text), &ts); err != nil {
			t.Fatalf("pgtype cannot parse %q: %v", text, err)
		}
		return ts.Time.UTC().Format(time.RFC3339Nano)
	}
	var ts pgtype.Timestamp
	if err := types.Scan(oid, pgtype.TextFormatCode, []byte(text), &ts); err != nil {
		t.Fatalf("pgtype cannot parse %q: %v", text, err)
	}
	return ts.Time.Format("2006-01-02T15:04:05.999999999") + "Z"
}

// TestISOTimestampFastPathAgrees: the per-row rewrite of PostgreSQL's ISO text into RFC 3339 gives
// what parsing and formatting give, for random instants of years 1 to 9999 in PostgreSQL's output
// form (microseconds, trailing zeros dropped), and declines every other form.
func TestISOTimestampFastPathAgrees(t *testing.T) {
	rng := rand.New(rand.NewPCG(23, uint64(time.Now().UnixNano())))
	lo, hi := time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC).Unix(), time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC).Unix()
	for i := 0; i < 20000; i++ {
		ts := time.Unix(lo+rng.Int64N(hi-lo), 0).UTC()
		switch rng.IntN(3) {
		case 0: // whole seconds
		case 1:
			ts = ts.Add(time.Duration(rng.IntN(1e6)) * time.Microsecond)
		default: // a few digits, as a round fraction prints
			ts = ts.Add(time.Duration(rng.IntN(10)) * 100 * time.Millisecond)
		}
		text := ts.Format("2006-01-02 15:04:05.999999") // PostgreSQL's ISO output in UTC
		for _, c := range []struct {
			oid    uint32
			suffix string
		}{{pgtype.TimestamptzOID, "+00"}, {pgtype.TimestampOID, ""}} {
			got, ok := isoTimestampToRFC3339([]byte(text+c.suffix), c.oid == pgtype.TimestamptzOID)
			if !ok {
				t.Fatalf("%q (oid %d): declined", text+c.suffix, c.oid)
			}
			if want := slowTimestamp(t, c.oid, text+c.suffix); string(got) != want {
				t.Fatalf("%q (oid %d) -> %q, parsing gives %q", text+c.suffix, c.oid, got, want)
			}
		}
	}
	for _, text := range []string{
		"2026-12-02 09:30:00+01", "2026-12-02 09:30:00+05:30", "2026-12-02 09:30:00-00",
		"0044-03-15 12:00:00+00 BC", "10000-01-01 00:00:00+00", "infinity", "-infinity",
		"2026-12-02 09:30:00.50+00", "2026-12-02 09:30:00.1234567+00", "2026-12-02 09:30:00.+00",
		"2026-12-02T09:30:00+00", "2026-12-02 09:30+00", "2026-12-0x 09:30:00+00", "+00", "",
		"2026-12-02 09:30:00.12a+00",
	} {
		if got, ok := isoTimestampToRFC3339([]byte(text), true); ok {
			t.Errorf("timestamptz %q -> %q, want it declined (parsed instead)", text, got)
		}
	}
	for _, text := range []string{"2026-12-02 09:30:00+00", "2026-12-02 09:30:00 BC", "2026-12-02 09:30:00.10", "infinity"} {
		if got, ok := isoTimestampToRFC3339([]byte(text), false); ok {
			t.Errorf("timestamp %q -> %q, want it declined (parsed instead)", text, got)
		}
	}
}

// TestStatusUpdateIsBoundedWhenThePeerStopsReading: a server (or a middlebox) that stops reading must
// not hold a status update until TCP gives up: the write fails within the stream's write timeout and
// the connection is closed, so the session ends and the next one starts.
func TestStatusUpdateIsBoundedWhenThePeerStopsReading(t *testing.T) {
	client, server := net.Pipe() // writes block until the other end reads: it never does
	defer server.Close()
	st := newTestStream()
	st.conn = pipeConn(t, client)
	st.writeTimeout = 200 * time.Millisecond
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- st.sendStatus(0x2000, false) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "presumed dead") {
			t.Fatalf("status update to a peer that reads nothing returned %v, want a timeout", err)
		}
		t.Logf("failed after %s: %v", time.Since(start).Round(time.Millisecond), err)
	case <-time.After(10 * time.Second):
		t.Fatal("the status update blocked for 10 s on a peer that reads nothing")
	}
	closed := make(chan error, 1)
	go func() { closed <- st.Close(context.Background()) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("closing the stream blocked on a peer that reads nothing")
	}
}

// BenchmarkTimestamptzToRFC3339 compares the per-row rewrite of created_at with parsing and
// formatting it (pgtype), the path for any other form.
func BenchmarkTimestamptzToRFC3339(b *testing.B) {
	text := []byte("2026-12-05 06:45:18.698028+00")
	types := pgtype.NewMap()
	b.Run("rewrite", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := convertText(types, pgtype.TimestamptzOID, text); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parse", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var ts pgtype.Timestamptz
			if err := types.Scan(pgtype.TimestamptzOID, pgtype.TextFormatCode, text, &ts); err != nil {
				b.Fatal(err)
			}
			_ = ts.Time.UTC().AppendFormat(nil, time.RFC3339Nano)
		}
	})
}

// flushRecorder is a Batcher whose Flush is due at a set time; it records when Flush ran.
type flushRecorder struct {
	recordingHandler
	due     time.Time
	flushed chan time.Time
}

func (b *flushRecorder) Committed(context.Context, *checkpoint.Tx, LSN) error { return nil }
func (b *flushRecorder) FlushDue() time.Time                                  { return b.due }
func (b *flushRecorder) Flush(context.Context) error {
	b.due = time.Time{}
	b.flushed <- time.Now()
	return nil
}

// TestReceiveWaitsAreBoundedAndInterruptible: the stream reads without a context per message (the
// socket's read deadline bounds each wait), so three things must still hold on a server that sends
// nothing: a batcher's Flush runs when due, not at the end of the second-long receive wait; the end
// of Run's context ends a blocked read at once; and the read deadline does not outlive Run, so that
// Finish's reads after it are not cut short.
func TestReceiveWaitsAreBoundedAndInterruptible(t *testing.T) {
	client, server := net.Pipe()
	defer server.Close()
	go func() { _, _ = io.Copy(io.Discard, server) }() // the server reads (status updates) and sends nothing
	st := newTestStream()
	st.conn = pipeConn(t, client)
	st.opts.StatusInterval = 10 * time.Second // one receive may wait a second (receiveWait)
	due := time.Now().Add(150 * time.Millisecond)
	h := &flushRecorder{due: due, flushed: make(chan time.Time, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- st.Run(ctx, checkpoint.NewTracker(100), h) }()

	select {
	case at := <-h.flushed:
		if late := at.Sub(due); late > 500*time.Millisecond {
			t.Errorf("Flush ran %s after it was due: the receive waited past the batcher's due time", late.Round(time.Millisecond))
		}
	case err := <-done:
		t.Fatalf("Run returned before the flush: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("Flush did not run within 5 s of being due")
	}

	time.Sleep(50 * time.Millisecond) // Run is blocked in a receive again
	canceled := time.Now()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Run returned %v after its context ended, want context.Canceled", err)
		}
		if took := time.Since(canceled); took > 500*time.Millisecond {
			t.Errorf("Run returned %s after its context ended: the blocked read was not interrupted", took.Round(time.Millisecond))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return within 5 s of its context ending")
	}

	// A read after Run (as Finish's) waits for the server, unbounded by Run's last deadline.
	go func() {
		time.Sleep(300 * time.Millisecond)
		_, _ = server.Write([]byte{'Z', 0, 0, 0, 5, 'I'}) // ReadyForQuery
	}()
	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer rcancel()
	msg, err := st.conn.ReceiveMessage(rctx)
	if err != nil {
		t.Fatalf("a read after Run failed: %v (Run's read deadline outlived it)", err)
	}
	if _, ok := msg.(*pgproto3.ReadyForQuery); !ok {
		t.Fatalf("a read after Run got %T, want ReadyForQuery", msg)
	}
}

// pipeConn is a PostgreSQL connection over client, one end of a net.Pipe whose other end the test
// plays the server on.
func pipeConn(t *testing.T, client net.Conn) *pgconn.PgConn {
	t.Helper()
	cfg, err := pgconn.ParseConfig("postgres://outbox@127.0.0.1/outbox")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgconn.Construct(&pgconn.HijackedConn{Conn: client, Frontend: pgproto3.NewFrontend(client, client), Config: cfg, ParameterStatuses: map[string]string{}})
	if err != nil {
		t.Fatal(err)
	}
	return conn
}
