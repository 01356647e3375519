package router

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// TestBudgetBoundsSourcesTogether: four limiters, each allowed 64 KiB, share a 100 KiB budget while
// goroutines take and return random record sizes. The bytes charged together never exceed the budget
// by more than one record per limiter (a limiter with nothing in flight always gets one through), no
// limiter waits for ever while another returns room, and everything returned leaves the budget at 0.
func TestBudgetBoundsSourcesTogether(t *testing.T) {
	const sources, perSource, budget = 4, 64 << 10, 100 << 10
	b := NewBudget(budget)
	var maxSeen int64
	var mu sync.Mutex
	observe := func() {
		used, _ := b.InFlight()
		mu.Lock()
		maxSeen = max(maxSeen, used)
		mu.Unlock()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for s := range sources {
		l := newLimiter(0, 1000, perSource, b)
		rng := rand.New(rand.NewPCG(uint64(s), 7))
		held := make(chan int64, 1000)
		wg.Add(2)
		go func() { // the stream: takes room
			defer wg.Done()
			defer close(held)
			for range 3000 {
				n := int64(1 + rng.IntN(8<<10))
				if err := l.Acquire(ctx, n); err != nil {
					t.Errorf("source %d waited for room until the deadline: %v", s, err)
					return
				}
				observe()
				held <- n
			}
		}()
		go func() { // the acknowledgements: return it, a little later
			defer wg.Done()
			for n := range held {
				if rand.IntN(4) == 0 {
					time.Sleep(50 * time.Microsecond)
				}
				l.Release(n)
			}
		}()
	}
	wg.Wait()
	if maxSeen > budget+sources*(8<<10) {
		t.Errorf("%d bytes in flight together, over the budget of %d and one record per source", maxSeen, budget)
	}
	if used, _ := b.InFlight(); used != 0 {
		t.Errorf("%d bytes still charged after everything was returned", used)
	}
	t.Logf("peak %d bytes in flight together (budget %d, each source's own cap %d)", maxSeen, budget, perSource)
}

// TestBudgetWakesAnotherSource: a source that waits because the budget is used up by another one
// takes its record as soon as the other returns room, though its own limits never stood in the way.
func TestBudgetWakesAnotherSource(t *testing.T) {
	b := NewBudget(100)
	busy, waiting := newLimiter(0, 10, 1000, b), newLimiter(0, 10, 1000, b)
	for range 2 {
		if err := busy.Acquire(context.Background(), 50); err != nil {
			t.Fatal(err)
		}
	}
	if err := waiting.Acquire(context.Background(), 60); err != nil { // alone in its limiter: gets through
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- waiting.Acquire(context.Background(), 10) }()
	select {
	case err := <-got:
		t.Fatalf("took room the budget does not have: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	busy.Release(50)
	busy.Release(50)
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting source was not woken when the other returned room")
	}
}
