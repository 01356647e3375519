package replication

import (
	"bytes"
	"math/rand/v2"
	"testing"
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
		fill byte
	}
	var pieces []piece
	for i := range 5000 {
		n := rng.IntN(600)
		if i%97 == 0 {
			n = slabBytes/4 + rng.IntN(slabBytes) // its own allocation
		}
		p := piece{b: s.take(n), c: s.columns(1 + rng.IntN(12)), fill: byte(i)}
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
	}
}
