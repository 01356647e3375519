// Package checkpoint computes which WAL position may be confirmed to PostgreSQL.
//
// It is pure logic with no I/O: the replication stream tells it where transactions begin and commit,
// the router tells it when records are acknowledged by Kafka, and it answers with the watermark — the
// highest commit end LSN such that every record of that transaction and of every earlier one has been
// acknowledged. The slot is never confirmed past the watermark.
package checkpoint

import (
	"fmt"
	"sync"
	"time"
)

// LSN is a PostgreSQL WAL position.
type LSN uint64

// String formats the LSN the way PostgreSQL does (for example 16/B374D848).
func (l LSN) String() string { return fmt.Sprintf("%X/%X", uint32(l>>32), uint32(l)) }

// MarshalText formats the LSN as String does (JSON reports show 16/B374D848, as PostgreSQL does).
func (l LSN) MarshalText() ([]byte, error) { return []byte(l.String()), nil }

// UnmarshalText parses the form String writes.
func (l *LSN) UnmarshalText(text []byte) error {
	var hi, lo uint32
	if _, err := fmt.Sscanf(string(text), "%X/%X", &hi, &lo); err != nil {
		return fmt.Errorf("parse LSN %q: %w", text, err)
	}
	*l = LSN(uint64(hi)<<32 | uint64(lo))
	return nil
}

// Tx is one transaction as seen by the tracker. It is created by Tracker.Begin and must only be
// used with the tracker that created it.
type Tx struct {
	seq        uint64
	commitTime time.Time
	sentTime   time.Time // when the server sent the Begin message (its clock); zero when unknown
	commitLSN  LSN
	pending    int  // records handed to Kafka and not yet acknowledged
	committed  bool // the Commit message has been received
	endLSN     LSN
}

// CommitTime is the commit timestamp announced by the transaction's Begin message.
func (t *Tx) CommitTime() time.Time { return t.commitTime }

// Behind is how long after its commit the server sent the transaction's Begin message, both times
// by the server's clock (no skew against this host's): about zero while the stream keeps up, the
// age of the backlog while it catches up. Zero when the send time is unknown.
func (t *Tx) Behind() time.Duration {
	if t.sentTime.IsZero() || t.commitTime.IsZero() {
		return 0
	}
	return max(0, t.sentTime.Sub(t.commitTime))
}

// CommitLSN is the position of the transaction's commit record announced by its Begin message
// (BeginMessage.FinalLSN); transactions arrive in the order of this position. Zero when unknown.
func (t *Tx) CommitLSN() LSN { return t.commitLSN }

// Tracker is the ack watermark. It is safe for concurrent use: the replication stream calls Begin,
// Add and Commit from one goroutine, the Kafka producer calls Ack from its promise goroutine.
type Tracker struct {
	mu        sync.Mutex
	queue     []*Tx // transactions not yet folded into the watermark, in commit order
	nextSeq   uint64
	watermark LSN
	pending   int // records not yet acknowledged, over all transactions
}

// NewTracker returns a tracker whose watermark starts at start, normally the slot's
// confirmed_flush_lsn.
func NewTracker(start LSN) *Tracker {
	return &Tracker{watermark: start}
}

// Begin registers a new transaction with the commit time and commit position its Begin message
// announces. Transactions must be begun in commit order, which is the order pgoutput sends them in
// when streaming is off.
func (t *Tracker) Begin(commitTime time.Time, commitLSN LSN) *Tx {
	return t.BeginSent(commitTime, time.Time{}, commitLSN)
}

// BeginSent is Begin with the time the server sent the Begin message (XLogData.ServerTime), which
// Tx.Behind compares with the commit time.
func (t *Tracker) BeginSent(commitTime, sentTime time.Time, commitLSN LSN) *Tx {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.nextSeq++
	tx := &Tx{seq: t.nextSeq, commitTime: commitTime, sentTime: sentTime, commitLSN: commitLSN}
	t.queue = append(t.queue, tx)
	return tx
}

// Add records that one more record of tx has been handed to Kafka. Call it before producing.
func (t *Tracker) Add(tx *Tx) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if tx.committed && tx.pending == 0 {
		panic("checkpoint: Add after the transaction was committed and fully acknowledged")
	}
	tx.pending++
	t.pending++
}

// Ack records that one record of tx has been acknowledged (written to its topic or to the
// dead-letter topic). It returns true when the watermark moved.
func (t *Tracker) Ack(tx *Tx) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if tx.pending <= 0 {
		panic("checkpoint: Ack without a matching Add")
	}
	tx.pending--
	t.pending--
	return t.advance()
}

// Commit records the end LSN of tx (CommitMessage.TransactionEndLSN). It returns true when the
// watermark moved.
//
// A transaction with nothing left to acknowledge (no outbox rows, as PostgreSQL 14's empty
// transactions and other tables' transactions are, or rows all acknowledged already) waits only for
// its predecessors: it is folded into the committed transaction before it, whose end LSN it takes,
// so that the queue holds one entry per transaction with records in flight, never one per
// transaction of the database while Kafka is away.
func (t *Tracker) Commit(tx *Tx, endLSN LSN) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	tx.committed = true
	tx.endLSN = endLSN
	if n := len(t.queue); tx.pending == 0 && n >= 2 && t.queue[n-1] == tx && t.queue[n-2].committed {
		prev := t.queue[n-2]
		prev.endLSN = max(prev.endLSN, endLSN)
		t.queue[n-1] = nil
		t.queue = t.queue[:n-1]
		return false // prev is still waiting for acknowledgements, or it would have been folded
	}
	return t.advance()
}

// advance folds fully acknowledged, committed transactions at the head of the queue into the
// watermark. Callers hold mu.
func (t *Tracker) advance() bool {
	moved := false
	i := 0
	for ; i < len(t.queue); i++ {
		head := t.queue[i]
		if !head.committed || head.pending > 0 {
			break
		}
		if head.endLSN > t.watermark {
			t.watermark = head.endLSN
			moved = true
		}
	}
	if i > 0 {
		// Drop the folded transactions without keeping the backing array's prefix alive forever.
		n := copy(t.queue, t.queue[i:])
		for j := n; j < len(t.queue); j++ {
			t.queue[j] = nil
		}
		t.queue = t.queue[:n]
	}
	return moved
}

// CutShort reports whether tx is a transaction a session ends in the middle of with everything before
// it in Kafka: its Commit message has not arrived, every transaction before it is folded into the
// watermark, and every record handed to Kafka for it is acknowledged. Its rows so far may then be
// counted as delivered, contiguous with the watermark.
func (t *Tracker) CutShort(tx *Tx) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return !tx.committed && tx.pending == 0 && len(t.queue) > 0 && t.queue[0] == tx
}

// Watermark returns the LSN that may be confirmed to PostgreSQL.
func (t *Tracker) Watermark() LSN {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.watermark
}

// Idle reports whether nothing is in flight and no transaction is half-received.
func (t *Tracker) Idle() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.queue) == 0
}

// AdvanceIdle moves the watermark to lsn (normally a keepalive's server WAL end) if the tracker is
// idle and lsn is ahead. This is what keeps an idle outbox from pinning WAL while other tables are
// busy. It returns true when the watermark moved.
func (t *Tracker) AdvanceIdle(lsn LSN) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.queue) != 0 || lsn <= t.watermark {
		return false
	}
	t.watermark = lsn
	return true
}

// Stats is a snapshot of the tracker's state, for metrics and logs.
type Stats struct {
	// Watermark is the LSN that may be confirmed.
	Watermark LSN
	// PendingRecords counts records handed to Kafka and not yet acknowledged.
	PendingRecords int
	// OpenTransactions counts transactions not yet folded into the watermark.
	OpenTransactions int
	// OldestCommitTime is the commit time of the oldest transaction not yet folded into the
	// watermark; zero when idle.
	OldestCommitTime time.Time
}

// Stats returns a consistent snapshot of the tracker.
func (t *Tracker) Stats() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := Stats{Watermark: t.watermark, PendingRecords: t.pending, OpenTransactions: len(t.queue)}
	if len(t.queue) > 0 {
		s.OldestCommitTime = t.queue[0].commitTime
	}
	return s
}
