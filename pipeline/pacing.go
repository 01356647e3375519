// Pacing: when what waits in the producer (at-least-once) or in the open Kafka transaction
// (exactly-once) is sent — at once on a quiet stream, in fuller batches on a busy one.

package pipeline

import (
	"context"
	"time"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// quietClock tells when what waits for a batch should go out at once because the WAL stream is
// quiet: at once at the end of a transaction that came after the stream had been quiet for the quiet
// period (an isolated transaction: nothing suggests another one is close behind), otherwise once the
// stream has stayed quiet for the quiet period after a transaction. Under load transactions follow
// each other closely, so neither happens and batches fill.
type quietClock struct {
	quiet    time.Duration
	lastEnd  time.Time // when the stream last saw a transaction end
	txStart  time.Time // when the current transaction's first row arrived; zero before it
	isolated bool      // the last transaction began after a quiet period
}

// row notes a row of the current transaction.
func (q *quietClock) row() {
	if q.txStart.IsZero() {
		q.txStart = time.Now()
	}
}

// end notes a transaction's end, with rows or without.
func (q *quietClock) end() {
	now := time.Now()
	q.isolated = !q.txStart.IsZero() && q.txStart.Sub(q.lastEnd) >= q.quiet
	q.lastEnd, q.txStart = now, time.Time{}
}

// sent notes that what waited went out; a Flush that blocked the stream (a Kafka commit) is not a
// quiet period, so the next transaction's gap counts from now.
func (q *quietClock) sent() { q.lastEnd = time.Now() }

// due is when to send what waits.
func (q *quietClock) due() time.Time {
	if q.isolated {
		return q.lastEnd
	}
	return q.lastEnd.Add(q.quiet)
}

// txPace measures how closely PostgreSQL transactions with rows follow one another: a moving
// average of the gaps between their ends, each gap counted as at most bound, so that after a long
// idle period a busy stream is seen within a few transactions.
type txPace struct {
	bound   time.Duration
	lastEnd time.Time     // when the last transaction with rows ended
	gap     time.Duration // the average gap; 0 until two have ended
}

// note notes that a transaction with rows ended at now.
func (p *txPace) note(now time.Time) {
	if !p.lastEnd.IsZero() {
		gap := min(now.Sub(p.lastEnd), p.bound)
		if p.gap == 0 {
			p.gap = gap
		} else {
			p.gap += (gap - p.gap) / 8
		}
	}
	p.lastEnd = now
}

// busy reports whether transactions with rows end, on average, less than bound/busyGaps apart.
func (p *txPace) busy() bool {
	return p.gap > 0 && p.gap < p.bound/busyGaps
}

// quietHandler is the at-least-once handler that sends what lingers in the producer as soon as the
// WAL stream is quiet (quietClock): low latency at low load, lingering batches under load, without a
// knob to choose between them.
type quietHandler struct {
	handler
	clock    quietClock
	pace     txPace    // bound: kafka.linger
	lastKick time.Time // when what lingered was last sent at once
	pending  bool      // rows were produced since the last kick
}

// Deliver implements replication.Handler.
func (h *quietHandler) Deliver(ctx context.Context, tx *checkpoint.Tx, row *replication.Row) error {
	if err := h.handler.Deliver(ctx, tx, row); err != nil {
		return err
	}
	h.clock.row()
	h.pending = true
	return nil
}

// Committed implements replication.Batcher.
func (h *quietHandler) Committed(context.Context, *checkpoint.Tx, checkpoint.LSN) error {
	rows := !h.clock.txStart.IsZero()
	h.clock.end()
	if rows {
		h.pace.note(h.clock.lastEnd)
	}
	return nil
}

// FlushDue implements replication.Batcher.
//
// On a busy stream (txPace) the short gaps between transactions look quiet too, and a send at every
// one of them turns the linger off: at 10,000 events/s in 10-row transactions about a thousand small
// produce requests a second, each one work for the broker and for this process, which tells on a
// shared host (measured with the bench's CPU burner on one core: p99 44 ms, against 26 ms with the
// linger alone). So on a busy stream a send on a quiet stream comes at most every half linger after
// the one before; a lone transaction still goes out at once.
func (h *quietHandler) FlushDue() time.Time {
	if !h.pending {
		return time.Time{}
	}
	due := h.clock.due()
	if h.pace.busy() {
		if spaced := h.lastKick.Add(h.pace.bound / 2); spaced.After(due) {
			due = spaced
		}
	}
	return due
}

// Flush implements replication.Batcher: it kicks the producer and does not wait.
func (h *quietHandler) Flush(context.Context) error {
	h.pending = false
	h.lastKick = time.Now()
	h.router.Kick()
	return nil
}
