// Producing: admission into the in-flight window, the produce call and its acknowledgement, and the
// classification of a failed produce (retry with the next session, isolate a rejected batch, or
// dead-letter the record at fault).

package router

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Produce hands a prepared record to Kafka without blocking; ack runs once the record, or its
// dead-letter record, is acknowledged. A final produce error fails the router instead: ack never
// runs, so the slot never moves past the record.
//
// In transactions, a record produced while a commit runs (StartCommit) waits, in order, for the next
// transaction, which begins once the commit is complete.
func (r *Router) Produce(p *Prepared, ack func()) {
	if r.transactional() {
		r.txnMu.Lock()
		defer r.txnMu.Unlock()
		if r.committing != nil {
			r.queued = append(r.queued, waitingRecord{p: p, ack: ack})
			return
		}
	}
	r.produceNow(p, ack)
}

// produceNow is Produce with no commit running.
func (r *Router) produceNow(p *Prepared, ack func()) {
	if err := r.Err(); err != nil {
		// Failed since Prepare: nothing more goes to Kafka before the replay (never acknowledged,
		// so the slot never moves past it).
		r.release(p.reserved())
		endSpan(p.span, p.rec, err)
		return
	}
	if err := r.begin(); err != nil {
		r.release(p.reserved())
		r.fail(err)
		return
	}
	r.txnRecords++
	if r.hold(p, ack) {
		return
	}
	r.produce(p, ack)
}

// produce hands p to Kafka; its topic is ready.
func (r *Router) produce(p *Prepared, ack func()) {
	if p.prep != nil {
		// Held while its topic was prepared: what needed the topic is done now.
		prep, row := p.prep, p.row
		p.prep, p.row = nil, nil
		if prep.err != nil {
			// Never acknowledged: the session replays it.
			r.release(p.reserved())
			endSpan(p.span, p.rec, prep.err)
			r.fail(prep.err)
			return
		}
		if problem, class := topicProblem(p.rec, int(p.size), prep.info); problem != nil {
			endSpan(p.span, p.rec, problem)
			p.span = nil
			if r.opts.DLQTopic == "" {
				r.release(p.reserved())
				r.fail(&UndeliverableError{EventID: eventID(p.rec), Reason: problem.Error(), CommitLSN: p.src.CommitLSN})
				return
			}
			p.dlqReason, p.dlqClass = problem.Error(), class
		} else {
			r.stamp(p.rec, row, p.src, prep.info)
		}
	}
	if p.dlqReason != "" {
		r.produceDLQ(p.rec, p, p.dlqReason, p.dlqClass, ack)
		return
	}
	client, lane := r.producer()
	if p.alone && r.alone != nil {
		client = r.alone
	}
	start := time.Now()
	client.Produce(context.Background(), p.rec, func(rec *kgo.Record, err error) {
		if err == nil {
			n := len(rec.Key) + len(rec.Value)
			r.opts.Counters.Produced.Add(1)
			r.opts.Counters.ProducedBytes.Add(int64(n))
			now := time.Now() // one clock read per acknowledgement, for the window and the observer
			r.limiter.ReleaseAcked(p.reserved(), now, now.Sub(start))
			r.trackInFlight()
			r.checkPartitions(rec)
			if r.opts.Observer != nil {
				var e2e time.Duration
				if !p.src.CommitTime.IsZero() {
					e2e = now.Sub(p.src.CommitTime)
				}
				r.opts.Observer.Produced(rec.Topic, p.typ, n, now.Sub(start), e2e)
			}
			endSpan(p.span, rec, nil)
			ack()
			return
		}
		endSpan(p.span, rec, err)
		switch {
		case errors.Is(err, kerr.InvalidTopicException):
			// The topic, not the batch, is at fault: no record can ever go to it.
			r.produceDLQ(rec, p, fmt.Sprintf("kafka refused topic %s: %v", rec.Topic, err), "unroutable", ack)
		case recordRejected(err) && p.alone:
			r.produceDLQ(rec, p, fmt.Sprintf("kafka rejected the record, produced alone: %v", err), "rejected", ack)
		case recordRejected(err):
			r.release(p.reserved())
			for {
				upTo := r.rejectedUpTo.Load()
				if p.src.CommitLSN <= upTo || r.rejectedUpTo.CompareAndSwap(upTo, p.src.CommitLSN) {
					break
				}
			}
			r.fail(&RejectedBatchError{Topic: rec.Topic, Err: err, UpTo: r.rejectedUpTo.Load()})
		case r.transactional() && fenced(err):
			r.release(p.reserved())
			r.fail(r.wrapTxnErr(fmt.Sprintf("produce event %s to %s", eventID(rec), rec.Topic), lane, err))
		default:
			r.release(p.reserved())
			r.fail(fmt.Errorf("produce event %s to %s: %w", eventID(rec), rec.Topic, err))
		}
	})
}

// recordRejected reports whether Kafka rejected a batch for what a record in it is (too large,
// invalid): retrying the same batch can never help, and only producing each record alone tells
// which one is at fault.
func recordRejected(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge) ||
		errors.Is(err, kerr.InvalidRecord) || errors.Is(err, kerr.CorruptMessage) ||
		// A timestamp outside the topic's bounds (its configuration changed since the router read it,
		// or the broker's clock): produced alone, the record is stamped afresh.
		errors.Is(err, kerr.InvalidTimestamp)
}

func (r *Router) release(size int64) {
	r.limiter.Release(size)
	r.trackInFlight()
}

func (r *Router) trackInFlight() {
	recs, b, window := r.limiter.InFlight()
	r.opts.Counters.InFlightRecords.Store(recs)
	r.opts.Counters.InFlightBytes.Store(b)
	r.opts.Counters.InFlightWindow.Store(window)
}
