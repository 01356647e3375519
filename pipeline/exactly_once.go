package pipeline

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// txnHandler is the exactly-once mode's handler. Rows go into the open Kafka transaction as they
// arrive; whole PostgreSQL transactions are grouped until the WAL stream has been quiet for
// kafka.quiet_flush after one, kafka.transaction_interval has passed since the first row, or
// kafka.transaction_max_records rows are in, and the Kafka transaction is then
// committed with a checkpoint at the end of the last PostgreSQL transaction it holds. The slot is
// confirmed only up to the last committed checkpoint (confirmLimit). Transactions the last checkpoint
// already covers are skipped whole, by their commit position.
//
// While the stream catches up on a backlog (it reads transactions committed catchUpBehind or more
// before the server sent them), a Kafka transaction stays open catchUpFactor times as long and takes
// as many times the rows: the records are late anyway, and fewer commits (each idles the producer
// for a flush, EndTxn and the coordinator's markers) drain the backlog faster. Once the stream
// reads transactions as they commit, the configured interval and size apply again.
type txnHandler struct {
	handler
	skipBelow checkpoint.LSN
	// timeline and timelineStart are the server's, written into every checkpoint.
	timeline      uint32
	timelineStart checkpoint.LSN
	verified      func() checkpoint.LSN // the verifier's limit: idle checkpoints never pass it
	interval      time.Duration
	catchUp       time.Duration // the interval while the stream catches up (catchUpInterval)
	ackTimeout    time.Duration // kafka.ack_timeout: bounds a commit; 0 does not
	clock         quietClock    // quiet 0: no commit on a quiet stream
	maxRecords    int
	idleEvery     time.Duration
	obs           *observed
	// stopBefore, when set, is a row that can never be delivered, and the commit position of its
	// transaction: the session stops at that transaction's first row, so that the complete
	// transactions before it, which share the open Kafka transaction, are committed first.
	stopBefore *router.UndeliverableError

	committed atomic.Uint64 // the last committed checkpoint: no confirm passes it
	// failedTxns is the number of PostgreSQL transactions of the Kafka transaction whose commit
	// failed; -1 while none did. Written by the commit's goroutine.
	failedTxns atomic.Int32

	records    int            // rows in the open Kafka transaction
	txns       int            // PostgreSQL transactions in it
	firstAt    time.Time      // when its first row was produced
	lastEnd    checkpoint.LSN // end of the last PostgreSQL transaction in it
	open       *checkpoint.Tx // a transaction with rows in it whose Commit has not arrived
	behind     bool           // the last transaction with rows was read catchUpBehind or more late
	lastCommit time.Time      // when the last Kafka transaction was committed
	pace       txPace         // how closely PostgreSQL transactions with rows follow one another
	skipped    atomic.Int64   // rows skipped as already in Kafka
	skippedTx  *checkpoint.Tx // the last transaction skipped, counted once
	skippedTxs int
}

var _ replication.Batcher = (*txnHandler)(nil)

const (
	// catchUpBehind is how late (commit to the server's sending it) a transaction is read for the
	// stream to count as catching up on a backlog.
	catchUpBehind = time.Second
	// catchUpFactor is how many times longer and larger a Kafka transaction grows while catching up.
	catchUpFactor = 8
	// busyGaps: the stream counts as busy while PostgreSQL transactions with rows end, on average,
	// less than interval/busyGaps apart (txPace); a busy stream's commits on a quiet stream come at
	// most every half interval (see FlushDue), and so do at-least-once's sends on a quiet stream,
	// every half linger (quietHandler.FlushDue).
	busyGaps = 4
)

// catchUpInterval is how long a Kafka transaction stays open while the stream catches up:
// catchUpFactor times the interval, but never more than a quarter of the transaction timeout
// (nor less than the interval itself).
func catchUpInterval(interval, timeout time.Duration) time.Duration {
	return max(interval, min(catchUpFactor*interval, timeout/4))
}

// noteTx notes whether the stream catches up, at the first row of each PostgreSQL transaction.
func (h *txnHandler) noteTx(tx *checkpoint.Tx) {
	if h.open != tx {
		h.behind = tx.Behind() >= catchUpBehind
	}
}

// catchingUp reports whether the open Kafka transaction takes the catch-up bounds: the stream reads
// late and the catch-up interval is longer than the configured one (it is capped to it otherwise).
func (h *txnHandler) catchingUp() bool {
	return h.behind && h.catchUp > h.interval
}

// currentInterval and currentMaxRecords are the bounds of the open Kafka transaction.
func (h *txnHandler) currentInterval() time.Duration {
	if h.catchingUp() {
		return h.catchUp
	}
	return h.interval
}

func (h *txnHandler) currentMaxRecords() int {
	if h.catchingUp() {
		return h.maxRecords * catchUpFactor
	}
	return h.maxRecords
}

// confirmLimit is the stream's ConfirmLimit in exactly-once mode.
func (h *txnHandler) confirmLimit() checkpoint.LSN {
	return min(h.verified(), checkpoint.LSN(h.committed.Load()))
}

// Deliver implements replication.Handler.
func (h *txnHandler) Deliver(ctx context.Context, tx *checkpoint.Tx, row *replication.Row) error {
	if checkpoint.AlreadyDelivered(tx.CommitLSN(), h.skipBelow) {
		h.skipped.Add(1)
		if h.skippedTx != tx {
			h.skippedTx = tx
			h.skippedTxs++
		}
		return nil
	}
	if h.stopBefore != nil && uint64(tx.CommitLSN()) == h.stopBefore.CommitLSN && h.open != tx {
		return &stoppedBefore{h.stopBefore}
	}
	if err := h.handler.Deliver(ctx, tx, row); err != nil {
		return err
	}
	if h.records == 0 {
		h.firstAt = time.Now()
	}
	h.noteTx(tx)
	h.clock.row()
	h.records++
	h.open = tx
	return nil
}

// Committed implements replication.Batcher.
func (h *txnHandler) Committed(ctx context.Context, tx *checkpoint.Tx, end checkpoint.LSN) error {
	h.clock.end()
	if checkpoint.AlreadyDelivered(tx.CommitLSN(), h.skipBelow) {
		return nil
	}
	if h.open == tx {
		h.pace.note(h.clock.lastEnd)
	}
	h.open = nil
	h.lastEnd = end
	h.txns++
	if h.records >= h.currentMaxRecords() {
		return h.Flush(ctx)
	}
	return nil
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// idlePosition is where an idle checkpoint may stand: the watermark (a keepalive's WAL end once
// everything is delivered), never past the last verified position; zero while anything is in flight.
func (h *txnHandler) idlePosition() checkpoint.LSN {
	if h.records > 0 || !h.tracker.Idle() {
		return 0
	}
	return min(h.tracker.Watermark(), h.verified())
}

// FlushDue implements replication.Batcher.
//
// A commit on a quiet stream (kafka.quiet_flush) keeps a lone transaction from waiting for the
// interval. On a busy stream the gaps between transactions look quiet too, and every gap would
// commit: measured at 10,000 events/s in 10-row transactions, 420 Kafka transactions/s, each one
// work for the transaction coordinator (the state log, a marker on every partition) and for this
// process. So on a busy stream a commit on a quiet stream comes at most every half interval (170
// commits/s there, 13% less CPU, the same p99); the interval and kafka.transaction_max_records
// bound a transaction as before.
func (h *txnHandler) FlushDue() time.Time {
	if h.records > 0 {
		due := h.firstAt.Add(h.currentInterval())
		if h.clock.quiet > 0 {
			q := h.clock.due()
			if h.pace.busy() {
				if spaced := h.lastCommit.Add(h.interval / 2); spaced.After(q) {
					q = spaced
				}
			}
			due = minTime(due, q)
		}
		return due
	}
	if h.idlePosition() > checkpoint.LSN(h.committed.Load()) {
		return h.lastCommit.Add(h.idleEvery)
	}
	return time.Time{}
}

// Flush implements replication.Batcher: it commits the open Kafka transaction with its checkpoint,
// or, with no rows waiting, writes an idle checkpoint so that the slot may be confirmed to a
// keepalive's position and an idle outbox does not pin WAL.
func (h *txnHandler) Flush(ctx context.Context) error {
	if h.open != nil {
		return errors.New("exactly-once: a Kafka transaction would end inside a PostgreSQL transaction")
	}
	cp := checkpoint.Record{LSN: h.lastEnd, Transactions: h.txns, Timeline: h.timeline, TimelineStart: h.timelineStart}
	if h.records == 0 {
		cp = checkpoint.Record{LSN: h.idlePosition(), Timeline: h.timeline, TimelineStart: h.timelineStart}
		if cp.LSN <= checkpoint.LSN(h.committed.Load()) {
			return nil
		}
	}
	// The commit runs in the background while the stream reads on (rows produced meanwhile wait in
	// the router until the commit's records are acknowledged, then go into the next Kafka
	// transaction), bounded as an acknowledgement is bounded, so that PostgreSQL is let go if Kafka
	// does not answer. StartCommit first waits until the commit before lets records go on (and
	// returns its failure, which ends the session); commits end in order. A graceful stop waits for
	// them (finish).
	var cctx context.Context
	var cancel context.CancelFunc
	if h.ackTimeout > 0 {
		cctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), h.ackTimeout)
	} else {
		cctx, cancel = context.WithCancel(context.WithoutCancel(ctx))
	}
	ended := func(err error) error {
		defer cancel()
		if err != nil {
			// The first commit that failed; one after it fails for its sake.
			h.failedTxns.CompareAndSwap(-1, int32(cp.Transactions))
			if errors.Is(cctx.Err(), context.DeadlineExceeded) {
				return &kafkaError{fmt.Errorf("%w: the Kafka commit did not finish within kafka.ack_timeout (%s); the slot keeps everything unconfirmed, and a new session starts once Kafka answers: %w",
					errReleased, h.ackTimeout, err)}
			}
			return err
		}
		h.committed.Store(uint64(cp.LSN))
		if h.obs != nil {
			h.obs.markCheckpoint(cp.LSN)
		}
		return nil
	}
	if err := h.router.StartCommit(cctx, cp, ended); err != nil {
		cancel()
		return err
	}
	h.records, h.txns, h.firstAt, h.lastCommit = 0, 0, time.Time{}, time.Now()
	h.clock.sent()
	return nil
}

// finish commits the session's open Kafka transaction when the stream stopped gracefully between
// whole PostgreSQL transactions, and reports whether it did. Otherwise the transaction is to be
// aborted (Router.Abort) once PostgreSQL is let go, and its transactions are replayed by the next
// session.
func (h *txnHandler) finish(ctx context.Context, commit bool) (committed bool, err error) {
	if !commit || h.open != nil || h.router.Err() != nil {
		return false, nil
	}
	if err := h.Flush(ctx); err != nil {
		return false, fmt.Errorf("commit the last Kafka transaction: %w", err)
	}
	if err := h.router.WaitCommit(ctx); err != nil {
		return false, fmt.Errorf("commit the last Kafka transaction: %w", err)
	}
	return true, nil
}

// startExactlyOnce fences older instances of the slot, reads the last checkpoint and decides where
// the session resumes: transactions below the returned position are already in Kafka. slot is the
// slot's confirmed position and srv the server the session streams from. It refuses a slot that
// stands ahead of the checkpoint unless the gap is accepted.
func (p *Pipeline) startExactlyOnce(ctx context.Context, rt *router.Router, slot checkpoint.LSN, srv replication.Server) (skipBelow checkpoint.LSN, last *checkpoint.Record, err error) {
	fctx, cancel := context.WithTimeout(ctx, p.cfg.Kafka.TransactionTimeout+30*time.Second)
	defer cancel()
	// Asked before fencing changes it: a last transaction that committed wrote a checkpoint.
	state, err := rt.TransactionState(fctx)
	if err != nil {
		return 0, nil, &kafkaError{err}
	}
	if err := rt.Fence(fctx); err != nil {
		return 0, nil, &kafkaError{err}
	}
	last, err = rt.ReadCheckpoint(fctx)
	if err != nil {
		return 0, nil, &kafkaError{err}
	}
	if last == nil && (p.obs.hadCheckpoint() || state == "CompleteCommit") {
		why := "this process had one"
		if !p.obs.hadCheckpoint() {
			why = "Kafka's transaction coordinator says the slot's last Kafka transaction committed, and every one that commits writes a checkpoint"
		}
		if !p.gaps.flag {
			return 0, nil, fmt.Errorf("%w: kafka.checkpoint_topic %s holds no checkpoint for slot %s, yet %s: the topic was deleted, or its records expired (retention). "+
				"Resuming from the slot would deliver its unconfirmed tail again to read_committed consumers; to do so anyway, start once with --accept-gap, or recover with `outbox-cdc resync`",
				checkpoint.ErrMissing, p.cfg.Kafka.CheckpointTopic, p.slotID, why)
		}
		p.gaps.flag = false
		p.log.Warn("exactly-once: the slot's checkpoint is missing from Kafka and --accept-gap is set: resuming from the slot; events after it may be delivered twice",
			"checkpoint_topic", p.cfg.Kafka.CheckpointTopic, "reason", why)
	}
	timeline := srv.Timeline
	resume, err := p.gaps.start(slot, srv.Checkpoint(), last)
	if err != nil {
		return 0, nil, err
	}
	switch {
	case last == nil:
		p.log.Info("exactly-once: no checkpoint in Kafka yet; starting from the slot", "slot_lsn", slot.String(), "checkpoint_topic", p.cfg.Kafka.CheckpointTopic)
	case resume.PhantomTo != 0:
		p.log.Error("exactly-once: the last checkpoint is past the point where its timeline ended on this server: this server was promoted without the previous primary's WAL from there on. "+
			"Kafka holds events of transactions in that range whose rows do not exist here (phantom events); this timeline's own transactions from that point on are delivered. "+
			"Set synchronized_standby_slots on the primary so that the router never receives what a standby lacks (see `outbox-cdc status --standby`)",
			"timeline", last.Timeline, "timeline_end", resume.PhantomFrom.String(), "checkpoint_lsn", last.LSN.String(), "server_timeline", timeline,
			"phantom_wal_bytes", uint64(resume.PhantomTo-resume.PhantomFrom))
	case resume.Unrelated:
		p.log.Warn("exactly-once: the last checkpoint was written on a timeline that is not in this server's history (a server restored from a backup?); "+
			"resuming from the slot's position: records may be delivered twice",
			"checkpoint_timeline", last.Timeline, "server_timeline", timeline, "checkpoint_lsn", last.LSN.String(), "slot_lsn", slot.String())
	case slot > last.LSN:
		p.log.Warn("exactly-once: the slot is ahead of the last checkpoint and --accept-gap is set: events between them may never have reached Kafka",
			"slot_lsn", slot.String(), "checkpoint_lsn", last.LSN.String())
	default:
		p.log.Info("exactly-once: resuming after the last checkpoint", "checkpoint_lsn", last.LSN.String(), "slot_lsn", slot.String(),
			"checkpoint_written", last.Written.UTC().Format(time.RFC3339Nano))
	}
	if last != nil {
		// What the checkpoint counts on this server: after a failover past its timeline's end, less
		// than its position.
		p.obs.markCheckpoint(resume.SkipBelow)
	}
	return resume.SkipBelow, last, nil
}

// gapPolicy is --accept-gap: it accepts the gap between the slot and the last checkpoint that the
// first checkpoint read of the process finds — and, while neither moves, that same gap again in a
// later session — but no other. A gap that opens later (the slot dropped and created anew under a
// running router) is refused like any other.
type gapPolicy struct {
	flag     bool // --accept-gap was given and no checkpoint has been read yet
	accepted *acceptedGap
}

// acceptedGap is the gap --accept-gap accepted: the slot's position and the checkpoint then.
type acceptedGap struct {
	slot checkpoint.LSN
	last checkpoint.Record
}

// start is checkpoint.Start with the policy's answer to a gap.
func (g *gapPolicy) start(slot checkpoint.LSN, server checkpoint.Server, last *checkpoint.Record) (checkpoint.Resume, error) {
	resume, err := checkpoint.Start(slot, server, last, false)
	if errors.Is(err, checkpoint.ErrGap) && g.accepts(slot, last) {
		resume, err = checkpoint.Start(slot, server, last, true)
		if err == nil && g.accepted == nil {
			g.accepted = &acceptedGap{slot: slot, last: *last}
		}
	}
	if err == nil || errors.Is(err, checkpoint.ErrGap) {
		g.flag = false // the flag answered the first checkpoint read; later ones are on their own
	}
	return resume, err
}

// accepts reports whether the gap of a slot at slot ahead of last is the one accepted.
func (g *gapPolicy) accepts(slot checkpoint.LSN, last *checkpoint.Record) bool {
	if g.flag {
		return true
	}
	a := g.accepted
	return a != nil && last != nil && last.LSN == a.last.LSN && last.Written.Equal(a.last.Written) && slot <= a.slot
}

// singleTransaction reports whether the open Kafka transaction holds at most one PostgreSQL
// transaction (whole or in part): one that cannot be split, so a replay meets the same limits.
func (h *txnHandler) singleTransaction() bool {
	if n := h.failedTxns.Load(); n >= 0 {
		return n <= 1 // a commit failed: the transaction it ended
	}
	return h.txns == 0 || (h.txns == 1 && h.open == nil)
}

// stoppedBefore ends a session at the first row of the transaction holding a row that can never be
// delivered (txnHandler.stopBefore), between whole PostgreSQL transactions: the open Kafka
// transaction is committed, then the row's error stops the pipeline.
type stoppedBefore struct{ err *router.UndeliverableError }

// Error implements error.
func (s *stoppedBefore) Error() string { return s.err.Error() }

// Unwrap returns the undeliverable row's error.
func (s *stoppedBefore) Unwrap() error { return s.err }
