package pin

import (
	"math/rand/v2"
	"sync"
	"testing"
)

// TestChargesOncePerBlock holds and releases a block from many goroutines at random, as records of
// one block are prepared by the stream and acknowledged by the producer, and checks that what was
// charged minus what was given back is always the block's size while anyone holds it, and 0 after.
func TestChargesOncePerBlock(t *testing.T) {
	for round := range 50 {
		b := NewBlock(int64(1000 + round))
		var mu sync.Mutex
		var charged int64
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 200 + rand.IntN(200) {
					c := b.Hold()
					mu.Lock()
					charged += c
					mu.Unlock()
					if got := b.Holders(); got < 1 {
						t.Errorf("a holder sees %d holders", got)
					}
					r := b.Release()
					mu.Lock()
					charged -= r
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if charged != 0 || b.Holders() != 0 {
			t.Fatalf("round %d: %d bytes still charged, %d holders, after every hold was released", round, charged, b.Holders())
		}
	}
}

func TestHoldAndRelease(t *testing.T) {
	b := NewBlock(32 << 10)
	if c := b.Hold(); c != 32<<10 {
		t.Fatalf("first Hold charged %d, want the block's size %d", c, 32<<10)
	}
	if c := b.Hold(); c != 0 {
		t.Fatalf("second Hold charged %d, want 0", c)
	}
	if r := b.Release(); r != 0 {
		t.Fatalf("Release with a holder left gave back %d, want 0", r)
	}
	if r := b.Release(); r != 32<<10 {
		t.Fatalf("last Release gave back %d, want %d", r, 32<<10)
	}
	if r := b.Release(); r != 0 || b.Holders() != 0 {
		t.Fatalf("a Release without its Hold gave back %d (holders %d), want 0", r, b.Holders())
	}
	if c := b.Hold(); c != 32<<10 {
		t.Fatalf("Hold after the block was let go charged %d, want its size again", c)
	}
	var none *Block
	if none.Hold() != 0 || none.Release() != 0 || none.Size() != 0 || none.Holders() != 0 {
		t.Fatal("a nil block charges something")
	}
}
