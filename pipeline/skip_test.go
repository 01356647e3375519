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
