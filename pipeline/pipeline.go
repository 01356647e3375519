// Package pipeline wires replication, router and checkpoint into the run loop shared by the CLI
// commands: it streams committed outbox rows to Kafka, confirms only acknowledged positions, waits as
// a hot standby while another instance holds the slot, and rebuilds everything and replays from the
// slot after a failure.
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/outbox"
	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// Pipeline is the run loop. Create it with New and call Run once.
type Pipeline struct {
	cfg   config.Config
	log   *slog.Logger
	rules *router.Rules
	// tableRules route the rows of the further outbox tables (the tables list), in its order.
	tableRules []*router.Rules

	// Replication counts what the stream decoded and ignored.
	Replication replication.Counters
	// Router counts what the router delivered.
	Router router.Counters

	state    atomic.Int32
	obs      observed
	observer router.Observer
	// isolateUntil is the highest commit position of a batch Kafka rejected: transactions up to it
	// are produced one record at a time, so that only the record at fault is dead-lettered.
	isolateUntil uint64
	// gaps decides which gaps between the slot and the last checkpoint the exactly-once mode accepts.
	gaps gapPolicy
	// slotID identifies the slot across processes (exactly-once mode); learned once.
	slotID *checkpoint.SlotID
	// skippedRows counts rows skipped as already in Kafka (exactly-once mode).
	skippedRows atomic.Int64
	// tracer, if not nil, records the records' spans.
	tracer trace.Tracer
	// budget, if not nil, is the process's in-flight budget, shared with the other sources.
	budget *router.Budget
	// creations bounds the topics the pipeline's routers create per hour (kafka.max_new_topics_per_hour).
	creations *router.CreationLimit
	// streamedFrom is the slot's position when this process's first at-least-once session began:
	// the process delivered every transaction from there on (handOver).
	streamedFrom checkpoint.LSN
	// stopBefore is a row that can never be delivered (no dead-letter topic) that stopped an
	// exactly-once session: the next one commits the transactions before it, then stops there.
	stopBefore *router.UndeliverableError
	// rowsPerPart, when not zero, replaces rowsPerPart (tests read small tables in parts).
	rowsPerPart int64
}

// Option configures a Pipeline.
type Option func(*Pipeline)

// WithObserver has the router report every acknowledged record to o (for metrics).
func WithObserver(o router.Observer) Option {
	return func(p *Pipeline) { p.observer = o }
}

// WithTracer has the router record a producer span per record with t (tracing.otlp_endpoint).
func WithTracer(t trace.Tracer) Option {
	return func(p *Pipeline) { p.tracer = t }
}

// WithBudget has the pipeline's routers share the process's in-flight budget b with the other
// sources (fleet.max_inflight_bytes), beside its own limits.
func WithBudget(b *router.Budget) Option {
	return func(p *Pipeline) { p.budget = b }
}

// WithAcceptGap lets the exactly-once mode start from a slot that stands ahead of the last checkpoint
// in Kafka (the --accept-gap flag): what lies between may never have reached Kafka.
func WithAcceptGap() Option {
	return func(p *Pipeline) { p.gaps.flag = true }
}

// State is what the pipeline is doing.
type State int32

// The pipeline's states.
const (
	// StateStarting: connecting, setting up, or backing off after a failure.
	StateStarting State = iota
	// StateStandby: another instance holds the slot; this one waits to take over.
	StateStandby
	// StateStreaming: the slot is ours and WAL flows to Kafka.
	StateStreaming
	// StateStopped: Run has returned.
	StateStopped
)

// String names the state.
func (s State) String() string {
	return [...]string{"starting", "standby", "streaming", "stopped"}[s]
}

// State returns what the pipeline is doing now.
func (p *Pipeline) State() State { return State(p.state.Load()) }

// New validates what the configuration cannot check alone (the routing rules) and returns a pipeline.
func New(cfg config.Config, log *slog.Logger, opts ...Option) (*Pipeline, error) {
	rules, err := router.NewRules(cfg.Routing, cfg.Postgres.Columns)
	if err != nil {
		return nil, fmt.Errorf("invalid configuration: %w", err)
	}
	// Shared by the exactly-once routers of every slot, in either mode of this one: a row's record
	// there could pass for a checkpoint.
	rules.Reserve(cfg.Kafka.CheckpointTopic, "kafka.checkpoint_topic, which holds the exactly-once checkpoints")
	if cfg.Kafka.ExactlyOnce() && !outbox.ValidTopic(cfg.Kafka.CheckpointTopic) {
		return nil, fmt.Errorf("invalid configuration: kafka.checkpoint_topic: %q is not a valid Kafka topic name", cfg.Kafka.CheckpointTopic)
	}
	p := &Pipeline{cfg: cfg, log: log, rules: rules, creations: router.NewCreationLimit(cfg.Kafka.MaxNewTopicsPerHour)}
	tables, err := cfg.OutboxTables()
	if err != nil {
		return nil, fmt.Errorf("invalid configuration: %w", err)
	}
	for i, t := range tables[1:] {
		tr, err := router.NewRules(t.Routing, cfg.Postgres.Columns)
		if err != nil {
			return nil, fmt.Errorf("invalid configuration: tables[%d]: %w", i, err)
		}
		tr.Reserve(cfg.Kafka.CheckpointTopic, "kafka.checkpoint_topic, which holds the exactly-once checkpoints")
		p.tableRules = append(p.tableRules, tr)
	}
	for _, o := range opts {
		o(p)
	}
	if p.gaps.flag && !cfg.Kafka.ExactlyOnce() {
		return nil, fmt.Errorf("invalid configuration: --accept-gap applies to kafka.delivery exactly-once only (at-least-once keeps no checkpoint that the slot could be ahead of)")
	}
	return p, nil
}

// permanent reports errors that replaying cannot fix: the operator must act.
func permanent(err error) bool {
	var undeliverable *router.UndeliverableError
	return replication.Refused(err) || errors.As(err, &undeliverable) || errors.Is(err, replication.ErrNotSetUp) || errors.Is(err, replication.ErrSlotLost) ||
		errors.Is(err, replication.ErrResyncInterrupted) || errors.Is(err, replication.ErrOutboxChanged) || errors.Is(err, replication.ErrUnreadable) || errors.Is(err, router.ErrConfig) ||
		errors.Is(err, checkpoint.ErrGap) || errors.Is(err, checkpoint.ErrMissing) || errors.Is(err, checkpoint.ErrBeyondWAL) || errors.Is(err, errTransactionTooLarge)
}

// maxBackoff caps every wait between sessions, jitter included.
const maxBackoff = 30 * time.Second

// Run streams until ctx ends (then it stops gracefully and returns nil) or a permanent error occurs.
// Transient failures — lost connections, a broker gone, a final produce error — are logged and
// retried from the slot with exponential backoff and jitter.
func (p *Pipeline) Run(ctx context.Context) error {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 500 * time.Millisecond
	bo.MaxInterval = maxBackoff
	bo.RandomizationFactor = 0.5
	c := carried{poke: make(chan struct{}, 1)}
	defer p.state.Store(int32(StateStopped))
	defer func() {
		if c.lingering != nil {
			c.lingering.rt.Close()
		}
	}()
	monitorCtx, stopMonitor := context.WithCancel(ctx)
	defer stopMonitor()
	go p.pollSlot(monitorCtx, c.poke)
	for {
		c.streamed, c.progressed = time.Time{}, false
		err := p.runOnce(ctx, &c)
		p.state.Store(int32(StateStarting))
		if ctx.Err() != nil {
			return nil
		}
		var poison *router.UndeliverableError
		if cfg := p.cfg; cfg.Kafka.ExactlyOnce() && errors.As(err, &poison) && poison.CommitLSN != 0 &&
			(p.stopBefore == nil || p.stopBefore.CommitLSN != poison.CommitLSN) {
			// The complete PostgreSQL transactions that shared the row's Kafka transaction were
			// aborted with it: one more session commits them, stopping where the row's begins.
			p.stopBefore = poison
			p.obs.countError(err)
			p.log.Warn("a row can never be delivered (no dead-letter topic): committing the complete transactions before it, then stopping",
				"event_id", poison.EventID, "commit_lsn", checkpoint.LSN(poison.CommitLSN).String())
			continue
		}
		if permanent(err) {
			p.obs.countError(err)
			return err
		}
		var wait time.Duration
		if errors.Is(err, replication.ErrSlotInUse) {
			if !c.standby {
				p.log.Info("slot is in use by another instance: waiting as hot standby", "slot", p.cfg.Postgres.Slot, "reason", err.Error())
				c.standby = true
			}
			p.state.Store(int32(StateStandby))
			wait = p.cfg.Postgres.StandbyPollInterval
		} else {
			if c.madeProgress() {
				bo.Reset() // the last session worked for a while: this is a new failure, not the same one again
			}
			wait = min(bo.NextBackOff(), maxBackoff)
			p.obs.countError(err)
			if c.streamed.IsZero() {
				p.log.Warn("cannot start a session (transient failure); retrying after backoff", "error", err.Error(), "retry_in", wait.Round(time.Millisecond).String())
			} else {
				p.log.Warn("pipeline stopped (transient failure); replaying from the slot after backoff", "error", err.Error(), "retry_in", wait.Round(time.Millisecond).String())
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// runOnce is one session: check Kafka, set up, stream until failure or ctx's end.
func (p *Pipeline) runOnce(ctx context.Context, c *carried) error {
	cfg := p.cfg
	if err := p.identify(ctx); err != nil {
		return err
	}
	if err := p.settleLingering(ctx, c); err != nil {
		return err
	}
	// Kafka first: a session that cannot deliver would only hold the slot and replay.
	rt, err := p.newRouter(ctx, func(o *router.Options) { o.DeferNewTopics = true })
	if err != nil {
		return err
	}
	kept := false // the router lingers past the session (settleLingering)
	defer func() {
		if !kept {
			rt.Close()
		}
	}()

	s, err := p.setup(ctx, c)
	if err != nil {
		return err
	}
	res, srv, conn := s.res, s.server, s.conn
	started := false
	defer func() {
		if !started {
			_ = conn.Close(context.Background())
		}
	}()
	if err := p.checkPhantomRisk(ctx, s.cat, res.Slot.Failover || res.WantFailover); err != nil {
		s.close()
		return err
	}
	v := &verifier{target: replication.TargetOf(cfg.Postgres), cat: s.cat, outbox: p.outbox(), more: p.tables(), log: p.log, obs: &p.obs, last: res.Verified,
		giveUp: cfg.Postgres.ReceiveTimeout}
	defer func() { c.verified = v.last }()
	p.obs.markVerified(time.Now())
	defer v.close()

	d, err := p.newDelivery(ctx, c, rt, res.Slot.ConfirmedFlush, srv, v.confirmLimit)
	if err != nil {
		return err // the catalog connection is the verifier's, closed with it
	}

	if res.WantFailover && !res.Slot.Failover {
		if err := replication.AlterSlotFailover(ctx, conn, cfg.Postgres.Slot); err != nil {
			p.log.Warn("could not make the slot a failover slot; it will not survive a promotion of a standby (postgres.failover_slot)", "slot", cfg.Postgres.Slot, "error", err.Error())
		} else {
			p.log.Info("made the slot a failover slot: standbys with sync_replication_slots keep a copy", "slot", cfg.Postgres.Slot)
		}
	}
	stream, err := replication.Start(ctx, conn, replication.Options{
		Slot: cfg.Postgres.Slot, Outbox: p.outbox(), Tables: p.tables(), Columns: p.columnRoles(), StartLSN: res.Slot.ConfirmedFlush,
		StatusInterval: cfg.Postgres.StatusInterval, ReceiveTimeout: cfg.Postgres.ReceiveTimeout, ConfirmLimit: d.confirmLimit,
		BaseType: p.baseType, Missing: res.Missing, Ignore: replication.IgnoredTables(cfg.Postgres.IgnoreTables), Logger: p.log, Counters: &p.Replication,
		MessagePrefixes: cfg.Postgres.MessagePrefixes,
	})
	if err != nil {
		return err
	}
	started = true
	defer func() { _ = stream.Close(context.Background()) }()
	c.lastPID = stream.BackendPID()

	if c.standby {
		p.log.Info("took over the slot from the previous instance", "slot", cfg.Postgres.Slot)
		c.standby = false
	}
	tracker := checkpoint.NewTracker(res.Slot.ConfirmedFlush)
	server := stream.Server()
	p.obs.setSession(tracker, c.lastPID, server)
	defer p.obs.setSession(nil, 0, "")
	p.log.Info("streaming", "slot", cfg.Postgres.Slot, "publication", cfg.Postgres.Publication,
		"table", cfg.Postgres.Table, "from_lsn", res.Slot.ConfirmedFlush.String(), "server", server)
	if c.server != "" && c.server != server {
		p.log.Warn("streaming from another server than the last session: a failover or switchover", "previous", c.server, "server", server)
	}
	c.server = server

	p.state.Store(int32(StateStreaming))
	c.streamed = time.Now()
	c.slotSeen = true
	select {
	case c.poke <- struct{}{}: // a fresh look at the slot, now held by this session
	default:
	}
	defer func() { c.progressed = checkpoint.LSN(p.Replication.ConfirmedLSN.Load()) > res.Slot.ConfirmedFlush }()
	streamCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-rt.Failed():
			cancel(rt.Err())
		case <-streamCtx.Done():
		}
	}()
	verifying := make(chan struct{})
	go func() {
		defer close(verifying)
		v.run(streamCtx, cancel)
	}()
	go p.watchKafka(streamCtx, tracker, cancel)
	h := d.handler(handler{router: rt, tracker: tracker})
	runErr := stream.Run(streamCtx, tracker, h)
	// Not streaming any more, whatever the clean-up below takes (an abort waits for Kafka).
	p.state.Store(int32(StateStarting))
	if ctx.Err() == nil && errors.Is(runErr, context.Canceled) {
		if cause := context.Cause(streamCtx); cause != nil {
			runErr = cause
		}
	}
	if rerr := rt.Err(); rerr != nil {
		runErr = d.kafkaFailed(rerr)
		var rejected *router.RejectedBatchError
		if errors.As(rerr, &rejected) {
			// Every record of the rejected partition fails with it; wait for their promises to name
			// their transactions, then replay those one record at a time.
			fctx, fcancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = rt.Flush(fctx)
			fcancel()
			p.isolateUntil = max(p.isolateUntil, rt.RejectedUpTo())
			p.log.Warn("kafka rejected a batch: replaying its transactions one record at a time", "topic", rejected.Topic,
				"error", rejected.Err.Error(), "isolate_until_lsn", checkpoint.LSN(p.isolateUntil).String())
		}
	}
	cancel(nil)
	<-verifying

	stop := d.end(ctx.Err() != nil && rt.Err() == nil, runErr)
	graceful := stop.graceful
	kept = stop.keepRouter
	if stop.abort != nil {
		defer stop.abort() // after the stream is closed (below), before the deferred rt.Close
		defer func() { _ = stream.Close(context.Background()) }()
	}
	if graceful {
		// Two more verifications, a moment apart, so that the final confirm covers what was just
		// acknowledged: a check confirms only what the check before it saw (verifier.accept).
		vctx, vcancel := context.WithTimeout(context.Background(), 2*verifyTimeout)
		err := v.once(vctx)
		if err == nil {
			time.Sleep(finalVerifyGap)
			err = v.once(vctx)
		}
		if err != nil {
			p.log.Warn("shutdown: could not verify the outbox once more; confirming up to the last verification", "error", err.Error())
		}
		vcancel()
	}
	// One last status update: everything acknowledged so far, and nothing more. On a graceful stop the
	// stream is ended properly, so that the update is applied before the connection closes.
	if graceful {
		fctx, fcancel := context.WithTimeout(context.Background(), finishTimeout)
		if err := stream.Finish(fctx); err == nil {
			p.log.Debug("replication stream ended cleanly")
		} else {
			p.log.Warn("shutdown: the replication stream did not end cleanly; the final confirm may be lost (the next start re-sends it)", "error", err.Error())
		}
		fcancel()
	} else if cerr := stream.Confirm(); cerr != nil && runErr == nil {
		runErr = cerr
	}
	if graceful {
		d.stopped(srv)
		st := tracker.Stats()
		p.log.Info("stopped", "confirmed_lsn", checkpoint.LSN(p.Replication.ConfirmedLSN.Load()).String(), "unacknowledged_records", st.PendingRecords)
		return nil
	}
	return runErr
}

// phantomRiskWarning says what a failover slot without synchronized_standby_slots risks.
const phantomRiskWarning = "the slot is a failover slot, but the primary's synchronized_standby_slots is empty: the router may receive (and publish) transactions that no standby has yet, " +
	"and after a failover to a standby that was behind, Kafka holds events whose transactions the new primary never had (phantom events). " +
	"Set synchronized_standby_slots to the standbys' physical slots (see outbox-cdc status --standby)"

// finishTimeout bounds the clean end of the replication stream at a graceful stop.
const finishTimeout = 5 * time.Second

// inFlightWait bounds the wait for Kafka's acknowledgements of what is in flight when a session ends
// on a PostgreSQL failure (at-least-once): what is acknowledged by then is not sent again. Usually
// they are there within milliseconds; the bound keeps a slow broker from delaying the reconnection.
const inFlightWait = time.Second

// errTransactionTooLarge stops the router: a PostgreSQL transaction cannot be delivered within the
// Kafka transaction timeout, and a replay would only time out again.
var errTransactionTooLarge = errors.New("a PostgreSQL transaction does not fit in one Kafka transaction")

// errReleased ends a session that lets go of the replication connection so that PostgreSQL is not
// held: the slot keeps everything unconfirmed, and the next session replays it.
var errReleased = errors.New("released the replication connection")

var _ replication.Batcher = (*quietHandler)(nil)
