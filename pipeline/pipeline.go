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

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// Pipeline is the run loop. Create it with New and call Run once.
type Pipeline struct {
	cfg   config.Config
	log   *slog.Logger
	rules *router.Rules

	// Replication counts what the stream decoded and ignored.
	Replication replication.Counters
	// Router counts what the router delivered.
	Router router.Counters

	state    atomic.Int32
	obs      observed
	observer router.Observer
}

// Option configures a Pipeline.
type Option func(*Pipeline)

// WithObserver has the router report every acknowledged record to o (for metrics).
func WithObserver(o router.Observer) Option {
	return func(p *Pipeline) { p.observer = o }
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
	rules, err := router.NewRules(cfg.Routing.Topic, cfg.Routing.Topics, cfg.Routing.FallbackTopic, columns(cfg))
	if err != nil {
		return nil, fmt.Errorf("routing: %w", err)
	}
	p := &Pipeline{cfg: cfg, log: log, rules: rules}
	for _, o := range opts {
		o(p)
	}
	return p, nil
}

func columns(cfg config.Config) router.Columns {
	c := cfg.Postgres.Columns
	return router.Columns{
		EventID: c.EventID, EventType: c.EventType, AggregateType: c.AggregateType, AggregateID: c.AggregateID,
		AggregateVersion: c.AggregateVersion, Payload: c.Payload, Headers: c.Headers, CreatedAt: c.CreatedAt,
	}
}

// permanent reports errors that replaying cannot fix: the operator must act.
func permanent(err error) bool {
	var undeliverable *router.UndeliverableError
	return errors.As(err, &undeliverable) || errors.Is(err, replication.ErrNotSetUp) || errors.Is(err, replication.ErrSlotLost) ||
		errors.Is(err, replication.ErrResyncInterrupted)
}

// Run streams until ctx ends (then it stops gracefully and returns nil) or a permanent error occurs.
// Transient failures — lost connections, a broker gone, a final produce error — are logged and
// retried from the slot with exponential backoff and jitter.
func (p *Pipeline) Run(ctx context.Context) error {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 500 * time.Millisecond
	bo.MaxInterval = 30 * time.Second
	bo.RandomizationFactor = 0.5
	standby := false
	defer p.state.Store(int32(StateStopped))
	monitorCtx, stopMonitor := context.WithCancel(ctx)
	defer stopMonitor()
	go p.pollSlot(monitorCtx)
	for {
		started := time.Now()
		err := p.runOnce(ctx, &standby)
		p.state.Store(int32(StateStarting))
		if ctx.Err() != nil {
			return nil
		}
		if permanent(err) {
			p.obs.countError(errorClass(err))
			return err
		}
		var wait time.Duration
		if errors.Is(err, replication.ErrSlotInUse) {
			if !standby {
				p.log.Info("slot is in use by another instance: waiting as hot standby", "slot", p.cfg.Postgres.Slot, "reason", err.Error())
				standby = true
			}
			p.state.Store(int32(StateStandby))
			wait = p.cfg.Postgres.StandbyPollInterval
		} else {
			if time.Since(started) > time.Minute {
				bo.Reset() // it streamed for a while: this is a new failure, not the same one again
			}
			wait = bo.NextBackOff()
			p.obs.countError(errorClass(err))
			p.log.Warn("pipeline stopped; replaying from the slot after backoff", "error", err.Error(), "retry_in", wait.Round(time.Millisecond).String())
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// runOnce is one session: connect, set up, stream until failure or ctx's end.
func (p *Pipeline) runOnce(ctx context.Context, standby *bool) (err error) {
	cfg := p.cfg
	conn, err := replication.Connect(ctx, cfg.Postgres.URL)
	if err != nil {
		return err
	}
	schema, table := replication.SplitTable(cfg.Postgres.Table)
	res, err := replication.Setup(ctx, conn, replication.SetupOptions{
		Slot: cfg.Postgres.Slot, Publication: cfg.Postgres.Publication, Schema: schema, Table: table,
		CreatePublication: cfg.Postgres.CreatePublication, CreateSlot: cfg.Postgres.CreateSlot,
	})
	if err != nil {
		_ = conn.Close(context.Background())
		return err
	}
	if res.CreatedPublication {
		p.log.Info("created publication", "publication", cfg.Postgres.Publication, "table", cfg.Postgres.Table)
	}
	if res.CreatedSlot {
		p.log.Info("created replication slot", "slot", cfg.Postgres.Slot)
	}

	stream, err := replication.Start(ctx, conn, replication.Options{
		Slot: cfg.Postgres.Slot, Publication: cfg.Postgres.Publication, Schema: schema, Table: table,
		StatusInterval: cfg.Postgres.StatusInterval, Logger: p.log, Counters: &p.Replication,
	})
	if err != nil {
		_ = conn.Close(context.Background())
		return err
	}
	defer func() { _ = stream.Close(context.Background()) }()

	rt, err := p.newRouter(ctx)
	if err != nil {
		return err
	}
	defer rt.Close()

	if *standby {
		p.log.Info("took over the slot from the previous instance", "slot", cfg.Postgres.Slot)
		*standby = false
	}
	tracker := checkpoint.NewTracker(stream.StartLSN())
	p.obs.setTracker(tracker)
	defer p.obs.setTracker(nil)
	p.log.Info("streaming", "slot", cfg.Postgres.Slot, "publication", cfg.Postgres.Publication,
		"table", cfg.Postgres.Table, "from_lsn", stream.StartLSN().String())

	p.state.Store(int32(StateStreaming))
	streamCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-rt.Failed():
			cancel()
		case <-streamCtx.Done():
		}
	}()
	go p.reportStalls(streamCtx, tracker)
	runErr := stream.Run(streamCtx, tracker, &handler{router: rt, tracker: tracker})
	if rerr := rt.Err(); rerr != nil {
		runErr = &kafkaError{rerr}
	}
	if ctx.Err() != nil && rt.Err() == nil {
		p.drain(rt, tracker)
	}
	// One last status update: everything acknowledged so far, and nothing more.
	if cerr := stream.Confirm(); cerr != nil && runErr == nil {
		runErr = cerr
	}
	if ctx.Err() != nil && rt.Err() == nil {
		st := tracker.Stats()
		p.log.Info("stopped", "confirmed_lsn", st.Watermark.String(), "unacknowledged_records", st.PendingRecords)
		return nil
	}
	return runErr
}

// newRouter creates the router every delivery path uses (run and resync) and checks that Kafka answers.
func (p *Pipeline) newRouter(ctx context.Context) (*router.Router, error) {
	cfg := p.cfg
	rt, err := router.New(router.Options{
		Brokers: cfg.Kafka.Brokers, ClientID: cfg.Kafka.ClientID, Security: cfg.KafkaSecurity(), Rules: p.rules, Columns: columns(cfg),
		DLQTopic: cfg.Routing.DLQTopic, CreateTopics: cfg.Kafka.CreateTopics,
		TopicPartitions: cfg.Kafka.TopicPartitions, TopicReplicationFactor: cfg.Kafka.TopicReplicationFactor,
		MaxMessageBytes: cfg.Kafka.MaxMessageBytes, MaxInFlightRecords: cfg.Limits.MaxInFlightRecords,
		MaxInFlightBytes: cfg.Limits.MaxInFlightBytes, Linger: cfg.Kafka.Linger, Logger: p.log, Counters: &p.Router,
		Observer: p.observer,
	})
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

// stallAfter is how long the watermark may stand still with records in flight before the pipeline
// says so.
const stallAfter = 30 * time.Second

// reportStalls logs, at most every stallAfter, that Kafka has not acknowledged records for a while:
// the one line an operator needs while a broker is away (the client retries without limit).
func (p *Pipeline) reportStalls(ctx context.Context, tr *checkpoint.Tracker) {
	tick := time.NewTicker(stallAfter)
	defer tick.Stop()
	last := tr.Stats().Watermark
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		st := tr.Stats()
		stalled := st.PendingRecords > 0 && st.Watermark == last
		last = st.Watermark
		if stalled {
			p.log.Warn("waiting for Kafka to acknowledge; the slot holds the backlog meanwhile",
				"unacknowledged_records", st.PendingRecords, "open_transactions", st.OpenTransactions,
				"oldest_commit_age", time.Since(st.OldestCommitTime).Round(time.Second).String(),
				"confirmed_lsn", st.Watermark.String())
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
	// Promises run after the flush; give them a moment to land in the tracker.
	for tr.Stats().PendingRecords > 0 && ctx.Err() == nil && rt.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
}

// handler hands rows from the stream to the router and records them in the tracker.
type handler struct {
	router  *router.Router
	tracker *checkpoint.Tracker
}

// Deliver implements replication.Handler.
func (h *handler) Deliver(ctx context.Context, tx *checkpoint.Tx, row replication.Row) error {
	prepared, err := h.router.Prepare(ctx, &row, router.Source{LSN: row.LSN.String(), CommitTime: tx.CommitTime()})
	if err != nil {
		return err
	}
	h.tracker.Add(tx)
	h.router.Produce(prepared, func() { h.tracker.Ack(tx) })
	return nil
}
