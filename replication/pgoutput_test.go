package replication

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"
)

// referenceInsert parses msg with pglogrepl, as the stream did before parseInsert: ok is false when
// pglogrepl fails or panics, leaves bytes unread, or meets a column kind it does not know (which it
// passes over silently).
func referenceInsert(msg []byte) (relID uint32, cols []*pglogrepl.TupleDataColumn, ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	if len(msg) == 8 && msg[0] == 'I' && msg[5] == 'N' && msg[6] == 0 && msg[7] == 0 {
		// No columns: pglogrepl wants at least one byte of tuple; the protocol allows none.
		return binary.BigEndian.Uint32(msg[1:5]), nil, true
	}
	m, err := pglogrepl.ParseV2(msg, false)
	if err != nil {
		return 0, nil, false
	}
	ins, isInsert := m.(*pglogrepl.InsertMessageV2)
	if !isInsert {
		return 0, nil, false
	}
	var td pglogrepl.TupleData
	if used, err := td.Decode(msg[6:]); err != nil || 6+used != len(msg) {
		return 0, nil, false
	}
	for _, c := range ins.Tuple.Columns {
		switch c.DataType {
		case 'n', 'u', 't', 'b':
		default:
			return 0, nil, false
		}
	}
	return ins.RelationID, ins.Tuple.Columns, true
}

// checkParseInsert holds parseInsert to pglogrepl: both accept the same messages with the same
// values, and what parseInsert returns does not share memory with msg.
func checkParseInsert(t *testing.T, msg []byte) {
	t.Helper()
	wantID, want, wantOK := referenceInsert(msg)
	id, got, err := parseInsert(msg, nil, nil)
	if (err == nil) != wantOK {
		t.Fatalf("parseInsert(%x): err %v, pglogrepl accepts: %v", msg, err, wantOK)
	}
	if err != nil {
		if !errors.Is(err, errMalformed) {
			t.Fatalf("parseInsert(%x): %v is not errMalformed", msg, err)
		}
		return
	}
	if id != wantID || len(got) != len(want) {
		t.Fatalf("parseInsert(%x): relation %d, %d columns; pglogrepl: %d, %d", msg, id, len(got), wantID, len(want))
	}
	for i := range got {
		if got[i].kind != want[i].DataType || !bytes.Equal(got[i].data, want[i].Data) {
			t.Fatalf("parseInsert(%x): column %d = %q %q; pglogrepl: %q %q", msg, i, got[i].kind, got[i].data, want[i].DataType, want[i].Data)
		}
	}
	before := make([][]byte, len(got))
	for i := range got {
		before[i] = bytes.Clone(got[i].data)
	}
	for i := range msg {
		msg[i] ^= 0xff
	}
	for i := range got {
		if !bytes.Equal(got[i].data, before[i]) {
			t.Fatalf("parseInsert: column %d changed with the message buffer: it was not copied", i)
		}
	}
}

// randomInsert builds a well-formed Insert of random columns.
func randomInsert(r *rand.Rand) []byte {
	w := &wal{}
	w.u8('I')
	w.u32(r.Uint32())
	w.u8('N')
	n := r.IntN(12)
	w.u16(uint16(n))
	for range n {
		kind := "ntbu"[r.IntN(4)]
		w.u8(kind)
		if kind == 't' || kind == 'b' {
			v := make([]byte, r.IntN(300))
			for i := range v {
				v[i] = byte(r.Uint32())
			}
			w.u32(uint32(len(v)))
			w.b = append(w.b, v...)
		}
	}
	return w.bytes()
}

// mutate damages a message the ways a broken stream could: cut short, a byte changed, bytes added.
func mutate(r *rand.Rand, msg []byte) []byte {
	switch r.IntN(4) {
	case 0:
		return msg[:r.IntN(len(msg))]
	case 1:
		msg[r.IntN(len(msg))] = byte(r.Uint32())
		return msg
	case 2:
		return append(msg, byte(r.Uint32()))
	default:
		return msg
	}
}

func TestParseInsertMatchesPglogrepl(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	accepted := 0
	for range 5000 {
		msg := randomInsert(r)
		if r.IntN(2) == 0 {
			msg = mutate(r, msg)
		}
		if _, _, err := parseInsert(bytes.Clone(msg), nil, nil); err == nil {
			accepted++
		}
		checkParseInsert(t, msg)
	}
	if accepted < 1250 || accepted > 4750 {
		t.Fatalf("%d of 5000 accepted: the generator no longer makes both good and broken messages", accepted)
	}
}

func TestParseInsertReusesItsScratch(t *testing.T) {
	msg := insertMsg(7, s("a"), nil, s("ccc"))
	scratch := make([]tupleColumn, 0, 8)
	_, cols, err := parseInsert(msg, scratch, nil)
	if err != nil {
		t.Fatal(err)
	}
	if &cols[:1][0] != &scratch[:1][0] {
		t.Fatal("parseInsert allocated a new column slice though the scratch had room")
	}
	if allocs := testing.AllocsPerRun(100, func() { _, cols, _ = parseInsert(msg, cols, nil) }); allocs != 1 {
		t.Fatalf("parseInsert allocates %v times per row, want 1 (the values' buffer)", allocs)
	}
	// With a slab, the values' buffers of many rows are one allocation.
	var space slab
	if allocs := testing.AllocsPerRun(1000, func() { _, cols, _ = parseInsert(msg, cols, &space) }); allocs != 0 {
		t.Fatalf("parseInsert with a slab allocates %v times per row, want 0", allocs)
	}
}

func TestMalformedMessagesAreErrorsNotPanics(t *testing.T) {
	for _, msg := range [][]byte{
		{}, {'R'}, {'R', 0, 0, 0, 1}, {'B', 1, 2}, {'C'}, {'T', 0, 0, 0, 5, 0}, {'Y', 0}, {'O'}, {'M'},
		{'U', 0, 0}, {'D'}, {'I', 0, 0, 0, 1, 'N', 0, 1, 't', 0, 0, 0, 9, 'x'},
	} {
		st := newTestStream()
		if len(msg) > 0 && msg[0] == 'I' {
			// An insert is parsed only for a known outbox relation inside a transaction: set up just
			// that, so that nothing but the malformed message can fail it.
			feedOK(t, st, relationMsg(1, "public", "outbox", col{"a", pgtype.TextOID}), beginMsg(1))
		}
		err := st.handleWAL(t.Context(), &recordingHandler{}, pglogrepl.XLogData{WALData: msg})
		if !errors.Is(err, errMalformed) || !errors.Is(err, ErrUnreadable) {
			t.Errorf("handleWAL(%q): %v, want a malformed-message error (ErrUnreadable)", msg, err)
		}
	}
}

// feedOK hands well-formed messages to the stream.
func feedOK(t *testing.T, st *Stream, msgs ...[]byte) {
	t.Helper()
	for _, m := range msgs {
		if err := st.handleWAL(t.Context(), &recordingHandler{}, pglogrepl.XLogData{WALData: m}); err != nil {
			t.Fatalf("well-formed message %q: %v", m[:1], err)
		}
	}
}

func FuzzParseInsert(f *testing.F) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 20 {
		f.Add(randomInsert(r))
	}
	f.Add(insertMsg(1, s("x"), nil))
	f.Fuzz(func(t *testing.T, msg []byte) { checkParseInsert(t, msg) })
}

func BenchmarkDecodeInsert(b *testing.B) {
	payload := string(bytes.Repeat([]byte("x"), 300))
	msg := insertMsg(1, s("0f8fad5b-d9cb-469f-a165-70867728950e"), s("order"), s("order-42"), s("OrderCreated"), s(payload), s("2026-12-03 05:00:00+00"), nil, nil)
	b.Run("hand", func(b *testing.B) {
		var cols []tupleColumn
		b.ReportAllocs()
		for b.Loop() {
			_, cols, _ = parseInsert(msg, cols, nil)
		}
	})
	b.Run("pglogrepl", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = pglogrepl.ParseV2(msg, false)
		}
	})
}
