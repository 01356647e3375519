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
			skipBelow, err := Start(confirmed, checkpoint, false)
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
			skip, err := Start(tt.slot, tt.last, tt.accept)
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
