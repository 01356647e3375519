package pipeline

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// TestAckedPositionSkipsOnlyWhereTheWALIsTheSame: an at-least-once session skips what the last one
// saw acknowledged only on the same cluster and database, only ahead of the slot, and on another
// timeline only up to where the acknowledged one ended by the server's history (after a failover,
// positions past the fork are other transactions).
func TestAckedPositionSkipsOnlyWhereTheWALIsTheSame(t *testing.T) {
	// Timeline 2 began at 1000 on the server that acknowledged up to 5000.
	tl1 := checkpoint.TimelineEnd{Timeline: 1, End: 1000}
	srv := replication.Server{SystemID: "7300", Database: "app", Timeline: 2, History: []checkpoint.TimelineEnd{tl1}}
	acked := ackedPosition{lsn: 5000, system: "7300", database: "app", timeline: 2, timelineStart: 1000}
	promoted := func(end checkpoint.LSN) replication.Server {
		return replication.Server{SystemID: "7300", Database: "app", Timeline: 3, History: []checkpoint.TimelineEnd{tl1, {Timeline: 2, End: end}}}
	}
	tests := []struct {
		name  string
		acked ackedPosition
		srv   replication.Server
		start checkpoint.LSN
		want  checkpoint.LSN
	}{
		{"same server, slot behind", acked, srv, 4000, 5000},
		{"slot at the position", acked, srv, 5000, 0},
		{"slot ahead", acked, srv, 6000, 0},
		{"nothing acknowledged yet", ackedPosition{}, srv, 4000, 0},
		{"another timeline not in the history", acked, replication.Server{SystemID: "7300", Database: "app", Timeline: 3}, 4000, 0},
		// A failover: timeline 2 (begun at 1000 here too) ended at 6000 on the promoted
		// server, past the acknowledged position: its WAL up to there is the same.
		{"a failover past the position", acked, promoted(6000), 4000, 5000},
		// The promoted server had timeline 2's WAL only to 4500 (asynchronous replication): past it the
		// positions are timeline 3's own transactions.
		{"a failover short of the position", acked, promoted(4500), 4000, 4500},
		{"a failover short of the slot", acked, promoted(3500), 4000, 0},
		// A sibling: its timeline 2 began at 900, where acked's began at 1000: they share nothing past 900.
		{"a sibling's timeline of the same number", acked, replication.Server{SystemID: "7300", Database: "app", Timeline: 2,
			History: []checkpoint.TimelineEnd{{Timeline: 1, End: 900}}}, 4000, 0},
		// The same timeline on a server whose WAL ends before the position (restored from a backup).
		{"a server whose WAL ends before it", acked, replication.Server{SystemID: "7300", Database: "app", Timeline: 2, History: srv.History, WALEnd: 4500}, 4000, 0},
		{"another cluster", acked, replication.Server{SystemID: "7301", Database: "app", Timeline: 2}, 4000, 0},
		{"another database", acked, replication.Server{SystemID: "7300", Database: "other", Timeline: 2}, 4000, 0},
	}
	for _, tt := range tests {
		if got := tt.acked.skipBelow(tt.srv, tt.start); got != tt.want {
			t.Errorf("%s: skipBelow = %d, want %d", tt.name, got, tt.want)
		}
	}
	// The skipper skips by whole transaction, below the position only, and never a transaction whose
	// commit position is unknown.
	tr := checkpoint.NewTracker(0)
	var rows atomic.Int64
	s := &skipper{below: 5000, rows: &rows}
	now := time.Now()
	below, at, unknown := tr.Begin(now, 4990), tr.Begin(now, 5000), tr.Begin(now, 0)
	if !s.skips(below) || !s.skips(below) || s.skips(at) || s.skips(unknown) {
		t.Error("skipper: want the transaction below skipped (twice: two rows), not the one at the position nor an unknown one")
	}
	if s.txs != 1 || s.n != 2 || rows.Load() != 2 {
		t.Errorf("skipper counted %d transactions, %d rows (%d overall); want 1, 2", s.txs, s.n, rows.Load())
	}
}

// TestHalfReceivedTransactionIsNotSentAgain: a session that ends between a transaction's rows and its
// commit (pgoutput sends the rows first, and they are produced as they come) tells the next one how
// many of its leading rows Kafka holds, and the replay skips those rows — on the same WAL only, and
// never rows Kafka may not hold.
func TestHalfReceivedTransactionIsNotSentAgain(t *testing.T) {
	tl1 := checkpoint.TimelineEnd{Timeline: 1, End: 1000}
	srv := replication.Server{SystemID: "7300", Database: "app", Timeline: 2, History: []checkpoint.TimelineEnd{tl1}}
	promoted := func(end checkpoint.LSN) replication.Server {
		return replication.Server{SystemID: "7300", Database: "app", Timeline: 3, History: []checkpoint.TimelineEnd{tl1, {Timeline: 2, End: end}}}
	}
	cut := ackedPosition{lsn: 5000, system: "7300", database: "app", timeline: 2, timelineStart: 1000, partial: 5200, partialRows: 2}
	rules := []struct {
		name     string
		acked    ackedPosition
		srv      replication.Server
		wantAt   checkpoint.LSN
		wantRows int
	}{
		{"same server", cut, srv, 5200, 2},
		{"no half-received transaction", ackedPosition{lsn: 5000, system: "7300", database: "app", timeline: 2, timelineStart: 1000}, srv, 0, 0},
		{"a failover past its commit", cut, promoted(6000), 5200, 2},
		// The promoted server's WAL forks before the commit: the same position is another transaction.
		{"a failover short of its commit", cut, promoted(5100), 0, 0},
		{"a failover at its commit", cut, promoted(5200), 0, 0},
		{"another cluster", cut, replication.Server{SystemID: "7301", Database: "app", Timeline: 2}, 0, 0},
	}
	for _, tt := range rules {
		at, rows := tt.acked.partialSkip(tt.srv, 4000)
		if at != tt.wantAt || rows != tt.wantRows {
			t.Errorf("%s: partialSkip = %d, %d rows; want %d, %d", tt.name, at, rows, tt.wantAt, tt.wantRows)
		}
	}

	// The replay: the first two rows of the transaction committing at 5200 are skipped, the third is
	// not; the transaction before it is skipped whole, the one after it not at all.
	tr := checkpoint.NewTracker(4000)
	var skipped atomic.Int64
	s := &skipper{below: 5000, partial: 5200, partialRows: 2, rows: &skipped}
	now := time.Now()
	before := tr.Begin(now, 4900)
	if !s.skips(before) || !s.skips(before) {
		t.Error("a transaction below the watermark was not skipped whole")
	}
	tr.Commit(before, 4950)
	half := tr.Begin(now, 5200)
	got := []bool{s.skips(half), s.skips(half)}
	third := s.skips(half)
	if !got[0] || !got[1] || third {
		t.Fatalf("the half-received transaction's rows skipped: %v then %v; want the first two only", got, third)
	}
	// A row the handler could not take yet (in-flight cap) is offered again: same answer.
	if s.skips(half) {
		t.Fatal("the third row, offered again, was skipped")
	}
	tr.Add(half)
	s.handed()
	if s.txs != 2 || s.n != 4 || skipped.Load() != 4 {
		t.Errorf("counted %d transactions, %d rows (%d overall); want 2, 4", s.txs, s.n, skipped.Load())
	}

	// This session is cut with the third row not acknowledged: what it carries is the earlier
	// session's knowledge, not more.
	if a := s.carry(tr, srv); a.lsn != 5000 || a.partial != 5200 || a.partialRows != 2 {
		t.Errorf("cut with a row unacknowledged: carried %+v; want the watermark 5000 and 2 rows of 5200", a)
	}
	// Acknowledged: all three rows are Kafka's.
	tr.Ack(half)
	if a := s.carry(tr, srv); a.lsn != 5000 || a.partial != 5200 || a.partialRows != 3 {
		t.Errorf("cut with every row acknowledged: carried %+v; want 3 rows of 5200", a)
	}
	tr.Commit(half, 5250)
	// Committed and acknowledged: the watermark covers it; nothing half-received.
	if a := s.carry(tr, srv); a.lsn != 5250 || a.partial != 0 || a.partialRows != 0 {
		t.Errorf("cut after the commit: carried %+v; want the watermark 5250 alone", a)
	}

	// A session cut before it got to what the last one acknowledged keeps that knowledge.
	tr2 := checkpoint.NewTracker(4000)
	s2 := &skipper{below: 5000, partial: 5200, partialRows: 2, rows: &skipped}
	early := tr2.Begin(now, 4100)
	s2.skips(early)
	if a := s2.carry(tr2, srv); a.lsn != 5000 || a.partial != 5200 || a.partialRows != 2 {
		t.Errorf("cut before the watermark: carried %+v; want the watermark 5000 and 2 rows of 5200", a)
	}
	// Cut inside a later transaction, with its rows acknowledged: that one is carried.
	tr3 := checkpoint.NewTracker(4000)
	s3 := &skipper{rows: &skipped}
	next := tr3.Begin(now, 5600)
	for i := 0; i < 5; i++ {
		if s3.skips(next) {
			t.Fatal("skipped a row with nothing to skip")
		}
		tr3.Add(next)
		s3.handed()
		tr3.Ack(next)
	}
	if a := s3.carry(tr3, srv); a.lsn != 4000 || a.partial != 5600 || a.partialRows != 5 {
		t.Errorf("cut inside a transaction of acknowledged rows: carried %+v; want 5 rows of 5600", a)
	}
	// The same with a record of an earlier transaction unacknowledged: the replay sends that one
	// again, and everything after it, in order.
	tr4 := checkpoint.NewTracker(4000)
	s4 := &skipper{rows: &skipped}
	stuck := tr4.Begin(now, 5500)
	s4.skips(stuck)
	tr4.Add(stuck)
	s4.handed()
	tr4.Commit(stuck, 5550)
	cutShort := tr4.Begin(now, 5600)
	s4.skips(cutShort)
	tr4.Add(cutShort)
	s4.handed()
	tr4.Ack(cutShort)
	if a := s4.carry(tr4, srv); a.partial != 0 || a.partialRows != 0 {
		t.Errorf("cut with an earlier transaction unacknowledged: carried %+v; want no rows of 5600", a)
	}
}
