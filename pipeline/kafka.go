// The pipeline's side of Kafka: the session's router, the watch over its acknowledgements (a stall
// is reported, and after kafka.ack_timeout the session lets go of PostgreSQL), and the graceful
// drain.

package pipeline

import (
	"context"
	"fmt"
	"time"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// newRouter creates the router every delivery path uses (run and resync), with adjust applied to its
// options, and checks that Kafka answers.
func (p *Pipeline) newRouter(ctx context.Context, adjust ...func(*router.Options)) (*router.Router, error) {
	cfg := p.cfg
	opts := router.Options{
		Kafka: cfg.Kafka, Rules: p.rules, TableRules: p.tableRules, Columns: cfg.Postgres.Columns, Format: p.format(), DLQTopic: cfg.Routing.DLQTopic, Limits: cfg.Limits,
		IsolateUntil: p.isolateUntil, Logger: p.log, Counters: &p.Router, Observer: p.observer, Tracer: p.tracer, Budget: p.budget,
		TopicCreations: p.creations,
	}
	for _, f := range adjust {
		f(&opts)
	}
	if cfg.Kafka.ExactlyOnce() && p.slotID != nil {
		opts.Transactions = &router.Transactions{Slot: *p.slotID, Topic: cfg.Kafka.CheckpointTopic, Timeout: cfg.Kafka.TransactionTimeout}
	}
	rt, err := router.New(opts)
	if err != nil {
		return nil, &kafkaError{err}
	}
	pingCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := rt.Ping(pingCtx); err != nil {
		rt.Close()
		return nil, &kafkaError{err}
	}
	return rt, nil
}

// stallReportEvery is how often a stall is logged while Kafka does not acknowledge.
const stallReportEvery = 30 * time.Second

// watchKafka watches acknowledgements while records are in flight. Every stallReportEvery without
// one it logs the one line an operator needs while a broker is away (the client retries without
// limit); after kafka.ack_timeout without one it ends the session through release: a session that
// cannot confirm holds PostgreSQL (a walsender at shutdown waits for its client to confirm
// everything it sent), while the slot alone keeps everything unconfirmed just as well. The next
// session starts once Kafka answers.
func (p *Pipeline) watchKafka(ctx context.Context, tr *checkpoint.Tracker, release context.CancelCauseFunc) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	acked := func() int64 { return p.Router.Produced.Load() + p.Router.DeadLettered.Load() }
	last, lastAt, reported := acked(), time.Now(), time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		st := tr.Stats()
		if n := acked(); n != last || st.PendingRecords == 0 {
			last, lastAt, reported = n, time.Now(), time.Now()
			continue
		}
		waited := time.Since(lastAt)
		if time.Since(reported) >= stallReportEvery {
			reported = time.Now()
			p.log.Warn("waiting for Kafka to acknowledge; the slot holds the backlog meanwhile",
				"unacknowledged_records", st.PendingRecords, "open_transactions", st.OpenTransactions,
				"oldest_commit_age", time.Since(st.OldestCommitTime).Round(time.Second).String(),
				"confirmed_lsn", st.Watermark.String())
		}
		if timeout := p.cfg.Kafka.AckTimeout; timeout > 0 && waited >= timeout {
			release(&kafkaError{fmt.Errorf("%w: Kafka acknowledged nothing for %s (kafka.ack_timeout) with %d records waiting; the slot keeps them, and a new session starts once Kafka answers",
				errReleased, waited.Round(time.Second), st.PendingRecords)})
			return
		}
	}
}

// drain waits, bounded by the shutdown timeout, for in-flight records to be acknowledged.
func (p *Pipeline) drain(rt *router.Router, tr *checkpoint.Tracker) {
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.ShutdownTimeout)
	defer cancel()
	if err := rt.Flush(ctx); err != nil {
		p.log.Warn("shutdown: not every in-flight record was acknowledged in time", "error", err.Error(), "timeout", p.cfg.ShutdownTimeout.String())
		return
	}
	awaitPromises(ctx, rt, tr)
}

// awaitPromises waits, after a successful Flush of rt, until the records' promises have landed in tr
// (they run after the flush returns), rt fails or ctx ends.
func awaitPromises(ctx context.Context, rt *router.Router, tr *checkpoint.Tracker) {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for tr.Stats().PendingRecords > 0 && rt.Err() == nil {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
