package pipeline

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// delivery is a delivery mode's part of one session. runOnce tells the session's story — Kafka, set-up,
// the stream, the stop — and asks the mode at each step that differs: how far the slot may be
// confirmed, the handler the stream gets, what a failure of Kafka means, and how the session's
// deliveries end. atLeastOnce (below) and exactlyOnce (exactly_once.go) are the two modes.
type delivery interface {
	// confirmLimit bounds the slot's confirmed position, beside the tracker's watermark.
	confirmLimit() checkpoint.LSN
	// handler is what the stream gets, built on the session's base handler (its router and tracker).
	// It is called once the stream has started.
	handler(base handler) replication.Handler
	// kafkaFailed is the error the session reports for the router's failure rerr.
	kafkaFailed(rerr error) error
	// end finishes the session's deliveries once the stream stopped, with runErr its error; graceful
	// says the stop was asked for and Kafka is healthy.
	end(graceful bool, runErr error) ending
	// stopped runs after a graceful stop's final confirm.
	stopped(srv replication.Server)
}

// ending is what a delivery mode's end leaves the session to do.
type ending struct {
	// graceful is whether the stop stays graceful: the final confirm covers what was delivered.
	graceful bool
	// abort, when set, runs once the stream is closed: the open Kafka transaction is aborted.
	abort func()
	// keepRouter: the router lingers into the next session (settleLingering) and is not closed.
	keepRouter bool
}

// newDelivery starts the configured delivery mode for a session whose slot stands at start on srv;
// limit is the publication verifier's bound. Exactly-once fences and reads its checkpoint here, before
// the slot is taken, so that no older instance can commit after the read and the walsender is not
// kept waiting meanwhile.
func (p *Pipeline) newDelivery(ctx context.Context, c *carried, rt *router.Router, start checkpoint.LSN, srv replication.Server, limit func() checkpoint.LSN) (delivery, error) {
	if p.cfg.Kafka.ExactlyOnce() {
		return p.newExactlyOnce(ctx, rt, start, srv, limit)
	}
	return &atLeastOnce{p: p, c: c, rt: rt, srv: srv, start: start, limit: limit}, nil
}

// atLeastOnce produces every row as it comes and lets the slot be confirmed up to the acknowledged
// watermark. A session skips the transactions an earlier session of this process saw acknowledged
// (carried.go), and leaves the next one what Kafka acknowledged, and its router when records were
// still in flight as PostgreSQL was let go.
type atLeastOnce struct {
	p     *Pipeline
	c     *carried
	rt    *router.Router
	srv   replication.Server
	start checkpoint.LSN
	limit func() checkpoint.LSN
	base  handler // the session's, with its skipper
}

func (a *atLeastOnce) confirmLimit() checkpoint.LSN { return a.limit() }

func (a *atLeastOnce) handler(base handler) replication.Handler {
	if a.p.streamedFrom == 0 {
		a.p.streamedFrom = a.start
	}
	base.skip = &skipper{below: a.c.acked.skipBelow(a.srv, a.start), rows: &a.p.skippedRows}
	base.skip.partial, base.skip.partialRows = a.c.acked.partialSkip(a.srv, a.start)
	a.base = base
	cfg := a.p.cfg.Kafka
	if cfg.QuietFlush > 0 && cfg.Linger > 0 {
		return &quietHandler{handler: a.base, clock: quietClock{quiet: cfg.QuietFlush}, pace: txPace{bound: cfg.Linger}}
	}
	return &a.base
}

func (a *atLeastOnce) kafkaFailed(rerr error) error { return &kafkaError{rerr} }

func (a *atLeastOnce) end(graceful bool, runErr error) ending {
	tracker := a.base.tracker
	switch {
	case graceful || (errors.Is(runErr, replication.ErrOutboxChanged) && a.rt.Err() == nil):
		// Everything handed to Kafka before the stop is delivered and confirmed: a restart resumes
		// exactly where this session stopped.
		a.p.drain(a.rt, tracker)
	case a.rt.Err() == nil:
		// A failure on PostgreSQL's side: Kafka still takes what is in flight. Waiting a moment for it
		// lets the next session skip those transactions rather than send them again.
		fctx, fcancel := context.WithTimeout(context.Background(), inFlightWait)
		_ = a.rt.Flush(fctx)
		fcancel()
	}
	// Up to the watermark, past the last verified position (the final confirm went that far): the
	// transactions between were acknowledged, and the next session replays them only if its set-up
	// finds the outbox unchanged since the last verification (setup: Continues), in which case the
	// walsender sends them again with the same rows.
	skip := a.base.skip
	a.c.acked = skip.carry(tracker, a.srv)
	e := ending{graceful: graceful}
	var ke *kafkaError
	if errors.As(runErr, &ke) && errors.Is(runErr, errReleased) && a.rt.Err() == nil && tracker.Stats().PendingRecords > 0 {
		e.keepRouter = true
		a.c.lingering = &lingering{rt: a.rt, tracker: tracker, skip: skip, srv: a.srv, since: time.Now()}
	}
	if skip.txs > 0 || skip.n > 0 {
		a.p.log.Info("skipped transactions Kafka had acknowledged before the last failure (not sent again)", "transactions", skip.txs, "rows", skip.n)
	}
	return e
}

func (a *atLeastOnce) stopped(srv replication.Server) { a.p.handOver(srv) }

// exactlyOnce writes rows in Kafka transactions with a checkpoint record and lets the slot be
// confirmed only up to the last committed checkpoint (txnHandler).
type exactlyOnce struct {
	*txnHandler
	p  *Pipeline
	rt *router.Router
}

// newExactlyOnce fences older instances of the slot and reads the last checkpoint
// (startExactlyOnce), then sets up the session's transactional handler.
func (p *Pipeline) newExactlyOnce(ctx context.Context, rt *router.Router, start checkpoint.LSN, srv replication.Server, limit func() checkpoint.LSN) (*exactlyOnce, error) {
	cfg := p.cfg
	skipBelow, last, err := p.startExactlyOnce(ctx, rt, start, srv)
	if err != nil {
		return nil, err
	}
	h := &txnHandler{skipBelow: skipBelow, timeline: srv.Timeline, timelineStart: srv.TimelineStart(), verified: limit, ackTimeout: cfg.Kafka.AckTimeout, interval: cfg.Kafka.TransactionInterval,
		catchUp: catchUpInterval(cfg.Kafka.TransactionInterval, cfg.Kafka.TransactionTimeout), clock: quietClock{quiet: cfg.Kafka.QuietFlush},
		pace: txPace{bound: cfg.Kafka.TransactionInterval}, maxRecords: cfg.Kafka.TransactionMaxRecords, idleEvery: cfg.Postgres.StatusInterval, obs: &p.obs,
		stopBefore: p.stopBefore}
	h.committed.Store(uint64(start))
	h.failedTxns.Store(-1)
	if last != nil {
		// What Kafka holds on this server's timeline: after a failover, less than the checkpoint.
		h.committed.Store(uint64(skipBelow))
	}
	return &exactlyOnce{txnHandler: h, p: p, rt: rt}, nil
}

func (e *exactlyOnce) handler(base handler) replication.Handler {
	e.txnHandler.handler = base
	return e.txnHandler
}

func (e *exactlyOnce) kafkaFailed(rerr error) error {
	if errors.Is(rerr, router.ErrTxnTimedOut) && e.singleTransaction() {
		// One PostgreSQL transaction is never split over Kafka transactions: replayed, it would time
		// out again, forever.
		return fmt.Errorf("%w: a single PostgreSQL transaction took longer to deliver than kafka.transaction_timeout (%s) allows; raise kafka.transaction_timeout (and the brokers' transaction.max.timeout.ms): %w",
			errTransactionTooLarge, e.p.cfg.Kafka.TransactionTimeout, rerr)
	}
	return &kafkaError{rerr}
}

func (e *exactlyOnce) end(graceful bool, runErr error) ending {
	e.p.skippedRows.Add(e.skipped.Load())
	if e.skippedTxs > 0 {
		e.p.log.Info("exactly-once: skipped transactions the last checkpoint already holds", "transactions", e.skippedTxs, "rows", e.skipped.Load())
	}
	// The open Kafka transaction is committed only when the stream stopped between whole PostgreSQL
	// transactions; otherwise it is aborted, once PostgreSQL is let go, and replayed.
	var stopped *stoppedBefore
	keep := (errors.Is(runErr, replication.ErrOutboxChanged) || errors.As(runErr, &stopped)) && e.rt.Err() == nil
	fctx, fcancel := context.WithTimeout(context.Background(), e.p.cfg.ShutdownTimeout)
	committed, err := e.finish(fctx, graceful || keep)
	fcancel()
	out := ending{graceful: graceful}
	if err != nil {
		e.p.log.Warn("stop: the last Kafka transaction was not committed; the next session replays it", "error", err.Error())
		out.graceful = false
	}
	if !committed {
		out.abort = e.rt.Abort
	}
	return out
}

func (e *exactlyOnce) stopped(replication.Server) {}

// handler hands rows from the stream to the router and records them in the tracker.
type handler struct {
	router  *router.Router
	tracker *checkpoint.Tracker
	// skip (at-least-once), when not nil, skips the transactions an earlier session of this process
	// saw acknowledged by Kafka.
	skip *skipper
	// ackTx and ack are the last transaction delivered and its acknowledgement callback, shared by
	// its rows: one closure per transaction, not per row.
	ackTx *checkpoint.Tx
	ack   func()
}

// Deliver implements replication.Handler.
func (h *handler) Deliver(ctx context.Context, tx *checkpoint.Tx, row *replication.Row) error {
	if h.skip.skips(tx) {
		return nil
	}
	prepared, err := h.router.Prepare(ctx, row, router.Source{LSN: uint64(row.LSN), CommitTime: tx.CommitTime(), CommitLSN: uint64(tx.CommitLSN())})
	if err != nil {
		return err
	}
	h.tracker.Add(tx)
	if h.ackTx != tx {
		tracker := h.tracker
		h.ackTx, h.ack = tx, func() { tracker.Ack(tx) }
	}
	h.router.Produce(prepared, h.ack)
	h.skip.handed()
	return nil
}
