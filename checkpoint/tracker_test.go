package checkpoint

import (
	"math/rand/v2"
	"testing"
	"time"
)

// record is one produced record of a simulated transaction.
type record struct {
	tx    int
	acked bool
}

// TestWatermarkNeverPassesUnacknowledged drives the tracker with random transaction sizes, random
// interleavings of commits and acks, and random ack orders, and checks after every step that the
// watermark never reaches the end LSN of a transaction that still has an unacknowledged record or
// has not committed, and that it ends at the last commit once everything is acknowledged.
func TestWatermarkNeverPassesUnacknowledged(t *testing.T) {
	for seed := uint64(1); seed <= 300; seed++ {
		rng := rand.New(rand.NewPCG(seed, seed*7919))
		start := LSN(1000)
		tr := NewTracker(start)

		nTx := 1 + rng.IntN(40)
		txs := make([]*Tx, nTx)
		ends := make([]LSN, nTx)
		committed := make([]bool, nTx)
		var records []*record
		lsn := start
		for i := range txs {
			txs[i] = tr.Begin(time.Unix(int64(i), 0), 0)
			rows := rng.IntN(6) // zero-row transactions happen (deletes only, filtered rows)
			for r := 0; r < rows; r++ {
				tr.Add(txs[i])
				records = append(records, &record{tx: i})
			}
			// Several transactions may share nothing but order; end LSNs strictly increase.
			lsn += LSN(1 + rng.IntN(100))
			ends[i] = lsn
		}

		check := func(step string) {
			wm := tr.Watermark()
			for i := range txs {
				unsafe := !committed[i]
				for _, r := range records {
					if r.tx == i && !r.acked {
						unsafe = true
					}
				}
				if unsafe && wm >= ends[i] {
					t.Fatalf("seed %d, %s: watermark %s reached end %s of tx %d which is not fully acknowledged", seed, step, wm, ends[i], i)
				}
			}
		}

		// Commits arrive in order; acks in random order, interleaved with commits.
		nextCommit := 0
		order := rng.Perm(len(records))
		for _, idx := range order {
			for nextCommit < nTx && rng.IntN(2) == 0 {
				tr.Commit(txs[nextCommit], ends[nextCommit])
				committed[nextCommit] = true
				nextCommit++
				check("commit")
			}
			records[idx].acked = true
			tr.Ack(txs[records[idx].tx])
			check("ack")
		}
		for ; nextCommit < nTx; nextCommit++ {
			tr.Commit(txs[nextCommit], ends[nextCommit])
			committed[nextCommit] = true
			check("final commit")
		}
		if got, want := tr.Watermark(), ends[nTx-1]; got != want {
			t.Fatalf("seed %d: final watermark %s, want %s", seed, got, want)
		}
		if !tr.Idle() {
			t.Fatalf("seed %d: tracker not idle after everything was acknowledged", seed)
		}
	}
}

func TestAdvanceIdleOnlyWhenNothingInFlight(t *testing.T) {
	tests := []struct {
		name      string
		setup     func(tr *Tracker)
		keepalive LSN
		want      LSN
	}{
		{"idle moves to keepalive", func(*Tracker) {}, 500, 500},
		{"never moves backwards", func(*Tracker) {}, 50, 100},
		{"half-received transaction pins", func(tr *Tracker) { tr.Begin(time.Time{}, 0) }, 500, 100},
		{"unacknowledged record pins", func(tr *Tracker) {
			tx := tr.Begin(time.Time{}, 0)
			tr.Add(tx)
			tr.Commit(tx, 200)
		}, 500, 100},
		{"acknowledged transaction then idle", func(tr *Tracker) {
			tx := tr.Begin(time.Time{}, 0)
			tr.Add(tx)
			tr.Commit(tx, 200)
			tr.Ack(tx)
		}, 500, 500},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := NewTracker(100)
			tt.setup(tr)
			tr.AdvanceIdle(tt.keepalive)
			if got := tr.Watermark(); got != tt.want {
				t.Fatalf("watermark %s, want %s", got, tt.want)
			}
		})
	}
}

func TestStats(t *testing.T) {
	tr := NewTracker(10)
	ct := time.Unix(1700000000, 0)
	tx := tr.Begin(ct, 0)
	tr.Add(tx)
	tr.Add(tx)
	s := tr.Stats()
	if s.PendingRecords != 2 || s.OpenTransactions != 1 || !s.OldestCommitTime.Equal(ct) || s.Watermark != 10 {
		t.Fatalf("unexpected stats %+v", s)
	}
	tr.Commit(tx, 20)
	tr.Ack(tx)
	if moved := tr.Ack(tx); !moved {
		t.Fatal("last ack did not report the watermark moving")
	}
	if s := tr.Stats(); s.PendingRecords != 0 || s.OpenTransactions != 0 || !s.OldestCommitTime.IsZero() || s.Watermark != 20 {
		t.Fatalf("unexpected stats after acks %+v", s)
	}
}

func TestLSNString(t *testing.T) {
	if got := LSN(0x16B374D848).String(); got != "16/B374D848" {
		t.Fatalf("got %s", got)
	}
	var back LSN
	if err := back.UnmarshalText([]byte("16/B374D848")); err != nil || back != 0x16B374D848 {
		t.Fatalf("round trip: %s, %v", back, err)
	}
	if err := back.UnmarshalText([]byte("nonsense")); err == nil {
		t.Fatal("parsed nonsense")
	}
}

func BenchmarkTrackerRoundTrip(b *testing.B) {
	tr := NewTracker(0)
	for i := 0; i < b.N; i++ {
		tx := tr.Begin(time.Time{}, 0)
		tr.Add(tx)
		tr.Commit(tx, LSN(i+1))
		tr.Ack(tx)
	}
}

// TestStreamShapedTrafficStaysSafeAndBounded drives the tracker as the replication stream does (one
// transaction received at a time: Begin, Add per row, Commit), with most transactions row-less (other
// tables, PostgreSQL 14's empty transactions) and acknowledgements arriving at random, sometimes not
// at all for a long while (Kafka away). After every step the watermark must not reach a transaction
// with an unacknowledged record, and the queue must hold no more entries than transactions with
// records in flight, plus the one being received: row-less transactions never pile up.
func TestStreamShapedTrafficStaysSafeAndBounded(t *testing.T) {
	for seed := uint64(1); seed <= 60; seed++ {
		rng := rand.New(rand.NewPCG(seed, seed*104729))
		tr := NewTracker(1)
		lsn := LSN(1)
		type inflight struct {
			tx  *Tx
			end LSN // 0 until committed
		}
		var pending []*inflight  // one per unacknowledged record
		var withRows []*inflight // one per transaction that had records
		var lowestUnsafe func() LSN = func() LSN {
			low := LSN(0)
			for _, p := range pending {
				if p.end != 0 && (low == 0 || p.end < low) {
					low = p.end
				}
			}
			return low
		}
		outage := rng.IntN(2) == 0 // half the seeds: no acks for the first 80% of the traffic
		const nTx = 2000
		for i := 0; i < nTx; i++ {
			tx := tr.Begin(time.Time{}, lsn+1)
			var mine []*inflight
			if rng.IntN(10) == 0 {
				for r := 0; r < 1+rng.IntN(4); r++ {
					tr.Add(tx)
					p := &inflight{tx: tx}
					mine = append(mine, p)
					pending = append(pending, p)
				}
			}
			lsn += LSN(1 + rng.IntN(50))
			tr.Commit(tx, lsn)
			for _, p := range mine {
				p.end = lsn
			}
			if len(mine) > 0 {
				withRows = append(withRows, mine[0])
			}
			if !(outage && i < nTx*8/10) {
				for len(pending) > 0 && rng.IntN(3) != 0 {
					k := rng.IntN(len(pending))
					tr.Ack(pending[k].tx)
					pending = append(pending[:k], pending[k+1:]...)
				}
			}
			if low := lowestUnsafe(); low != 0 && tr.Watermark() >= low {
				t.Fatalf("seed %d tx %d: watermark %s reached %s, the end of a transaction with an unacknowledged record", seed, i, tr.Watermark(), low)
			}
			// Transactions with records that the watermark has not passed may wait in the queue;
			// row-less ones must not.
			waiting := 0
			for _, p := range withRows {
				if p.end > tr.Watermark() {
					waiting++
				}
			}
			if open := tr.Stats().OpenTransactions; open > waiting+1 {
				t.Fatalf("seed %d tx %d: %d transactions queued for %d with records: row-less transactions pile up", seed, i, open, waiting)
			}
		}
		for _, p := range pending {
			tr.Ack(p.tx)
		}
		if tr.Watermark() != lsn || !tr.Idle() {
			t.Fatalf("seed %d: after all acks watermark %s (want %s), idle %t", seed, tr.Watermark(), lsn, tr.Idle())
		}
	}
}

// TestBehind: a transaction's lateness is its Begin's send time less its commit time, both by the
// server's clock; zero when either is unknown or the clocks disagree.
func TestBehind(t *testing.T) {
	tr := NewTracker(0)
	commit := time.Date(2026, 12, 5, 6, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name string
		tx   *Tx
		want time.Duration
	}{
		{"read 3 s after its commit", tr.BeginSent(commit, commit.Add(3*time.Second), 1), 3 * time.Second},
		{"read as it commits", tr.BeginSent(commit, commit, 2), 0},
		{"send time unknown", tr.Begin(commit, 3), 0},
		{"commit time unknown", tr.BeginSent(time.Time{}, commit, 4), 0},
		{"sent before its commit (never negative)", tr.BeginSent(commit, commit.Add(-time.Second), 5), 0},
	} {
		if got := c.tx.Behind(); got != c.want {
			t.Errorf("%s: Behind() = %s, want %s", c.name, got, c.want)
		}
	}
}

// TestCutShort: only a transaction without its commit, with every record acknowledged and nothing
// before it waiting, counts as cut short with its rows in Kafka.
func TestCutShort(t *testing.T) {
	tr := NewTracker(100)
	now := time.Now()
	a := tr.Begin(now, 200)
	if !tr.CutShort(a) {
		t.Error("a transaction with no rows yet and nothing before it: want cut short")
	}
	tr.Add(a)
	if tr.CutShort(a) {
		t.Error("a record unacknowledged: want not cut short")
	}
	tr.Ack(a)
	if !tr.CutShort(a) {
		t.Error("its record acknowledged: want cut short")
	}
	tr.Add(a)
	tr.Commit(a, 250)
	b := tr.Begin(now, 300)
	if tr.CutShort(b) {
		t.Error("the transaction before still waits for a record: want not cut short")
	}
	tr.Ack(a)
	if !tr.CutShort(b) {
		t.Error("everything before folded into the watermark: want cut short")
	}
	tr.Commit(b, 350)
	if tr.CutShort(b) {
		t.Error("its commit arrived: want not cut short")
	}
}
