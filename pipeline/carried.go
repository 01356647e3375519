// What one session of the pipeline leaves to the next: the transactions Kafka acknowledged (skipped
// instead of sent again), a cut transaction's rows already handed over, the router a session let go
// of while Kafka was silent (lingering), and, at an at-least-once router's graceful stop, the hand-over
// checkpoint that lets the exactly-once mode resume without a gap.

package pipeline

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// carried is what one session leaves to the next.
type carried struct {
	// standby is true while this instance waits for a slot another one holds.
	standby bool
	// lastPID is the walsender of the previous session: if it still holds the slot, the connection
	// died without the server noticing, and the next session ends it rather than wait as a standby
	// for wal_sender_timeout.
	lastPID int
	// streamed is when the last session began streaming (zero if it never did); progressed is true
	// once it confirmed a position.
	streamed   time.Time
	progressed bool
	// poke asks the slot monitor for a fresh observation.
	poke chan struct{}
	// slotSeen is true once a session streamed from the slot: a slot missing later is not re-created.
	slotSeen bool
	// server is the address the last session streamed from.
	server string
	// verified is the last session's last verification of the outbox: the next one must continue it.
	verified replication.Verification
	// acked is how far the last session's transactions were all acknowledged by Kafka (at-least-once
	// mode), and on which server: the next session skips whole transactions below it instead of
	// sending them again.
	acked ackedPosition
	// lingering is the last session's router when that session let go of PostgreSQL because Kafka
	// acknowledged nothing for kafka.ack_timeout (at-least-once): see settleLingering.
	lingering *lingering
}

// lingering is a router, with what its session knew, kept after the session ended.
type lingering struct {
	rt      *router.Router
	tracker *checkpoint.Tracker
	skip    *skipper
	srv     replication.Server
	since   time.Time
}

// lingerFor bounds, in kafka.ack_timeouts, how long a lingering router is waited for while Kafka does
// not acknowledge its records; then it is closed and its records are replayed (sent again).
const lingerFor = 10

// settleLingering waits, up to kafka.ack_timeout, for the records the last session left with its
// router to be acknowledged, then closes that router and carries what it delivered. The session let
// go of PostgreSQL because Kafka stopped acknowledging (a broker restarting, say); its records stayed
// with the producer, which sends them again with the same producer id and sequence numbers once the
// broker answers, so that the broker drops the ones it had written but whose acknowledgement was lost.
// Closing the router at once failed them instead, and the replay sent them again as new records:
// duplicates. While they are not acknowledged, the next session does not start (it could not
// deliver either); after lingerFor ack timeouts, or when the router fails, the router is closed and its
// unacknowledged records are replayed.
func (p *Pipeline) settleLingering(ctx context.Context, c *carried) error {
	l := c.lingering
	if l == nil {
		return nil
	}
	wait := max(p.cfg.Kafka.AckTimeout, time.Second)
	fctx, cancel := context.WithTimeout(ctx, wait)
	err := l.rt.Flush(fctx)
	cancel()
	if err != nil && l.rt.Err() == nil && ctx.Err() == nil && time.Since(l.since) < lingerFor*wait {
		return &kafkaError{fmt.Errorf("%w: Kafka has not acknowledged the %d records the last session left with the producer yet; they are re-sent as they were once it answers",
			errReleased, l.tracker.Stats().PendingRecords)}
	}
	if err == nil {
		lctx, cancel := context.WithTimeout(ctx, time.Second)
		awaitPromises(lctx, l.rt, l.tracker)
		cancel()
	}
	l.rt.Close()
	c.lingering = nil
	before := c.acked.lsn
	c.acked = l.skip.carry(l.tracker, l.srv)
	p.log.Info("the records the last session left with the Kafka producer are settled", "acknowledged_up_to_lsn", c.acked.lsn.String(),
		"previously_lsn", before.String(), "unacknowledged_records", l.tracker.Stats().PendingRecords)
	return nil
}

// ackedPosition is a watermark of acknowledged transactions on one server's timeline.
type ackedPosition struct {
	lsn              checkpoint.LSN
	system, database string
	timeline         uint32
	// timelineStart is where that timeline began on the server that streamed it: a timeline of the
	// same number that began elsewhere (a sibling promoted on its own) shares no positions past it.
	timelineStart checkpoint.LSN
	// partial is the commit position of the transaction the session ended in the middle of (its
	// Commit message never came), and partialRows how many of its leading rows Kafka had all
	// acknowledged: pgoutput sends a transaction's rows before its commit, and they are produced as
	// they come. Zero when the session ended between transactions or with some of them unacknowledged.
	partial     checkpoint.LSN
	partialRows int
}

// skipBelow is the position below which a session on srv, starting from the slot at start, may skip
// transactions as already acknowledged (zero: skip nothing). Only on the same cluster and database,
// only ahead of the slot, and only as far as srv's WAL is the one the position counted in: on
// another timeline (after a failover or a point-in-time recovery), up to where the acknowledged
// timeline ended by srv's timeline history — past that point the same positions hold other
// transactions — and nothing when the history does not hold that timeline. It is the exactly-once
// mode's rule for its checkpoint (checkpoint.Start).
func (a ackedPosition) skipBelow(srv replication.Server, start checkpoint.LSN) checkpoint.LSN {
	if a.lsn <= start || a.system == "" || a.system != srv.SystemID || a.database != srv.Database || a.timeline == 0 || srv.Timeline == 0 {
		return 0
	}
	last := &checkpoint.Record{LSN: a.lsn, Timeline: a.timeline, TimelineStart: a.timelineStart}
	r, err := checkpoint.Start(start, srv.Checkpoint(), last, true)
	if err != nil || r.Unrelated || r.SkipBelow <= start {
		return 0
	}
	return r.SkipBelow
}

// partialSkip is the commit position of the transaction whose first rows a session on srv, starting
// from the slot at start, may skip as already acknowledged, and how many (zero: none). The same
// transaction is replayed at the same commit position only where the WAL is the same: skipBelow's
// rule, applied to the position just past its commit.
func (a ackedPosition) partialSkip(srv replication.Server, start checkpoint.LSN) (checkpoint.LSN, int) {
	if a.partial == 0 || a.partialRows <= 0 {
		return 0, 0
	}
	at := a
	at.lsn = a.partial + 1
	if !checkpoint.AlreadyDelivered(a.partial, at.skipBelow(srv, start)) {
		return 0, 0
	}
	return a.partial, a.partialRows
}

// madeProgress reports whether the last session did something worth starting the backoff over for:
// it confirmed a position, or streamed for a while.
func (c *carried) madeProgress() bool {
	return !c.streamed.IsZero() && (c.progressed || time.Since(c.streamed) >= progressAfter)
}

// progressAfter is how long a session must stream to count as progress without a confirm.
const progressAfter = 5 * time.Second

// handOverTimeout bounds the hand-over checkpoint at an at-least-once router's graceful stop.
const handOverTimeout = 5 * time.Second

// handOver writes, at an at-least-once router's graceful stop, a hand-over checkpoint at the position
// the stream confirmed — every transaction before it acknowledged by Kafka — when the slot has an
// exactly-once checkpoint behind it (it streamed exactly-once before) and this process streamed from
// that checkpoint (or before it) on: the exactly-once mode then resumes there, instead of taking
// what at-least-once delivered meanwhile for a gap. A process that began past the checkpoint (the
// slot dropped and created anew, advanced by hand, or moved by an at-least-once router that did not
// stop gracefully) hands nothing over, so that the gap is still refused. Without an earlier
// checkpoint there is nothing to hand over: the exactly-once mode starts from the slot.
func (p *Pipeline) handOver(srv replication.Server) {
	confirmed := checkpoint.LSN(p.Replication.ConfirmedLSN.Load())
	slot := checkpoint.SlotID{SystemID: srv.SystemID, Database: srv.Database, Slot: p.cfg.Postgres.Slot}
	ctx, cancel := context.WithTimeout(context.Background(), handOverTimeout)
	defer cancel()
	last, err := router.ReadCheckpoint(ctx, p.cfg.Kafka, p.cfg.Kafka.CheckpointTopic, slot, p.log)
	if err != nil || last == nil || last.LSN >= confirmed || confirmed == 0 {
		if err != nil {
			p.log.Debug("shutdown: no hand-over checkpoint (the checkpoint topic cannot be read)", "error", err.Error())
		}
		return
	}
	if p.streamedFrom > last.LSN {
		p.log.Warn("shutdown: no hand-over checkpoint: this router began streaming past the slot's last exactly-once checkpoint, so what lies between was not delivered by it; switching the slot to exactly-once is refused as a gap",
			"checkpoint_lsn", last.LSN.String(), "streamed_from", p.streamedFrom.String())
		return
	}
	rec := checkpoint.Record{Slot: slot, LSN: confirmed, Timeline: srv.Timeline, TimelineStart: srv.TimelineStart(), Written: time.Now().UTC(), Delivery: config.DeliveryAtLeastOnce}
	if err := router.WriteHandover(ctx, p.cfg.Kafka, p.cfg.Kafka.CheckpointTopic, rec, p.log); err != nil {
		p.log.Warn("shutdown: could not write the hand-over checkpoint; switching this slot to exactly-once will be refused as a gap until an at-least-once router stops gracefully again",
			"checkpoint_topic", p.cfg.Kafka.CheckpointTopic, "error", err.Error())
		return
	}
	p.log.Info("wrote a hand-over checkpoint: the exactly-once mode resumes here without a gap", "checkpoint_topic", p.cfg.Kafka.CheckpointTopic,
		"lsn", confirmed.String(), "previous_checkpoint", last.LSN.String())
}

// skipper skips whole transactions committed below a position, and the leading rows of the one
// transaction an earlier session ended in the middle of, counting them. It also follows how many rows
// of the current transaction were handed over, for the next session's skip.
type skipper struct {
	below checkpoint.LSN
	// partial is the commit position of the transaction whose first partialRows rows are skipped.
	partial     checkpoint.LSN
	partialRows int
	rows        *atomic.Int64 // rows skipped, over the pipeline's life
	// cur is the transaction whose rows came last, and seen how many of them were handed to Kafka or
	// skipped.
	cur     *checkpoint.Tx
	seen    int
	skipped *checkpoint.Tx // the last transaction counted in txs
	txs     int            // transactions skipped (whole or in part) in this session
	n       int64          // rows skipped in this session
}

// skips reports whether the next row of tx is to be skipped, and counts it. A row it does not skip
// must be reported with handed once Kafka has it.
func (s *skipper) skips(tx *checkpoint.Tx) bool {
	if s == nil {
		return false
	}
	if s.cur != tx {
		s.cur, s.seen = tx, 0
	}
	c := tx.CommitLSN()
	if c == 0 || !(checkpoint.AlreadyDelivered(c, s.below) || c == s.partial && s.seen < s.partialRows) {
		return false
	}
	s.seen++
	s.rows.Add(1)
	s.n++
	if s.skipped != tx {
		s.skipped = tx
		s.txs++
	}
	return true
}

// carry is what the next session may skip: the transactions below this session's watermark or below
// what it was told to skip itself (a session cut before it got that far must not forget it), and the
// leading rows of the transaction it ended in the middle of if Kafka holds them and everything before
// them (an unacknowledged one may be lost: then they all go again, in order) — or the earlier such
// transaction if this session did not get to it.
func (s *skipper) carry(tracker *checkpoint.Tracker, srv replication.Server) ackedPosition {
	a := ackedPosition{lsn: max(tracker.Watermark(), s.below), system: srv.SystemID, database: srv.Database, timeline: srv.Timeline, timelineStart: srv.TimelineStart()}
	if !checkpoint.AlreadyDelivered(s.partial, a.lsn) {
		a.partial, a.partialRows = s.partial, s.partialRows
	}
	if tx, rows := s.open(); tx != nil && tx.CommitLSN() != 0 && !checkpoint.AlreadyDelivered(tx.CommitLSN(), a.lsn) {
		if tracker.CutShort(tx) {
			if tx.CommitLSN() == a.partial {
				rows = max(rows, a.partialRows)
			}
			a.partial, a.partialRows = tx.CommitLSN(), rows
		}
	}
	return a
}

// handed records that the current transaction's next row was handed to Kafka.
func (s *skipper) handed() {
	if s != nil {
		s.seen++
	}
}

// open is the transaction whose rows came last and how many of them were handed over or skipped.
func (s *skipper) open() (*checkpoint.Tx, int) {
	if s == nil {
		return nil, 0
	}
	return s.cur, s.seen
}
