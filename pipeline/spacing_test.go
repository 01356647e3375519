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
		h.txGap, h.lastCommit = c.txGap, now.Add(-c.lastCommit)
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
	h := &txnHandler{interval: interval}
	at := time.Now()
	end := func(gap time.Duration) {
		at = at.Add(gap)
		h.noteEnd(at)
	}
	end(0)
	if h.busy() {
		t.Fatal("busy after one transaction")
	}
	end(time.Hour)
	if h.txGap != interval {
		t.Fatalf("an idle hour counted as %s, want the interval %s", h.txGap, interval)
	}
	n := 0
	for ; !h.busy(); n++ {
		if n == 100 {
			t.Fatalf("not busy after 100 transactions 1 ms apart (average gap %s)", h.txGap)
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
		t.Errorf("still busy with transactions 20 ms apart (average gap %s)", h.txGap)
	}
}
