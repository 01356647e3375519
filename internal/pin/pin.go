// Package pin charges memory that several records share to the in-flight byte cap once: rows are
// carved from blocks of a few tens of KiB (their values, columns and the row itself), and a record in
// flight keeps its row's whole block alive. The first record that holds a block charges the block's
// size; the last one to let go of it gives the size back. So a few records held long (a partition
// that does not acknowledge, a topic being created), each from another block, count for the blocks
// they keep alive, not for their own few hundred bytes.
package pin

import "sync/atomic"

// Block is a piece of memory shared by the rows carved from it. The zero of *Block (nil) is a row
// with memory of its own: it charges nothing beyond the record.
type Block struct {
	size int64
	refs atomic.Int64
}

// NewBlock returns a block of size bytes that no one holds.
func NewBlock(size int64) *Block { return &Block{size: size} }

// Size returns the block's size in bytes (0 for nil).
func (b *Block) Size() int64 {
	if b == nil {
		return 0
	}
	return b.size
}

// Hold counts one more holder and returns the bytes to charge: the block's size for the first
// holder, else 0.
func (b *Block) Hold() int64 {
	if b == nil {
		return 0
	}
	if b.refs.Add(1) == 1 {
		return b.size
	}
	return 0
}

// Release counts one holder less and returns the bytes to give back: the block's size when it was
// the last holder, else 0. Every Hold is matched by exactly one Release.
func (b *Block) Release() int64 {
	if b == nil {
		return 0
	}
	switch n := b.refs.Add(-1); {
	case n == 0:
		return b.size
	case n < 0:
		b.refs.Add(1) // a Release without its Hold gives nothing back (the tests check the pairs)
	}
	return 0
}

// Holders returns how many hold the block now.
func (b *Block) Holders() int64 {
	if b == nil {
		return 0
	}
	return b.refs.Load()
}
