package router

import (
	"context"
	"sync"
)

// limiter caps records and bytes in flight. Acquire is called by one goroutine (the replication
// stream); Release from the producer's promise goroutine.
type limiter struct {
	mu                   sync.Mutex
	records, bytes       int64
	maxRecords, maxBytes int64
	wake                 chan struct{}
}

func newLimiter(maxRecords int, maxBytes int64) *limiter {
	return &limiter{maxRecords: int64(maxRecords), maxBytes: maxBytes, wake: make(chan struct{}, 1)}
}

// Acquire takes room for one record of n bytes, waiting until there is room or ctx ends. A record
// always fits when nothing is in flight, so one over the byte cap cannot wedge the router.
func (l *limiter) Acquire(ctx context.Context, n int64) error { return l.acquire(ctx, n, false) }

// AcquireAlone takes room for one record of n bytes once nothing else is in flight, waiting until
// then or until ctx ends: the record is then alone in the producer, in a batch of its own.
func (l *limiter) AcquireAlone(ctx context.Context, n int64) error { return l.acquire(ctx, n, true) }

func (l *limiter) acquire(ctx context.Context, n int64, alone bool) error {
	for {
		l.mu.Lock()
		if l.records == 0 || (!alone && l.records < l.maxRecords && l.bytes+n <= l.maxBytes) {
			l.records++
			l.bytes += n
			l.mu.Unlock()
			return nil
		}
		l.mu.Unlock()
		select {
		case <-l.wake:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Release returns the room of one record of n bytes.
func (l *limiter) Release(n int64) {
	l.mu.Lock()
	l.records--
	l.bytes -= n
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// InFlight returns the records and bytes in flight.
func (l *limiter) InFlight() (records, bytes int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.records, l.bytes
}
