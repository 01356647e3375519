package router

import (
	"context"
	"sync"
	"time"
)

// limiter caps records and bytes in flight. Acquire is called by one goroutine (the replication
// stream); Release from the producer's promise goroutine. The records' cap is a window between
// minRecords and maxRecords sized by the latency of the acknowledgements (windowSizer); with
// minRecords at maxRecords it is fixed.
type limiter struct {
	mu                   sync.Mutex
	records, bytes       int64
	maxRecords, maxBytes int64
	sizer                *windowSizer // nil: the window is fixed at maxRecords
	wake                 chan struct{}
	budget               *Budget // the process's, shared with the other sources; nil: none
}

func newLimiter(minRecords, maxRecords int, maxBytes int64, budget *Budget) *limiter {
	l := &limiter{maxRecords: int64(maxRecords), maxBytes: maxBytes, wake: make(chan struct{}, 1), budget: budget}
	if minRecords > 0 && minRecords < maxRecords {
		l.sizer = newWindowSizer(int64(minRecords), int64(maxRecords))
		l.maxRecords = l.sizer.window
	}
	return l
}

// Acquire takes room for one record of n bytes, waiting until there is room or ctx ends. A record
// always fits when nothing is in flight, so one over the byte cap cannot wedge the router.
func (l *limiter) Acquire(ctx context.Context, n int64) error { return l.acquire(ctx, n, false) }

// AcquireAlone takes room for one record of n bytes once nothing else is in flight, waiting until
// then or until ctx ends: the record is then alone in the producer, in a batch of its own.
func (l *limiter) AcquireAlone(ctx context.Context, n int64) error { return l.acquire(ctx, n, true) }

func (l *limiter) acquire(ctx context.Context, n int64, alone bool) error {
	for !l.take(n, alone) {
		// Waiting: the budget's signal is taken, then room tried for again, so that room another
		// source returns in between is not missed.
		shared := l.budget.changed()
		if l.take(n, alone) {
			return nil
		}
		select {
		case <-l.wake:
		case <-shared:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// take takes room for one record of n bytes (alone: only when nothing is in flight) and returns
// true, or returns false. A record always fits when nothing of this source is in flight, whatever
// the budget says, so that one busy source never stalls another for good.
func (l *limiter) take(n int64, alone bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.records == 0 || (!alone && l.records < l.maxRecords && l.bytes+n <= l.maxBytes && l.budget.take(n)) {
		if l.records == 0 {
			l.budget.charge(n)
		}
		l.records++
		l.bytes += n
		return true
	}
	if !alone && l.sizer != nil && l.records >= l.maxRecords && l.sizer.wait(time.Now()) {
		l.maxRecords = l.sizer.window // the window holds the stream back
	}
	return false
}

// Release returns the room of one record of n bytes that was not acknowledged.
func (l *limiter) Release(n int64) { l.release(n, time.Time{}, -1) }

// ReleaseAcked returns the room of one record of n bytes that Kafka acknowledged at now, took
// after it was handed over, for the window's sizing.
func (l *limiter) ReleaseAcked(n int64, now time.Time, took time.Duration) { l.release(n, now, took) }

func (l *limiter) release(n int64, now time.Time, took time.Duration) {
	l.budget.give(n)
	l.mu.Lock()
	l.records--
	l.bytes -= n
	if l.sizer != nil && took >= 0 && l.sizer.acked(now, took) {
		l.maxRecords = l.sizer.window
	}
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// ReleaseBytes returns n bytes of room that no record holds any more (a shared block whose last
// holder gave up before it was charged).
func (l *limiter) ReleaseBytes(n int64) {
	l.budget.give(n)
	l.mu.Lock()
	l.bytes -= n
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// InFlight returns the records and bytes in flight, and the records' cap now.
func (l *limiter) InFlight() (records, bytes, window int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.records, l.bytes, l.maxRecords
}

// Budget caps the bytes in flight of several routers together — a fleet's sources — so that the
// process's memory is bounded by configuration, not by the number of busy sources times each one's
// limits. Each router still keeps its own limits; a router with nothing in flight always gets one
// record through, so that a source is slowed by the others, never stopped. Safe for concurrent use;
// a nil *Budget is no budget.
type Budget struct {
	mu       sync.Mutex
	bytes    int64
	max      int64
	released chan struct{} // closed, and replaced, when room is returned while a router waits
	waiting  bool          // a router took released to wait on
}

// NewBudget returns a budget of max bytes.
func NewBudget(max int64) *Budget { return &Budget{max: max, released: make(chan struct{})} }

// take charges n bytes when they fit.
func (b *Budget) take(n int64) bool {
	if b == nil {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.bytes+n > b.max {
		return false
	}
	b.bytes += n
	return true
}

// charge charges n bytes whether they fit or not (a router's only record in flight).
func (b *Budget) charge(n int64) {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.bytes += n
	b.mu.Unlock()
}

// give returns n bytes and wakes the routers that wait for room.
func (b *Budget) give(n int64) {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.bytes -= n
	if b.waiting {
		close(b.released)
		b.released, b.waiting = make(chan struct{}), false
	}
	b.mu.Unlock()
}

// changed is closed the next time room is returned (never, for no budget).
func (b *Budget) changed() <-chan struct{} {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.waiting = true
	return b.released
}

// InFlight returns the bytes charged now and the budget's cap.
func (b *Budget) InFlight() (bytes, max int64) {
	if b == nil {
		return 0, 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.bytes, b.max
}
