package pipeline

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// TestAckedPositionSkipsOnlyOnTheSameTimeline: an at-least-once session skips what the last one saw
// acknowledged only on the same cluster, database and timeline (after a failover, positions past the
// fork are other transactions), and only ahead of the slot.
func TestAckedPositionSkipsOnlyOnTheSameTimeline(t *testing.T) {
	srv := replication.Server{SystemID: "7300", Database: "app", Timeline: 2}
	acked := ackedPosition{lsn: 5000, system: "7300", database: "app", timeline: 2}
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
		{"another timeline (a failover)", acked, replication.Server{SystemID: "7300", Database: "app", Timeline: 3}, 4000, 0},
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
