package pipeline

import (
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
)

// TestCatchUpGrowsTheKafkaTransaction: while the stream reads transactions committed long before
// the server sent them, the open Kafka transaction stays open longer and takes more rows; once it
// reads transactions as they commit, the configured bounds apply again, so that a caught-up stream
// is not held by the longer interval.
func TestCatchUpGrowsTheKafkaTransaction(t *testing.T) {
	const interval, timeout, maxRecords = 25 * time.Millisecond, time.Minute, 100
	h := &txnHandler{interval: interval, catchUp: catchUpInterval(interval, timeout), maxRecords: maxRecords}
	tr := checkpoint.NewTracker(0)
	now := time.Now()
	start := now.Add(-time.Second)
	h.records, h.firstAt = 1, start

	cases := []struct {
		name         string
		tx           *checkpoint.Tx
		wantInterval time.Duration
		wantMax      int
	}{
		{"read as it commits", tr.BeginSent(now, now.Add(2*time.Millisecond), 1), interval, maxRecords},
		{"read 5 s late: catching up", tr.BeginSent(now.Add(-5*time.Second), now, 2), catchUpFactor * interval, catchUpFactor * maxRecords},
		{"read just under the threshold", tr.BeginSent(now.Add(-catchUpBehind+time.Millisecond), now, 3), interval, maxRecords},
		{"send time unknown", tr.Begin(now.Add(-time.Hour), 4), interval, maxRecords},
		{"read 1 h late", tr.BeginSent(now.Add(-time.Hour), now, 5), catchUpFactor * interval, catchUpFactor * maxRecords},
		{"caught up again", tr.BeginSent(now, now, 6), interval, maxRecords},
	}
	for _, c := range cases {
		h.noteTx(c.tx)
		if got := h.FlushDue().Sub(start); got != c.wantInterval {
			t.Errorf("%s: Kafka transaction due %s after its first row, want %s", c.name, got, c.wantInterval)
		}
		if got := h.currentMaxRecords(); got != c.wantMax {
			t.Errorf("%s: at most %d rows, want %d", c.name, got, c.wantMax)
		}
	}
}

// TestCatchUpInterval: the catching-up interval never exceeds a quarter of the transaction timeout
// (the broker aborts a transaction open longer than it) nor falls below the interval.
func TestCatchUpInterval(t *testing.T) {
	for _, c := range []struct{ interval, timeout, want time.Duration }{
		{25 * time.Millisecond, time.Minute, 200 * time.Millisecond},
		{5 * time.Second, 20 * time.Second, 5 * time.Second},
		{time.Second, 10 * time.Second, 2500 * time.Millisecond},
		{time.Millisecond, time.Second, 8 * time.Millisecond},
	} {
		if got := catchUpInterval(c.interval, c.timeout); got != c.want {
			t.Errorf("catchUpInterval(%s, %s) = %s, want %s", c.interval, c.timeout, got, c.want)
		}
	}
}
