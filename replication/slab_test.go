package replication

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"unsafe"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
	"github.com/outbox-cdc/outbox-cdc/internal/pin"
)

// TestSlabPiecesAreDisjoint hands out pieces of random sizes (some larger than a slab) and checks
// that each keeps what was written into it, however much is taken after it, and that growing a
// piece (append) cannot write into the next one.
func TestSlabPiecesAreDisjoint(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var s slab
	type piece struct {
		b    []byte
		c    []Column
		r    *Row
		a    blockArrays
		fill byte
	}
	var pieces []piece
	for i := range 5000 {
		n := rng.IntN(600)
		if i%97 == 0 {
			n = slabBytes/4 + rng.IntN(slabBytes) // its own allocation
		}
		c := 1 + rng.IntN(12)
		s.fit(n, c)
		p := piece{b: s.take(n), c: s.columns(c), fill: byte(i)}
		p.r = s.row(Row{LSN: LSN(i), Columns: p.c})
		p.a = arraysOf(&s)
		if n <= slabOwnValues && n > 0 && !within(unsafe.Pointer(unsafe.SliceData(p.b)), n, p.a.bytes, p.a.nBytes) {
			t.Fatalf("piece %d: its bytes are not in its row's block", i)
		}
		if len(p.b) != n || cap(p.b) != n {
			t.Fatalf("take(%d): len %d cap %d", n, len(p.b), cap(p.b))
		}
		for j := range p.b {
			p.b[j] = p.fill
		}
		for j := range p.c {
			p.c[j].TypeOID = uint32(i)
		}
		pieces = append(pieces, p)
	}
	grown := make([][]Column, 0, len(pieces))
	for i, p := range pieces { // growing a piece must not reach the next one
		pieces[i].b = append(p.b, 0xFF)[:len(p.b)]
		grown = append(grown, append(p.c, Column{TypeOID: 1<<32 - 1}))
	}
	for i, p := range pieces {
		if len(grown[i]) != len(p.c)+1 {
			t.Fatalf("piece %d did not grow", i)
		}
		if !bytes.Equal(p.b, bytes.Repeat([]byte{p.fill}, len(p.b))) {
			t.Fatalf("piece %d (%d bytes) was overwritten", i, len(p.b))
		}
		for _, c := range p.c {
			if c.TypeOID != uint32(i) {
				t.Fatalf("columns of piece %d were overwritten: %d", i, c.TypeOID)
			}
		}
		if p.r.LSN != LSN(i) || p.r.Block() == nil {
			t.Fatalf("row of piece %d reads LSN %d, block %p", i, p.r.LSN, p.r.Block())
		}
		if len(p.b) > slabOwnValues {
			// A block of its own, counting all it keeps alive.
			if want := int64(len(p.b) + len(p.c)*columnSize + rowSize); p.r.Block().Size() != want || p.r.Block() == s.block {
				t.Fatalf("piece %d of %d bytes: block of %d bytes (shared: %v), want its own of %d", i, len(p.b), p.r.Block().Size(), p.r.Block() == s.block, want)
			}
			continue
		}
		checkInBlock(t, fmt.Sprint("piece ", i), p.r, p.a)
	}
}

// within reports whether the n bytes at p lie inside the allocation of size bytes at base.
func within(p unsafe.Pointer, n int, base unsafe.Pointer, size int) bool {
	return uintptr(p) >= uintptr(base) && uintptr(p)+uintptr(n) <= uintptr(base)+uintptr(size)
}

// blockArrays are the allocations one block hands out, as the slab held them.
type blockArrays struct {
	bytes, cols, rows unsafe.Pointer
	nBytes, nCols     int
	nRows             int
}

// arraysOf returns the current block's allocations of s.
func arraysOf(s *slab) blockArrays {
	return blockArrays{
		bytes: unsafe.Pointer(unsafe.SliceData(s.bytes)), nBytes: cap(s.bytes),
		cols: unsafe.Pointer(unsafe.SliceData(s.cols)), nCols: cap(s.cols) * columnSize,
		rows: unsafe.Pointer(unsafe.SliceData(s.rows)), nRows: cap(s.rows) * rowSize,
	}
}

// checkInBlock fails t unless every piece of r (its values in the slab, its columns, the Row itself)
// lies in the allocations of r's block, and the block's size counts all three.
func checkInBlock(t *testing.T, what string, r *Row, a blockArrays) {
	t.Helper()
	if !within(unsafe.Pointer(r), rowSize, a.rows, a.nRows) {
		t.Fatalf("%s: the Row is not in its block's rows", what)
	}
	if !within(unsafe.Pointer(unsafe.SliceData(r.Columns)), len(r.Columns)*columnSize, a.cols, a.nCols) {
		t.Fatalf("%s: its columns are not in its block's columns", what)
	}
	total := 0 // the tuple's bytes, about: its values are in the block unless they are more than slabOwnValues
	for _, c := range r.Columns {
		total += len(c.Value) + 5
	}
	for _, c := range r.Columns {
		if len(c.Value) > 0 && total <= slabOwnValues && !within(unsafe.Pointer(unsafe.SliceData(c.Value)), len(c.Value), a.bytes, a.nBytes) {
			t.Fatalf("%s: the value of %s (%d bytes) is not in its block's bytes", what, c.Name, len(c.Value))
		}
	}
	if want := int64(a.nBytes + a.nCols + a.nRows); r.Block().Size() != want {
		t.Fatalf("%s: block of %d bytes, its allocations hold %d", what, r.Block().Size(), want)
	}
}

// TestStreamRowsComeFromOneBlock feeds the stream inserts of random sizes (some with a value of its
// own allocation) and checks that each row's values, columns and the Row itself come from the block
// the row names: the router charges that block while the row's record is in flight, and a row
// whose pieces straddled two blocks would keep one alive uncharged.
func TestStreamRowsComeFromOneBlock(t *testing.T) {
	st := newTestStream()
	h := &keepingHandler{}
	feed(t, st, h, relationMsg(1, "public", "outbox", col{"event_id", pgtype.TextOID}, col{"event_type", pgtype.TextOID},
		col{"aggregate_id", pgtype.TextOID}, col{"payload", pgtype.JSONBOID}, col{"headers", pgtype.JSONBOID}, col{"n", pgtype.Int8OID}), beginMsg(900))
	rng := rand.New(rand.NewPCG(3, 4))
	arrays := map[*pin.Block]blockArrays{}
	for i := range 3000 {
		payload := strings.Repeat("x", rng.IntN(900)) // the bytes run out before the columns and rows
		if i/500%2 == 1 {
			payload = strings.Repeat("z", rng.IntN(20)) // the columns and rows run out first
		}
		if i%101 == 0 {
			payload = strings.Repeat("y", slabOwnValues+rng.IntN(slabBytes))
		}
		feed(t, st, h, insertMsg(1, s(fmt.Sprint("e", i)), s("Paid"), s(fmt.Sprint("agg-", i%7)), s(payload), nil, s("7")))
		r := h.rows[len(h.rows)-1]
		if len(payload) > slabOwnValues {
			// A row too large for a block is a block of its own, counting every value it keeps alive.
			if r.Block() == nil || r.Block() == st.space.block || r.Block().Size() < int64(len(payload)) {
				t.Fatalf("row %d of %d bytes: block %p of %d bytes (the stream's %p)", i, len(payload), r.Block(), r.Block().Size(), st.space.block)
			}
			continue
		}
		if r.Block() == nil || r.Block() != st.space.block {
			t.Fatalf("row %d names block %p, the stream's is %p", i, r.Block(), st.space.block)
		}
		if _, ok := arrays[r.Block()]; !ok {
			arrays[r.Block()] = arraysOf(&st.space)
		}
		checkInBlock(t, fmt.Sprint("row ", i, " as read"), r, arrays[r.Block()])
		if v, _ := r.Value("payload"); string(v) != payload {
			t.Fatalf("row %d: payload of %d bytes, want %d", i, len(v), len(payload))
		}
	}
	if len(arrays) < 10 {
		t.Fatalf("3000 rows in %d blocks: the test did not cross blocks", len(arrays))
	}
	for i, r := range h.rows {
		if _, ok := arrays[r.Block()]; !ok {
			continue // a block of its own
		}
		checkInBlock(t, fmt.Sprint("row ", i), r, arrays[r.Block()])
	}
}

// keepingHandler keeps the rows it is handed, as the router does while their records are in flight.
type keepingHandler struct{ rows []*Row }

func (h *keepingHandler) Deliver(_ context.Context, _ *checkpoint.Tx, row *Row) error {
	h.rows = append(h.rows, row)
	return nil
}

// TestSlabBlocksFitTheirRows fills the slab with rows of one shape and checks that, from the second
// block on, every block is mostly used when it is replaced: the part that ran out full, the other
// two at least three quarters. Blocks of fixed parts left a quarter of themselves unused with the
// outbox's typical rows, and all of a block is charged to the in-flight byte cap.
func TestSlabBlocksFitTheirRows(t *testing.T) {
	for _, shape := range []struct {
		name        string
		bytes, cols int
	}{
		{"typical outbox row", 720, 8},
		{"small values", 40, 6},
		{"many columns", 200, 60},
		{"one large value", 3000, 5},
		{"no values", 0, 4},
	} {
		t.Run(shape.name, func(t *testing.T) {
			var s slab
			blocks := 0
			for i := range 3000 {
				before := s.block
				used := [3]float64{
					float64(len(s.bytes)) / float64(max(cap(s.bytes), 1)),
					float64(len(s.cols)) / float64(max(cap(s.cols), 1)),
					float64(len(s.rows)) / float64(max(cap(s.rows), 1)),
				}
				s.fit(shape.bytes, shape.cols)
				if before != nil && s.block != before {
					blocks++
					if blocks > 1 { // the first block has the defaults
						full, least := max(used[0], used[1], used[2]), min(used[0], used[1], used[2])
						if shape.bytes == 0 {
							least = min(used[1], used[2])
						}
						if full < 0.9 || least < 0.75 {
							t.Fatalf("row %d: block %d replaced with values/columns/rows %.2f/%.2f/%.2f used", i, blocks, used[0], used[1], used[2])
						}
					}
				}
				s.take(shape.bytes)
				s.columns(shape.cols)
				s.row(Row{LSN: LSN(i)})
			}
			if blocks < 3 {
				t.Fatalf("only %d blocks for 3000 rows", blocks)
			}
		})
	}
}

// TestSlabRowDoesNotAllocate checks that a row carved from the slab costs no allocation of its own:
// its values, columns and the Row itself come from the block (a few allocations per block, less than
// one per row on average). A Row returned by address from row's parameter moved every call's Row to
// the heap, one allocation per event.
func TestSlabRowDoesNotAllocate(t *testing.T) {
	var s slab
	i := 0
	if allocs := testing.AllocsPerRun(2000, func() {
		s.fit(700, 8)
		v := s.take(700)
		c := s.columns(8)
		c[0].Value = v
		s.row(Row{LSN: LSN(i), Columns: c})
		i++
	}); allocs != 0 {
		t.Fatalf("a row from the slab allocates %v times, want 0 (amortized over its block)", allocs)
	}
}
