package replication

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
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

func (h *recordingHandler) Deliver(_ context.Context, tx *checkpoint.Tx, row Row) error {
	if h.tracker != nil {
		h.tracker.Add(tx)
	}
	h.rows = append(h.rows, row)
	h.txs = append(h.txs, tx)
	return nil
}

func newTestStream() *Stream {
	return &Stream{
		opts:     Options{Outbox: Outbox{Schema: "public", Table: "outbox", Publication: "pub"}, StatusInterval: time.Hour},
		types:    pgtype.NewMap(),
		rels:     make(map[uint32]*relation),
		counters: new(Counters),
		tracker:  checkpoint.NewTracker(100),
		lastSent: time.Now(),
		sentLSN:  100,
	}
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
			if err == nil {
				t.Fatal("accepted")
			}
		})
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
	d := NewRowDecoder()
	tests := []struct {
		oid        uint32
		text, want string
	}{
		{pgtype.TimestamptzOID, "2026-12-02 09:30:00.5+01", "2026-12-02T08:30:00.5Z"},
		{pgtype.TimestampOID, "2026-12-02 09:30:00.123456", "2026-12-02T09:30:00.123456Z"},
		{pgtype.TimestampOID, "2026-12-02 09:30:00", "2026-12-02T09:30:00Z"},
		{pgtype.TimestampOID, "infinity", "infinity"},
	}
	for _, tt := range tests {
		row, err := d.Decode([]string{"created_at"}, []uint32{tt.oid}, [][]byte{[]byte(tt.text)})
		if err != nil {
			t.Fatalf("%s: %v", tt.text, err)
		}
		if v, _ := row.Value("created_at"); string(v) != tt.want {
			t.Errorf("%s (oid %d) -> %q, want %q", tt.text, tt.oid, v, tt.want)
		}
	}
}
