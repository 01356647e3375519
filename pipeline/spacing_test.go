package pipeline

import (
	"testing"
	"time"
)

// TestBusyStreamSpacesQuietCommits: on a quiet stream a transaction commits as soon as the stream is
// quiet, even right after the commit before; on a busy stream (transactions with rows ending less
// than a quarter interval apart) a commit on a quiet stream comes no sooner than half an interval
// after the commit before, and the interval still bounds the transaction.
func TestBusyStreamSpacesQuietCommits(t *testing.T) {
	const interval = 10 * time.Millisecond
	now := time.Now()
	cases := []struct {
		name       string
		txGap      time.Duration // average gap between transactions with rows; 0: none seen
		lastCommit time.Duration // before now
		firstRow   time.Duration // before now
		want       time.Duration // due, from now
	}{
		{"quiet stream, no history", 0, time.Millisecond, time.Millisecond, 0},
		{"quiet stream, one transaction per interval", interval, time.Millisecond, time.Millisecond, 0},
		{"just under busy", interval / busyGaps, time.Millisecond, time.Millisecond, 0},
		{"busy, commit before 1 ms ago", time.Millisecond, time.Millisecond, time.Millisecond, interval/2 - time.Millisecond},
		{"busy, commit before long ago", time.Millisecond, time.Second, time.Millisecond, 0},
		{"busy, the interval ends first", time.Millisecond, time.Millisecond, interval - 2*time.Millisecond, 2 * time.Millisecond},
	}
	for _, c := range cases {
		h := &txnHandler{interval: interval, catchUp: interval, maxRecords: 1000, clock: quietClock{quiet: time.Millisecond}}
		h.pace, h.lastCommit = txPace{bound: interval, gap: c.txGap}, now.Add(-c.lastCommit)
		h.records, h.firstAt = 10, now.Add(-c.firstRow)
		// The transaction began after a quiet period and has just ended: due at its end.
		h.clock.lastEnd, h.clock.isolated = now, true
		if got := h.FlushDue().Sub(now); got != c.want {
			t.Errorf("%s: due %s from now, want %s", c.name, got, c.want)
		}
	}
}

// TestTransactionGap: the average gap between transactions with rows follows the load, and a long
// idle period counts as one interval, so that a busy stream after it is seen within a few
// transactions.
func TestTransactionGap(t *testing.T) {
	const interval = 10 * time.Millisecond
	h := &txPace{bound: interval}
	at := time.Now()
	end := func(gap time.Duration) {
		at = at.Add(gap)
		h.note(at)
	}
	end(0)
	if h.busy() {
		t.Fatal("busy after one transaction")
	}
	end(time.Hour)
	if h.gap != interval {
		t.Fatalf("an idle hour counted as %s, want the interval %s", h.gap, interval)
	}
	n := 0
	for ; !h.busy(); n++ {
		if n == 100 {
			t.Fatalf("not busy after 100 transactions 1 ms apart (average gap %s)", h.gap)
		}
		end(time.Millisecond)
	}
	if n > 15 {
		t.Errorf("busy only after %d transactions 1 ms apart, want at most 15", n)
	}
	for i := 0; i < 100; i++ {
		end(20 * time.Millisecond)
	}
	if h.busy() {
		t.Errorf("still busy with transactions 20 ms apart (average gap %s)", h.gap)
	}
}

// TestBusyStreamSpacesQuietSends is TestBusyStreamSpacesQuietCommits for at-least-once: on a quiet
// stream what lingers goes out as soon as the stream is quiet, even right after the send before; on
// a busy stream no sooner than half a linger after the send before, so that batches fill.
func TestBusyStreamSpacesQuietSends(t *testing.T) {
	const linger = 10 * time.Millisecond
	now := time.Now()
	cases := []struct {
		name     string
		txGap    time.Duration // average gap between transactions with rows; 0: none seen
		lastKick time.Duration // before now
		pending  bool
		want     time.Duration // due, from now; -1: nothing due
	}{
		{"nothing waits", time.Millisecond, time.Millisecond, false, -1},
		{"quiet stream, no history", 0, time.Millisecond, true, 0},
		{"quiet stream, one transaction per linger", linger, time.Millisecond, true, 0},
		{"just under busy", linger / busyGaps, time.Millisecond, true, 0},
		{"busy, sent 1 ms ago", time.Millisecond, time.Millisecond, true, linger/2 - time.Millisecond},
		{"busy, sent long ago", time.Millisecond, time.Second, true, 0},
	}
	for _, c := range cases {
		h := &quietHandler{clock: quietClock{quiet: time.Millisecond}, pace: txPace{bound: linger, gap: c.txGap}}
		h.lastKick, h.pending = now.Add(-c.lastKick), c.pending
		// The transaction began after a quiet period and has just ended: due at its end.
		h.clock.lastEnd, h.clock.isolated = now, true
		due := h.FlushDue()
		if c.want < 0 {
			if !due.IsZero() {
				t.Errorf("%s: due %s from now, want nothing due", c.name, due.Sub(now))
			}
			continue
		}
		if got := due.Sub(now); got != c.want {
			t.Errorf("%s: due %s from now, want %s", c.name, got, c.want)
		}
	}
}

// TestQuietHandlerPacesTransactionsWithRows: only transactions with rows count for the pace (a
// stream of empty transactions from other tables is not a busy outbox), at the time their end was
// noted.
func TestQuietHandlerPacesTransactionsWithRows(t *testing.T) {
	h := &quietHandler{clock: quietClock{quiet: time.Millisecond}, pace: txPace{bound: 10 * time.Millisecond}}
	for range 50 {
		if err := h.Committed(t.Context(), nil, 0); err != nil {
			t.Fatal(err)
		}
	}
	if !h.pace.lastEnd.IsZero() || h.pace.busy() {
		t.Fatalf("empty transactions counted: %+v", h.pace)
	}
	for range 50 {
		h.clock.row()
		if err := h.Committed(t.Context(), nil, 0); err != nil {
			t.Fatal(err)
		}
		if h.pace.lastEnd != h.clock.lastEnd {
			t.Fatalf("pace noted %v, the transaction ended %v", h.pace.lastEnd, h.clock.lastEnd)
		}
	}
	if !h.pace.busy() {
		t.Errorf("50 back-to-back transactions with rows not busy: %+v", h.pace)
	}
}
