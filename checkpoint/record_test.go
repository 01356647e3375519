package checkpoint

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// modelTx is one PostgreSQL transaction of the model: where its commit record begins and ends, and
// how many outbox rows it holds.
type modelTx struct {
	commit, end LSN
	rows        int
}

// modelLog generates n transactions in commit order. A commit record may begin exactly where the
// previous one ended: the boundary case of the skip rule.
func modelLog(rng *rand.Rand, n int) []modelTx {
	txs := make([]modelTx, n)
	pos := LSN(0x1000)
	for i := range txs {
		if rng.IntN(4) != 0 {
			pos += LSN(1 + rng.IntN(200))
		}
		txs[i].commit = pos
		pos += LSN(1 + rng.IntN(100))
		txs[i].end = pos
		if rng.IntN(3) != 0 {
			txs[i].rows = 1 + rng.IntN(4)
		}
	}
	return txs
}

// TestExactlyOnceAcrossCrashes runs the exactly-once protocol against a model of PostgreSQL and Kafka,
// with crashes at random points: in the middle of a Kafka transaction (aborted), between the Kafka
// commit and the slot confirm, after the confirm, and after an idle checkpoint. After each restart the
// slot re-sends every transaction whose commit record begins at or after its confirmed position
// (PostgreSQL's rule), and the relay skips what Start and AlreadyDelivered say Kafka holds. At the end
// the committed Kafka log must hold every row exactly once, in commit order.
func TestExactlyOnceAcrossCrashes(t *testing.T) {
	slot := SlotID{SystemID: "7", Database: "app", Slot: "s"}
	for seed := uint64(1); seed <= 500; seed++ {
		rng := rand.New(rand.NewPCG(seed, seed*104729))
		txs := modelLog(rng, 1+rng.IntN(60))

		var kafka []int          // committed rows, as transaction indexes, in log order
		var checkpoint *Record   // last committed checkpoint
		confirmed := LSN(0x1000) // the slot's confirmed position
		for restarts := 0; ; restarts++ {
			if restarts > 10*len(txs)+10 {
				t.Fatalf("seed %d: no progress after %d restarts", seed, restarts)
			}
			resume, err := Start(confirmed, Server{}, checkpoint, false)
			skipBelow := resume.SkipBelow
			if err != nil {
				t.Fatalf("seed %d: restart %d: %v", seed, restarts, err)
			}
			// The session: the slot re-sends from its confirmed position.
			var batch []int // rows of the open Kafka transaction
			batchEnd := LSN(0)
			crashed := false
			for i, tx := range txs {
				if tx.commit < confirmed {
					continue // PostgreSQL does not send it again
				}
				if AlreadyDelivered(tx.commit, skipBelow) {
					continue
				}
				for r := 0; r < tx.rows; r++ {
					batch = append(batch, i)
					if rng.IntN(40) == 0 {
						crashed = true // mid-transaction: the Kafka transaction aborts
						break
					}
				}
				if crashed {
					break
				}
				batchEnd = tx.end
				if rng.IntN(3) != 0 {
					continue // more transactions join the Kafka transaction
				}
				// Kafka commit: the rows and the checkpoint, atomically.
				kafka = append(kafka, batch...)
				checkpoint = &Record{Slot: slot, LSN: batchEnd}
				batch = batch[:0]
				if rng.IntN(5) == 0 {
					crashed = true // between the Kafka commit and the slot confirm
					break
				}
				if rng.IntN(2) == 0 {
					confirmed = checkpoint.LSN
				}
				// Idle: a keepalive's WAL end, anywhere up to where the next transaction's commit
				// record begins, is checkpointed and then confirmed.
				if i+1 < len(txs) && rng.IntN(4) == 0 {
					w := tx.end + LSN(rng.IntN(int(txs[i+1].commit-tx.end)+1))
					checkpoint = &Record{Slot: slot, LSN: w}
					if rng.IntN(2) == 0 {
						confirmed = w
					}
				}
				if rng.IntN(15) == 0 {
					crashed = true
					break
				}
			}
			if crashed {
				continue
			}
			if len(batch) > 0 {
				kafka = append(kafka, batch...)
				checkpoint = &Record{Slot: slot, LSN: batchEnd}
			}
			break
		}
		var want []int
		for i, tx := range txs {
			for r := 0; r < tx.rows; r++ {
				want = append(want, i)
			}
		}
		if len(kafka) != len(want) {
			t.Fatalf("seed %d: Kafka holds %d rows, want %d (%v vs %v)", seed, len(kafka), len(want), kafka, want)
		}
		for j := range want {
			if kafka[j] != want[j] {
				t.Fatalf("seed %d: row %d of Kafka is from transaction %d, want %d", seed, j, kafka[j], want[j])
			}
		}
	}
}

// TestStartRefusesGap checks the slot identity guard: a slot ahead of the checkpoint is refused
// unless the gap is accepted, one at or behind it resumes from the checkpoint, and no checkpoint means
// nothing to skip.
func TestStartRefusesGap(t *testing.T) {
	cp := &Record{LSN: 0x5000, Written: time.Unix(1700000000, 0)}
	tests := []struct {
		name      string
		slot      LSN
		last      *Record
		accept    bool
		wantSkip  LSN
		wantError bool
	}{
		{"no checkpoint", 0x9000, nil, false, 0, false},
		{"slot behind", 0x4000, cp, false, 0x5000, false},
		{"slot at checkpoint", 0x5000, cp, false, 0x5000, false},
		{"slot ahead", 0x5001, cp, false, 0, true},
		{"slot ahead, accepted", 0x9000, cp, true, 0x5000, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resume, err := Start(tt.slot, Server{}, tt.last, tt.accept)
			skip := resume.SkipBelow
			if (err != nil) != tt.wantError {
				t.Fatalf("error %v, want error %v", err, tt.wantError)
			}
			if err != nil {
				if !errors.Is(err, ErrGap) || !strings.Contains(err.Error(), tt.slot.String()) || !strings.Contains(err.Error(), cp.LSN.String()) ||
					!strings.Contains(err.Error(), "resync") || !strings.Contains(err.Error(), "--accept-gap") {
					t.Fatalf("gap error does not name both positions and the ways out: %v", err)
				}
				return
			}
			if skip != tt.wantSkip {
				t.Fatalf("skip below %s, want %s", skip, tt.wantSkip)
			}
		})
	}
}

func TestRecordRoundTrip(t *testing.T) {
	r := Record{Slot: SlotID{SystemID: "7301", Database: "app", Slot: "outbox_cdc"}, LSN: 0x16B374D848, Transactions: 3, Records: 12,
		Written: time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)}
	got, err := ParseRecord([]byte(r.Slot.String()), r.Marshal())
	if err != nil {
		t.Fatal(err)
	}
	if got != r {
		t.Fatalf("round trip: got %+v, want %+v", got, r)
	}
	if _, err := ParseRecord([]byte("other/app/s"), r.Marshal()); err == nil {
		t.Fatal("a record under another slot's key was accepted")
	}
	if _, err := ParseRecord([]byte(r.Slot.String()), []byte("{")); err == nil {
		t.Fatal("a malformed record was accepted")
	}
	if _, err := ParseRecord([]byte("//"), []byte(`{"slot":{}}`)); err == nil {
		t.Fatal("a record without a position was accepted")
	}
	if id := r.Slot.TransactionalID(); id != "outbox-cdc-7301/app/outbox_cdc" {
		t.Fatalf("transactional id %q", id)
	}
}

// TestStartAfterAFailover: a checkpoint written on an earlier timeline counts only up to where that
// timeline ended on the promoted server. Beyond it, the checkpoint's transactions are phantoms and the
// same positions hold the new timeline's transactions, which must be delivered.
func TestStartAfterAFailover(t *testing.T) {
	history := []TimelineEnd{{Timeline: 1, End: 0x4000}, {Timeline: 2, End: 0x7000}}
	tests := []struct {
		name       string
		slot       LSN
		server     Server
		last       Record
		want       Resume
		wantGapErr bool
	}{
		{"same timeline", 0x3000, Server{Timeline: 2, History: history[:1]}, Record{LSN: 0x5000, Timeline: 2}, Resume{SkipBelow: 0x5000}, false},
		{"checkpoint before the fork", 0x3000, Server{Timeline: 2, History: history[:1]}, Record{LSN: 0x3800, Timeline: 1}, Resume{SkipBelow: 0x3800}, false},
		{"checkpoint at the fork", 0x3000, Server{Timeline: 2, History: history[:1]}, Record{LSN: 0x4000, Timeline: 1}, Resume{SkipBelow: 0x4000}, false},
		{"checkpoint past the fork", 0x3000, Server{Timeline: 2, History: history[:1]}, Record{LSN: 0x5000, Timeline: 1}, Resume{SkipBelow: 0x4000, PhantomFrom: 0x4000, PhantomTo: 0x5000}, false},
		{"two promotions", 0x3000, Server{Timeline: 3, History: history}, Record{LSN: 0x5000, Timeline: 1}, Resume{SkipBelow: 0x4000, PhantomFrom: 0x4000, PhantomTo: 0x5000}, false},
		{"middle timeline", 0x6000, Server{Timeline: 3, History: history}, Record{LSN: 0x9000, Timeline: 2}, Resume{SkipBelow: 0x7000, PhantomFrom: 0x7000, PhantomTo: 0x9000}, false},
		{"timeline not in the history", 0x3000, Server{Timeline: 3, History: history[:1]}, Record{LSN: 0x9000, Timeline: 2}, Resume{SkipBelow: 0x3000, Unrelated: true}, false},
		{"server behind the checkpoint's timeline", 0x3000, Server{Timeline: 1}, Record{LSN: 0x9000, Timeline: 2}, Resume{SkipBelow: 0x3000, Unrelated: true}, false},
		{"checkpoint without a timeline", 0x3000, Server{Timeline: 2, History: history[:1]}, Record{LSN: 0x5000}, Resume{SkipBelow: 0x5000}, false},
		{"slot past the fork", 0x4800, Server{Timeline: 2, History: history[:1]}, Record{LSN: 0x5000, Timeline: 1}, Resume{}, true},
		{"same timeline, same start", 0x3000, Server{Timeline: 2, History: history[:1]}, Record{LSN: 0x5000, Timeline: 2, TimelineStart: 0x4000}, Resume{SkipBelow: 0x5000}, false},
		{"sibling timeline that branched later", 0x3000, Server{Timeline: 2, History: []TimelineEnd{{1, 0x4800}}}, Record{LSN: 0x5000, Timeline: 2, TimelineStart: 0x4000},
			Resume{SkipBelow: 0x4000, PhantomFrom: 0x4000, PhantomTo: 0x5000}, false},
		{"sibling timeline that branched earlier", 0x3000, Server{Timeline: 2, History: []TimelineEnd{{1, 0x3800}}}, Record{LSN: 0x5000, Timeline: 2, TimelineStart: 0x4000},
			Resume{SkipBelow: 0x3800, PhantomFrom: 0x3800, PhantomTo: 0x5000}, false},
		{"sibling of a middle timeline", 0x3000, Server{Timeline: 3, History: history}, Record{LSN: 0x6000, Timeline: 2, TimelineStart: 0x3800},
			Resume{SkipBelow: 0x3800, PhantomFrom: 0x3800, PhantomTo: 0x6000}, false},
		{"sibling, slot past the branch", 0x3900, Server{Timeline: 2, History: []TimelineEnd{{1, 0x3800}}}, Record{LSN: 0x5000, Timeline: 2, TimelineStart: 0x4000}, Resume{}, true},
		{"checkpoint past a failover, WAL short of it", 0x3000, Server{Timeline: 2, History: history[:1], WALEnd: 0x4800}, Record{LSN: 0x5000, Timeline: 1},
			Resume{SkipBelow: 0x4000, PhantomFrom: 0x4000, PhantomTo: 0x5000}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Start(tt.slot, tt.server, &tt.last, false)
			if (err != nil) != tt.wantGapErr || (err != nil && !errors.Is(err, ErrGap)) {
				t.Fatalf("error %v, want a gap error: %t", err, tt.wantGapErr)
			}
			if err == nil && got != tt.want {
				t.Fatalf("resume %+v, want %+v", got, tt.want)
			}
		})
	}
}

// branchAt is the history of a server promoted with old[:cut]: the new timeline continues at the
// fork (where old[:cut] ends) with transactions of its own, at positions old also used.
func branchAt(rng *rand.Rand, old []modelTx, cut int) (history []modelTx, fork LSN) {
	fork = LSN(0x1000)
	if cut > 0 {
		fork = old[cut-1].end
	}
	fresh := modelLog(rng, 1+rng.IntN(40))
	shift := fork - fresh[0].commit + LSN(rng.IntN(2))
	for i := range fresh {
		fresh[i].commit += shift
		fresh[i].end += shift
	}
	return append(append([]modelTx{}, old[:cut]...), fresh...), fork
}

// TestFailoverModel: random logs fork at a random position (the standby received the old primary's
// WAL up to there), new transactions follow on the new timeline at positions the old one also used,
// and the relay resumes from a checkpoint written anywhere on the old timeline with the slot anywhere
// the standby had synchronized it. Every transaction of the new server's history must be delivered:
// skipped only when the checkpoint holds it, never because its position is below the checkpoint's.
func TestFailoverModel(t *testing.T) {
	for seed := uint64(1); seed <= 2000; seed++ {
		rng := rand.New(rand.NewPCG(seed, seed*7919))
		old := modelLog(rng, 2+rng.IntN(40))
		cut := rng.IntN(len(old) + 1) // the standby has old[:cut]
		newHistory, fork := branchAt(rng, old, cut)
		// The checkpoint: the end of any old transaction (the relay streamed it before the failover).
		cpAt := old[rng.IntN(len(old))].end
		// The slot on the new server: synchronized at most up to the fork, at most the checkpoint.
		slot := LSN(0x1000)
		if cut > 0 {
			slot = old[rng.IntN(cut)].end
		}
		slot = min(slot, cpAt)
		last := &Record{LSN: cpAt, Timeline: 1}
		resume, err := Start(slot, Server{Timeline: 2, History: []TimelineEnd{{Timeline: 1, End: fork}}}, last, false)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		for i, tx := range newHistory {
			if tx.commit < slot {
				continue // PostgreSQL does not send it
			}
			inKafka := i < cut && tx.end <= cpAt
			if skipped := AlreadyDelivered(tx.commit, resume.SkipBelow); skipped != inKafka {
				t.Fatalf("seed %d: transaction %d at %s (fork %s, checkpoint %s): skipped %t, but in Kafka %t", seed, i, tx.commit, fork, cpAt, skipped, inKafka)
			}
		}
		if cpAt > fork && (resume.PhantomFrom != fork || resume.PhantomTo != cpAt) {
			t.Fatalf("seed %d: phantom range %s-%s, want %s-%s", seed, resume.PhantomFrom, resume.PhantomTo, fork, cpAt)
		}
	}
}

// TestSiblingTimelineModel: the old primary (timeline 1) dies; standby A, promoted at its fork, takes
// timeline 2 and the relay streams from it, writing checkpoints on timeline 2; A dies too, and the
// relay moves to standby B, promoted independently at a fork of its own — also timeline 2. The
// checkpoint counts on B only up to where A's and B's histories branched: every transaction of B's
// history must be delivered unless Kafka holds it. (Siblings promoted at the same position cannot be
// told apart and are left out.)
func TestSiblingTimelineModel(t *testing.T) {
	for seed := uint64(1); seed <= 2000; seed++ {
		rng := rand.New(rand.NewPCG(seed, seed*6151))
		old := modelLog(rng, 2+rng.IntN(40))
		cutA, cutB := rng.IntN(len(old)+1), rng.IntN(len(old)+1)
		if cutA == cutB {
			// Promoted at the same position, the two are the same timeline to every record
			// PostgreSQL keeps: the one case this cannot tell apart (the README says so).
			continue
		}
		historyA, forkA := branchAt(rng, old, cutA)
		historyB, forkB := branchAt(rng, old, cutB)
		cpAt := historyA[rng.IntN(len(historyA))].end
		last := &Record{LSN: cpAt, Timeline: 2, TimelineStart: forkA}
		// B's slot was synchronized from the old primary: at most what was confirmed there.
		slot := LSN(0x1000)
		if cutB > 0 {
			slot = old[rng.IntN(cutB)].end
		}
		slot = min(slot, forkA, cpAt)
		resume, err := Start(slot, Server{Timeline: 2, History: []TimelineEnd{{Timeline: 1, End: forkB}}}, last, false)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		for i, tx := range historyB {
			if tx.commit < slot {
				continue
			}
			inKafka := i < min(cutA, cutB) && tx.end <= cpAt
			if skipped := AlreadyDelivered(tx.commit, resume.SkipBelow); skipped != inKafka {
				t.Fatalf("seed %d: transaction %d at %s (forks %s and %s, checkpoint %s): skipped %t, but in Kafka %t", seed, i, tx.commit, forkA, forkB, cpAt, skipped, inKafka)
			}
		}
	}
}

// TestCheckpointPastTheWALIsRefused: a checkpoint that would have transactions skipped past the end of
// the server's WAL was not written by this slot's router here (a forged record, a restore to an earlier
// point): trusting it would skip everything up to it. --accept-gap does not accept it.
func TestCheckpointPastTheWALIsRefused(t *testing.T) {
	for _, accept := range []bool{false, true} {
		_, err := Start(0x1000, Server{Timeline: 1, WALEnd: 0x2000}, &Record{LSN: 0xFFFF0000, Timeline: 1}, accept)
		if !errors.Is(err, ErrBeyondWAL) || !strings.Contains(err.Error(), "resync") {
			t.Errorf("accept-gap %t: %v, want ErrBeyondWAL pointing at resync", accept, err)
		}
	}
	if _, err := Start(0x1000, Server{Timeline: 1, WALEnd: 0x2000}, &Record{LSN: 0x2000, Timeline: 1}, false); err != nil {
		t.Errorf("a checkpoint at the WAL's end refused: %v", err)
	}
}

func TestParseTimelineHistory(t *testing.T) {
	got, err := ParseTimelineHistory([]byte("1\t0/3000A28\tno recovery target specified\n\n2\t1/2000000\tbefore 2026-12-03\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []TimelineEnd{{1, 0x3000A28}, {2, 0x1_02000000}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for _, bad := range []string{"1", "x\t0/1", "1\tnot-an-lsn"} {
		if _, err := ParseTimelineHistory([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
